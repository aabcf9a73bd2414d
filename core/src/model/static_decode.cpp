#include "model/static_decode.hpp"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>

#include <map>
#include <memory>

#ifdef GROVE_CUDA_DECODE
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include "model/cuda_decode_kernels.hpp"
#endif

#include "grove/error.hpp"
#include "grove/model.hpp"
#include "model/autocast.hpp"
#include "model/sampling.hpp"

namespace grove {

bool cuda_graphs_compiled() {
#ifdef GROVE_CUDA_DECODE
    return true;
#else
    return false;
#endif
}

namespace {

constexpr int64_t kSmallestBucket = 8;
// The host reads the batch (one synchronisation) every this many steps, to stop when every row is
// done and to move the live rows to a smaller bucket.
constexpr int64_t kStepsBetweenLooks = 8;

// The batch size a step runs at for `live` rows out of N: a power of two from 8, at most N.
int64_t bucket_for(int64_t live, int64_t N) {
    int64_t bucket = kSmallestBucket;
    while (bucket < live) bucket *= 2;
    return std::min(bucket, N);
}

// The decode step's fixed buffers for N rows; a bucket of n rows uses the first n of each.
struct StaticBatch {
    KVCache cache;        // [N, kv_heads, capacity, head_dim] per layer; cache.column the column written
    at::Tensor token;     // [N, 1] long: the token each row feeds in
    at::Tensor position;  // [N, 1] long: its position (before token 0: the prompt's last token's)
    at::Tensor visible;   // [N, capacity] bool: the columns each row attends to

    KVCache first_rows(int64_t n) const {
        KVCache view;
        view.capacity = cache.capacity;
        view.length = cache.length;
        view.column = cache.column;
        view.split_attention = cache.split_attention;
        for (size_t l = 0; l < cache.keys.size(); ++l) {
            view.keys.push_back(cache.keys[l].narrow(0, 0, n));
            view.values.push_back(cache.values[l].narrow(0, 0, n));
        }
        return view;
    }
};

class DecodeState;

// Runs one step of the generation on the first `rows` slots: the model's decode step, then
// DecodeState::advance (sample, record, set up the next decode). On CUDA the decode step is
// captured once per bucket as a CUDA graph and replayed; with `capture_sampling` advance is
// captured in the same graph, so a step is one replay and nothing of the host's. Elsewhere both
// run eagerly.
class StepRunner {
public:
    StepRunner(DecodeState& state, bool capture_sampling) : state_(state), capture_sampling_(capture_sampling) {}

    void run(int64_t rows);

private:
#ifdef GROVE_CUDA_DECODE
    // Capture happens on a side stream (never the default one). c10's setters rather than
    // CUDAStreamGuard, whose inline parts would call the CUDA runtime from this file.
    struct SideStream {
        c10::cuda::CUDAStream previous = c10::cuda::getCurrentCUDAStream();
        explicit SideStream(c10::cuda::CUDAStream side) { c10::cuda::setCurrentCUDAStream(side); }
        ~SideStream() { c10::cuda::setCurrentCUDAStream(previous); }
    };
    struct Captured {
        at::cuda::CUDAGraph graph;
        at::Tensor logits;  // the decode step's output, rewritten by each replay
    };
    std::unique_ptr<Captured> capture(int64_t rows);
    std::map<int64_t, std::unique_ptr<Captured>> graphs_;
    at::cuda::MempoolId_t pool_{0, 0};
    bool pool_set_ = false;
#endif

