// The checkpoint unit (docs/training.md#checkpoints-and-resume): save and restore side by side.
// <output>/checkpoint-<step>/ holds the model as users load it (a Hugging Face folder, or an
// adapter folder in PEFT's layout), the tokenizer, and what exact resume needs: trainable tensors,
// the optimizer's state (AdamW's moments, Adafactor's factored ones), the counters and sampler
// position, and a partly used generation batch's micro-batches (one file per rank). Folders are written under a temporary name and renamed.
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "grove/manifest.hpp"
#include "grove/policy_loss.hpp"
#include "grove/run_config.hpp"
#include "train/best_checkpoint.hpp"
#include "train/micro_batches.hpp"
#include "train/rollout.hpp"

namespace grove {

class Optimizer;
class ProcessGroup;

// The counters a run advances; all of it is saved.
struct TrainingProgress {
    int64_t global_step = 0, micro_step = 0, generation_index = 0, num_tokens = 0;
    PromptSource::Position sampler;
    double generation_tokens = 0;  // the current generation batch's loss tokens, all ranks
    EntropyControl entropy;        // the entropy bonus's coefficient (adaptive: it moves)
    // rollouts.jsonl's length when the checkpoint was written (rank 0 writes it); unset when it was
    // not being written. A resume cuts the file back to it, since the steps after are rerun.
    std::optional<int64_t> rollouts_bytes;
    BestSoFar best;  // train.metric_for_best_model's best evaluation
};

// What a checkpoint saves and restores, by reference to the trainer's own.
struct CheckpointedState {
    TrainingProgress& progress;
    std::vector<MicroBatch>& unused_micro_batches;  // saved only inside a generation batch
    const std::vector<at::Tensor>& trainable;
    Optimizer& optimizer;
    // ZeRO stage 1: the rank whose optimizer keeps trainable[i]'s state; empty: every rank's does.
    // A checkpoint holds them all either way (gathered to rank 0), so it resumes sharded or not.
    const std::vector<int>& owners;
    // The reference model's tensors by name (beta > 0 with the full adapter), or none. A run that
    // moves them (`reference_moves`: sync_ref_model) saves them in reference.safetensors; a resume
    // restores them whenever the checkpoint has that file, and sets `reference_restored`.
    std::vector<std::pair<std::string, at::Tensor>> reference = {};
    bool reference_moves = false;
    bool reference_restored = false;
};

// "checkpoint-<step>" and back; nullopt for any other folder name.
std::string checkpoint_name(int64_t step);
std::optional<int64_t> checkpoint_step(const std::string& folder_name);
// The newest checkpoint of a run that a resume can start from (whole: not one of
// output.save_only_model's), before step `before` when set; nullopt when there is none.
std::optional<int64_t> newest_resumable_step(const std::string& output_dir, std::optional<int64_t> before = std::nullopt);
// That checkpoint's folder (what --resume latest resumes), or nullopt.
std::optional<std::string> latest_checkpoint(const std::string& output_dir);
// True when the folder holds a run's files (metrics, state or checkpoints).
bool holds_run(const std::string& output_dir);

// How a run (grove train, grove sft) starts in its output folder: one that holds another run is
// refused unless resuming or overwriting (never when the model it trains, `model_path`, lies
// inside: overwriting would delete it); --resume latest without a checkpoint yet (a run killed
// before its first) starts from step 0, which `log` is told.
struct RunStart {
    std::optional<std::string> resume_from;  // a checkpoint folder or "latest"; unset: from step 0
    bool clear = false;                      // --overwrite of an earlier run: empty the folder first
};
RunStart run_start(const std::string& output_dir, const std::string& model_path, const std::optional<std::string>& resume,
                   bool overwrite, std::ostream* log);
// The manifest a run resumed from `resume` ("latest" or a checkpoint folder; unset: no resume) goes
// on with. When model.path names a Hub model whose branch or tag has moved since that checkpoint was
// written (model.path now resolves to another snapshot of the same id), the run keeps the snapshot
// the checkpoint recorded while the cache holds it, and `log` is told; else `manifest` unchanged.
Manifest manifest_to_resume(const Manifest& manifest, const std::optional<std::string>& resume, std::ostream* log);
// Makes the output folder (emptied first when `clear`) and proves it can write there before the
// model loads, so a read-only or missing folder costs seconds, not the steps before a checkpoint.
void prepare_output_folder(const std::string& output_dir, bool clear);

// Whether output.save_strategy asks for a checkpoint after optimizer step `step` of `total` (under
// "best", after an evaluation that found a new best: `new_best`). The run's last step saves anyway.
bool checkpoint_due(const OutputSection& output, int64_t step, int64_t total, double steps_per_epoch, bool new_best);

// Torch's random generator (the adapter's dropout masks) is not in a checkpoint: every optimizer step
// reseeds it from the run's seed and the step's index, so a resumed run draws what a straight one drew.
void seed_step_randomness(int64_t seed, int64_t step);

// For the kill-and-resume tests: when the environment's GROVE_TEST_KILL_AT is "<point>:<step>" (every
// rank) or "<point>:<step>@<rank>" (that rank only), the process kills itself with SIGKILL here
// (points: startup, step, shards, save; docs/reliability.md).
void test_kill_point(const char* point, int64_t step);

class Checkpoints {
public:
    // `resolved_manifest`: the run's settings (Manifest::resolved_toml), kept in every checkpoint as
    // manifest.resolved.toml so that a resume can name what changed since.
    // `reward_columns`: each reward column's name and weight, the ones plugins add (an environment's
    // get_reward()) included, which the manifest alone does not show; kept in trainer_state.json.
    Checkpoints(std::string output_dir, int rank, int world_size, ProcessGroup* group, std::string resolved_manifest,
                std::vector<std::pair<std::string, double>> reward_columns)
            : output_(std::move(output_dir)),
              rank_(rank),
              world_size_(world_size),
              group_(group),
              resolved_manifest_(std::move(resolved_manifest)),
              reward_columns_(std::move(reward_columns)) {}

