#include "grove/policy_loss.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "grove/distributed.hpp"
#include "grove/error.hpp"
#include "grove/plugin_host.hpp"

namespace grove {

namespace {
// the values a plugin reads: float32, row-major, on the host
at::Tensor host_floats(const at::Tensor& t) { return t.detach().to(at::kCPU, at::kFloat).contiguous(); }

// Every process's values of `local` (1-D), in rank order.
at::Tensor gather_values(const at::Tensor& local, ProcessGroup* group) {
    if (!group) return local;
    const double sentinel = -1e9;  // entropies are >= 0, so it cannot be a value (TRL's choice too)
    const int64_t longest = int64_t(group->max(double(local.numel())));
    at::Tensor padded = at::full({1, longest}, sentinel, local.options());
    padded.narrow(1, 0, local.numel()).copy_(local.unsqueeze(0));
    at::Tensor all = group->all_gather_rows(padded).reshape(-1);
    return all.masked_select(all != sentinel);
}

// TRL's get_high_entropy_mask: the loss's tokens whose entropy reaches the (1 - quantile) quantile
// of every process's loss tokens.
// `mask`: on the host.
at::Tensor top_entropy_mask(const at::Tensor& entropy, const at::Tensor& mask, double quantile, ProcessGroup* group) {
    const at::Tensor values = host_floats(entropy), loss_tokens = mask.to(at::kBool);
    const at::Tensor all = gather_values(values.masked_select(loss_tokens), group);
    if (all.numel() == 0) return at::zeros_like(values);
    const at::Tensor threshold = at::quantile(all, 1.0 - quantile);
    return (values * loss_tokens.to(at::kFloat) >= threshold).logical_and(loss_tokens).to(at::kFloat);
}

// TRL's get_off_policy_mask (DeepSeek-V3.2): [B, 1], 0 for a row with a negative advantage whose
// mean KL(sampler || policy) over its loss tokens exceeds the threshold.
// The values the objective reads, on the host, also what the host's masks are computed from.
struct HostValues {
    at::Tensor logp, mask, advantages, old;  // old: undefined when absent
};

at::Tensor off_policy_mask(const PolicyLossInputs& in, const HostValues& v, double threshold) {
    const at::Tensor sampling = in.sampling_logp ? host_floats(*in.sampling_logp) : v.old.defined() ? v.old : v.logp;
    const at::Tensor kl = at::nan_to_num(sampling - v.logp, 0.0);  // unknown sampling log-probs give no evidence
    const at::Tensor mean_kl = (kl * v.mask).sum(1, true) / v.mask.sum(1, true).clamp_min(1.0);
    return (v.advantages.unsqueeze(1) >= 0).logical_or(mean_kl <= threshold).to(at::kFloat);
}

// The masks on the policy term ([B, T] float on the host; undefined when off): the top-entropy
// tokens, and that times the rows the off-policy mask keeps.
struct PolicyMasks {
    at::Tensor top_entropy, policy;
};
PolicyMasks policy_masks(const PolicyLossInputs& in, const HostValues& v, const PolicyLossOptions& o) {
    PolicyMasks m;
    if (o.top_entropy_quantile < 1.0)
        m.policy = m.top_entropy = top_entropy_mask(in.entropy, v.mask, o.top_entropy_quantile, in.group);
    if (o.off_policy_mask_threshold) {
        const at::Tensor rows = off_policy_mask(in, v, *o.off_policy_mask_threshold).expand({v.mask.size(0), v.mask.size(1)});
        m.policy = m.policy.defined() ? m.policy * rows : rows.contiguous();
    }
    return m;
}

// TRL's entropy bonus: coef x the mean entropy of the trained tokens, divided by the accumulation
// steps (never by a reduction's normaliser). Returns the term to subtract and records its sums.
at::Tensor entropy_bonus(const PolicyLossInputs& in, const at::Tensor& trained, const PolicyLossOptions& o,
                         PolicyLossResult& out) {
    const at::Tensor on_device = trained.to(in.entropy.device());
    const at::Tensor entropy_sum = (in.entropy * on_device).sum();
    out.trained_entropy_sum = entropy_sum.item<double>();
    out.trained_token_count = trained.sum().item<double>();
    return o.entropy_coef * entropy_sum / std::max(out.trained_token_count, 1.0) / double(o.gradient_accumulation_steps);
}
}  // namespace

PolicyLossResult policy_loss(const PluginInstance& objective, const PolicyLossInputs& in, const PolicyLossOptions& o) {
    if (o.beta != 0.0 && !in.ref_logp) throw Error(ErrorKind::runtime, "policy_loss: beta != 0 needs reference log-probs");
    const int64_t B = in.logp.size(0), T = in.logp.size(1);
    const HostValues v{host_floats(in.logp), host_floats(in.mask), host_floats(in.advantages),
                       in.old_logp ? host_floats(*in.old_logp) : at::Tensor()};
    const at::Tensor weight_values = host_floats(in.weights),
                     ref_values = in.ref_logp ? host_floats(*in.ref_logp) : at::Tensor();
    const PolicyMasks masks = policy_masks(in, v, o);
    const at::Tensor ratio_values =
        in.sampling_ratio ? host_floats(*in.sampling_ratio).expand({B, T}).contiguous() : at::Tensor();
    grove_objective_batch batch{};
    batch.struct_size = sizeof(batch);
    batch.rows = uint32_t(B);
    batch.columns = uint32_t(T);
    batch.logp = v.logp.data_ptr<float>();
    batch.old_logp = v.old.defined() ? v.old.data_ptr<float>() : nullptr;
    batch.ref_logp = in.ref_logp ? ref_values.data_ptr<float>() : nullptr;
    batch.mask = v.mask.data_ptr<float>();
    batch.weights = weight_values.data_ptr<float>();
    batch.advantages = v.advantages.data_ptr<float>();
    batch.beta = o.beta;
    batch.epsilon = o.epsilon;
    batch.epsilon_high = o.epsilon_high;
    batch.delta = o.delta ? *o.delta : std::nan("");
    batch.importance_level =
        o.importance_sampling_level == ImportanceSamplingLevel::sequence ? GROVE_IMPORTANCE_SEQUENCE : GROVE_IMPORTANCE_TOKEN;
    batch.use_bias_correction_kl = o.use_bias_correction_kl;
    batch.policy_mask = masks.policy.defined() ? masks.policy.data_ptr<float>() : nullptr;
    batch.sampling_ratio = ratio_values.defined() ? ratio_values.data_ptr<float>() : nullptr;
    ObjectiveResult r = objective.objective_loss(batch);

    PolicyLossResult out;
    out.value = r.loss;
    const at::Tensor grad =
        at::from_blob(r.grad.data(), {B, T}, at::kFloat).to(in.logp.device(), in.logp.scalar_type(), false, true);
    const at::Tensor surrogate = (grad * in.logp).sum();
    out.loss = surrogate - surrogate.detach() + r.loss;
    if (o.entropy_bonus) {
        // the tokens the policy term trains; the off-policy mask is not among them (TRL)
        const at::Tensor trained = masks.top_entropy.defined() ? v.mask * masks.top_entropy : v.mask;
        const at::Tensor bonus = entropy_bonus(in, trained, o, out);
        out.loss = out.loss - bonus;
        out.value -= bonus.item<double>();
    }
    out.metrics.names = objective.info().metric_names;
    out.metrics.sums = std::move(r.metric_sums);
    out.metrics.counts = std::move(r.metric_counts);
    out.metrics.aggregation = std::move(r.metric_aggregation);
    return out;
}

at::Tensor importance_sampling_ratio(const at::Tensor& old_logp, const at::Tensor& sampling_logp, const at::Tensor& mask,
                                     SamplingCorrection mode, std::optional<double> clip_min, std::optional<double> clip_max) {
    if (mode == SamplingCorrection::none) throw Error(ErrorKind::runtime, "importance_sampling_ratio: no correction mode");
    at::Tensor difference = at::nan_to_num((host_floats(old_logp) - host_floats(sampling_logp)) * host_floats(mask), 0.0);
    const bool per_row = mode == SamplingCorrection::sequence_truncate || mode == SamplingCorrection::sequence_mask;
    if (per_row) difference = difference.sum(-1, true);
    at::Tensor ratio = at::exp(difference);
    if (mode == SamplingCorrection::token_truncate || mode == SamplingCorrection::sequence_truncate)
        return at::clamp(ratio, clip_min, clip_max);
    const at::Tensor outside = (ratio < clip_min.value_or(-INFINITY)).logical_or(ratio > clip_max.value_or(INFINITY));
    return ratio.masked_fill(outside, 0.0);
}

SamplingRatioStats sampling_ratio_stats(const at::Tensor& ratio, const at::Tensor& mask) {
    const at::Tensor values =
        ratio.size(1) == 1 ? ratio.reshape(-1) : ratio.masked_select(host_floats(mask).to(at::kBool).to(ratio.device()));
    if (values.numel() == 0) return {};
    return {values.min().item<double>(), values.mean().item<double>(), values.max().item<double>()};
}

void EntropyControl::finish_step(double entropy, const LossSection& loss) {
    if (!loss.use_adaptive_entropy) return;
    coef = entropy <= loss.entropy_target ? std::min(coef + loss.entropy_coef_delta, loss.entropy_coef_max)
                                          : std::max(coef - loss.entropy_coef_delta, loss.entropy_coef_min);
    last_entropy = entropy;
}

}  // namespace grove
