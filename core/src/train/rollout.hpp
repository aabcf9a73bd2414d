// Stage 1 of a GRPO step, the rollout (docs/architecture.md#the-training-step-as-stages): draw the
// generation batch's prompts, then generate their completions, or replay completions made elsewhere
// ([rollouts] path). Rows are group-major: rows [g*G, (g+1)*G) share prompt g.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "grove/dataset.hpp"
#include "grove/episodes.hpp"
#include "grove/generation.hpp"
#include "grove/rollouts_file.hpp"

namespace grove {

class Model;
class Tokenizer;

// One row of a generation batch before it has a completion.
struct BatchRow {
    std::vector<int64_t> prompt_ids;
    std::string prompt_text, columns_json;          // columns_json: the dataset row's other columns
    const ReplayRow* replay = nullptr;              // set when the completion is replayed
    std::vector<ChatMessage> prompt_messages = {};  // the prompt as chat messages; empty for a text prompt
    bool prompt_given = true;                       // false: the dataset row had none (PromptRow::prompt_given)
};

// The prompts a run samples from, and the sampler's position in them: a seeded permutation per
// epoch (TRL's RepeatSampler, each prompt num_generations times in a row), or the rollouts file in
// its order. Only (epoch, position, replay_position) need saving to resume exactly.
class PromptSource {
public:
    struct Position {
        int64_t epoch = 0, position = 0;
        size_t replay_position = 0;
    };

    // Training prompts, tokenized once with the chat template applied.
    PromptSource(std::vector<BatchRow> prompts, int64_t num_generations, uint64_t seed, bool shuffle);
    // A rollouts file's rows, in consecutive groups of num_generations (checked).
    PromptSource(std::vector<ReplayRow> replay, int64_t num_generations);

    // The next generation batch of `rows` rows (rows / num_generations prompts), the same on every rank.
    std::vector<BatchRow> next_batch(int64_t rows);

    // prompts (replay: groups of num_generations rows) per epoch
    size_t prompt_count() const { return replay_.empty() ? prompts_.size() : replay_.size() / size_t(G_); }
    const Position& position() const { return at_; }
    void restore(const Position& position);
    double epoch_progress() const;  // epoch + position / prompt_count (the `epoch` metric)

private:
    void fill_permutation();
    std::vector<BatchRow> prompts_;
    std::vector<ReplayRow> replay_;
    int64_t G_ = 1;
    uint64_t seed_ = 0;
    bool shuffle_ = true;
    std::vector<int64_t> permutation_;
    Position at_;
};

// This rank's slice [rank * n, (rank + 1) * n) of a generation batch, as accelerate shards TRL's
// (groups may span ranks).
std::vector<BatchRow> shard_rows(const std::vector<BatchRow>& batch, int rank, int world_size);

// The rollout stage's value: this rank's rows with their completions.
struct Rollout {
    std::vector<BatchRow> rows;    // [N] this rank's
    GenerationResult completions;  // [N, C]; lengths include the EOS token
    // [N, C] long: 1 where the model wrote the token, 0 where an environment did (TRL's env_mask) or
    // past the row's end; undefined when single-turn (every completion token is the model's)
    at::Tensor model_token_mask;
    std::vector<EpisodeStats> episodes;  // [N] with an environment; empty otherwise
    int64_t first_row = 0;               // index of rows[0] in the global generation batch
    uint64_t seed = 0;                   // the sampler's seed for this batch
    bool replayed() const { return !rows.empty() && rows[0].replay; }
};

// [N, C] long: 1 for the completion tokens the model wrote (Rollout::model_token_mask, or the
// completion mask when single-turn); and their count per row, which TRL's length metrics count.
at::Tensor model_tokens(const Rollout& rollout);
std::vector<int64_t> model_token_counts(const Rollout& rollout);

// Completions of different lengths as the padded tensors of a GenerationResult (a row is truncated
// when it does not end with EOS); a row's log-probs may be empty (zeros), as may a row.
GenerationResult padded_completions(const std::vector<std::vector<int64_t>>& ids,
                                    const std::vector<std::vector<float>>& logprobs, const SamplingOptions& options);
// Per-row model-token masks (TRL's env_mask), padded to the completions' width with 0.
at::Tensor padded_model_tokens(const std::vector<std::vector<int64_t>>& model_tokens, const GenerationResult& completions);

// Samples every row's completion with `options` (its seed included).
Rollout generate_rollout(const Model& model, std::vector<BatchRow> rows, const SamplingOptions& options, int64_t first_row);
// The rows' given completions, each cut after its first EOS id (kept), as generated ones stop; a
// multi-turn row (with an env_mask) stays whole and its mask goes to Rollout::model_token_mask.
Rollout replay_rollout(std::vector<BatchRow> rows, const SamplingOptions& options, int64_t first_row);

}  // namespace grove
