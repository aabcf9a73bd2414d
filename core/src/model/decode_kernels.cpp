#include "model/decode_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

namespace grove::kernels {
namespace {

#define GROVE_AVX2 __attribute__((target("avx2,fma")))
// the partial sums live in registers only if the fixed-count loops are fully unrolled
#define GROVE_UNROLL _Pragma("GCC unroll 16")

GROVE_AVX2 inline float horizontal_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// ROWS rows of x against WEIGHTS consecutive weight rows: ROWS x WEIGHTS dot products of length K,
// each kept as 8 partial sums in one register (3 x 4 = 12 of the 16 ymm registers, plus the weight
// vectors; more spill and run at half speed). As k advances it also asks for the 64-byte lines of
// [ahead, ahead_end), evenly spread, to be brought into cache: weight rows a later block will need.
template <int WEIGHTS, int ROWS>
GROVE_AVX2 void block(const float* x, int64_t ldx, const float* w, int64_t K, const float* bias, float* y, int64_t ldy,
                      const char* ahead, const char* ahead_end) {
    __m256 acc[ROWS][WEIGHTS];
    GROVE_UNROLL for (int m = 0; m < ROWS; ++m) GROVE_UNROLL for (int n = 0; n < WEIGHTS; ++n) acc[m][n] = _mm256_setzero_ps();
    const int64_t full = K & ~int64_t(7);
    const int64_t ahead_per_step = full ? ((ahead_end - ahead) * 8 + full - 1) / full : 0;
    const char* requested_to = ahead;
    for (int64_t k = 0; k < full; k += 8) {
        __m256 wv[WEIGHTS];
        GROVE_UNROLL for (int n = 0; n < WEIGHTS; ++n) wv[n] = _mm256_loadu_ps(w + n * K + k);
        for (requested_to += ahead_per_step; ahead < requested_to && ahead < ahead_end; ahead += 64)
            _mm_prefetch(ahead, _MM_HINT_T1);
        GROVE_UNROLL for (int m = 0; m < ROWS; ++m) {
            __m256 xv = _mm256_loadu_ps(x + m * ldx + k);
            GROVE_UNROLL for (int n = 0; n < WEIGHTS; ++n) acc[m][n] = _mm256_fmadd_ps(xv, wv[n], acc[m][n]);
        }
    }
    if (full < K) {  // the last K % 8 columns through a lane mask
        alignas(32) int32_t lanes[8];
        for (int i = 0; i < 8; ++i) lanes[i] = full + i < K ? -1 : 0;
        __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
        __m256 wv[WEIGHTS];
        for (int n = 0; n < WEIGHTS; ++n) wv[n] = _mm256_maskload_ps(w + n * K + full, mask);
        for (int m = 0; m < ROWS; ++m) {
            __m256 xv = _mm256_maskload_ps(x + m * ldx + full, mask);
            for (int n = 0; n < WEIGHTS; ++n) acc[m][n] = _mm256_fmadd_ps(xv, wv[n], acc[m][n]);
        }
    }
    for (int m = 0; m < ROWS; ++m)
        for (int n = 0; n < WEIGHTS; ++n) {
            float sum = horizontal_sum(acc[m][n]);
            y[m * ldy + n] = bias ? sum + bias[n] : sum;
        }
}

// All rows of x against WEIGHTS weight rows, in passes of 4 rows of x (then 2, then 1). Only the first
// pass reads the weight rows from memory; the others find them in cache. So that memory keeps
// streaming during those compute-only passes, the bytes [ahead, ahead_end) of weight rows needed
// later are split evenly over all passes and requested as they run.
template <int WEIGHTS>
GROVE_AVX2 void weight_rows(const float* x, int64_t ldx, const float* w, int64_t K, const float* bias, float* y, int64_t ldy,
                            int64_t rows, const char* ahead, const char* ahead_end) {
    const int64_t passes = rows / 4 + (rows % 4) / 2 + rows % 2;
    int64_t pass = 0;
    auto share = [&](int64_t p) { return ahead + (ahead_end - ahead) * p / passes; };
    int64_t m = 0;
    for (; m + 4 <= rows; m += 4, ++pass)
        block<WEIGHTS, 4>(x + m * ldx, ldx, w, K, bias, y + m * ldy, ldy, share(pass), share(pass + 1));
    if (m + 2 <= rows) {
        block<WEIGHTS, 2>(x + m * ldx, ldx, w, K, bias, y + m * ldy, ldy, share(pass), share(pass + 1));
        m += 2, ++pass;
    }
    if (m < rows) block<WEIGHTS, 1>(x + m * ldx, ldx, w, K, bias, y + m * ldy, ldy, share(pass), share(pass + 1));
}

// 3 weight rows per block and prefetching 2 blocks ahead: the fastest of the combinations tried
// (1-4 weight rows, 1-8 rows of x, 1-8 blocks ahead) at the 135M shape on the CI machine
constexpr int kWeights = 3, kBlocksAhead = 2;

// Columns [n_begin, n_end) of small_batch_linear; prefetching looks ahead up to column n_limit
GROVE_AVX2 void linear_columns(const float* x, int64_t ldx, const float* w, const float* bias, float* y, int64_t ldy,
                               int64_t rows, int64_t K, int64_t n_begin, int64_t n_end, int64_t n_limit) {
    const char* last = reinterpret_cast<const char*>(w + n_limit * K);
    auto bytes_of_row = [&](int64_t n) { return std::min(reinterpret_cast<const char*>(w + n * K), last); };
    int64_t n = n_begin;
    for (; n + kWeights <= n_end; n += kWeights)
        weight_rows<kWeights>(x, ldx, w + n * K, K, bias ? bias + n : nullptr, y + n, ldy, rows,
                              bytes_of_row(n + kBlocksAhead * kWeights), bytes_of_row(n + (kBlocksAhead + 1) * kWeights));
    for (; n < n_end; ++n) weight_rows<1>(x, ldx, w + n * K, K, bias ? bias + n : nullptr, y + n, ldy, rows, last, last);
}

GROVE_AVX2 float dot(const float* a, const float* b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float sum = horizontal_sum(acc);
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

// y += a * x over n values
GROVE_AVX2 void add_scaled(float* y, const float* x, float a, int64_t n) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += a * x[i];
}

// e^x in 8 lanes (Cephes' expf: x = n ln2 + r, a degree-5 polynomial for e^r, 2^n from the exponent
// bits; within 2 ulp of expf for x in [-87, 88], which covers every value it is given here)
GROVE_AVX2 __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
        p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(c));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

// out[i] = e^(x[i] - shift) over n values
GROVE_AVX2 void exp_shifted(const float* x, float shift, float* out, int64_t n) {
    const __m256 sv = _mm256_set1_ps(shift);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sv)));
    if (i < n) {
        alignas(32) float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        std::copy(x + i, x + n, lanes);
        _mm256_store_ps(lanes, exp8(_mm256_sub_ps(_mm256_load_ps(lanes), sv)));
        std::copy(lanes, lanes + (n - i), out + i);
    }
}

