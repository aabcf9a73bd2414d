/*
 * keyword_reward — a reward plugin in plain C, built out of tree against the installed Grove SDK.
 *
 *   cmake -S examples/custom-reward -B build-keyword -DCMAKE_PREFIX_PATH=<grove prefix>
 *   cmake --build build-keyword
 *   grove check examples/custom-reward/grove.toml        (loads ./build-keyword/libkeyword_reward.so)
 *
 * Score: 1.0 when the completion contains `keyword` (at least `min_count` times), else 0.0.
 * Rows whose dataset JSON has "keyword_applies": false get NaN ("not applicable"), which Grove
 * leaves out of this reward's sum, as TRL does with None. Metric "occurrences" counts the matches.
 */
#include <grove/grove_plugin.h>

#include <stdlib.h>
#include <string.h>

typedef struct keyword_reward {
    char* keyword;
    size_t keyword_size;
    int64_t min_count;
} keyword_reward;

static const grove_config_key keys[] = {
    {sizeof(grove_config_key), "keyword", GROVE_VALUE_STRING, 1, NULL, "text the completion must contain"},
    {sizeof(grove_config_key), "min_count", GROVE_VALUE_INT, 0, "1", "occurrences needed for a score of 1.0"},
};
static const char* const metrics[] = {"occurrences"};

static grove_status create(const grove_config* config, void** instance, grove_error_sink* err) {
    const char* keyword = grove_config_string(config, "keyword", "");
    keyword_reward* self;
    if (keyword[0] == '\0') return grove_fail(err, GROVE_ERROR_CONFIG, "keyword", "must not be empty");
    self = (keyword_reward*)calloc(1, sizeof *self);
    if (!self) return grove_fail(err, GROVE_ERROR_OUT_OF_MEMORY, NULL, "out of memory");
    self->keyword_size = strlen(keyword);
    self->keyword = (char*)malloc(self->keyword_size + 1);
    if (!self->keyword) {
        free(self);
        return grove_fail(err, GROVE_ERROR_OUT_OF_MEMORY, NULL, "out of memory");
    }
    memcpy(self->keyword, keyword, self->keyword_size + 1); /* the config is borrowed: copy it */
    self->min_count = grove_config_int(config, "min_count", 1);
    if (self->min_count < 1) {
        free(self->keyword);
        free(self);
        return grove_fail(err, GROVE_ERROR_CONFIG, "min_count", "must be at least 1");
    }
    *instance = self;
    return GROVE_OK;
}

static void destroy(void* instance) {
    keyword_reward* self = (keyword_reward*)instance;
    free(self->keyword);
    free(self);
}

static size_t count_occurrences(const grove_text* text, const char* needle, size_t needle_size) {
    size_t count = 0, i;
    if (text->size < needle_size) return 0;
    for (i = 0; i + needle_size <= text->size; ++i)
        if (memcmp(text->data + i, needle, needle_size) == 0) {
            ++count;
            i += needle_size - 1;
        }
    return count;
}

/* A deliberately small check of the row JSON; a real plugin would use a JSON parser. */
static int not_applicable(const grove_text* row_json) {
    static const char marker[] = "\"keyword_applies\": false";
    grove_text json = *row_json;
    return count_occurrences(&json, marker, sizeof marker - 1) > 0;
}

static grove_status score(void* instance, const grove_reward_batch* batch, grove_reward_output* out, grove_error_sink* err) {
    const keyword_reward* self = (const keyword_reward*)instance;
    uint32_t i;
    (void)err;
    for (i = 0; i < batch->count; ++i) {
        size_t n = count_occurrences(&batch->completions[i], self->keyword, self->keyword_size);
        out->metrics[i] = (float)n;                        /* metric 0 of row i */
        if (not_applicable(&batch->row_json[i])) continue; /* leave the pre-filled NaN */
        out->scores[i] = (int64_t)n >= self->min_count ? 1.0f : 0.0f;
    }
    return GROVE_OK;
}

static const grove_reward_api reward_api = {sizeof(grove_reward_api), score};

static const grove_plugin_descriptor descriptor = {sizeof(grove_plugin_descriptor),
                                                   GROVE_PLUGIN_KIND_REWARD,
                                                   "keyword",
                                                   "1.0.0",
                                                   "1.0 when the completion contains the keyword (example plugin in C)",
                                                   GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC,
                                                   keys,
                                                   2,
                                                   metrics,
                                                   1,
                                                   create,
                                                   destroy,
                                                   &reward_api,
                                                   NULL,
                                                   NULL,
                                                   NULL,
                                                   NULL}; /* reduction, adapter, environment (ABI 1.2), objective (1.5) */

static const grove_plugin_descriptor* const all_plugins[] = {&descriptor};
static const grove_plugin_list plugin_list = {sizeof(grove_plugin_list), GROVE_ABI_MAJOR, GROVE_ABI_MINOR, 1, all_plugins};

GROVE_EXPORT const grove_plugin_list* grove_plugin_entry(const grove_host_api* host) {
    (void)host;
    return &plugin_list;
}
