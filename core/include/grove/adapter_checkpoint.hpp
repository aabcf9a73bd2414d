// Adapter checkpoints. A run that trains an adapter saves it as PEFT does (adapter_config.json +
// adapter_model.safetensors, so Python's PeftModel loads it) plus grove_adapter.json: which adapter
// plugin and configuration made it. Merging re-creates that adapter through the plugin ABI,
// re-attaches it to the base model, loads its parameters and adds each layer's merged_delta to the
// base weight, so any adapter plugin merges, not only LoRA. A PEFT LoRA folder made elsewhere (no
// grove_adapter.json) merges through the explicitly named import peft_lora_import().
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "grove/beside_adapter.hpp"
#include "grove/manifest.hpp"

namespace grove {

class Model;
class AdapterHost;

// Writes the adapter's files into `folder` (rank 0, inside a checkpoint's temporary folder).
void save_adapter_checkpoint(const std::string& folder, const Model& model, const AdapterHost& adapter,
                             const PluginUse& adapter_use, const std::string& base_model_dir);

// The adapter that made a checkpoint folder: its grove_adapter.json, else peft_lora_import().
PluginUse adapter_use_of_checkpoint(const std::string& adapter_dir);

// What the checkpoint trained beside its adapter (modules_to_save, ensure_weight_tying,
// trainable_token_indices), from its grove_adapter.json, else its adapter_config.json.
BesideAdapter beside_adapter_of_checkpoint(const std::string& adapter_dir);

// The base model with the checkpoint's adapter merged into its weights. `plugin_dirs` are searched
// before the default plugin path.
std::unique_ptr<Model> load_merged_adapter(const std::string& adapter_dir, const std::string& base_dir,
                                           const std::string& device, const std::string& dtype,
                                           const std::vector<std::string>& plugin_dirs = {});

// The base model an adapter checkpoint's adapter_config.json names, as PEFT writes it: the folder or
// Hub id (base_model_name_or_path) and the Hub revision ("main" when it names none); nullopt when it
// names no base.
struct AdapterBase {
    std::string name_or_path, revision;
};
std::optional<AdapterBase> recorded_adapter_base(const std::string& adapter_dir);

// That base's folder, as PEFT's AutoPeftModel loads it: a folder (relative to the checkpoint if
// relative) or the Hub id's snapshot at that revision in the local Hugging Face cache; an input
// error naming the checkpoint and `grove export --base` when there is none.
std::string adapter_base_folder(const std::string& adapter_dir);

// `grove export --merge ADAPTER_DIR [--base MODEL_DIR] OUT_DIR`: a Hugging Face folder.
void export_merged(const std::string& adapter_dir, const std::string& base_dir, const std::string& out_dir);

// A model folder, or an adapter checkpoint (adapter_config.json, no config.json): then the base
// model its adapter_config.json names (base_model_name_or_path, relative to the checkpoint if
// relative) with the adapter merged in. eval, generate and logprobs take adapter checkpoints so.
std::unique_ptr<Model> load_model_or_adapter_checkpoint(const std::string& folder, const std::string& device,
                                                        const std::string& dtype,
                                                        const std::vector<std::string>& plugin_dirs = {});

}  // namespace grove
