#include "grove/policy_loss.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "grove/error.hpp"
#include "grove/plugin_host.hpp"

namespace grove {

PolicyLossResult policy_loss(const PluginInstance& objective, const at::Tensor& logp, const std::optional<at::Tensor>& old_logp,
                             const std::optional<at::Tensor>& ref_logp, const at::Tensor& advantages, const at::Tensor& mask,
                             const at::Tensor& weights, const PolicyLossOptions& o) {
    if (o.beta != 0.0 && !ref_logp) throw Error(ErrorKind::runtime, "policy_loss: beta != 0 needs reference log-probs");
    // the values the objective reads: float32, row-major, on the host
    auto host = [](const at::Tensor& t) { return t.detach().to(at::kCPU, at::kFloat).contiguous(); };
    const at::Tensor logp_values = host(logp), mask_values = host(mask), weight_values = host(weights),
                     advantage_values = host(advantages);
    const at::Tensor old_values = old_logp ? host(*old_logp) : at::Tensor(),
                     ref_values = ref_logp ? host(*ref_logp) : at::Tensor();
    grove_objective_batch batch{};
    batch.struct_size = sizeof(batch);
    batch.rows = uint32_t(logp.size(0));
    batch.columns = uint32_t(logp.size(1));
    batch.logp = logp_values.data_ptr<float>();
    batch.old_logp = old_logp ? old_values.data_ptr<float>() : nullptr;
    batch.ref_logp = ref_logp ? ref_values.data_ptr<float>() : nullptr;
    batch.mask = mask_values.data_ptr<float>();
    batch.weights = weight_values.data_ptr<float>();
    batch.advantages = advantage_values.data_ptr<float>();
    batch.beta = o.beta;
    batch.epsilon = o.epsilon;
    batch.epsilon_high = o.epsilon_high;
    batch.delta = o.delta ? *o.delta : std::nan("");
    batch.importance_level =
        o.importance_sampling_level == ImportanceSamplingLevel::sequence ? GROVE_IMPORTANCE_SEQUENCE : GROVE_IMPORTANCE_TOKEN;
    batch.use_bias_correction_kl = o.use_bias_correction_kl;
    ObjectiveResult r = objective.objective_loss(batch);

    PolicyLossResult out;
    out.value = r.loss;
    const at::Tensor grad = at::from_blob(r.grad.data(), {logp.size(0), logp.size(1)}, at::kFloat)
                                .to(logp.device(), logp.scalar_type(), false, true);
    const at::Tensor surrogate = (grad * logp).sum();
    out.loss = surrogate - surrogate.detach() + r.loss;
    out.metrics.names = objective.info().metric_names;
    out.metrics.sums = std::move(r.metric_sums);
    out.metrics.counts = std::move(r.metric_counts);
    out.metrics.aggregation = std::move(r.metric_aggregation);
    return out;
}

}  // namespace grove
