#include "grove/evaluation.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "grove/advantages.hpp"
#include "grove/dataset.hpp"
#include "grove/distributed.hpp"
#include "grove/environment_host.hpp"
#include "grove/episodes.hpp"
#include "grove/error.hpp"
#include "grove/model.hpp"
#include "grove/plugin_host.hpp"
#include "grove/tokenizer.hpp"
#include "grove/adapter_checkpoint.hpp"
#include "grove/reward_model.hpp"
#include "grove/reward_set.hpp"
#include "grove/run_config.hpp"

namespace grove {

EvaluationRequest evaluation_request(const Manifest& manifest) { return evaluation_request(RunConfig::from(manifest)); }

EvaluationRequest evaluation_request(const RunConfig& c) {
    EvaluationRequest r;
    r.model_dir = c.model.path;
    auto source = c.data.eval_source ? c.data.eval_source : c.data.source;
    if (!source) throw Error(ErrorKind::manifest, c.manifest_path + ": grove eval needs data.eval_source or data.source");
    r.data_source = *source;
    r.prompt_column = c.data.prompt_column;
    r.chat_template = c.model.chat_template;
    r.enable_thinking = c.model.enable_thinking;
    r.cast_lm_head_to_fp32 = c.model.cast_lm_head_to_fp32;
    r.rewards = c.rewards;
    r.plugin_dirs = c.plugin_dirs;
    r.sampling = sampling_options(c);
    r.device = c.model.device;
    r.dtype = c.model.dtype;
    r.environment = c.environment.use;
    r.environment_reward = c.environment.reward;
    r.max_turns = c.environment.max_turns;
    r.advantages.scale_rewards = c.loss.scale_rewards;
    r.advantages.aggregation = c.loss.aggregation;
    return r;
}

EvaluationResult evaluate(const EvaluationRequest& q) {
    if (q.rewards.empty() && !q.environment)
        throw Error(ErrorKind::usage,
                    "grove eval: no reward to report: the manifest has no [[rewards]], and without its "
                    "environment (--no-environment) nothing judges the completions; add a [[rewards]] "
                    "table, or leave the environment in");
    auto model = load_model_or_adapter_checkpoint(q.model_dir, q.device, q.dtype, q.plugin_dirs);
    if (q.cast_lm_head_to_fp32) model->keep_lm_head_in_float32();
    auto tokenizer = Tokenizer::load(q.model_dir);
    PluginHost host(plugin_search_path(q.plugin_dirs));
    // the environment first: a Python reward taking TRL's `environments` looks for it when created
    std::unique_ptr<Environment> environment;
    if (q.environment) environment = make_environment(host, *q.environment, q.environment_reward, q.rewards, q.rewards.empty());
    const RewardSet rewards(host, q.rewards, reward_model_factory(model->device().str()));
    return evaluate(LoadedEvaluator{*model, *tokenizer, rewards, environment.get()}, q);
}

namespace {
// The reward columns: the plugins', then the environment's own score of each episode when asked.
std::vector<PluginUse> reward_columns(const LoadedEvaluator& loaded, const EvaluationRequest& q) {
    std::vector<PluginUse> uses = q.rewards;
    if (loaded.environment)
        for (const PluginUse& column : loaded.environment->reward_columns()) uses.push_back(column);
    return uses;
}
}  // namespace

EvaluationResult evaluate(const LoadedEvaluator& loaded, const EvaluationRequest& q, ProcessGroup* group) {
    Model& model = loaded.model;
    const Tokenizer& tokenizer = loaded.tokenizer;
    const RewardSet& rewards = loaded.rewards;
    Environment* environment = loaded.environment;
    ChatTemplate family = chat_template_from_name(q.chat_template, tokenizer.config(), q.enable_thinking);
    const std::vector<PluginUse> uses = reward_columns(loaded, q);
    const bool scores_environment = environment && environment->reward_column();
    std::vector<float> environment_scores;
    auto rows = load_prompts(q.data_source, q.prompt_column, Environment::rows_without_prompt(environment));
    if (q.limit > 0 && size_t(q.limit) < rows.size()) rows.resize(size_t(q.limit));
    SamplingOptions o = q.sampling;
    set_stop_tokens(o, model, tokenizer.config());

    EvaluationResult result;
    std::map<std::string, std::vector<double>> columns;
    std::vector<double> weighted;
    int64_t prompts_per_batch = std::max<int64_t>(1, q.batch / std::max<int64_t>(1, q.samples));
    int64_t batch_index = -1;
    for (size_t start = 0; start < rows.size(); start += size_t(prompts_per_batch)) {
        if (++batch_index % (group ? group->world_size() : 1) != (group ? group->rank() : 0)) continue;
        size_t end = std::min(rows.size(), start + size_t(prompts_per_batch));
        std::vector<std::vector<int64_t>> prompts;
        std::vector<std::string> texts, json_rows;
        PromptMessages messages;  // conversational prompts, for reward models
        for (size_t i = start; i < end; ++i) {
            std::string text = prompt_text(rows[i], family, tokenizer.config(),
                                           environment ? environment->tools_for(rows[i].columns_json, rows[i].origin) : "");
            for (int64_t k = 0; k < q.samples; ++k) {
                prompts.push_back(tokenizer.encode(text, rows[i].messages.empty()));  // as training tokenizes it
                texts.push_back(text);
                json_rows.push_back(rows[i].columns_json);
                messages.push_back(rows[i].messages);
            }
        }
        o.seed = q.sampling.seed + start;
        RewardRows batch;
        batch.num_generations = uint32_t(q.samples);
        batch.step = q.step;
        batch.seed = o.seed;
        // episode numbers run on across batches (and ranks), so an environment keying state on them never
        // mixes two; the rewards' rows carry the same numbers (TRL's `environments` finds its instances by them)
        const int64_t first_row = int64_t(start) * q.samples;
        batch.global_row_offset = uint64_t(first_row);
        auto add_row = [&](EvaluationRow row, const std::vector<int64_t>& ids, size_t i,
                           const std::vector<int64_t>& model_tokens = {}) {
            row.prompt = texts[i];
            row.completion = tokenizer.decode(ids, true);
            batch.add(row.prompt, row.completion, std::vector<int32_t>(ids.begin(), ids.end()), row.truncated, json_rows[i],
                      std::vector<uint8_t>(model_tokens.begin(), model_tokens.end()));
            if (environment) batch.add_episode_turns(reward_turn_texts(ids, model_tokens, tokenizer));
            batch.prompt_json.push_back(prompt_json(texts[i], messages[i]));
            result.rows.push_back(std::move(row));
        };
        if (environment) {
            std::vector<EpisodeStart> starts;
            for (size_t i = 0; i < prompts.size(); ++i)
                starts.push_back(
                    {prompts[i], texts[i], json_rows[i], messages[i], rows[start + i / size_t(q.samples)].prompt_given});
            auto episodes = run_episodes(model, tokenizer, *environment, starts, o,
                                         {q.max_turns, o.max_new_tokens, q.step, family}, first_row);
            for (size_t i = 0; i < starts.size(); ++i) {  // the prompts the model saw (begin_episodes may add to them)
                texts[i] = starts[i].prompt_text;
                messages[i] = starts[i].messages;
            }
            if (scores_environment) {
                score_whole_episodes(*environment, tokenizer, starts, episodes, q.step, o.seed, first_row);
                environment_scores.clear();
                for (const Episode& e : episodes) environment_scores.push_back(e.stats.environment_reward);
            }
            for (size_t i = 0; i < episodes.size(); ++i) {
                const Episode& e = episodes[i];
                EvaluationRow row;
                row.turns = episode_turns(e, tokenizer);
                for (uint8_t m : e.model_tokens) row.length += m;
                // as the trainer flags an episode for the rewards (padded_completions): it does not end with EOS
                row.truncated = e.ids.empty() || std::find(o.eos_token_ids.begin(), o.eos_token_ids.end(), e.ids.back()) ==
                                                     o.eos_token_ids.end();
                row.tool_calls = e.stats.tool_calls;
                row.tool_failures = e.stats.tool_failures;
                add_row(std::move(row), e.ids, i, e.model_tokens);
            }
        } else {
            GenerationResult g = generate(model, prompts, o);
            for (size_t i = 0; i < prompts.size(); ++i) {
                const int64_t length = g.lengths[i];
                const int64_t* ids = g.completion_ids[int64_t(i)].data_ptr<int64_t>();
                EvaluationRow row;
                row.length = length;
                row.truncated = g.truncated[int64_t(i)].item<bool>();
                add_row(std::move(row), std::vector<int64_t>(ids, ids + length), i);
            }
        }
        size_t first = result.rows.size() - prompts.size();
        std::vector<double> sums(prompts.size(), 0.0);
        std::vector<bool> scored(prompts.size(), false);
        RewardScores scores_of_batch = rewards.score(batch.view(), {}, &messages);
        if (scores_environment)
            for (auto& column : environment->scores_by_column(environment_scores, json_rows))
                scores_of_batch.values.push_back(std::move(column));
        for (size_t k = 0; k < uses.size(); ++k) {
            const std::vector<float>& scores = scores_of_batch.values[k];
            for (size_t i = 0; i < prompts.size(); ++i) {
                result.rows[first + i].rewards[uses[k].name] = scores[i];
                columns[uses[k].name].push_back(scores[i]);
                if (!std::isnan(scores[i])) {
                    sums[i] += uses[k].weight * scores[i];
                    scored[i] = true;
                }
            }
        }
        for (size_t i = 0; i < prompts.size(); ++i) weighted.push_back(scored[i] ? sums[i] : std::nan(""));
    }
    for (const PluginUse& use : uses) {
        result.reward_names.push_back(use.name);
        result.reward_mean[use.name] = nanmean(columns[use.name]);
    }
    // what a reward counts as is declared (by the plugin, or the manifest's role), never guessed from its name
    if (auto k = rewards.find_role(RewardRole::accuracy)) result.accuracy = result.reward_mean[q.rewards[*k].name];
    if (auto k = rewards.find_role(RewardRole::format_rate)) result.format_rate = result.reward_mean[q.rewards[*k].name];
    result.reward = nanmean(weighted);
    double length = 0, truncated = 0, calls = 0;
    for (const auto& row : result.rows) {
        length += double(row.length);
        truncated += row.truncated;
        calls += double(row.tool_calls);
    }
    if (environment) result.tool_call_frequency = result.rows.empty() ? 0.0 : calls / double(result.rows.size());
    result.mean_length = result.rows.empty() ? 0.0 : length / double(result.rows.size());
    result.truncated_ratio = result.rows.empty() ? 0.0 : truncated / double(result.rows.size());
    return result;
}

std::map<std::string, double> evaluation_metrics(const EvaluationResult& result, const LoadedEvaluator& loaded,
                                                 const EvaluationRequest& q, ProcessGroup* group) {
    const std::vector<PluginUse> uses = reward_columns(loaded, q);
    // every rank's rows as one table: its rewards, then length, truncated, tool calls and 1 (a row;
    // ranks with fewer rows pad with zeros, dropped below)
    const int64_t K = int64_t(uses.size()), columns = K + 4, rows = int64_t(result.rows.size());
    const int64_t padded = group ? int64_t(group->max(double(rows))) : rows;
    at::Tensor table = at::zeros({padded, columns}, at::kDouble);
    auto cell = table.accessor<double, 2>();
    for (int64_t i = 0; i < rows; ++i) {
        const EvaluationRow& row = result.rows[size_t(i)];
        for (int64_t k = 0; k < K; ++k) cell[i][k] = row.rewards.at(uses[size_t(k)].name);
        cell[i][K] = double(row.length);
        cell[i][K + 1] = row.truncated ? 1.0 : 0.0;
        cell[i][K + 2] = double(row.tool_calls);
        cell[i][K + 3] = 1.0;
    }
    if (group) table = group->all_gather_rows(table);
    table = table.index({table.select(1, K + 3) == 1.0});  // a rank's rows are whole groups, kept in order
    const int64_t n = table.size(0);
    std::map<std::string, double> m;
    if (n == 0) return m;
    const at::Tensor rewards = table.narrow(1, 0, K).to(at::kFloat).contiguous();
    std::vector<double> weights;
    for (const PluginUse& use : uses) weights.push_back(use.weight);
    AdvantageOptions grouping = q.advantages;
    grouping.num_generations = int(q.samples);
    const AdvantageResult a = compute_advantages(
        std::vector<float>(rewards.data_ptr<float>(), rewards.data_ptr<float>() + n * K), int(K), weights, grouping);
    m["eval_reward"] = a.reward;
    m["eval_reward_std"] = a.reward_std;
    m["eval_frac_reward_zero_std"] = a.frac_reward_zero_std;
    for (int64_t k = 0; k < K; ++k) {
        m["eval_rewards/" + uses[size_t(k)].name + "/mean"] = a.reward_mean[size_t(k)];
        m["eval_rewards/" + uses[size_t(k)].name + "/std"] = a.reward_std_per_function[size_t(k)];
    }
    const at::Tensor lengths = table.select(1, K);
    m["eval_completions/mean_length"] = lengths.mean().item<double>();
    m["eval_completions/min_length"] = lengths.min().item<double>();
    m["eval_completions/max_length"] = lengths.max().item<double>();
    m["eval_completions/clipped_ratio"] = table.select(1, K + 1).mean().item<double>();
    if (auto k = loaded.rewards.find_role(RewardRole::accuracy)) m["eval_accuracy"] = a.reward_mean[*k];
    if (auto k = loaded.rewards.find_role(RewardRole::format_rate)) m["eval_format_rate"] = a.reward_mean[*k];
    if (loaded.environment) m["eval_tools/call_frequency"] = table.select(1, K + 2).mean().item<double>();
    return m;
}

std::vector<std::string> evaluation_metric_names(const LoadedEvaluator& loaded, const EvaluationRequest& request) {
    // one group of placeholder rows, every column scored, gives every key evaluation_metrics writes
    EvaluationRow row;
    for (const PluginUse& column : reward_columns(loaded, request)) row.rewards[column.name] = 0.0f;
    EvaluationResult placeholder;
    placeholder.rows.assign(size_t(std::max<int64_t>(1, request.samples)), row);
    std::vector<std::string> names;
    for (const auto& [name, value] : evaluation_metrics(placeholder, loaded, request)) names.push_back(name);
    return names;
}

}  // namespace grove
