/* Shared by the C test plugins: a reward whose score() gives every row 1.0. */
#include <grove/grove_plugin.h>

static grove_status ok_create(const grove_config* config, void** instance, grove_error_sink* err) {
    (void)config;
    (void)err;
    *instance = NULL;
    return GROVE_OK;
}
static grove_status ones(void* instance, const grove_reward_batch* batch, grove_reward_output* out, grove_error_sink* err) {
    uint32_t i;
    (void)instance;
    (void)err;
    for (i = 0; i < batch->count; ++i) out->scores[i] = 1.0f;
    return GROVE_OK;
}
static const grove_reward_api ones_api = {sizeof(grove_reward_api), ones};