    DecodeState& state_;
    const bool capture_sampling_;
};

// One token per row from logits [rows, V] on the device, with no host synchronisation; `u` [rows]
// are the rows' uniforms. `chosen` gets each token's log-probability under the temperature. On CUDA
// one kernel samples (after ATen's filters, when set), and a NaN row sets `invalid`.
at::Tensor sample_on_device(const at::Tensor& logits, const at::Tensor& u, const at::Tensor& seen, const SamplingOptions& o,
                            at::Tensor& chosen, at::Tensor& invalid) {
    const bool filter = !o.greedy && detail::filters_logits(o, logits.size(-1));
#ifdef GROVE_CUDA_DECODE
    if (logits.is_cuda() && (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16)) {
        at::Tensor scaled, drawn_from = logits.contiguous();
        double temperature = o.greedy ? 1.0 : o.temperature;
        if (filter) {  // the filtered logits already carry the temperature
            scaled = logits.to(at::kFloat) / o.temperature;
            drawn_from = detail::process_logits(logits, scaled, seen, o).contiguous();
            temperature = 1.0;
        }
        const int64_t rows = logits.size(0);
        at::Tensor token = at::empty({rows}, logits.options().dtype(at::kLong));
        chosen = at::empty({rows}, logits.options().dtype(at::kFloat));
        const char* error =
            cuda_kernels::sample(drawn_from.scalar_type() == at::kFloat ? cuda_kernels::DType::f32 : cuda_kernels::DType::bf16,
                                 drawn_from.data_ptr(), rows, logits.size(-1), float(temperature),
                                 o.greedy ? nullptr : u.data_ptr<double>(), token.data_ptr<int64_t>(), chosen.data_ptr<float>(),
                                 invalid.data_ptr<int>(), c10::cuda::getCurrentCUDAStream().stream());
        if (error) throw Error(ErrorKind::runtime, std::string("CUDA sampling kernel: ") + error);
        if (filter) chosen = detail::log_probability(scaled, token);  // the kernel's is of the filtered logits
        return token;
    }
#endif
    if (o.greedy) {
        at::Tensor token = logits.argmax(-1);
        chosen = detail::log_probability(logits.to(at::kFloat), token);
        return token;
    }
    at::Tensor scaled = logits.to(at::kFloat);
    if (o.temperature != 1.0) scaled = scaled / o.temperature;
    // inverse CDF in float32 (no [rows, V] float64 temporaries); the target scales with the row's
    // total so rounding in the sum cannot push it past the last token
    at::Tensor cdf = detail::process_logits(logits, scaled, seen, o).softmax(-1).cumsum(-1);
    const int64_t V = logits.size(-1);
    at::Tensor target = (u.unsqueeze(-1) * cdf.narrow(-1, V - 1, 1).to(at::kDouble)).to(at::kFloat);
    at::Tensor token = at::searchsorted(cdf, target).squeeze(-1).clamp_max(V - 1);
    chosen = detail::log_probability(scaled, token);
    return token;
}

// Throws when a sampled row was NaN or all -inf (read where the host synchronises anyway).
void check_valid(const at::Tensor& invalid, int64_t step) {
    if (invalid.item<int>() != 0)
        throw Error(ErrorKind::runtime, "generate: the model's logits are NaN (or all -inf) by decode step " +
                                            std::to_string(step + 1) + " (a diverged or corrupt checkpoint?)");
}

// The prompts, prefilled eagerly into `batch`, whose cache has room for every new token (the mask's
// columns); returns each row's next-token logits.
at::Tensor prefill(const Model& model, const detail::LeftPadded& padded, StaticBatch& batch) {
    const at::Device device = model.device();
    const int64_t N = padded.ids.size(0), P = padded.width;
    batch.cache = model.make_cache(N, padded.mask.size(1));
    for (auto* tensors : {&batch.cache.keys, &batch.cache.values})
        for (at::Tensor& t : *tensors) t.zero_();  // masked columns must hold finite values (0 x NaN)
    const at::Tensor mask = padded.mask.to(device), prompt_mask = mask.narrow(1, 0, P);
    at::Tensor hidden =
        model.hidden_states(padded.ids.to(device), prompt_mask, (prompt_mask.cumsum(-1) - 1).clamp_min(0), &batch.cache);
    batch.visible = mask.to(at::kBool);
    batch.position = prompt_mask.sum(-1, true) - 1;  // the prompt's last token; the first sampled one is next
    batch.token = at::zeros({N, 1}, at::TensorOptions().device(device).dtype(at::kLong));
    batch.cache.column = at::full({1}, P, at::TensorOptions().device(device).dtype(at::kLong));
    return model.logits(hidden.narrow(1, P - 1, 1)).squeeze(1);
}

// Every row's tokens, log-probabilities, length and EOS flag, kept on the device while decoding. One
// extra row, the sink (row N), takes the writes of slots that hold no row; it is dropped at the end.
struct DeviceResults {
    at::Tensor ids, logprobs, lengths, ended_eos;
    int64_t pad;

