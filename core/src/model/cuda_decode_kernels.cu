#include "model/cuda_decode_kernels.hpp"

#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>

namespace grove::cuda_kernels {
namespace {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16(x);  // round to nearest even, as ATen's casts
}
// x stored in T and read back: where an ATen op on T tensors rounds its result
template <typename T>
__device__ __forceinline__ float rounded(float x) {
    return to_float(from_float<T>(x));
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}
// The block's total (max when `take_max`) of each thread's x; every thread gets it. `scratch` holds
// one float per warp.
__device__ float block_reduce(float x, float* scratch, bool take_max) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
    x = take_max ? warp_max(x) : warp_sum(x);
    __syncthreads();  // scratch may still be read by an earlier reduction
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    float total = take_max ? -INFINITY : 0.0f;
    for (int w = 0; w < warps; ++w) total = take_max ? fmaxf(total, scratch[w]) : total + scratch[w];
    return total;
}

// dst[place(i)] = float(src[i]) for i < n, by the whole block, kInFlight loads issued before any is
// used: these kernels run few blocks per SM, so a loop that waited on each load in turn would pay
// the memory latency per element.
constexpr int kInFlight = 16;
template <typename T, typename Place>
__device__ void load_floats(const T* src, int n, float* dst, Place place) {
    for (int base = threadIdx.x; base < n; base += blockDim.x * kInFlight) {
        float v[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
            const int i = base + u * blockDim.x;
            v[u] = i < n ? to_float(src[i]) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
            const int i = base + u * blockDim.x;
            if (i < n) dst[place(i)] = v[u];
        }
    }
}

constexpr int kThreads = 256;

template <typename T>
__global__ void add_rms_norm_kernel(T* h, const T* delta, const T* weight, T* y, int H, float eps) {
    __shared__ float scratch[32];
    T* row = h + int64_t(blockIdx.x) * H;
    const T* row_delta = delta ? delta + int64_t(blockIdx.x) * H : nullptr;
    float squares = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float v = to_float(row[i]);
        if (row_delta) {
            v = rounded<T>(v + to_float(row_delta[i]));
            row[i] = from_float<T>(v);
        }
        squares += v * v;
    }
    const float inverse = rsqrtf(block_reduce(squares, scratch, false) / float(H) + eps);
    T* out = y + int64_t(blockIdx.x) * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x)  // each thread reads back what it wrote
        out[i] = from_float<T>(to_float(weight[i]) * rounded<T>(to_float(row[i]) * inverse));
}

// q*cos + rotate_half(q)*sin with rotate_half(x) = cat(-x[half:], x[:half]), each product and the
// sum rounded to T as ATen's three ops round them
template <typename T>
__device__ __forceinline__ T rotated(const T* head, const T* cos, const T* sin, int d, int D) {
    const int half = D / 2;
    const float x = to_float(head[d]);
    const float partner = d < half ? -to_float(head[d + half]) : to_float(head[d - half]);
    return from_float<T>(rounded<T>(x * to_float(cos[d])) + rounded<T>(partner * to_float(sin[d])));
}

template <typename T>
__global__ void rotary_into_cache_kernel(const T* q, const T* k, const T* v, int64_t q_stride, int64_t kv_stride, const T* cos,
                                         const T* sin, T* q_out, T* key_cache, T* value_cache, const int64_t* column,
                                         int q_heads, int kv_heads, int D, int64_t capacity) {
    const int64_t b = blockIdx.x;
    const T* row_cos = cos + b * D;
    const T* row_sin = sin + b * D;
    const int64_t col = *column;
    const int q_elements = q_heads * D, kv_elements = kv_heads * D;
    for (int i = threadIdx.x; i < q_elements + 2 * kv_elements; i += blockDim.x) {
        if (i < q_elements) {
            const int head = i / D, d = i % D;
            q_out[b * q_elements + i] = rotated(q + b * q_stride + head * D, row_cos, row_sin, d, D);
            continue;
        }
        const bool is_key = i < q_elements + kv_elements;
        const int j = i - q_elements - (is_key ? 0 : kv_elements), head = j / D, d = j % D;
        const int64_t at = ((b * kv_heads + head) * capacity + col) * D + d;
        if (is_key)
            key_cache[at] = rotated(k + b * kv_stride + head * D, row_cos, row_sin, d, D);
        else
            value_cache[at] = v[b * kv_stride + j];
    }
}

