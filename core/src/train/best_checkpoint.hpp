// TrainingArguments' metric_for_best_model (docs/training.md#the-best-checkpoint): which evaluation
// is the best so far, which checkpoint holds it, and which checkpoints save_total_limit deletes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "grove/run_config.hpp"

namespace grove {

// Kept in every checkpoint (trainer_state.json's best_metric, best_global_step, best_model_checkpoint).
struct BestSoFar {
    std::optional<double> metric;
    std::optional<int64_t> step;        // the optimizer step of that evaluation
    std::optional<int64_t> checkpoint;  // the step of the checkpoint that holds it (saved at that step)
};

// The evaluation after optimizer step `step` (not eval_on_start's): true when its metric is better
// than the best so far, which it then becomes (transformers' _determine_best_metric; ties are no
// better). Throws naming the metrics there are when `settings.metric` is not among them.
bool record_evaluation(const BestModelSettings& settings, const std::map<std::string, double>& metrics, int64_t step,
                       BestSoFar& best);

// Before the first step: `evaluated` (every metric the run's evaluation logs) has settings.metric, or
// an error names the key and the metrics there are, before any step's work can be lost.
void check_metric_is_evaluated(const BestModelSettings& settings, const std::vector<std::string>& evaluated,
                               const std::string& manifest_path);

// The checkpoints (their steps) that `limit` (save_total_limit) deletes from `steps`: the oldest
// beyond the newest `limit`, never the best one (`best_checkpoint`), and with a limit of 1 the
// newest is kept beside the best, as transformers' _rotate_checkpoints does.
std::vector<int64_t> checkpoints_beyond_limit(std::vector<int64_t> steps, int64_t limit,
                                              std::optional<int64_t> best_checkpoint);

}  // namespace grove
