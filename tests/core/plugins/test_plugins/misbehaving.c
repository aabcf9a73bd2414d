/* A reward and an environment that misbehave on purpose, for the isolation tests: from optimizer
 * step `from_step` on, the reward's score() and the environment's step() do `behaviour`: segfault,
 * abort, exit, hang, garbage (prints binary noise to stdout and stderr, then answers), fail
 * (returns an error), or fine (score_episodes too); bad_judgement makes episode_reward() answer a
 * judgement that is none of GROVE_EPISODES_*. Otherwise the reward gives 1.0 per row and logs "misbehaving/calls",
 * per row its index (the first five rows, in two calls) and the count of ASCII vowels in its completion;
 * the environment answers "<seen N>" (N: the turn's tokens) and ends episodes at their second turn,
 * and judges each whole episode 0.5. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

typedef struct {
    char behaviour[16];
    int64_t from_step;
} misbehaving;

static grove_status create(const grove_config* config, void** instance, grove_error_sink* err) {
    misbehaving* m = (misbehaving*)calloc(1, sizeof(misbehaving));
    (void)err;
    strncpy(m->behaviour, grove_config_string(config, "behaviour", "fine"), sizeof m->behaviour - 1);
    m->from_step = grove_config_int(config, "from_step", 0);
    *instance = m;
    return GROVE_OK;
}

static void destroy(void* instance) { free(instance); }

/* Does the configured misbehaviour at or after from_step; returns GROVE_OK when the call should go on. */
static grove_status misbehave(const misbehaving* m, int64_t step, grove_error_sink* err) {
    if (step >= m->from_step) {
        if (!strcmp(m->behaviour, "segfault")) raise(SIGSEGV);
        if (!strcmp(m->behaviour, "abort")) abort();
        if (!strcmp(m->behaviour, "exit")) exit(7);
        if (!strcmp(m->behaviour, "hang"))
            for (;;) pause();
        if (!strcmp(m->behaviour, "fail")) return grove_fail(err, GROVE_ERROR_INTERNAL, NULL, "the judge is unreachable");
        if (!strcmp(m->behaviour, "garbage")) {
            static const unsigned char noise[] = {0x47, 0x52, 0x56, 0x57, 0xff, 0x00, 0x13, 0x37, 0x0a};
            fwrite(noise, 1, sizeof noise, stdout);
            fflush(stdout);
            (void)!write(1, noise, sizeof noise);
            fwrite(noise, 1, sizeof noise, stderr);
        }
    }
    return GROVE_OK;
}

/* Each row's count of the bytes a, e, i, o and u in its completion, as column "misbehaving/vowels": a
 * value the test can recompute from the row's logged completion, to find a value moved to another row. */
static void log_vowels(const grove_reward_batch* batch, grove_reward_output* out) {
    char(*numbers)[24] = calloc(batch->count ? batch->count : 1, sizeof *numbers);
    grove_text* values = calloc(batch->count ? batch->count : 1, sizeof *values);
    uint32_t i;
    size_t b;
    for (i = 0; i < batch->count; ++i) {
        unsigned vowels = 0;
        for (b = 0; b < batch->completions[i].size; ++b) {
            const char c = batch->completions[i].data[b];
            vowels += c != 0 && strchr("aeiou", c) != NULL;
        }
        values[i].size = (size_t)snprintf(numbers[i], sizeof numbers[i], "%u", vowels);
        values[i].data = numbers[i];
    }
    out->log_extra(out, "misbehaving/vowels", values, batch->count);
    free(values);
    free(numbers);
}

static grove_status score(void* instance, const grove_reward_batch* batch, grove_reward_output* out, grove_error_sink* err) {
    uint32_t i;
    grove_status status = misbehave((const misbehaving*)instance, batch->step, err);
    if (status != GROVE_OK) return status;
    for (i = 0; i < batch->count; ++i) out->scores[i] = 1.0f;
    out->log_metric(out, "misbehaving/calls", 1.0);
    if (GROVE_HAS_FIELD(out, grove_reward_output, log_extra)) { /* each row's index, in two calls */
        static const grove_text indices[] = {{"0", 1}, {"1", 1}, {"2", 1}, {"3", 1}, {"\"more\"", 6}};
        const uint32_t first = batch->count < 2 ? batch->count : 2;
        out->log_extra(out, "misbehaving/row", indices, first);
        out->log_extra(out, "misbehaving/row", indices + first, batch->count - first < 3 ? batch->count - first : 3);
        log_vowels(batch, out);
    }
    return GROVE_OK;
}

