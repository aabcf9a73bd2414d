// The GRPO policy loss for one micro-batch (docs/grpo.md#policy-loss), reduced by per-token weights from
// a reduction plugin so the policy and KL terms are always reduced alike:
//   log_ratio = logp - old_logp              (old_logp = logp.detach() when absent: ratio exactly 1)
//   token level:    w = log_ratio;   sequence level (GSPO): w = sum_t(log_ratio m) / clamp(sum_t m, 1)
//   coef_1 = exp(w);  coef_2 = clamp(coef_1, 1 - epsilon, 1 + epsilon_high)
//   if delta: coef_1 = min(coef_1, delta)    (two-sided clip, INTELLECT-2)
//   L = -min(coef_1 A, coef_2 A)
//   if beta != 0: kl = exp(ref - logp) - (ref - logp) - 1                (k3 estimator, per token)
//                 kl *= coef_1 (before the delta cap) with use_bias_correction_kl (DeepSeek-V3.2)
//                 L += beta * kl
//   loss = sum_{b,t} weight[b,t] * L[b,t]
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "grove/run_config.hpp"

namespace grove {

struct PolicyLossOptions {
    double beta = 0.0;
    double epsilon = 0.2;
    double epsilon_high = 0.2;
    std::optional<double> delta;
    ImportanceSamplingLevel importance_sampling_level = ImportanceSamplingLevel::token;
    bool use_bias_correction_kl = false;  // the reference snapshot's default (newer TRL defaults to true)
};

// Masked sums and counts for TRL's metrics: summed over processes, sum / max(count, 1) is this
// micro-batch's kl and clip_ratio/{low,high,region}_mean as TRL's _compute_loss logs them
// (docs/grpo.md#logged-metrics).
struct LossStatistics {
    double kl_sum = 0, clip_low_sum = 0, clip_high_sum = 0, clip_region_sum = 0;
    bool has_kl = false;     // beta != 0
    double token_count = 0;  // sum of the mask
    double clip_count = 0;   // what clip sums are divided by: tokens, or every row at sequence level
    // the lowest row share of low-clipped tokens and the highest of high-clipped ones (NaN: no row has tokens)
    double clip_low_row_min = 0, clip_high_row_max = 0;
};

struct PolicyLossResult : LossStatistics {
    at::Tensor loss;  // scalar, differentiable
};

// logp, old_logp, ref_logp, mask, weights: [B, T]; advantages: [B].
PolicyLossResult policy_loss(const at::Tensor& logp, const std::optional<at::Tensor>& old_logp,
                             const std::optional<at::Tensor>& ref_logp, const at::Tensor& advantages, const at::Tensor& mask,
                             const at::Tensor& weights, const PolicyLossOptions& options);

}  // namespace grove