    DeviceResults(int64_t N, int64_t C, int64_t pad_token_id, at::Device device) : pad(pad_token_id) {
        const auto on_device = at::TensorOptions().device(device);
        ids = at::full({N + 1, C}, pad_token_id, on_device.dtype(at::kLong));
        logprobs = at::zeros({N + 1, C}, on_device.dtype(at::kFloat));
        lengths = at::zeros({N + 1}, on_device.dtype(at::kLong));
        ended_eos = at::zeros({N + 1}, on_device.dtype(at::kBool));
    }
    // The token of each slot at step `step` ([1] long on the device; `slots` [rows] name the rows);
    // slots not `live` record padding, and the rows that `ended` here get their length.
    void record(const at::Tensor& step, const at::Tensor& slots, const at::Tensor& live, const at::Tensor& token,
                const at::Tensor& chosen, const at::Tensor& ended, const at::Tensor& is_eos) {
        const at::Tensor at_step = slots * ids.size(1) + step;  // [row, step] in the flattened results
        ids.view(-1).index_copy_(0, at_step, token.masked_fill(live.logical_not(), pad));
        logprobs.view(-1).index_copy_(0, at_step, chosen.masked_fill(live.logical_not(), 0.0));
        lengths.index_copy_(0, slots, at::where(ended, step + 1, lengths.index_select(0, slots)));
        ended_eos.index_copy_(0, slots, ended_eos.index_select(0, slots).logical_or(ended.logical_and(is_eos)));
    }
    // The rows that never ended ran to the last step.
    GenerationResult to_host() const {
        const int64_t N = lengths.size(0) - 1, C = ids.size(1);
        GenerationResult r;
        at::Tensor n = lengths.narrow(0, 0, N).cpu();
        n = n.masked_fill(n == 0, C);
        r.lengths.assign(n.data_ptr<int64_t>(), n.data_ptr<int64_t>() + N);
        const int64_t steps = n.max().item<int64_t>();
        r.completion_ids = ids.narrow(0, 0, N).narrow(1, 0, steps).cpu().contiguous();
        r.sampled_logprobs = logprobs.narrow(0, 0, N).narrow(1, 0, steps).cpu().contiguous();
        r.truncated = ended_eos.narrow(0, 0, N).logical_not().cpu();
        r.completion_mask = (at::arange(steps, at::kLong).unsqueeze(0) < n.unsqueeze(1)).to(at::kLong);
        return r;
    }
};

// The generation's state on the device. Every value a step reads that changes from step to step is
// here (the step counter too), so a captured step replays correctly: the host passes a step nothing
// but its bucket size, which is fixed per graph.
class DecodeState {
public:
    DecodeState(const Model& model, const detail::LeftPadded& padded, const SamplingOptions& o)
            : model_(model),
              o_(o),
              N_(padded.ids.size(0)),
              P_(padded.width),
              results_(N_, o.max_new_tokens, o.pad_token_id, model.device()) {
        const int64_t C = o.max_new_tokens, V = model.config().vocab_size;
        const auto on_device = at::TensorOptions().device(model.device());
        first_logits_ = prefill(model, padded, batch_);
        batch_.cache.split_attention = o.split_attention;
        step_ = at::zeros({1}, on_device.dtype(at::kLong));
        slot_row_ = at::arange(N_, on_device.dtype(at::kLong));
        done_ = at::zeros({N_}, on_device.dtype(at::kBool));
        invalid_ = at::zeros({1}, on_device.dtype(at::kInt));
        if (!o.greedy) {  // [C, N + 1]: the eager loop's per-step draws, every prompt one per step (the sink 0.5)
            at::Generator generator = at::detail::createCPUGenerator(o.seed);
            uniforms_ = at::cat({at::rand({C, N_}, generator, at::TensorOptions().dtype(at::kDouble)),
                                 at::full({C, 1}, 0.5, at::kDouble)},
                                1)
                            .to(model.device());
        }
        if (o.repetition_penalty != 1.0) {  // scatter_add: padding shares its id with real tokens (see DecodeSession)
            seen_ = at::zeros({N_, V}, on_device.dtype(at::kLong))
                        .scatter_add_(1, padded.ids.to(model.device()), padded.mask.narrow(1, 0, P_).to(model.device())) > 0;
        }
        if (!o.eos_token_ids.empty()) eos_ = at::tensor(o.eos_token_ids, at::kLong).to(model.device());
    }

    // Samples token 0 from the prompts' logits (eagerly, before any step).
    void start() {
        advance(first_logits_, N_);
        first_logits_ = at::Tensor();
    }
    bool on_cuda() const { return model_.device().is_cuda(); }
    c10::DeviceIndex device_index() const { return model_.device().index(); }

    // The model's step for the first `rows` slots: the logits [rows, V] that follow each slot's
    // token. It writes that token's keys and values at the cache's column, the same on a second run.
    at::Tensor decode(int64_t rows) const {
        KVCache view = batch_.first_rows(rows);
        return model_.decode_step_logits(batch_.token.narrow(0, 0, rows), batch_.position.narrow(0, 0, rows),
                                         batch_.visible.narrow(0, 0, rows), view);
    }

