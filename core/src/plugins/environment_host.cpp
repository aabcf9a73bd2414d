#include "grove/environment_host.hpp"

#include "grove/error.hpp"

namespace grove {

void EnvironmentTurns::add(uint64_t episode, uint32_t turn, std::string text, const std::vector<int64_t>& turn_tokens, bool eos,
                           std::string prompt, std::string columns_json) {
    episodes.push_back(episode);
    turns.push_back(turn);
    turn_texts.push_back(std::move(text));
    prompts.push_back(std::move(prompt));
    row_json.push_back(std::move(columns_json));
    for (int64_t id : turn_tokens) tokens.push_back(int32_t(id));
    token_offsets.push_back(int64_t(tokens.size()));
    ended_with_eos.push_back(eos ? 1 : 0);
}

const grove_environment_batch& EnvironmentTurns::view() {
    turn_text_views_ = text_views(turn_texts);
    prompt_views_ = text_views(prompts);
    json_views_ = text_views(row_json);
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
    return batch_;
}

Environment::Environment(PluginInstance instance) : instance_(std::move(instance)) {
    const PluginInfo& info = instance_.info();
    if (info.kind != GROVE_PLUGIN_KIND_ENVIRONMENT)
        throw Error(ErrorKind::plugin,
                    "plugin " + info.display() + " is a " + plugin_kind_name(info.kind) + " plugin, not an environment");
    if (info.descriptor->environment->stop_strings) {
        const char* const* stops = nullptr;
        ErrorCapture capture;
        instance_.check(info.descriptor->environment->stop_strings(instance_.handle(), &stops, &capture.sink), "stop_strings",
                        capture);
        for (; stops && *stops; ++stops)
            if (**stops) stop_strings_.emplace_back(*stops);
    }
}

EnvironmentAnswers Environment::step(EnvironmentTurns& turns) const {
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
        sinks[i] = {sizeof(grove_text_sink), &answers.observations[i], [](grove_text_sink* s, const char* data, size_t size) {
                        static_cast<std::string*>(s->host_data)->append(data, size);
                    }};
        sink_pointers[i] = &sinks[i];
    }
    grove_environment_output out{sizeof(grove_environment_output), sink_pointers.data(), answers.done.data(),
                                 answers.tool_calls.data(), answers.tool_failures.data()};
    ErrorCapture capture;
    const grove_status status =
        instance_.info().descriptor->environment->step(instance_.handle(), &turns.view(), &out, &capture.sink);
    if (status != GROVE_OK)  // name the episodes, so the row that broke it can be found
        capture.message =
            (capture.message.empty() ? "no message given (status " + std::to_string(status) + ")" : capture.message) +
            " (the call held the episodes of generation-batch rows " + std::to_string(turns.episodes.front()) + " to " +
            std::to_string(turns.episodes.back()) + ")";
    instance_.check(status, "step", capture);
    return answers;
}

}  // namespace grove
