#include "train/episodes.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "grove/distributed.hpp"
#include "grove/environment_host.hpp"
#include "grove/model.hpp"
#include "grove/tokenizer.hpp"

namespace grove {

size_t cut_at_stop_string(const Tokenizer& tokenizer, const std::vector<int64_t>& ids, const std::vector<std::string>& stops) {
    auto contains_stop = [&](size_t length) {
        const std::string text = tokenizer.decode(std::vector<int64_t>(ids.begin(), ids.begin() + long(length)), false);
        return std::any_of(stops.begin(), stops.end(), [&](const std::string& s) { return text.find(s) != std::string::npos; });
    };
    if (stops.empty() || !contains_stop(ids.size())) return ids.size();
    // a prefix's text is a prefix of the longer one's, so "contains a stop string" only turns on
    size_t low = 1, high = ids.size();
    while (low < high) {
        const size_t middle = (low + high) / 2;
        if (contains_stop(middle))
            high = middle;
        else
            low = middle + 1;
    }
    return low;
}

std::map<std::string, double> episode_metrics(const Rollout& rollout, ProcessGroup* group) {
    double episodes = double(rollout.episodes.size()), calls = 0, failures = 0, turns = 0, observation = 0, hit = 0,
           seconds = 0;
    for (const EpisodeStats& e : rollout.episodes) {
        calls += double(e.tool_calls);
        failures += double(e.tool_failures);
        turns += double(e.turns);
        observation += double(e.observation_tokens);
        hit += e.hit_max_turns ? 1.0 : 0.0;
        seconds += e.environment_seconds;
    }
    if (group) {
        for (double* v : {&episodes, &calls, &failures, &turns, &observation, &hit}) *v = group->sum(*v);
        seconds = group->max(seconds);
    }
    const double n = std::max(1.0, episodes);
    return {{"tools/call_frequency", calls / n},   {"tools/failure_frequency", calls > 0 ? failures / calls : 0.0},
            {"episodes/turns_mean", turns / n},    {"episodes/observation_tokens_mean", observation / n},
            {"episodes/max_turns_ratio", hit / n}, {"step_time/environment", seconds}};
}

namespace {

// An episode while it runs.
struct Running {
    Episode episode;
    bool running = true;
};

// The model's turn k of generation result g, cut at a stop string and at the episode's budget.
void append_turn(Episode& e, const GenerationResult& g, int64_t k, const Tokenizer& tokenizer,
                 const std::vector<std::string>& stops, int64_t budget) {
    const int64_t length = std::min<int64_t>(g.lengths[size_t(k)], budget - int64_t(e.ids.size()));
    at::Tensor ids = g.completion_ids[k].narrow(0, 0, length).contiguous();
    std::vector<int64_t> turn(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + length);
    turn.resize(cut_at_stop_string(tokenizer, turn, stops));
    at::Tensor lp = g.sampled_logprobs[k].narrow(0, 0, int64_t(turn.size())).contiguous();
    e.ids.insert(e.ids.end(), turn.begin(), turn.end());
    e.model_tokens.insert(e.model_tokens.end(), turn.size(), 1);
    e.logprobs.insert(e.logprobs.end(), lp.data_ptr<float>(), lp.data_ptr<float>() + turn.size());
    ++e.stats.turns;
}

// An observation's tokens, cut to the budget; true when that ends the episode (as TRL cuts its tool
// output).
bool append_observation(Episode& e, const std::vector<int64_t>& observation, int64_t budget) {
    const int64_t room = budget - int64_t(e.ids.size());
    const int64_t n = std::min<int64_t>(room, int64_t(observation.size()));
    e.ids.insert(e.ids.end(), observation.begin(), observation.begin() + n);
    e.model_tokens.insert(e.model_tokens.end(), size_t(n), 0);
    e.logprobs.insert(e.logprobs.end(), size_t(n), 0.0f);
    e.stats.observation_tokens += n;
    return n < int64_t(observation.size()) || n == room;  // the budget is spent: the episode ends
}

Rollout to_rollout(const std::vector<Episode>& episodes, std::vector<BatchRow> rows, const SamplingOptions& options,
                   int64_t first_row) {
    std::vector<std::vector<int64_t>> ids, model_tokens;
    std::vector<std::vector<float>> logprobs;
    Rollout r;
    for (const Episode& e : episodes) {
        ids.push_back(e.ids);
        model_tokens.push_back(e.model_tokens);
        logprobs.push_back(e.logprobs);
        r.episodes.push_back(e.stats);
    }
    r.completions = padded_completions(ids, logprobs, options);
    r.model_token_mask = padded_model_tokens(model_tokens, r.completions);
    r.rows = std::move(rows);
    r.first_row = first_row;
    r.seed = options.seed;
    return r;
}

}  // namespace

std::vector<Episode> run_episodes(const Model& model, const Tokenizer& tokenizer, const Environment& environment,
                                  const std::vector<EpisodeStart>& starts, const SamplingOptions& options,
                                  const EpisodeLimits& limits, int64_t first_row) {
    const std::set<int64_t> eos(options.eos_token_ids.begin(), options.eos_token_ids.end());
    const int64_t budget = limits.max_completion_length;
    std::vector<Running> episodes(starts.size());
    for (int64_t turn = 0; turn < limits.max_turns; ++turn) {
        std::vector<size_t> writing;  // the episodes that write this turn
        std::vector<std::vector<int64_t>> histories;
        int64_t longest = 0;
        for (size_t i = 0; i < episodes.size(); ++i) {
            const Episode& e = episodes[i].episode;
            if (!episodes[i].running || int64_t(e.ids.size()) >= budget) continue;
            writing.push_back(i);
            histories.push_back(starts[i].prompt_ids);
            histories.back().insert(histories.back().end(), e.ids.begin(), e.ids.end());
            longest = std::max<int64_t>(longest, budget - int64_t(e.ids.size()));
        }
        if (writing.empty()) break;
        SamplingOptions turn_options = options;
        turn_options.max_new_tokens = longest;
        turn_options.seed = options.seed + 1000003ull * uint64_t(turn);  // each turn its own stream
        const GenerationResult g = generate(model, histories, turn_options);

        EnvironmentTurns waiting;
        waiting.step = limits.step;
        waiting.seed = options.seed;
        std::vector<size_t> waiting_episodes;
        for (size_t k = 0; k < writing.size(); ++k) {
            const size_t i = writing[k];
            Episode& e = episodes[i].episode;
            const size_t before = e.ids.size();
            append_turn(e, g, int64_t(k), tokenizer, environment.stop_strings(), budget);
            const std::vector<int64_t> ids(e.ids.begin() + long(before), e.ids.end());
            const bool ended_with_eos = !ids.empty() && eos.count(ids.back());
            const bool spent = int64_t(e.ids.size()) >= budget, last_turn = turn + 1 == limits.max_turns;
            if (spent || last_turn) {
                e.stats.hit_max_turns = last_turn && !spent && !ended_with_eos;  // it still wanted the environment
                episodes[i].running = false;
                continue;
            }
            waiting.add(uint64_t(first_row) + i, uint32_t(e.stats.turns), tokenizer.decode(ids, false), ids, ended_with_eos,
                        starts[i].prompt_text, starts[i].columns_json);
            waiting_episodes.push_back(i);
        }
        const auto start = std::chrono::steady_clock::now();
        const EnvironmentAnswers answers = environment.step(waiting);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        for (size_t k = 0; k < waiting_episodes.size(); ++k) {
            Running& r = episodes[waiting_episodes[k]];
            r.episode.stats.tool_calls += answers.tool_calls[k];
            r.episode.stats.tool_failures += answers.tool_failures[k];
            r.episode.stats.environment_seconds += seconds / double(waiting_episodes.size());
            if (answers.done[k] || answers.observations[k].empty())
                r.running = false;
            else if (append_observation(r.episode, tokenizer.encode(answers.observations[k], false), budget))
                r.running = false;
        }
    }
    std::vector<Episode> out;
    for (Running& r : episodes) out.push_back(std::move(r.episode));
    return out;
}

Rollout generate_episodes(const Model& model, const Tokenizer& tokenizer, const Environment& environment,
                          std::vector<BatchRow> rows, const SamplingOptions& options, const EpisodeLimits& limits,
                          int64_t first_row) {
    std::vector<EpisodeStart> starts;
    for (const BatchRow& row : rows) starts.push_back({row.prompt_ids, row.prompt_text, row.columns_json});
    const auto episodes = run_episodes(model, tokenizer, environment, starts, options, limits, first_row);
    return to_rollout(episodes, std::move(rows), options, first_row);
}

}  // namespace grove
