// The GRPO policy loss for one micro-batch, by an objective plugin (grove_plugin.h section 11;
// docs/objectives.md): the plugin gets the values of the policy's log-probabilities (and the old and
// reference ones, the advantages, the mask, the reduction plugin's weights and these options) and
// returns the loss and d loss / d logp. The host turns that into a scalar whose value is the loss and
// whose gradient is the objective's:
//   loss_tensor = value + sum(grad * logp) - stop_gradient(sum(grad * logp))
// exact, because the loss reaches the model's weights only through logp.
// The host's own options act around the objective: the top-entropy and off-policy masks and the
// sampling correction weigh its policy term; the entropy bonus is added after it.
#pragma once

#include <ATen/core/Tensor.h>

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "grove/run_config.hpp"

namespace grove {

class PluginInstance;
class ProcessGroup;

// The manifest's loss options, handed to every objective (grove_objective_batch), and the host's.
struct PolicyLossOptions {
    double beta = 0.0;
    double epsilon = 0.2;
    double epsilon_high = 0.2;
    std::optional<double> delta;
    ImportanceSamplingLevel importance_sampling_level = ImportanceSamplingLevel::token;
    bool use_bias_correction_kl = false;  // the reference snapshot's default (newer TRL defaults to true)
    double top_entropy_quantile = 1.0;
    std::optional<double> off_policy_mask_threshold;
    bool entropy_bonus = false;               // entropy_coef != 0 or adaptive: the bonus term is on
    double entropy_coef = 0.0;                // the coefficient this micro-batch applies (EntropyControl)
    int64_t gradient_accumulation_steps = 1;  // the bonus, a mean per micro-batch, is divided by it (TRL)
};

// What one micro-batch's loss reads. [B, T] on one device, advantages [B].
struct PolicyLossInputs {
    at::Tensor logp;
    at::Tensor entropy;  // each position's entropy; with a graph when the entropy bonus is on
    std::optional<at::Tensor> old_logp, ref_logp;
    std::optional<at::Tensor> sampling_logp;   // the sampler's (NaN where unknown): the off-policy mask's KL
    std::optional<at::Tensor> sampling_ratio;  // importance_sampling_ratio(): [B, T] or [B, 1]
    at::Tensor advantages, mask, weights;
    ProcessGroup* group = nullptr;  // the entropy quantile is over every process's tokens
};

// An objective's metrics for one micro-batch on this process: per metric of its descriptor a sum and
// a count (NaN where unset) and how processes and micro-batches combine them (grove_metric_aggregation).
struct ObjectiveMetrics {
    std::vector<std::string> names;
    std::vector<double> sums, counts;
    std::vector<uint8_t> aggregation;
};

struct PolicyLossResult {
    at::Tensor loss;   // scalar, differentiable: its gradient is the objective's (and the bonus's)
    double value = 0;  // the objective's loss plus the entropy bonus (also loss's value, to float rounding)
    ObjectiveMetrics metrics;
    // the entropy of the tokens the policy term trains (sum, count): adaptive entropy's measurement
    double trained_entropy_sum = 0, trained_token_count = 0;
};

PolicyLossResult policy_loss(const PluginInstance& objective, const PolicyLossInputs& inputs, const PolicyLossOptions& options);

// TRL's importance-sampling correction between the sampler's log-probabilities and the trainer's at
// generation (old): exp(old - sampling) per token, or exp of its sum over a row ([B, 1]), truncated
// to [clip_min, clip_max] or set to 0 outside it. Masked positions and NaN (unknown) sampling
// log-probabilities contribute ratio 1.
at::Tensor importance_sampling_ratio(const at::Tensor& old_logp, const at::Tensor& sampling_logp, const at::Tensor& mask,
                                     SamplingCorrection mode, std::optional<double> clip_min, std::optional<double> clip_max);

// TRL's sampling/importance_sampling_ratio/{min,mean,max} of one process's ratios (rows for the
// sequence modes, the loss's tokens for the token modes); 0 when there are none.
struct SamplingRatioStats {
    double min = 0, mean = 0, max = 0;
};
SamplingRatioStats sampling_ratio_stats(const at::Tensor& ratio, const at::Tensor& mask);

// The entropy bonus's coefficient (TRL's entropy_coef and its adaptive control, Skywork-OR1): during
// an optimizer step every micro-batch applies the coefficient decided at the end of the previous one.
struct EntropyControl {
    double coef = 0.0;
    double last_entropy = std::numeric_limits<double>::infinity();  // none measured yet: no bonus at first

    double applied(const LossSection& loss) const {
        return !loss.use_adaptive_entropy || last_entropy <= loss.entropy_target ? coef : 0.0;
    }
    // After an optimizer step, with the mean entropy of the tokens it trained on every process.
    void finish_step(double entropy, const LossSection& loss);
};

}  // namespace grove
