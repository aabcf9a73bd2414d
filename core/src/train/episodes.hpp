// Stage 1 for multi-turn runs (docs/training.md#multi-turn-episodes-environment): each row's
// completion is an episode of model turns and environment observations, generated in token space.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "train/rollout.hpp"

namespace grove {

class Environment;
class ProcessGroup;

struct EpisodeLimits {
    int64_t max_turns = 4;              // model turns per episode
    int64_t max_completion_length = 0;  // every token of the episode, observations included (as TRL)
    int64_t step = 0;                   // optimizer step, for the environment's batch
};

// Samples every row's episode. Each turn is generated for all running episodes together, from
// their whole history as token ids (nothing is re-tokenized); a turn ends at EOS, at the end of one
// of the environment's stop strings, or at the budget; then the environment answers all waiting
// episodes in one call. Observation tokens go into the completion with model_token_mask 0.
Rollout generate_episodes(const Model& model, const Tokenizer& tokenizer, const Environment& environment,
                          std::vector<BatchRow> rows, const SamplingOptions& options, const EpisodeLimits& limits,
                          int64_t first_row);

// TRL's tools/call_frequency (calls per episode) and tools/failure_frequency (failed calls per call),
// and episodes/* (turns, observation tokens, share that hit max_turns) and step_time/environment,
// over every rank's episodes.
std::map<std::string, double> episode_metrics(const Rollout& rollout, ProcessGroup* group);

// The shortest prefix of `ids` whose decoded text contains one of `stops`; ids.size() if none does.
size_t cut_at_stop_string(const Tokenizer& tokenizer, const std::vector<int64_t>& ids, const std::vector<std::string>& stops);

}  // namespace grove
