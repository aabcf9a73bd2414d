// CPU kernels for the decode step of generate(): one new position per sequence, a few to a few
// dozen sequences, float32, no gradients.
//
// At these sizes ATen's general kernels spend most of their time outside arithmetic: GEMM libraries
// pack and wait on memory, and each of the ~40 element-wise ops of a decoder layer costs more in
// dispatch and allocation than in work. These kernels do the same arithmetic in place on raw
// buffers. No libtorch here; work is split over OpenMP threads, the same runtime (torch's libgomp)
// and pool as torch's own ops. The caller (Model, inside a DecodeKernelScope) checks dtypes,
// devices and layouts; every kernel needs AVX2 and FMA (decode_kernels_available()).
#pragma once

#include <cstdint>

namespace grove::kernels {

// Whether this CPU has AVX2 and FMA (checked once). Without them no kernel here may be called.
bool decode_kernels_available();

// y[m, n] = bias[n] + sum_k x[m, k] * w[n, k] for m < rows and n < N, float32 accumulation (8 lanes
// summed at the end: the order differs from a BLAS, the sum does not). x has row stride ldx, y row
// stride ldy, w is [N, K] contiguous and read in place (nothing to repack after an optimizer step),
// from memory once: passes over 4 rows of x at a time reuse it from cache while later weight rows
// are prefetched; bias may be null. Up to `threads` threads share the columns (each at least 2^18
// multiply-adds), taking chunks of them as they become free.
void small_batch_linear(const float* x, int64_t ldx, const float* w, const float* bias, float* y, int64_t ldy, int64_t rows,
                        int64_t K, int64_t N, int threads);

// Llama's RMSNorm on rows of H: y = weight * x / sqrt(mean(x^2) + eps), x and y [rows, H].
void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t H, float eps);

// Rotary embedding in place, transformers' rotate_half convention: for each row r and head,
// x[d] = x[d] cos[d] - x[d + D/2] sin[d] and x[d + D/2] = x[d + D/2] cos[d + D/2] + x[d] sin[d + D/2].
// x is [rows, heads, D], cos and sin [rows, D].
void rotary(float* x, const float* cos, const float* sin, int64_t rows, int64_t heads, int64_t D);

// y = silu(gate) * up, element-wise over n values (the SwiGLU MLP's middle).
void silu_mul(const float* gate, const float* up, float* y, int64_t n);

// One decode step of attention with a KV cache, grouped heads included. Writes this step's keys and
// values ([B, kv_heads, D]) at position S - 1 of the cache ([B, kv_heads, capacity, D] each), then
// for each sequence b and query head h (kv head h / (heads / kv_heads), as transformers' repeat_kv)
// out[b, h] = softmax_s(cap(scale q[b, h] . K[b, kv, s]) over s < S with visible[b * S + s]) . V[b, kv, s],
// cap(x) = softcap tanh(x / softcap) when softcap > 0 (Gemma 2), x otherwise.
// q and out are [B, heads, D]. At least one position per row must be visible.
void decode_attention(const float* q, const float* new_keys, const float* new_values, float* key_cache, float* value_cache,
                      int64_t capacity, const bool* visible, float* out, int64_t B, int64_t heads, int64_t kv_heads, int64_t S,
                      int64_t D, float scale, float softcap, int threads);

// One sampling step over rows of V logits, float32 (row stride ld): for each row r, with
// s = logits / temperature (temperature 1 leaves them as they are) and p = softmax(s),
//   tokens[r]      = the first token i with p[i] > 0 whose cumulative probability p[0] + ... + p[i]
//                    reaches uniforms[r] (in [0, 1)): inverse-CDF sampling, sums in float64;
//   logprobs[r]    = s[tokens[r]] - logsumexp(s), the sampled token's log-probability.
// Logits of -inf have probability 0 and are never drawn. A row whose logits are NaN or all -inf
// gets token -1 (the caller reports it). Rows are shared by up to `threads` threads.
void sample_softmax(const float* logits, int64_t ld, int64_t rows, int64_t V, float temperature, const double* uniforms,
                    int64_t* tokens, float* logprobs, int threads);

}  // namespace grove::kernels
