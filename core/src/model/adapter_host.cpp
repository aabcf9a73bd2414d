#include "grove/adapter_host.hpp"

#include <ATen/ATen.h>

#include <cmath>

#include "grove/error.hpp"
#include "grove/manifest.hpp"
#include "grove/model.hpp"
#include "plugins/text_sink.hpp"
#include "text/text_util.hpp"

// The per-call context behind the C op table. Handles are pointers to at::Tensor objects kept in a
// deque (stable addresses) for the duration of the call; parameters live in AdaptedLinear.
struct grove_op_context {
    std::deque<at::Tensor> temporaries;
    std::string first_error;
    bool training = true;
    // attach() only: where declared parameters go, and how to create them
    std::deque<std::pair<std::string, at::Tensor>>* parameters = nullptr;
    std::string layer_name;
    at::TensorOptions options;
    // the layer's own tensors, for adapters that rescale it (ABI 1.13); base_output only in forward()
    at::Tensor base_weight;
    at::Tensor input;         // forward()'s x
    at::Tensor layer_output;  // W x + b for `input` when the caller had it
    std::optional<at::Tensor> bias;
};

namespace grove {
namespace {

at::Tensor& unwrap(grove_tensor t) { return *reinterpret_cast<at::Tensor*>(t); }
grove_tensor wrap(grove_op_context* ctx, at::Tensor t) {
    ctx->temporaries.push_back(std::move(t));
    return reinterpret_cast<grove_tensor>(&ctx->temporaries.back());
}

// Runs one op; a torch error is recorded (first one wins) and the op returns NULL.
template <class Fn>
grove_tensor run_op(grove_op_context* ctx, const char* op, Fn&& fn) {
    try {
        return wrap(ctx, fn());
    } catch (const std::exception& e) {
        if (ctx->first_error.empty()) {
            std::string what = e.what();
            ctx->first_error = std::string("tensor op ") + op + " failed: " + what.substr(0, what.find('\n'));
        }
        return nullptr;
    }
}

// Why a parameter called `name` cannot be declared now, or "" if it can.
std::string parameter_refusal(const grove_op_context* ctx, const char* name) {
    if (!ctx->parameters) return "parameters can only be created in attach()";
    if (!name || !*name) return "a parameter needs a name";
    for (const auto& [existing, tensor] : *ctx->parameters)
        if (existing == name) return "parameter '" + std::string(name) + "' declared twice";
    return "";
}

grove_status op_parameter(grove_op_context* ctx, const char* name, uint32_t ndim, const int64_t* shape, uint32_t init,
                          double init_arg, grove_tensor* out, grove_error_sink* err) {
    if (const std::string refusal = parameter_refusal(ctx, name); !refusal.empty())
        return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, nullptr, refusal.c_str());
    if (ndim == 0 || ndim > 4)
        return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, nullptr, "a parameter needs 1 to 4 dimensions");
    std::vector<int64_t> sizes(shape, shape + ndim);
    for (int64_t s : sizes)
        if (s <= 0) return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, nullptr, "parameter sizes must be positive");
    at::Tensor p;
    // random values come from the CPU generator and then move: the same seed gives the same adapter
    // on every device (as PEFT, which initialises on the CPU)
    const at::TensorOptions on_cpu = ctx->options.device(at::kCPU);
    try {
        switch (init) {
            case GROVE_INIT_ZEROS:
                p = at::zeros(sizes, on_cpu);
                break;
            case GROVE_INIT_ONES:
                p = at::ones(sizes, on_cpu);
                break;
            case GROVE_INIT_NORMAL:
                p = at::empty(sizes, on_cpu).normal_(0.0, init_arg);
                break;
            case GROVE_INIT_KAIMING_UNIFORM: {
                // torch.nn.init.kaiming_uniform_(w, a): fan_in = size(1) * receptive field
                int64_t fan_in = ndim >= 2 ? sizes[1] : sizes[0];
                for (uint32_t d = 2; d < ndim; ++d) fan_in *= sizes[d];
                double gain = std::sqrt(2.0 / (1.0 + init_arg * init_arg));
                double bound = gain * std::sqrt(3.0 / double(fan_in));
                p = at::empty(sizes, on_cpu).uniform_(-bound, bound);
                break;
            }
            default:
                return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, nullptr, "unknown grove_init value");
        }
        p = p.to(ctx->options.device());
    } catch (const std::exception& e) {
        return grove_fail(err, GROVE_ERROR_INTERNAL, nullptr, e.what());
    }
    p.requires_grad_(true);
    ctx->parameters->emplace_back(name, p);
    *out = reinterpret_cast<grove_tensor>(&ctx->parameters->back().second);
    return GROVE_OK;
}

