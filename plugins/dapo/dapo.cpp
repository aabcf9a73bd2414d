// Reduction "dapo": token mean over every token that contributes to one optimizer step, across all
// processes (TRL loss_type="dapo", its default; docs/grpo.md#reductions):
//   loss = sum(L*m) / (clamp(N, 1) / world_size)  =>  weight[b,t] = m[b,t] * world_size / clamp(N, 1)
// (DDP averages gradients over processes; multiplying by world_size undoes that average.)
//
// N, by `normalizer`:
//   "optimizer_window" (default): tokens in the micro-batches that accumulate into this optimizer
//       step. The accumulated gradient is then exactly the token mean of the step, whatever
//       steps_per_generation and gradient_accumulation_steps are.
//   "generation_batch": tokens in the whole generation batch — TRL's normaliser at the reference
//       snapshot. It equals the window when steps_per_generation == gradient_accumulation_steps
//       (the default) and is off by GA/steps_per_generation otherwise (TRL issue #5619).
// Split-invariant for any split of the window, equal-size or not.
#include <grove/plugin.hpp>

#include <algorithm>

namespace {
struct Dapo {
    explicit Dapo(const grove::sdk::Config& config) {
        std::string normalizer = config.get_string("normalizer", "optimizer_window");
        if (normalizer == "optimizer_window")
            use_window_ = true;
        else if (normalizer == "generation_batch")
            use_window_ = false;
        else
            throw grove::sdk::config_error("normalizer", "'" + normalizer +
                                                             "' is not a normalizer; use \"optimizer_window\" (default) "
                                                             "or \"generation_batch\" (TRL's, issue #5619)");
    }
    void weights(const grove_reduction_context& c, float* weight) const {
        double tokens = use_window_ ? c.optimizer_window_tokens : c.generation_batch_tokens;
        double scale = double(c.world_size) / std::max(tokens, 1.0);
        size_t n = size_t(c.rows) * c.columns;
        for (size_t i = 0; i < n; ++i) weight[i] = float(c.mask[i] * scale);
    }
    bool use_window_ = true;
};
const grove_config_key kDapoKeys[] = {
    grove::sdk::key("normalizer", GROVE_VALUE_STRING, "\"optimizer_window\"",
                    "token count to divide by: optimizer_window (exact) or generation_batch (TRL)")};
constexpr auto kDapo = grove::sdk::reduction_descriptor<Dapo>(
    "dapo", "1.0.0", "token mean over every token of the optimizer step, all processes (DAPO)",
    GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC | GROVE_PLUGIN_SPLIT_INVARIANT, kDapoKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kDapo)
