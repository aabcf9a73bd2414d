#include "grove/optimizer.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cctype>
#include <regex>
#include <cmath>
#include <stdexcept>
#include <tuple>

namespace grove {

Optimizer::Optimizer(std::vector<at::Tensor> params, std::vector<bool> decays, std::vector<bool> updated)
        : params_(std::move(params)),
          decay_(std::move(decays)),
          updated_(std::move(updated)),
          tensor_steps_(params_.size(), 0) {
    if (updated_.empty()) updated_.assign(params_.size(), true);
    if (updated_.size() != params_.size()) throw std::invalid_argument("Optimizer: one `updated` flag per tensor");
    if (decay_.size() != params_.size()) throw std::invalid_argument("Optimizer: one `decays` flag per tensor");
}

bool weight_decay_applies(const std::string& name) {
    // the patterns transformers searches each parameter's lower-cased name for
    static const std::regex excluded("bias|layernorm|rmsnorm|(^|\\.)norm($|\\.)|_norm($|\\.)");
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    return !std::regex_search(lower, excluded);
}

void Optimizer::allocate_state() {
    state_.assign(params_.size(), {});
    for (size_t i = 0; i < params_.size(); ++i) {
        if (!updated_[i]) continue;
        for (const OptimizerSlot& slot : slots(i))
            state_[i].push_back(at::zeros(slot.shape, params_[i].options().dtype(slot.dtype)));
    }
}

double Optimizer::clip_grad_norm(double max_norm) {
    std::vector<at::Tensor> norms;
    for (const auto& p : params_)
        if (p.grad().defined()) norms.push_back(p.grad().norm().to(at::kDouble));
    double total = norms.empty() ? 0.0 : at::stack(norms).norm().item<double>();
    if (max_norm > 0 && total > max_norm && std::isfinite(total)) {
        at::NoGradGuard no_grad;
        for (auto& p : params_)
            if (p.grad().defined()) p.grad().mul_(max_norm / (total + 1e-6));  // torch's clip_grad_norm_
    }
    return total;
}

void Optimizer::zero_grad() {
    for (auto& p : params_)
        if (p.grad().defined()) p.mutable_grad().reset();
}

std::vector<std::pair<std::string, at::Tensor>> Optimizer::state() const {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (size_t i = 0; i < params_.size(); ++i) {
        if (!updated_[i]) continue;
        const std::vector<OptimizerSlot> named = slots(i);
        for (size_t k = 0; k < named.size(); ++k) out.emplace_back(named[k].name + "." + std::to_string(i), state_[i][k]);
    }
    return out;
}

std::vector<size_t> Optimizer::begin_step() {
    ++steps_;
    std::vector<size_t> stepped;
    for (size_t i = 0; i < params_.size(); ++i) {
        if (!params_[i].grad().defined()) continue;
        ++tensor_steps_[i];
        if (updated_[i]) stepped.push_back(i);
    }
    return stepped;
}

void Optimizer::restore(int64_t steps, std::vector<int64_t> tensor_steps, const std::vector<std::vector<at::Tensor>>& state) {
    if (tensor_steps.size() != params_.size()) throw std::invalid_argument("Optimizer::restore: one step count per tensor");
    at::NoGradGuard no_grad;
    steps_ = steps;
    tensor_steps_ = std::move(tensor_steps);
    for (size_t i = 0; i < params_.size(); ++i) {
        if (!updated_[i]) continue;
        for (size_t k = 0; k < state_[i].size(); ++k) state_[i][k].copy_(state[i][k]);
    }
}

AdamW::AdamW(std::vector<at::Tensor> params, std::vector<bool> decays, AdamWOptions options, std::vector<bool> updated)
        : Optimizer(std::move(params), std::move(decays), std::move(updated)), o_(options) {
    allocate_state();
}

std::vector<OptimizerSlot> AdamW::slots(size_t i) const {
    const at::Tensor& p = params_[i];
    return {{"exp_avg", p.sizes().vec(), p.scalar_type()}, {"exp_avg_sq", p.sizes().vec(), p.scalar_type()}};
}

void AdamW::step(double lr) {
    at::NoGradGuard no_grad;
    for (size_t i : begin_step()) {
        at::Tensor& p = params_[i];
        const double t = double(tensor_steps_[i]);
        const double bias1 = 1.0 - std::pow(o_.beta1, t), bias2 = 1.0 - std::pow(o_.beta2, t);
        at::Tensor g = p.grad();
        at::Tensor &exp_avg = state_[i][0], &exp_avg_sq = state_[i][1];
        if (o_.weight_decay != 0.0 && decay_[i]) p.mul_(1.0 - lr * o_.weight_decay);
        exp_avg.mul_(o_.beta1).add_(g, 1.0 - o_.beta1);
        exp_avg_sq.mul_(o_.beta2).addcmul_(g, g, 1.0 - o_.beta2);
        at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias2)).add_(o_.epsilon);
        p.addcdiv_(exp_avg, denom, -lr / bias1);
    }
}

