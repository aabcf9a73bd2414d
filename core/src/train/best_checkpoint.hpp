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
    std::optional<int64_t> step;                  // the optimizer step of that evaluation
    std::optional<int64_t> checkpoint;            // the step of the checkpoint that holds it (saved at that step)
    int64_t evaluations_without_improvement = 0;  // early stopping's count (EarlyStoppingCallback's)
};

struct EvaluationOutcome {
    bool new_best = false;    // the best so far now (save_strategy = "best" saves it)
    bool stop_early = false;  // early_stopping_patience evaluations in a row without improvement
};

// The evaluation after optimizer step `step` (not eval_on_start's), in transformers' order: early
// stopping compares it with the best so far (EarlyStoppingCallback.on_evaluate: an improvement must
// exceed the threshold), then it becomes the best when its metric is better (_determine_best_metric;
// ties are no better). Throws naming the metrics there are when `settings.metric` is not among them.
EvaluationOutcome record_evaluation(const BestModelSettings& settings, const std::map<std::string, double>& metrics,
                                    int64_t step, BestSoFar& best);

// The line a run prints when early stopping ends it after optimizer step `step` of `total`.
std::string early_stopping_note(const BestModelSettings& settings, const BestSoFar& best, int64_t step, int64_t total);

// Before the first step: `evaluated` (every metric the run's evaluation logs) has settings.metric, or
// an error names the key and the metrics there are, before any step's work can be lost.
// eval_runtime is not among them: seconds differ between ranks and runs.
void check_metric_is_evaluated(const BestModelSettings& settings, std::vector<std::string> evaluated,
                               const std::string& manifest_path);

// The checkpoints (their steps) that `limit` (save_total_limit) deletes from `steps`: the oldest
// beyond the newest `limit`, never the best one (`best_checkpoint`), and with a limit of 1 the
// newest is kept beside the best, as transformers' _rotate_checkpoints does.
std::vector<int64_t> checkpoints_beyond_limit(std::vector<int64_t> steps, int64_t limit,
                                              std::optional<int64_t> best_checkpoint);

}  // namespace grove
