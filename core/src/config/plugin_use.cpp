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
    toml::table config;
    try {
        config.insert("r", c.at("r").get<int64_t>());
        config.insert("alpha", c.at("lora_alpha").get<double>());
        config.insert("dropout", c.value("lora_dropout", 0.0));
        config.insert("use_rslora", c.value("use_rslora", false));
        toml::array targets;
        const nlohmann::json& t = c.at("target_modules");
        if (t.is_string())
            targets.push_back(t.get<std::string>());
        else
            for (const auto& name : t) targets.push_back(name.get<std::string>());
        config.insert("target_modules", std::move(targets));
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
