// The run's reward functions as one unit: the plugin instances with their metric names and weights,
// scoring a batch in one call per function. Shared by `grove train` (the scoring stage), `grove eval`
// and `grove plugins score`. No libtorch.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "grove/manifest.hpp"
#include "grove/plugin_host.hpp"
#include "grove/tokenizer.hpp"

namespace grove {

class IsolatedReward;

// Per-row values that rewards logged by column (TRL's log_extra): column -> [N] JSON texts, "" for a
// row with no value. A column a reward logs twice fills the rows after its first values; a column
// that two rewards log is the second's as "<reward>/<column>".
using ExtraColumns = std::vector<std::pair<std::string, std::vector<std::string>>>;
// The columns of `logs.extras` over a batch of `rows` rows; throws when a column gets more values than
// rows, or a value that is not JSON.
ExtraColumns extra_columns(const RewardLogs& logs, size_t rows);

// Every reward function's score of every row of one batch (rows group-major, as the batch's).
struct RewardScores {
    std::vector<std::string> names;          // [K] metric names of the functions
    std::vector<std::vector<float>> values;  // [K][N]; NaN where a function does not apply
    // [M] "rewards/<reward>/<metric>" for the plugins' per-row metrics, then the names the plugins
    // logged by name (TRL's log_metric), as given
    std::vector<std::string> metric_names;
    std::vector<std::vector<float>> metrics;  // [M][N]; a logged name's values fill its first rows, NaN after
    ExtraColumns extra;                       // what the plugins logged per row (TRL's log_extra)
    size_t rows() const { return values.empty() ? 0 : values[0].size(); }
    // row-major [N * K], as compute_advantages takes it
    std::vector<float> row_major() const;
};

// What `grove eval` reports a reward as. A plugin declares it (GROVE_PLUGIN_REPORTS_ACCURACY /
// _FORMAT_RATE); the manifest's [[rewards]] role overrides it.
enum class RewardRole { none, accuracy, format_rate };

// Each row's prompt as chat messages, or an empty list for a text prompt (a reward model renders a
// conversation with its own chat template, as TRL does).
using PromptMessages = std::vector<std::vector<ChatMessage>>;

// A reward the host computes itself rather than a plugin: a reward model (grove/reward_model.hpp,
// which needs libtorch). It fills scores[i] for every row of the batch; `messages` may be null.
using HostReward =
    std::function<void(const grove_reward_batch& batch, const PromptMessages* messages, std::vector<float>& scores)>;
using HostRewardFactory = std::function<HostReward(const PluginUse& use)>;

class RewardSet {
public:
    // Finds and configures every use (manifest errors name the use's origin); uses with a model go to
    // `models`, and without one such a use is an error.
    RewardSet(PluginHost& host, const std::vector<PluginUse>& uses, const HostRewardFactory& models = {});
    ~RewardSet();
    RewardSet(RewardSet&&) noexcept;

    size_t size() const { return instances_.size(); }
    const std::vector<std::string>& names() const { return names_; }
    const std::vector<double>& weights() const { return weights_; }

    // Calls every function once on the batch. `skip[k]` leaves function k uncalled, its values NaN
    // (replayed rows that bring their own values).
    // `messages` ([N] or null): the rows' prompts as conversations, for reward models.
    RewardScores score(const grove_reward_batch& batch, const std::vector<bool>& skip = {},
                       const PromptMessages* messages = nullptr) const;

    // The first function with this role, if any.
    std::optional<size_t> find_role(RewardRole role) const;

private:
    std::vector<std::optional<PluginInstance>> instances_;   // nullopt: host_rewards_ or isolated_ has it
    std::vector<std::unique_ptr<IsolatedReward>> isolated_;  // [[rewards]] isolation = "process"
    std::vector<HostReward> host_rewards_;
    std::vector<std::string> names_;
    std::vector<double> weights_;
    std::vector<RewardRole> roles_;
};

RewardRole reward_role_from_name(const std::string& name);  // "none" | "accuracy" | "format_rate"

}  // namespace grove
