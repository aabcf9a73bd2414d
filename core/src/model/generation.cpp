#include "grove/generation.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <map>
#include <optional>

#include "model/autocast.hpp"
#include "model/decode_kernels.hpp"
#include "model/sampling.hpp"
#include "model/static_decode.hpp"
#include "grove/error.hpp"
#include "grove/run_config.hpp"
#include "grove/model.hpp"
#include "grove/tokenizer.hpp"

namespace grove {

namespace detail {

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

bool filters_logits(const SamplingOptions& o, int64_t V) {
    return o.repetition_penalty != 1.0 || (o.top_k > 0 && o.top_k < V) || o.top_p < 1.0 || o.min_p > 0.0;
}

at::Tensor log_probability(const at::Tensor& scaled, const at::Tensor& token) {
    return (scaled.gather(-1, token.unsqueeze(-1)) - at::logsumexp(scaled, -1, true)).squeeze(-1);
}

void check_generation_length(const Model& model, const std::vector<std::vector<int64_t>>& prompts, int64_t max_new_tokens) {
    size_t longest = 0;
    for (const auto& p : prompts) longest = std::max(longest, p.size());
    model.check_sequence_length(int64_t(longest) + max_new_tokens - 1);
}

LeftPadded left_pad(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_token_id, int64_t extra_columns,
                    int64_t vocab_size) {
    if (prompts.empty()) throw Error(ErrorKind::usage, "generate: no prompts");
    const int64_t N = int64_t(prompts.size());
    LeftPadded out;
    for (const auto& p : prompts) {
        if (p.empty()) throw Error(ErrorKind::usage, "generate: a prompt has no tokens");
        for (int64_t id : p)  // the embedding would index past its rows
            if (id < 0 || id >= vocab_size)
                throw Error(ErrorKind::input, "generate: a prompt holds token id " + std::to_string(id) +
                                                  ", outside the model's vocabulary [0, " + std::to_string(vocab_size) +
                                                  "): the tokenizer files do not belong to this model (config.json's "
                                                  "vocab_size); use the checkpoint's own tokenizer");
        out.width = std::max<int64_t>(out.width, int64_t(p.size()));
    }
    const auto long_options = at::TensorOptions().dtype(at::kLong);
    out.ids = at::full({N, out.width}, pad_token_id, long_options);
    out.mask = at::zeros({N, out.width + extra_columns}, long_options);
    for (int64_t b = 0; b < N; ++b) {
        const int64_t n = int64_t(prompts[size_t(b)].size());
        out.ids[b].narrow(0, out.width - n, n).copy_(at::tensor(prompts[size_t(b)], long_options));
        out.mask[b].narrow(0, out.width - n, n).fill_(1);
    }
    return out;
}

namespace {
// The dtype the output layer's product runs in: autocast's on the hidden states' device, else theirs.
at::ScalarType product_dtype(const at::Tensor& hidden) {
    const at::DeviceType device = hidden.device().type();
    return at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : hidden.scalar_type();
}

// [rows, vocab] float32 logits / temperature of a chunk of hidden rows; the weight is already in the
// product's dtype
at::Tensor scaled_logits(const at::Tensor& hidden, const at::Tensor& weight_in_dtype, double temperature) {
    return at::linear(hidden.to(weight_in_dtype.scalar_type()), weight_in_dtype).to(at::kFloat) / temperature;
}

// log p(target) with the output layer's logits recomputed in the backward pass: the forward keeps
// only its inputs and each row's log-normaliser, where autograd would keep every chunk's float32
// logits until the backward (5 GB at 8,192 positions and a 150k vocabulary). The backward is
// autograd's, chunk by chunk: d logp / d logits = onehot(target) - softmax, divided by the
// temperature, through the product in its dtype; the head's gradient is summed in float32.
struct RecomputedLogprobs : torch::autograd::Function<RecomputedLogprobs> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                              const at::Tensor& targets, double temperature, int64_t chunk_rows) {
        const at::ScalarType dtype = product_dtype(hidden);
        const at::Tensor weight_in_dtype = weight.to(dtype);
        const int64_t M = hidden.size(0);
        at::Tensor logp = at::empty({M}, hidden.options().dtype(at::kFloat));
        at::Tensor normalizer = at::empty({M}, logp.options());
        for (int64_t start = 0; start < M; start += chunk_rows) {
            const int64_t n = std::min(chunk_rows, M - start);
            at::Tensor logits = scaled_logits(hidden.narrow(0, start, n), weight_in_dtype, temperature);
            at::Tensor norm = at::logsumexp(logits, -1);
            normalizer.narrow(0, start, n).copy_(norm);
            logp.narrow(0, start, n).copy_(logits.gather(-1, targets.narrow(0, start, n)).squeeze(-1) - norm);
        }
        ctx->save_for_backward({hidden, weight, targets, normalizer});
        ctx->saved_data["temperature"] = temperature;
        ctx->saved_data["chunk_rows"] = chunk_rows;
        ctx->saved_data["dtype"] = int64_t(dtype);
        return logp;
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grad_outputs) {
        const auto saved = ctx->get_saved_variables();
        const at::Tensor &hidden = saved[0], &weight = saved[1], &targets = saved[2], &normalizer = saved[3];
        const double temperature = ctx->saved_data["temperature"].toDouble();
        const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
        const auto dtype = at::ScalarType(ctx->saved_data["dtype"].toInt());
        const at::Tensor grad = grad_outputs[0].to(at::kFloat);
        const at::Tensor weight_in_dtype = weight.to(dtype);
        const bool want_hidden = ctx->needs_input_grad(0), want_weight = ctx->needs_input_grad(1);
        at::Tensor grad_hidden = want_hidden ? at::empty_like(hidden) : at::Tensor();
        at::Tensor grad_weight = want_weight ? at::zeros(weight.sizes(), weight.options().dtype(at::kFloat)) : at::Tensor();
        const int64_t M = hidden.size(0);
        for (int64_t start = 0; start < M; start += chunk_rows) {
            const int64_t n = std::min(chunk_rows, M - start);
            const at::Tensor h = hidden.narrow(0, start, n).to(dtype), g = grad.narrow(0, start, n).unsqueeze(-1);
            at::Tensor logits = scaled_logits(h, weight_in_dtype, temperature);
            at::Tensor d_logits = (logits - normalizer.narrow(0, start, n).unsqueeze(-1)).exp_().mul_(g).neg_();
            d_logits.scatter_add_(1, targets.narrow(0, start, n), g);
            const at::Tensor d_product = (d_logits / temperature).to(dtype);
            if (want_hidden) grad_hidden.narrow(0, start, n).copy_(d_product.mm(weight_in_dtype));
            if (want_weight) grad_weight.add_(d_product.t().mm(h).to(at::kFloat));
        }
        return {grad_hidden, want_weight ? grad_weight.to(weight.scalar_type()) : at::Tensor(), at::Tensor(), at::Tensor(),
                at::Tensor()};
    }
};
}  // namespace

