/* Test reward "model_tokens", in plain C: a row's score is the number of completion tokens the model
 * wrote, and its metric "environment_tokens" the number an environment inserted, both read from
 * grove_reward_batch.model_token_mask (ABI 1.4). Under a host older than 1.4 every score is NaN.
 * Its metrics "turns" and "turn_bytes" are the number of the row's episode_turns and the bytes of
 * their texts together (ABI 1.10; NaN without them). */
#include <grove/grove_plugin.h>

#include <math.h>
#include <stddef.h>

static grove_status create(const grove_config* config, void** instance, grove_error_sink* err) {
    (void)config, (void)err;
    *instance = NULL;
    return GROVE_OK;
}
static void destroy(void* instance) { (void)instance; }

static grove_status score(void* instance, const grove_reward_batch* b, grove_reward_output* out, grove_error_sink* err) {
    (void)instance, (void)err;
    if (!GROVE_HAS_FIELD(b, grove_reward_batch, model_token_mask) || !b->model_token_mask) return GROVE_OK;
    for (uint32_t i = 0; i < b->count; ++i) {
        int64_t model = 0, environment = 0;
        for (int64_t t = b->completion_token_offsets[i]; t < b->completion_token_offsets[i + 1]; ++t) {
            if (b->model_token_mask[t])
                ++model;
            else
                ++environment;
        }
        out->scores[i] = (float)model;
        out->metrics[i] = (float)environment;
    }
    if (!GROVE_HAS_FIELD(b, grove_reward_batch, episode_turns) || !b->episode_turns) return GROVE_OK;
    for (uint32_t i = 0; i < b->count; ++i) {
        size_t bytes = 0;
        for (uint64_t k = b->episode_turn_offsets[i]; k < b->episode_turn_offsets[i + 1]; ++k)
            bytes += b->episode_turns[k].size;
        out->metrics[b->count + i] = (float)(b->episode_turn_offsets[i + 1] - b->episode_turn_offsets[i]);
        out->metrics[2 * b->count + i] = (float)bytes;
    }
    return GROVE_OK;
}

static const char* const metrics[] = {"environment_tokens", "turns", "turn_bytes"};
static const grove_reward_api api = {sizeof(grove_reward_api), score};
static const grove_plugin_descriptor descriptor = {sizeof(grove_plugin_descriptor),
                                                   GROVE_PLUGIN_KIND_REWARD,
                                                   "model_tokens",
                                                   "1.0.0",
                                                   "counts the model's completion tokens (a test reward)",
                                                   GROVE_PLUGIN_DETERMINISTIC,
                                                   NULL,
                                                   0,
                                                   metrics,
                                                   3,
                                                   create,
                                                   destroy,
                                                   &api,
                                                   NULL,
                                                   NULL,
                                                   NULL};
static const grove_plugin_descriptor* const all[] = {&descriptor};
static const grove_plugin_list list = {sizeof(grove_plugin_list), GROVE_ABI_MAJOR, GROVE_ABI_MINOR, 1, all};

GROVE_EXPORT const grove_plugin_list* grove_plugin_entry(const grove_host_api* host) {
    (void)host;
    return &list;
}