    // After a decode: a token per slot from `logits` is sampled and recorded at the step counter,
    // then the next decode is set up (its token, cache column, mask and position).
    void advance(const at::Tensor& logits, int64_t rows) {
        const at::Tensor slots = slot_row_.narrow(0, 0, rows), live = done_.narrow(0, 0, rows).logical_not();
        at::Tensor chosen;
        const at::Tensor token = sample(logits, rows, chosen);
        // a comparison, not at::isin, which may sort (and synchronise) for larger sets
        const at::Tensor is_eos = eos_.defined() ? (token.unsqueeze(-1) == eos_).any(-1) : at::zeros_like(live);
        const at::Tensor ended = live.logical_and(is_eos);  // rows still live after the last step end in to_host
        results_.record(step_, slots, live, token, chosen, ended, is_eos);
        done_.narrow(0, 0, rows).logical_or_(ended);
        if (seen_.defined()) seen_.narrow(0, 0, rows).scatter_(1, token.unsqueeze(-1), true);
        // the token enters the cache at column P + step (after the last step: a column no step reads)
        batch_.token.narrow(0, 0, rows).copy_(token.unsqueeze(-1));
        batch_.cache.column.copy_(step_ + P_);
        batch_.visible.narrow(0, 0, rows).index_fill_(1, batch_.cache.column, true);
        batch_.position.narrow(0, 0, rows).add_(1);
        step_.add_(1);
    }

    // A token per slot from `logits` at the step counter's uniforms, and its log-probability in
    // `chosen`. It changes no state (but the NaN flag, which the same logits set anyway): the
    // capture's warm-up runs it at each new bucket size.
    at::Tensor sample(const at::Tensor& logits, int64_t rows, at::Tensor& chosen) {
        const at::Tensor slots = slot_row_.narrow(0, 0, rows);
        const at::Tensor u = o_.greedy ? at::Tensor() : uniforms_.view(-1).index_select(0, slots + step_ * (N_ + 1));
        return sample_on_device(logits, u, seen_.defined() ? seen_.narrow(0, 0, rows) : seen_, o_, chosen, invalid_);
    }

    // The host's look at the batch after step t (one synchronisation): whether any row is live, and
    // when the live rows fit a smaller bucket than `rows`, moves them to its front (their cache, mask,
    // position, token and seen tokens); the rest of the smaller bucket holds no row. Returns the
    // bucket to go on with, 0 when every row is done.
    int64_t look(int64_t t, int64_t rows) {
        const at::Tensor keep = done_.narrow(0, 0, rows).logical_not().nonzero().squeeze(-1);
        check_valid(invalid_, t);
        const int64_t alive = keep.size(0);
        if (alive == 0) return 0;
        const int64_t smaller = bucket_for(alive, N_);
        if (smaller == rows) return rows;
        std::vector<at::Tensor*> per_slot{&batch_.visible, &batch_.position, &batch_.token, &slot_row_};
        for (auto* tensors : {&batch_.cache.keys, &batch_.cache.values})
            for (at::Tensor& buffer : *tensors) per_slot.push_back(&buffer);
        if (seen_.defined()) per_slot.push_back(&seen_);
        for (at::Tensor* buffer : per_slot) buffer->narrow(0, 0, alive).copy_(buffer->narrow(0, 0, rows).index_select(0, keep));
        slot_row_.narrow(0, alive, smaller - alive).fill_(N_);  // the results' sink
        done_.narrow(0, 0, alive).fill_(false);
        done_.narrow(0, alive, smaller - alive).fill_(true);
        return smaller;
    }

