/* An objective whose gradient is NaN at row 1, column 2: the host must stop with a message that
 * names the plugin and the position, never back-propagate it. */
#include <math.h>

#include "common.h"
static grove_status nan_loss(void* instance, const grove_objective_batch* b, grove_objective_output* out,
                             grove_error_sink* err) {
    (void)instance;
    (void)err;
    out->loss = 0.0;
    if (b->rows > 1 && b->columns > 2) out->grad[1 * b->columns + 2] = NAN;
    return GROVE_OK;
}
static const grove_objective_api nan_api = {sizeof(grove_objective_api), NULL, nan_loss};
static const grove_plugin_descriptor d = {sizeof(grove_plugin_descriptor),
                                          GROVE_PLUGIN_KIND_OBJECTIVE,
                                          "nan_objective",
                                          "1.0.0",
                                          "its gradient has a NaN",
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
                                          &nan_api};
ONE_PLUGIN_LIBRARY(d, GROVE_ABI_MAJOR, GROVE_ABI_MINOR)
