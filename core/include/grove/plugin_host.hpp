// The plugin host: finds plugin libraries, loads them with Boost.DLL, checks their ABI version,
// validates each instance's configuration against the keys the plugin declares, creates and
// destroys instances, and turns every plugin failure into one grove::Error that names the plugin
// and its file. Nothing here depends on libtorch.
#pragma once

#include <grove/grove_plugin.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace toml {
inline namespace v3 {
class table;
class node;
}  // namespace v3
}  // namespace toml

namespace grove {

class PluginLibrary;  // a loaded shared library; kept alive while any of its plugins is in use

const char* plugin_kind_name(uint32_t kind);  // "reward", "reduction", "adapter", "environment", "unknown"

// One plugin as found in a library.
struct PluginInfo {
    std::string name;
    uint32_t kind = 0;  // grove_plugin_kind
    std::string version;
    std::string description;
    std::string file;  // absolute path of the library
    uint32_t abi_major = 0;
    uint32_t abi_minor = 0;
    uint64_t flags = 0;
    std::vector<grove_config_key> keys;  // strings point into the library (kept alive below)
    std::vector<std::string> metric_names;
    const grove_plugin_descriptor* descriptor = nullptr;
    std::shared_ptr<PluginLibrary> library;

    std::string display() const;  // "'format' (/path/libgrove_format.so)"
};

// Where plugins are looked for, in order: directories given explicitly (the manifest's
// plugin_dirs), then $GROVE_PLUGIN_PATH (colon-separated), then <exe>/../lib/grove/plugins (which
// is the build tree's plugin folder for a built grove and the installed one for an installed grove).
std::vector<std::string> plugin_search_path(const std::vector<std::string>& explicit_dirs);

class PluginHost {
public:
    explicit PluginHost(std::vector<std::string> search_dirs);

    // Every plugin in the search path. Libraries that cannot be used (not a plugin, wrong ABI) are
    // skipped and described in `skipped`. A name provided by two different files is an error.
    std::vector<PluginInfo> list(std::vector<std::string>* skipped = nullptr);

    // `reference` is a name ("format") or a path to a library ("./libmy_reward.so", anything with a
    // '/' or ending in ".so"). With a path, the library must hold exactly one plugin of that kind,
    // or `name` selects one. `expected_kind` 0 accepts any kind.
    // `origin` (e.g. "grove.toml:12:1 [adapter]") prefixes every error, so it names the line to fix.
    PluginInfo find(const std::string& reference, uint32_t expected_kind = 0, const std::string& origin = "");

    // Loads one library file and returns all its plugins (errors name the file).
    std::vector<PluginInfo> load_file(const std::string& path);

    const std::vector<std::string>& search_dirs() const { return search_dirs_; }

private:
    PluginInfo find_anywhere(const std::string& reference, uint32_t expected_kind);
    std::vector<std::string> search_dirs_;
};

// An instance's validated configuration in C ABI form. Owns all storage the grove_config points to.
class PluginConfig {
public:
    // Checks `table` against the plugin's declared keys: unknown keys (with a suggestion), wrong
    // types, missing required keys. `origin` names the table in messages when a key has no source
    // position (e.g. it came from --set). `base_dir`: the folder the table's relative paths are
    // relative to (the manifest's; empty = the current folder). Throws grove::Error(manifest).
    PluginConfig(const PluginInfo& plugin, const toml::table* table, const std::string& origin,
                 const std::string& base_dir = "");
    // From TOML text (tests, `grove plugins info`).
    static PluginConfig from_toml_text(const PluginInfo& plugin, const std::string& toml_text, const std::string& origin,
                                       const std::string& base_dir = "");
    PluginConfig(PluginConfig&&) noexcept;
    ~PluginConfig();

    const grove_config* get() const { return &config_; }
    // "file:line:col" of a key, or the origin when unknown.
    std::string location_of(const std::string& key) const;
    const std::string& origin() const { return origin_; }

private:
    struct Storage;
    std::unique_ptr<Storage> storage_;
    grove_config config_{};
    std::string origin_;
};

// One live instance; destroyed (and its library released) with this object.
// What an objective plugin returned for one micro-batch (grove_objective_output), host-owned.
struct ObjectiveResult {
    double loss = 0;
    std::vector<float> grad;                         // [rows * columns]: d loss / d logp
    std::vector<double> metric_sums, metric_counts;  // per metric of the descriptor, NaN where unset
    std::vector<uint8_t> metric_aggregation;         // grove_metric_aggregation per metric
};

// What a reward logs while it scores a batch, besides its scores, in the order logged: scalars by
// name (TRL's log_metric) and per-row values by column, as JSON texts (TRL's log_extra).
struct RewardLogs {
    std::vector<std::pair<std::string, double>> metrics;
    std::vector<std::pair<std::string, std::vector<std::string>>> extras;
};

class PluginInstance {
public:
    PluginInstance(PluginInfo plugin, PluginConfig config);  // throws grove::Error(plugin)
    PluginInstance(PluginInstance&&) noexcept;
    PluginInstance& operator=(PluginInstance&&) = delete;
    PluginInstance(const PluginInstance&) = delete;
    ~PluginInstance();

