// Stage 2 of a GRPO step, scoring (docs/architecture.md#the-training-step-as-stages): every reward
// function scores this rank's rows once, replayed rows' given rewards replace the plugins' scores,
// the whole generation batch's rewards are gathered from every rank, and the group-relative
// advantages are computed from them (docs/grpo.md#rewards-and-advantages).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "grove/advantages.hpp"
#include "grove/reward_set.hpp"
#include "train/rollout.hpp"

namespace grove {

class Environment;
class ProcessGroup;
class Tokenizer;

// The scoring stage's value. Vectors indexed by row cover the WHOLE generation batch (every rank's
// rows, in global order); this rank's rows are [first_local_row, first_local_row + local_rows).
struct ScoredBatch {
    std::vector<std::string> reward_names;                    // [K]
    std::vector<std::vector<float>> rewards;                  // [K][N]; NaN where a function does not apply
    std::vector<float> advantages;                            // [N]
    std::vector<int64_t> completion_lengths, prompt_lengths;  // [N] tokens (completions include EOS)
    std::vector<uint8_t> truncated;                           // [N] 1 when no EOS within the budget
    AdvantageResult statistics;                               // reward, reward_std, ... (TRL's metrics)
    std::vector<double> weights;                              // [K] each column's weight in the sum
    std::map<std::string, double> plugin_metrics;             // "rewards/<name>/<metric>": mean over rows
    std::vector<std::string> plugin_metric_names;             // [M] the same metrics' names
    std::vector<std::vector<double>> plugin_metric_rows;      // [M][N] their per-row values
    std::vector<std::string> local_completions;               // [local_rows] decoded, special tokens removed
    ExtraColumns local_extra;                                 // [local_rows] per column: what rewards logged per row
    int64_t first_local_row = 0, local_rows = 0;

    std::vector<float> local_advantages() const;
    float local_reward(size_t k, int64_t local_row) const { return rewards[k][size_t(first_local_row + local_row)]; }
};

// Replayed rows that bring a function's value replace its score (a null value gives NaN).
void apply_given_rewards(RewardScores& scores, const std::vector<BatchRow>& rows);
// Functions whose every row brings its value need not be called.
std::vector<bool> rewards_given_by_every_row(const std::vector<std::string>& names, const std::vector<BatchRow>& rows);

struct ScoringContext {
    int64_t step = 0;  // the optimizer step the batch is generated for
    int rank = 0, world_size = 1;
    ProcessGroup* group = nullptr;  // null for one process
    // the environment whose judgement is a reward (Environment::reward_columns): the episodes'
    // environment_reward fills its columns, after the plugins', each row's in its own column
    const Environment* environment_reward = nullptr;
    int64_t max_steps = 0;  // the run's optimizer steps in all (rewards see it as TRL's trainer_state.max_steps)
};

ScoredBatch score_rollout(const Rollout& rollout, const RewardSet& rewards, const Tokenizer& tokenizer,
                          const AdvantageOptions& advantages, const ScoringContext& context);

// TRL's generation-batch metrics: completions/*, reward, reward_std, frac_reward_zero_std,
// rewards/<name>/mean|std and the plugins' own (docs/grpo.md#logged-metrics).
std::map<std::string, double> scored_batch_metrics(const ScoredBatch& batch);

}  // namespace grove
