// AdamW with torch.optim.AdamW's exact update, global-norm gradient clipping, and Hugging Face's
// learning-rate schedules. Used by `grove train` and `grove sft`.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "grove/run_config.hpp"

namespace grove {

struct AdamWOptions {
    double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8, weight_decay = 0.0;
};

class AdamW {
public:
    // Weight decay applies to tensors of two or more dimensions only (not to norms and biases).
    // `updated[i]` false: this optimizer keeps no moments for params[i] and leaves it alone (another
    // rank updates it, ZeRO stage 1); empty: it updates every tensor.
    AdamW(std::vector<at::Tensor> params, AdamWOptions options, std::vector<bool> updated = {});
    // The total L2 norm of all gradients before clipping; scales them to max_norm when above it
    // (max_norm <= 0 disables clipping). One device sync.
    double clip_grad_norm(double max_norm);
    //   p -= lr*wd*p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
    //   p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
    void step(double lr);
    void zero_grad();

    const std::vector<at::Tensor>& params() const { return params_; }
    int64_t steps() const { return steps_; }
    bool updates(size_t i) const { return updated_[i]; }
    // params[i]'s first and second moments (undefined where this optimizer does not update it).
    std::pair<at::Tensor, at::Tensor> moments(size_t i) const { return {exp_avg_[i], exp_avg_sq_[i]}; }
    // The moments this optimizer keeps, under names "exp_avg.<i>" / "exp_avg_sq.<i>", for checkpoints.
    std::vector<std::pair<std::string, at::Tensor>> state() const;
    // Entries for tensors this optimizer does not update are ignored (and may be undefined).
    void restore(int64_t steps, const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq);

private:
    std::vector<at::Tensor> params_, exp_avg_, exp_avg_sq_;
    std::vector<bool> decay_, updated_;
    AdamWOptions o_;
    int64_t steps_ = 0;
};

// ZeRO stage 1: the rank that keeps the moments of, and updates, each tensor. Largest tensor first,
// each to the rank holding the fewest elements so far, so shares are about equal and every rank
// computes the same owners.
std::vector<int> shard_owners(const std::vector<at::Tensor>& params, int world_size);

// transformers.get_scheduler's multiplier of the peak rate `peak` at optimizer step `step` (0-based):
// linear warmup (none for constant), then linear decay to 0, cosine to 0 or to min_lr_rate, cosines
// with hard restarts, polynomial decay to lr_end, inverse square root, or none; or warmup-stable-decay,
// or cosine_warmup_with_min_lr (whose warmup and decay each start a step later).
double learning_rate_multiplier(LrSchedule schedule, int64_t step, int64_t warmup, int64_t total,
                                const LrSchedulerOptions& options = {}, double peak = 1.0);

// A run's learning rate over its `total` optimizer steps, as transformers' Trainer builds the schedule
// from TrainingArguments: train.warmup_steps warm up, else warmup_ratio x total rounded up.
struct LearningRateSchedule {
    LrSchedule type = LrSchedule::linear;
    double peak = 0.0;
    LrSchedulerOptions options;
    int64_t warmup = 0, total = 0;

    static LearningRateSchedule of(const TrainSection& train, int64_t total);
    // the rate of optimizer step `step` (0-based)
    double rate(int64_t step) const { return peak * learning_rate_multiplier(type, step, warmup, total, options, peak); }
    // a warning line when warmup was asked of "constant", which has none (as in transformers); else empty
    std::string ignored_warmup_warning() const;
};

}  // namespace grove