// The threads worth using for `work` multiply-adds: each at least 2^18, as in small_batch_linear
int64_t useful_threads(int threads, int64_t parts, int64_t work) {
    return std::max<int64_t>(1, std::min<int64_t>({int64_t(threads), parts, work >> 18}));
}

// Work split over threads comes in this many chunks per thread, taken dynamically
constexpr int64_t kChunksPerThread = 8;

// This thread's scratch buffer of at least n values, kept between calls: a fresh buffer each decode
// step would cost an allocation (and, past malloc's mmap threshold, page faults). Valid until the
// thread's next call for the same type.
template <typename T>
T* scratch(int64_t n) {
    thread_local std::vector<T> buffer;
    if (buffer.size() < size_t(n)) buffer.resize(size_t(n));
    return buffer.data();
}

}  // namespace

bool decode_kernels_available() {
    static const bool supported = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }();
    return supported;
}

void small_batch_linear(const float* x, int64_t ldx, const float* w, const float* bias, float* y, int64_t ldy, int64_t rows,
                        int64_t K, int64_t N, int threads) {
    const int64_t parts = useful_threads(threads, N, rows * K * N);
    if (parts == 1) return linear_columns(x, ldx, w, bias, y, ldy, rows, K, 0, N, N);
    // Columns go in chunks to whichever thread is free, not half to each: on a shared machine one
    // core often runs far slower than the other for a while, and the other would wait for it.
    // Whole weight blocks per chunk.
    const int64_t chunks = std::min<int64_t>(parts * kChunksPerThread, (N + kWeights - 1) / kWeights);
    const int64_t chunk = (N / chunks + kWeights - 1) / kWeights * kWeights;
#ifdef _OPENMP
#pragma omp parallel for num_threads(parts) schedule(dynamic, 1)
#endif
    for (int64_t begin = 0; begin < N; begin += chunk)
        linear_columns(x, ldx, w, bias, y, ldy, rows, K, begin, std::min(N, begin + chunk), N);
}