    GenerationResult finish(int64_t last_step) const {
        check_valid(invalid_, last_step);
        return results_.to_host();
    }

private:
    const Model& model_;
    const SamplingOptions& o_;
    const int64_t N_, P_;
    StaticBatch batch_;
    DeviceResults results_;
    at::Tensor first_logits_;  // the prompts' next-token logits
    at::Tensor step_;          // [1] long: the step whose token advance() samples next
    at::Tensor slot_row_;      // [N] long: the row each slot holds, or the sink (N)
    at::Tensor done_;          // [N] bool per slot
    at::Tensor invalid_;       // [1] int, set by the CUDA sampler on a NaN row
    at::Tensor uniforms_, seen_, eos_;
};

#ifdef GROVE_CUDA_DECODE
std::unique_ptr<StepRunner::Captured> StepRunner::capture(int64_t rows) {
    // Buckets only shrink within a generation, so the graphs replay in the order they were
    // captured, which lets them share one memory pool.
    if (!pool_set_) {
        pool_ = at::cuda::graph_pool_handle();
        pool_set_ = true;
    }
    // (device_synchronize rather than a stream's: this file then calls nothing of the CUDA runtime
    // directly, so it needs no libcudart of its own; torch's is the one loaded)
    c10::cuda::device_synchronize();  // the buffers' latest values are written
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, state_.device_index());
    auto captured = std::make_unique<Captured>();
    {
        SideStream on_side(side);
        // one eager decode first: lazy set-ups (cuBLAS workspaces, kernel choices) must not happen
        // inside the capture. It writes the same cache column the replay writes again. Sampling,
        // whose kernels may depend on the batch size, is warmed up too; the rest of advance (which
        // would change the state) ran eagerly for token 0, with the kernels it uses at any size.
        const at::Tensor logits = state_.decode(rows);
        if (capture_sampling_) {
            at::Tensor chosen;
            state_.sample(logits, rows, chosen);
        }
        c10::cuda::device_synchronize();
        captured->graph.capture_begin(pool_);
        try {
            captured->logits = state_.decode(rows);
            if (capture_sampling_) state_.advance(captured->logits, rows);
        } catch (...) {  // end the capture, or the stream stays capturing and later calls fail obscurely
            try {
                captured->graph.capture_end();
            } catch (...) {
            }
            throw;
        }
        captured->graph.capture_end();
    }
    c10::cuda::device_synchronize();
    return captured;
}
#endif

void StepRunner::run(int64_t rows) {
#ifdef GROVE_CUDA_DECODE
    if (state_.on_cuda()) {
        std::unique_ptr<Captured>& captured = graphs_[rows];
        if (!captured) captured = capture(rows);
        captured->graph.replay();
        if (!capture_sampling_) state_.advance(captured->logits, rows);
        return;
    }
#endif
    state_.advance(state_.decode(rows), rows);
}

}  // namespace

const char* graph_engine_refusal(const ModelConfig& config) {
    if (config.mixture_of_experts())
        return "the graph engine does not run mixtures of experts; generate() decodes them eagerly";
    if (config.attention_logit_softcap > 0)
        return "the graph engine does not soft-cap attention (Gemma 2); generate() decodes it eagerly";
    return nullptr;
}

GenerationResult static_generate(const Model& policy, const std::vector<std::vector<int64_t>>& prompts,
                                 const SamplingOptions& o) {
    if (o.max_new_tokens < 1) throw Error(ErrorKind::usage, "generate: max_new_tokens must be >= 1");
    if (!o.greedy && !(o.temperature > 0)) throw Error(ErrorKind::usage, "generate: temperature must be > 0");
    if (const char* refusal = graph_engine_refusal(policy.config())) throw Error(ErrorKind::usage, refusal);
    detail::check_generation_length(policy, prompts, o.max_new_tokens);
    at::NoGradGuard no_grad;
    const at::Device device = policy.device();
    // the model's device is the current one: streams, synchronisation and capture act on the current device
    const c10::OptionalDeviceGuard on_the_models_device(device.is_cuda() ? std::optional<at::Device>(device) : std::nullopt);
    // Generation weights: bf16 copies instead of autocast's casts inside every step, and adapters
    // merged, so a step is plain ATen work on fixed tensors.
    const bool autocast = at::autocast::is_autocast_enabled(device.type()) && policy.dtype() == at::kFloat;
    std::unique_ptr<Model> copy;
    if (autocast || policy.has_adapters())
        copy = policy.generation_copy(autocast ? at::autocast::get_autocast_dtype(device.type()) : policy.dtype());
    const Model& model = copy ? *copy : policy;
    // off: the generation weights already have the dtype the engine generates in
    const AutocastScope autocast_off(device.type(), false, at::autocast::get_autocast_dtype(device.type()));

    DecodeState state(model, detail::left_pad(prompts, o.pad_token_id, o.max_new_tokens, model.config().vocab_size), o);
    state.start();
    StepRunner runner(state, o.capture_sampling);
    const int64_t C = o.max_new_tokens;
    int64_t rows = int64_t(prompts.size());  // the bucket
    for (int64_t t = 1; t < C && rows > 0; ++t) {
        runner.run(rows);  // decodes token t - 1 and samples token t
        if ((t + 1) % kStepsBetweenLooks == 0) rows = state.look(t, rows);
    }
    return state.finish(C - 1);
}

}  // namespace grove
