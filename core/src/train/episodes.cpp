#include "train/episodes.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

#include "grove/dataset.hpp"
#include "grove/distributed.hpp"
#include "grove/error.hpp"
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
           dropped = 0, seconds = 0;
    for (const EpisodeStats& e : rollout.episodes) {
        calls += double(e.tool_calls);
        failures += double(e.tool_failures);
        turns += double(e.turns);
        observation += double(e.observation_tokens);
        hit += e.hit_max_turns ? 1.0 : 0.0;
        dropped += e.observation_dropped ? 1.0 : 0.0;
        seconds += e.environment_seconds;
    }
    if (group) {
        for (double* v : {&episodes, &calls, &failures, &turns, &observation, &hit, &dropped}) *v = group->sum(*v);
        seconds = group->max(seconds);
    }
    const double n = std::max(1.0, episodes);
    return {{"tools/call_frequency", calls / n},   {"tools/failure_frequency", calls > 0 ? failures / calls : 0.0},
            {"episodes/turns_mean", turns / n},    {"episodes/observation_tokens_mean", observation / n},
            {"episodes/max_turns_ratio", hit / n}, {"episodes/dropped_observation_ratio", dropped / n},
            {"step_time/environment", seconds}};
}

namespace {

// An episode while it runs.
struct Running {
    Episode episode;
    bool running = true;
};

// Whether a turn's text reached a stop string, checked after every sampled token on the turn's last
// few tokens only (a stop string of n bytes spans at most n tokens, plus one whose leading space a
// decoder may drop). The turn is then cut exactly by cut_at_stop_string.
DecodeSession::StopCheck stop_check(const Tokenizer& tokenizer, const std::vector<std::string>& stops) {
    if (stops.empty()) return nullptr;
    size_t longest = 0;
    for (const std::string& s : stops) longest = std::max(longest, s.size());
    const size_t window = longest + 1;
    return [&tokenizer, stops, window](size_t, const std::vector<int64_t>& turn) {
        const size_t from = turn.size() > window ? turn.size() - window : 0;
        const std::string tail = tokenizer.decode(std::vector<int64_t>(turn.begin() + long(from), turn.end()), false);
        return std::any_of(stops.begin(), stops.end(), [&](const std::string& s) { return tail.find(s) != std::string::npos; });
    };
}

// The model's turn, cut at a stop string (the sampler stopped at the budget already).
void append_turn(Episode& e, const DecodeSession::Turn& turn, const Tokenizer& tokenizer,
                 const std::vector<std::string>& stops) {
    const size_t n = cut_at_stop_string(tokenizer, turn.ids, stops);
    e.ids.insert(e.ids.end(), turn.ids.begin(), turn.ids.begin() + long(n));
    e.model_tokens.insert(e.model_tokens.end(), n, 1);
    e.logprobs.insert(e.logprobs.end(), turn.logprobs.begin(), turn.logprobs.begin() + long(n));
    ++e.stats.turns;
}

// An observation's tokens, as context. The caller has checked that they fit in the budget.
void append_observation(Episode& e, const std::vector<int64_t>& observation) {
    e.ids.insert(e.ids.end(), observation.begin(), observation.end());
    e.model_tokens.insert(e.model_tokens.end(), observation.size(), 0);
    e.logprobs.insert(e.logprobs.end(), observation.size(), 0.0f);
    e.stats.observation_tokens += int64_t(observation.size());
}

// The dataset's prompt as an environment gets it (grove_environment_batch.prompt_json): empty where
// the row had none, so that a TRL class's reset() gets no `prompt`, as TRL resets it; a plugin built
// before SDK 1.12, which was promised JSON, gets the empty user message the row stands for instead.
std::string environment_prompt_json(const Environment& environment, const EpisodeStart& start) {
    return start.prompt_given || environment.info().abi_minor < 12 ? prompt_json(start.prompt_text, start.messages) : "";
}

// The environment's text for each prompt (SDK begin_episodes), added as TRL adds reset()'s: to the
// end of the last message of a conversation, rendered again, or to the end of a text prompt.
void begin_episodes(const Environment& environment, const Tokenizer& tokenizer, std::vector<EpisodeStart>& starts,
                    uint64_t seed, const EpisodeLimits& limits, int64_t first_row) {
    if (!environment.begins_episodes()) return;
    EnvironmentTurns episodes;
    episodes.step = limits.step;
    episodes.seed = seed;
    for (size_t i = 0; i < starts.size(); ++i)
        episodes.add(uint64_t(first_row) + i, 0, "", {}, false, starts[i].prompt_text, starts[i].columns_json,
                     environment_prompt_json(environment, starts[i]));
    const std::vector<std::string> additions = environment.begin_episodes(episodes);
    for (size_t i = 0; i < starts.size(); ++i) {
        if (additions[i].empty()) continue;
        EpisodeStart& s = starts[i];
        if (s.messages.empty()) {
            s.prompt_text += additions[i];
        } else {
            s.messages.back().content += additions[i];
            s.prompt_text = render_chat(limits.chat_template, s.messages, true, tokenizer.config(),
                                        environment.tools_for(s.columns_json, "row " + std::to_string(first_row + int64_t(i))));
        }
        s.prompt_ids = tokenizer.encode(s.prompt_text, s.messages.empty());  // as the trainer tokenizes the prompt
    }
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
                                  std::vector<EpisodeStart>& starts, const SamplingOptions& options,
                                  const EpisodeLimits& limits, int64_t first_row) {
    const int64_t budget = limits.max_completion_length;
    if (budget < 1) throw Error(ErrorKind::usage, "episodes: max_completion_length must be >= 1");
    const int64_t context = model.config().max_position_embeddings;  // 0: the checkpoint names none
    if (starts.empty()) return {};
    begin_episodes(environment, tokenizer, starts, options.seed, limits, first_row);
    const std::vector<std::string>& stops = environment.stop_strings();
    std::vector<std::vector<int64_t>> prompts;
    for (const EpisodeStart& s : starts) prompts.push_back(s.prompt_ids);
    DecodeSession session(model, prompts, options, budget, /*resumable=*/limits.max_turns > 1);
    const DecodeSession::StopCheck stop = stop_check(tokenizer, stops);
    std::vector<Running> episodes(starts.size());
    for (int64_t turn = 0; turn < limits.max_turns; ++turn) {
        std::vector<int64_t> room(episodes.size(), 0);
        for (size_t i = 0; i < episodes.size(); ++i)
            if (episodes[i].running) room[i] = budget - int64_t(episodes[i].episode.ids.size());
        const std::vector<DecodeSession::Turn> turns = session.sample_turn(room, stop, turn + 1 == limits.max_turns);

        EnvironmentTurns waiting;
        waiting.step = limits.step;
        waiting.seed = options.seed;
        std::vector<size_t> waiting_episodes;
        std::vector<int64_t> kept;  // each waiting episode's turn length after the stop-string cut
        for (size_t i = 0; i < episodes.size(); ++i) {
            if (!episodes[i].running) continue;
            Episode& e = episodes[i].episode;
            const size_t before = e.ids.size();
            append_turn(e, turns[i], tokenizer, stops);
            const std::vector<int64_t> ids(e.ids.begin() + long(before), e.ids.end());
            const bool ended_with_eos = turns[i].eos && ids.size() == turns[i].ids.size();
            e.stats.ended_with_eos = ended_with_eos;
            const bool spent = int64_t(e.ids.size()) >= budget, last_turn = turn + 1 == limits.max_turns;
            if (spent || last_turn) {
                e.stats.hit_max_turns = last_turn && !spent && !ended_with_eos;  // it still wanted the environment
                episodes[i].running = false;
                continue;
            }
            waiting.add(uint64_t(first_row) + i, uint32_t(e.stats.turns), tokenizer.decode(ids, false), ids, ended_with_eos,
                        starts[i].prompt_text, starts[i].columns_json, environment_prompt_json(environment, starts[i]));
            waiting_episodes.push_back(i);
            kept.push_back(int64_t(ids.size()));
        }
        if (waiting_episodes.empty()) break;
        const auto start = std::chrono::steady_clock::now();
        const EnvironmentAnswers answers = environment.step(waiting);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::vector<DecodeSession::Continuation> going_on;
        for (size_t k = 0; k < waiting_episodes.size(); ++k) {
            const size_t i = waiting_episodes[k];
            Running& r = episodes[i];
            r.episode.stats.tool_calls += answers.tool_calls[k];
            r.episode.stats.tool_failures += answers.tool_failures[k];
            r.episode.stats.environment_seconds += seconds / double(waiting_episodes.size());
            const std::vector<int64_t> observation =
                answers.observations[k].empty()
                    ? std::vector<int64_t>()
                    : tokenizer.encode(continue_assistant_turn(conversation_family(limits.chat_template, starts[i].messages),
                                                               answers.observations[k]),
                                       false);
            if (answers.done[k] || observation.empty()) {  // nothing to go on from
                r.running = false;
                continue;
            }
            // An observation that does not fit in what is left of the budget, or that would bring the
            // sequence to the model's max_position_embeddings, is dropped whole and the episode ends, as
            // TRL 1.16 rolls back such a tool result: no episode holds part of an observation. One that
            // just fills the budget ends it too (no room is left).
            const int64_t room = budget - int64_t(r.episode.ids.size());
            const int64_t sequence = int64_t(starts[i].prompt_ids.size() + r.episode.ids.size() + observation.size());
            if (int64_t(observation.size()) > room || (context > 0 && sequence >= context)) {
                r.episode.stats.observation_dropped = true;
                r.running = false;
                continue;
            }
            const size_t before = r.episode.ids.size();
            append_observation(r.episode, observation);
            if (int64_t(observation.size()) == room) {
                r.running = false;
                continue;
            }
            going_on.push_back({i, kept[k], std::vector<int64_t>(r.episode.ids.begin() + long(before), r.episode.ids.end())});
        }
        if (going_on.empty()) break;
        session.continue_rows(going_on);
    }
    std::vector<Episode> out;
    for (Running& r : episodes) out.push_back(std::move(r.episode));
    return out;
}

std::vector<EpisodeTurn> episode_turns(const std::vector<int64_t>& ids, const std::vector<int64_t>& model_tokens,
                                       const Tokenizer& tokenizer) {
    std::vector<EpisodeTurn> turns;
    for (size_t start = 0; start < ids.size();) {
        size_t end = start;
        while (end < ids.size() && model_tokens[end] == model_tokens[start]) ++end;
        turns.push_back({model_tokens[start] != 0,
                         tokenizer.decode(std::vector<int64_t>(ids.begin() + long(start), ids.begin() + long(end)), false)});
        start = end;
    }
    return turns;
}

std::vector<std::string> reward_turn_texts(const std::vector<int64_t>& ids, const std::vector<int64_t>& model_tokens,
                                           const Tokenizer& tokenizer) {
    std::vector<std::string> texts;
    for (EpisodeTurn& turn : episode_turns(ids, model_tokens, tokenizer)) {
        if (turn.from_model != (texts.size() % 2 == 0)) texts.emplace_back();  // the model's turn is empty
        texts.push_back(std::move(turn.text));
    }
    if (texts.empty()) texts.emplace_back();
    return texts;
}

void score_whole_episodes(const Environment& environment, const Tokenizer& tokenizer, const std::vector<EpisodeStart>& starts,
                          std::vector<Episode>& episodes, int64_t step, uint64_t seed, int64_t first_row) {
    EnvironmentTurns whole;
    whole.step = step;
    whole.seed = seed;
    for (size_t i = 0; i < episodes.size(); ++i) {
        const Episode& e = episodes[i];
        whole.add(uint64_t(first_row) + i, uint32_t(e.stats.turns), tokenizer.decode(e.ids, false), e.ids,
                  e.stats.ended_with_eos, starts[i].prompt_text, starts[i].columns_json,
                  environment_prompt_json(environment, starts[i]));
    }
    const std::vector<float> scores = environment.score_episodes(whole);
    for (size_t i = 0; i < episodes.size(); ++i) episodes[i].stats.environment_reward = scores[i];
}

Rollout generate_episodes(const Model& model, const Tokenizer& tokenizer, const Environment& environment,
                          std::vector<BatchRow> rows, const SamplingOptions& options, const EpisodeLimits& limits,
                          int64_t first_row, bool score_episodes) {
    std::vector<EpisodeStart> starts;
    for (const BatchRow& row : rows)
        starts.push_back({row.prompt_ids, row.prompt_text, row.columns_json, row.prompt_messages, row.prompt_given});
    auto episodes = run_episodes(model, tokenizer, environment, starts, options, limits, first_row);
    for (size_t i = 0; i < rows.size(); ++i) {  // the prompts the model saw, which begin_episodes may have extended
        rows[i].prompt_ids = starts[i].prompt_ids;
        rows[i].prompt_text = starts[i].prompt_text;
        rows[i].prompt_messages = starts[i].messages;
    }
    if (score_episodes) score_whole_episodes(environment, tokenizer, starts, episodes, limits.step, options.seed, first_row);
    return to_rollout(episodes, std::move(rows), options, first_row);
}

}  // namespace grove