constexpr int kAttentionThreads = 256, kMaxHeadDim = 256, kMaxGroup = 8, kKeyTile = 64;
constexpr size_t kMaxAttentionShared = 96 * 1024;  // opt-in shared memory that A100 and H100 both give
static_assert(kAttentionThreads / 32 >= kMaxGroup, "a warp per query head of a group");

// Shared memory: the group's queries [group, D], scores [group, span], partial outputs
// [parts, group, D] (parts = threads / D), a tile of keys [kKeyTile, D + 1] and the row's mask
// [span], in floats, where span is the columns one block attends to.
size_t attention_shared_bytes(int64_t group, int64_t D, int64_t span) {
    const int64_t parts = kAttentionThreads / D;
    return sizeof(float) * size_t(group * D + group * span + parts * group * D + kKeyTile * (D + 1) + span);
}

// One block per (KV head, row, split), for the query heads that share the KV head (its group), so
// keys and values are read once; split z attends to the columns [z * span, (z + 1) * span). Scores:
// the keys a tile of columns at a time into shared memory (read coalesced), then each thread one
// (column, head) dot product. The softmax per head, a warp each. Values, a tile at a time likewise:
// each thread sums one dimension over a share of the columns. As in ATen's fused attention, the
// normaliser sums the float weights and the values are weighted by them in T.
// With one split, the block writes the output. With several (flash-decoding: more blocks than
// KV heads x rows, when those are too few to keep the GPU busy), it writes its unnormalised sums,
// its largest score and its normaliser to `partials` [B, q_heads, splits, D + 2], and
// combine_attention_kernel merges them.
template <typename T>
__global__ void decode_attention_kernel(const T* q, const T* key_cache, const T* value_cache, const bool* visible, T* out,
                                        float* partials, int q_heads, int kv_heads, int D, int64_t capacity, int64_t span,
                                        float scale) {
    extern __shared__ float shared[];
    __shared__ float totals[kMaxGroup], tops[kMaxGroup], reduce_scratch[kAttentionThreads / 32];
    const int kv_head = blockIdx.x, b = blockIdx.y, group = q_heads / kv_heads, parts = blockDim.x / D;
    const int64_t begin = int64_t(blockIdx.z) * span;
    int64_t n = (capacity - begin < span ? capacity - begin : span);
    float* query = shared;                      // [group, D]
    float* scores = query + group * D;          // [group, span]
    float* partial = scores + group * span;     // [parts, group, D]
    float* tile = partial + parts * group * D;  // [kKeyTile, D + 1]: the padding spreads a column's reads over banks
    float* seen = tile + kKeyTile * (D + 1);    // [span]: 1 where the row attends to the column
    const T* keys = key_cache + ((int64_t(b) * kv_heads + kv_head) * capacity + begin) * D;
    const T* values = value_cache + ((int64_t(b) * kv_heads + kv_head) * capacity + begin) * D;
    const bool* row_visible = visible + int64_t(b) * capacity + begin;
    const T* row_q = q + (int64_t(b) * q_heads + int64_t(kv_head) * group) * D;
    const int64_t first_head = int64_t(b) * q_heads + int64_t(kv_head) * group;  // of [B, q_heads]
    load_floats(row_q, group * D, query, [](int i) { return i; });
    float last_visible = -1.0f;  // exact as a float: a cache holds far fewer than 2^24 columns
    for (int64_t s = threadIdx.x; s < n; s += blockDim.x) {
        seen[s] = row_visible[s] ? 1.0f : 0.0f;
        if (row_visible[s]) last_visible = float(s);
    }
    // The columns after the last visible one (those of tokens not generated yet: the cache is
    // allocated for the longest row) are neither read nor weighed; they would weigh 0, so the sums
    // are the same. A split with none visible adds nothing (its largest score -inf). n is the same
    // for the whole block.
    n = int64_t(block_reduce(last_visible, reduce_scratch, true)) + 1;
    if (n == 0 && partials) {
        for (int i = threadIdx.x; i < group * (D + 2); i += blockDim.x) {
            const int g = i / (D + 2), j = i % (D + 2);
            partials[((first_head + g) * gridDim.z + blockIdx.z) * (D + 2) + j] = j == D ? -INFINITY : 0.0f;
        }
        return;
    }

    for (int64_t first = 0; first < n; first += kKeyTile) {
        const int columns = int(n - first < kKeyTile ? n - first : kKeyTile);
        __syncthreads();  // the previous tile is used up (and the queries are written)
        load_floats(keys + first * D, columns * D, tile, [D](int i) { return (i / D) * (D + 1) + i % D; });
        __syncthreads();
        for (int i = threadIdx.x; i < columns * group; i += blockDim.x) {
            const int column = i % columns, g = i / columns;
            float dot = 0.0f;
            for (int d = 0; d < D; ++d) dot += query[g * D + d] * tile[column * (D + 1) + d];
            scores[g * span + first + column] = seen[first + column] != 0.0f ? dot * scale : -INFINITY;
        }
    }
    __syncthreads();
    // the softmax of head g by warp g (a block has at least kMaxGroup warps)
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (warp < group) {
        float* row = scores + warp * span;
        float top = -INFINITY;
        for (int64_t s = lane; s < n; s += 32) top = fmaxf(top, row[s]);
        top = warp_max(top);
        float total = 0.0f;
        for (int64_t s = lane; s < n; s += 32) {
            const float p = row[s] == -INFINITY ? 0.0f : __expf(row[s] - top);
            row[s] = p;
            total += p;
        }
        total = warp_sum(total);
        if (lane == 0) totals[warp] = total, tops[warp] = top;
    }
    __syncthreads();  // every weight and total written

    // values a tile at a time into shared memory too: a thread's loop over columns then waits on no
    // global load (masked columns weigh 0 and hold finite values)
    const int d = threadIdx.x % D, part = threadIdx.x / D;
    float sums[kMaxGroup] = {};
    for (int64_t first = 0; first < n; first += kKeyTile) {
        const int columns = int(n - first < kKeyTile ? n - first : kKeyTile);
        load_floats(values + first * D, columns * D, tile, [](int i) { return i; });
        __syncthreads();
        if (part < parts)
            for (int column = part; column < columns; column += parts) {
                const float v = tile[column * D + d];
#pragma unroll
                for (int g = 0; g < kMaxGroup; ++g)  // a fixed bound keeps sums in registers
                    if (g < group) sums[g] += rounded<T>(scores[g * span + first + column]) * v;
            }
        __syncthreads();  // the tile is used up
    }
    if (part < parts) {
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g)
            if (g < group) partial[(part * group + g) * D + d] = sums[g];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
        const int g = i / D;
        float sum = 0.0f;
        for (int p = 0; p < parts; ++p) sum += partial[(p * group + g) * D + i % D];
        if (!partials) {
            out[first_head * D + i] = from_float<T>(totals[g] > 0.0f ? sum / totals[g] : 0.0f);
            continue;
        }
        float* mine = partials + ((first_head + g) * gridDim.z + blockIdx.z) * (D + 2);
        mine[i % D] = sum;
        if (i % D == 0) mine[D] = tops[g], mine[D + 1] = totals[g];
    }
}

