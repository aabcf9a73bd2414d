#include "grove/generation.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "model/decode_kernels.hpp"
#include "grove/error.hpp"
#include "grove/run_config.hpp"
#include "grove/model.hpp"
#include "grove/tokenizer.hpp"

namespace grove {

namespace {

// HF's logits processors, in generate()'s order: repetition penalty, then temperature, top-k,
// top-p, min-p. `seen` [N, V] bool marks tokens already in the row (prompt and completion);
// `scaled` is logits / temperature, which generate() has already computed, reused when no penalty
// applies (the penalty acts before the temperature).
at::Tensor process_logits(const at::Tensor& raw, const at::Tensor& scaled, const at::Tensor& seen, const SamplingOptions& o) {
    at::Tensor logits = scaled;
    if (o.repetition_penalty != 1.0) {
        at::Tensor float_logits = raw.to(at::kFloat);
        at::Tensor penalised =
            at::where(float_logits > 0, float_logits / o.repetition_penalty, float_logits * o.repetition_penalty);
        logits = at::where(seen, penalised, float_logits) / o.temperature;
    }
    const double neg_inf = -std::numeric_limits<double>::infinity();
    if (o.top_k > 0 && o.top_k < logits.size(-1)) {
        at::Tensor kth = std::get<0>(at::topk(logits, o.top_k, -1)).narrow(-1, o.top_k - 1, 1);
        logits = logits.masked_fill(logits < kth, neg_inf);
    }
    if (o.top_p < 1.0) {
        auto [sorted, order] = at::sort(logits, -1, /*descending=*/false);
        at::Tensor cumulative = sorted.softmax(-1).cumsum(-1);
        at::Tensor remove_sorted = cumulative <= (1.0 - o.top_p);
        remove_sorted.narrow(-1, remove_sorted.size(-1) - 1, 1).fill_(false);  // keep at least one token
        at::Tensor remove = at::zeros_like(remove_sorted).scatter(-1, order, remove_sorted);
        logits = logits.masked_fill(remove, neg_inf);
    }
    if (o.min_p > 0.0) {
        at::Tensor probs = logits.softmax(-1);
        at::Tensor threshold = probs.amax(-1, true) * o.min_p;
        logits = logits.masked_fill(probs < threshold, neg_inf);
    }
    return logits;
}

}  // namespace

SamplingOptions sampling_options(const RunConfig& c) {
    SamplingOptions o;
    o.max_new_tokens = c.generation.max_completion_length;
    o.temperature = c.generation.temperature;
    o.top_p = c.generation.top_p;
    o.top_k = c.generation.top_k;
    o.min_p = c.generation.min_p;
    o.repetition_penalty = c.generation.repetition_penalty;
    o.seed = uint64_t(c.train.seed);
    return o;
}

void set_stop_tokens(SamplingOptions& o, const Model& model, const TokenizerConfig& tokenizer) {
    o.eos_token_ids = model.config().eos_token_ids;
    if (tokenizer.eos_id) o.eos_token_ids.push_back(*tokenizer.eos_id);
    o.pad_token_id = tokenizer.pad_id.value_or(o.eos_token_ids.empty() ? 0 : o.eos_token_ids.front());
}

GenerationResult generate(const Model& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& o) {
    if (prompts.empty()) throw Error(ErrorKind::usage, "generate: no prompts");
    if (o.max_new_tokens < 1) throw Error(ErrorKind::usage, "generate: max_new_tokens must be >= 1");
    if (!o.greedy && !(o.temperature > 0)) throw Error(ErrorKind::usage, "generate: temperature must be > 0");
    at::NoGradGuard no_grad;
    DecodeKernelScope decode_kernels;  // decode steps on the CPU kernels (float32, AVX2)
    const int64_t N = int64_t(prompts.size());
    int64_t P = 0;
    for (const auto& p : prompts) {
        if (p.empty()) throw Error(ErrorKind::usage, "generate: a prompt has no tokens");
        P = std::max<int64_t>(P, int64_t(p.size()));
    }
    const int64_t C = o.max_new_tokens, V = model.config().vocab_size;
    at::Device device = model.device();
    auto long_cpu = at::TensorOptions().dtype(at::kLong);

    // left-padded prompts, mask, positions counted from each row's first real token
    at::Tensor ids = at::full({N, P}, o.pad_token_id, long_cpu);
    at::Tensor mask = at::zeros({N, P + C}, long_cpu);
    for (int64_t b = 0; b < N; ++b) {
        int64_t n = int64_t(prompts[b].size());
        ids[b].narrow(0, P - n, n).copy_(at::tensor(prompts[b], long_cpu));
        mask[b].narrow(0, P - n, n).fill_(1);
    }
    ids = ids.to(device);
    mask = mask.to(device);
    at::Tensor prompt_mask = mask.narrow(1, 0, P);
    at::Tensor positions = (prompt_mask.cumsum(-1) - 1).clamp_min(0);
    at::Tensor next_position = prompt_mask.sum(-1, true);  // [N, 1]
    at::Tensor seen = at::zeros({N, V}, at::TensorOptions().dtype(at::kBool).device(device));
    if (o.repetition_penalty != 1.0) seen.scatter_(1, ids, prompt_mask.to(at::kBool));

    at::Tensor eos = o.eos_token_ids.empty() ? at::Tensor() : at::tensor(o.eos_token_ids, long_cpu).to(device);
    at::Tensor out_ids = at::full({N, C}, o.pad_token_id, long_cpu.device(device));
    at::Tensor out_logp = at::zeros({N, C}, at::TensorOptions().dtype(at::kFloat).device(device));
    at::Tensor finished = at::zeros({N}, at::TensorOptions().dtype(at::kBool).device(device));  // per prompt
    at::Tensor lengths = at::zeros({N}, long_cpu.device(device));
    // one seeded CPU generator: the same uniforms on every device, hence the same completions
    at::Generator generator = at::detail::createCPUGenerator(o.seed);

    // A row that stops leaves the batch (its KV cache, mask, position and seen tokens), so every
    // decode step computes only the rows still sampling; `rows` maps the batch's rows to the prompts'.
    // Short completions in a batch with one long one are the common GRPO case.
    at::Tensor rows = at::arange(N, long_cpu.device(device));
    KVCache cache = model.make_cache(N, P + C);
    const bool filtering = o.repetition_penalty != 1.0 || (o.top_k > 0 && o.top_k < V) || o.top_p < 1.0 || o.min_p > 0.0;
    const bool sampling_kernel = device.is_cpu() && kernels::decode_kernels_available();
    at::Tensor hidden = model.hidden_states(ids, prompt_mask, positions, &cache);
    at::Tensor logits = model.logits(hidden.narrow(1, P - 1, 1)).squeeze(1);
    // log p(token) under the temperature alone, from the scaled logits: what the sampler used
    auto log_probability = [](const at::Tensor& scaled, const at::Tensor& token) {
        return (scaled.gather(-1, token.unsqueeze(-1)) - at::logsumexp(scaled, -1, true)).squeeze(-1);
    };
    int64_t steps = 0;
    for (int64_t t = 0; t < C; ++t) {
        const int64_t A = rows.size(0);
        at::Tensor token, chosen;
        if (o.greedy) {
            at::Tensor scaled = logits.to(at::kFloat);
            token = logits.argmax(-1);
            chosen = log_probability(scaled, token);
        } else {
            // every prompt draws its uniform each step, in or out of the batch: a row's samples do not
            // depend on when the others stopped
            at::Tensor u = at::rand({N, 1}, generator, at::TensorOptions().dtype(at::kDouble)).to(device);
            if (A < N) u = u.index_select(0, rows);
            at::Tensor scaled = logits.to(at::kFloat);
            if (o.temperature != 1.0 && (filtering || !sampling_kernel)) scaled = scaled / o.temperature;
            if (sampling_kernel) {
                // temperature, softmax, inverse CDF and the token's log-probability in one pass per row
                // on the CPU, with no [rows, vocabulary] temporaries (the filters, when set, stay ATen's)
                at::Tensor processed = (filtering ? process_logits(logits, scaled, seen, o) : scaled).contiguous();
                token = at::empty({A}, long_cpu);
                chosen = at::empty({A}, at::TensorOptions().dtype(at::kFloat));
                kernels::sample_softmax(processed.data_ptr<float>(), V, A, V, filtering ? 1.0f : float(o.temperature),
                                        u.data_ptr<double>(), token.data_ptr<int64_t>(), chosen.data_ptr<float>(),
                                        at::get_num_threads());
                if (token.min().item<int64_t>() < 0)
                    throw Error(ErrorKind::runtime, "generate: the model's logits are NaN (or all -inf) at new token " +
                                                        std::to_string(t + 1) + " (a diverged or corrupt checkpoint?)");
                if (filtering)  // the kernel's log-probability is of the filtered logits
                    chosen = log_probability(scaled, token);
            } else {
                at::Tensor probs = process_logits(logits, scaled, seen, o).softmax(-1);
                at::Tensor cdf = probs.to(at::kDouble).cumsum(-1);
                // inverse CDF; clamp guards the rounding of the last bucket
                token = at::searchsorted(cdf, u * cdf.narrow(-1, V - 1, 1)).squeeze(-1).clamp_max(V - 1);
                chosen = log_probability(scaled, token);
            }
        }
        out_ids.select(1, t).index_copy_(0, rows, token);
        out_logp.select(1, t).index_copy_(0, rows, chosen);
        mask.select(1, P + t).fill_(1);
        if (o.repetition_penalty != 1.0) seen.scatter_(1, token.unsqueeze(-1), true);
        steps = t + 1;
        if (eos.defined()) {
            at::Tensor stopped = at::isin(token, eos);
            if (stopped.any().item<bool>()) {
                at::Tensor stopped_rows = rows.masked_select(stopped);
                finished.index_fill_(0, stopped_rows, true);
                lengths.index_fill_(0, stopped_rows, t + 1);
                at::Tensor keep = stopped.logical_not().nonzero().squeeze(-1);
                if (keep.numel() == 0) break;
                rows = rows.index_select(0, keep);
                token = token.index_select(0, keep);
                mask = mask.index_select(0, keep);
                next_position = next_position.index_select(0, keep);
                if (o.repetition_penalty != 1.0) seen = seen.index_select(0, keep);
                for (size_t l = 0; l < cache.keys.size(); ++l) {
                    cache.keys[l] = cache.keys[l].index_select(0, keep);
                    cache.values[l] = cache.values[l].index_select(0, keep);
                }
            }
        }
        if (t + 1 == C) break;
        hidden = model.hidden_states(token.unsqueeze(-1), mask.narrow(1, 0, P + t + 1), next_position, &cache);
        next_position = next_position + 1;
        logits = model.logits(hidden).squeeze(1);
    }
    lengths.masked_fill_(finished.logical_not(), steps);  // the rows still sampling at the end

    GenerationResult r;
    r.completion_ids = out_ids.narrow(1, 0, steps).cpu();
    at::Tensor lengths_cpu = lengths.cpu();
    r.completion_mask = (at::arange(steps, long_cpu).unsqueeze(0) < lengths_cpu.unsqueeze(1)).to(at::kLong);
    r.truncated = finished.logical_not().cpu();
    r.sampled_logprobs = out_logp.narrow(1, 0, steps).cpu();
    r.lengths.assign(lengths_cpu.data_ptr<int64_t>(), lengths_cpu.data_ptr<int64_t>() + N);
    return r;
}

at::Tensor token_logprobs(const Model& model, const at::Tensor& hidden, const at::Tensor& targets, double temperature,
                          int64_t chunk_rows, at::Tensor* entropy) {
    int64_t B = hidden.size(0), T = hidden.size(1), H = hidden.size(2);
    at::Tensor flat_hidden = hidden.reshape({B * T, H});
    at::Tensor flat_targets = targets.reshape({B * T, 1}).to(hidden.device());
    std::vector<at::Tensor> pieces, entropies;
    // one pass even with no positions, so the result stays in the graph of hidden and the head
    for (int64_t start = 0; start == 0 || start < B * T; start += chunk_rows) {
        int64_t n = std::min(chunk_rows, B * T - start);
        at::Tensor logits = at::linear(flat_hidden.narrow(0, start, n), model.lm_head_weight()).to(at::kFloat) / temperature;
        at::Tensor picked = logits.gather(-1, flat_targets.narrow(0, start, n)).squeeze(-1);
        at::Tensor normalizer = at::logsumexp(logits, -1);
        pieces.push_back(picked - normalizer);
        if (entropy) {  // H = logsumexp - sum(p * logits); a metric, so no graph
            at::NoGradGuard no_grad;
            at::Tensor p = at::softmax(logits.detach(), -1);
            entropies.push_back(normalizer.detach() - (p * logits.detach()).sum(-1));
        }
    }
    if (entropy) *entropy = at::cat(entropies).view({B, T});
    return at::cat(pieces).view({B, T});
}

at::Tensor completion_logprobs(const Model& model, const at::Tensor& prompt_ids, const at::Tensor& prompt_mask,
                               const at::Tensor& completion_ids, const at::Tensor& completion_mask, double temperature,
                               at::Tensor* entropy) {
    const int64_t B = prompt_ids.size(0), P = prompt_ids.size(1), C = completion_ids.size(1), L = P + C;
    const at::Device device = model.device();
    // Only real tokens go through the model, packed row after row (Model::packed_hidden_states).
    at::Tensor keep = at::cat({prompt_mask, completion_mask}, 1).cpu().to(at::kBool);  // [B, L]
    at::Tensor kept = keep.reshape(-1).nonzero().squeeze(-1);                          // flat input positions
    at::Tensor row_lengths = keep.sum(1).to(at::kLong).contiguous();
    at::Tensor positions = (keep.to(at::kLong).cumsum(-1) - 1).reshape(-1).index_select(0, kept);
    at::Tensor tokens = at::cat({prompt_ids, completion_ids}, 1).cpu().reshape(-1).index_select(0, kept);
    at::Tensor hidden = model.packed_hidden_states(
        tokens, positions, std::vector<int64_t>(row_lengths.data_ptr<int64_t>(), row_lengths.data_ptr<int64_t>() + B));

    // Completion token t of row b is predicted at input position P - 1 + t. Positions that are masked,
    // or whose predictor is, get log-prob (and entropy) 0; every consumer masks them.
    at::Tensor packed_index = keep.reshape(-1).to(at::kLong).cumsum(0) - 1;  // flat input position -> row of hidden
    at::Tensor scored =
        completion_mask.cpu().to(at::kBool).logical_and(keep.narrow(1, P - 1, C)).reshape(-1).nonzero().squeeze(-1);
    at::Tensor predictor = packed_index.index_select(0, scored.div(C, "floor") * L + P - 1 + scored.remainder(C));
    at::Tensor targets = completion_ids.cpu().reshape(-1).index_select(0, scored);
    at::Tensor scored_entropy;
    at::Tensor logprobs = token_logprobs(model, hidden.index_select(0, predictor.to(device)).unsqueeze(0), targets.unsqueeze(0),
                                         temperature, 1024, entropy ? &scored_entropy : nullptr);
    at::Tensor scored_on_device = scored.to(device);
    auto spread = [&](const at::Tensor& values) {  // [1, M] -> [B, C], zeros elsewhere
        return at::zeros({B * C}, values.options()).index_copy(0, scored_on_device, values.squeeze(0)).view({B, C});
    };
    if (entropy) *entropy = spread(scored_entropy);
    return spread(logprobs);
}

}  // namespace grove
