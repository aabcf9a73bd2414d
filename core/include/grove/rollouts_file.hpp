// Rollouts files (docs/training.md#replaying-rollouts): completions generated elsewhere, one JSON
// row each, that a run replays instead of generating. No libtorch: the trainer turns rows into tensors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace grove {

class Tokenizer;

// One row given by a rollouts file: what it was generated from and, optionally, how it was scored.
struct ReplayRow {
    std::vector<int64_t> prompt_ids, completion_ids;
    std::vector<float> sampling_logprobs;   // empty when not given
    std::vector<int64_t> env_mask;          // multi-turn, TRL's field: 1 = the model's token, 0 = the environment's
    std::map<std::string, double> rewards;  // given values (NaN for null) replace the plugins' scores
    std::string prompt_text, columns_json;
};

// Reads a rollouts JSONL file; every error names file:line. Token ids are checked against
// vocab_size before the tokenizer sees them.
std::vector<ReplayRow> read_rollouts(const std::string& path, int64_t num_generations, const Tokenizer& tokenizer,
                                     int64_t vocab_size, const std::vector<std::string>& reward_names);

}  // namespace grove
