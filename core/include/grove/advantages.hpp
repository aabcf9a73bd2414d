// Rewards -> group-relative advantages, exactly as TRL's GRPOTrainer (docs/grpo.md#rewards-and-advantages):
//   sum_then_normalize: r_i = nansum_k(w_k R[i,k]) (NaN when every R[i,k] is NaN);
//       A_i = r_i - nanmean_group(r);  scale "group": / (nanstd_group(r) + 1e-4),
//       "batch": / (nanstd_all(r) + 1e-4) (the mean stays per group), "none": unscaled.
//   normalize_then_sum (GDPO): z[i,k] = (R[i,k] - nanmean_group_k) / (nanstd_group_k + 1e-4);
//       r_i = nansum_k(w_k z[i,k]); A_i = (r_i - nanmean_all(r)) / (nanstd_all(r) + 1e-4).
//   nanstd is unbiased (count - 1) and NaN for fewer than two values; NaN advantages become 0.
// Rows are group-major: rows [g*G, (g+1)*G) belong to prompt g. No libtorch.
#pragma once

#include <string>
#include <vector>

#include "grove/run_config.hpp"

namespace grove {

struct AdvantageOptions {
    int num_generations = 8;
    ScaleRewards scale_rewards = ScaleRewards::group;
    RewardAggregation aggregation = RewardAggregation::sum_then_normalize;
};

struct AdvantageResult {
    std::vector<float> advantages;  // [N], NaN replaced by 0
    std::vector<float> rewards;     // [N] weighted sum of the raw rewards per row (NaN when unscorable)
    // metrics under TRL's names
    double reward = 0, reward_std = 0, frac_reward_zero_std = 0;
    std::vector<double> reward_mean, reward_std_per_function;  // [K]: rewards/<name>/mean|std
    int unscorable_rows = 0;                                   // rows where every reward was NaN
};

// R: N rows x K rewards, row-major; weights: K.
AdvantageResult compute_advantages(const std::vector<float>& R, int K, const std::vector<double>& weights,
                                   const AdvantageOptions& options);

double nanmean(const std::vector<double>& x);
double nanstd(const std::vector<double>& x);  // unbiased; NaN when fewer than 2 values

}  // namespace grove
