// Test environment: answers every model turn with the same `observation` until the episode has
// `turns` model turns, then says done; scores a whole episode by how often the observation
// occurs in it. `stop` (optional) ends model turns early; `fail_at_turn`
// returns an error status at that turn, to test how the host reports a broken environment;
// `prompt_note` (optional) is added to every episode's prompt before generation (begin_episodes);
// `tools` (optional) is what tools_json() gives; `judgement` and `reward_name` are what
// episode_reward() says of its score of whole episodes.
#include <grove/plugin.hpp>

#include <string>

namespace {
struct Scripted {
    explicit Scripted(const grove::sdk::Config& c)
            : observation(c.get_string("observation", " ok")),
              stop(c.get_string("stop", "")),
              turns(c.get_int("turns", 2)),
              fail_at_turn(c.get_int("fail_at_turn", 0)),
              prompt_note(c.get_string("prompt_note", "")),
              tools(c.get_string("tools", "")),
              judgement(c.get_string("judgement", "on_request")),
              reward_name(c.get_string("reward_name", "")) {
        if (judgement != "none" && judgement != "on_request" && judgement != "as_reward")
            throw grove::sdk::Error(GROVE_ERROR_CONFIG, "judgement must be none, on_request or as_reward", "judgement");
        stops[0] = stop.empty() ? nullptr : stop.c_str();
    }
    const char* const* stop_strings() const { return stops; }
    std::string tools_json() const { return tools; }
    grove::sdk::EpisodeReward episode_reward() const {
        return {judgement == "none"        ? GROVE_EPISODES_UNJUDGED
                : judgement == "as_reward" ? GROVE_EPISODES_JUDGED_AS_REWARD
                                           : GROVE_EPISODES_JUDGED_ON_REQUEST,
                reward_name};
    }
    void begin_episodes(const grove_environment_batch& b, grove_environment_output& out) const {
        for (uint32_t i = 0; i < b.count && !prompt_note.empty(); ++i) grove::sdk::observe(out, i, prompt_note);
    }
    void step(const grove_environment_batch& b, grove_environment_output& out) const {
        for (uint32_t i = 0; i < b.count; ++i) {
            if (int64_t(b.turns[i]) == fail_at_turn)
                throw grove::sdk::Error(GROVE_ERROR_INTERNAL, "scripted failure at turn " + std::to_string(fail_at_turn));
            if (int64_t(b.turns[i]) >= turns) {
                out.done[i] = 1;
                continue;
            }
            out.tool_calls[i] = 1;
            grove::sdk::observe(out, i, observation);
        }
    }
    // its score of a whole episode: how often the observation occurs in it (the tool calls it answered)
    void score_episodes(const grove_environment_batch& b, float* rewards) const {
        for (uint32_t i = 0; i < b.count; ++i) {
            const std::string_view text = grove::sdk::view(b.turn_texts[i]);
            int count = 0;
            for (size_t at = text.find(observation); at != std::string_view::npos; at = text.find(observation, at + 1)) ++count;
            rewards[i] = float(count);
        }
    }
    std::string observation, stop;
    int64_t turns, fail_at_turn;
    std::string prompt_note, tools, judgement, reward_name;
    const char* stops[2] = {nullptr, nullptr};
};
const grove_config_key kKeys[] = {
    grove::sdk::key("observation", GROVE_VALUE_STRING, "\" ok\"", "the answer to every turn"),
    grove::sdk::key("stop", GROVE_VALUE_STRING, "\"\"", "a stop string; empty: none"),
    grove::sdk::key("turns", GROVE_VALUE_INT, "2", "model turns before done"),
    grove::sdk::key("fail_at_turn", GROVE_VALUE_INT, "0", "return an error at this turn; 0: never"),
    grove::sdk::key("prompt_note", GROVE_VALUE_STRING, "\"\"", "text added to every prompt before generation"),
    grove::sdk::key("tools", GROVE_VALUE_STRING, "\"\"", "what tools_json() gives; empty: nothing"),
    grove::sdk::key("judgement", GROVE_VALUE_STRING, "\"on_request\"",
                    "what episode_reward() says: none, on_request or as_reward"),
    grove::sdk::key("reward_name", GROVE_VALUE_STRING, "\"\"", "the reward column's name episode_reward() gives"),
};
constexpr auto kScripted =
    grove::sdk::environment_descriptor<Scripted>("scripted_env", "1.0.0", "answers every turn the same", 0, kKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kScripted)
