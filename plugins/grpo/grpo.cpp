// Reduction "grpo": the GRPO paper's sequence-level mean (TRL loss_type="grpo"; docs/grpo.md#reductions):
//   loss = mean_b( sum_t(L*m) / clamp(sum_t m, 1) ) / GA
//   =>  weight[b,t] = m[b,t] / clamp(sum_t m[b,t], 1) / B / GA
// Every sequence counts equally whatever its length. Split-invariant for equal-size micro-batches.
#include <grove/plugin.hpp>

#include <algorithm>

namespace {
struct Grpo {
    explicit Grpo(const grove::sdk::Config&) {}
    void weights(const grove_reduction_context& c, float* weight) const {
        for (uint32_t b = 0; b < c.rows; ++b) {
            const float* mask = c.mask + size_t(b) * c.columns;
            double tokens = 0;
            for (uint32_t t = 0; t < c.columns; ++t) tokens += mask[t];
            double scale = 1.0 / (std::max(tokens, 1.0) * c.rows * c.gradient_accumulation_steps);
            for (uint32_t t = 0; t < c.columns; ++t) weight[size_t(b) * c.columns + t] = float(mask[t] * scale);
        }
    }
};
constexpr auto kGrpo = grove::sdk::reduction_descriptor<Grpo>(
    "grpo", "1.0.0", "per-sequence token mean, then mean over sequences (GRPO paper)",
    GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC | GROVE_PLUGIN_SPLIT_INVARIANT, grove::sdk::kNoKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kGrpo)
