// Batched sampling with a KV cache (preallocated, grown when a continued episode needs more), and
// the per-token log-probability function that training reuses. A GRPO generation batch is prompts x num_generations rows, generated at once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace grove {

class Model;
struct RouterLoad;
struct RunConfig;
struct TokenizerConfig;

struct SamplingOptions {
    int64_t max_new_tokens = 512;
    bool greedy = false;  // argmax; ignores the options below
    double temperature = 1.0;
    int64_t top_k = 0;                   // 0 disables
    double top_p = 1.0;                  // 1 disables
    double min_p = 0.0;                  // 0 disables
    double repetition_penalty = 1.0;     // 1 disables (CTRL-style, over prompt and completion tokens)
    std::vector<int64_t> eos_token_ids;  // stop a row at any of these
    int64_t pad_token_id = 0;            // fills rows after they stop (never used to build masks)
    uint64_t seed = 0;
    // On CUDA, generate() runs the static-shape engine: bf16 generation weights when the model is
    // float32 under bf16 autocast, a preallocated KV cache, and the decode step captured as a CUDA
    // graph per batch-size bucket (docs/performance.md). false: the eager decode loop.
    bool cuda_graphs = true;
    // With cuda_graphs: sampling and the per-step bookkeeping are captured in the decode step's
    // graph too, so a step is one replay with no host work between replays. Off: on an H200 it
    // changed no token but did not shorten the idle time between replays (docs/performance.md).
    bool capture_sampling = false;
    // With cuda_graphs: decode attention splits each row's columns over several blocks when rows x
    // KV heads are too few to keep the GPU busy (flash-decoding). On since the device kit measured
    // it (an H200: attention per step halved at batch 64; docs/performance.md). false: one block
    // per KV head and row.
    bool split_attention = true;
};

struct GenerationResult {
    at::Tensor completion_ids;     // [N, C] long, right-padded with pad_token_id
    at::Tensor completion_mask;    // [N, C] long, 1 up to and including the first EOS
    at::Tensor truncated;          // [N] bool, no EOS within max_new_tokens
    at::Tensor sampled_logprobs;   // [N, C] float, log softmax(logits / temperature) of each sampled token (0 where masked)
    std::vector<int64_t> lengths;  // completion lengths (incl. EOS)
};

// The manifest's [generation] settings (the seed is the run's).
SamplingOptions sampling_options(const RunConfig& config);
// Stop at every EOS id of the checkpoint (config.json, generation_config.json) and the tokenizer;
// pad with the tokenizer's pad token, else the first EOS id.
void set_stop_tokens(SamplingOptions& options, const Model& model, const TokenizerConfig& tokenizer);

// The sampling engine: a batch of rows that samples turn by turn and goes on from its KV cache.
// generate() is one turn; multi-turn episodes (episodes.hpp) append each observation to the rows
// that continue, which prefills only the new tokens, never the history again.
class DecodeSession {
public:
    // Prefills the prompts (token ids, no padding). `capacity` new tokens fit before the cache grows;
    // a `resumable` session keeps the rows that end a turn for continue_rows().
    DecodeSession(const Model& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& options,
                  int64_t capacity, bool resumable);
    ~DecodeSession();
    DecodeSession(const DecodeSession&) = delete;
    DecodeSession& operator=(const DecodeSession&) = delete;

    struct Turn {
        std::vector<int64_t> ids;     // sampled this turn, including the EOS or the stop
        std::vector<float> logprobs;  // log softmax(logits / temperature) of each
        bool eos = false;             // it ended at an EOS token
    };
    // Whether row `row`'s turn so far, `turn`, ends here (a stop string).
    using StopCheck = std::function<bool(size_t row, const std::vector<int64_t>& turn)>;
    // Samples one turn for every live row: until an EOS, limits[row] (>= 1) tokens, or `stop`.
    // Rows that are not live (finished, or never continued) get an empty turn. After the
    // `last_turn` no row can continue, so none is kept for continue_rows().
    std::vector<Turn> sample_turn(const std::vector<int64_t>& limits, const StopCheck& stop = nullptr, bool last_turn = false);

    struct Continuation {
        size_t row = 0;
        int64_t keep = 0;             // the first `keep` tokens of its last turn stay in the history (the rest are
                                      // masked out; for a repetition penalty they still count as seen)
        std::vector<int64_t> tokens;  // then these (an observation) follow
    };
    // The listed rows go on in the next turn: their kept turn and `tokens` enter the cache in one
    // batched forward pass. Every other row finishes. Call when no row is live.
    void continue_rows(const std::vector<Continuation>& rows);

private:
    struct State;
    std::unique_ptr<State> s_;
};

// Generates for every prompt (token ids, no padding; rows may differ in length). The same seed and
// inputs give the same completions on the same device.
GenerationResult generate(const Model& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& options);

// log p(target[b,t]) under logits / temperature, from final hidden states [B, T, H], computed
// `chunk_rows` positions at a time in float32 so the full [B, T, vocab] float32 tensor never exists.
// Differentiable with respect to hidden and the head weight. With `entropy`, also writes each
// position's entropy of softmax(logits / temperature), [B, T] (TRL's `entropy`): a metric without a
// graph, or with one when `entropy_graph` (the entropy bonus trains it).
at::Tensor token_logprobs(const Model& model, const at::Tensor& hidden, const at::Tensor& targets, double temperature,
                          int64_t chunk_rows = 1024, at::Tensor* entropy = nullptr, bool entropy_graph = false);

// Log-probs [B, C] of completion tokens given left-padded prompts and right-padded completions:
// input = cat(prompt, completion), positions from the mask, logits at position t predict token t+1.
// Only the real tokens are computed (packed rows); masked completion positions hold 0. A mixture of
// experts records its routing over those tokens (TRL's attention mask) into `router_load` if given.
at::Tensor completion_logprobs(const Model& model, const at::Tensor& prompt_ids, const at::Tensor& prompt_mask,
                               const at::Tensor& completion_ids, const at::Tensor& completion_mask, double temperature,
                               at::Tensor* entropy = nullptr, bool entropy_graph = false, RouterLoad* router_load = nullptr);

}  // namespace grove
