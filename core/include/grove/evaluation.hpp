// `grove eval`: sample (or greedily decode) completions for a prompt set and score them with reward
// plugins: mean reward per function, accuracy and format rate where a reward declares that role
// (GROVE_PLUGIN_REPORTS_ACCURACY / _FORMAT_RATE, or [[rewards]] role), and completion lengths.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "grove/advantages.hpp"
#include "grove/episodes.hpp"
#include "grove/generation.hpp"
#include "grove/manifest.hpp"
#include "grove/run_config.hpp"

namespace grove {

struct EvaluationRequest {
    std::string model_dir;
    std::string data_source;  // JSONL or builtin:NAME
    std::string prompt_column = "prompt";
    std::string chat_template = "auto";
    bool enable_thinking = true;        // model.enable_thinking
    bool cast_lm_head_to_fp32 = false;  // model.cast_lm_head_to_fp32: the output layer in float32
    std::vector<PluginUse> rewards;     // name, plugin, weight, config
    std::vector<std::string> plugin_dirs;
    SamplingOptions sampling;  // greedy or sampling; eos/pad filled from the checkpoint
    int64_t samples = 1;       // completions per prompt
    int64_t limit = 0;         // first N prompts only (0: all)
    int64_t batch = 64;        // prompts x samples generated at once
    std::string device = "auto", dtype = "float32";
    std::optional<PluginUse> environment;          // multi-turn episodes with this environment plugin
    EnvironmentRewardSettings environment_reward;  // whether its score of each episode is a reward column
    int64_t max_turns = kNoTurnLimit;              // model turns per episode
    AdvantageOptions advantages;                   // evaluation_metrics' grouping (num_generations = samples)
    int64_t step = 0;                              // the optimizer step plugins are told (training: the current one)
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
    std::vector<std::string> reward_names;      // the reward columns in order (the environment's last)
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
EvaluationRequest evaluation_request(const RunConfig& config);
// Loads the request's model (a Hugging Face folder or an adapter checkpoint), its rewards and
// environment, and evaluates every prompt.
EvaluationResult evaluate(const EvaluationRequest& request);

class Model;
class Tokenizer;
class RewardSet;
class Environment;
class ProcessGroup;

// What evaluate() runs with, already loaded: the trainer evaluates its own model (adapters as they
// are) with its own scorers. `environment` may be null.
struct LoadedEvaluator {
    Model& model;
    const Tokenizer& tokenizer;
    const RewardSet& rewards;
    Environment* environment;
};
// Evaluates the request's prompts in batches of `request.batch` completions; with `group`, each rank
// takes every world_size-th batch (the same batches and seeds as one process). The result's rows
// and means are this rank's; evaluation_metrics() combines every rank's.
EvaluationResult evaluate(const LoadedEvaluator& loaded, const EvaluationRequest& request, ProcessGroup* group = nullptr);

// TRL's evaluation metrics over every rank's rows (keys as TRL logs them with eval_strategy, "eval_"
// first): eval_reward, eval_reward_std, eval_rewards/<name>/mean and /std, eval_frac_reward_zero_std
// (groups of `request.samples`), eval_completions/mean_length, min_length, max_length and
// clipped_ratio; Grove's eval_accuracy and eval_format_rate where a reward has that role, and
// eval_tools/call_frequency with an environment. Every rank calls it.
std::map<std::string, double> evaluation_metrics(const EvaluationResult& result, const LoadedEvaluator& loaded,
                                                 const EvaluationRequest& request, ProcessGroup* group = nullptr);
// The names evaluation_metrics() gives `loaded` and `request`, known before anything is evaluated
// (train.metric_for_best_model is checked against them before the first step).
std::vector<std::string> evaluation_metric_names(const LoadedEvaluator& loaded, const EvaluationRequest& request);

}  // namespace grove
