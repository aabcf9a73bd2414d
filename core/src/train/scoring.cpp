#include "train/scoring.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "grove/dataset.hpp"
#include "grove/distributed.hpp"
#include "grove/environment_host.hpp"
#include "grove/episodes.hpp"
#include "grove/error.hpp"
#include "grove/tokenizer.hpp"

namespace grove {

std::vector<float> ScoredBatch::local_advantages() const {
    return std::vector<float>(advantages.begin() + first_local_row, advantages.begin() + first_local_row + local_rows);
}

void apply_given_rewards(RewardScores& scores, const std::vector<BatchRow>& rows) {
    for (size_t k = 0; k < scores.names.size(); ++k)
        for (size_t i = 0; i < rows.size(); ++i) {
            if (!rows[i].replay) continue;
            auto given = rows[i].replay->rewards.find(scores.names[k]);
            if (given != rows[i].replay->rewards.end()) scores.values[k][i] = float(given->second);
        }
}

std::vector<bool> rewards_given_by_every_row(const std::vector<std::string>& names, const std::vector<BatchRow>& rows) {
    std::vector<bool> given(names.size(), !rows.empty());
    for (size_t k = 0; k < names.size(); ++k)
        for (const BatchRow& row : rows)
            if (!row.replay || !row.replay->rewards.count(names[k])) given[k] = false;
    return given;
}

namespace {
// Columns of per-row values, this rank's rows -> every rank's rows in rank order (one collective).
std::vector<std::vector<double>> gather_columns(const std::vector<std::vector<double>>& local, int64_t rows,
                                                ProcessGroup* group) {
    if (!group) return local;
    at::Tensor table = at::empty({rows, int64_t(local.size())}, at::kDouble);
    auto cell = table.accessor<double, 2>();
    for (size_t c = 0; c < local.size(); ++c)
        for (int64_t i = 0; i < rows; ++i) cell[i][int64_t(c)] = local[c][size_t(i)];
    at::Tensor all = group->all_gather_rows(table).contiguous();
    std::vector<std::vector<double>> out(local.size(), std::vector<double>(size_t(all.size(0))));
    auto all_cell = all.accessor<double, 2>();
    for (size_t c = 0; c < local.size(); ++c)
        for (int64_t i = 0; i < all.size(0); ++i) out[c][size_t(i)] = all_cell[i][int64_t(c)];
    return out;
}
// The gather needs the same metric columns on every process; a reward that logs a metric by name on
// some processes only would misalign them.
void require_same_metric_names(const std::vector<std::string>& names, ProcessGroup& group) {
    std::string joined;
    for (const std::string& name : names) joined += name + '\n';
    const double fingerprint = double(std::hash<std::string>{}(joined) >> 12);  // exact in a double
    if (group.max(fingerprint) != fingerprint || group.max(-fingerprint) != -fingerprint)
        throw Error(ErrorKind::plugin,
                    "the processes' reward metrics differ in this batch (a reward logs a metric by name on some processes "
                    "only); log the same names on every process");
}

template <typename T>
std::vector<double> as_doubles(const std::vector<T>& v) {
    return std::vector<double>(v.begin(), v.end());
}
}  // namespace

ScoredBatch score_rollout(const Rollout& rollout, const RewardSet& rewards, const Tokenizer& tokenizer,
                          const AdvantageOptions& advantage_options, const ScoringContext& context) {
    const GenerationResult& c = rollout.completions;
    const int64_t N = int64_t(rollout.rows.size());
    ScoredBatch out;
    RewardRows batch;
    batch.num_generations = uint32_t(advantage_options.num_generations);
    batch.step = context.step;
    batch.seed = rollout.seed;
    batch.rank = uint32_t(context.rank);
    batch.world_size = uint32_t(context.world_size);
    batch.global_row_offset = uint64_t(rollout.first_row);
    batch.max_steps = context.max_steps;
    // episodes: which tokens the model wrote (rewards see the whole episode, observations included)
    const at::Tensor model_mask =
        rollout.model_token_mask.defined() ? rollout.model_token_mask.to(at::kByte).contiguous() : at::Tensor();
    for (int64_t i = 0; i < N; ++i) {
        const int64_t length = c.lengths[size_t(i)];
        const int64_t* ids = c.completion_ids[i].data_ptr<int64_t>();
        std::vector<int64_t> completion(ids, ids + length);
        std::vector<uint8_t> model_tokens;
        if (model_mask.defined())
            model_tokens.assign(model_mask[i].data_ptr<uint8_t>(), model_mask[i].data_ptr<uint8_t>() + length);
        batch.add(rollout.rows[size_t(i)].prompt_text, tokenizer.decode(completion, true),
                  std::vector<int32_t>(completion.begin(), completion.end()), c.truncated[i].item<bool>(),
                  rollout.rows[size_t(i)].columns_json, model_tokens);
        if (model_mask.defined())
            batch.add_episode_turns(
                reward_turn_texts(completion, std::vector<int64_t>(model_tokens.begin(), model_tokens.end()), tokenizer));
        batch.prompt_json.push_back(prompt_json(rollout.rows[size_t(i)].prompt_text, rollout.rows[size_t(i)].prompt_messages));
    }
    PromptMessages messages;
    for (const BatchRow& row : rollout.rows) messages.push_back(row.prompt_messages);
    RewardScores scores = rewards.score(batch.view(), rewards_given_by_every_row(rewards.names(), rollout.rows), &messages);
    std::vector<double> weights = rewards.weights();
    if (context.environment_reward) {
        std::vector<float> environment_scores;
        std::vector<std::string> columns_json;
        for (size_t i = 0; i < rollout.episodes.size(); ++i) {
            environment_scores.push_back(rollout.episodes[i].environment_reward);
            columns_json.push_back(rollout.rows[i].columns_json);
        }
        const std::vector<PluginUse>& columns = context.environment_reward->reward_columns();
        auto by_column = context.environment_reward->scores_by_column(environment_scores, columns_json);
        for (size_t c = 0; c < columns.size(); ++c) {
            scores.names.push_back(columns[c].name);
            scores.values.push_back(std::move(by_column[c]));
            weights.push_back(columns[c].weight);
        }
    }
    apply_given_rewards(scores, rollout.rows);

    // every rank's rows: rewards, the plugins' metrics, lengths, flags
    if (context.group) require_same_metric_names(scores.metric_names, *context.group);
    std::vector<std::vector<double>> local;
    for (const auto& values : scores.values) local.push_back(as_doubles(values));
    for (const auto& values : scores.metrics) local.push_back(as_doubles(values));
    local.push_back(as_doubles(model_token_counts(rollout)));  // as TRL: an environment's tokens are not counted
    local.push_back(as_doubles(batch.truncated));
    std::vector<double> prompt_lengths;
    for (const BatchRow& row : rollout.rows) prompt_lengths.push_back(double(row.prompt_ids.size()));
    local.push_back(prompt_lengths);
    std::vector<std::vector<double>> all = gather_columns(local, N, context.group);

    const size_t K = scores.values.size(), M = scores.metrics.size();
    out.reward_names = scores.names;
    for (size_t k = 0; k < K; ++k) out.rewards.emplace_back(all[k].begin(), all[k].end());
    out.weights = weights;
    out.plugin_metric_names = scores.metric_names;
    for (size_t m = 0; m < M; ++m) {
        out.plugin_metrics[scores.metric_names[m]] = nanmean(all[K + m]);
        out.plugin_metric_rows.push_back(all[K + m]);
    }
    for (double v : all[K + M]) out.completion_lengths.push_back(int64_t(v));
    for (double v : all[K + M + 1]) out.truncated.push_back(uint8_t(v != 0.0));
    for (double v : all[K + M + 2]) out.prompt_lengths.push_back(int64_t(v));
    RewardScores gathered;
    gathered.values = out.rewards;
    out.statistics = compute_advantages(gathered.row_major(), int(K), weights, advantage_options);
    out.advantages = out.statistics.advantages;
    out.local_completions = batch.completions;
    out.local_extra = std::move(scores.extra);
    out.first_local_row = rollout.first_row;
    out.local_rows = N;
    return out;
}

std::map<std::string, double> scored_batch_metrics(const ScoredBatch& b) {
    std::map<std::string, double> m = b.plugin_metrics;
    const size_t N = b.completion_lengths.size();
    double length_sum = 0, length_min = 1e18, length_max = 0, clipped = 0, terminated_sum = 0, terminated = 0;
    double terminated_min = 1e18, terminated_max = 0;
    for (size_t i = 0; i < N; ++i) {
        const double l = double(b.completion_lengths[i]);
        length_sum += l;
        length_min = std::min(length_min, l);
        length_max = std::max(length_max, l);
        if (b.truncated[i]) {
            ++clipped;
            continue;
        }
        terminated_sum += l;
        ++terminated;
        terminated_min = std::min(terminated_min, l);
        terminated_max = std::max(terminated_max, l);
    }
    m["completions/mean_length"] = length_sum / double(std::max<size_t>(1, N));
    m["completions/min_length"] = length_min;
    m["completions/max_length"] = length_max;
    m["completions/clipped_ratio"] = clipped / double(std::max<size_t>(1, N));
    m["completions/mean_terminated_length"] = terminated ? terminated_sum / terminated : 0.0;
    m["completions/min_terminated_length"] = terminated ? terminated_min : 0.0;
    m["completions/max_terminated_length"] = terminated ? terminated_max : 0.0;
    m["reward"] = b.statistics.reward;
    m["reward_std"] = b.statistics.reward_std;
    m["frac_reward_zero_std"] = b.statistics.frac_reward_zero_std;
    for (size_t k = 0; k < b.reward_names.size(); ++k) {
        m["rewards/" + b.reward_names[k] + "/mean"] = b.statistics.reward_mean[k];
        m["rewards/" + b.reward_names[k] + "/std"] = b.statistics.reward_std_per_function[k];
    }
    return m;
}

}  // namespace grove