// The splits of one (row, query head) per block, a thread per dimension: each split's sums and
// normaliser rescaled to the largest score of all, then out = sums / normaliser. A split with no
// visible column (largest score -inf) adds nothing.
template <typename T>
__global__ void combine_attention_kernel(const float* partials, T* out, int D, int splits) {
    const int64_t head = blockIdx.x;  // of [B, q_heads]
    const float* split = partials + head * splits * (D + 2);
    float top = -INFINITY;
    for (int z = 0; z < splits; ++z) top = fmaxf(top, split[z * (D + 2) + D]);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float sum = 0.0f, total = 0.0f;
        for (int z = 0; z < splits; ++z) {
            const float* mine = split + z * (D + 2);
            if (mine[D] == -INFINITY) continue;
            const float weight = __expf(mine[D] - top);
            sum += weight * mine[d];
            total += weight * mine[D + 1];
        }
        out[head * D + d] = from_float<T>(total > 0.0f ? sum / total : 0.0f);
    }
}

// Blocks per SM the split attention aims for: a few, so that loads of one block overlap another's.
constexpr int64_t kAttentionBlocksPerSm = 4;

// How decode_attention divides the columns: `splits` blocks per KV head and row, `span` columns
// each (a multiple of the key tile; no split is empty).
struct AttentionSplit {
    int64_t splits = 1, span = 0;
};
// The current device's SM count (0 if unknown), asked once per device.
int multiprocessors() {
    static std::atomic<int> known[64];
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
    if ((count = known[device].load()) > 0) return count;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    known[device].store(count);
    return count;
}

