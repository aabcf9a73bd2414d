#include "train/dynamic_sampling.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "grove/advantages.hpp"

namespace grove {

bool group_disagrees(const ScoredBatch& batch, int64_t group, int64_t G) {
    const std::vector<float>& r = batch.statistics.rewards;
    std::vector<double> rows(r.begin() + group * G, r.begin() + (group + 1) * G);
    const double std = nanstd(rows);  // NaN (fewer than two scorable rows) counts as agreeing
    return std::isfinite(std) && std > 1e-8;
}

namespace {
struct Pick {
    size_t part;
    int64_t group;
};

// The picked groups' rows of several rollouts as one rollout (completions padded to the widest).
Rollout select_rollout(const std::vector<ScoredRollout>& parts, const std::vector<Pick>& picks, int64_t G,
                       int64_t pad_token_id) {
    int64_t width = 0;
    for (const Pick& p : picks) width = std::max(width, parts[p.part].rollout.completions.completion_ids.size(1));
    const int64_t N = int64_t(picks.size()) * G;
    // replayed rounds may differ: a single-turn row's model tokens are its completion's
    const bool multi_turn =
        std::any_of(parts.begin(), parts.end(), [](const ScoredRollout& p) { return p.rollout.model_token_mask.defined(); });
    Rollout out;
    out.seed = parts[0].rollout.seed;
    GenerationResult& c = out.completions;
    c.completion_ids = at::full({N, width}, pad_token_id, at::kLong);
    c.completion_mask = at::zeros({N, width}, at::kLong);
    c.sampled_logprobs = at::zeros({N, width}, at::kFloat);
    c.truncated = at::zeros({N}, at::kBool);
    if (multi_turn) out.model_token_mask = at::zeros({N, width}, at::kLong);
    int64_t row = 0;
    for (const Pick& p : picks) {
        const Rollout& from = parts[p.part].rollout;
        const GenerationResult& f = from.completions;
        const int64_t w = f.completion_ids.size(1);
        for (int64_t j = p.group * G; j < (p.group + 1) * G; ++j, ++row) {
            out.rows.push_back(from.rows[size_t(j)]);
            c.completion_ids[row].narrow(0, 0, w).copy_(f.completion_ids[j]);
            c.completion_mask[row].narrow(0, 0, w).copy_(f.completion_mask[j]);
            c.sampled_logprobs[row].narrow(0, 0, w).copy_(f.sampled_logprobs[j].cpu());
            c.truncated[row] = f.truncated[j];
            c.lengths.push_back(f.lengths[size_t(j)]);
            if (multi_turn)
                out.model_token_mask[row].narrow(0, 0, w).copy_(from.model_token_mask.defined() ? from.model_token_mask[j]
                                                                                                : f.completion_mask[j]);
            if (!from.episodes.empty()) out.episodes.push_back(from.episodes[size_t(j)]);
        }
    }
    return out;
}

// The picked groups' scores as one batch, its advantages and statistics recomputed over it.
ScoredBatch select_scores(const std::vector<ScoredRollout>& parts, const std::vector<Pick>& picks, int64_t G,
                          const AdvantageOptions& options) {
    const ScoredBatch& first = parts[0].scored;
    ScoredBatch out;
    out.reward_names = first.reward_names;
    out.weights = first.weights;
    out.plugin_metric_names = first.plugin_metric_names;
    out.rewards.resize(first.rewards.size());
    out.plugin_metric_rows.resize(first.plugin_metric_rows.size());
    for (const Pick& p : picks) {
        const ScoredBatch& s = parts[p.part].scored;
        // a metric a reward logged by name may be missing from a round: matched by name, NaN there
        std::vector<const std::vector<double>*> metric_rows;
        for (const std::string& name : out.plugin_metric_names) {
            auto at = std::find(s.plugin_metric_names.begin(), s.plugin_metric_names.end(), name);
            metric_rows.push_back(at == s.plugin_metric_names.end()
                                      ? nullptr
                                      : &s.plugin_metric_rows[size_t(at - s.plugin_metric_names.begin())]);
        }
        for (int64_t j = p.group * G; j < (p.group + 1) * G; ++j) {
            for (size_t k = 0; k < s.rewards.size(); ++k) out.rewards[k].push_back(s.rewards[k][size_t(j)]);
            for (size_t m = 0; m < metric_rows.size(); ++m)
                out.plugin_metric_rows[m].push_back(metric_rows[m] ? (*metric_rows[m])[size_t(j)]
                                                                   : std::numeric_limits<double>::quiet_NaN());
            out.completion_lengths.push_back(s.completion_lengths[size_t(j)]);
            out.prompt_lengths.push_back(s.prompt_lengths[size_t(j)]);
            out.truncated.push_back(s.truncated[size_t(j)]);
            out.local_completions.push_back(s.local_completions[size_t(j)]);
            // what rewards logged per row, matched by column ("" where a round lacks it)
            const size_t row = out.local_completions.size() - 1;
            for (const auto& logged : s.local_extra) {
                auto at = std::find_if(out.local_extra.begin(), out.local_extra.end(),
                                       [&](const auto& c) { return c.first == logged.first; });
                if (at == out.local_extra.end()) at = out.local_extra.insert(out.local_extra.end(), {logged.first, {}});
                at->second.resize(row + 1);
                at->second[row] = logged.second[size_t(j)];
            }
        }
    }
    for (auto& column : out.local_extra) column.second.resize(out.local_completions.size());
    for (size_t m = 0; m < out.plugin_metric_rows.size(); ++m)
        out.plugin_metrics[out.plugin_metric_names[m]] = nanmean(out.plugin_metric_rows[m]);
    const size_t N = out.completion_lengths.size(), K = out.rewards.size();
    std::vector<float> row_major(N * K);
    for (size_t i = 0; i < N; ++i)
        for (size_t k = 0; k < K; ++k) row_major[i * K + k] = out.rewards[k][i];
    out.statistics = compute_advantages(row_major, int(K), out.weights, options);
    out.advantages = out.statistics.advantages;
    out.first_local_row = 0;
    out.local_rows = int64_t(N);
    return out;
}
}  // namespace

std::pair<ScoredRollout, std::map<std::string, double>> fill_with_informative_groups(
    const std::function<ScoredRollout(int64_t)>& generate_round, int64_t groups, int64_t max_rounds,
    const AdvantageOptions& options, int64_t pad_token_id) {
    const int64_t G = options.num_generations;
    std::vector<ScoredRollout> parts;
    std::vector<Pick> kept, agreeing;
    double first_round_zero_std = 0;
    while (int64_t(kept.size()) < groups && int64_t(parts.size()) < max_rounds) {
        parts.push_back(generate_round(int64_t(parts.size())));
        const ScoredBatch& s = parts.back().scored;
        if (parts.size() == 1) first_round_zero_std = s.statistics.frac_reward_zero_std;
        for (int64_t g = 0; g < int64_t(s.completion_lengths.size()) / G; ++g)
            (group_disagrees(s, g, G) ? kept : agreeing).push_back({parts.size() - 1, g});
    }
    const int64_t short_by = std::max<int64_t>(0, groups - int64_t(kept.size()));
    const int64_t filtered = int64_t(agreeing.size()) - short_by;  // dropped for good
    kept.resize(std::min<size_t>(kept.size(), size_t(groups)));
    kept.insert(kept.end(), agreeing.end() - short_by, agreeing.end());  // the newest agreeing groups fill a shortfall
    ScoredRollout out{select_rollout(parts, kept, G, pad_token_id), select_scores(parts, kept, G, options)};
    std::map<std::string, double> metrics{{"dynamic_sampling/rounds", double(parts.size())},
                                          {"dynamic_sampling/filtered_groups", double(filtered)},
                                          {"dynamic_sampling/groups_filled_agreeing", double(short_by)},
                                          {"dynamic_sampling/first_round_frac_reward_zero_std", first_round_zero_std}};
    return {std::move(out), std::move(metrics)};
}

}  // namespace grove
