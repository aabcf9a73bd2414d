#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <toml++/toml.h>

#include "config/toml_input.hpp"
#include "grove/error.hpp"
#include "grove/manifest.hpp"

namespace grove {

std::string plugin_config_toml(const PluginUse& use) {
    if (!use.config) return "";
    toml::table table = *use.config;
    table.is_inline(false);  // the manifest's `config = { ... }` prints as a document, not inline
    std::ostringstream os;
    os << table;
    return os.str();
}

PluginUse plugin_use_from_toml(const std::string& plugin, const std::string& config_toml, const std::string& origin) {
    PluginUse use;
    use.plugin = plugin;
    use.name = plugin;
    use.origin = origin;
    try {
        use.config = std::make_shared<toml::table>(parse_toml(std::string_view(config_toml), std::string_view(origin)));
    } catch (const toml::parse_error& e) {
        throw Error(ErrorKind::input, origin + ": the recorded configuration is not TOML: " + std::string(e.description()));
    }
    return use;
}

PluginUse peft_lora_import(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw Error(ErrorKind::input, path + ": cannot be read (is this an adapter checkpoint?)");
    nlohmann::json c = nlohmann::json::parse(in, nullptr, false);
    if (c.is_discarded() || !c.is_object()) throw Error(ErrorKind::input, path + ": not a JSON object (is the file damaged?)");
    if (c.value("peft_type", "") != "LORA")
        throw Error(ErrorKind::input,
                    path + ": peft_type must be LORA: only PEFT LoRA folders import without a grove_adapter.json");
    // what the lora plugin cannot rebuild would merge into another model without a word: refused
    auto set = [&](const std::string& key) {
        if (!c.contains(key)) return false;
        const nlohmann::json& v = c[key];
        return !(v.is_null() || v == false || ((v.is_array() || v.is_object()) && v.empty()) || (key == "bias" && v == "none"));
    };
    for (const char* key : {"layers_pattern", "target_parameters", "bias", "lora_bias", "fan_in_fan_out", "use_qalora",
                            "alora_invocation_tokens", "arrow_config", "layer_replication", "megatron_config"})
        if (set(key))
            throw Error(
                ErrorKind::input,
                path + ": " + key +
                    " is set, which Grove's lora adapter does not take; merge this adapter with PEFT (merge_and_unload)");
    // these start the adapter from the base or from activations and leave the base as it was
    if (const nlohmann::json init = c.value("init_lora_weights", nlohmann::json(true));
        init.is_string() && init != "gaussian" && init != "eva" && init != "orthogonal")
        throw Error(ErrorKind::input, path + ": init_lora_weights is " + init.dump() +
                                          ", so the adapter is relative to base weights PEFT rewrote; convert it with PEFT "
                                          "(save_pretrained's path_initial_model_for_weight_conversion) or merge it there");
    toml::table config;
    try {
        config.insert("r", c.at("r").get<int64_t>());
        config.insert("alpha", c.at("lora_alpha").get<double>());
        config.insert("dropout", c.value("lora_dropout", 0.0));
        config.insert("use_rslora", c.value("use_rslora", false));
        config.insert("use_dora", c.value("use_dora", false));
        // a list, "all-linear", or one regular expression over the whole name (the lora plugin's *_regex key)
        auto insert_names = [&](const std::string& key) {
            const nlohmann::json& v = c.at(key);
            if (v.is_string() && v != "all-linear") {
                config.insert(key + "_regex", v.get<std::string>());
                return;
            }
            toml::array list;
            if (v.is_string())
                list.push_back(v.get<std::string>());
            else
                for (const auto& name : v) list.push_back(name.get<std::string>());
            config.insert(key, std::move(list));
        };
        insert_names("target_modules");
        if (set("exclude_modules")) insert_names("exclude_modules");
        if (set("layers_to_transform")) {
            toml::array layers;
            const nlohmann::json& v = c.at("layers_to_transform");
            if (v.is_number_integer())
                layers.push_back(v.get<int64_t>());
            else
                for (const auto& index : v) layers.push_back(index.get<int64_t>());
            config.insert("layers_to_transform", std::move(layers));
        }
        for (const char* key : {"rank_pattern", "alpha_pattern"}) {
            if (!set(key) || c[key].empty()) continue;
            toml::table patterns;
            for (const auto& [pattern, value] : c[key].items()) {
                if (value.is_number_integer())
                    patterns.insert(pattern, value.get<int64_t>());
                else
                    patterns.insert(pattern, value.get<double>());
            }
            config.insert(key, std::move(patterns));
        }
    } catch (const nlohmann::json::exception& e) {
        throw Error(ErrorKind::input, path + ": " + e.what());
    }
    PluginUse use;
    use.plugin = use.name = "lora";
    use.origin = path + " (imported as the lora adapter)";
    use.config = std::make_shared<toml::table>(std::move(config));
    return use;
}

}  // namespace grove