at::Tensor recomputed_token_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                     double temperature, int64_t chunk_rows) {
    return RecomputedLogprobs::apply(hidden, weight, targets, temperature, chunk_rows);
}

}  // namespace detail

using detail::log_probability;
using detail::process_logits;

SamplingOptions sampling_options(const RunConfig& c) {
    SamplingOptions o;
    o.max_new_tokens = c.generation.max_completion_length;
    o.temperature = c.generation.temperature;
    o.top_p = c.generation.top_p;
    o.top_k = c.generation.top_k;
    o.min_p = c.generation.min_p;
    o.repetition_penalty = c.generation.repetition_penalty;
    o.seed = uint64_t(c.train.seed);
    o.cuda_graphs = c.generation.cuda_graphs;
    o.split_attention = c.generation.split_attention;
    return o;
}

void set_stop_tokens(SamplingOptions& o, const Model& model, const TokenizerConfig& tokenizer) {
    o.eos_token_ids = model.config().eos_token_ids;
    if (tokenizer.eos_id) o.eos_token_ids.push_back(*tokenizer.eos_id);
    o.pad_token_id = tokenizer.pad_id.value_or(o.eos_token_ids.empty() ? 0 : o.eos_token_ids.front());
}

// The session's state. The live batch holds the rows sampling now; a row that ends its turn leaves
// it (its KV cache, mask, position and seen tokens), so every decode step computes only the rows
// still sampling (short completions in a batch with one long one are the common GRPO case). A
// resumable session parks those rows until continue_rows() brings them back.
struct DecodeSession::State {
    // a batch of rows: the live one, or one parked group
    struct Batch {
        at::Tensor rows;           // [A] prompt index of each batch row
        KVCache cache;             // [A, ...]; cache.length columns filled
        at::Tensor mask;           // [A, capacity] long, 1 where a column holds a real token
        at::Tensor next_position;  // [A, 1]
        at::Tensor seen;           // [A, V] bool, tokens in the row (repetition penalty only)
        at::Tensor last_token;     // [A] the turn's last token, not yet in the cache (parked rows)
        int64_t turn_start = 0;    // the cache column of the turn's first token (parked rows)
        int64_t size() const { return rows.defined() ? rows.size(0) : 0; }
    };

