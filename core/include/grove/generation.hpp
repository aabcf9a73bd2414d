// Batched sampling with a preallocated KV cache, and the per-token log-probability function that
// training reuses. A GRPO generation batch is prompts x num_generations rows, generated at once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace grove {

class Model;
struct RunConfig;
struct TokenizerConfig;

struct SamplingOptions {
    int64_t max_new_tokens = 512;
    bool greedy = false;  // argmax; ignores the options below
    double temperature = 1.0;
    int64_t top_k = 0;                   // 0 disables
    double top_p = 1.0;                  // 1 disables
    double min_p = 0.0;                  // 0 disables
    double repetition_penalty = 1.0;     // 1 disables (CTRL-style, over prompt and completion tokens)
    std::vector<int64_t> eos_token_ids;  // stop a row at any of these
    int64_t pad_token_id = 0;            // fills rows after they stop (never used to build masks)
    uint64_t seed = 0;
};

struct GenerationResult {
    at::Tensor completion_ids;     // [N, C] long, right-padded with pad_token_id
    at::Tensor completion_mask;    // [N, C] long, 1 up to and including the first EOS
    at::Tensor truncated;          // [N] bool, no EOS within max_new_tokens
    at::Tensor sampled_logprobs;   // [N, C] float, log softmax(logits / temperature) of each sampled token (0 where masked)
    std::vector<int64_t> lengths;  // completion lengths (incl. EOS)
};

// The manifest's [generation] settings (the seed is the run's).
SamplingOptions sampling_options(const RunConfig& config);
// Stop at every EOS id of the checkpoint (config.json, generation_config.json) and the tokenizer;
// pad with the tokenizer's pad token, else the first EOS id.
void set_stop_tokens(SamplingOptions& options, const Model& model, const TokenizerConfig& tokenizer);

// Generates for every prompt (token ids, no padding; rows may differ in length). The same seed and
// inputs give the same completions on the same device.
GenerationResult generate(const Model& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& options);

// log p(target[b,t]) under logits / temperature, from final hidden states [B, T, H], computed
// `chunk_rows` positions at a time in float32 so the full [B, T, vocab] float32 tensor never exists.
// Differentiable with respect to hidden and the head weight. With `entropy`, also writes each
// position's entropy of softmax(logits / temperature), [B, T], without a graph (TRL's `entropy`).
at::Tensor token_logprobs(const Model& model, const at::Tensor& hidden, const at::Tensor& targets, double temperature,
                          int64_t chunk_rows = 1024, at::Tensor* entropy = nullptr);

// Log-probs [B, C] of completion tokens given left-padded prompts and right-padded completions:
// input = cat(prompt, completion), positions from the mask, logits at position t predict token t+1.
// Only the real tokens are computed (packed rows); masked completion positions hold 0.
at::Tensor completion_logprobs(const Model& model, const at::Tensor& prompt_ids, const at::Tensor& prompt_mask,
                               const at::Tensor& completion_ids, const at::Tensor& completion_mask, double temperature,
                               at::Tensor* entropy = nullptr);

}  // namespace grove