Adafactor::Adafactor(std::vector<at::Tensor> params, std::vector<bool> decays, double weight_decay, std::vector<bool> updated)
        : Optimizer(std::move(params), std::move(decays), std::move(updated)), weight_decay_(weight_decay) {
    allocate_state();
}

std::vector<OptimizerSlot> Adafactor::slots(size_t i) const {
    const std::vector<int64_t> shape = params_[i].sizes().vec();
    if (shape.size() < 2) return {{"exp_avg_sq", shape, at::kFloat}};
    std::vector<int64_t> row(shape.begin(), shape.end() - 1), column(shape.begin(), shape.end() - 2);
    column.push_back(shape.back());
    return {{"exp_avg_sq_row", row, at::kFloat}, {"exp_avg_sq_col", column, at::kFloat}};
}

namespace {
// root mean square of a tensor's elements, as a 0-d tensor (no device sync)
at::Tensor rms(const at::Tensor& t) { return t.norm(2) / std::sqrt(double(t.numel())); }
// Adafactor's fixed settings under Trainer (transformers' defaults)
constexpr double kAdafactorEps = 1e-30, kAdafactorClip = 1.0, kAdafactorDecayRate = -0.8;
}  // namespace

void Adafactor::step(double lr) {
    at::NoGradGuard no_grad;
    for (size_t i : begin_step()) {
        at::Tensor& p = params_[i];
        const double beta2 = 1.0 - std::pow(double(tensor_steps_[i]), kAdafactorDecayRate);
        const at::Tensor g = p.grad().to(at::kFloat);
        at::Tensor update = g.pow(2).add_(kAdafactorEps);
        if (state_[i].size() == 2) {  // a matrix: the row and column means stand for the whole
            at::Tensor &row = state_[i][0], &column = state_[i][1];
            row.mul_(beta2).add_(update.mean(-1), 1.0 - beta2);
            column.mul_(beta2).add_(update.mean(-2), 1.0 - beta2);
            const at::Tensor row_factor = (row / row.mean(-1, true)).rsqrt_().unsqueeze(-1);
            update = row_factor * column.unsqueeze(-2).rsqrt();
            update.mul_(g);
        } else {
            at::Tensor& squares = state_[i][0];
            squares.mul_(beta2).add_(update, 1.0 - beta2);
            update = squares.rsqrt().mul_(g);
        }
        update.div_((rms(update) / kAdafactorClip).clamp_(1.0));
        update.mul_(lr);
        at::Tensor weights = p.scalar_type() == at::kFloat ? p : p.to(at::kFloat);  // as transformers updates half types
        if (weight_decay_ != 0.0 && decay_[i]) weights.add_(weights, -weight_decay_ * lr);
        weights.sub_(update);
        if (!weights.is_same(p)) p.copy_(weights);
    }
}

std::unique_ptr<Optimizer> make_optimizer(const TrainSection& t, const std::vector<std::pair<std::string, at::Tensor>>& params,
                                          std::vector<bool> updated) {
    std::vector<at::Tensor> tensors;
    std::vector<bool> decays;
    for (const auto& [name, tensor] : params) {
        tensors.push_back(tensor);
        decays.push_back(weight_decay_applies(name));
    }
    if (t.optim == OptimizerKind::adafactor)
        return std::make_unique<Adafactor>(std::move(tensors), std::move(decays), t.weight_decay, std::move(updated));
    return std::make_unique<AdamW>(std::move(tensors), std::move(decays),
                                   AdamWOptions{t.adam_beta1, t.adam_beta2, t.adam_epsilon, t.weight_decay},
                                   std::move(updated));
}

std::string ignored_optimizer_settings_warning(const TrainSection& t) {
    const TrainSection defaults;
    if (t.optim != OptimizerKind::adafactor) return "";
    std::string keys;
    for (const auto& [value, fallback, key] : {std::tuple{t.adam_beta1, defaults.adam_beta1, "adam_beta1"},
                                               {t.adam_beta2, defaults.adam_beta2, "adam_beta2"},
                                               {t.adam_epsilon, defaults.adam_epsilon, "adam_epsilon"}})
        if (value != fallback) keys += std::string(keys.empty() ? "" : ", ") + "train." + key;
    if (keys.empty()) return "";
    return "grove: warning: train.optim = \"adafactor\" does not use " + keys +
           " (AdamW's settings; transformers' Trainer ignores them for Adafactor too)\n";
}

