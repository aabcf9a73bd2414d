#include "train/micro_batches.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "grove/distributed.hpp"
#include "grove/error.hpp"
#include "grove/policy_loss.hpp"
#include "grove/model.hpp"

namespace grove {

MicroBatch pad_rollout(const Rollout& rollout, const std::vector<float>& advantages, bool mask_truncated_completions,
                       int64_t pad_token_id) {
    const int64_t N = int64_t(rollout.rows.size());
    int64_t P = 0;
    for (const BatchRow& row : rollout.rows) P = std::max<int64_t>(P, int64_t(row.prompt_ids.size()));
    MicroBatch b;
    b.prompt_ids = at::full({N, P}, pad_token_id, at::kLong);
    b.prompt_mask = at::zeros({N, P}, at::kLong);
    for (int64_t i = 0; i < N; ++i) {
        const std::vector<int64_t>& ids = rollout.rows[size_t(i)].prompt_ids;
        const int64_t n = int64_t(ids.size());
        b.prompt_ids[i].narrow(0, P - n, n).copy_(at::tensor(ids, at::kLong));
        b.prompt_mask[i].narrow(0, P - n, n).fill_(1);
    }
    const GenerationResult& c = rollout.completions;
    b.completion_ids = c.completion_ids;
    b.completion_mask = c.completion_mask.clone();
    if (mask_truncated_completions) b.completion_mask.mul_(c.truncated.logical_not().to(at::kLong).unsqueeze(1));
    b.loss_mask = model_tokens(rollout) * b.completion_mask;
    b.advantages = at::tensor(advantages, at::kFloat);
    auto brings_none = [](const BatchRow& row) { return row.replay && row.replay->sampling_logprobs.empty(); };
    // none at all (a rollouts file without them): the off-policy mask compares with old, as TRL without vLLM
    if (!c.sampled_logprobs.defined() || std::all_of(rollout.rows.begin(), rollout.rows.end(), brings_none)) return b;
    b.sampling_logps = c.sampled_logprobs.to(at::kCPU, at::kFloat, false, true);
    for (size_t i = 0; i < rollout.rows.size(); ++i)  // unknown, as TRL's NaN: no correction, no KL evidence
        if (brings_none(rollout.rows[i])) b.sampling_logps->select(0, int64_t(i)).fill_(NAN);
    return b;
}

std::vector<MicroBatch> split_micro_batches(const MicroBatch& whole, int64_t count, uint64_t shuffle_seed) {
    const int64_t N = whole.prompt_ids.size(0), rows = N / count;
    at::Generator g = at::detail::createCPUGenerator(shuffle_seed);
    at::Tensor order = at::randperm(N, g, at::kLong);
    std::vector<MicroBatch> out;
    for (int64_t s = 0; s < count; ++s) {
        at::Tensor index = order.narrow(0, s * rows, rows);
        MicroBatch b{whole.prompt_ids.index_select(0, index),     whole.prompt_mask.index_select(0, index),
                     whole.completion_ids.index_select(0, index), whole.completion_mask.index_select(0, index),
                     whole.loss_mask.index_select(0, index),      whole.advantages.index_select(0, index)};
        if (whole.sampling_logps) b.sampling_logps = whole.sampling_logps->index_select(0, index);
        out.push_back(std::move(b));
    }
    return out;
}

at::Tensor logprobs_no_grad(const Model& model, const MicroBatch& b, double temperature) {
    at::NoGradGuard no_grad;
    return completion_logprobs(model, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask, temperature);
}

void add_old_and_reference_logprobs(std::vector<MicroBatch>& batches, const LogprobSources& s) {
    for (MicroBatch& b : batches) {
        if (s.need_old) b.old_logps = logprobs_no_grad(*s.policy, b, s.temperature).cpu();
        if (!s.need_reference) continue;
        if (s.reference) {
            b.ref_logps = logprobs_no_grad(*s.reference, b, s.temperature).cpu();
        } else {  // LoRA: the base model is the adapter switched off, and on again whatever happens
            struct AdaptersOff {
                Model& model;
                explicit AdaptersOff(Model& m) : model(m) { model.set_adapters_enabled(false); }
                ~AdaptersOff() { model.set_adapters_enabled(true); }
            } off(*s.policy);
            b.ref_logps = logprobs_no_grad(*s.policy, b, s.temperature).cpu();
        }
    }
}

std::map<std::string, double> add_sampling_ratios(std::vector<MicroBatch>& batches, SamplingCorrection mode,
                                                  std::optional<double> clip_min, std::optional<double> clip_max,
                                                  ProcessGroup* group) {
    if (mode == SamplingCorrection::none) return {};
    std::vector<at::Tensor> ratios, masks;
    for (MicroBatch& b : batches) {
        if (!b.sampling_logps)
            throw Error(ErrorKind::input,
                        "loss.importance_sampling_correction needs the sampler's log-probabilities, and "
                        "these replayed rollouts bring no sampling_logprobs: add them to the file or set "
                        "loss.importance_sampling_correction = \"none\"");
        if (!b.old_logps) throw Error(ErrorKind::runtime, "importance-sampling correction needs the old log-probs");
        b.sampling_ratio = importance_sampling_ratio(*b.old_logps, *b.sampling_logps, b.loss_mask, mode, clip_min, clip_max);
        ratios.push_back(*b.sampling_ratio);
        masks.push_back(b.loss_mask);
    }
    SamplingRatioStats s = sampling_ratio_stats(at::cat(ratios), at::cat(masks));
    if (group) {  // TRL: the least and greatest over ranks, the mean of the ranks' means
        s.min = -group->max(-s.min);
        s.max = group->max(s.max);
        s.mean = group->sum(s.mean) / double(group->world_size());
    }
    return {{"sampling/importance_sampling_ratio/min", s.min},
            {"sampling/importance_sampling_ratio/mean", s.mean},
            {"sampling/importance_sampling_ratio/max", s.max}};
}

std::optional<SamplingDifference> sampling_logprob_difference(const Rollout& rollout, const MicroBatch& whole,
                                                              const Model& model, double temperature, ProcessGroup* group) {
    bool all_given = rollout.replayed() && std::all_of(rollout.rows.begin(), rollout.rows.end(), [](const BatchRow& row) {
                         return row.replay && !row.replay->sampling_logprobs.empty();
                     });
    if (group) all_given = group->max(all_given ? 0.0 : 1.0) == 0.0;  // every rank's rows
    if (!all_given) return std::nullopt;
    const GenerationResult& c = rollout.completions;
    const at::Tensor& sampling = *whole.sampling_logps;  // every row brought them (pad_rollout)
    MicroBatch all_tokens = whole;                       // truncated rows too: the difference is about sampling, not the loss
    all_tokens.completion_mask = c.completion_mask;
    at::Tensor trainer = logprobs_no_grad(model, all_tokens, temperature).cpu();
    at::Tensor mask = model_tokens(rollout).to(at::kFloat);  // as TRL: the model's tokens only
    at::Tensor diff = (trainer - sampling).abs() * mask;
    double sum = diff.sum().item<double>(), count = mask.sum().item<double>(), max = diff.max().item<double>();
    if (group) {
        sum = group->sum(sum);
        count = group->sum(count);
        max = group->max(max);
    }
    return SamplingDifference{sum / std::max(1.0, count), max};
}

}  // namespace grove
