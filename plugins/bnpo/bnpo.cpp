// Reduction "bnpo": token mean over the LOCAL micro-batch (TRL loss_type="bnpo"; docs/grpo.md#reductions):
//   loss = sum(L*m) / clamp(sum(m), 1) / GA   =>  weight[b,t] = m[b,t] / clamp(sum m, 1) / GA
// Not split-invariant: each micro-batch is normalised by its own token count, so (batch 4, GA 1)
// and (batch 2, GA 2) weigh tokens differently when the micro-batches hold different token counts.
#include <grove/plugin.hpp>

#include <algorithm>

namespace {
struct Bnpo {
    explicit Bnpo(const grove::sdk::Config&) {}
    void weights(const grove_reduction_context& c, float* weight) const {
        size_t n = size_t(c.rows) * c.columns;
        double tokens = 0;
        for (size_t i = 0; i < n; ++i) tokens += c.mask[i];
        double scale = 1.0 / (std::max(tokens, 1.0) * c.gradient_accumulation_steps);
        for (size_t i = 0; i < n; ++i) weight[i] = float(c.mask[i] * scale);
    }
};
constexpr auto kBnpo =
    grove::sdk::reduction_descriptor<Bnpo>("bnpo", "1.0.0", "token mean over the local micro-batch (not split-invariant)",
                                           GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC, grove::sdk::kNoKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kBnpo)
