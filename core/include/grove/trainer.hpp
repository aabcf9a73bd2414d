// The GRPO training loop (reference §0 and §3): TRL's batching, rewards from plugins, group-relative
// advantages, the clipped policy loss reduced by a reduction plugin, AdamW with gradient clipping and
// a learning-rate schedule, TRL-named metrics, atomic checkpoints and exact resume.
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
    bool overwrite = false;                // replace an output folder that holds another run
    std::optional<std::string> resume;     // "latest" or a checkpoint folder
    // torch.distributed terms. With world_size > 1 every rank runs a Trainer on the same manifest:
    // each generates and scores its slice of the generation batch, rewards are gathered for the
    // advantages, gradients are averaged, and rank 0 alone writes metrics and checkpoints.
    int rank = 0, world_size = 1;
    ProcessGroup* group = nullptr;         // required when world_size > 1; outlives the trainer
    std::ostream* log = nullptr;           // progress (nullptr: silent)
    bool progress_bar = false;             // one line redrawn in place (a terminal); else a line per logging step
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
    // Writes <output>/checkpoint-<step> atomically (temporary folder, then rename); keeps the last K.
    std::string save_checkpoint();

    int64_t global_step() const;
    int64_t total_steps() const;
    bool has_reference_model() const;  // false whenever beta = 0 (and for LoRA, which uses the base model)
    class Model& model();

private:
    struct State;
    std::unique_ptr<State> s_;
};

// `grove export --merge ADAPTER_DIR --base MODEL_DIR OUT_DIR`: base weights + merged LoRA deltas.
void export_merged(const std::string& adapter_dir, const std::string& base_dir, const std::string& out_dir);

// A model folder, or a LoRA checkpoint (adapter_config.json, no config.json): then the base model
// its adapter_config.json names (base_model_name_or_path, relative to the checkpoint if relative)
// with the adapter merged in. eval, generate and logprobs take LoRA checkpoints this way.
std::unique_ptr<class Model> load_model_or_lora_checkpoint(const std::string& folder, const std::string& device,
                                                           const std::string& dtype);

}  // namespace grove
