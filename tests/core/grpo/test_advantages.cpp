// Advantages against TRL's formulas (docs/grpo.md#rewards-and-advantages) on hand-computed cases.
#include <gtest/gtest.h>

#include <cmath>

#include "grove/advantages.hpp"

namespace {
const float kNaN = std::nanf("");
grove::AdvantageOptions options(int G, const char* scale = "group", const char* aggregation = "sum_then_normalize") {
    grove::AdvantageOptions o;
    o.num_generations = G;
    o.scale_rewards = grove::scale_rewards_from_name(scale);
    o.aggregation = grove::reward_aggregation_from_name(aggregation);
    return o;
}
}  // namespace

TEST(Advantages, GroupScalingUsesUnbiasedStdPlusEpsilon) {
    // TRL's doc example: group rewards {1, 0}: mean 0.5, std 0.7071 (N-1), A = +-0.5 / (0.7071 + 1e-4)
    auto r = grove::compute_advantages({1, 0, 3, 3}, 1, {1.0}, options(2));
    double a = 0.5 / (std::sqrt(0.5) + 1e-4);
    EXPECT_NEAR(r.advantages[0], a, 1e-6);
    EXPECT_NEAR(r.advantages[1], -a, 1e-6);
    EXPECT_EQ(r.advantages[2], 0.0f);  // zero-variance group
    EXPECT_EQ(r.advantages[3], 0.0f);
    EXPECT_DOUBLE_EQ(r.frac_reward_zero_std, 0.5);
    EXPECT_DOUBLE_EQ(r.reward, 1.75);
    EXPECT_NEAR(r.reward_std, std::sqrt((0.5625 + 3.0625 + 1.5625 + 1.5625) / 3.0), 1e-12);  // = 1.5
}

TEST(Advantages, BatchScalingKeepsTheGroupMean) {
    std::vector<float> R{1, 0, 3, 5};
    auto r = grove::compute_advantages(R, 1, {1.0}, options(2, "batch"));
    double std_all = grove::nanstd({1, 0, 3, 5});
    EXPECT_NEAR(r.advantages[0], 0.5 / (std_all + 1e-4), 1e-6);
    EXPECT_NEAR(r.advantages[3], 1.0 / (std_all + 1e-4), 1e-6);
    EXPECT_DOUBLE_EQ(r.frac_reward_zero_std, 0.0);
    auto none = grove::compute_advantages(R, 1, {1.0}, options(2, "none"));
    EXPECT_EQ(none.advantages, (std::vector<float>{0.5f, -0.5f, -1.0f, 1.0f}));
}

TEST(Advantages, WeightsNanRowsAndSingleValidGroups) {
    // K = 2 rewards, weights 0.5 and 2; row 1 misses reward 2 (nansum), row 3 misses both (unscorable)
    std::vector<float> R{1,    1,     // r = 2.5
                         3,    kNaN,  // r = 1.5
                         0,    1,     // r = 2.0   group 2: rows 2,3; row 3 unscorable
                         kNaN, kNaN};
    auto r = grove::compute_advantages(R, 2, {0.5, 2.0}, options(2));
    double std01 = grove::nanstd({2.5, 1.5});
    EXPECT_NEAR(r.advantages[0], 0.5 / (std01 + 1e-4), 1e-6);
    EXPECT_NEAR(r.advantages[1], -0.5 / (std01 + 1e-4), 1e-6);
    EXPECT_EQ(r.advantages[2], 0.0f);  // one valid value: Bessel std is NaN -> advantage 0
    EXPECT_EQ(r.advantages[3], 0.0f);  // unscorable -> 0
    EXPECT_TRUE(std::isnan(r.rewards[3]));
    EXPECT_EQ(r.unscorable_rows, 1);
    EXPECT_NEAR(r.reward, (2.5 + 1.5 + 2.0) / 3.0, 1e-12);
    EXPECT_NEAR(r.reward_mean[1], 1.0, 1e-12);  // rewards/<k>/mean over non-NaN values
}

TEST(Advantages, LoggedRewardReflectsWeightsInBothAggregations) {
    // TRL's test_reward_metric_reflects_reward_weights: constant rewards 1 and 0, weights 0.7 / 0.3
    std::vector<float> R{1, 0, 1, 0, 1, 0, 1, 0};
    for (const char* aggregation : {"sum_then_normalize", "normalize_then_sum"}) {
        auto r = grove::compute_advantages(R, 2, {0.7, 0.3}, options(2, "group", aggregation));
        EXPECT_NEAR(r.reward, 0.7, 1e-5) << aggregation;
    }
}

TEST(Advantages, NormalizeThenSumStandardisesEachRewardPerGroupThenTheSum) {
    std::vector<float> R{1, 10,  //
                         0, 30,  //
                         2, 20,  //
                         4, 20};
    auto r = grove::compute_advantages(R, 2, {1.0, 1.0}, options(2, "group", "normalize_then_sum"));
    // per group and reward: z = (x - mean) / (std + 1e-4)
    auto z = [](double x, double a, double b) {
        double mean = (a + b) / 2, std = grove::nanstd({a, b});
        return (x - mean) / (std + 1e-4);
    };
    std::vector<double> sums{z(1, 1, 0) + z(10, 10, 30), z(0, 1, 0) + z(30, 10, 30), z(2, 2, 4) + z(20, 20, 20),
                             z(4, 2, 4) + z(20, 20, 20)};
    double mean = grove::nanmean(sums), std = grove::nanstd(sums);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(r.advantages[i], (sums[i] - mean) / (std + 1e-4), 1e-5) << i;
}

// Groups of one completion (evaluation with num_generations_eval = 1) or a batch of one row: TRL
// takes the std as 0, not NaN, so every row counts towards frac_reward_zero_std and advantages are 0.
TEST(Advantages, GroupsOfOneHaveZeroSpreadAsInTrl) {
    for (const char* scale : {"group", "none"}) {
        auto r = grove::compute_advantages({1, 0, 3}, 1, {1.0}, options(1, scale));
        EXPECT_DOUBLE_EQ(r.frac_reward_zero_std, 1.0) << scale;
        EXPECT_EQ(r.advantages, (std::vector<float>{0, 0, 0})) << scale;
    }
    EXPECT_DOUBLE_EQ(grove::compute_advantages({1, 0, 3}, 1, {1.0}, options(1, "batch")).frac_reward_zero_std, 0.0);
    EXPECT_DOUBLE_EQ(grove::compute_advantages({2}, 1, {1.0}, options(1, "batch")).frac_reward_zero_std, 1.0);
    // normalize_then_sum: each reward's z-score within a group of one is 0, so every sum is 0
    auto gdpo = grove::compute_advantages({1, 2, 0, 5}, 2, {1.0, 1.0}, options(1, "group", "normalize_then_sum"));
    EXPECT_DOUBLE_EQ(gdpo.frac_reward_zero_std, 1.0);
    EXPECT_EQ(gdpo.advantages, (std::vector<float>{0, 0}));
}

TEST(Advantages, RejectsIncompleteGroups) {
    EXPECT_THROW(grove::compute_advantages({1, 2, 3}, 1, {1.0}, options(2)), std::exception);
}
