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
    at::Tensor position;  // [N, 1] long: its position
    at::Tensor visible;   // [N, capacity] bool: the columns each row attends to

    KVCache first_rows(int64_t n) const {
        KVCache view;
        view.capacity = cache.capacity;
        view.length = cache.length;
        view.column = cache.column;
        for (size_t l = 0; l < cache.keys.size(); ++l) {
            view.keys.push_back(cache.keys[l].narrow(0, 0, n));
            view.values.push_back(cache.values[l].narrow(0, 0, n));
        }
        return view;
    }
};

// Runs the decode step on the first `rows` rows of the batch and returns their logits [rows, V]:
// on CUDA by replaying the step captured for that bucket (captured on first use), elsewhere eagerly.
class StepRunner {
public:
    StepRunner(const Model& model, const StaticBatch& batch) : model_(model), batch_(batch) {}

    at::Tensor run(int64_t rows) {
#ifdef GROVE_CUDA_DECODE
        if (model_.device().is_cuda()) {
            std::unique_ptr<Captured>& captured = graphs_[rows];
            if (!captured) captured = capture(rows);
            captured->graph.replay();
            return captured->logits;
        }
#endif
        return step(rows);
    }

private:
    at::Tensor step(int64_t rows) const {
        KVCache view = batch_.first_rows(rows);
        return model_.decode_step_logits(batch_.token.narrow(0, 0, rows), batch_.position.narrow(0, 0, rows),
                                         batch_.visible.narrow(0, 0, rows), view);
    }

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
        at::Tensor logits;  // the graph's output, rewritten by each replay
    };
    std::unique_ptr<Captured> capture(int64_t rows) {
        // Buckets only shrink within a generation, so the graphs replay in the order they were
        // captured, which lets them share one memory pool.
        if (!pool_set_) {
            pool_ = at::cuda::graph_pool_handle();
            pool_set_ = true;
        }
        // (device_synchronize rather than a stream's: this file then calls nothing of the CUDA runtime
        // directly, so it needs no libcudart of its own; torch's is the one loaded)
        c10::cuda::device_synchronize();  // the buffers' latest values are written
        c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, model_.device().index());
        auto captured = std::make_unique<Captured>();
        {
            SideStream on_side(side);
            // one eager step first: lazy set-ups (cuBLAS workspaces, kernel choices) must not happen
            // inside the capture. It writes the same cache column the replay writes again.
            step(rows);
            c10::cuda::device_synchronize();
            captured->graph.capture_begin(pool_);
            try {
                captured->logits = step(rows);
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
    std::map<int64_t, std::unique_ptr<Captured>> graphs_;
    at::cuda::MempoolId_t pool_{0, 0};
    bool pool_set_ = false;
#endif

    const Model& model_;
    const StaticBatch& batch_;
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
    batch.position = prompt_mask.sum(-1, true);
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
    // Step t's token of each slot (`slots` [rows] name their rows); slots not `live` record padding,
    // and the rows that `ended` here get their length.
    void record(int64_t t, const at::Tensor& slots, const at::Tensor& live, const at::Tensor& token, const at::Tensor& chosen,
                const at::Tensor& ended, const at::Tensor& is_eos) {
        ids.select(1, t).index_copy_(0, slots, token.masked_fill(live.logical_not(), pad));
        logprobs.select(1, t).index_copy_(0, slots, chosen.masked_fill(live.logical_not(), 0.0));
        lengths.index_copy_(0, slots, at::where(ended, t + 1, lengths.index_select(0, slots)));
        ended_eos.index_copy_(0, slots, ended_eos.index_select(0, slots).logical_or(ended.logical_and(is_eos)));
    }
    GenerationResult to_host() const {
        const int64_t N = lengths.size(0) - 1;
        GenerationResult r;
        const at::Tensor n = lengths.narrow(0, 0, N).cpu();
        r.lengths.assign(n.data_ptr<int64_t>(), n.data_ptr<int64_t>() + N);
        const int64_t steps = n.max().item<int64_t>();
        r.completion_ids = ids.narrow(0, 0, N).narrow(1, 0, steps).cpu().contiguous();
        r.sampled_logprobs = logprobs.narrow(0, 0, N).narrow(1, 0, steps).cpu().contiguous();
        r.truncated = ended_eos.narrow(0, 0, N).logical_not().cpu();
        r.completion_mask = (at::arange(steps, at::kLong).unsqueeze(0) < n.unsqueeze(1)).to(at::kLong);
        return r;
    }
};

// The rows `keep` of the first `rows` slots of each buffer move to its front, in order.
void move_to_front(const std::vector<at::Tensor*>& buffers, const at::Tensor& keep, int64_t rows) {
    for (at::Tensor* buffer : buffers)
        buffer->narrow(0, 0, keep.size(0)).copy_(buffer->narrow(0, 0, rows).index_select(0, keep));
}

}  // namespace