    State(const Model& m, const SamplingOptions& options, bool resumable, int64_t room)
            : model(m),
              o(options),
              resumable(resumable),
              room(std::max<int64_t>(room, 1)),
              N(0),
              V(m.config().vocab_size),
              device(m.device()),
              generator(at::detail::createCPUGenerator(options.seed)) {}

    const Model& model;
    SamplingOptions o;
    bool resumable;
    int64_t room;  // new tokens a continued batch makes room for before its cache grows
    int64_t N, V;
    at::Device device;
    // one seeded CPU generator: the same uniforms on every device, hence the same samples
    at::Generator generator;
    at::Tensor eos;  // stop tokens on the device; undefined when none
    Batch live;
    at::Tensor logits;  // [A, V] the live rows' next-token logits
    std::vector<Batch> parked;

    void ensure_capacity(int64_t needed);
    at::Tensor sample(int64_t step, at::Tensor& chosen);
    // rows `keep` of b; `trimmed` keeps only the filled cache columns (a parked group never grows)
    Batch select(const Batch& b, const at::Tensor& keep, bool trimmed = false) const;
};

namespace {
auto long_options() { return at::TensorOptions().dtype(at::kLong); }
}  // namespace

// The cache and mask grow (zero-filled) when a turn or an observation would pass their capacity.
void DecodeSession::State::ensure_capacity(int64_t needed) {
    KVCache& cache = live.cache;
    if (needed <= cache.capacity) return;
    const int64_t capacity = std::max(needed, cache.capacity + cache.capacity / 2);
    for (auto* tensors : {&cache.keys, &cache.values})
        for (at::Tensor& t : *tensors) {
            at::Tensor grown = at::zeros({t.size(0), t.size(1), capacity, t.size(3)}, t.options());
            grown.narrow(2, 0, cache.length).copy_(t.narrow(2, 0, cache.length));
            t = grown;
        }
    at::Tensor mask = at::zeros({live.size(), capacity}, live.mask.options());
    mask.narrow(1, 0, live.mask.size(1)).copy_(live.mask);
    live.mask = mask;
    cache.capacity = capacity;
}

DecodeSession::State::Batch DecodeSession::State::select(const Batch& b, const at::Tensor& keep, bool trimmed) const {
    const int64_t columns = trimmed ? b.cache.length : b.cache.capacity;
    Batch s;
    s.rows = b.rows.index_select(0, keep);
    s.mask = b.mask.narrow(1, 0, columns).index_select(0, keep);
    s.next_position = b.next_position.index_select(0, keep);
    if (b.seen.defined()) s.seen = b.seen.index_select(0, keep);
    s.cache.length = b.cache.length;
    s.cache.capacity = columns;
    for (size_t l = 0; l < b.cache.keys.size(); ++l) {
        s.cache.keys.push_back(b.cache.keys[l].narrow(2, 0, columns).index_select(0, keep));
        s.cache.values.push_back(b.cache.values[l].narrow(2, 0, columns).index_select(0, keep));
    }
    return s;
}

