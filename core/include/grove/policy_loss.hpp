// The GRPO policy loss for one micro-batch, by an objective plugin (grove_plugin.h section 11;
// docs/objectives.md): the plugin gets the values of the policy's log-probabilities (and the old and
// reference ones, the advantages, the mask, the reduction plugin's weights and these options) and
// returns the loss and d loss / d logp. The host turns that into a scalar whose value is the loss and
// whose gradient is the objective's:
//   loss_tensor = value + sum(grad * logp) - stop_gradient(sum(grad * logp))
// exact, because the loss reaches the model's weights only through logp.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "grove/run_config.hpp"

namespace grove {

class PluginInstance;

// The manifest's loss options, handed to every objective (grove_objective_batch).
struct PolicyLossOptions {
    double beta = 0.0;
    double epsilon = 0.2;
    double epsilon_high = 0.2;
    std::optional<double> delta;
    ImportanceSamplingLevel importance_sampling_level = ImportanceSamplingLevel::token;
    bool use_bias_correction_kl = false;  // the reference snapshot's default (newer TRL defaults to true)
};

// An objective's metrics for one micro-batch on this process: per metric of its descriptor a sum and
// a count (NaN where unset) and how processes and micro-batches combine them (grove_metric_aggregation).
struct ObjectiveMetrics {
    std::vector<std::string> names;
    std::vector<double> sums, counts;
    std::vector<uint8_t> aggregation;
};

struct PolicyLossResult {
    at::Tensor loss;   // scalar, differentiable: its gradient is the objective's
    double value = 0;  // the objective's loss (also loss's value, to float rounding)
    ObjectiveMetrics metrics;
};

// logp, old_logp, ref_logp, mask, weights: [B, T] on one device; advantages: [B].
PolicyLossResult policy_loss(const PluginInstance& objective, const at::Tensor& logp, const std::optional<at::Tensor>& old_logp,
                             const std::optional<at::Tensor>& ref_logp, const at::Tensor& advantages, const at::Tensor& mask,
                             const at::Tensor& weights, const PolicyLossOptions& options);

}  // namespace grove
