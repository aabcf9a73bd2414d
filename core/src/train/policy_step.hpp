// Stage 4 of a GRPO step, the update (docs/architecture.md#the-training-step-as-stages): each
// micro-batch's forward, loss and backward, and the step's loss-side metrics as TRL logs them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "grove/policy_loss.hpp"
#include "train/micro_batches.hpp"

namespace grove {

class Model;
struct RouterLoad;
class PluginInstance;
class ProcessGroup;
struct ReductionCounts;

// One micro-batch's share of TRL's loss-side metrics on this process: sums and counts, which TRL sums
// over processes before dividing (its global_masked_mean), and extremes (min / max over every row
// of every process). Entropy comes from the forward, the rest from the objective.
struct MicroBatchMetrics {
    ObjectiveMetrics objective;  // from policy_loss()
    double entropy_sum = 0, token_count = 0;
    std::optional<double> aux_loss;  // a mixture of experts' load-balancing loss (unweighted), when it is trained
};

// TRL appends one value per micro-batch and logs the mean of what was appended since the last log:
// with a line per optimizer step, the mean over the step's micro-batches (docs/grpo.md#logged-metrics).
class StepMetrics {
public:
    void add(const MicroBatchMetrics& m) { micro_batches_.push_back(m); }
    // Every rank calls it with the same number of micro-batches (one collective).
    std::map<std::string, double> finish(ProcessGroup* group) const;

private:
    std::vector<MicroBatchMetrics> micro_batches_;
};

// TRL's term for a mixture of experts: loss + coef * aux / gradient_accumulation_steps, aux the
// routers' load-balancing loss over the micro-batch's tokens. Returns aux's value (TRL logs it).
double add_router_aux_loss(PolicyLossResult& loss, const RouterLoad& routing, double coef,
                           uint32_t gradient_accumulation_steps);

struct MicroStepResult {
    double loss = 0;  // the value back-propagated (not back-propagated when not finite)
    MicroBatchMetrics metrics;
    double trained_entropy_sum = 0, trained_token_count = 0;  // adaptive entropy's measurement (policy_loss)
};

// The policy's forward on the micro-batch (under bf16 autocast on `autocast`, when set), the
// reduction plugin's weights, the objective plugin's loss (plus a mixture of experts' weighted
// load-balancing loss) and its backward.
struct MicroStepContext {
    const PluginInstance& reduction;
    const ReductionCounts& counts;
    const PluginInstance& objective;
    const PolicyLossOptions& loss;
    double temperature = 1.0;
    std::optional<at::DeviceType> autocast;
    ProcessGroup* group = nullptr;
    // a mixture of experts: the load-balancing loss's weight (0: not computed); TRL adds
    // coef x aux / gradient_accumulation_steps to each micro-batch's loss
    double router_aux_loss_coef = 0;
};
MicroStepResult train_micro_batch(Model& policy, const MicroBatch& batch, const MicroStepContext& context);

}  // namespace grove
