// The run's files besides checkpoints, written by rank 0 only: metrics.jsonl (one line per
// optimizer step), completions.jsonl (sample completions with their rewards and advantages) and
// rollouts.jsonl (every row as [rollouts] path can replay it).
#pragma once

#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "train/rollout.hpp"
#include "train/scoring.hpp"

namespace grove {

class RunLog {
public:
    // Opens the files (appending when resuming); `open` false gives a log that writes nothing.
    // resumed_at: the checkpoint's step; the logs then drop what came after it and append
    RunLog(const std::string& output_dir, bool open, std::optional<int64_t> resumed_at, bool save_rollouts);

    void write_metrics(int64_t step, const std::map<std::string, double>& metrics);
    // This rank's first `limit` rows (all when unset).
    void write_completions(int64_t step, const Rollout& rollout, const ScoredBatch& scored, std::optional<int64_t> limit);
    // Every row of this rank with its prompt and completion ids, sampling log-probs and rewards.
    void write_rollouts(const Rollout& rollout, const ScoredBatch& scored);

private:
    std::ofstream metrics_, completions_, rollouts_;
};

}  // namespace grove
