// The static-shape decode engine behind generate() on CUDA. A decode step whose every tensor has a
// fixed shape and address can be captured once as a CUDA graph and replayed for the cost of one
// launch, where the eager step costs ~1,800 kernel launches of host time (dispatch-bound: measured on
// an H100, docs/performance.md):
//   - weights for generation in bf16 when the caller runs a float32 model under bf16 autocast
//     (Model::generation_copy: adapters merged, no autocast casts per step);
//   - one KV cache of [rows, capacity] allocated up front; a step writes its column through a
//     device index and attends to every column under a [rows, capacity] mask (KVCache::column);
//   - rows that finish stay in the batch, masked, until the live ones fit a smaller batch-size
//     bucket (powers of two from 8), when they are moved to the front and the smaller bucket's
//     graph takes over; the host looks at the batch every few steps, never inside a step;
//   - the step itself is Model::decode_step_logits: on CUDA nine kernels per layer, five of them
//     fused ones of our own (cuda_decode_kernels.hpp) and four GEMMs (q/k/v and gate/up
//     concatenated in generation copies, and by Model::concatenate_projections for a model that
//     generates as it is); decode attention splits its columns over more blocks where rows x KV
//     heads are too few (SamplingOptions::split_attention);
//   - sampling on the device, one kernel per step on CUDA (ATen's filters first when set), with the
//     same per-step uniforms as the eager loop (a seeded CPU generator, drawn for the whole turn up
//     front);
//   - with SamplingOptions::capture_sampling, sampling and the per-step bookkeeping are captured in
//     the step's graph too: every value a step reads that changes between steps (the step counter
//     included) lives on the device, so a replay needs nothing from the host.
// On the CPU the same steps run eagerly, on the ATen operations the kernels replace (no graphs):
// the tests compare it with the eager loop; the device kit compares the CUDA engine with it.
#pragma once

#include <cstdint>
#include <vector>

#include "grove/generation.hpp"

namespace grove {

class Model;

// Whether this build can capture CUDA graphs (compiled with the CUDA headers).
bool cuda_graphs_compiled();

struct ModelConfig;

// Why the static engine cannot run a model of this config, or null when it can: a mixture of
// experts (which expert a token takes decides the work per step, which a captured graph cannot
// follow), soft-capped attention (its fused attention takes no cap). generate() decodes those eagerly.
const char* graph_engine_refusal(const ModelConfig& config);

// generate()'s contract, on the static engine (one turn, no stop strings).
GenerationResult static_generate(const Model& model, const std::vector<std::vector<int64_t>>& prompts,
                                 const SamplingOptions& options);

}  // namespace grove
