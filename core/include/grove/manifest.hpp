// The TOML manifest that composes a run. Every key, its type, default, valid range and meaning is
// declared once, in the schema table (manifest_schema.cpp); the validator, `grove check`'s resolved
// output and docs/manifest.md all come from that table.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace toml {
inline namespace v3 {
class table;
}
}  // namespace toml

namespace grove {

enum class KeyType { string, integer, number, boolean, string_array, table, integer_array };

struct KeySpec {
    const char* section;  // "model", "generation", ...; "" = top level; "rewards[]" = each reward
    const char* key;
    KeyType type;
    const char* default_toml;  // TOML literal of the default; nullptr = unset unless given
    const char* help;
    const char* choices = nullptr;  // "a|b|c" for strings
    double min = -1e300;            // inclusive bounds for numbers
    double max = 1e300;
    bool min_exclusive = false;
    bool required = false;
    bool is_path = false;            // resolved against the manifest's folder
    const char* trl_name = nullptr;  // the GRPOConfig / TrainingArguments option it mirrors
};

const std::vector<KeySpec>& manifest_schema();

// One plugin use: a reward, the adapter, the reduction, the objective, or the environment.
struct PluginUse {
    std::string plugin;  // name or path (paths already resolved); empty for a reward model
    std::string model;   // rewards: a Hugging Face sequence-classification folder (resolved), or empty
    std::string name;    // rewards: the metric name (defaults to the plugin name)
    double weight = 1.0;
    std::string role;  // rewards: "accuracy" | "format_rate" | "none" for `grove eval`; "" = the plugin's own
    std::shared_ptr<toml::table> config;  // the plugin's own table (never null)
    std::string origin;                   // "grove.toml:12:1 [[rewards]] #1" — where the use is declared
    std::string base_dir;                 // the manifest's folder: the plugin resolves relative paths against it
    struct Isolation {                    // rewards: isolation, timeout and on_failure
        bool process = false;             // run the plugin in a worker process
        double timeout_seconds = 0;       // per call; 0 = none
        bool failures_are_nan = false;    // a failed batch scores NaN instead of stopping the run
    } isolation;
};

// What a manifest is read for: a GRPO run's batches must hold whole groups of num_generations;
// grove sft's have no groups.
enum class ManifestUse { grpo, sft };

class Manifest {
public:
    // Parses, applies `overrides` ("section.key=value", as --set), validates, fills defaults and
    // resolves the batch configuration. world_size: processes of the run (from WORLD_SIZE).
    // Throws grove::Error(manifest) with file:line:col, what is wrong and what is valid.
    static Manifest load(const std::string& path, const std::vector<std::string>& overrides = {}, int world_size = 1,
                         ManifestUse use = ManifestUse::grpo);
    static Manifest parse(const std::string& text, const std::string& source_name,
                          const std::vector<std::string>& overrides = {}, int world_size = 1,
                          ManifestUse use = ManifestUse::grpo);

    // Typed access by "section.key"; the key must be declared in the schema (a typo is a bug:
    // std::logic_error). Optional keys that are unset give std::nullopt.
    std::string string(const std::string& key) const;
    int64_t integer(const std::string& key) const;
    double number(const std::string& key) const;
    bool boolean(const std::string& key) const;
    std::optional<int64_t> optional_integer(const std::string& key) const;
    std::optional<double> optional_number(const std::string& key) const;
    std::optional<bool> optional_boolean(const std::string& key) const;
    std::optional<std::string> optional_string(const std::string& key) const;
    std::vector<std::string> strings(const std::string& key) const;
    std::vector<int64_t> integers(const std::string& key) const;

    const std::vector<PluginUse>& rewards() const { return rewards_; }
    const PluginUse& adapter() const { return adapter_; }
    const PluginUse& reduction() const { return reduction_; }
    const PluginUse& objective() const { return objective_; }
    const std::optional<PluginUse>& environment() const { return environment_; }  // [environment] plugin, when set
    const std::string& path() const { return path_; }
    const std::string& directory() const { return directory_; }
    int world_size() const { return world_size_; }

    // Schema keys (outside [[rewards]], [adapter], [reduction], [objective]) that no accessor has read since the
    // manifest was loaded: a test builds a RunConfig and expects none, so no key is ignored silently.
    std::vector<std::string> keys_never_read() const;

    // The whole configuration with every default and derived value, as TOML with one comment per key.
    // `absolute_paths`: relative paths made absolute against the current folder, so two runs of the
    // same manifest started from different folders print the same (what a checkpoint keeps).
    std::string resolved_toml(bool absolute_paths = false) const;
    // The keys whose values differ between two resolved_toml() texts, each as
    // "section.key = NOW (was BEFORE)" ("unset" for a key one of them lacks; a reward's keys by
    // index, "rewards.0.weight"). A key `before` lacks that `now` has at its schema default (a key
    // added to Grove since `before` was written) is no change. A text that is not TOML counts as
    // having no keys.
    static std::vector<std::string> resolved_changes(const std::string& before, const std::string& now);
    // The string at `key` ("section.key") of a resolved_toml() text; none when it has no such string.
    static std::optional<std::string> resolved_string(const std::string& resolved, const std::string& key);

    // model.path becomes `folder` (a resumed run keeping the Hub snapshot it started from). The
    // values are copied first: manifests copied from this one keep theirs.
    void use_model_folder(const std::string& folder);

private:
    std::string path_, directory_;
    int world_size_ = 1;
    std::shared_ptr<toml::table> values_;  // resolved section -> key -> value
    std::shared_ptr<std::set<std::string>> keys_read_ = std::make_shared<std::set<std::string>>();
    std::vector<PluginUse> rewards_;
    PluginUse adapter_, reduction_, objective_;
    std::optional<PluginUse> environment_;
};

// A plugin use's own table as TOML text, and back (adapter checkpoints record theirs).
std::string plugin_config_toml(const PluginUse& use);
PluginUse plugin_use_from_toml(const std::string& plugin, const std::string& config_toml, const std::string& origin);
// The explicitly named import of a PEFT LoRA folder made elsewhere: the built-in "lora" adapter
// configured from its adapter_config.json (r, lora_alpha, lora_dropout, use_rslora, target_modules).
PluginUse peft_lora_import(const std::string& adapter_config_path);

// A number in the fewest digits (15 to 17) that read back as the same double: 0.9, not
// 0.90000000000000002; 1e-07.
std::string format_number(double value);

// docs/manifest.md, generated from the schema (a test keeps the committed file identical).
std::string manifest_reference_markdown();

}  // namespace grove
