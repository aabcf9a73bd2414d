// Reduction "dr_grpo": Dr. GRPO's constant normaliser (TRL loss_type="dr_grpo"; docs/grpo.md#reductions):
//   loss = sum(L*m) / (B * max_completion_length) / GA
//   =>  weight[b,t] = m[b,t] / (B * max_completion_length * GA)
// No length bias; split-invariant for equal-size micro-batches.
#include <grove/plugin.hpp>

namespace {
struct DrGrpo {
    explicit DrGrpo(const grove::sdk::Config&) {}
    void weights(const grove_reduction_context& c, float* weight) const {
        if (c.max_completion_length == 0)
            throw grove::sdk::Error(GROVE_ERROR_INVALID_ARGUMENT, "max_completion_length must be > 0");
        double scale = 1.0 / (double(c.rows) * c.max_completion_length * c.gradient_accumulation_steps);
        size_t n = size_t(c.rows) * c.columns;
        for (size_t i = 0; i < n; ++i) weight[i] = float(c.mask[i] * scale);
    }
};
constexpr auto kDrGrpo = grove::sdk::reduction_descriptor<DrGrpo>(
    "dr_grpo", "1.0.0", "sum over tokens / (rows x max_completion_length) (Dr. GRPO)",
    GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC | GROVE_PLUGIN_SPLIT_INVARIANT, grove::sdk::kNoKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kDrGrpo)