grove_status op_parameter_from(grove_op_context* ctx, const char* name, grove_tensor initial, grove_tensor* out,
                               grove_error_sink* err) {
    if (const std::string refusal = parameter_refusal(ctx, name); !refusal.empty())
        return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, nullptr, refusal.c_str());
    if (!initial) return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, nullptr, "a parameter needs an initial tensor");
    at::Tensor p;
    try {
        p = unwrap(initial).detach().to(ctx->options, /*non_blocking=*/false, /*copy=*/true);
    } catch (const std::exception& e) {
        return grove_fail(err, GROVE_ERROR_INTERNAL, nullptr, e.what());
    }
    p.requires_grad_(true);
    ctx->parameters->emplace_back(name, p);
    *out = reinterpret_cast<grove_tensor>(&ctx->parameters->back().second);
    return GROVE_OK;
}

grove_tensor op_base_weight(grove_op_context* ctx) {
    return run_op(ctx, "base_weight", [&] {
        if (!ctx->base_weight.defined()) throw std::invalid_argument("no layer weight in this call");
        return ctx->base_weight.detach();
    });
}
grove_tensor op_base_output(grove_op_context* ctx, grove_tensor x) {
    return run_op(ctx, "base_output", [&] {
        if (!ctx->input.defined()) throw std::invalid_argument("only forward() has a layer output");
        const at::Tensor& in = unwrap(x);
        // PEFT's DoRA also takes the layer's output less its bias
        if (in.is_same(ctx->input) && ctx->layer_output.defined())
            return ctx->bias ? ctx->layer_output - *ctx->bias : ctx->layer_output;
        return at::linear(in, ctx->base_weight.detach());
    });
}

grove_tensor op_linear(grove_op_context* ctx, grove_tensor x, grove_tensor w) {
    return run_op(ctx, "linear", [&] { return at::linear(unwrap(x), unwrap(w)); });
}
grove_tensor op_matmul(grove_op_context* ctx, grove_tensor a, grove_tensor b) {
    return run_op(ctx, "matmul", [&] { return at::matmul(unwrap(a), unwrap(b)); });
}
grove_tensor op_add(grove_op_context* ctx, grove_tensor a, grove_tensor b) {
    return run_op(ctx, "add", [&] { return unwrap(a) + unwrap(b); });
}
grove_tensor op_mul(grove_op_context* ctx, grove_tensor a, grove_tensor b) {
    return run_op(ctx, "mul", [&] { return unwrap(a) * unwrap(b); });
}
grove_tensor op_scale(grove_op_context* ctx, grove_tensor a, double factor) {
    return run_op(ctx, "scale", [&] { return unwrap(a) * factor; });
}
grove_tensor op_dropout(grove_op_context* ctx, grove_tensor a, double p) {
    return run_op(ctx, "dropout", [&] {
        if (!ctx->training || p == 0.0) return unwrap(a);
        return at::dropout(unwrap(a), p, true);
    });
}
uint32_t op_shape(grove_op_context*, grove_tensor a, int64_t* sizes, uint32_t max_dims) {
    const at::Tensor& t = unwrap(a);
    for (uint32_t d = 0; d < max_dims && d < uint32_t(t.dim()); ++d) sizes[d] = t.size(d);
    return uint32_t(t.dim());
}

grove_tensor op_detach(grove_op_context* ctx, grove_tensor a) {
    return run_op(ctx, "detach", [&] { return unwrap(a).detach(); });
}
grove_tensor op_div(grove_op_context* ctx, grove_tensor a, grove_tensor b) {
    return run_op(ctx, "div", [&] { return unwrap(a) / unwrap(b); });
}
grove_tensor op_row_norm(grove_op_context* ctx, grove_tensor a) {
    return run_op(ctx, "row_norm", [&] {
        if (unwrap(a).dim() != 2) throw std::invalid_argument("row_norm takes a 2-D tensor");
        return at::linalg_vector_norm(unwrap(a), 2, /*dim=*/{1});
    });
}
grove_tensor op_reshape(grove_op_context* ctx, grove_tensor a, uint32_t ndim, const int64_t* shape) {
    return run_op(ctx, "reshape", [&] { return unwrap(a).reshape(at::IntArrayRef(shape, ndim)); });
}

