/* A plain-C reward whose create() refuses its configuration with a message about one key. */
#include "common.h"
static grove_status failing_create(const grove_config* config, void** instance, grove_error_sink* err) {
    (void)instance;
    if (grove_config_float(config, "threshold", 0.0) > 1.0)
        return grove_fail(err, GROVE_ERROR_CONFIG, "threshold", "threshold must be at most 1.0");
    return grove_fail(err, GROVE_ERROR_INTERNAL, NULL, "the answer key file could not be opened");
}
static const grove_config_key keys[] = {{sizeof(grove_config_key), "threshold", GROVE_VALUE_FLOAT, 0, "0.5", "a threshold"}};
static const grove_plugin_descriptor d = {sizeof(grove_plugin_descriptor),
                                          GROVE_PLUGIN_KIND_REWARD,
                                          "failing",
                                          "1.0.0",
                                          "create() always fails",
                                          0,
                                          keys,
                                          1,
                                          NULL,
                                          0,
                                          failing_create,
                                          NULL,
                                          &ones_api,
                                          NULL,
                                          NULL};
ONE_PLUGIN_LIBRARY(d, GROVE_ABI_MAJOR, GROVE_ABI_MINOR)
