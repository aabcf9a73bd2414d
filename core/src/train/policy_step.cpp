#include "train/policy_step.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "grove/distributed.hpp"
#include "grove/generation.hpp"
#include "grove/model.hpp"
#include "grove/plugin_host.hpp"
#include "model/autocast.hpp"

namespace grove {

MicroBatchMetrics micro_batch_metrics(const PolicyLossResult& r, double entropy_sum) { return {r, entropy_sum}; }

namespace {
enum Column { kl, entropy, tokens, low, high, region, clip_count, low_min, high_max, columns };

double nan_extreme(double a, double b, bool lowest) {  // NaN only when both are
    if (std::isnan(a)) return b;
    if (std::isnan(b)) return a;
    return lowest ? std::min(a, b) : std::max(a, b);
}
}  // namespace

std::map<std::string, double> StepMetrics::finish(ProcessGroup* group) const {
    const int64_t A = int64_t(micro_batches_.size());
    at::Tensor local = at::empty({A, columns}, at::kDouble);
    auto cell = local.accessor<double, 2>();
    for (int64_t a = 0; a < A; ++a) {
        const LossStatistics& m = micro_batches_[size_t(a)].loss;
        const double entropy_sum = micro_batches_[size_t(a)].entropy_sum;
        const double values[columns] = {m.kl_sum,       entropy_sum,        m.token_count,
                                        m.clip_low_sum, m.clip_high_sum,    m.clip_region_sum,
                                        m.clip_count,   m.clip_low_row_min, m.clip_high_row_max};
        for (int c = 0; c < columns; ++c) cell[a][c] = values[c];
    }
    const at::Tensor all = group ? group->all_gather_rows(local).contiguous() : local;
    auto all_cell = all.accessor<double, 2>();
    const int64_t ranks = A ? all.size(0) / A : 1;
    std::map<std::string, double> sums;
    for (int64_t a = 0; a < A; ++a) {
        double total[columns] = {0};
        total[low_min] = total[high_max] = std::numeric_limits<double>::quiet_NaN();
        for (int64_t r = 0; r < ranks; ++r) {
            const auto row = all_cell[r * A + a];
            for (int c = kl; c <= clip_count; ++c) total[c] += row[c];
            total[low_min] = nan_extreme(total[low_min], row[low_min], true);
            total[high_max] = nan_extreme(total[high_max], row[high_max], false);
        }
        const double token_divisor = std::max(total[tokens], 1.0), clip_divisor = std::max(total[clip_count], 1.0);
        sums["kl"] += total[kl] / token_divisor;
        sums["entropy"] += total[entropy] / token_divisor;
        sums["clip_ratio/low_mean"] += total[low] / clip_divisor;
        sums["clip_ratio/high_mean"] += total[high] / clip_divisor;
        sums["clip_ratio/region_mean"] += total[region] / clip_divisor;
        sums["clip_ratio/low_min"] += total[low_min];  // NaN propagates, as TRL's nanmin of an all-NaN gather
        sums["clip_ratio/high_max"] += total[high_max];
    }
    std::map<std::string, double> out;
    for (const auto& [key, sum] : sums) out[key] = sum / double(std::max<int64_t>(A, 1));
    if (A == 0 || !micro_batches_[0].loss.has_kl) out.erase("kl");  // logged only with beta != 0
    return out;
}

MicroStepResult train_micro_batch(Model& policy, const MicroBatch& b, const PluginInstance& reduction,
                                  const ReductionCounts& counts, const PolicyLossOptions& options, double temperature,
                                  std::optional<at::DeviceType> autocast) {
    at::Tensor entropy, logp;
    {
        AutocastScope bf16(autocast);  // the forward only; backward follows the recorded dtypes
        logp = completion_logprobs(policy, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask, temperature,
                                   &entropy);
    }
    const at::Tensor mask = b.loss_mask.to(at::kFloat).contiguous();
    const double entropy_sum = (entropy * mask.to(entropy.device())).sum().item<double>();
    std::vector<float> weights;
    reduction.weights(reduction_context(mask.data_ptr<float>(), uint32_t(mask.size(0)), uint32_t(mask.size(1)), counts),
                      weights);
    const at::Device device = logp.device();
    at::Tensor w = at::from_blob(weights.data(), {mask.size(0), mask.size(1)}, at::kFloat).clone().to(device);
    auto on_device = [&](const std::optional<at::Tensor>& t) {
        return t ? std::optional<at::Tensor>(t->to(device)) : std::nullopt;
    };
    PolicyLossResult loss =
        policy_loss(logp, on_device(b.old_logps), on_device(b.ref_logps), b.advantages.to(device), mask.to(device), w, options);
    MicroStepResult out;
    out.loss = loss.loss.item<double>();
    if (!std::isfinite(out.loss)) return out;  // the caller reports it once every rank knows
    loss.loss.backward();
    out.metrics = micro_batch_metrics(loss, entropy_sum);
    return out;
}

}  // namespace grove