// One token for every live row from `logits`; `chosen` gets its log-probability under the
// temperature. Every prompt draws its uniform each step, live or not: a row's samples do not depend
// on when the others stopped.
at::Tensor DecodeSession::State::sample(int64_t step, at::Tensor& chosen) {
    const int64_t A = live.size();
    if (o.greedy) {
        at::Tensor token = logits.argmax(-1);
        chosen = log_probability(logits.to(at::kFloat), token);
        return token;
    }
    at::Tensor u = at::rand({N, 1}, generator, at::TensorOptions().dtype(at::kDouble)).to(device);
    if (A < N) u = u.index_select(0, live.rows);
    const bool filter = detail::filters_logits(o, V), sampling_kernel = device.is_cpu() && kernels::decode_kernels_available();
    at::Tensor scaled = logits.to(at::kFloat);
    if (o.temperature != 1.0 && (filter || !sampling_kernel)) scaled = scaled / o.temperature;
    at::Tensor token;
    if (sampling_kernel) {
        // temperature, softmax, inverse CDF and the token's log-probability in one pass per row on
        // the CPU, with no [rows, vocabulary] temporaries (the filters, when set, stay ATen's)
        at::Tensor processed = (filter ? process_logits(logits, scaled, live.seen, o) : scaled).contiguous();
        token = at::empty({A}, long_options());
        chosen = at::empty({A}, at::TensorOptions().dtype(at::kFloat));
        kernels::sample_softmax(processed.data_ptr<float>(), V, A, V, filter ? 1.0f : float(o.temperature),
                                u.data_ptr<double>(), token.data_ptr<int64_t>(), chosen.data_ptr<float>(),
                                at::get_num_threads());
        if (token.min().item<int64_t>() < 0)
            throw Error(ErrorKind::runtime, "generate: the model's logits are NaN (or all -inf) at decode step " +
                                                std::to_string(step + 1) + " (a diverged or corrupt checkpoint?)");
        if (filter) chosen = log_probability(scaled, token);  // the kernel's is of the filtered logits
        return token;
    }
    at::Tensor probs = process_logits(logits, scaled, live.seen, o).softmax(-1);
    at::Tensor cdf = probs.to(at::kDouble).cumsum(-1);
    // inverse CDF; clamp guards the rounding of the last bucket
    token = at::searchsorted(cdf, u * cdf.narrow(-1, V - 1, 1)).squeeze(-1).clamp_max(V - 1);
    chosen = log_probability(scaled, token);
    return token;
}

DecodeSession::DecodeSession(const Model& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& o,
                             int64_t capacity, bool resumable)
        : s_(std::make_unique<State>(model, o, resumable, capacity)) {
    if (!o.greedy && !(o.temperature > 0)) throw Error(ErrorKind::usage, "generate: temperature must be > 0");
    at::NoGradGuard no_grad;
    DecodeKernelScope decode_kernels;
    State& s = *s_;
    // left-padded prompts, mask, positions counted from each row's first real token
    detail::LeftPadded padded =
        detail::left_pad(prompts, o.pad_token_id, std::max<int64_t>(capacity, 1), model.config().vocab_size);
    const int64_t N = s.N = int64_t(prompts.size()), P = padded.width;
    State::Batch& live = s.live;
    at::Tensor ids = padded.ids.to(s.device);
    live.mask = padded.mask.to(s.device);
    at::Tensor prompt_mask = live.mask.narrow(1, 0, P);
    live.next_position = prompt_mask.sum(-1, true);  // [N, 1]
    live.rows = at::arange(N, long_options().device(s.device));
    if (o.repetition_penalty != 1.0) {
        // scatter_add, not scatter_: a padding position shares its id with real tokens (pad = EOS), and
        // which of two writes to one place wins is unspecified on CUDA
        live.seen = at::zeros({N, s.V}, ids.options()).scatter_add_(1, ids, prompt_mask) > 0;
    }
    if (!o.eos_token_ids.empty()) s.eos = at::tensor(o.eos_token_ids, long_options()).to(s.device);
    live.cache = model.make_cache(N, live.mask.size(1));
    at::Tensor positions = (prompt_mask.cumsum(-1) - 1).clamp_min(0);
    at::Tensor hidden = model.hidden_states(ids, prompt_mask, positions, &live.cache);
    s.logits = model.logits(hidden.narrow(1, P - 1, 1)).squeeze(1);
}

DecodeSession::~DecodeSession() = default;