GROVE_AVX2 void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t H, float eps) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * H;
        float* yr = y + r * H;
        const float inverse = 1.0f / std::sqrt(dot(xr, xr, H) / float(H) + eps);
        for (int64_t i = 0; i < H; ++i) yr[i] = weight[i] * (xr[i] * inverse);
    }
}

GROVE_AVX2 void rotary(float* x, const float* cos, const float* sin, int64_t rows, int64_t heads, int64_t D) {
    const int64_t half = D / 2;
    for (int64_t r = 0; r < rows; ++r) {
        const float* c = cos + r * D;
        const float* s = sin + r * D;
        for (int64_t h = 0; h < heads; ++h) {
            float* v = x + (r * heads + h) * D;
            for (int64_t i = 0; i < half; ++i) {
                const float first = v[i], second = v[i + half];
                v[i] = first * c[i] - second * s[i];
                v[i + half] = second * c[i + half] + first * s[i + half];
            }
        }
    }
}

GROVE_AVX2 void silu_mul(const float* gate, const float* up, float* y, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

namespace {
// The dot products of q with 4 consecutive rows of D values each (D a multiple of 8): four 8-lane
// partial sums, reduced together by horizontal adds.
GROVE_AVX2 inline __m128 dot4(const float* q, const float* rows, int64_t D) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t c = 0; c < D; c += 8) {
        const __m256 qv = _mm256_loadu_ps(q + c);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + c), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + D + c), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + 2 * D + c), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + 3 * D + c), a3);
    }
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// out = sum_s weights[s] values[s] / total for D a multiple of 8: 64 dimensions at a time are kept in
// 8 registers across all positions, so out is written once
GROVE_AVX2 void weighted_rows(const float* weights, const float* values, int64_t S, int64_t D, float total, float* out) {
    const __m256 inverse = _mm256_set1_ps(1.0f / total);
    for (int64_t c0 = 0; c0 < D; c0 += 64) {
        const int64_t width = std::min<int64_t>(64, D - c0) / 8;
        __m256 acc[8];
        GROVE_UNROLL for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
        for (int64_t s = 0; s < S; ++s) {
            if (weights[s] == 0.0f) continue;  // masked positions
            const __m256 wv = _mm256_set1_ps(weights[s]);
            const float* v = values + s * D + c0;
            if (width == 8) {
                GROVE_UNROLL for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + 8 * i), acc[i]);
            } else {
                for (int64_t i = 0; i < width; ++i) acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + 8 * i), acc[i]);
            }
        }
        for (int64_t i = 0; i < width; ++i) _mm256_storeu_ps(out + c0 + 8 * i, _mm256_mul_ps(acc[i], inverse));
    }
}

