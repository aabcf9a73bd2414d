/* A reward whose function table's struct_size stops before score(): the host must refuse it by
 * name rather than read past the table the plugin declared. */
#include "common.h"
static const grove_reward_api short_api = {sizeof(uint32_t), ones};
static const grove_plugin_descriptor d = {sizeof(grove_plugin_descriptor),
                                          GROVE_PLUGIN_KIND_REWARD,
                                          "short_table",
                                          "1.0.0",
                                          "its reward table is too small",
                                          0,
                                          NULL,
                                          0,
                                          NULL,
                                          0,
                                          ok_create,
                                          NULL,
                                          &short_api,
                                          NULL,
                                          NULL};
ONE_PLUGIN_LIBRARY(d, GROVE_ABI_MAJOR, GROVE_ABI_MINOR)