AttentionSplit attention_split(int64_t B, int64_t kv_heads, int64_t capacity, bool split) {
    AttentionSplit plan{1, capacity};
    const int sms = split ? multiprocessors() : 0;
    if (sms <= 0 || B * kv_heads <= 0) return plan;
    const int64_t blocks = B * kv_heads, wanted = (kAttentionBlocksPerSm * sms + blocks - 1) / blocks;
    const int64_t tiles = (capacity + kKeyTile - 1) / kKeyTile;
    const int64_t splits = std::min<int64_t>(std::min<int64_t>(wanted, tiles), 65535);
    if (splits <= 1) return plan;
    plan.span = ((tiles + splits - 1) / splits) * kKeyTile;
    plan.splits = (capacity + plan.span - 1) / plan.span;
    return plan;
}

constexpr int kSampleThreads = 1024;

// One row per block. The largest scaled logit s = x / temperature (and, greedy, its first index);
// the softmax's normaliser over contiguous chunks of the vocabulary, one per thread; their
// exclusive scan (cub), and the inverse CDF: the first token whose cumulative weight reaches
// u * total (searchsorted's left side), found by the one thread whose chunk the target falls in.
// The token's log-probability is s - max - log(total). A row that is NaN or all -inf gets token 0
// and sets *invalid.
template <typename T>
__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const T* logits, int64_t V, float temperature, const double* uniforms, int64_t* tokens, float* logprobs,
                  int* invalid) {
    using Scan = cub::BlockScan<float, kSampleThreads>;
    __shared__ typename Scan::TempStorage scan_storage;
    __shared__ float prefixes[kSampleThreads + 1], top_values[32];
    __shared__ int64_t top_indices[32];
    const T* row = logits + int64_t(blockIdx.x) * V;
    const bool divide = temperature != 1.0f;
    auto scaled = [&](int64_t i) { return divide ? to_float(row[i]) / temperature : to_float(row[i]); };

    float top = -INFINITY;
    int64_t top_index = V;
    bool nan = false;
    constexpr int kUnroll = 8;  // loads in flight per thread (see load_floats)
    for (int64_t base = threadIdx.x; base < V; base += int64_t(blockDim.x) * kUnroll) {
        float v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t i = base + int64_t(u) * blockDim.x;
            v[u] = i < V ? scaled(i) : -INFINITY;
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {  // a thread sees its indices in increasing order
            nan = nan || isnan(v[u]);
            if (v[u] > top) top = v[u], top_index = base + int64_t(u) * blockDim.x;
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const float other = __shfl_xor_sync(0xffffffffu, top, offset);
        const int64_t other_index = __shfl_xor_sync(0xffffffffu, top_index, offset);
        if (other > top || (other == top && other_index < top_index)) top = other, top_index = other_index;
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) top_values[warp] = top, top_indices[warp] = top_index;
    nan = __syncthreads_or(nan);
    top = -INFINITY, top_index = V;
    for (int w = 0; w < int(blockDim.x / 32); ++w)
        if (top_values[w] > top || (top_values[w] == top && top_indices[w] < top_index))
            top = top_values[w], top_index = top_indices[w];
    if (nan || !(top > -INFINITY)) {
        if (threadIdx.x == 0) tokens[blockIdx.x] = 0, logprobs[blockIdx.x] = NAN, *invalid = 1;
        return;
    }

    const int64_t chunk = (V + blockDim.x - 1) / blockDim.x, begin = threadIdx.x * chunk;
    const int64_t end = begin + chunk < V ? begin + chunk : V;
    float sum = 0.0f;
    for (int64_t base = begin; base < end; base += kUnroll) {
        float v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = base + u < end ? scaled(base + u) : -INFINITY;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) sum += __expf(v[u] - top);  // in index order, as the walk below
    }
    float prefix, total;
    Scan(scan_storage).ExclusiveSum(sum, prefix, total);
    prefixes[threadIdx.x] = prefix;
    if (threadIdx.x == 0) prefixes[blockDim.x] = INFINITY;
    __syncthreads();
    if (!uniforms) {  // greedy
        if (threadIdx.x == 0) tokens[blockIdx.x] = top_index, logprobs[blockIdx.x] = -logf(total);
        return;
    }
    const float target = float(uniforms[blockIdx.x] * double(total));
    // the one thread whose chunk holds the target: prefixes only grow, so exactly one has
    // prefix < target <= the next prefix (the last chunk takes what rounding leaves past the total)
    const bool first_chunk_holds_zero = threadIdx.x == 0 && !(target > 0.0f);
    if (!first_chunk_holds_zero && !(prefix < target && target <= prefixes[threadIdx.x + 1])) return;
    float cumulative = prefix;
    int64_t token = -1, last_drawable = -1;
    for (int64_t i = begin; i < end && token < 0; ++i) {
        const float weight = __expf(scaled(i) - top);
        cumulative += weight;
        if (weight > 0.0f) last_drawable = i;
        if (cumulative >= target && weight > 0.0f) token = i;
    }
    // rounding left the target past this chunk's own sum: its last drawable token, or the top one
    if (token < 0) token = last_drawable >= 0 ? last_drawable : top_index;
    tokens[blockIdx.x] = token;
    logprobs[blockIdx.x] = scaled(token) - top - logf(total);
}