std::vector<int> shard_owners(const std::vector<at::Tensor>& params, int world_size) {
    std::vector<size_t> largest_first(params.size());
    for (size_t i = 0; i < params.size(); ++i) largest_first[i] = i;
    std::stable_sort(largest_first.begin(), largest_first.end(),
                     [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
    std::vector<int64_t> load(size_t(world_size), 0);
    std::vector<int> owners(params.size(), 0);
    for (size_t i : largest_first) {
        const int rank = int(std::min_element(load.begin(), load.end()) - load.begin());  // the first least loaded
        owners[i] = rank;
        load[size_t(rank)] += params[i].numel();
    }
    return owners;
}

namespace {
// factor in [0, 1] mapped onto [floor, 1] (transformers' min_lr_rate, min_lr_ratio), never below 0
double above_floor(double factor, double floor) { return std::max(0.0, factor * (1.0 - floor) + floor); }

// transformers' _get_wsd_scheduler_lambda: each curve from 0 to 1 over its phase, scaled into [min_lr_ratio, 1]
double wsd_multiplier(int64_t step, int64_t warmup, int64_t total, const LrSchedulerOptions& o) {
    const int64_t decay = o.num_decay_steps.value_or(0), stable = o.num_stable_steps.value_or(total - warmup - decay);
    auto scaled = [&](double factor) { return above_floor(factor, o.min_lr_ratio); };
    if (step < warmup) {
        const double progress = double(step) / double(std::max<int64_t>(1, warmup));
        switch (o.warmup_type) {
            case WsdCurve::linear:
                return scaled(progress);
            case WsdCurve::cosine:
                return scaled(0.5 * (1.0 - std::cos(M_PI * progress)));
            case WsdCurve::one_minus_sqrt:
                return scaled(1.0 - std::sqrt(1.0 - progress));
        }
    }
    if (step < warmup + stable) return 1.0;
    if (step < warmup + stable + decay) {
        const double progress = double(step - warmup - stable) / double(std::max<int64_t>(1, decay));
        switch (o.decay_type) {
            case WsdCurve::linear:
                return scaled(1.0 - progress);
            case WsdCurve::cosine:
                return scaled(0.5 * (1.0 + std::cos(M_PI * progress)));  // half a cosine (num_cycles 0.5)
            case WsdCurve::one_minus_sqrt:
                return scaled(1.0 - std::sqrt(progress));
        }
    }
    return o.min_lr_ratio;
}

// transformers' cosine_warmup_with_min_lr: counts each step as done (step + 1) in warmup and decay
double cosine_warmup_with_min_lr_multiplier(int64_t step, int64_t warmup, int64_t total, const LrSchedulerOptions& o) {
    if (step < warmup) {
        if (!o.warmup_lr_rate) return double(step + 1) / double(std::max<int64_t>(1, warmup));
        return *o.warmup_lr_rate + (1.0 - *o.warmup_lr_rate) * double(step) / double(std::max<int64_t>(1, warmup - 1));
    }
    const double progress = double(step - warmup + 1) / double(std::max<int64_t>(1, total - warmup));
    return above_floor(0.5 * (1.0 + std::cos(M_PI * progress)), o.min_lr_rate.value_or(0.0));
}
}  // namespace

double learning_rate_multiplier(LrSchedule schedule, int64_t step, int64_t warmup, int64_t total, const LrSchedulerOptions& o,
                                double peak) {
    if (schedule == LrSchedule::constant) return 1.0;  // transformers' get_constant_schedule: no warmup
    if (schedule == LrSchedule::warmup_stable_decay) return wsd_multiplier(step, warmup, total, o);
    if (schedule == LrSchedule::cosine_warmup_with_min_lr) return cosine_warmup_with_min_lr_multiplier(step, warmup, total, o);
    if (step < warmup) return double(step) / double(std::max<int64_t>(1, warmup));
    if (schedule == LrSchedule::constant_with_warmup) return 1.0;
    if (schedule == LrSchedule::inverse_sqrt) {  // get_scheduler passes it no kwargs: its timescale is the warmup
        const double timescale = double(warmup > 0 ? warmup : 10000);
        return 1.0 / std::sqrt((double(step) + timescale - double(warmup)) / timescale);
    }
    double progress = double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
    const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
    if (schedule == LrSchedule::cosine) return std::max(0.0, cosine);
    if (schedule == LrSchedule::cosine_with_min_lr) return above_floor(cosine, o.min_lr_rate.value_or(0.0));
    if (schedule == LrSchedule::cosine_with_restarts)
        return progress >= 1.0 ? 0.0
                               : std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * std::fmod(double(o.num_cycles) * progress, 1.0))));
    if (schedule == LrSchedule::polynomial) {
        if (step > total) return o.lr_end / peak;
        return ((peak - o.lr_end) * std::pow(1.0 - progress, o.power) + o.lr_end) / peak;
    }
    return std::max(0.0, double(total - step) / double(std::max<int64_t>(1, total - warmup)));  // linear
}

LearningRateSchedule LearningRateSchedule::of(const TrainSection& train, int64_t total) {
    LearningRateSchedule s;
    s.type = train.lr_scheduler_type;
    s.peak = train.learning_rate;
    s.options = train.lr_scheduler_kwargs;
    s.total = total;
    s.warmup = train.warmup_steps > 0 ? train.warmup_steps : int64_t(std::ceil(train.warmup_ratio * double(total)));
    return s;
}

std::string LearningRateSchedule::ignored_warmup_warning() const {
    if (warmup == 0 || type != LrSchedule::constant) return "";
    return "grove: warning: train.lr_scheduler_type = \"constant\" has no warmup, as in transformers (Grove warmed it "
           "up before 2026-11-25), so the " +
           std::to_string(warmup) + " warmup steps are not taken; use \"constant_with_warmup\" to warm up\n";
}

}  // namespace grove
