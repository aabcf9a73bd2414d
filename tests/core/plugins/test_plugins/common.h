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

/* The library's one entry point, listing the single descriptor `d` under the given ABI version. */
#define ONE_PLUGIN_LIBRARY(d, abi_major, abi_minor)                                                  \
    static const grove_plugin_descriptor* const all[] = {&d};                                        \
    static const grove_plugin_list list = {sizeof(grove_plugin_list), abi_major, abi_minor, 1, all}; \
    GROVE_EXPORT const grove_plugin_list* grove_plugin_entry(const grove_host_api* host) {           \
        (void)host;                                                                                  \
        return &list;                                                                                \
    }
