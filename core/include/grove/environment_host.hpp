// The host side of environment plugins (SDK section 9): one call for every episode waiting on the
// environment, its answers copied into host-owned values. Nothing here depends on libtorch.
#pragma once

#include <grove/grove_plugin.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "grove/plugin_host.hpp"
#include "grove/plugin_worker.hpp"
#include "grove/run_config.hpp"

namespace grove {

enum class MissingPrompt;  // grove/dataset.hpp

// The episodes of one step() call, owned on the host side; view() gives the borrowed C struct that
// points into them (valid while this object lives and is not modified).
struct EnvironmentTurns {
    std::vector<uint64_t> episodes;
    std::vector<uint32_t> turns;
    std::vector<std::string> turn_texts, prompts, row_json;
    std::vector<std::string> prompt_json;   // the dataset's prompts as JSON; left empty when unknown
    std::vector<int64_t> token_offsets{0};  // CSR over tokens
    std::vector<int32_t> tokens;
    std::vector<uint8_t> ended_with_eos;
    int64_t step = 0;
    uint64_t seed = 0;

    // prompt_as_json: the dataset's prompt as JSON, "" where the row has none; nullopt: not known
    void add(uint64_t episode, uint32_t turn, std::string text, const std::vector<int64_t>& turn_tokens, bool eos,
             std::string prompt, std::string columns_json, std::optional<std::string> prompt_as_json = std::nullopt);
    size_t size() const { return episodes.size(); }
    const grove_environment_batch& view();

private:
    std::vector<grove_text> turn_text_views_, prompt_views_, json_views_, prompt_json_views_;
    grove_environment_batch batch_{};
};

// What the environment answered, per waiting episode.
struct EnvironmentAnswers {
    std::vector<std::string> observations;  // empty: no observation
    std::vector<uint8_t> done;
    std::vector<uint32_t> tool_calls, tool_failures;
};

// A live environment plugin: its stop strings (copied once) and its step() call. Every failure
// becomes a grove::Error(plugin) that names the plugin and the first episode of the call. It runs in
// Grove's process, or in a worker process of its own ([environment] isolation = "process").
class Environment {
public:
    explicit Environment(PluginInstance instance);
    explicit Environment(std::unique_ptr<PluginWorker> worker);
    ~Environment();

    const std::vector<std::string>& stop_strings() const { return stop_strings_; }
    // Its tools as the plugin gave them (SDK tools_json): a JSON array of function schemas, or (SDK
    // 1.11) an object choosing a list by a dataset column; empty: none (an empty array too, as TRL
    // passes `tools or None`).
    const std::string& tools_json() const { return tools_json_; }
    // The tools the prompt of a dataset row shows (its other columns as a JSON object): the array,
    // or the list its column names (TRL's environment_factory={name: factory}); "" for none. A row
    // without the column or with a name the environment does not know is refused, naming `origin`.
    std::string tools_for(const std::string& columns_json, const std::string& origin) const;
    // Whether it is several, each row's chosen by a dataset column (SDK 1.11 tools_json), and which.
    const std::string& tools_column() const { return tools_column_; }
    EnvironmentAnswers step(EnvironmentTurns& turns) const;
    // Whether it judges whole episodes (SDK 1.3 score_episodes), and its scores of `episodes`, each
    // given whole (NaN: no score).
    bool scores_episodes() const { return scores_episodes_; }
    std::vector<float> score_episodes(EnvironmentTurns& episodes) const;
    // What the plugin says of that judgement (SDK episode_reward): a reward even without
    // reward_weight, and the column's name when the manifest gives none (empty: none).
    bool reward_by_default() const { return reward_by_default_; }
    const std::string& default_reward_name() const { return reward_name_; }
    // That judgement as a reward column (name, weight; the plugin and config are the environment's),
    // or null: not a reward. make_environment decides it from the manifest and the plugin.
    const PluginUse* reward_column() const { return reward_column_ ? &*reward_column_ : nullptr; }
    // The columns that judgement fills: reward_column() alone, or, for several environments whose
    // tools_json names reward columns by value (SDK 1.12 "reward_names") when the manifest names
    // none, one per name, as TRL logs one per environment class with get_reward(). Empty: no reward.
    const std::vector<PluginUse>& reward_columns() const { return reward_columns_; }
    // The index in reward_columns() of the column a row's score goes to (the row's other columns
    // as a JSON object), or no_column (its environment has none; its score is not counted).
    static constexpr size_t no_column = size_t(-1);
    size_t reward_column_of(const std::string& columns_json) const;
    // Episodes' scores spread over reward_columns(): each row's in its own column, NaN in the others
    // (`columns_json`: each row's other columns).
    std::vector<std::vector<float>> scores_by_column(const std::vector<float>& scores,
                                                     const std::vector<std::string>& columns_json) const;
    // How a dataset read for this environment (null: none) takes rows without a prompt: the
    // environment's to write when it writes prompts (SDK begin_episodes), else refused.
    static MissingPrompt rows_without_prompt(const Environment* environment);
    // Whether it prepares episodes before generation (SDK 1.7 begin_episodes), and the text it adds
    // to each episode's prompt (empty: none).
    bool begins_episodes() const { return begins_episodes_; }
    std::vector<std::string> begin_episodes(EnvironmentTurns& episodes) const;
    const PluginInfo& info() const;

private:
    using AnswerCall = grove_status (*)(void*, const grove_environment_batch*, grove_environment_output*, grove_error_sink*);
    EnvironmentAnswers answer(EnvironmentTurns& turns, AnswerCall call, const char* name) const;

    std::optional<PluginInstance> instance_;  // in Grove's process, or
    std::unique_ptr<PluginWorker> worker_;    // in a worker process
    std::vector<std::string> stop_strings_;
    std::string tools_json_;
    std::string tools_column_;                           // SDK 1.11: the column that chooses, or empty
    std::map<std::string, std::string> tools_by_value_;  // the column's values: their tools ("" none)
    void set_tools(std::string tools_json);
    bool scores_episodes_ = false, begins_episodes_ = false;
    bool reward_by_default_ = false;  // SDK episode_reward: GROVE_EPISODES_JUDGED_AS_REWARD
    std::string reward_name_;         // the plugin's name for that column; empty: none
    std::optional<PluginUse> reward_column_;
    // SDK 1.12: each value's column name; empty when the manifest names the one column
    std::map<std::string, std::string> reward_name_by_value_;
    std::vector<PluginUse> reward_columns_;

    friend std::unique_ptr<Environment> make_environment(PluginHost&, const PluginUse&, const EnvironmentRewardSettings&,
                                                         const std::vector<PluginUse>&, bool);
};

// The [environment] plugin, created, with its judgement of whole episodes as a reward column when
// `reward` sets a weight or the plugin makes it one (TRL's get_reward()). A weight for a plugin
// that judges nothing, a name that `rewards` already use, and (with `reward_required`: a GRPO run
// with no [[rewards]]) no column at all are manifest errors naming the section and the fix.
std::unique_ptr<Environment> make_environment(PluginHost& host, const PluginUse& use, const EnvironmentRewardSettings& reward,
                                              const std::vector<PluginUse>& rewards, bool reward_required);

}  // namespace grove