GenerationResult static_generate(const Model& policy, const std::vector<std::vector<int64_t>>& prompts,
                                 const SamplingOptions& o) {
    if (o.max_new_tokens < 1) throw Error(ErrorKind::usage, "generate: max_new_tokens must be >= 1");
    if (!o.greedy && !(o.temperature > 0)) throw Error(ErrorKind::usage, "generate: temperature must be > 0");
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

    const detail::LeftPadded padded = detail::left_pad(prompts, o.pad_token_id, o.max_new_tokens);
    const int64_t N = int64_t(prompts.size()), P = padded.width, C = o.max_new_tokens, V = model.config().vocab_size;
    const auto on_device = at::TensorOptions().device(device);
    const auto device_long = on_device.dtype(at::kLong);

    StaticBatch batch;
    at::Tensor logits = prefill(model, padded, batch);

    // Each slot of the batch holds a row (a prompt), or none after a move to a smaller bucket: then it
    // names the results' sink row
    const int64_t sink = N;
    at::Tensor slot_row = at::arange(N, device_long);
    at::Tensor done = at::zeros({N}, on_device.dtype(at::kBool));
    DeviceResults results(N, C, o.pad_token_id, device);
    at::Tensor uniforms;  // [C, N + 1]: the eager loop's per-step draws, every prompt one per step
    if (!o.greedy) {
        at::Generator generator = at::detail::createCPUGenerator(o.seed);
        uniforms =
            at::cat({at::rand({C, N}, generator, at::TensorOptions().dtype(at::kDouble)), at::full({C, 1}, 0.5, at::kDouble)},
                    1)
                .to(device);
    }
    at::Tensor seen;
    if (o.repetition_penalty != 1.0) {
        // scatter_add: padding shares its id with real tokens (see DecodeSession)
        seen =
            at::zeros({N, V}, device_long).scatter_add_(1, padded.ids.to(device), padded.mask.narrow(1, 0, P).to(device)) > 0;
    }
    const at::Tensor eos = o.eos_token_ids.empty() ? at::Tensor() : at::tensor(o.eos_token_ids, at::kLong).to(device);

    at::Tensor invalid = at::zeros({1}, on_device.dtype(at::kInt));  // set by the CUDA sampler on a NaN row
    StepRunner runner(model, batch);
    int64_t rows = N;  // the bucket
    for (int64_t t = 0; t < C; ++t) {
        const at::Tensor slots = slot_row.narrow(0, 0, rows), live = done.narrow(0, 0, rows).logical_not();
        at::Tensor chosen;
        const at::Tensor token =
            sample_on_device(logits, o.greedy ? at::Tensor() : uniforms.select(0, t).index_select(0, slots),
                             seen.defined() ? seen.narrow(0, 0, rows) : seen, o, chosen, invalid);
        const at::Tensor is_eos = eos.defined() ? at::isin(token, eos) : at::zeros_like(live);
        const at::Tensor ended = t + 1 == C ? live : live.logical_and(is_eos);
        results.record(t, slots, live, token, chosen, ended, is_eos);
        done.narrow(0, 0, rows).logical_or_(ended);
        if (t + 1 == C) break;
        if (seen.defined()) seen.narrow(0, 0, rows).scatter_(1, token.unsqueeze(-1), true);

        // the token enters the cache at column P + t; its logits predict the next token
        batch.token.narrow(0, 0, rows).copy_(token.unsqueeze(-1));
        batch.cache.column.fill_(P + t);
        batch.visible.narrow(0, 0, rows).select(1, P + t).fill_(true);
        logits = runner.run(rows);
        batch.position.narrow(0, 0, rows).add_(1);

        if ((t + 1) % kStepsBetweenLooks != 0) continue;
        const at::Tensor keep = done.narrow(0, 0, rows).logical_not().nonzero().squeeze(-1);
        check_valid(invalid, t);
        const int64_t alive = keep.size(0);
        if (alive == 0) break;
        const int64_t smaller = bucket_for(alive, N);
        if (smaller == rows) continue;
        // the live rows move to the front (their cache, mask, position, seen tokens); the rest of
        // the smaller bucket holds no row
        std::vector<at::Tensor*> per_slot{&batch.visible, &batch.position, &slot_row};
        for (auto* tensors : {&batch.cache.keys, &batch.cache.values})
            for (at::Tensor& buffer : *tensors) per_slot.push_back(&buffer);
        if (seen.defined()) per_slot.push_back(&seen);
        move_to_front(per_slot, keep, rows);
        slot_row.narrow(0, alive, smaller - alive).fill_(sink);
        done.narrow(0, 0, alive).fill_(false);
        done.narrow(0, alive, smaller - alive).fill_(true);
        logits = at::cat({logits.index_select(0, keep), at::zeros({smaller - alive, V}, logits.options())});
        rows = smaller;
    }

    check_valid(invalid, C - 1);
    return results.to_host();
}

}  // namespace grove
