#include "grove/reward_set.hpp"

#include <limits>
#include <stdexcept>

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

RewardSet::RewardSet(PluginHost& host, const std::vector<PluginUse>& uses) {
    for (const auto& use : uses) {
        auto info = host.find(use.plugin, GROVE_PLUGIN_KIND_REWARD, use.origin);
        roles_.push_back(use.role.empty() ? declared_role(info) : reward_role_from_name(use.role));
        instances_.emplace_back(info, PluginConfig(info, use.config.get(), use.origin + " config"));
        names_.push_back(use.name);
        weights_.push_back(use.weight);
    }
}

RewardScores RewardSet::score(const grove_reward_batch& batch, const std::vector<bool>& skip) const {
    RewardScores out;
    out.names = names_;
    const size_t N = batch.count;
    for (size_t k = 0; k < instances_.size(); ++k) {
        std::vector<float> scores(N, std::numeric_limits<float>::quiet_NaN()), metrics;
        if (k >= skip.size() || !skip[k]) instances_[k].score(batch, scores, metrics);
        out.values.push_back(std::move(scores));
        const auto& metric_names = instances_[k].info().metric_names;
        for (size_t m = 0; m < metric_names.size() && !metrics.empty(); ++m) {
            out.metric_names.push_back("rewards/" + names_[k] + "/" + metric_names[m]);
            out.metrics.emplace_back(metrics.begin() + long(m * N), metrics.begin() + long((m + 1) * N));
        }
    }
    return out;
}

std::optional<size_t> RewardSet::find_role(RewardRole role) const {
    for (size_t k = 0; k < roles_.size(); ++k)
        if (roles_[k] == role) return k;
    return std::nullopt;
}

}  // namespace grove