template <typename T>
__global__ void silu_mul_kernel(const T* gate, const T* up, int64_t stride, T* out, int64_t rows, int64_t I) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * I; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r = i / I, j = i % I;
        const float g = to_float(gate[r * stride + j]);
        out[i] = from_float<T>(rounded<T>(g / (1.0f + expf(-g))) * to_float(up[r * stride + j]));
    }
}

const char* launched() {
    const cudaError_t error = cudaGetLastError();
    return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

// Runs `launch` with the kernel's element type for `dtype`.
template <typename Launch>
const char* with_type(DType dtype, Launch&& launch) {
    if (dtype == DType::bf16)
        launch(__nv_bfloat16{});
    else
        launch(float{});
    return launched();
}

}  // namespace

const char* add_rms_norm(DType dtype, void* h, const void* delta, const void* weight, void* y, int64_t rows, int64_t H,
                         float eps, void* stream) {
    return with_type(dtype, [&](auto zero) {
        using T = decltype(zero);
        add_rms_norm_kernel<T><<<unsigned(rows), kThreads, 0, cudaStream_t(stream)>>>(
            static_cast<T*>(h), static_cast<const T*>(delta), static_cast<const T*>(weight), static_cast<T*>(y), int(H), eps);
    });
}

const char* rotary_into_cache(DType dtype, const void* q, const void* k, const void* v, int64_t q_stride, int64_t kv_stride,
                              const void* cos, const void* sin, void* q_out, void* key_cache, void* value_cache,
                              const int64_t* column, int64_t B, int64_t q_heads, int64_t kv_heads, int64_t D, int64_t capacity,
                              void* stream) {
    return with_type(dtype, [&](auto zero) {
        using T = decltype(zero);
        rotary_into_cache_kernel<T><<<unsigned(B), kThreads, 0, cudaStream_t(stream)>>>(
            static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), q_stride, kv_stride,
            static_cast<const T*>(cos), static_cast<const T*>(sin), static_cast<T*>(q_out), static_cast<T*>(key_cache),
            static_cast<T*>(value_cache), column, int(q_heads), int(kv_heads), int(D), capacity);
    });
}

