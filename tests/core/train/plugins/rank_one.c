/* Test adapter "rank_one", in plain C against the SDK header only: one rank-1 update per targeted
 * layer, delta(x) = scale * u (v . x) with u [out, 1] (zeros) and v [1, in] (normal), merged as
 * W += scale * u v. It saves no PEFT configuration of its own kind, so merging it proves that
 * `grove export --merge` goes through the plugin's merged_delta, not through LoRA's formula. */
#include <grove/grove_plugin.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double scale;
} rank_one;

static const grove_config_key keys[] = {
    {sizeof(grove_config_key), "scale", GROVE_VALUE_FLOAT, 0, "2.0", "multiplies the update"},
};

static grove_status create(const grove_config* config, void** instance, grove_error_sink* err) {
    rank_one* r = malloc(sizeof *r);
    if (!r) return grove_fail(err, GROVE_ERROR_OUT_OF_MEMORY, NULL, "out of memory");
    r->scale = grove_config_float(config, "scale", 2.0);
    *instance = r;
    return GROVE_OK;
}
static void destroy(void* instance) { free(instance); }

static grove_status attach(void* instance, const grove_linear_info* layer, const grove_tensor_ops* ops, grove_op_context* ctx,
                           void** layer_state, grove_error_sink* err) {
    grove_tensor u, v;
    int64_t u_shape[2] = {layer->out_features, 1}, v_shape[2] = {1, layer->in_features};
    grove_status s;
    if (strcmp(layer->short_name, "q_proj") != 0 && strcmp(layer->short_name, "down_proj") != 0) return GROVE_OK;
    s = ops->parameter(ctx, "rank_one_u.weight", 2, u_shape, GROVE_INIT_ZEROS, 0.0, &u, err);
    if (s != GROVE_OK) return s;
    s = ops->parameter(ctx, "rank_one_v.weight", 2, v_shape, GROVE_INIT_NORMAL, 0.1, &v, err);
    if (s != GROVE_OK) return s;
    *layer_state = instance;
    return GROVE_OK;
}

static grove_status forward(void* instance, void* layer_state, const grove_tensor_ops* ops, grove_op_context* ctx,
                            const grove_tensor* params, uint32_t count, grove_tensor x, grove_tensor* delta,
                            grove_error_sink* err) {
    const rank_one* r = instance;
    (void)layer_state;
    if (count != 2) return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, NULL, "expected u and v");
    *delta = ops->scale(ctx, ops->linear(ctx, ops->linear(ctx, x, params[1]), params[0]), r->scale);
    return *delta ? GROVE_OK : GROVE_ERROR_INTERNAL;
}

static grove_status merged_delta(void* instance, void* layer_state, const grove_tensor_ops* ops, grove_op_context* ctx,
                                 const grove_tensor* params, uint32_t count, grove_tensor* delta, grove_error_sink* err) {
    const rank_one* r = instance;
    (void)layer_state;
    if (count != 2) return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, NULL, "expected u and v");
    *delta = ops->scale(ctx, ops->matmul(ctx, params[0], params[1]), r->scale);
    return *delta ? GROVE_OK : GROVE_ERROR_INTERNAL;
}

static grove_status saved_config_json(void* instance, grove_text_sink* out, grove_error_sink* err) {
    static const char text[] = "{\"adapter\": \"rank_one\"}";
    (void)instance;
    (void)err;
    out->append(out, text, sizeof text - 1);
    return GROVE_OK;
}

static const grove_adapter_api api = {sizeof(grove_adapter_api), attach, forward, merged_delta, NULL, saved_config_json};
static const grove_plugin_descriptor descriptor = {sizeof(grove_plugin_descriptor),
                                                   GROVE_PLUGIN_KIND_ADAPTER,
                                                   "rank_one",
                                                   "1.0.0",
                                                   "rank-1 updates (a test adapter)",
                                                   GROVE_PLUGIN_DETERMINISTIC,
                                                   keys,
                                                   1,
                                                   NULL,
                                                   0,
                                                   create,
                                                   destroy,
                                                   NULL,
                                                   NULL,
                                                   &api};
static const grove_plugin_descriptor* const all[] = {&descriptor};
static const grove_plugin_list list = {sizeof(grove_plugin_list), GROVE_ABI_MAJOR, GROVE_ABI_MINOR, 1, all};

GROVE_EXPORT const grove_plugin_list* grove_plugin_entry(const grove_host_api* host) {
    (void)host;
    return &list;
}
