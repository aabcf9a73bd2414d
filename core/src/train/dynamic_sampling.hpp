// DAPO's dynamic sampling ("filter groups"; verl's algorithm.filter_groups), between scoring and
// micro-batches (docs/training.md#dynamic-sampling): a group whose rows' rewards all agree has zero
// advantages and teaches nothing, so it is dropped and prompts are drawn and generated again until
// the generation batch is full of groups that disagree. After `max_rounds` rounds the newest
// agreeing groups fill what is still missing, so a step never fails for want of signal.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "train/rollout.hpp"
#include "train/scoring.hpp"

namespace grove {

struct ScoredRollout {
    Rollout rollout;
    ScoredBatch scored;
};

// Whether group g's rows' weighted rewards differ (TRL's frac_reward_zero_std counts the others).
// With aggregation = normalize_then_sum too, agreement is of these raw weighted sums.
bool group_disagrees(const ScoredBatch& batch, int64_t group, int64_t num_generations);

// Rounds of `generate_round(round)` (round 0 first) until `groups` disagreeing groups are found or
// `max_rounds` have run; returns them, in the order found, as one batch with its advantages
// recomputed (completions padded with pad_token_id), and the dynamic_sampling/* metrics. One process only.
std::pair<ScoredRollout, std::map<std::string, double>> fill_with_informative_groups(
    const std::function<ScoredRollout(int64_t round)>& generate_round, int64_t groups, int64_t max_rounds,
    const AdvantageOptions& advantages, int64_t pad_token_id);

}  // namespace grove
