// Reduction "luspo": each sequence's token sum, then the mean over sequences (TRL loss_type="luspo",
// Length-Unbiased Sequence Policy Optimization; docs/reductions.md):
//   loss = mean_b( sum_t L*m ) / GA   =>  weight[b,t] = m[b,t] / B / GA
// With the clipped objective at importance_sampling_level = "sequence" (LUSPO's setup) every token of
// a row shares the row's ratio, so a row weighs by its length: GSPO's per-row mean without the
// division by length. Split-invariant for equal-size micro-batches.
#include <grove/plugin.hpp>

namespace {
struct Luspo {
    explicit Luspo(const grove::sdk::Config&) {}
    void weights(const grove_reduction_context& c, float* weight) const {
        const double scale = 1.0 / (double(c.rows) * c.gradient_accumulation_steps);
        const size_t n = size_t(c.rows) * c.columns;
        for (size_t i = 0; i < n; ++i) weight[i] = float(c.mask[i] * scale);
    }
};
constexpr auto kLuspo = grove::sdk::reduction_descriptor<Luspo>(
    "luspo", "1.0.0", "per-sequence token sum, then mean over sequences (LUSPO)",
    GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC | GROVE_PLUGIN_SPLIT_INVARIANT, grove::sdk::kNoKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kLuspo)
