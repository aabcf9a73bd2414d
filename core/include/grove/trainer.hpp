// The GRPO training loop (docs/grpo.md#one-training-step, docs/architecture.md): TRL's batching,
// rewards from plugins, group-relative advantages, the clipped policy loss reduced by a reduction
// plugin, AdamW with gradient clipping and a learning-rate schedule, TRL-named metrics, atomic
// checkpoints and exact resume.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

namespace grove {

class Manifest;
class ProcessGroup;

struct TrainerOptions {
    bool overwrite = false;             // replace an output folder that holds another run
    std::optional<std::string> resume;  // "latest" or a checkpoint folder
    // torch.distributed terms. With world_size > 1 every rank runs a Trainer on the same manifest:
    // each generates and scores its slice of the generation batch, rewards are gathered for the
    // advantages, gradients are averaged, and rank 0 alone writes metrics and checkpoints.
    int rank = 0, world_size = 1;
    ProcessGroup* group = nullptr;      // required when world_size > 1; outlives the trainer
    std::optional<std::string> device;  // this rank's device, over [model] device (place_rank's choice)
    std::ostream* log = nullptr;        // progress (nullptr: silent)
    bool progress_bar = false;          // one line redrawn in place (a terminal); else a line per logging step
};

class Trainer {
public:
    Trainer(const Manifest& manifest, const TrainerOptions& options);
    ~Trainer();

    // One optimizer step (gradient_accumulation_steps micro-steps); returns its metrics.
    std::map<std::string, double> step();
    // Steps until max_steps (or the epochs) are done, logging and checkpointing as configured; stops
    // early, after a checkpoint, when SIGINT or SIGTERM arrives. Returns the number of steps run.
    int64_t run();
    // SIGINT or SIGTERM when one stopped the last run() (after it wrote a checkpoint), else 0
    int stop_signal() const;
    // Writes <output>/checkpoint-<step> atomically (temporary folder, then rename); keeps the last K.
    // `model_only` (output.save_only_model) leaves out what only a resume needs.
    std::string save_checkpoint(bool model_only = false);

    int64_t global_step() const;
    int64_t total_steps() const;
    bool has_reference_model() const;  // false whenever beta = 0 (and for LoRA, which uses the base model)
    class Model& model();

private:
    void print_progress(const std::map<std::string, double>& metrics, int64_t steps_run, double elapsed_seconds) const;
    struct State;
    std::unique_ptr<State> s_;
};

}  // namespace grove
