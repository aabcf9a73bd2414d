// `grove eval`: sample (or greedily decode) completions for a prompt set and score them with reward
// plugins: mean reward per function, accuracy and format rate where a reward declares that role
// (GROVE_PLUGIN_REPORTS_ACCURACY / _FORMAT_RATE, or [[rewards]] role), and completion lengths.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "grove/episodes.hpp"
#include "grove/generation.hpp"
#include "grove/manifest.hpp"

namespace grove {

struct EvaluationRequest {
    std::string model_dir;
    std::string data_source;  // JSONL or builtin:NAME
    std::string prompt_column = "prompt";
    std::string chat_template = "auto";
    std::vector<PluginUse> rewards;  // name, plugin, weight, config
    std::vector<std::string> plugin_dirs;
    SamplingOptions sampling;  // greedy or sampling; eos/pad filled from the checkpoint
    int64_t samples = 1;       // completions per prompt
    int64_t limit = 0;         // first N prompts only (0: all)
    int64_t batch = 64;        // prompts x samples generated at once
    std::string device = "auto", dtype = "float32";
    std::optional<PluginUse> environment;         // multi-turn episodes with this environment plugin
    std::optional<PluginUse> environment_reward;  // its score of each episode as a reward column (name, weight)
    int64_t max_turns = 4;                        // model turns per episode
};

struct EvaluationRow {
    std::string prompt, completion;
    int64_t length = 0;
    bool truncated = false;
    std::map<std::string, float> rewards;
    std::vector<EpisodeTurn> turns;  // episodes: the model's and the environment's turns in order
    int64_t tool_calls = 0, tool_failures = 0;
};

struct EvaluationResult {
    std::vector<EvaluationRow> rows;
    std::map<std::string, double> reward_mean;  // per reward name (NaN rows excluded)
    double reward = 0;                          // weighted sum, averaged
    double accuracy = -1;                       // mean of the reward whose role is accuracy; -1 when none
    double format_rate = -1;                    // mean of the reward whose role is format_rate; -1 when none
    double mean_length = 0;                     // model tokens only (an episode's observations are not counted)
    double truncated_ratio = 0;
    double tool_call_frequency = -1;  // tool calls per episode; -1 without an environment
};

// From a manifest: model.path, data.eval_source (else data.source), rewards, generation settings
// and the [environment], whose episodes are then scored whole (as the trainer scores them).
EvaluationRequest evaluation_request(const Manifest& manifest);
EvaluationResult evaluate(const EvaluationRequest& request);

}  // namespace grove
