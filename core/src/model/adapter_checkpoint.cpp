#include "grove/adapter_checkpoint.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "grove/adapter_host.hpp"
#include "grove/error.hpp"
#include "grove/hub_cache.hpp"
#include "grove/model.hpp"
#include "grove/plugin_host.hpp"
#include "grove/safetensors.hpp"
#include "grove/tokenizer.hpp"
#include "model/tensor_io.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace grove {

namespace {
const char* kAdapterRecord = "grove_adapter.json";

json read_json_file(const fs::path& path) {
    std::ifstream in(path);
    if (!in) throw Error(ErrorKind::input, path.string() + ": cannot be read");
    json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        throw Error(ErrorKind::input, path.string() + ": not a JSON object (is the file damaged?)");
    return j;
}
}  // namespace

void save_adapter_checkpoint(const std::string& folder, const Model& model, const AdapterHost& adapter,
                             const PluginUse& adapter_use, const std::string& base_model_dir) {
    save_tensors((fs::path(folder) / "adapter_model.safetensors").string(), model.saved_adapter_tensors(), {{"format", "pt"}});
    const std::string saved = adapter.saved_config_json();
    json config = saved.empty() ? json::object() : json::parse(saved, nullptr, false);
    if (!config.is_object())
        throw Error(ErrorKind::plugin, adapter_use.origin + ": the adapter's saved_config_json is not a JSON object");
    // a base from the Hugging Face cache is named by its Hub id and commit, as PEFT names it, so that
    // AutoPeftModelForCausalLM (and Grove) load that base from any cache
    if (const auto hub = cached_hub_model_of(base_model_dir)) {
        config["base_model_name_or_path"] = hub->id;
        config["revision"] = hub->commit;
    } else {
        config["base_model_name_or_path"] = fs::absolute(base_model_dir).string();
    }
    json record = {{"plugin", adapter_use.plugin}, {"config", plugin_config_toml(adapter_use)}};
    const BesideAdapter& beside = model.beside_adapter();
    for (json* j : {&config, &record}) {
        if (!beside.modules_to_save.empty()) (*j)["modules_to_save"] = beside.modules_to_save;
        if (beside.ensure_weight_tying) (*j)["ensure_weight_tying"] = true;
        if (!beside.trainable_token_indices.empty()) (*j)["trainable_token_indices"] = beside.trainable_token_indices;
    }
    write_file_atomically((fs::path(folder) / "adapter_config.json").string(), config.dump(2) + "\n");
    write_file_atomically((fs::path(folder) / kAdapterRecord).string(), record.dump(2) + "\n");
}

BesideAdapter beside_adapter_of_checkpoint(const std::string& adapter_dir) {
    const fs::path record_path = fs::path(adapter_dir) / kAdapterRecord;
    const fs::path file = fs::exists(record_path) ? record_path : fs::path(adapter_dir) / "adapter_config.json";
    const json j = read_json_file(file);
    BesideAdapter saved;
    auto read = [&](const char* key, auto& into, const char* what) {
        if (!j.contains(key) || j[key].is_null()) return;
        try {
            j[key].get_to(into);
        } catch (const json::exception&) {
            throw Error(ErrorKind::input, file.string() + ": " + key + " is not " + what);
        }
    };
    read("modules_to_save", saved.modules_to_save, "a list of module names");
    read("ensure_weight_tying", saved.ensure_weight_tying, "true or false");
    if (j.contains("trainable_token_indices") && j["trainable_token_indices"].is_object())
        throw Error(ErrorKind::input, file.string() +
                                          ": trainable_token_indices names layers (PEFT's dictionary form), which "
                                          "Grove does not take; merge this adapter with PEFT (merge_and_unload)");
    read("trainable_token_indices", saved.trainable_token_indices, "a list of token ids");
    return saved;
}

PluginUse adapter_use_of_checkpoint(const std::string& adapter_dir) {
    const fs::path record_path = fs::path(adapter_dir) / kAdapterRecord;
    if (!fs::exists(record_path)) return peft_lora_import((fs::path(adapter_dir) / "adapter_config.json").string());
    json record = read_json_file(record_path);
    if (!record.contains("plugin") || !record["plugin"].is_string() || !record.contains("config") ||
        !record["config"].is_string())
        throw Error(ErrorKind::input, record_path.string() + ": needs \"plugin\" and \"config\" strings");
    return plugin_use_from_toml(record["plugin"], record["config"], record_path.string());
}

