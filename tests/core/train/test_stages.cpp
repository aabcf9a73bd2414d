// The training step's stages, each alone, without a Trainer or a model: scoring's replayed rewards,
// the prompt sampler, micro-batch assembly, checkpoint names and the step's metrics.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <set>

#include "train/checkpoint.hpp"
#include "train/micro_batches.hpp"
#include "train/policy_step.hpp"
#include "train/rollout.hpp"
#include "train/scoring.hpp"

namespace {
grove::BatchRow row(std::vector<int64_t> prompt, const grove::ReplayRow* replay = nullptr) {
    grove::BatchRow r;
    r.prompt_ids = std::move(prompt);
    r.prompt_text = "p";
    r.columns_json = "{}";
    r.replay = replay;
    return r;
}
}  // namespace

TEST(Scoring, ReplayedRewardsOverridePluginScores) {
    grove::ReplayRow given_both, given_a, given_none;
    given_both.rewards = {{"a", 0.25}, {"b", std::nan("")}};
    given_a.rewards = {{"a", -1.0}};
    std::vector<grove::BatchRow> rows = {row({1}, &given_both), row({1}, &given_a), row({2}, &given_none)};
    grove::RewardScores scores;
    scores.names = {"a", "b"};
    scores.values = {{10, 11, 12}, {20, 21, 22}};
    grove::apply_given_rewards(scores, rows);
    EXPECT_EQ(scores.values[0], (std::vector<float>{0.25f, -1.0f, 12.0f}));
    EXPECT_TRUE(std::isnan(scores.values[1][0])) << "a null given value is NaN, not the plugin's";
    EXPECT_EQ(scores.values[1][1], 21.0f);
    EXPECT_EQ(scores.values[1][2], 22.0f);
    EXPECT_EQ(grove::rewards_given_by_every_row({"a", "b"}, rows), (std::vector<bool>{false, false}));
    EXPECT_EQ(grove::rewards_given_by_every_row({"a", "b"}, {rows[0], rows[1]}), (std::vector<bool>{true, false}));
    ASSERT_EQ(scores.row_major().size(), 6u);
    EXPECT_EQ(scores.row_major()[2], -1.0f);  // row 1, reward a
    EXPECT_EQ(scores.row_major()[5], 22.0f);  // row 2, reward b
}

TEST(PromptSource, EpochsDropAnIncompleteChunkAndRestoreContinuesExactly) {
    std::vector<grove::BatchRow> prompts;
    for (int64_t i = 0; i < 5; ++i) prompts.push_back(row({i}));
    grove::PromptSource source(prompts, 2, 7, true);
    // 4 rows = 2 prompts x 2 generations, group-major
    auto first = source.next_batch(4);
    ASSERT_EQ(first.size(), 4u);
    EXPECT_EQ(first[0].prompt_ids, first[1].prompt_ids);
    EXPECT_EQ(first[2].prompt_ids, first[3].prompt_ids);
    const auto saved = source.position();
    auto second = source.next_batch(4);
    std::set<int64_t> seen{first[0].prompt_ids[0], first[2].prompt_ids[0], second[0].prompt_ids[0], second[2].prompt_ids[0]};
    EXPECT_EQ(seen.size(), 4u) << "an epoch visits distinct prompts";
    EXPECT_EQ(source.position().epoch, 0);
    source.next_batch(4);  // 1 prompt left of 5: TRL's sampler drops it and starts epoch 1
    EXPECT_EQ(source.position().epoch, 1);
    EXPECT_EQ(source.position().position, 2);

    grove::PromptSource resumed(prompts, 2, 7, true);
    resumed.restore(saved);
    auto again = resumed.next_batch(4);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(again[i].prompt_ids, second[i].prompt_ids);
}

TEST(MicroBatches, PaddingAndSplitKeepEveryRowOnce) {
    grove::Rollout rollout;
    for (int64_t i = 0; i < 4; ++i) rollout.rows.push_back(row(std::vector<int64_t>(size_t(1 + i), 100 + i)));
    auto& c = rollout.completions;
    c.completion_ids = at::arange(12, at::kLong).view({4, 3});
    c.lengths = {3, 1, 2, 3};
    c.completion_mask = (at::arange(3, at::kLong).unsqueeze(0) < at::tensor(c.lengths, at::kLong).unsqueeze(1)).to(at::kLong);
    c.truncated = at::tensor(std::vector<uint8_t>{1, 0, 0, 1}).to(at::kBool);
    auto whole = grove::pad_rollout(rollout, {0.5f, -0.5f, 1.0f, -1.0f}, true, 0);
    EXPECT_EQ(whole.prompt_ids.sizes(), (std::vector<int64_t>{4, 4}));
    EXPECT_EQ(whole.prompt_ids[0][3].item<int64_t>(), 100);  // left-padded
    EXPECT_EQ(whole.prompt_mask[0].sum().item<int64_t>(), 1);
    EXPECT_EQ(whole.completion_mask[0].sum().item<int64_t>(), 0) << "mask_truncated_completions";
    EXPECT_EQ(whole.completion_mask[2].sum().item<int64_t>(), 2);
    auto parts = grove::split_micro_batches(whole, 2, 11);
    ASSERT_EQ(parts.size(), 2u);
    std::multiset<int64_t> firsts;
    for (const auto& p : parts) {
        ASSERT_EQ(p.completion_ids.size(0), 2);
        for (int64_t r = 0; r < 2; ++r) {
            const int64_t id = p.completion_ids[r][0].item<int64_t>();
            firsts.insert(id);
            const std::vector<float> advantages = {0.5f, -0.5f, 1.0f, -1.0f};
            EXPECT_FLOAT_EQ(p.advantages[r].item<float>(), advantages[size_t(id / 3)]);
        }
    }
    EXPECT_EQ(firsts, (std::multiset<int64_t>{0, 3, 6, 9}));
}

