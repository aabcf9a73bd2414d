#include "grove/environment_host.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>

#include <nlohmann/json.hpp>

#include "grove/dataset.hpp"
#include "grove/error.hpp"
#include "grove/manifest.hpp"
#include "plugins/text_sink.hpp"
#include "plugins/worker_protocol.hpp"

namespace grove {

void EnvironmentTurns::add(uint64_t episode, uint32_t turn, std::string text, const std::vector<int64_t>& turn_tokens, bool eos,
                           std::string prompt, std::string columns_json, std::optional<std::string> prompt_as_json) {
    episodes.push_back(episode);
    turns.push_back(turn);
    turn_texts.push_back(std::move(text));
    prompts.push_back(std::move(prompt));
    row_json.push_back(std::move(columns_json));
    if (prompt_as_json) prompt_json.push_back(std::move(*prompt_as_json));
    for (int64_t id : turn_tokens) tokens.push_back(int32_t(id));
    token_offsets.push_back(int64_t(tokens.size()));
    ended_with_eos.push_back(eos ? 1 : 0);
}

const grove_environment_batch& EnvironmentTurns::view() {
    turn_text_views_ = text_views(turn_texts);
    prompt_views_ = text_views(prompts);
    json_views_ = text_views(row_json);
    prompt_json_views_ = text_views(prompt_json);
    batch_ = grove_environment_batch{};
    batch_.struct_size = sizeof(grove_environment_batch);
    batch_.count = uint32_t(episodes.size());
    batch_.episodes = episodes.data();
    batch_.turns = turns.data();
    batch_.turn_texts = turn_text_views_.data();
    batch_.turn_token_offsets = token_offsets.data();
    batch_.turn_tokens = tokens.data();
    batch_.turn_ended_with_eos = ended_with_eos.data();
    batch_.prompts = prompt_views_.data();
    batch_.row_json = json_views_.data();
    batch_.step = step;
    batch_.seed = seed;
    batch_.prompt_json = !prompt_json.empty() && prompt_json.size() == episodes.size() ? prompt_json_views_.data() : nullptr;
    return batch_;
}

Environment::Environment(PluginInstance instance) : instance_(std::move(instance)) {
    const PluginInfo& info = instance_->info();
    if (info.kind != GROVE_PLUGIN_KIND_ENVIRONMENT)
        throw Error(ErrorKind::plugin,
                    "plugin " + info.display() + " is a " + plugin_kind_name(info.kind) + " plugin, not an environment");
    if (info.descriptor->environment->stop_strings) {
        const char* const* stops = nullptr;
        ErrorCapture capture;
        instance_->check(info.descriptor->environment->stop_strings(instance_->handle(), &stops, &capture.sink), "stop_strings",
                         capture);
        for (; stops && *stops; ++stops)
            if (**stops) stop_strings_.emplace_back(*stops);
    }
    const grove_environment_api* api = info.descriptor->environment;
    scores_episodes_ = api->struct_size >= offsetof(grove_environment_api, score_episodes) + sizeof(api->score_episodes) &&
                       api->score_episodes != nullptr;
    begins_episodes_ = GROVE_HAS_FIELD(api, grove_environment_api, begin_episodes) && api->begin_episodes != nullptr;
    if (GROVE_HAS_FIELD(api, grove_environment_api, episode_reward) && api->episode_reward) {
        uint32_t judgement = scores_episodes_ ? GROVE_EPISODES_JUDGED_ON_REQUEST : GROVE_EPISODES_UNJUDGED;
        grove_text_sink sink = text_sink_into(reward_name_);
        ErrorCapture capture;
        instance_->check(api->episode_reward(instance_->handle(), &judgement, &sink, &capture.sink), "episode_reward", capture);
        if (judgement > GROVE_EPISODES_JUDGED_AS_REWARD || (judgement != GROVE_EPISODES_UNJUDGED && !scores_episodes_))
            throw Error(ErrorKind::plugin, "plugin " + info.display() + ": episode_reward() answered judgement " +
                                               std::to_string(judgement) +
                                               (judgement > GROVE_EPISODES_JUDGED_AS_REWARD
                                                    ? ", which is none of GROVE_EPISODES_UNJUDGED, _JUDGED_ON_REQUEST and "
                                                      "_JUDGED_AS_REWARD (0, 1, 2)"
                                                    : ", but it has no score_episodes to judge with"));
        scores_episodes_ = scores_episodes_ && judgement != GROVE_EPISODES_UNJUDGED;
        reward_by_default_ = scores_episodes_ && judgement == GROVE_EPISODES_JUDGED_AS_REWARD;
    }
    if (GROVE_HAS_FIELD(api, grove_environment_api, tools_json) && api->tools_json) {
        std::string tools;
        grove_text_sink sink = text_sink_into(tools);
        ErrorCapture capture;
        instance_->check(api->tools_json(instance_->handle(), &sink, &capture.sink), "tools_json", capture);
        set_tools(std::move(tools));
    }
}

namespace {
// no tools at all for an empty list, as TRL renders GRPO prompts with `tools or None` (Llama 3.1's
// template would write its tool-use turn for an empty list)
std::string tool_list(const nlohmann::ordered_json& list) { return list.empty() ? "" : list.dump(); }
}  // namespace

void Environment::set_tools(std::string tools_json) {
    tools_json_ = std::move(tools_json);
    if (tools_json_.empty()) return;
    // ordered: a schema is rendered with its keys in the order the plugin wrote them
    const auto tools = nlohmann::ordered_json::parse(tools_json_, nullptr, false);
    const auto* routed = tools.is_object() ? &tools : nullptr;
    auto names_columns = [](const nlohmann::ordered_json& names) {
        return names.is_object() && std::all_of(names.begin(), names.end(), [](const auto& n) { return n.is_string(); });
    };
    const bool well_formed =
        tools.is_array() ||
        (routed && routed->contains("select_by") && (*routed)["select_by"].is_string() && routed->contains("tools") &&
         (*routed)["tools"].is_object() &&
         routed->size() == 2 + size_t(routed->contains("reward_names") && names_columns((*routed)["reward_names"])));
    if (!well_formed)
        throw Error(ErrorKind::plugin, "plugin " + info().display() +
                                           ": tools_json() gave neither a JSON array of tool schemas nor {\"select_by\": "
                                           "COLUMN, \"tools\": {VALUE: [...]}} (with, optionally, \"reward_names\": "
                                           "{VALUE: NAME})): " +
                                           tools_json_.substr(0, 200));
    if (tools.is_array()) {
        if (tools.empty()) tools_json_.clear();
        return;
    }
    tools_column_ = (*routed)["select_by"].get<std::string>();
    for (const auto& [value, list] : (*routed)["tools"].items()) {
        if (!list.is_array())
            throw Error(ErrorKind::plugin, "plugin " + info().display() + ": tools_json()'s tools for \"" + value +
                                               "\" are not a JSON array of tool schemas");
        tools_by_value_[value] = tool_list(list);
    }
    if (routed->contains("reward_names"))
        for (const auto& [value, name] : (*routed)["reward_names"].items()) {
            if (!tools_by_value_.count(value) || name.get<std::string>().empty())
                throw Error(
                    ErrorKind::plugin,
                    "plugin " + info().display() + ": tools_json()'s reward_names give \"" + value + "\" " +
                        (tools_by_value_.count(value) ? "an empty name" : "a column, but its tools name no such value") +
                        "; each key must be a value of \"tools\" and each name a reward column's");
            reward_name_by_value_[value] = name;
        }
}

MissingPrompt Environment::rows_without_prompt(const Environment* environment) {
    return environment && environment->begins_episodes() ? MissingPrompt::environment_writes : MissingPrompt::refused;
}

std::vector<std::vector<float>> Environment::scores_by_column(const std::vector<float>& scores,
                                                              const std::vector<std::string>& columns_json) const {
    std::vector<std::vector<float>> columns(reward_columns_.size(),
                                            std::vector<float>(scores.size(), std::numeric_limits<float>::quiet_NaN()));
    for (size_t i = 0; i < scores.size(); ++i)
        if (size_t c = reward_column_of(columns_json[i]); c != no_column) columns[c][i] = scores[i];
    return columns;
}

size_t Environment::reward_column_of(const std::string& columns_json) const {
    if (reward_columns_.empty()) return no_column;
    if (reward_name_by_value_.empty()) return 0;  // one column: every row's
    const auto columns = nlohmann::json::parse(columns_json.empty() ? "{}" : columns_json, nullptr, false);
    const auto* value = columns.is_object() && columns.contains(tools_column_) ? &columns[tools_column_] : nullptr;
    const auto named =
        value && value->is_string() ? reward_name_by_value_.find(value->get<std::string>()) : reward_name_by_value_.end();
    if (named == reward_name_by_value_.end()) return no_column;
    for (size_t c = 0; c < reward_columns_.size(); ++c)
        if (reward_columns_[c].name == named->second) return c;
    return no_column;
}

std::string Environment::tools_for(const std::string& columns_json, const std::string& origin) const {
    if (tools_column_.empty()) return tools_json_;
    const auto columns = nlohmann::json::parse(columns_json.empty() ? "{}" : columns_json, nullptr, false);
    auto names = [&] {  // for the refusals only: this runs for every row's prompt
        std::string list;
        for (const auto& [value, tools] : tools_by_value_) list += (list.empty() ? "\"" : ", \"") + value + "\"";
        return list;
    };
    const auto* chosen = columns.is_object() && columns.contains(tools_column_) ? &columns[tools_column_] : nullptr;
    if (!chosen || !chosen->is_string())
        throw Error(ErrorKind::input, origin + ": environment plugin " + info().display() +
                                          " is several, chosen by each row's \"" + tools_column_ +
                                          "\" column, which this row " + (chosen ? "does not give as text" : "lacks") +
                                          "; give it one of " + names());
    const auto found = tools_by_value_.find(chosen->get<std::string>());
    if (found == tools_by_value_.end())
        throw Error(ErrorKind::input, origin + ": \"" + tools_column_ + "\" is \"" + chosen->get<std::string>() +
                                          "\", which is none of the environments of plugin " + info().display() + ": " +
                                          names());
    return found->second;
}

Environment::Environment(std::unique_ptr<PluginWorker> worker) : worker_(std::move(worker)) {
    worker::EnvironmentTraits traits = worker::decode_traits(worker_->ready_payload());
    stop_strings_ = std::move(traits.stop_strings);
    set_tools(std::move(traits.tools_json));
    scores_episodes_ = traits.scores_episodes;
    begins_episodes_ = traits.begins_episodes;
    reward_by_default_ = traits.reward_by_default;
    reward_name_ = std::move(traits.reward_name);
}

Environment::~Environment() = default;

const PluginInfo& Environment::info() const { return instance_ ? instance_->info() : worker_->info(); }

namespace {
// In a worker: one `request` for these episodes, its reply decoded.
template <class Decode>
auto call_worker(PluginWorker& process, worker::FrameType request, worker::FrameType reply, EnvironmentTurns& turns,
                 const char* name, Decode decode) {
    const std::string what = std::string(name) + " for the episodes of generation-batch rows " +
                             std::to_string(turns.episodes.front()) + " to " + std::to_string(turns.episodes.back()) +
                             " (step " + std::to_string(turns.step) + ")";
    return process.call(uint32_t(request), uint32_t(reply), worker::encode_turns(turns.view()), what, decode);
}

// A failed call's error names the episodes it held, so the row that broke it can be found.
void check_call(const PluginInstance& instance, grove_status status, const char* entry, ErrorCapture& capture,
                const EnvironmentTurns& episodes) {
    if (status != GROVE_OK)
        capture.message =
            (capture.message.empty() ? "no message given (status " + std::to_string(status) + ")" : capture.message) +
            " (the call held the episodes of generation-batch rows " + std::to_string(episodes.episodes.front()) + " to " +
            std::to_string(episodes.episodes.back()) + ")";
    instance.check(status, entry, capture);
}
}  // namespace

std::vector<float> Environment::score_episodes(EnvironmentTurns& episodes) const {
    if (!scores_episodes())
        throw Error(ErrorKind::plugin, "plugin " + info().display() + " does not judge whole episodes (score_episodes)");
    std::vector<float> rewards(episodes.size(), std::numeric_limits<float>::quiet_NaN());
    if (rewards.empty()) return rewards;
    if (worker_)
        return call_worker(*worker_, worker::FrameType::environment_score, worker::FrameType::episode_scores, episodes,
                           "score_episodes", [&](const std::string& reply) {
                               std::vector<float> scores = worker::decode_floats(reply);
                               if (scores.size() != rewards.size())
                                   throw Error(ErrorKind::plugin, std::to_string(scores.size()) + " scores for " +
                                                                      std::to_string(rewards.size()) + " episodes");
                               return scores;
                           });
    ErrorCapture capture;
    const grove_status status = instance_->info().descriptor->environment->score_episodes(instance_->handle(), &episodes.view(),
                                                                                          rewards.data(), &capture.sink);
    check_call(*instance_, status, "score_episodes", capture, episodes);
    return rewards;
}

std::vector<std::string> Environment::begin_episodes(EnvironmentTurns& episodes) const {
    if (!begins_episodes()) return std::vector<std::string>(episodes.size());
    if (episodes.size() == 0) return {};
    if (worker_)
        return call_worker(*worker_, worker::FrameType::environment_begin, worker::FrameType::answers, episodes,
                           "begin_episodes",
                           [&](const std::string& reply) { return worker::decode_answers(reply, episodes.size()); })
            .observations;
    return answer(episodes, instance_->info().descriptor->environment->begin_episodes, "begin_episodes").observations;
}

EnvironmentAnswers Environment::step(EnvironmentTurns& turns) const {
    if (turns.size() == 0) return {};
    if (worker_)
        return call_worker(*worker_, worker::FrameType::environment_step, worker::FrameType::answers, turns, "step",
                           [&](const std::string& reply) { return worker::decode_answers(reply, turns.size()); });
    return answer(turns, instance_->info().descriptor->environment->step, "step");
}

EnvironmentAnswers Environment::answer(EnvironmentTurns& turns, AnswerCall call, const char* name) const {
    const size_t n = turns.size();
    EnvironmentAnswers answers;
    answers.observations.assign(n, std::string());
    answers.done.assign(n, 0);
    answers.tool_calls.assign(n, 0);
    answers.tool_failures.assign(n, 0);
    if (n == 0) return answers;
    std::vector<grove_text_sink> sinks(n);
    std::vector<grove_text_sink*> sink_pointers(n);
    for (size_t i = 0; i < n; ++i) {
        sinks[i] = text_sink_into(answers.observations[i]);
        sink_pointers[i] = &sinks[i];
    }
    grove_environment_output out{sizeof(grove_environment_output), sink_pointers.data(), answers.done.data(),
                                 answers.tool_calls.data(), answers.tool_failures.data()};
    ErrorCapture capture;
    const grove_status status = call(instance_->handle(), &turns.view(), &out, &capture.sink);
    check_call(*instance_, status, name, capture, turns);
    return answers;
}

std::unique_ptr<Environment> make_environment(PluginHost& host, const PluginUse& use, const EnvironmentRewardSettings& reward,
                                              const std::vector<PluginUse>& rewards, bool reward_required) {
    std::unique_ptr<Environment> environment;
    if (use.isolation.process)
        environment = std::make_unique<Environment>(std::make_unique<PluginWorker>(
            host.find(use.plugin, GROVE_PLUGIN_KIND_ENVIRONMENT, use.origin), use, GROVE_PLUGIN_KIND_ENVIRONMENT));
    else
        environment = std::make_unique<Environment>(create_plugin(host, use, GROVE_PLUGIN_KIND_ENVIRONMENT));
    const std::string plugin =
        environment->info().display() +
        (environment->default_reward_name().empty() ? "" : " (" + environment->default_reward_name() + ")");
    if (reward.weight && !environment->scores_episodes())
        throw Error(ErrorKind::manifest, use.origin + ": reward_weight makes the environment a reward column, but plugin " +
                                             plugin +
                                             " does not score whole episodes (SDK score_episodes; in Python, a TRL class's "
                                             "get_reward()); remove reward_weight");
    if (reward.weight || environment->reward_by_default()) {
        PluginUse column = use;
        column.name = reward.name.value_or(environment->default_reward_name().empty() ? "environment"
                                                                                      : environment->default_reward_name());
        column.weight = reward.weight.value_or(1.0);  // TRL weighs an environment's get_reward() 1
        // several environments naming a column each (TRL: one per class with get_reward()), unless
        // the manifest names the one column
        if (reward.name) environment->reward_name_by_value_.clear();
        const bool by_value = !environment->reward_name_by_value_.empty();
        std::vector<std::string> names;
        for (const auto& [value, name] : environment->reward_name_by_value_)
            if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
        if (!by_value) names.push_back(column.name);
        for (const std::string& name : names) {
            PluginUse named = column;
            named.name = name;
            for (const PluginUse& r : rewards)
                if (r.name == name)
                    throw Error(
                        ErrorKind::manifest,
                        use.origin + ": the environment's reward column \"" + name + "\" has the name of the reward at " +
                            r.origin +
                            (by_value ? "; rename that reward (its `name`), or set reward_name to make the environments' "
                                        "columns one"
                                      : "; give the environment's column another reward_name"));
            environment->reward_columns_.push_back(std::move(named));
        }
        environment->reward_column_ = std::move(column);
    } else if (reward.name) {
        throw Error(ErrorKind::manifest,
                    use.origin + ": reward_name names the environment's reward column, but plugin " + plugin +
                        "'s judgement is no reward" +
                        (environment->scores_episodes() ? " unless reward_weight is set: set it too" : ": remove reward_name"));
    }
    if (reward_required && !environment->reward_column())
        throw Error(ErrorKind::manifest,
                    no_reward_message(use.origin + ": plugin " + plugin + " is no reward" +
                                      (environment->scores_episodes() ? " unless reward_weight is set" : "")));
    return environment;
}

}  // namespace grove
