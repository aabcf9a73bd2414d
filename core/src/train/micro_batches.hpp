// Stage 3 of a GRPO step, micro-batch assembly (docs/architecture.md#the-training-step-as-stages):
// this rank's scored rows become padded tensors (prompts left-padded, completions right-padded),
// are shuffled with the run's seed and split into steps_per_generation micro-batches, each with the
// old and reference log-probabilities it will need (docs/grpo.md#log-probabilities-and-the-ratio).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "grove/run_config.hpp"
#include "train/rollout.hpp"

namespace grove {

class Model;
class ProcessGroup;

struct MicroBatch {
    at::Tensor prompt_ids, prompt_mask;          // [B, P] left-padded
    at::Tensor completion_ids, completion_mask;  // [B, C] right-padded; the mask: the tokens the model reads
    at::Tensor loss_mask;                        // [B, C] the completion tokens the loss counts (the model's)
    at::Tensor advantages;                       // [B]
    std::optional<at::Tensor> old_logps = std::nullopt, ref_logps = std::nullopt;  // [B, C] on the CPU, when needed
    // the sampler's log-probabilities ([B, C], NaN where a replayed row brought none) and, with
    // loss.importance_sampling_correction, the correction's ratio ([B, C] or [B, 1])
    std::optional<at::Tensor> sampling_logps = std::nullopt, sampling_ratio = std::nullopt;
};

// This rank's whole rollout as one batch. The loss counts the model's tokens (an environment's are
// context only); with mask_truncated_completions, truncated rows' masks are 0.
MicroBatch pad_rollout(const Rollout& rollout, const std::vector<float>& advantages, bool mask_truncated_completions,
                       int64_t pad_token_id);

// The batch's rows in a seeded random order, cut into `count` equal micro-batches.
std::vector<MicroBatch> split_micro_batches(const MicroBatch& whole, int64_t count, uint64_t shuffle_seed);

// Per-token log-probabilities of the batch's completions, without a graph.
at::Tensor logprobs_no_grad(const Model& model, const MicroBatch& batch, double temperature);

// Where the old and reference log-probabilities come from. The reference is `reference` when set,
// else the policy with its adapters switched off (LoRA: the base model).
struct LogprobSources {
    Model* policy = nullptr;
    const Model* reference = nullptr;
    bool need_old = false, need_reference = false;
    double temperature = 1.0;
};
void add_old_and_reference_logprobs(std::vector<MicroBatch>& batches, const LogprobSources& sources);

// With a correction mode, each micro-batch's sampling_ratio from its old and sampling log-probs,
// and TRL's sampling/importance_sampling_ratio/{min,mean,max} over every rank's.
std::map<std::string, double> add_sampling_ratios(std::vector<MicroBatch>& batches, SamplingCorrection mode,
                                                  std::optional<double> clip_min, std::optional<double> clip_max,
                                                  ProcessGroup* group);

// sampling/sampling_logp_difference/{mean,max}: how far the sampler's log-probabilities (replayed
// rows that bring them, on every rank) are from the trainer's (docs/grpo.md#sampler-mismatch);
// nullopt when some row brings none.
struct SamplingDifference {
    double mean = 0, max = 0;
};
std::optional<SamplingDifference> sampling_logprob_difference(const Rollout& rollout, const MicroBatch& whole,
                                                              const Model& model, double temperature, ProcessGroup* group);

}  // namespace grove
