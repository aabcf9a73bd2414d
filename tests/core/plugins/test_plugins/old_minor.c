/* A plugin built against SDK 1.0 (list abi_minor 0, no role flags): a 1.1 host loads and calls it. */
#include "common.h"
static const grove_plugin_descriptor d = {sizeof(grove_plugin_descriptor),
                                          GROVE_PLUGIN_KIND_REWARD,
                                          "from_the_past",
                                          "1.0.0",
                                          "built for ABI 1.0",
                                          0,
                                          NULL,
                                          0,
                                          NULL,
                                          0,
                                          ok_create,
                                          NULL,
                                          &ones_api,
                                          NULL,
                                          NULL};
ONE_PLUGIN_LIBRARY(d, 1, 0)
