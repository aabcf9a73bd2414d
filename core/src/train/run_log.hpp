// The run's files besides checkpoints, written by rank 0 only: metrics.jsonl (one line per
// optimizer step), completions.jsonl (sample completions with their rewards and advantages),
// rollouts.jsonl (every row as [rollouts] path can replay it) and, with logging.report_to =
// "tensorboard", the metrics again as a TensorBoard event file in runs/.
#pragma once

#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "grove/tensorboard.hpp"

#include "train/rollout.hpp"
#include "train/scoring.hpp"

namespace grove {

// Drops the lines of a JSONL log whose "step" is after `step` (a resumed run logs those steps again),
// and a last line cut short by a kill; rewritten through a temporary file and a rename.
void drop_steps_after(const std::string& jsonl_file, int64_t step);

class RunLog {
public:
    // Where a resumed run continues its logs: metrics and completions drop the lines of steps after
    // `step`; rollouts.jsonl is cut back to `rollouts_bytes` when known (its rows carry no step).
    struct Resume {
        int64_t step = 0;
        std::optional<int64_t> rollouts_bytes;
    };
    struct Files {
        bool save_rollouts = false, tensorboard = false;
        bool completions = true;  // grove sft samples none
    };
    // Opens the files (appending when resuming); `open` false gives a log that writes nothing.
    RunLog(const std::string& output_dir, bool open, std::optional<Resume> resume, Files files);

    void write_metrics(int64_t step, const std::map<std::string, double>& metrics);
    // This rank's first `limit` rows (all when unset).
    void write_completions(int64_t step, const Rollout& rollout, const ScoredBatch& scored, std::optional<int64_t> limit);
    // Every row of this rank with its prompt and completion ids, sampling log-probs and rewards.
    void write_rollouts(const Rollout& rollout, const ScoredBatch& scored);
    // rollouts.jsonl's length so far, for a checkpoint; unset when the log does not write it.
    std::optional<int64_t> rollouts_bytes();

private:
    std::ofstream metrics_, completions_, rollouts_;
    std::string rollouts_path_;
    std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace grove
