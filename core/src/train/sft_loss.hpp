// grove sft's loss on a micro-batch and its optimizer step, shared by run_sft and the test that
// compares them with TRL's SFTTrainer. Internal to core/.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "grove/sft.hpp"

namespace grove {

class Model;

struct SftLoss {
    at::Tensor loss;                 // differentiable: the cross-entropy plus the weighted load-balancing term
    std::optional<double> aux_loss;  // a mixture of experts' load-balancing loss (unweighted), when it is trained
    // TRL's SFT metrics over the micro-batch's trained tokens (0 when it has none): the share whose
    // most likely token (the first, on ties) is the label, and the mean entropy of the distribution
    double mean_token_accuracy = 0.0;
    double entropy = 0.0;
};

// What a token's loss is (TRL's SFTConfig.loss_type and router_aux_loss_coef).
struct SftObjective {
    // loss_type = "dft" (Dynamic Fine-Tuning): each trained token's -log p times p, p detached;
    // false: the cross-entropy -log p
    bool dft = false;
    // a mixture of experts' load-balancing term's weight; 0: not computed
    double router_aux_loss_coef = 0.0;
};

// NEFTune (TRL's neftune_noise_alpha, through transformers' hook on the embeddings): while training,
// noise uniform in [-m, m], m = alpha / sqrt(L x hidden_size), is added to the token embeddings. It
// is drawn from torch's generator for the batch as TRL's collator lays it out, [rows, longest row,
// hidden_size] (L the longest row), or [1, every token, hidden_size] padding-free (L their count), and
// each token takes its own position's draw: the same seed draws TRL's noise.
struct SftNoise {
    double neftune_noise_alpha = 0.0;  // 0: none
    bool padding_free = false;         // padding_free_batches()
};

// The optimizer step a micro-batch belongs to, for scaling its loss as TRL 1.16's SFTTrainer does
// under transformers' Trainer: the cross-entropy is summed and divided by the trained tokens of the
// whole step (Trainer's num_items_in_batch), the load-balancing term divided by the micro-batches.
struct SftStep {
    // of every micro-batch of the step (see trained_tokens()); unset: the tokens this micro-batch
    // predicts (its labels after the shift), as TRL divides without num_items_in_batch (evaluation)
    std::optional<int64_t> trained_tokens;
    int64_t micro_batches = 1;
    SftNoise noise;  // training only
};

// Trained tokens of the examples `picked` (TRL's labels != -100), at least 1 as TRL clamps it.
int64_t trained_tokens(const std::vector<SftExample>& examples, const std::vector<int64_t>& picked);

// One micro-batch's loss: the next-token loss (`objective`) summed over the trained tokens of the
// examples `picked`, their rows packed end to end, scaled for `step`; a mixture of experts with
// router_aux_loss_coef != 0 adds coef x its load-balancing loss / step.micro_batches. The micro-
// batches' losses (and gradients) add up to the step's.
SftLoss sft_loss(Model& model, const std::vector<SftExample>& examples, const std::vector<int64_t>& picked,
                 const SftObjective& objective, const SftStep& step);

// One optimizer step's forward and backward passes over its micro-batches (the gradients add up in
// the parameters), and what TRL logs for the step: the loss summed over the micro-batches (each
// scaled for the step), the aux loss, accuracy and entropy averaged over them. step_number names
// the step in the error a non-finite loss raises.
struct SftStepMetrics {
    double loss = 0.0, mean_token_accuracy = 0.0, entropy = 0.0;
    std::optional<double> aux_loss;
};
SftStepMetrics sft_backward(Model& model, const std::vector<SftExample>& examples,
                            const std::vector<std::vector<int64_t>>& micro_batches, const SftObjective& objective,
                            const SftNoise& noise, int64_t step_number);

// TRL's evaluation (Trainer.evaluate through SFTTrainer.compute_loss), without gradients: the
// examples in order, in batches of batch_size (the last one shorter); each batch's loss is its mean
// token loss (`objective`) over the tokens it predicts (+ coef x its load-balancing loss); eval_loss is those
// means weighted by the batches' sizes, eval_entropy, eval_mean_token_accuracy and eval_aux_loss the
// batches' plain means.
std::map<std::string, double> sft_evaluate(Model& model, const std::vector<SftExample>& examples, int64_t batch_size,
                                           const SftObjective& objective);

}  // namespace grove