// decode_attention for the (sequence, head) pairs [begin, end); scores holds S floats
GROVE_AVX2 void attend(const float* q, const float* key_cache, const float* value_cache, int64_t capacity, const bool* visible,
                       float* out, int64_t heads, int64_t kv_heads, int64_t S, int64_t D, float scale, float softcap,
                       int64_t begin, int64_t end, float* scores) {
    const int64_t group = heads / kv_heads;
    const bool vector_rows = D % 8 == 0;  // every head size in use (64, 80, 96, 128, ...)
    for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / heads, g = (task % heads) / group;
        const float* query = q + task * D;
        const float* keys = key_cache + (b * kv_heads + g) * capacity * D;
        const float* values = value_cache + (b * kv_heads + g) * capacity * D;
        const bool* seen = visible + b * S;
        int64_t s = 0;
        if (vector_rows)
            for (; s + 4 <= S; s += 4) _mm_storeu_ps(scores + s, dot4(query, keys + s * D, D));
        for (; s < S; ++s) scores[s] = dot(query, keys + s * D, D);
        float top = -INFINITY;
        for (s = 0; s < S; ++s) {
            const float scaled = scale * scores[s];
            scores[s] = !seen[s] ? -INFINITY : softcap > 0 ? softcap * std::tanh(scaled / softcap) : scaled;
            top = std::max(top, scores[s]);
        }
        exp_shifted(scores, top, scores, S);
        float total = 0.0f;
        for (s = 0; s < S; ++s) {
            if (!seen[s]) scores[s] = 0.0f;
            total += scores[s];
        }
        float* o = out + task * D;
        if (vector_rows) {
            weighted_rows(scores, values, S, D, total, o);
            continue;
        }
        std::fill(o, o + D, 0.0f);
        for (s = 0; s < S; ++s)
            if (seen[s]) add_scaled(o, values + s * D, scores[s] / total, D);
    }
}
}  // namespace

void decode_attention(const float* q, const float* new_keys, const float* new_values, float* key_cache, float* value_cache,
                      int64_t capacity, const bool* visible, float* out, int64_t B, int64_t heads, int64_t kv_heads, int64_t S,
                      int64_t D, float scale, float softcap, int threads) {
    for (int64_t row = 0; row < B * kv_heads; ++row) {  // (sequence, kv head) rows of the cache
        std::copy(new_keys + row * D, new_keys + (row + 1) * D, key_cache + (row * capacity + S - 1) * D);
        std::copy(new_values + row * D, new_values + (row + 1) * D, value_cache + (row * capacity + S - 1) * D);
    }
    const int64_t tasks = B * heads, parts = useful_threads(threads, tasks, tasks * S * D * 2);
    if (parts == 1) {
        return attend(q, key_cache, value_cache, capacity, visible, out, heads, kv_heads, S, D, scale, softcap, 0, tasks,
                      scratch<float>(S));
    }
    const int64_t chunks = std::min(parts * kChunksPerThread, tasks);  // dynamic, as in small_batch_linear
#ifdef _OPENMP
#pragma omp parallel for num_threads(parts) schedule(dynamic, 1)
#endif
    for (int64_t part = 0; part < chunks; ++part) {
        attend(q, key_cache, value_cache, capacity, visible, out, heads, kv_heads, S, D, scale, softcap, tasks * part / chunks,
               tasks * (part + 1) / chunks, scratch<float>(S));
    }
}

