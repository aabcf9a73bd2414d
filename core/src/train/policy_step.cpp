#include "train/policy_step.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "grove/distributed.hpp"
#include "grove/generation.hpp"
#include "grove/model.hpp"
#include "grove/plugin_host.hpp"
#include "model/autocast.hpp"

namespace grove {

namespace {
double nan_extreme(double a, double b, bool lowest) {  // NaN only when both are
    if (std::isnan(a)) return b;
    if (std::isnan(b)) return a;
    return lowest ? std::min(a, b) : std::max(a, b);
}
}  // namespace

std::map<std::string, double> StepMetrics::finish(ProcessGroup* group) const {
    const int64_t A = int64_t(micro_batches_.size());
    const ObjectiveMetrics* first = A ? &micro_batches_[0].objective : nullptr;
    // entropy, tokens, (sum, count) for each objective metric, then the aux loss (NaN: none)
    const int64_t M = first ? int64_t(first->names.size()) : 0, columns = 3 + 2 * M;
    at::Tensor local = at::empty({A, columns}, at::kDouble);
    auto cell = local.accessor<double, 2>();
    for (int64_t a = 0; a < A; ++a) {
        const MicroBatchMetrics& m = micro_batches_[size_t(a)];
        cell[a][0] = m.entropy_sum;
        cell[a][1] = m.token_count;
        for (int64_t k = 0; k < M; ++k) {
            cell[a][2 + 2 * k] = m.objective.sums[size_t(k)];
            cell[a][3 + 2 * k] = m.objective.counts[size_t(k)];
        }
        cell[a][2 + 2 * M] = m.aux_loss.value_or(std::nan(""));
    }
    const at::Tensor all = group ? group->all_gather_rows(local).contiguous() : local;
    auto all_cell = all.accessor<double, 2>();
    const int64_t ranks = A ? all.size(0) / A : 1;
    auto total = [&](int64_t a, int64_t column) {
        double sum = 0;
        for (int64_t r = 0; r < ranks; ++r) sum += all_cell[r * A + a][column];
        return sum;
    };
    std::map<std::string, double> sums;
    for (int64_t a = 0; a < A; ++a) {
        sums["entropy"] += total(a, 0) / std::max(total(a, 1), 1.0);
        if (!std::isnan(all_cell[a][2 + 2 * M]))  // TRL: the mean over processes of each one's aux loss
            sums["aux_loss"] += total(a, 2 + 2 * M) / double(ranks);
        for (int64_t k = 0; k < M; ++k) {
            const uint8_t how = first->aggregation[size_t(k)];
            const std::string& name = first->names[size_t(k)];
            if (how == GROVE_METRIC_MEAN) {
                if (std::isnan(first->counts[size_t(k)])) continue;  // not reported (kl with beta = 0)
                sums[name] += total(a, 2 + 2 * k) / std::max(total(a, 3 + 2 * k), 1.0);
            } else {  // NaN when no process has a value, as TRL's nanmin of an all-NaN gather
                double extreme = std::nan("");
                for (int64_t r = 0; r < ranks; ++r)
                    extreme = nan_extreme(extreme, all_cell[r * A + a][2 + 2 * k], how == GROVE_METRIC_MIN);
                sums[name] += extreme;
            }
        }
    }
    std::map<std::string, double> out;
    for (const auto& [key, sum] : sums) out[key] = sum / double(std::max<int64_t>(A, 1));
    return out;
}

double add_router_aux_loss(PolicyLossResult& loss, const RouterLoad& routing, double coef,
                           uint32_t gradient_accumulation_steps) {
    const at::Tensor aux = routing.balancing_loss().to(loss.loss.device());
    const double scale = coef / double(std::max<uint32_t>(gradient_accumulation_steps, 1));
    const double value = aux.item<double>();
    loss.loss = loss.loss + aux * scale;
    loss.value += value * scale;
    return value;
}

MicroStepResult train_micro_batch(Model& policy, const MicroBatch& b, const MicroStepContext& c) {
    at::Tensor entropy, logp;
    RouterLoad routing;
    RouterLoad* router_load = c.router_aux_loss_coef != 0 ? &routing : nullptr;
    {
        AutocastScope bf16(c.autocast);  // the forward only; backward follows the recorded dtypes
        logp = completion_logprobs(policy, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask, c.temperature,
                                   &entropy, c.loss.entropy_bonus, router_load);
    }
    const at::Tensor mask = b.loss_mask.to(at::kFloat).contiguous();
    const double entropy_sum = (entropy.detach() * mask.to(entropy.device())).sum().item<double>();
    std::vector<float> weights;
    c.reduction.weights(reduction_context(mask.data_ptr<float>(), uint32_t(mask.size(0)), uint32_t(mask.size(1)), c.counts),
                        weights);
    const at::Device device = logp.device();
    auto on_device = [&](const std::optional<at::Tensor>& t) {
        return t ? std::optional<at::Tensor>(t->to(device)) : std::nullopt;
    };
    PolicyLossInputs in;
    in.logp = logp;
    in.entropy = entropy;
    in.old_logp = on_device(b.old_logps);
    in.ref_logp = on_device(b.ref_logps);
    in.sampling_logp = b.sampling_logps;  // read on the host
    in.sampling_ratio = b.sampling_ratio;
    in.advantages = b.advantages.to(device);
    in.mask = mask.to(device);
    in.weights = at::from_blob(weights.data(), {mask.size(0), mask.size(1)}, at::kFloat).clone().to(device);
    in.group = c.group;
    PolicyLossResult loss = policy_loss(c.objective, in, c.loss);
    MicroStepResult out;
    out.loss = loss.value;
    std::optional<double> aux_value;
    if (router_load) {
        aux_value = add_router_aux_loss(loss, routing, c.router_aux_loss_coef, c.counts.gradient_accumulation_steps);
        out.loss = loss.value;
    }
    if (!std::isfinite(out.loss)) return out;  // the caller reports it once every rank knows
    loss.loss.backward();
    out.metrics = {std::move(loss.metrics), entropy_sum, mask.sum().item<double>(), aux_value};
    out.trained_entropy_sum = loss.trained_entropy_sum;
    out.trained_token_count = loss.trained_token_count;
    return out;
}

}  // namespace grove