    // Writes checkpoint-<global_step> (every rank calls it): files under .tmp-checkpoint-<step>, their
    // checksums into trainer_state.json last, then a rename. A failure (a full disk, a read-only
    // folder) removes the partial folder and throws an error naming the last whole checkpoint. `export_model(folder)` writes the model
    // files users load (rank 0 only). When the step is the best evaluation's, state.progress.best
    // records that this checkpoint holds it. With `keep_last` (save_total_limit) set, older
    // checkpoints beyond it are deleted, never the best one (checkpoints_beyond_limit).
    // `model_only` (output.save_only_model) leaves out what only a resume needs: the optimizer's
    // state, the trainable tensors and a generation batch's rest; such a checkpoint is not resumed.
    std::string save(const CheckpointedState& state, bool inside_generation_batch, const std::string& manifest_path,
                     const std::function<void(const std::string& folder)>& export_model, std::optional<int64_t> keep_last,
                     bool model_only = false);
    // `folder` is a checkpoint folder or "latest". Every file is checked against the sizes and
    // checksums written with it; errors name the file and the checkpoint to resume from instead.
    void restore(const std::string& folder, CheckpointedState& state) const;
    // The settings that differ between those the checkpoint `folder` (or "latest") was written with
    // and this run's (Manifest::resolved_changes), and its reward columns when they differ; none for a
    // checkpoint that kept no settings.
    std::vector<std::string> changed_settings(const std::string& folder) const;
    // Writes a warning to `log` (when set) naming changed_settings(folder), if any: a resumed run
    // repeats the original only with the same settings.
    void warn_of_changed_settings(const std::string& folder, std::ostream* log) const;

    // train.load_best_model_at_end, once the run has finished (rank 0): the best checkpoint's model
    // files (what export_model wrote there, checked against their checksums) copied into output.dir,
    // with a line to `log` (when set) naming it; without one (no checkpoint is at a best evaluation)
    // the line says so and nothing is copied. True when it copied.
    bool write_best_model(const BestModelSettings& settings, const BestSoFar& best, std::ostream* log) const;

private:
    std::string write(const CheckpointedState& state, bool inside_generation_batch, const std::string& manifest_path,
                      const std::function<void(const std::string& folder)>& export_model, std::optional<int64_t> keep_last,
                      bool model_only);
    // Writes the optimizer's moments to `file` (rank 0). Sharded, every rank takes part: rank 0
    // receives each moment from its owner as the file is written, one at a time.
    void save_optimizer(const std::string& file, const CheckpointedState& state) const;
    // Every file trainer_state.json lists exists with its size and checksum; throws naming the file.
    void verify_files(const std::string& dir, const nlohmann::json& files) const;
    // What to do when `damaged` cannot be resumed: the previous checkpoint of the run that wrote it,
    // or start again.
    std::string resume_advice(const std::string& damaged) const;
    // Starting again: --overwrite when `writer` (a checkpoint's run folder) is this run's output,
    // which it would clear; else without --resume.
    std::string start_again_advice(const std::filesystem::path& writer) const;
    // A checkpoint folder, with "latest" resolved to the newest one.
    std::string folder_of(const std::string& folder) const;

    std::string output_;
    int rank_, world_size_;
    ProcessGroup* group_;
    std::string resolved_manifest_;
    std::vector<std::pair<std::string, double>> reward_columns_;
};

}  // namespace grove