std::vector<DecodeSession::Turn> DecodeSession::sample_turn(const std::vector<int64_t>& limits, const StopCheck& stop,
                                                            bool last_turn) {
    State& s = *s_;
    if (int64_t(limits.size()) != s.N) throw Error(ErrorKind::usage, "sample_turn: one limit per row");
    std::vector<Turn> turns(size_t(s.N));
    if (s.live.size() == 0) return turns;
    at::NoGradGuard no_grad;
    DecodeKernelScope decode_kernels;
    State::Batch& live = s.live;
    const at::Tensor live_rows = live.rows.cpu().contiguous();
    int64_t longest = 0;
    for (int64_t i = 0; i < live_rows.size(0); ++i) {
        const int64_t limit = limits[size_t(live_rows.data_ptr<int64_t>()[i])];
        if (limit < 1) throw Error(ErrorKind::usage, "sample_turn: a live row's limit must be >= 1");
        longest = std::max(longest, limit);
    }
    const auto device_long = long_options().device(s.device);
    at::Tensor row_limits = at::tensor(limits, long_options()).to(s.device).index_select(0, live.rows);
    at::Tensor out_ids = at::full({s.N, longest}, s.o.pad_token_id, device_long);
    at::Tensor out_logp = at::zeros({s.N, longest}, at::TensorOptions().dtype(at::kFloat).device(s.device));
    at::Tensor lengths = at::zeros({s.N}, device_long), ended_eos = at::zeros({s.N}, device_long.dtype(at::kBool));
    s.ensure_capacity(live.cache.length + longest);
    const int64_t turn_start = live.cache.length;
    std::vector<std::vector<int64_t>> so_far(stop ? size_t(s.N) : 0);  // each row's turn, for `stop`
    for (int64_t t = 0; t < longest; ++t) {
        at::Tensor chosen;
        at::Tensor token = s.sample(t, chosen);
        out_ids.select(1, t).index_copy_(0, live.rows, token);
        out_logp.select(1, t).index_copy_(0, live.rows, chosen.to(s.device));
        if (live.seen.defined()) live.seen.scatter_(1, token.unsqueeze(-1), true);
        at::Tensor stopped = row_limits.le(t + 1);
        at::Tensor eos = s.eos.defined() ? at::isin(token, s.eos) : at::zeros_like(stopped);
        stopped = stopped.logical_or(eos);
        if (stop) {
            const at::Tensor rows = live.rows.cpu().contiguous(), tokens = token.cpu().contiguous();
            const int64_t *row = rows.data_ptr<int64_t>(), *sampled = tokens.data_ptr<int64_t>();
            std::vector<uint8_t> hit(size_t(rows.size(0)), 0);
            for (int64_t k = 0; k < rows.size(0); ++k) {
                auto& turn = so_far[size_t(row[k])];
                turn.push_back(sampled[k]);
                hit[size_t(k)] = stop(size_t(row[k]), turn);
            }
            stopped = stopped.logical_or(at::tensor(hit, at::kByte).to(s.device).to(at::kBool));
        }
        if (stopped.any().item<bool>()) {
            at::Tensor stopped_rows = live.rows.masked_select(stopped);
            lengths.index_fill_(0, stopped_rows, t + 1);
            ended_eos.index_copy_(0, stopped_rows, eos.masked_select(stopped));
            if (s.resumable && !last_turn) {
                State::Batch p = s.select(live, stopped.nonzero().squeeze(-1), /*trimmed=*/true);
                p.last_token = token.masked_select(stopped);
                p.turn_start = turn_start;
                s.parked.push_back(std::move(p));
            }
            at::Tensor keep = stopped.logical_not().nonzero().squeeze(-1);
            if (keep.numel() == 0) {
                live = State::Batch{};
                break;
            }
            live = s.select(live, keep);
            token = token.index_select(0, keep);
            row_limits = row_limits.index_select(0, keep);
        }
        // the token goes into the cache at the next column; its logits predict the next token
        const int64_t column = live.cache.length;
        live.mask.select(1, column).fill_(1);
        at::Tensor hidden =
            s.model.hidden_states(token.unsqueeze(-1), live.mask.narrow(1, 0, column + 1), live.next_position, &live.cache);
        live.next_position = live.next_position + 1;
        s.logits = s.model.logits(hidden).squeeze(1);
    }
    const at::Tensor ids = out_ids.cpu(), logp = out_logp.cpu(), n = lengths.cpu(), eos = ended_eos.cpu();
    for (int64_t i = 0; i < s.N; ++i) {
        const int64_t length = n[i].item<int64_t>();
        Turn& turn = turns[size_t(i)];
        turn.ids.assign(ids[i].data_ptr<int64_t>(), ids[i].data_ptr<int64_t>() + length);
        turn.logprobs.assign(logp[i].data_ptr<float>(), logp[i].data_ptr<float>() + length);
        turn.eos = eos[i].item<bool>();
    }
    return turns;
}