std::unique_ptr<Model> load_merged_adapter(const std::string& adapter_dir, const std::string& base_dir,
                                           const std::string& device, const std::string& dtype,
                                           const std::vector<std::string>& plugin_dirs) {
    const PluginUse use = adapter_use_of_checkpoint(adapter_dir);
    PluginHost host(plugin_search_path(plugin_dirs));
    PluginInstance adapter = create_plugin(host, use, GROVE_PLUGIN_KIND_ADAPTER);
    AdapterHost adapter_host(adapter);
    if (adapter_host.trains_base_weights())
        throw Error(ErrorKind::input, adapter_dir + ": made by the adapter '" + adapter.info().name +
                                          "', which trains the base weights: the folder is a full model, nothing to merge");
    // declared after the adapter objects: if merging throws, the model (whose attached layers call
    // into the adapter when destroyed) goes first
    auto model = Model::load(base_dir, device, dtype);
    model->attach_adapter(adapter_host);
    model->train_beside_adapter(beside_adapter_of_checkpoint(adapter_dir));
    const std::string weights_path = (fs::path(adapter_dir) / "adapter_model.safetensors").string();
    SafetensorsFile weights(weights_path);
    const auto parameters = model->saved_adapter_tensors();  // a tied lm_head's name reads into the embedding
    if (!model->has_adapters())
        throw Error(ErrorKind::input,
                    adapter_dir + ": its adapter '" + adapter.info().name + "' attaches to no layer of " + base_dir);
    {
        at::NoGradGuard no_grad;
        for (const auto& [name, tensor] : parameters) {
            const TensorEntry* entry = weights.find(name);
            if (!entry)
                throw Error(ErrorKind::input,
                            weights_path + ": no \"" + name + "\" (was the adapter made for another model or configuration?)");
            if (entry->shape != std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end()))
                throw Error(ErrorKind::input, weights_path + ": \"" + name + "\" has shape " +
                                                  c10::str(at::IntArrayRef(entry->shape)) + " but the adapter '" +
                                                  adapter.info().name + "' configured from " + use.origin + " makes it " +
                                                  c10::str(tensor.sizes()) + " (a rank or target that differs per layer?)");
            at::Tensor target = tensor;
            target.copy_(tensor_from_entry(*entry, weights_path));
        }
        // PEFT wraps every layer its target names match, also those Grove does not compute (a multimodal
        // Gemma 3's vision tower): a zero lora_B there changes nothing, and its lora_A nothing without
        // it; any other tensor left over (a non-zero lora_B, a DoRA magnitude) would be lost here
        std::set<std::string> attached;
        for (const auto& [name, tensor] : parameters) attached.insert(name);
        for (const TensorEntry& entry : weights.tensors()) {
            if (attached.count(entry.name) || entry.name.find("lora_A") != std::string::npos) continue;
            if (entry.name.find("lora_B") != std::string::npos &&
                tensor_from_entry(entry, weights_path).count_nonzero().item<int64_t>() == 0)
                continue;
            throw Error(ErrorKind::input, weights_path + ": \"" + entry.name +
                                              "\" is not a tensor of the adapter Grove rebuilt from " + use.origin +
                                              " (a layer Grove does not compute, such as a vision tower, or a setting it does "
                                              "not take): merging without it would change the model; merge this adapter "
                                              "with PEFT (merge_and_unload)");
        }
    }
    model->merge_adapters();  // before adapter_host and adapter go out of scope
    return model;
}

void export_merged(const std::string& adapter_dir, const std::string& base_dir, const std::string& out_dir) {
    auto model = load_merged_adapter(adapter_dir, base_dir, "cpu", "float32");
    model->save(out_dir);
    copy_tokenizer_files(base_dir, out_dir);
}

std::optional<AdapterBase> recorded_adapter_base(const std::string& adapter_dir) {
    const fs::path file = fs::path(adapter_dir) / "adapter_config.json";
    if (!fs::exists(file)) return std::nullopt;
    const json config = read_json_file(file);
    const json base = config.value("base_model_name_or_path", json());
    if (!base.is_string() || base.get<std::string>().empty()) return std::nullopt;
    const json revision = config.value("revision", json());
    return AdapterBase{base.get<std::string>(), revision.is_string() ? revision.get<std::string>() : "main"};
}

std::string adapter_base_folder(const std::string& adapter_dir) {
    const auto base = recorded_adapter_base(adapter_dir);
    if (!base)
        throw Error(ErrorKind::input, adapter_dir +
                                          "/adapter_config.json: no base_model_name_or_path; merge it with "
                                          "`grove export --merge " +
                                          adapter_dir + " --base MODEL_DIR OUT_DIR`");
    const fs::path base_dir =
        fs::path(base->name_or_path).is_absolute()
            ? fs::path(base->name_or_path)
            : fs::path(local_or_cached_model_folder(base->name_or_path, (fs::path(adapter_dir) / base->name_or_path).string(),
                                                    base->revision));
    if (!fs::exists(base_dir / "config.json"))
        throw Error(ErrorKind::input, adapter_dir + "/adapter_config.json: its base model " + base->name_or_path +
                                          " (revision " + base->revision +
                                          ") is neither a model folder here nor in the local Hugging Face cache (" +
                                          hub_cache_directory() + "); merge it with `grove export --merge " + adapter_dir +
                                          " --base MODEL_DIR OUT_DIR`");
    return base_dir.string();
}

std::unique_ptr<Model> load_model_or_adapter_checkpoint(const std::string& folder, const std::string& device,
                                                        const std::string& dtype, const std::vector<std::string>& plugin_dirs) {
    const fs::path dir(folder);
    if (fs::exists(dir / "config.json") || !fs::exists(dir / "adapter_config.json")) return Model::load(folder, device, dtype);
    return load_merged_adapter(folder, adapter_base_folder(folder), device, dtype, plugin_dirs);
}

}  // namespace grove