TEST(Checkpoint, OnlyCheckpointFoldersParse) {
    EXPECT_EQ(grove::checkpoint_name(12), "checkpoint-12");
    EXPECT_EQ(grove::checkpoint_step("checkpoint-12"), 12);
    for (const char* name :
         {"checkpoint-", "checkpoint-1a", "checkpoint--1", ".tmp-checkpoint-3", "latest", "checkpoint-99999999999999999999"})
        EXPECT_FALSE(grove::checkpoint_step(name).has_value()) << name;
}

// TRL logs, per micro-batch, the masked mean pooled over processes, then the mean over micro-batches
// (not the step's tokens pooled); low_min / high_max are the extremes over rows.
TEST(StepMetrics, AreTheMeanOfTheMicroBatchesMeans) {
    const double nan = std::nan("");
    // an objective's metrics as the clipped objective reports them: (sum, count) means and row extremes
    auto metrics_of = [&](double kl_sum, double kl_count, double low, double high, double count, double low_min,
                          double high_max) {
        grove::ObjectiveMetrics m;
        m.names = {"kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/low_min", "clip_ratio/high_max"};
        m.sums = {kl_sum, low, high, low_min, high_max};
        m.counts = {kl_count, count, count, nan, nan};
        m.aggregation = {GROVE_METRIC_MEAN, GROVE_METRIC_MEAN, GROVE_METRIC_MEAN, GROVE_METRIC_MIN, GROVE_METRIC_MAX};
        return m;
    };
    grove::StepMetrics metrics;
    metrics.add({metrics_of(3, 30, 3, 0, 30, 0.0, 0.0), 15.0, 30});
    metrics.add({metrics_of(1, 2, 0, 1, 2, 0.0, 1.0), 3.0, 2});
    auto m = metrics.finish(nullptr);
    EXPECT_DOUBLE_EQ(m["kl"], (0.1 + 0.5) / 2);  // pooled would be 4 / 32
    EXPECT_DOUBLE_EQ(m["entropy"], (0.5 + 1.5) / 2);
    EXPECT_DOUBLE_EQ(m["clip_ratio/low_mean"], 0.05);
    EXPECT_DOUBLE_EQ(m["clip_ratio/high_mean"], 0.25);
    EXPECT_DOUBLE_EQ(m["clip_ratio/low_min"], 0.0);
    EXPECT_DOUBLE_EQ(m["clip_ratio/high_max"], 0.5);
    grove::StepMetrics without;
    without.add({metrics_of(nan, nan, 0, 0, 4, nan, nan), 0.0, 4});
    const auto logged = without.finish(nullptr);
    EXPECT_EQ(logged.count("kl"), 0u) << "a mean whose count stays NaN (kl with beta = 0) is not logged";
    EXPECT_TRUE(std::isnan(logged.at("clip_ratio/low_min"))) << "an extreme no row has is logged as NaN";
}

// A multi-turn row (one with TRL's env_mask) keeps every turn, EOS ids and all; its environment's
// tokens stay in the model's input but leave the loss and the length counts. A plain row still stops
// at its first EOS.
TEST(Rollout, MultiTurnRowsStayWholeAndTheirEnvironmentTokensLeaveTheLoss) {
    grove::ReplayRow multi_turn, plain;
    multi_turn.prompt_ids = plain.prompt_ids = {1, 4};
    multi_turn.completion_ids = {5, 2, 7, 8, 9, 2};
    multi_turn.env_mask = {1, 1, 0, 0, 1, 1};
    plain.completion_ids = {5, 2, 7};
    grove::SamplingOptions options;
    options.eos_token_ids = {2};
    auto rollout = grove::replay_rollout({row({1, 4}, &multi_turn), row({1, 4}, &plain)}, options, 0);
    EXPECT_EQ(rollout.completions.lengths, (std::vector<int64_t>{6, 2}));
    EXPECT_FALSE(rollout.completions.truncated[0].item<bool>());
    EXPECT_EQ(grove::model_token_counts(rollout), (std::vector<int64_t>{4, 2}));

    auto whole = grove::pad_rollout(rollout, {0.5f, -0.5f}, false, 0);
    auto as_vector = [](const at::Tensor& t) {
        at::Tensor c = t.to(at::kLong).contiguous();
        return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
    };
    EXPECT_EQ(as_vector(whole.completion_mask[0]), (std::vector<int64_t>{1, 1, 1, 1, 1, 1})) << "the model reads every token";
    EXPECT_EQ(as_vector(whole.loss_mask[0]), (std::vector<int64_t>{1, 1, 0, 0, 1, 1})) << "the loss counts the model's";
    EXPECT_EQ(as_vector(whole.loss_mask[1]), (std::vector<int64_t>{1, 1, 0, 0, 0, 0}));
    auto halves = grove::split_micro_batches(whole, 2, 3);
    EXPECT_EQ(halves[0].loss_mask.sum().item<int64_t>() + halves[1].loss_mask.sum().item<int64_t>(), 6);
}
