/* An objective built against SDK 1.5 (list abi_minor 5): it cannot see the 1.6 policy mask and
 * sampling ratio, so the host must refuse to run it with them rather than let it ignore them. */
#include "common.h"
static grove_status zero_loss(void* instance, const grove_objective_batch* b, grove_objective_output* out,
                              grove_error_sink* err) {
    (void)instance;
    (void)b;
    (void)err;
    out->loss = 0.0;
    return GROVE_OK;
}
static const grove_objective_api api = {sizeof(grove_objective_api), NULL, zero_loss};
static const grove_plugin_descriptor d = {sizeof(grove_plugin_descriptor),
                                          GROVE_PLUGIN_KIND_OBJECTIVE,
                                          "objective_1_5",
                                          "1.0.0",
                                          "built for ABI 1.5",
                                          0,
                                          NULL,
                                          0,
                                          NULL,
                                          0,
                                          ok_create,
                                          NULL,
                                          NULL,
                                          NULL,
                                          NULL,
                                          NULL,
                                          &api};
ONE_PLUGIN_LIBRARY(d, 1, 5)
