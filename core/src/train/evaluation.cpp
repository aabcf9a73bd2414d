#include "grove/evaluation.hpp"

#include <ATen/ATen.h>

#include <cmath>

#include "grove/advantages.hpp"
#include "grove/dataset.hpp"
#include "grove/error.hpp"
#include "grove/model.hpp"
#include "grove/plugin_host.hpp"
#include "grove/tokenizer.hpp"
#include "grove/trainer.hpp"

namespace grove {

EvaluationRequest evaluation_request(const Manifest& m) {
    EvaluationRequest r;
    r.model_dir = m.string("model.path");
    auto eval_source = m.optional_string("data.eval_source");
    auto source = eval_source ? eval_source : m.optional_string("data.source");
    if (!source) throw Error(ErrorKind::manifest, m.path() + ": grove eval needs data.eval_source or data.source");
    r.data_source = *source;
    r.prompt_column = m.string("data.prompt_column");
    r.chat_template = m.string("model.chat_template");
    r.rewards = m.rewards();
    r.plugin_dirs = m.strings("plugin_dirs");
    r.sampling = sampling_options(m);
    r.device = m.string("model.device");
    r.dtype = m.string("model.dtype");
    return r;
}

EvaluationResult evaluate(const EvaluationRequest& q) {
    auto model = load_model_or_lora_checkpoint(q.model_dir, q.device, q.dtype);
    auto tokenizer = Tokenizer::load(q.model_dir);
    ChatTemplate family = chat_template_from_name(q.chat_template, tokenizer->config());
    PluginHost host(plugin_search_path(q.plugin_dirs));
    std::vector<PluginInstance> rewards;
    for (const auto& use : q.rewards) {
        auto info = host.find(use.plugin, GROVE_PLUGIN_KIND_REWARD);
        rewards.emplace_back(info, PluginConfig(info, use.config.get(), use.origin + " config"));
    }
    auto rows = load_prompts(q.data_source, q.prompt_column);
    if (q.limit > 0 && size_t(q.limit) < rows.size()) rows.resize(size_t(q.limit));
    SamplingOptions o = q.sampling;
    set_stop_tokens(o, *model, tokenizer->config());

    EvaluationResult result;
    std::map<std::string, std::vector<double>> columns;
    std::vector<double> weighted;
    int64_t prompts_per_batch = std::max<int64_t>(1, q.batch / std::max<int64_t>(1, q.samples));
    for (size_t start = 0; start < rows.size(); start += size_t(prompts_per_batch)) {
        size_t end = std::min(rows.size(), start + size_t(prompts_per_batch));
        std::vector<std::vector<int64_t>> prompts;
        std::vector<std::string> texts, json_rows;
        for (size_t i = start; i < end; ++i) {
            std::string text = prompt_text(rows[i], family, tokenizer->config());
            for (int64_t k = 0; k < q.samples; ++k) {
                prompts.push_back(tokenizer->encode(text, false));
                texts.push_back(text);
                json_rows.push_back(rows[i].columns_json);
            }
        }
        o.seed = q.sampling.seed + start;
        GenerationResult g = generate(*model, prompts, o);
        RewardRows batch;
        batch.num_generations = uint32_t(q.samples);
        batch.seed = o.seed;
        for (size_t i = 0; i < prompts.size(); ++i) {
            int64_t length = g.lengths[i];
            std::vector<int64_t> ids(g.completion_ids[int64_t(i)].data_ptr<int64_t>(),
                                     g.completion_ids[int64_t(i)].data_ptr<int64_t>() + length);
            EvaluationRow row;
            row.prompt = texts[i];
            row.completion = tokenizer->decode(ids, true);
            row.length = length;
            row.truncated = g.truncated[int64_t(i)].item<bool>();
            batch.add(row.prompt, row.completion, std::vector<int32_t>(ids.begin(), ids.end()), row.truncated, json_rows[i]);
            result.rows.push_back(std::move(row));
        }
        size_t first = result.rows.size() - prompts.size();
        std::vector<double> sums(prompts.size(), 0.0);
        std::vector<bool> scored(prompts.size(), false);
        for (size_t k = 0; k < rewards.size(); ++k) {
            std::vector<float> scores, metrics;
            rewards[k].score(batch.view(), scores, metrics);
            for (size_t i = 0; i < prompts.size(); ++i) {
                result.rows[first + i].rewards[q.rewards[k].name] = scores[i];
                columns[q.rewards[k].name].push_back(scores[i]);
                if (!std::isnan(scores[i])) {
                    sums[i] += q.rewards[k].weight * scores[i];
                    scored[i] = true;
                }
            }
        }
        for (size_t i = 0; i < prompts.size(); ++i) weighted.push_back(scored[i] ? sums[i] : std::nan(""));
    }
    for (size_t k = 0; k < q.rewards.size(); ++k) {
        const std::string& name = q.rewards[k].name;
        double mean = nanmean(columns[name]);
        result.reward_mean[name] = mean;
        const std::string& plugin = rewards[k].info().name;
        if (plugin == "correctness" && result.accuracy < 0) result.accuracy = mean;
        if (plugin == "format" && result.format_rate < 0) result.format_rate = mean;
    }
    result.reward = nanmean(weighted);
    double length = 0, truncated = 0;
    for (const auto& row : result.rows) {
        length += double(row.length);
        truncated += row.truncated;
    }
    result.mean_length = result.rows.empty() ? 0.0 : length / double(result.rows.size());
    result.truncated_ratio = result.rows.empty() ? 0.0 : truncated / double(result.rows.size());
    return result;
}

}  // namespace grove