void DecodeSession::continue_rows(const std::vector<Continuation>& rows) {
    State& s = *s_;
    if (!s.resumable) throw Error(ErrorKind::usage, "continue_rows: the session is not resumable");
    if (s.live.size() != 0) throw Error(ErrorKind::usage, "continue_rows: rows are still sampling");
    at::NoGradGuard no_grad;
    DecodeKernelScope decode_kernels;
    std::map<int64_t, const Continuation*> wanted;
    for (const Continuation& c : rows)
        if (!wanted.emplace(int64_t(c.row), &c).second)
            throw Error(ErrorKind::usage, "continue_rows: row " + std::to_string(c.row) + " is listed twice");
    // the wanted rows of every parked group, in one batch whose columns line up: a group whose
    // cache is shorter gets masked zero columns up to the longest (attention skips them)
    std::vector<State::Batch> groups;
    std::vector<const Continuation*> order;
    std::vector<std::vector<int64_t>> blocks;  // in `order`
    int64_t length = 0;
    for (State::Batch& p : s.parked) {
        const at::Tensor prows = p.rows.cpu().contiguous();
        std::vector<int64_t> keep;
        for (int64_t k = 0; k < prows.size(0); ++k)
            if (auto it = wanted.find(prows.data_ptr<int64_t>()[k]); it != wanted.end()) {
                keep.push_back(k);
                order.push_back(it->second);
            }
        if (keep.empty()) continue;
        at::Tensor index = at::tensor(keep, long_options()).to(s.device);
        State::Batch g = s.select(p, index);
        // each row's block: the turn's last token when it stays and is not yet cached, then its
        // tokens; turn tokens cached past the kept ones are rolled back (masked, positions reused)
        const at::Tensor last = p.last_token.index_select(0, index).cpu().contiguous();
        const int64_t cached = g.cache.length - p.turn_start;  // the turn's tokens but the last
        for (int64_t k = 0; k < g.size(); ++k) {
            const Continuation& c = *order[order.size() - size_t(g.size()) + size_t(k)];
            if (c.keep < 0 || c.keep > cached + 1)
                throw Error(ErrorKind::usage, "continue_rows: row " + std::to_string(c.row) + " keeps " +
                                                  std::to_string(c.keep) + " tokens of a turn of " +
                                                  std::to_string(cached + 1));
            std::vector<int64_t> block;
            if (c.keep > cached) block.push_back(last.data_ptr<int64_t>()[k]);
            block.insert(block.end(), c.tokens.begin(), c.tokens.end());
            if (block.empty()) throw Error(ErrorKind::usage, "continue_rows: a row has nothing to continue with");
            if (const int64_t back = cached - c.keep; back > 0) {
                g.mask[k].narrow(0, g.cache.length - back, back).zero_();
                g.next_position[k] -= back;
            }
            blocks.push_back(std::move(block));
        }
        length = std::max(length, g.cache.length);
        groups.push_back(std::move(g));
    }
    s.parked.clear();
    if (order.size() != rows.size()) throw Error(ErrorKind::usage, "continue_rows: a row is not waiting to continue");
    if (groups.empty()) return;

    const int64_t A = int64_t(order.size());
    int64_t width = 1;
    for (const auto& block : blocks) width = std::max<int64_t>(width, int64_t(block.size()));
    State::Batch live;
    const KVCache& first = groups.front().cache;
    live.cache = s.model.make_cache(A, length + width + s.room);
    live.mask = at::zeros({A, length + width + s.room}, long_options().device(s.device));
    std::vector<at::Tensor> batch_rows, positions, seen;
    int64_t offset = 0;
    for (const State::Batch& g : groups) {
        const int64_t n = g.size(), filled = g.cache.length;
        for (size_t l = 0; l < first.keys.size(); ++l)
            for (auto [to, from] :
                 {std::pair{&live.cache.keys[l], &g.cache.keys[l]}, {&live.cache.values[l], &g.cache.values[l]}}) {
                to->narrow(0, offset, n).narrow(2, 0, filled).copy_(from->narrow(2, 0, filled));
                to->narrow(0, offset, n).narrow(2, filled, length - filled).zero_();
            }
        live.mask.narrow(0, offset, n).narrow(1, 0, filled).copy_(g.mask.narrow(1, 0, filled));
        batch_rows.push_back(g.rows);
        positions.push_back(g.next_position);
        if (g.seen.defined()) seen.push_back(g.seen);
        offset += n;
    }
    live.cache.length = length;
    live.rows = at::cat(batch_rows);
    live.next_position = at::cat(positions);
    if (!seen.empty()) live.seen = at::cat(seen);

    // the blocks, left-padded so every row's last token is the block's last column
    at::Tensor ids = at::full({A, width}, s.o.pad_token_id, long_options());
    at::Tensor block_mask = at::zeros({A, width}, long_options());
    for (int64_t r = 0; r < A; ++r) {
        const auto& b = blocks[size_t(r)];
        const int64_t n = int64_t(b.size());
        ids[r].narrow(0, width - n, n).copy_(at::tensor(b, long_options()));
        block_mask[r].narrow(0, width - n, n).fill_(1);
    }
    ids = ids.to(s.device);
    block_mask = block_mask.to(s.device);
    live.mask.narrow(1, length, width).copy_(block_mask);
    at::Tensor block_positions = live.next_position + (block_mask.cumsum(-1) - 1).clamp_min(0);
    if (live.seen.defined())  // the block's real tokens join the seen ones (padding adds nothing)
        live.seen.logical_or_(at::zeros({A, s.V}, ids.options()).scatter_add_(1, ids, block_mask) > 0);
    at::Tensor hidden = s.model.hidden_states(ids, live.mask.narrow(1, 0, length + width), block_positions, &live.cache);
    live.next_position = live.next_position + block_mask.sum(-1, true);
    s.logits = s.model.logits(hidden.narrow(1, width - 1, 1)).squeeze(1);
    s.live = std::move(live);
}

