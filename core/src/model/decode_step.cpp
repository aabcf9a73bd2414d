// Model::decode_step_logits: the static decode step of the graph engine (static_decode.cpp) as nine
// kernels per layer. Each operation below runs a fused CUDA kernel where the build has them and the
// tensors suit it, and otherwise the ATen ops it replaces (the CPU, which the tests compare with the
// eager loop, and any other case).
#include <ATen/ATen.h>

#include <initializer_list>
#include <optional>
#include <string>

#ifdef GROVE_CUDA_DECODE
#include <c10/cuda/CUDAStream.h>

#include "model/cuda_decode_kernels.hpp"
#endif

#include "grove/error.hpp"
#include "grove/model.hpp"
#include "model/layer.hpp"

namespace grove {
namespace {

#ifdef GROVE_CUDA_DECODE
// The kernels' dtype when every tensor is on CUDA with one dtype they take and unit inner stride.
std::optional<cuda_kernels::DType> kernel_dtype(std::initializer_list<at::Tensor> tensors) {
    const at::ScalarType type = tensors.begin()->scalar_type();
    if (type != at::kFloat && type != at::kBFloat16) return std::nullopt;
    for (const at::Tensor& t : tensors)
        if (!t.is_cuda() || t.scalar_type() != type || t.stride(-1) != 1) return std::nullopt;
    return type == at::kFloat ? cuda_kernels::DType::f32 : cuda_kernels::DType::bf16;
}
void* current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
void check(const char* error, const char* kernel) {
    if (error) throw Error(ErrorKind::runtime, std::string("CUDA decode kernel ") + kernel + ": " + error);
}
#endif

// h += delta (when defined), then the RMS norm of h. The CUDA kernel computes Llama's scaling only
// (Gemma's and OLMo's scale in float32 before the cast).
at::Tensor add_rms_norm(at::Tensor& h, const at::Tensor& delta, const at::Tensor& weight, double eps, NormScaling scaling) {
#ifdef GROVE_CUDA_DECODE
    const auto type = delta.defined() ? kernel_dtype({h, delta, weight}) : kernel_dtype({h, weight});
    if (type && scaling == NormScaling::after_cast && h.is_contiguous() && (!delta.defined() || delta.is_contiguous())) {
        at::Tensor y = at::empty_like(h);
        const int64_t H = h.size(-1);
        check(cuda_kernels::add_rms_norm(*type, h.data_ptr(), delta.defined() ? delta.data_ptr() : nullptr, weight.data_ptr(),
                                         y.data_ptr(), h.numel() / H, H, float(eps), current_stream()),
              "add_rms_norm");
        return y;
    }
#endif
    if (delta.defined()) h.add_(delta);
    return rms_norm(h, weight, eps, scaling);
}

// The rotary embedding of q [B, heads * D] (returned as [B, heads, D]) and of k, written with v at
// the cache's column. A partial rotary embedding (cos narrower than a head) takes the ATen path.
at::Tensor rotary_into_cache(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                             const at::Tensor& sin, at::Tensor& keys, at::Tensor& values, const at::Tensor& column) {
    const int64_t B = q.size(0), kv_heads = keys.size(1), capacity = keys.size(2), D = keys.size(3), heads = q.size(1) / D;
#ifdef GROVE_CUDA_DECODE
    const auto type = kernel_dtype({q, k, v, cos, sin, keys, values});
    if (type && cos.size(-1) == D && k.stride(0) == v.stride(0) && cos.is_contiguous() && sin.is_contiguous() &&
        keys.is_contiguous() && values.is_contiguous() && column.is_cuda()) {
        at::Tensor queries = at::empty({B, heads, D}, q.options());
        check(cuda_kernels::rotary_into_cache(*type, q.data_ptr(), k.data_ptr(), v.data_ptr(), q.stride(0), k.stride(0),
                                              cos.data_ptr(), sin.data_ptr(), queries.data_ptr(), keys.data_ptr(),
                                              values.data_ptr(), column.data_ptr<int64_t>(), B, heads, kv_heads, D, capacity,
                                              current_stream()),
              "rotary_into_cache");
        return queries;
    }
#endif
    const at::Tensor row_cos = cos.view({B, 1, -1}), row_sin = sin.view({B, 1, -1});
    const at::Tensor q_heads = q.view({B, heads, D}), k_heads = k.view({B, kv_heads, D});
    // float32 tables (OLMo 2) rotate in float32: the results go back to the projections' dtype
    keys.index_copy_(2, column, apply_rotary(k_heads, row_cos, row_sin).to(keys.scalar_type()).unsqueeze(2));
    values.index_copy_(2, column, v.view({B, kv_heads, 1, D}));
    return apply_rotary(q_heads, row_cos, row_sin).to(q.scalar_type());
}

// One query per head, queries [B, heads, D], on the visible columns of the cache: [B, heads * D].
// `split`: on CUDA, the columns may be split over several blocks (cuda_kernels::decode_attention).
at::Tensor decode_attention(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& visible, double scale, bool split) {
    const int64_t B = queries.size(0), heads = queries.size(1), kv_heads = keys.size(1), capacity = keys.size(2),
                  D = keys.size(3);
#ifdef GROVE_CUDA_DECODE
    const auto type = kernel_dtype({queries, keys, values});
    if (type && queries.is_contiguous() && keys.is_contiguous() && values.is_contiguous() && visible.is_cuda() &&
        visible.is_contiguous() && cuda_kernels::decode_attention_fits(heads, kv_heads, D, capacity)) {
        at::Tensor out = at::empty({B, heads * D}, queries.options());
        const size_t workspace_bytes = cuda_kernels::decode_attention_workspace(B, heads, kv_heads, D, capacity, split);
        at::Tensor workspace;
        if (workspace_bytes > 0) workspace = at::empty({int64_t(workspace_bytes)}, queries.options().dtype(at::kByte));
        check(cuda_kernels::decode_attention(*type, queries.data_ptr(), keys.data_ptr(), values.data_ptr(),
                                             visible.data_ptr<bool>(), out.data_ptr(), B, heads, kv_heads, D, capacity,
                                             float(scale), split, workspace.defined() ? workspace.data_ptr() : nullptr,
                                             current_stream()),
              "decode_attention");
        return out;
    }
#endif
    // each KV head's group of query heads as that head's queries: the fused SDPA kernels take no
    // grouped heads under a mask
    return at::scaled_dot_product_attention(queries.reshape({B, kv_heads, heads / kv_heads, D}), keys, values,
                                            visible.view({B, 1, 1, capacity}), 0.0, false, scale)
        .reshape({B, heads * D});
}

// act(gate) * up; the CUDA kernel computes silu's
at::Tensor activation_mul(const at::Tensor& gate, const at::Tensor& up, ModelConfig::Activation activation) {
#ifdef GROVE_CUDA_DECODE
    const auto type = kernel_dtype({gate, up});
    if (type && activation == ModelConfig::Activation::silu && gate.stride(0) == up.stride(0)) {
        const int64_t rows = gate.size(0), I = gate.size(1);
        at::Tensor out = at::empty({rows, I}, gate.options());
        check(cuda_kernels::silu_mul(*type, gate.data_ptr(), up.data_ptr(), gate.stride(0), out.data_ptr(), rows, I,
                                     current_stream()),
              "silu_mul");
        return out;
    }
#endif
    return gated_activation(gate, up, activation);
}

// [B, H] through the linears' concatenated weight (one GEMM) when the layer has it, else each.
std::vector<at::Tensor> project(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                std::initializer_list<const Linear*> linears) {
    std::vector<at::Tensor> out;
    if (!weight.defined()) {
        for (const Linear* l : linears) out.push_back((*l)(x));
        return out;
    }
    std::vector<int64_t> widths;
    for (const Linear* l : linears) widths.push_back(l->weight.size(0));
    return split_columns(at::linear(x, weight, bias), widths);
}

// q_norm and k_norm on the projections {q, k, v} [B, heads * D], over each head (Qwen3, Gemma 3) or
// the whole projection (OLMo 2: the weight is that wide); v is made contiguous too, so that k and v
// keep one row stride (the rotary kernel takes one for both).
void normalize_heads(std::vector<at::Tensor>& qkv, const at::Tensor& q_norm, const at::Tensor& k_norm, double eps,
                     NormScaling scaling) {
    const at::Tensor* weights[] = {&q_norm, &k_norm};
    for (size_t i = 0; i < 2; ++i) {
        const int64_t B = qkv[i].size(0), D = weights[i]->size(0);
        at::Tensor heads = qkv[i].contiguous().view({-1, D});
        qkv[i] = add_rms_norm(heads, at::Tensor(), *weights[i], eps, scaling).view({B, -1});
    }
    qkv[2] = qkv[2].contiguous();
}

}  // namespace

at::Tensor Model::decode_step_logits(const at::Tensor& token, const at::Tensor& position, const at::Tensor& visible,
                                     KVCache& cache) const {
    const ModelConfig& c = config_;
    if (c.attention_logit_softcap > 0)  // static_generate refuses such a model before it gets here
        throw Error(ErrorKind::usage, "decode_step_logits: the graph engine's decode step does not soft-cap attention");
    const int64_t B = token.size(0);
    if (token.numel() != B || position.numel() != B || visible.scalar_type() != at::kBool || visible.dim() != 2 ||
        visible.size(0) != B || visible.size(1) != cache.capacity || !cache.column.defined())
        throw Error(ErrorKind::runtime,
                    "decode_step_logits: one token and position per row, a [rows, capacity] bool mask "
                    "and the cache's column");
    // the sliding-window layers' columns: the last sliding_window up to cache.column (rows are contiguous)
    at::Tensor windowed;
    if (c.window_hides_keys(cache.capacity))
        windowed = visible.logical_and(at::arange(cache.capacity, cache.column.options()) > cache.column - c.sliding_window);
    const RotaryTables tables = rotary_tables(position.view({B, 1}));
    const double eps = c.rms_norm_eps;
    const bool gemma = c.gemma_norms;          // the attention's and MLP's outputs normed too, and the MLP's input
    const bool post_only = c.post_norms_only;  // OLMo 2: only the attention's and MLP's outputs normed
    const NormScaling scaling = c.norm_scaling;
    at::Tensor h = embed(token.view({B}));  // [B, H]
    at::Tensor delta;                       // what the last block adds to h: the next norm adds it
    // h += delta with no norm after it (OLMo 2's layer inputs)
    auto add_delta = [&] {
        if (delta.defined()) h.add_(delta);
        return h;
    };
    for (size_t l = 0; l < layers_.size(); ++l) {
        const Layer& layer = *layers_[l];
        at::Tensor x = post_only ? add_delta() : add_rms_norm(h, delta, layer.input_norm, eps, scaling);
        auto qkv =
            layer.fused() ? layer.project_qkv(x) : project(x, layer.qkv_weight, layer.qkv_bias, {&layer.q, &layer.k, &layer.v});
        if (layer.q_norm.defined()) normalize_heads(qkv, layer.q_norm, layer.k_norm, eps, scaling);
        const auto [cos, sin] = tables.layer(l, c);
        const at::Tensor queries = rotary_into_cache(qkv[0], qkv[1], qkv[2], cos.view({B, -1}), sin.view({B, -1}),
                                                     cache.keys[l], cache.values[l], cache.column);
        const at::Tensor& layer_visible = c.layer_windowed(l) && windowed.defined() ? windowed : visible;
        delta = layer.o(
            decode_attention(queries, cache.keys[l], cache.values[l], layer_visible, c.attention_scale, cache.split_attention));
        if (gemma || post_only) delta = rms_norm(delta, layer.post_attention_norm, eps, scaling);
        if (gemma)
            x = add_rms_norm(h, delta, layer.pre_feedforward_norm, eps, scaling);
        else
            x = post_only ? add_delta() : add_rms_norm(h, delta, layer.post_attention_norm, eps, scaling);
        const auto gate_up = layer.fused() ? layer.project_gate_up(x)
                                           : project(x, layer.gate_up_weight, layer.gate_up_bias, {&layer.gate, &layer.up});
        delta = layer.down(activation_mul(gate_up[0], gate_up[1], c.activation));
        if (gemma || post_only) delta = rms_norm(delta, layer.post_feedforward_norm, eps, scaling);
    }
    return logits(add_rms_norm(h, delta, norm_, eps, scaling));
}

}  // namespace grove
