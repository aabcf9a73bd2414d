#include "grove/policy_loss.hpp"

#include <limits>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "grove/error.hpp"

namespace grove {

PolicyLossResult policy_loss(const at::Tensor& logp, const std::optional<at::Tensor>& old_logp,
                             const std::optional<at::Tensor>& ref_logp, const at::Tensor& advantages, const at::Tensor& mask,
                             const at::Tensor& weights, const PolicyLossOptions& o) {
    if (o.beta != 0.0 && !ref_logp) throw Error(ErrorKind::runtime, "policy_loss: beta != 0 needs reference log-probs");
    at::Tensor m = mask.to(logp.scalar_type());
    at::Tensor old = old_logp ? *old_logp : logp.detach();
    at::Tensor log_ratio = logp - old;
    at::Tensor w;
    bool sequence = o.importance_sampling_level == ImportanceSamplingLevel::sequence;
    if (sequence)
        w = ((log_ratio * m).sum(-1) / m.sum(-1).clamp_min(1.0)).unsqueeze(-1);  // [B, 1]
    else
        w = log_ratio;
    at::Tensor coef_1 = at::exp(w);
    at::Tensor kl;
    if (o.beta != 0.0) {
        at::Tensor d = *ref_logp - logp;
        kl = at::exp(d) - d - 1.0;
        if (o.use_bias_correction_kl) kl = kl * coef_1;  // value unchanged on-policy, gradient corrected
    }
    at::Tensor coef_2 = at::clamp(coef_1, 1.0 - o.epsilon, 1.0 + o.epsilon_high);
    if (o.delta) coef_1 = at::clamp_max(coef_1, *o.delta);           // the clip metrics see the capped ratio, as TRL's
    at::Tensor A = advantages.to(logp.scalar_type()).unsqueeze(-1);  // [B, 1]
    at::Tensor per_token = -at::minimum(coef_1 * A, coef_2 * A);
    if (per_token.size(-1) != logp.size(-1)) per_token = per_token.expand_as(logp);
    if (kl.defined()) per_token = per_token + o.beta * kl;
    PolicyLossResult r;
    r.loss = (weights.to(per_token.scalar_type()) * per_token).sum();

    at::NoGradGuard no_grad;
    r.token_count = m.sum().item<double>();
    r.has_kl = kl.defined();
    if (kl.defined()) r.kl_sum = (kl.detach() * m).sum().item<double>();
    // TRL's clip metrics: low = ratio below 1 - epsilon where A < 0, high = above 1 + epsilon_high where A > 0
    at::Tensor c = coef_1.detach();
    at::Tensor low = (c < 1.0 - o.epsilon).logical_and(A < 0).to(m.scalar_type());
    at::Tensor high = (c > 1.0 + o.epsilon_high).logical_and(A > 0).to(m.scalar_type());
    at::Tensor region = (low + high).clamp_max(1.0);
    if (sequence) {  // [B, 1] values count every row, as TRL's x.mean() (a row without tokens has ratio 1)
        r.clip_count = double(low.size(0));
        r.clip_low_sum = low.sum().item<double>();
        r.clip_high_sum = high.sum().item<double>();
        r.clip_region_sum = region.sum().item<double>();
    } else {
        r.clip_count = r.token_count;
        r.clip_low_sum = (low * m).sum().item<double>();
        r.clip_high_sum = (high * m).sum().item<double>();
        r.clip_region_sum = (region * m).sum().item<double>();
    }
    // each row's share of clipped tokens (NaN for a row without tokens at token level): TRL's
    // clip_ratio/low_min and high_max are the extremes over every row of every process
    auto row_share = [&](const at::Tensor& clipped) {
        return sequence ? clipped.squeeze(-1).to(at::kDouble) : ((clipped * m).sum(-1) / m.sum(-1)).to(at::kDouble);
    };
    auto extreme = [](const at::Tensor& share, bool lowest) {
        at::Tensor valid = share.masked_select(share.isnan().logical_not());
        if (valid.numel() == 0) return std::numeric_limits<double>::quiet_NaN();
        return (lowest ? valid.min() : valid.max()).item<double>();
    };
    r.clip_low_row_min = extreme(row_share(low), true);
    r.clip_high_row_max = extreme(row_share(high), false);
    return r;
}

}  // namespace grove