GenerationResult generate(const Model& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& o) {
    if (o.max_new_tokens < 1) throw Error(ErrorKind::usage, "generate: max_new_tokens must be >= 1");
    detail::check_generation_length(model, prompts, o.max_new_tokens);
    // the engine merges adapters into its generation weights: one without merged_delta stays eager,
    // as do the models it refuses
    if (o.cuda_graphs && model.device().is_cuda() && cuda_graphs_compiled() && model.adapters_can_merge() &&
        !graph_engine_refusal(model.config()))
        return static_generate(model, prompts, o);
    DecodeSession session(model, prompts, o, o.max_new_tokens, /*resumable=*/false);
    const auto turns = session.sample_turn(std::vector<int64_t>(prompts.size(), o.max_new_tokens));
    const int64_t N = int64_t(prompts.size());
    int64_t steps = 0;
    for (const auto& turn : turns) steps = std::max<int64_t>(steps, int64_t(turn.ids.size()));
    GenerationResult r;
    r.completion_ids = at::full({N, steps}, o.pad_token_id, long_options());
    r.sampled_logprobs = at::zeros({N, steps}, at::TensorOptions().dtype(at::kFloat));
    r.truncated = at::zeros({N}, at::TensorOptions().dtype(at::kBool));
    for (int64_t i = 0; i < N; ++i) {
        const auto& turn = turns[size_t(i)];
        const int64_t n = int64_t(turn.ids.size());
        r.completion_ids[i].narrow(0, 0, n).copy_(at::tensor(turn.ids, long_options()));
        r.sampled_logprobs[i].narrow(0, 0, n).copy_(at::tensor(turn.logprobs, at::kFloat));
        r.truncated[i] = !turn.eos;
        r.lengths.push_back(n);
    }
    at::Tensor lengths = at::tensor(r.lengths, long_options());
    r.completion_mask = (at::arange(steps, long_options()).unsqueeze(0) < lengths.unsqueeze(1)).to(at::kLong);
    return r;
}

