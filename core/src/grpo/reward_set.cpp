#include "grove/reward_set.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "grove/error.hpp"
#include "grove/isolated_reward.hpp"

namespace grove {

std::vector<float> RewardScores::row_major() const {
    const size_t K = values.size(), N = rows();
    std::vector<float> out(N * K);
    for (size_t k = 0; k < K; ++k)
        for (size_t i = 0; i < N; ++i) out[i * K + k] = values[k][i];
    return out;
}

RewardRole reward_role_from_name(const std::string& name) {
    if (name == "accuracy") return RewardRole::accuracy;
    if (name == "format_rate") return RewardRole::format_rate;
    if (name == "none") return RewardRole::none;
    throw std::invalid_argument("'" + name + "' is not one of none, accuracy, format_rate");
}

namespace {
RewardRole declared_role(const PluginInfo& info) {
    if (info.flags & GROVE_PLUGIN_REPORTS_ACCURACY) return RewardRole::accuracy;
    if (info.flags & GROVE_PLUGIN_REPORTS_FORMAT_RATE) return RewardRole::format_rate;
    return RewardRole::none;
}
}  // namespace

RewardSet::RewardSet(PluginHost& host, const std::vector<PluginUse>& uses, const HostRewardFactory& models) {
    for (const auto& use : uses) {
        names_.push_back(use.name);
        weights_.push_back(use.weight);
        if (!use.model.empty()) {
            if (!models)
                throw Error(ErrorKind::usage, use.origin +
                                                  ": a reward model is scored by grove train and grove eval; this "
                                                  "command scores reward plugins only");
            roles_.push_back(use.role.empty() ? RewardRole::none : reward_role_from_name(use.role));
            instances_.emplace_back(std::nullopt);
            host_rewards_.push_back(models(use));
            continue;
        }
        auto info = host.find(use.plugin, GROVE_PLUGIN_KIND_REWARD, use.origin);
        roles_.push_back(use.role.empty() ? declared_role(info) : reward_role_from_name(use.role));
        host_rewards_.emplace_back();
        if (use.isolation.process) {
            instances_.emplace_back(std::nullopt);
            isolated_.resize(instances_.size());
            isolated_.back() = std::make_unique<IsolatedReward>(info, use);
            continue;
        }
        instances_.emplace_back(
            PluginInstance(info, PluginConfig(info, use.config.get(), use.origin + " config", use.base_dir)));
    }
    isolated_.resize(instances_.size());
}

RewardSet::~RewardSet() = default;
RewardSet::RewardSet(RewardSet&&) noexcept = default;

namespace {
// Values logged by name become metric columns whose mean over the gathered rows is TRL's
// sum(values) / count(values): value j of a name sits in row j, NaN elsewhere.
void add_logged_metrics(const std::vector<std::pair<std::string, double>>& logged, size_t rows, RewardScores& out) {
    std::map<std::string, size_t> column_of;
    for (const auto& [name, value] : logged) {
        auto [it, added] = column_of.try_emplace(name, out.metrics.size());
        if (added) {
            out.metric_names.push_back(name);
            out.metrics.emplace_back(rows, std::numeric_limits<float>::quiet_NaN());
        }
        std::vector<float>& column = out.metrics[it->second];
        auto slot = std::find_if(column.begin(), column.end(), [](float v) { return std::isnan(v); });
        if (slot == column.end())
            throw Error(ErrorKind::plugin, "a reward logged '" + name + "' more than " + std::to_string(rows) +
                                               " times (the batch's rows) in one batch; log it once per batch");
        *slot = float(value);
    }
}
}  // namespace

ExtraColumns extra_columns(const RewardLogs& logs, size_t rows) {
    ExtraColumns columns;
    std::map<std::string, size_t> column_of;
    std::map<std::string, size_t> filled;
    for (const auto& [column, values] : logs.extras) {
        auto [it, added] = column_of.try_emplace(column, columns.size());
        if (added) columns.emplace_back(column, std::vector<std::string>(rows));
        size_t& next = filled[column];
        if (values.size() > rows - next)
            throw Error(ErrorKind::plugin, "a reward logged " + std::to_string(next + values.size()) +
                                               " values for the column '" + column + "' of a batch of " + std::to_string(rows) +
                                               " rows (log_extra takes one value per row)");
        for (const std::string& value : values) {
            if (!nlohmann::json::accept(value))
                throw Error(ErrorKind::plugin,
                            "a reward logged a value for the column '" + column + "' that is not JSON: " + value.substr(0, 80));
            columns[it->second].second[next++] = value;
        }
    }
    return columns;
}

namespace {
// One reward's columns joined to the batch's; a column another reward already logged is kept apart
// as "<reward>/<column>".
void add_extra_columns(const RewardLogs& logs, size_t rows, const std::string& reward, ExtraColumns& columns) {
    ExtraColumns mine;
    try {
        mine = extra_columns(logs, rows);
    } catch (const Error& e) {
        throw Error(e.kind(), "reward " + reward + ": " + e.what());
    }
    for (auto& entry : mine) {  // (a named reference: lambdas may not capture structured bindings before C++20)
        const std::string& column = entry.first;
        const bool taken = std::any_of(columns.begin(), columns.end(), [&](const auto& c) { return c.first == column; });
        columns.emplace_back(taken ? reward + "/" + column : column, std::move(entry.second));
    }
}
}  // namespace

RewardScores RewardSet::score(const grove_reward_batch& batch, const std::vector<bool>& skip,
                              const PromptMessages* messages) const {
    RewardScores out;
    std::vector<std::pair<std::string, double>> logged;  // every reward's, in order
    out.names = names_;
    const size_t N = batch.count;
    for (size_t k = 0; k < instances_.size(); ++k) {
        std::vector<float> scores(N, std::numeric_limits<float>::quiet_NaN()), metrics;
        const bool wanted = k >= skip.size() || !skip[k];
        if (host_rewards_[k]) {
            if (wanted) host_rewards_[k](batch, messages, scores);
            out.values.push_back(std::move(scores));
            continue;
        }
        RewardLogs mine;
        if (wanted && isolated_[k])
            isolated_[k]->score(batch, scores, metrics, &mine);
        else if (wanted)
            instances_[k]->score(batch, scores, metrics, &mine);
        logged.insert(logged.end(), mine.metrics.begin(), mine.metrics.end());
        add_extra_columns(mine, N, names_[k], out.extra);
        out.values.push_back(std::move(scores));
        const auto& metric_names = isolated_[k] ? isolated_[k]->info().metric_names : instances_[k]->info().metric_names;
        for (size_t m = 0; m < metric_names.size() && !metrics.empty(); ++m) {
            out.metric_names.push_back("rewards/" + names_[k] + "/" + metric_names[m]);
            out.metrics.emplace_back(metrics.begin() + long(m * N), metrics.begin() + long((m + 1) * N));
        }
    }
    add_logged_metrics(logged, N, out);
    return out;
}

std::optional<size_t> RewardSet::find_role(RewardRole role) const {
    for (size_t k = 0; k < roles_.size(); ++k)
        if (roles_[k] == role) return k;
    return std::nullopt;
}

}  // namespace grove