bool decode_attention_fits(int64_t q_heads, int64_t kv_heads, int64_t D, int64_t capacity) {
    const int64_t group = q_heads / kv_heads;
    return D <= kMaxHeadDim && group <= kMaxGroup && attention_shared_bytes(group, D, capacity) <= kMaxAttentionShared;
}

size_t decode_attention_workspace(int64_t B, int64_t q_heads, int64_t kv_heads, int64_t D, int64_t capacity, bool split) {
    const AttentionSplit plan = attention_split(B, kv_heads, capacity, split);
    return plan.splits == 1 ? 0 : sizeof(float) * size_t(B * q_heads * plan.splits * (D + 2));
}

const char* decode_attention(DType dtype, const void* q, const void* key_cache, const void* value_cache, const bool* visible,
                             void* out, int64_t B, int64_t q_heads, int64_t kv_heads, int64_t D, int64_t capacity, float scale,
                             bool split, void* workspace, void* stream) {
    if (!decode_attention_fits(q_heads, kv_heads, D, capacity))
        return "decode_attention: head_dim > 256, more than 8 query heads per KV head, or too long a cache";
    const AttentionSplit plan = attention_split(B, kv_heads, capacity, split);
    if (plan.splits > 1 && !workspace) return "decode_attention: a split attention needs its workspace";
    const size_t shared = attention_shared_bytes(q_heads / kv_heads, D, plan.span);
    float* partials = plan.splits > 1 ? static_cast<float*>(workspace) : nullptr;
    return with_type(dtype, [&](auto zero) {
        using T = decltype(zero);
        // beyond 48 KiB a block's shared memory (the dynamic part plus the kernel's static arrays,
        // under 1 KiB) needs the opt-in
        if (shared + 1024 > 48 * 1024)
            cudaFuncSetAttribute(decode_attention_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
        decode_attention_kernel<T>
            <<<dim3(unsigned(kv_heads), unsigned(B), unsigned(plan.splits)), kAttentionThreads, shared, cudaStream_t(stream)>>>(
                static_cast<const T*>(q), static_cast<const T*>(key_cache), static_cast<const T*>(value_cache), visible,
                static_cast<T*>(out), partials, int(q_heads), int(kv_heads), int(D), capacity, plan.span, scale);
        if (partials)
            combine_attention_kernel<T>
                <<<unsigned(B * q_heads), unsigned(std::min<int64_t>(D, kAttentionThreads)), 0, cudaStream_t(stream)>>>(
                    partials, static_cast<T*>(out), int(D), int(plan.splits));
    });
}

const char* sample(DType dtype, const void* logits, int64_t rows, int64_t V, float temperature, const double* uniforms,
                   int64_t* tokens, float* logprobs, int* invalid, void* stream) {
    return with_type(dtype, [&](auto zero) {
        using T = decltype(zero);
        sample_kernel<T><<<unsigned(rows), kSampleThreads, 0, cudaStream_t(stream)>>>(
            static_cast<const T*>(logits), V, temperature, uniforms, tokens, logprobs, invalid);
    });
}

const char* silu_mul(DType dtype, const void* gate, const void* up, int64_t stride, void* out, int64_t rows, int64_t I,
                     void* stream) {
    const int64_t blocks = std::min<int64_t>((rows * I + kThreads - 1) / kThreads, 65535);
    return with_type(dtype, [&](auto zero) {
        using T = decltype(zero);
        silu_mul_kernel<T><<<unsigned(blocks), kThreads, 0, cudaStream_t(stream)>>>(
            static_cast<const T*>(gate), static_cast<const T*>(up), stride, static_cast<T*>(out), rows, I);
    });
}

}  // namespace grove::cuda_kernels
