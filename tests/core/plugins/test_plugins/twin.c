/* Built twice into one folder: two files providing the same plugin name. */
#include "common.h"
static const grove_plugin_descriptor d = {sizeof(grove_plugin_descriptor),
                                          GROVE_PLUGIN_KIND_REWARD,
                                          "twin",
                                          "1.0.0",
                                          "a name clash",
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
ONE_PLUGIN_LIBRARY(d, GROVE_ABI_MAJOR, GROVE_ABI_MINOR)
