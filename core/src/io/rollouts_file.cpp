#include "grove/rollouts_file.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "grove/dataset.hpp"
#include "grove/error.hpp"
#include "grove/tokenizer.hpp"
#include "io/json_values.hpp"
#include "text/text_util.hpp"

namespace grove {

using nlohmann::json;

namespace {
void require_in_vocabulary(const std::vector<int64_t>& ids, int64_t vocab_size, const std::string& where, const char* what) {
    for (int64_t id : ids)
        if (id < 0 || id >= vocab_size)
            throw Error(ErrorKind::input, where + ": " + what + " token id " + std::to_string(id) +
                                              " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
}
}  // namespace

std::vector<ReplayRow> read_rollouts(const std::string& path, int64_t num_generations, const Tokenizer& tokenizer,
                                     int64_t vocab_size, const std::vector<std::string>& reward_names) {
    std::vector<ReplayRow> replay;
    std::vector<std::string> origin;
    for_each_jsonl(path, "the rollouts (rollouts.path)", [&](json& j, const std::string& where) {
        if (!j.is_object())
            throw Error(ErrorKind::input, where + ": a rollout is a JSON object, not " + std::string(j.type_name()));
        ReplayRow r;
        try {
            if (j.contains("prompt_ids")) {
                r.prompt_ids = json_integers(j["prompt_ids"], where + ": prompt_ids");
                require_in_vocabulary(r.prompt_ids, vocab_size, where, "prompt");
                r.prompt_text = tokenizer.decode(r.prompt_ids, false);
            } else if (j.contains("prompt") && j["prompt"].is_string()) {
                r.prompt_text = j["prompt"];
                r.prompt_ids = tokenizer.encode(r.prompt_text, false);
            } else {
                throw Error(ErrorKind::input, where + ": a rollout needs \"prompt_ids\" or a text \"prompt\"");
            }
            if (!j.contains("completion_ids")) throw Error(ErrorKind::input, where + ": a rollout needs \"completion_ids\"");
            r.completion_ids = json_integers(j["completion_ids"], where + ": completion_ids");
            require_in_vocabulary(r.completion_ids, vocab_size, where, "completion");
            if (j.contains("sampling_logprobs")) {
                r.sampling_logprobs = j["sampling_logprobs"].get<std::vector<float>>();
                if (r.sampling_logprobs.size() != r.completion_ids.size())
                    throw Error(ErrorKind::input, where + ": sampling_logprobs has " +
                                                      std::to_string(r.sampling_logprobs.size()) + " values for " +
                                                      std::to_string(r.completion_ids.size()) + " completion tokens");
            }
            if (j.contains("env_mask")) {
                r.env_mask = json_integers(j["env_mask"], where + ": env_mask");
                if (r.env_mask.size() != r.completion_ids.size())
                    throw Error(ErrorKind::input, where + ": env_mask has " + std::to_string(r.env_mask.size()) +
                                                      " values for " + std::to_string(r.completion_ids.size()) +
                                                      " completion tokens; it needs one per token (TRL's convention: "
                                                      "1 = written by the model, 0 = by the environment)");
                for (int64_t v : r.env_mask)
                    if (v != 0 && v != 1)
                        throw Error(ErrorKind::input, where + ": env_mask holds " + std::to_string(v) + "; use 0 or 1");
            }
            if (j.contains("rewards")) {
                for (const auto& [name, value] : j["rewards"].items()) {
                    if (std::find(reward_names.begin(), reward_names.end(), name) == reward_names.end())
                        throw Error(ErrorKind::input, where + ": reward \"" + name +
                                                          "\" is not one of the manifest's rewards (" +
                                                          join(reward_names, ", ") + ")");
                    r.rewards[name] = value.is_null() ? std::nan("") : json_number(value, where + ": rewards." + name);
                }
            }
        } catch (const json::exception& e) {
            throw Error(ErrorKind::input, where + ": " + e.what());
        }
        require_in_vocabulary(r.prompt_ids, vocab_size, where, "prompt");  // a text prompt's ids
        if (r.prompt_ids.empty()) throw Error(ErrorKind::input, where + ": empty prompt");
        for (const char* key : {"prompt_ids", "prompt", "completion_ids", "sampling_logprobs", "env_mask", "rewards"})
            j.erase(key);
        r.columns_json = j.dump();
        replay.push_back(std::move(r));
        origin.push_back(where);
    });
    const size_t G = size_t(num_generations);
    if (replay.empty() || replay.size() % G != 0)
        throw Error(ErrorKind::input, path + ": " + std::to_string(replay.size()) +
                                          " rollouts do not form whole groups of num_generations = " + std::to_string(G));
    for (size_t i = 0; i < replay.size(); ++i)
        if (replay[i].prompt_ids != replay[i - i % G].prompt_ids)
            throw Error(ErrorKind::input, origin[i] + ": this row's prompt differs from its group's first row (" +
                                              origin[i - i % G] + "); rows must come in consecutive groups of " +
                                              std::to_string(G) + " with the same prompt");
    return replay;
}

}  // namespace grove
