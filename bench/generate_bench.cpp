// Times grove::generate alone (model loading excluded) on random prompt ids, for bench/generate.py.
//   grove_bench_generate MODEL_DIR BATCH PROMPT_LEN NEW_TOKENS [dtype] [device] [ENGINE]
// ENGINE (on CUDA): graphs (the default: split attention, q/k/v and gate/up concatenated as
// `grove generate` does), eager, or graphs with changes joined by '+': captured (sampling in the
// graph, SamplingOptions::capture_sampling), unsplit (split_attention off), unfused (the projections
// not concatenated: a GEMM per linear)
// Prints one JSON line: {"seconds": ..., "tokens": ..., "tokens_per_second": ...}, on CUDA also
// "peak_allocated_mib": the caching allocator's peak, as torch.cuda.max_memory_allocated reports it.
// With GROVE_BENCH_TRACE=FILE.json the timed call is profiled (CPU ops and CUDA kernels, Chrome trace).
#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <chrono>
#include <iostream>
#include <sstream>

#include "grove/generation.hpp"
#include "grove/model.hpp"

int main(int argc, char** argv) {
    if (argc < 5) {
        std::cerr << "usage: grove_bench_generate MODEL_DIR BATCH PROMPT_LEN NEW_TOKENS [float32|bfloat16] [cpu|cuda] "
                     "[graphs|eager|captured|unsplit|unfused, joined by +]\n";
        return 2;
    }
    std::string dtype = argc > 5 ? argv[5] : "float32", device = argc > 6 ? argv[6] : "cpu";
    int64_t batch = std::stoll(argv[2]), prompt_len = std::stoll(argv[3]), new_tokens = std::stoll(argv[4]);
    auto model = grove::Model::load(argv[1], device, dtype);
    at::manual_seed(0);
    at::Tensor ids = at::randint(4, model->config().vocab_size, {batch, prompt_len});
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t b = 0; b < batch; ++b)
        prompts.emplace_back(ids[b].data_ptr<int64_t>(), ids[b].data_ptr<int64_t>() + prompt_len);
    grove::SamplingOptions options;
    options.max_new_tokens = new_tokens;
    options.temperature = 1.0;
    const std::string engine = argc > 7 ? argv[7] : "graphs";
    std::stringstream parts(engine);
    bool concatenate = model->device().is_cuda();
    for (std::string part; std::getline(parts, part, '+');) {
        if (part == "eager")
            options.cuda_graphs = false, concatenate = false;
        else if (part == "captured")
            options.capture_sampling = true;
        else if (part == "unsplit")
            options.split_attention = false;
        else if (part == "unfused")
            concatenate = false;
        else if (part != "graphs") {
            std::cerr << "grove_bench_generate: unknown engine part '" << part
                      << "' (graphs, eager, captured, unsplit, unfused; joined by +)\n";
            return 2;
        }
    }
    if (concatenate) model->concatenate_projections();
    options.seed = 1;  // no EOS ids: every row generates new_tokens, as min_new_tokens does in transformers
    grove::generate(*model, prompts, [&] {
        auto o = options;
        o.max_new_tokens = 8;
        return o;
    }());  // warm-up at the timed batch size, as bench/generate.py does for transformers
    const bool on_gpu = model->device().is_cuda();
    if (on_gpu) at::accelerator::resetPeakStats(model->device().index());
    namespace profiler = torch::autograd::profiler;
    const char* trace = std::getenv("GROVE_BENCH_TRACE");
    const profiler::ProfilerConfig trace_config(profiler::ProfilerState::KINETO);
    std::set<profiler::ActivityType> activities{profiler::ActivityType::CPU};
    if (on_gpu) activities.insert(profiler::ActivityType::CUDA);
    if (trace) {
        profiler::prepareProfiler(trace_config, activities);
        profiler::enableProfiler(trace_config, activities);
    }
    auto start = std::chrono::steady_clock::now();
    auto result = grove::generate(*model, prompts, options);
    if (on_gpu) at::accelerator::synchronizeDevice(model->device().index());
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (trace) profiler::disableProfiler()->save(trace);
    int64_t tokens = 0;
    for (int64_t l : result.lengths) tokens += l;
    std::cout << "{\"seconds\": " << seconds << ", \"tokens\": " << tokens << ", \"tokens_per_second\": " << tokens / seconds;
    if (on_gpu) {
        auto stats = at::accelerator::getDeviceStats(model->device().index());
        std::cout << ", \"peak_allocated_mib\": " << double(stats.allocated_bytes[0].peak) / (1 << 20);
    }
    std::cout << "}\n";
    return 0;
}