namespace {
// Probabilities are summed in blocks of this many tokens: the walk to the sampled token skips
// whole blocks and adds one by one only inside the block where the uniform falls.
constexpr int64_t kSampleBlock = 64;

// sample_softmax for one row; e holds V floats and block_sums V / kSampleBlock + 1 doubles
GROVE_AVX2 void sample_row(const float* x, int64_t V, float temperature, double u, int64_t* token, float* logprob, float* e,
                           double* block_sums) {
    const bool divide = temperature != 1.0f;
    const __m256 t = _mm256_set1_ps(temperature);
    // the largest logit; dividing by a positive temperature keeps the order, so max(s) = max(x) / t
    // (max_ps drops NaN, so NaN lanes are looked for on the way)
    __m256 top8 = _mm256_set1_ps(-INFINITY), nan8 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= V; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        top8 = _mm256_max_ps(top8, v);
        nan8 = _mm256_or_ps(nan8, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, top8);
    float top = *std::max_element(lanes, lanes + 8);
    bool nan = _mm256_movemask_ps(nan8) != 0;
    for (; i < V; ++i) {
        top = std::max(top, x[i]);
        nan = nan || std::isnan(x[i]);
    }
    if (divide) top /= temperature;
    *token = -1;
    *logprob = 0.0f;
    if (nan || !(top > -INFINITY)) return;  // NaN, or nothing drawable
    // e[i] = exp(s[i] - top), 0 where that is below e^-87 (float's smallest normal; -inf included)
    const __m256 shift = _mm256_set1_ps(top), floor = _mm256_set1_ps(-87.0f);
    const int64_t blocks = (V + kSampleBlock - 1) / kSampleBlock;
    double total = 0.0;
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t begin = b * kSampleBlock, end = std::min(V, begin + kSampleBlock);
        __m256 sum8 = _mm256_setzero_ps();
        int64_t j = begin;
        for (; j + 8 <= end; j += 8) {
            __m256 s = _mm256_loadu_ps(x + j);
            if (divide) s = _mm256_div_ps(s, t);
            const __m256 d = _mm256_sub_ps(s, shift);
            const __m256 v = _mm256_and_ps(exp8(d), _mm256_cmp_ps(d, floor, _CMP_GE_OQ));
            _mm256_storeu_ps(e + j, v);
            sum8 = _mm256_add_ps(sum8, v);
        }
        float sum = horizontal_sum(sum8);
        for (; j < end; ++j) {
            const float d = (divide ? x[j] / temperature : x[j]) - top;
            e[j] = d >= -87.0f ? std::exp(d) : 0.0f;
            sum += e[j];
        }
        block_sums[b] = sum;
        total += sum;
    }
    // the first block whose cumulative sum reaches u * total, then the token inside it; should the
    // one-by-one sum fall short of the block's by rounding, the block's last drawable token
    const double target = u * total;
    double cumulative = 0.0;
    for (int64_t b = 0; b < blocks; ++b) {
        if (!(block_sums[b] > 0.0) || cumulative + block_sums[b] < target) {
            cumulative += block_sums[b];
            continue;
        }
        const int64_t begin = b * kSampleBlock, end = std::min(V, begin + kSampleBlock);
        for (int64_t j = begin; j < end; ++j) {
            if (e[j] <= 0.0f) continue;
            *token = j;
            cumulative += e[j];
            if (cumulative >= target) break;
        }
        break;
    }
    if (*token < 0) return;
    const float chosen = divide ? x[*token] / temperature : x[*token];
    *logprob = float(double(chosen) - (double(top) + std::log(total)));
}
}  // namespace

void sample_softmax(const float* logits, int64_t ld, int64_t rows, int64_t V, float temperature, const double* uniforms,
                    int64_t* tokens, float* logprobs, int threads) {
    const int64_t parts = useful_threads(threads, rows, rows * V * 8);
    auto run = [&](int64_t begin, int64_t end) {
        float* e = scratch<float>(V);
        double* block_sums = scratch<double>(V / kSampleBlock + 1);
        for (int64_t r = begin; r < end; ++r)
            sample_row(logits + r * ld, V, temperature, uniforms[r], tokens + r, logprobs + r, e, block_sums);
    };
    if (parts == 1) return run(0, rows);
#ifdef _OPENMP
#pragma omp parallel for num_threads(parts) schedule(dynamic, 1)
#endif
    for (int64_t r = 0; r < rows; ++r) run(r, r + 1);  // a row at a time, dynamic as in small_batch_linear
}

}  // namespace grove::kernels

#else  // not x86-64: decode_kernels_available() is false and nothing else may be called

namespace grove::kernels {
bool decode_kernels_available() { return false; }
void small_batch_linear(const float*, int64_t, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int) {
    std::abort();
}
void rms_norm(const float*, const float*, float*, int64_t, int64_t, float) { std::abort(); }
void rotary(float*, const float*, const float*, int64_t, int64_t, int64_t) { std::abort(); }
void silu_mul(const float*, const float*, float*, int64_t) { std::abort(); }
void decode_attention(const float*, const float*, const float*, float*, float*, int64_t, const bool*, float*, int64_t, int64_t,
                      int64_t, int64_t, int64_t, float, float, int) {
    std::abort();
}
void sample_softmax(const float*, int64_t, int64_t, int64_t, float, const double*, int64_t*, float*, int) { std::abort(); }
}  // namespace grove::kernels
#endif
