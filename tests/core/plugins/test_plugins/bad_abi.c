/* A plugin built for a future ABI major: the host must refuse it by name. */
#include "common.h"
static const grove_plugin_descriptor d = {sizeof(grove_plugin_descriptor),
                                          GROVE_PLUGIN_KIND_REWARD,
                                          "from_the_future",
                                          "9.0.0",
                                          "built for ABI 99",
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
ONE_PLUGIN_LIBRARY(d, 99, 0)
