// Stage 1 for multi-turn runs (docs/training.md#multi-turn-episodes-environment): each row's
// completion is an episode of model turns and environment observations, generated in token space.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "grove/episodes.hpp"
#include "train/rollout.hpp"

namespace grove {

class Environment;
class ProcessGroup;

// Every row's episode (run_episodes) as the rollout stage's value: observation tokens go into the
// completion with model_token_mask 0, and Rollout::episodes holds their counts (and, with
// `score_episodes`, the environment's score of each: the [environment] reward column).
Rollout generate_episodes(const Model& model, const Tokenizer& tokenizer, const Environment& environment,
                          std::vector<BatchRow> rows, const SamplingOptions& options, const EpisodeLimits& limits,
                          int64_t first_row, bool score_episodes = false);

// TRL's tools/call_frequency (calls per episode) and tools/failure_frequency (failed calls per call),
// and episodes/* (turns, observation tokens, share that hit max_turns) and step_time/environment,
// over every rank's episodes.
std::map<std::string, double> episode_metrics(const Rollout& rollout, ProcessGroup* group);

}  // namespace grove
