// Fused CUDA kernels for the static decode step (Model::decode_step_logits): one kernel where
// ATen's decode step runs several, because a captured decode step is bound by its number of kernels
// (about 60 per layer with ATen ops, measured on an H100; see docs/performance.md). Compiled by nvcc
// (cuda_decode_kernels.cu) without torch; this header names no CUDA type, so torch translation
// units include it without the CUDA headers. Each function launches on `stream` (a cudaStream_t)
// and returns nullptr, or the CUDA error's text. Builds without nvcc define no GROVE_CUDA_DECODE
// and call none of them.
//
// Every kernel rounds where the ATen ops it replaces round (each op's result is stored in the
// tensor's dtype), so a step in float32 matches ATen's to float rounding and one in bf16 differs
// only in the order of float sums.
#pragma once

#include <cstddef>
#include <cstdint>

namespace grove::cuda_kernels {

enum class DType { f32, bf16 };

// Per row of [rows, H]: h += delta (when delta is non-null, rounded to the dtype), then
// y = weight * (h * rsqrt(mean(h^2) + eps)), the RMS norm of model.cpp.
const char* add_rms_norm(DType dtype, void* h, const void* delta, const void* weight, void* y, int64_t rows, int64_t H,
                         float eps, void* stream);

// Rotary embedding of q [B, q_heads * D] (rows `q_stride` apart) into q_out [B, q_heads, D]; of
// k into the key cache and v unchanged into the value cache ([B, kv_heads, capacity, D] each), at
// the column *column (a device int64). k and v rows are `kv_stride` apart; cos and sin are [B, D].
const char* rotary_into_cache(DType dtype, const void* q, const void* k, const void* v, int64_t q_stride, int64_t kv_stride,
                              const void* cos, const void* sin, void* q_out, void* key_cache, void* value_cache,
                              const int64_t* column, int64_t B, int64_t q_heads, int64_t kv_heads, int64_t D, int64_t capacity,
                              void* stream);

// One query per head, q [B, q_heads, D], against the cache's columns that visible [B, capacity]
// (bool) marks; out [B, q_heads * D]. Query head h reads KV head h / (q_heads / kv_heads).
// Returns an error where decode_attention_fits does not hold: D > 256, more than 8 query heads per
// KV head, or scores that do not fit in 96 KiB of shared memory (about 3,000 columns for 7 heads).
// With `split`, when KV heads x rows are too few blocks to keep every SM busy, the columns are
// split over several blocks per head and row (flash-decoding) and a second kernel merges their
// results; `workspace` then holds decode_attention_workspace's bytes (device memory).
const char* decode_attention(DType dtype, const void* q, const void* key_cache, const void* value_cache, const bool* visible,
                             void* out, int64_t B, int64_t q_heads, int64_t kv_heads, int64_t D, int64_t capacity, float scale,
                             bool split, void* workspace, void* stream);
bool decode_attention_fits(int64_t q_heads, int64_t kv_heads, int64_t D, int64_t capacity);
// The device bytes decode_attention needs as its workspace (0: it runs unsplit).
size_t decode_attention_workspace(int64_t B, int64_t q_heads, int64_t kv_heads, int64_t D, int64_t capacity, bool split);

// One token per row of logits [rows, V] (contiguous), drawn from softmax(logits / temperature) by
// inverse CDF at uniforms[row] (device doubles; nullptr: greedy, the first largest logit), and its
// log-probability under that softmax (tokens: device int64). A row that is NaN or all -inf gets
// token 0 and sets *invalid (a device int) to 1, which the caller reads when it next synchronises.
const char* sample(DType dtype, const void* logits, int64_t rows, int64_t V, float temperature, const double* uniforms,
                   int64_t* tokens, float* logprobs, int* invalid, void* stream);

// out [rows, I] = silu(gate) * up, gate and up rows `stride` apart.
const char* silu_mul(DType dtype, const void* gate, const void* up, int64_t stride, void* out, int64_t rows, int64_t I,
                     void* stream);

}  // namespace grove::cuda_kernels