const grove_tensor_ops kOps = {sizeof(grove_tensor_ops),
                               op_parameter,
                               op_linear,
                               op_matmul,
                               op_add,
                               op_mul,
                               op_scale,
                               op_dropout,
                               op_shape,
                               op_base_weight,
                               op_base_output,
                               op_parameter_from,
                               op_detach,
                               op_div,
                               op_row_norm,
                               op_reshape};

std::string short_name(const std::string& name) {
    auto dot = name.rfind('.');
    return dot == std::string::npos ? name : name.substr(dot + 1);
}

// Reports a failed adapter call: the first op failure is the cause if there was one.
void check_call(const PluginInstance& adapter, grove_status status, const char* call, const ErrorCapture& capture,
                const grove_op_context& ctx, const std::string& layer) {
    if (status == GROVE_OK) return;
    std::string message = !ctx.first_error.empty() ? ctx.first_error : capture.message;
    throw Error(ErrorKind::plugin, "plugin " + adapter.info().display() + " failed in " + call + "() on layer " + layer + ": " +
                                       (message.empty() ? "no message given" : message));
}

std::vector<grove_tensor> parameter_handles(const std::deque<std::pair<std::string, at::Tensor>>& parameters) {
    std::vector<grove_tensor> handles;
    for (const auto& [name, tensor] : parameters)
        handles.push_back(reinterpret_cast<grove_tensor>(const_cast<at::Tensor*>(&tensor)));
    return handles;
}
}  // namespace

AdapterHost::AdapterHost(const PluginInstance& adapter) : adapter_(adapter) {
    if (adapter.info().kind != GROVE_PLUGIN_KIND_ADAPTER)
        throw Error(ErrorKind::plugin, "plugin " + adapter.info().display() + " is not an adapter");
}

bool AdapterHost::trains_base_weights() const { return adapter_.info().flags & GROVE_PLUGIN_TRAINS_BASE_WEIGHTS; }

std::unique_ptr<AdaptedLinear> AdapterHost::attach(const LinearLayer& layer) {
    std::unique_ptr<AdaptedLinear> adapted(new AdaptedLinear(*this, layer));
    std::string short_layer = short_name(layer.name);
    grove_linear_info info{sizeof(grove_linear_info),
                           layer.name.c_str(),
                           short_layer.c_str(),
                           layer.weight.size(1),
                           layer.weight.size(0),
                           layer.layer_index,
                           layer.bias.has_value() ? 1u : 0u};
    grove_op_context ctx;
    ctx.training = training_;
    ctx.parameters = &adapted->parameters_;
    ctx.layer_name = layer.name;
    ctx.options = layer.weight.options().requires_grad(false);
    ctx.base_weight = layer.weight;
    ErrorCapture capture;
    void* state = nullptr;
    grove_status status =
        adapter_.info().descriptor->adapter->attach(adapter_.handle(), &info, &kOps, &ctx, &state, &capture.sink);
    check_call(adapter_, status, "attach", capture, ctx, layer.name);
    if (!state) return nullptr;
    adapted->state_ = state;
    for (auto& [name, tensor] : adapted->parameters_) name = "base_model.model." + layer.name + "." + name;
    return adapted;
}

std::string AdapterHost::saved_config_json() const {
    const grove_adapter_api* api = adapter_.info().descriptor->adapter;
    if (!GROVE_HAS_FIELD(api, grove_adapter_api, saved_config_json) || !api->saved_config_json) return "";
    std::string text;
    grove_text_sink sink = text_sink_into(text);
    ErrorCapture capture;
    adapter_.check(api->saved_config_json(adapter_.handle(), &sink, &capture.sink), "saved_config_json", capture);
    return text;
}

AdaptedLinear::~AdaptedLinear() {
    const grove_adapter_api* api = host_.adapter_.info().descriptor->adapter;
    if (state_ && GROVE_HAS_FIELD(api, grove_adapter_api, detach) && api->detach) api->detach(host_.adapter_.handle(), state_);
}

