// Multi-turn episodes with an environment plugin (docs/training.md#multi-turn-episodes-environment):
// the model writes a turn, the environment answers, the model goes on, in token space. Used by the
// trainer's rollout stage and by `grove generate --environment`.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "grove/generation.hpp"
#include "grove/run_config.hpp"
#include "grove/tokenizer.hpp"

namespace grove {

class Environment;
class Model;
class Tokenizer;

struct EpisodeLimits {
    int64_t max_turns = kNoTurnLimit;   // model turns per episode
    int64_t max_completion_length = 0;  // every token of the episode, observations included (as TRL)
    int64_t step = 0;                   // optimizer step, for the environment's batch
    // how a conversation's prompt is rendered again when the environment adds to it (begin_episodes)
    ChatTemplate chat_template = ChatTemplate::plain;
};

// One episode's counts, for the environment metrics.
struct EpisodeStats {
    int64_t turns = 0, tool_calls = 0, tool_failures = 0, observation_tokens = 0;
    double environment_seconds = 0;    // this episode's share of the environment's calls
    bool hit_max_turns = false;        // its last allowed turn ended at a stop string, not EOS
    bool ended_with_eos = false;       // its last model turn ended with EOS
    bool observation_dropped = false;  // its last observation did not fit (budget or context) and was left out
    float environment_reward = std::numeric_limits<float>::quiet_NaN();  // its score_episodes() score, if asked
};

// Where an episode starts: its prompt as ids and text, the dataset row's other columns (JSON), and
// the prompt as chat messages (empty for a text prompt), which environments see as the dataset's.
struct EpisodeStart {
    std::vector<int64_t> prompt_ids;
    std::string prompt_text, columns_json = "{}";
    std::vector<ChatMessage> messages = {};
    bool prompt_given = true;  // false: the dataset row had no prompt (PromptRow::prompt_given)
};

struct Episode {
    std::vector<int64_t> ids;           // the completion: model turns and observations
    std::vector<int64_t> model_tokens;  // 1 where the model wrote the token (TRL's env_mask)
    std::vector<float> logprobs;        // the sampler's, 0 for observation tokens
    EpisodeStats stats;
};

// Samples every episode. Each turn is sampled for all running episodes together (DecodeSession); a
// turn ends at EOS, at the token that completes one of the environment's stop strings, or at the
// budget; then the environment answers all waiting episodes in one call, and the episodes that go
// on continue from their KV cache: only the observation's tokens are prefilled, and nothing is
// re-tokenized. `first_row` is the index of starts[0] in the generation batch (the environment's
// episode numbers). First the environment may add to each prompt (begin_episodes): `starts` then
// holds the prompts the model saw.
std::vector<Episode> run_episodes(const Model& model, const Tokenizer& tokenizer, const Environment& environment,
                                  std::vector<EpisodeStart>& starts, const SamplingOptions& options,
                                  const EpisodeLimits& limits, int64_t first_row = 0);

// An episode's turns in order: each run of tokens of one author (the model, or the environment),
// decoded with special tokens kept.
struct EpisodeTurn {
    bool from_model = true;
    std::string text;
};
std::vector<EpisodeTurn> episode_turns(const std::vector<int64_t>& ids, const std::vector<int64_t>& model_tokens,
                                       const Tokenizer& tokenizer);
inline std::vector<EpisodeTurn> episode_turns(const Episode& episode, const Tokenizer& tokenizer) {
    return episode_turns(episode.ids, episode.model_tokens, tokenizer);
}
// The turns as the rewards get them (grove_reward_batch.episode_turns): their texts, alternating
// from the model's (an empty first turn when the environment's tokens come first, or there are none).
std::vector<std::string> reward_turn_texts(const std::vector<int64_t>& ids, const std::vector<int64_t>& model_tokens,
                                           const Tokenizer& tokenizer);

// The environment's scores of the ended episodes, each given whole (score_episodes), into their
// stats' environment_reward. `step`, `seed` and `first_row` as for run_episodes.
void score_whole_episodes(const Environment& environment, const Tokenizer& tokenizer, const std::vector<EpisodeStart>& starts,
                          std::vector<Episode>& episodes, int64_t step, uint64_t seed, int64_t first_row = 0);

// The shortest prefix of `ids` whose decoded text contains one of `stops`; ids.size() if none does.
size_t cut_at_stop_string(const Tokenizer& tokenizer, const std::vector<int64_t>& ids, const std::vector<std::string>& stops);

}  // namespace grove
