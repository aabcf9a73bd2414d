// A decoder layer's weights, and the pieces of its computation that more than one file runs:
// model.cpp's forward passes and decode_step.cpp's static decode step. Internal to core/.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "grove/model.hpp"

namespace grove {

struct Model::Layer {
    // Llama's two norms: before the attention and before the MLP. Gemma 3 (ModelConfig::gemma_norms)
    // has four: post_attention_norm then norms the attention's output, and the MLP's input and output
    // have their own. OLMo 2 (ModelConfig::post_norms_only) has no input_norm and norms the
    // attention's output (post_attention_norm) and the MLP's (post_feedforward_norm).
    at::Tensor input_norm, post_attention_norm;
    at::Tensor pre_feedforward_norm;   // Gemma 3 only
    at::Tensor post_feedforward_norm;  // Gemma 3 and OLMo 2
    at::Tensor q_norm, k_norm;         // Qwen3 and Gemma 3 ([head_dim]), OLMo 2 ([heads * head_dim])
    Linear q, k, v, o, gate, up, down;
    // Phi-3's checkpoints hold q, k and v as one qkv_proj and gate and up as one gate_up_proj; its
    // model keeps them so (adapters attach to them under PEFT's names), and q, k, v, gate and up are
    // then unset.
    Linear qkv, gate_up;
    // Generation copies (Model::generation_copy) and models that only generate
    // (Model::concatenate_projections): q, k and v's weights as one matrix and gate and up's as
    // another, so that a decode step runs one GEMM for each; the Linears' weights (and biases) are
    // views of these.
    at::Tensor qkv_weight, gate_up_weight;
    std::optional<at::Tensor> qkv_bias, gate_up_bias;

    // A sparse layer of a mixture of experts (ModelConfig::layer_sparse) has no gate, up and down: a
    // router (Qwen3-MoE's mlp.gate, Mixtral's block_sparse_moe.gate) and its experts' SwiGLUs
    // (Mixtral's w1, w3 and w2 as gate, up and down).
    struct Expert {
        Linear gate, up, down;
    };
    Linear router;
    std::vector<Expert> experts;
    Expert shared_expert;       // Qwen2-MoE only (ModelConfig::shared_expert_intermediate_size)
    Linear shared_expert_gate;  // its [1, hidden] gate

    bool fused() const { return qkv.weight.defined(); }
    bool sparse() const { return !experts.empty(); }
    // The linears holding the layer's parameters, in checkpoint order: the attention's (q, k, v, o or
    // qkv, o) and the MLP's (gate, up, down or gate_up, down; a sparse layer's router, then each
    // expert's gate, up and down).
    std::vector<Linear*> attention_linears();
    std::vector<Linear*> mlp_linears();
    std::vector<Linear*> linears();
    // {q, k, v} and {gate, up} of x [..., hidden]: one product each when the layer is fused
    std::vector<at::Tensor> project_qkv(const at::Tensor& x) const;
    std::vector<at::Tensor> project_gate_up(const at::Tensor& x) const;
};

// The rotary embedding of x as transformers applies it: x * cos + rotate_half(x) * sin, with
// rotate_half(x) = cat(-x[..., half:], x[..., :half]); each op rounds in x's dtype. Where cos is
// narrower than x (partial_rotary_factor), only x's leading dimensions are rotated.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The RMS norm in float32, cast back and scaled in x's dtype, as transformers' Llama computes it; or
// scaled in float32 before the cast (OLMo 2), or by (1 + weight) in float32 before the cast (Gemma 3,
// whose weights start at zero).
using NormScaling = ModelConfig::NormScaling;
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, NormScaling scaling = NormScaling::after_cast);

// The consecutive column blocks of y [..., sum(widths)], as views.
std::vector<at::Tensor> split_columns(const at::Tensor& y, const std::vector<int64_t>& widths);

// q_norm / k_norm: the RMS norm of each weight-wide block of x [..., heads * head_dim]: each head
// (Qwen3, Gemma 3), or the whole projection (OLMo 2, whose weight is that wide).
at::Tensor head_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                         NormScaling scaling = NormScaling::after_cast);

// The gated MLP's middle: act(gate) * up, act silu (SwiGLU) or tanh-approximated gelu (Gemma's GeGLU).
at::Tensor gated_activation(const at::Tensor& gate, const at::Tensor& up, ModelConfig::Activation activation);

// Each layer's rotary tables: the rotation of the positions (rope_theta and its scaling), Gemma 3's
// local one for its sliding layers, and the identity for SmolLM3's NoPE layers (cos 1, sin 0 leave q
// and k exactly as they are). [B, 1, T, D] each, in the model's dtype (float32 for OLMo 2).
struct Model::RotaryTables {
    at::Tensor cos, sin;
    at::Tensor local_cos, local_sin;        // undefined unless the model has local layers
    at::Tensor identity_cos, identity_sin;  // undefined unless the model has NoPE layers
    std::pair<const at::Tensor&, const at::Tensor&> layer(size_t index, const ModelConfig& config) const {
        if (!config.layer_rotated(index)) return {identity_cos, identity_sin};
        if (config.layer_rotated_locally(index)) return {local_cos, local_sin};
        return {cos, sin};
    }
};

}  // namespace grove
