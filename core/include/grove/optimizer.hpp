// The optimizers (torch.optim.AdamW's exact update, or transformers' Adafactor as Trainer sets it
// up), global-norm gradient clipping, and Hugging Face's learning-rate schedules. Used by
// `grove train` and `grove sft`.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "grove/run_config.hpp"

namespace grove {

// One tensor an optimizer keeps for a trained tensor: its name in checkpoints ("<name>.<i>" for
// trained tensor i), shape and type. They follow from the trained tensor alone, so every rank knows
// them, whichever rank keeps the state.
struct OptimizerSlot {
    std::string name;
    std::vector<int64_t> shape;
    at::ScalarType dtype;
};

class Optimizer {
public:
    virtual ~Optimizer() = default;
    // The total L2 norm of all gradients before clipping; scales them to max_norm when above it
    // (max_norm <= 0 disables clipping). One device sync.
    double clip_grad_norm(double max_norm);
    // One update at learning rate `lr` of every tensor this optimizer updates that has a gradient.
    virtual void step(double lr) = 0;
    void zero_grad();
    virtual OptimizerKind kind() const = 0;

    const std::vector<at::Tensor>& params() const { return params_; }
    // step() calls so far
    int64_t steps() const { return steps_; }
    // per tensor, the steps in which it had a gradient: its own count t for bias correction, as torch
    // keeps state["step"] per tensor (an expert no token reached in a whole step is not stepped)
    const std::vector<int64_t>& tensor_steps() const { return tensor_steps_; }
    bool updates(size_t i) const { return updated_[i]; }
    // What this optimizer keeps for params[i], on every rank; and the tensors, in that order (none
    // where it does not update params[i]).
    virtual std::vector<OptimizerSlot> slots(size_t i) const = 0;
    const std::vector<at::Tensor>& state_of(size_t i) const { return state_[i]; }
    // Every tensor this optimizer keeps, named as slots() say, for checkpoints.
    std::vector<std::pair<std::string, at::Tensor>> state() const;
    // `state[i]` in slots(i)'s order; entries for tensors this optimizer does not update are ignored.
    void restore(int64_t steps, std::vector<int64_t> tensor_steps, const std::vector<std::vector<at::Tensor>>& state);

protected:
    // Weight decay applies to params[i] where decays[i] (weight_decay_applies of its name).
    // `updated[i]` false: this optimizer keeps no state for params[i] and leaves it alone (another
    // rank updates it, ZeRO stage 1); empty: it updates every tensor.
    Optimizer(std::vector<at::Tensor> params, std::vector<bool> decays, std::vector<bool> updated);
    // zeros for every slot of every updated tensor; a subclass's constructor calls it
    void allocate_state();
    // Counts a step() call and, for every tensor with a gradient, its own step (on every rank, also
    // for tensors another rank updates: their gradients are the same everywhere). The tensors this
    // optimizer now updates, with their step counts.
    std::vector<size_t> begin_step();

    std::vector<at::Tensor> params_;
    std::vector<std::vector<at::Tensor>> state_;
    std::vector<bool> decay_, updated_;
    int64_t steps_ = 0;
    std::vector<int64_t> tensor_steps_;
};

struct AdamWOptions {
    double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8, weight_decay = 0.0;
};

// torch.optim.AdamW. Slots: exp_avg, exp_avg_sq, in the tensor's type.
class AdamW final : public Optimizer {
public:
    AdamW(std::vector<at::Tensor> params, std::vector<bool> decays, AdamWOptions options, std::vector<bool> updated = {});
    //   p -= lr*wd*p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
    //   p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
    void step(double lr) override;
    OptimizerKind kind() const override { return OptimizerKind::adamw; }
    std::vector<OptimizerSlot> slots(size_t i) const override;

private:
    AdamWOptions o_;
};

// transformers.optimization.Adafactor as Trainer creates it for optim = "adafactor": lr given
// (relative_step and scale_parameter off), no first moment (beta1 None), eps (1e-30, 1e-3),
// clip_threshold 1, decay_rate -0.8. A matrix keeps the running mean of g^2 over each row and each
// column (slots exp_avg_sq_row and exp_avg_sq_col); any other tensor keeps exp_avg_sq. Float32 state.
class Adafactor final : public Optimizer {
public:
    Adafactor(std::vector<at::Tensor> params, std::vector<bool> decays, double weight_decay, std::vector<bool> updated = {});
    //   b2 = 1 - t^-0.8;  v = b2 v + (1-b2) (g^2 + 1e-30)  (per row and column for a matrix)
    //   u = g / sqrt(v);  u /= max(1, rms(u));  p -= lr*wd*p;  p -= lr u
    void step(double lr) override;
    OptimizerKind kind() const override { return OptimizerKind::adafactor; }
    std::vector<OptimizerSlot> slots(size_t i) const override;

private:
    double weight_decay_;
};

// Whether train.weight_decay applies to the trainable tensor saved as `name`: transformers'
// Trainer.get_decay_parameter_names leaves out biases and norms by name ("bias", "layernorm",
// "rmsnorm", a ".norm" or "_norm" component); everything else decays, DoRA's 1-D magnitudes too.
// transformers also leaves out every nn.LayerNorm by its type (GPT-2's ln_1); a family whose
// LayerNorm names match none of those patterns needs them added here.
bool weight_decay_applies(const std::string& name);

// train.optim's optimizer over `params` (named as saved) with train's settings (`updated` as Optimizer's).
std::unique_ptr<Optimizer> make_optimizer(const TrainSection& train,
                                          const std::vector<std::pair<std::string, at::Tensor>>& params,
                                          std::vector<bool> updated = {});
// A warning line when train has AdamW settings that train.optim does not use; else empty.
std::string ignored_optimizer_settings_warning(const TrainSection& train);

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