static grove_status stop_strings(void* instance, const char* const** strings, grove_error_sink* err) {
    static const char* const stops[] = {"</call>", NULL};
    (void)instance;
    (void)err;
    *strings = stops;
    return GROVE_OK;
}

static grove_status step(void* instance, const grove_environment_batch* batch, grove_environment_output* out,
                         grove_error_sink* err) {
    uint32_t i;
    grove_status status = misbehave((const misbehaving*)instance, batch->step, err);
    if (status != GROVE_OK) return status;
    for (i = 0; i < batch->count; ++i) {
        char seen[32];
        int n =
            snprintf(seen, sizeof seen, "<seen %d>", (int)(batch->turn_token_offsets[i + 1] - batch->turn_token_offsets[i]));
        out->observations[i]->append(out->observations[i], seen, (size_t)n);
        out->done[i] = batch->turns[i] >= 2;
        out->tool_calls[i] = 1;
    }
    return GROVE_OK;
}

static grove_status score_episodes(void* instance, const grove_environment_batch* episodes, float* rewards,
                                   grove_error_sink* err) {
    uint32_t i;
    grove_status status = misbehave((const misbehaving*)instance, episodes->step, err);
    if (status != GROVE_OK) return status;
    for (i = 0; i < episodes->count; ++i) rewards[i] = 0.5f;
    return GROVE_OK;
}

static grove_status episode_reward(void* instance, uint32_t* judgement, grove_text_sink* name, grove_error_sink* err) {
    (void)name;
    (void)err;
    if (!strcmp(((const misbehaving*)instance)->behaviour, "bad_judgement")) *judgement = 7;
    return GROVE_OK;
}

static const grove_reward_api api = {sizeof(grove_reward_api), score};
static const grove_config_key keys[] = {
    {sizeof(grove_config_key), "behaviour", GROVE_VALUE_STRING, 0, "\"fine\"",
     "segfault|abort|exit|hang|garbage|fail|fine|bad_judgement"},
    {sizeof(grove_config_key), "from_step", GROVE_VALUE_INT, 0, "0", "the first step that misbehaves"}};
static const grove_environment_api environment_api = {
    sizeof(grove_environment_api), stop_strings, step, score_episodes, NULL, NULL, episode_reward};
static const grove_plugin_descriptor reward = {sizeof(grove_plugin_descriptor),
                                               GROVE_PLUGIN_KIND_REWARD,
                                               "misbehaving",
                                               "1.0.0",
                                               "a reward that crashes, hangs or prints noise on purpose",
                                               0,
                                               keys,
                                               2,
                                               NULL,
                                               0,
                                               create,
                                               destroy,
                                               &api,
                                               NULL,
                                               NULL};
static const grove_plugin_descriptor environment = {sizeof(grove_plugin_descriptor),
                                                    GROVE_PLUGIN_KIND_ENVIRONMENT,
                                                    "misbehaving_env",
                                                    "1.0.0",
                                                    "an environment that crashes, hangs or prints noise on purpose",
                                                    0,
                                                    keys,
                                                    2,
                                                    NULL,
                                                    0,
                                                    create,
                                                    destroy,
                                                    NULL,
                                                    NULL,
                                                    NULL,
                                                    &environment_api};
static const grove_plugin_descriptor* const all[] = {&reward, &environment};
static const grove_plugin_list list = {sizeof(grove_plugin_list), GROVE_ABI_MAJOR, GROVE_ABI_MINOR, 2, all};
GROVE_EXPORT const grove_plugin_list* grove_plugin_entry(const grove_host_api* host) {
    (void)host;
    return &list;
}