at::Tensor token_logprobs(const Model& model, const at::Tensor& hidden, const at::Tensor& targets, double temperature,
                          int64_t chunk_rows, at::Tensor* entropy, bool entropy_graph) {
    int64_t B = hidden.size(0), T = hidden.size(1), H = hidden.size(2);
    // a float32 head (cast_lm_head_to_fp32): the product in float32, outside autocast
    std::optional<AutocastScope> float_head;
    if (model.lm_head_in_float32()) float_head.emplace(hidden.device().type(), false, at::kBFloat16);
    at::Tensor flat_hidden = hidden.reshape({B * T, H});
    if (model.lm_head_in_float32()) flat_hidden = flat_hidden.to(at::kFloat);
    at::Tensor flat_targets = targets.reshape({B * T, 1}).to(hidden.device());
    // On CUDA, a pass that records gradients keeps no logits for the backward (RecomputedLogprobs):
    // memory is what is short there. The CPU keeps autograd's path, where the recomputed product
    // would cost time and memory is plentiful. A trained entropy needs the logits' graph: autograd's path.
    const at::Tensor head = model.lm_head_weight();  // once: trained token rows make it a new tensor
    const bool recording = at::GradMode::is_enabled() && (hidden.requires_grad() || head.requires_grad());
    // (its backward knows no soft-capped logits: Gemma 2 takes autograd's path)
    if (recording && hidden.is_cuda() && B * T > 0 && !(entropy && entropy_graph) && model.config().final_logit_softcap == 0) {
        if (entropy) {
            at::NoGradGuard no_grad;
            token_logprobs(model, hidden, targets, temperature, chunk_rows, entropy);
        }
        return detail::recomputed_token_logprobs(flat_hidden, head, flat_targets, temperature, chunk_rows).view({B, T});
    }
    std::vector<at::Tensor> pieces, entropies;
    // one pass even with no positions, so the result stays in the graph of hidden and the head
    for (int64_t start = 0; start == 0 || start < B * T; start += chunk_rows) {
        int64_t n = std::min(chunk_rows, B * T - start);
        // soft-capped in float32, as TRL's fused head computes GRPO's log-probabilities
        at::Tensor logits =
            model.soft_capped_logits(at::linear(flat_hidden.narrow(0, start, n), head).to(at::kFloat)) / temperature;
        at::Tensor picked = logits.gather(-1, flat_targets.narrow(0, start, n)).squeeze(-1);
        at::Tensor normalizer = at::logsumexp(logits, -1);
        pieces.push_back(picked - normalizer);
        if (entropy && entropy_graph) {  // H = logsumexp - sum(p * logits)
            entropies.push_back(normalizer - (at::softmax(logits, -1) * logits).sum(-1));
        } else if (entropy) {  // a metric, so no graph
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
                               at::Tensor* entropy, bool entropy_graph, RouterLoad* router_load) {
    const int64_t B = prompt_ids.size(0), P = prompt_ids.size(1), C = completion_ids.size(1), L = P + C;
    model.check_sequence_length(L);  // TRL scores the padded batch
    const at::Device device = model.device();
    // Only real tokens go through the model, packed row after row (Model::packed_hidden_states).
    at::Tensor keep = at::cat({prompt_mask, completion_mask}, 1).cpu().to(at::kBool);  // [B, L]
    at::Tensor kept = keep.reshape(-1).nonzero().squeeze(-1);                          // flat input positions
    at::Tensor row_lengths = keep.sum(1).to(at::kLong).contiguous();
    at::Tensor positions = (keep.to(at::kLong).cumsum(-1) - 1).reshape(-1).index_select(0, kept);
    at::Tensor tokens = at::cat({prompt_ids, completion_ids}, 1).cpu().reshape(-1).index_select(0, kept);
    at::Tensor hidden = model.packed_hidden_states(
        tokens, positions, std::vector<int64_t>(row_lengths.data_ptr<int64_t>(), row_lengths.data_ptr<int64_t>() + B),
        router_load);

    // Completion token t of row b is predicted at input position P - 1 + t. Positions that are masked,
    // or whose predictor is, get log-prob (and entropy) 0; every consumer masks them.
    at::Tensor packed_index = keep.reshape(-1).to(at::kLong).cumsum(0) - 1;  // flat input position -> row of hidden
    at::Tensor scored =
        completion_mask.cpu().to(at::kBool).logical_and(keep.narrow(1, P - 1, C)).reshape(-1).nonzero().squeeze(-1);
    at::Tensor predictor = packed_index.index_select(0, scored.div(C, "floor") * L + P - 1 + scored.remainder(C));
    at::Tensor targets = completion_ids.cpu().reshape(-1).index_select(0, scored);
    at::Tensor scored_entropy;
    at::Tensor logprobs = token_logprobs(model, hidden.index_select(0, predictor.to(device)).unsqueeze(0), targets.unsqueeze(0),
                                         temperature, 1024, entropy ? &scored_entropy : nullptr, entropy_graph);
    at::Tensor scored_on_device = scored.to(device);
    auto spread = [&](const at::Tensor& values) {  // [1, M] -> [B, C], zeros elsewhere
        return at::zeros({B * C}, values.options()).index_copy(0, scored_on_device, values.squeeze(0)).view({B, C});
    };
    if (entropy) *entropy = spread(scored_entropy);
    return spread(logprobs);
}

}  // namespace grove
