// Pieces of sampling shared by the decode engines (generation.cpp's DecodeSession and the static
// engine of static_decode.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "grove/generation.hpp"

namespace grove::detail {

// HF's logits processors, in generate()'s order: repetition penalty, then temperature, top-k,
// top-p, min-p. `raw` are the model's logits, `scaled` = raw / temperature in float32 (computed once
// by the caller, reused when no penalty applies: the penalty acts before the temperature), `seen`
// [N, V] bool the tokens already in each row (the penalty only).
at::Tensor process_logits(const at::Tensor& raw, const at::Tensor& scaled, const at::Tensor& seen, const SamplingOptions& o);
// Whether process_logits changes anything for a vocabulary of V tokens.
bool filters_logits(const SamplingOptions& o, int64_t V);

// log p(token) under the temperature alone, from the scaled logits: what the sampler reports
at::Tensor log_probability(const at::Tensor& scaled, const at::Tensor& token);

// Prompts (token ids, no padding) as one left-padded batch on the CPU: ids [N, width] and a mask
// [N, width + extra_columns] (1 on real tokens) with room for the tokens to come.
struct LeftPadded {
    at::Tensor ids, mask;
    int64_t width = 0;
};
// A prompt id outside [0, vocab_size) is refused: the tokenizer is not the model's.
LeftPadded left_pad(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_token_id, int64_t extra_columns,
                    int64_t vocab_size);

// Before generating: Model::check_sequence_length on the longest sequence the model will be fed,
// the longest prompt and max_new_tokens - 1 (the last token is sampled, never fed).
void check_generation_length(const Model& model, const std::vector<std::vector<int64_t>>& prompts, int64_t max_new_tokens);

// token_logprobs' path on CUDA when gradients are recorded: log p(targets [M, 1]) of hidden rows
// [M, H] through the output layer `weight` [V, H] at `temperature`, `chunk_rows` rows at a time, with
// the same gradients as autograd's path but no logits kept for the backward (it recomputes them).
at::Tensor recomputed_token_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                     double temperature, int64_t chunk_rows);

}  // namespace grove::detail
