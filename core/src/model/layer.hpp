// A decoder layer's weights, and the pieces of its computation that more than one file runs:
// model.cpp's forward passes and decode_step.cpp's static decode step. Internal to core/.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "grove/model.hpp"

namespace grove {

struct Model::Layer {
    at::Tensor input_norm, post_attention_norm;
    at::Tensor q_norm, k_norm;  // [head_dim], Qwen3 only: undefined for the other families
    Linear q, k, v, o, gate, up, down;
    // Phi-3's checkpoints hold q, k and v as one qkv_proj and gate and up as one gate_up_proj; its
    // model keeps them so (adapters attach to them under PEFT's names), and q, k, v, gate and up are
    // then unset.
    Linear qkv, gate_up;
    // Generation copies only (Model::generation_copy): q, k and v's weights as one matrix and gate
    // and up's as another, so that a decode step runs one GEMM for each; the Linears' weights (and
    // biases) are views of these.
    at::Tensor qkv_weight, gate_up_weight;
    std::optional<at::Tensor> qkv_bias, gate_up_bias;

    bool fused() const { return qkv.weight.defined(); }
    // The linears holding the layer's parameters, in checkpoint order: the attention's (q, k, v, o or
    // qkv, o) and the MLP's (gate, up, down or gate_up, down).
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

// The RMS norm in float32, cast back and scaled in x's dtype, as transformers computes it.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// The consecutive column blocks of y [..., sum(widths)], as views.
std::vector<at::Tensor> split_columns(const at::Tensor& y, const std::vector<int64_t>& widths);

// Qwen3's q_norm / k_norm: the RMS norm of each head_dim-wide head of x [..., heads * head_dim].
at::Tensor head_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace grove