    const PluginInfo& info() const { return plugin_; }
    void* handle() const { return instance_; }

    // Reward call. scores/metrics are resized and NaN-filled by the host before the call; `logs`
    // receives what the plugin logs (grove_reward_output.log_metric and log_extra), in order.
    void score(const grove_reward_batch& batch, std::vector<float>& scores, std::vector<float>& metrics,
               RewardLogs* logs = nullptr) const;
    // Reduction call. weight is resized to rows*columns.
    void weights(const grove_reduction_context& context, std::vector<float>& weight) const;
    // Objective call: the loss and its gradient; a non-finite gradient is an error naming the plugin
    // (a non-finite loss is the caller's to report, once every rank knows).
    ObjectiveResult objective_loss(const grove_objective_batch& batch) const;

    // Throws grove::Error(plugin) naming this plugin, the call and the plugin's message when
    // status != GROVE_OK. Exposed for the adapter host.
    void check(grove_status status, const char* call, const struct ErrorCapture& capture) const;

private:
    PluginInfo plugin_;
    PluginConfig config_;
    void* instance_ = nullptr;
};

// Borrowed C views of host-owned strings, for the batches that cross the ABI.
std::vector<grove_text> text_views(const std::vector<std::string>& strings);

// The rows of one reward call, owned on the host side; view() gives the borrowed C struct that
// points into them (valid while this object lives and is not modified).
struct RewardRows {
    std::vector<std::string> prompts, completions, row_json;  // row_json: each row's other columns
    std::vector<std::string> prompt_json;                     // each row's dataset prompt as JSON, or empty when there is none
    std::vector<int64_t> token_offsets{0};                    // CSR over tokens
    std::vector<int32_t> tokens;
    std::vector<uint8_t> model_token_mask;  // aligned with tokens: 1 = the model wrote it, 0 = an environment
    std::vector<uint8_t> truncated;
    uint32_t num_generations = 1;
    int64_t step = 0;
    uint64_t seed = 0;
    uint32_t rank = 0, world_size = 1;
    uint64_t global_row_offset = 0;                 // row 0's index in the generation batch (all ranks; eval: the set)
    int64_t max_steps = 0;                          // the run's optimizer steps in all; 0 = unknown
    std::vector<std::string> episode_turns;         // the episodes' turns, row after row (grove_reward_batch)
    std::vector<uint64_t> episode_turn_offsets{0};  // CSR over episode_turns

    // `model_tokens` (aligned with completion_tokens) is empty for a completion the model wrote whole
    void add(std::string prompt, std::string completion, const std::vector<int32_t>& completion_tokens, bool is_truncated,
             std::string columns_json, const std::vector<uint8_t>& model_tokens = {});
    // The last added row is an episode with these turns (alternating, the model's first).
    void add_episode_turns(std::vector<std::string> turns);
    size_t size() const { return prompts.size(); }
    const grove_reward_batch& view();

private:
    std::vector<grove_text> prompt_views_, completion_views_, json_views_, prompt_json_views_, turn_views_;
    grove_reward_batch batch_{};
};

// The counts a reduction plugin's weights depend on, besides the mask (grove_reduction_context).
struct ReductionCounts {
    uint32_t gradient_accumulation_steps = 1, steps_per_generation = 1, world_size = 1, max_completion_length = 0;
    double generation_batch_tokens = 0, generation_batch_sequences = 0, optimizer_window_tokens = 0;
};
// The borrowed C context for one micro-batch's mask [rows * columns], row-major.
grove_reduction_context reduction_context(const float* mask, uint32_t rows, uint32_t columns, const ReductionCounts& counts);

struct PluginUse;
// The manifest's use of a plugin (a reward, the adapter, the reduction) as a live instance: found by
// name or path, its table checked against the plugin's keys; errors name the use's manifest line.
PluginInstance create_plugin(PluginHost& host, const PluginUse& use, uint32_t kind);

// Collects what a plugin reports through a grove_error_sink.
struct ErrorCapture {
    ErrorCapture();
    grove_error_sink sink;
    std::string key;
    std::string message;
    bool reported = false;
};

}  // namespace grove