at::Tensor AdaptedLinear::delta(const at::Tensor& x, const at::Tensor& base_output) const {
    grove_op_context ctx;
    ctx.training = host_.training_;
    ctx.layer_name = layer_.name;
    ctx.base_weight = layer_.weight;
    ctx.input = x;
    ctx.layer_output = base_output;
    ctx.bias = layer_.bias;
    ctx.temporaries.push_back(x);
    grove_tensor x_handle = reinterpret_cast<grove_tensor>(&ctx.temporaries.back());
    auto params = parameter_handles(parameters_);
    grove_tensor out = nullptr;
    ErrorCapture capture;
    grove_status status = host_.adapter_.info().descriptor->adapter->forward(
        host_.adapter_.handle(), state_, &kOps, &ctx, params.data(), uint32_t(params.size()), x_handle, &out, &capture.sink);
    check_call(host_.adapter_, status, "forward", capture, ctx, layer_.name);
    if (!out) check_call(host_.adapter_, GROVE_ERROR_INTERNAL, "forward", capture, ctx, layer_.name);
    at::Tensor result = unwrap(out);
    if (result.sizes().vec() != [&] {
            auto s = x.sizes().vec();
            s.back() = layer_.weight.size(0);
            return s;
        }())
        throw Error(ErrorKind::plugin, "plugin " + host_.adapter_.info().display() + " returned a delta of shape " +
                                           c10::str(result.sizes()) + " on layer " + layer_.name +
                                           "; expected the "
                                           "input's shape with the last dimension " +
                                           std::to_string(layer_.weight.size(0)));
    return result;
}

at::Tensor AdaptedLinear::forward(const at::Tensor& x) const {
    at::Tensor base = layer_.bias ? at::linear(x, layer_.weight, *layer_.bias) : at::linear(x, layer_.weight);
    return base + delta(x, base);
}

bool AdaptedLinear::can_merge() const {
    const grove_adapter_api* api = host_.adapter_.info().descriptor->adapter;
    return GROVE_HAS_FIELD(api, grove_adapter_api, merged_delta) && api->merged_delta;
}

at::Tensor AdaptedLinear::merged_delta() const {
    if (!can_merge())
        throw Error(ErrorKind::plugin, "plugin " + host_.adapter_.info().display() + " cannot be merged (no merged_delta)");
    const grove_adapter_api* api = host_.adapter_.info().descriptor->adapter;
    grove_op_context ctx;
    ctx.training = false;
    ctx.layer_name = layer_.name;
    ctx.base_weight = layer_.weight;
    auto params = parameter_handles(parameters_);
    grove_tensor out = nullptr;
    ErrorCapture capture;
    grove_status status = api->merged_delta(host_.adapter_.handle(), state_, &kOps, &ctx, params.data(),
                                            uint32_t(params.size()), &out, &capture.sink);
    check_call(host_.adapter_, status, "merged_delta", capture, ctx, layer_.name);
    if (!out) check_call(host_.adapter_, GROVE_ERROR_INTERNAL, "merged_delta", capture, ctx, layer_.name);
    at::Tensor result = unwrap(out);
    if (result.sizes() != layer_.weight.sizes())
        throw Error(ErrorKind::plugin, "plugin " + host_.adapter_.info().display() + " returned a merged delta of shape " +
                                           c10::str(result.sizes()) + " for weight " + c10::str(layer_.weight.sizes()));
    return result;
}

void train_beside_adapter(Model& model, const BesideAdapter& beside, const PluginUse& adapter_use) {
    if (!beside.empty() && !model.has_adapters())  // PEFT refuses target_modules that match nothing too
        throw Error(ErrorKind::plugin, adapter_use.origin +
                                           ": the adapter attaches to no layer: check its target_modules "
                                           "against the model's layer names (" +
                                           join(model.linear_module_names(), ", ") + ")");
    try {
        model.train_beside_adapter(beside);
    } catch (const Error& e) {
        throw Error(ErrorKind::manifest, adapter_use.origin + " " + e.what());
    }
}

std::vector<std::pair<std::string, at::Tensor>> trainable_parameters_or_refuse(Model& model, const PluginUse& adapter_use,
                                                                               const std::string& adapter_name) {
    std::vector<std::pair<std::string, at::Tensor>> params = model.trainable_named_parameters();
    if (params.empty())
        throw Error(ErrorKind::plugin, adapter_use.origin + ": the adapter '" + adapter_name +
                                           "' left no trainable parameter: check its target_modules against the model's "
                                           "layer names (" +
                                           join(model.linear_module_names(), ", ") + ")");
    return params;
}

}  // namespace grove
