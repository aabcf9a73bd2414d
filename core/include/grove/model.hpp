// The policy: one libtorch implementation of the Llama-family decoder (Llama 2/3 incl. llama3 rope
// scaling, Qwen2/2.5 with q/k/v biases, Qwen3, Mistral, Phi-3, SmolLM/SmolLM2/SmolLM3, TinyLlama,
// Gemma 3's text model with its four norms per layer, OLMo 2 / 3, and the mixtures of experts
// Qwen3-MoE, Qwen2-MoE, Mixtral and OLMoE), loaded from and saved to a Hugging Face
// folder. Numerics follow transformers' modeling_llama / modeling_qwen2 / modeling_gemma3: RMSNorm in
// float32, rotary embeddings computed in float32, SwiGLU (GeGLU for Gemma), grouped-query attention
// via at::scaled_dot_product_attention.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "grove/beside_adapter.hpp"
#include "grove/model_config.hpp"

namespace grove {

class AdapterHost;
class AdaptedLinear;

// Preallocated keys/values for incremental decoding: [layers][B, kv_heads, capacity, head_dim].
struct KVCache {
    std::vector<at::Tensor> keys, values;
    int64_t length = 0;  // positions filled
    int64_t capacity = 0;
    // Static shapes (Model::decode_step_logits): the column the step writes ([1] long, on the
    // model's device); `length` is then the caller's.
    at::Tensor column;
    // Static shapes on CUDA: decode attention may split the columns over several blocks per KV head
    // and row when those are too few for the GPU (flash-decoding; SamplingOptions::split_attention).
    bool split_attention = false;
};

// What a mixture of experts' routers chose over one forward pass, summed over its sparse layers and
// tokens: what transformers' load_balancing_loss_func needs (TRL adds that loss to GRPO's for an MoE
// policy). Only packed forward passes record it: every token they compute is real.
struct RouterLoad {
    at::Tensor probability_sum;  // [experts] float32: the routers' softmax probabilities, summed (with their graph)
    at::Tensor selection_count;  // [experts_per_token, experts] float32: how often each expert was a token's k-th pick
    int64_t routed = 0;          // (layer, token) pairs recorded
    // One sparse layer's router logits [tokens, experts]: softmax in their dtype and top-k, as
    // load_balancing_loss_func computes them.
    void record(const at::Tensor& router_logits, int64_t experts_per_token);
    // num_experts * sum over k and e of (count / routed) * (probability / routed): the auxiliary loss
    at::Tensor balancing_loss() const;
};

struct Linear {
    std::string name;  // module name, e.g. "model.layers.0.self_attn.q_proj"
    at::Tensor weight;
    std::optional<at::Tensor> bias;
    std::unique_ptr<AdaptedLinear> adapter;  // set when an adapter attached to this layer
    const bool* adapters_enabled = nullptr;  // the model's switch (reference log-probs of LoRA runs)
    at::Tensor operator()(const at::Tensor& x) const;
    // x W^T + b without the adapter (inside a DecodeKernelScope, small batches on the CPU kernel)
    at::Tensor base(const at::Tensor& x) const;
};

// Within this scope (one thread), gradient-free CPU float32 work runs on the decode kernels
// (core/src/model/decode_kernels.hpp): products of at most 32 rows, RMSNorm, rotary, the SwiGLU middle and
// the decode step's attention on the KV cache. At decode sizes they are about twice as fast as ATen's
// general kernels on the CPUs measured (docs/performance.md). generate() opens it; the training
// forward and log-probabilities never do, so the loss sees exactly ATen's arithmetic. A no-op on
// CPUs without AVX2/FMA.
class DecodeKernelScope {
public:
    DecodeKernelScope();
    ~DecodeKernelScope();
    DecodeKernelScope(const DecodeKernelScope&) = delete;
    DecodeKernelScope& operator=(const DecodeKernelScope&) = delete;

private:
    bool previous_;
};

class Model {
public:
    // device: "cpu", "cuda", "cuda:N" or "auto"; dtype: "float32" or "bfloat16".
    static std::unique_ptr<Model> load(const std::string& folder, const std::string& device = "cpu",
                                       const std::string& dtype = "float32");
    // A freshly initialised model for folder/config.json (transformers' Llama initialisation,
    // seeded), to train from scratch; save() then writes its weights next to the config.
    static std::unique_ptr<Model> initialize(const std::string& folder, uint64_t seed, const std::string& device = "cpu",
                                             const std::string& dtype = "float32");
    ~Model();

    const ModelConfig& config() const { return config_; }
    at::Device device() const;
    at::ScalarType dtype() const;

    // Final hidden states [B, T, H] (after the last norm). attention_mask [B, cache.length + T]
    // covers the cached and the new positions (1 = attend); position_ids [B, T].
    at::Tensor hidden_states(const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& position_ids,
                             KVCache* cache = nullptr) const;
    // Final hidden states [N, H] of rows packed end to end without padding: token_ids and
    // position_ids are [N], row_lengths (summing to N) split them into rows, and each token attends
    // causally within its row. Equal to hidden_states on the padded batch at its real positions, but
    // the linear layers never compute padding, which is most of a GRPO batch whose completions end
    // early (the batch is as long as its longest completion).
    // A mixture of experts records its routing into `router_load` when one is given.
    // `embedding_hook`, when set, replaces the token embeddings [N, H] by what it returns, at the
    // point transformers' forward hooks on embed_tokens see them: before Gemma 1 / 2's scaling by
    // sqrt(hidden_size), after Gemma 3's (its embedding module scales). NEFTune's noise goes there.
    using EmbeddingHook = std::function<at::Tensor(const at::Tensor&)>;
    at::Tensor packed_hidden_states(const at::Tensor& token_ids, const at::Tensor& position_ids,
                                    const std::vector<int64_t>& row_lengths, RouterLoad* router_load = nullptr,
                                    const EmbeddingHook& embedding_hook = {}) const;
    // logits = lm_head(hidden); float32 when the head is kept in float32
    at::Tensor logits(const at::Tensor& hidden) const;
    // The output layer's logits soft-capped as the config asks (Gemma 2's final_logit_softcapping)
    at::Tensor soft_capped_logits(const at::Tensor& logits) const;
    // The logits in float32, soft-capped after the cast: TRL's fused head, which computes the losses
    // (logits() caps them in their own dtype, as transformers' forward does)
    at::Tensor float32_logits(const at::Tensor& hidden) const;
    // TRL's cast_lm_head_to_fp32 (the ScaleRL recipe): the output layer's weight is kept in float32
    // and its product runs in float32 outside autocast, on hidden states cast up (logits(),
    // token_logprobs). A tied head keeps the embedding matrix in float32 and casts its lookups to
    // the model's dtype, as TRL does. Nothing changes for a float32 model without autocast.
    void keep_lm_head_in_float32();
    bool lm_head_in_float32() const { return lm_head_float32_; }
    at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& position_ids,
                       KVCache* cache = nullptr) const {
        return logits(hidden_states(input_ids, attention_mask, position_ids, cache));
    }
    // the output layer's weight: lm_head's, or a tied model's embedding (with its trained token rows)
    at::Tensor lm_head_weight() const;
    // A sequence classifier's head (score.weight, [num_labels, hidden]); undefined for a causal LM.
    const at::Tensor& score_weight() const { return score_; }

    // Throws an input error naming the limit when a sequence of `tokens` positions would pass a
    // longrope checkpoint's original_max_position_embeddings, where transformers switches to the long
    // factors, which Grove does not apply. Every forward pass checks; generation checks its longest
    // sequence before it starts; log-probabilities check the padded batch's width, because TRL's
    // forward passes no position ids, so transformers numbers positions over the padding too.
    void check_sequence_length(int64_t tokens) const;
    KVCache make_cache(int64_t batch, int64_t capacity) const;
    // One decode step on static shapes (the graph decode engine, static_decode.hpp): token and
    // position [B, 1] long, visible [B, capacity] bool; writes the step's keys and values at
    // cache.column, attends to the visible columns and returns the logits [B, V]. Each row's tokens
    // sit in consecutive columns up to cache.column (a sliding window counts columns). Nothing in it
    // depends on a host-side length, so it can be captured once and replayed. On CUDA it runs fused
    // kernels (cuda_decode_kernels.hpp), elsewhere the ATen ops they replace.
    at::Tensor decode_step_logits(const at::Tensor& token, const at::Tensor& position, const at::Tensor& visible,
                                  KVCache& cache) const;
    // A copy for generation: every weight in `dtype`, attached adapters merged into the base weights
    // (W + delta), no gradients. The decode engine's bf16 weights while training keeps float32.
    std::unique_ptr<Model> generation_copy(at::ScalarType dtype) const;
    // For a model that only generates in its own dtype (no generation copy is made then): each
    // layer's q/k/v and gate/up weights become row views of one matrix each, as in a generation
    // copy, so a decode step runs one GEMM per group. Values are unchanged; do not train the model
    // afterwards (its weights are views).
    void concatenate_projections();

    // Parameters under their checkpoint names (tied lm_head is not listed separately).
    std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;
    // The same under transformers' module names (Gemma3ForConditionalGeneration's
    // model.language_model.* rather than its checkpoint's language_model.model.*), as PEFT names them.
    std::vector<std::pair<std::string, at::Tensor>> module_named_parameters() const;
    // Base weights train (full fine-tuning) or stay frozen (adapters; inference).
    void set_base_trainable(bool trainable);
    // Every tensor that currently requires a gradient: base weights and/or adapter parameters,
    // named as saved (an adapter's under PEFT's "base_model.model." prefix).
    std::vector<std::pair<std::string, at::Tensor>> trainable_named_parameters() const;
    std::vector<at::Tensor> trainable_parameters() const;
    // Every linear layer of the decoder stack, for adapters.
    std::vector<Linear*> linear_layers();
    // Their module names without the layer prefix, once each: q_proj, ..., or Phi-3's qkv_proj, ...
    std::vector<std::string> linear_module_names();
    void attach_adapter(AdapterHost& host);
    bool has_adapters() const;
    bool adapters_can_merge() const;  // every attached adapter can give its merged delta
    // Gradient checkpointing (TRL's gradient_checkpointing, reentrant): while gradients are
    // recorded, each decoder layer keeps only its input and recomputes its activations in the
    // backward pass, with the random state (adapter dropout) of the first pass. Memory for
    // activations drops from layers x (batch x length x ~15 hidden) to one layer's worth plus the
    // layer inputs, for one extra forward pass. Gradients are the same as without it.
    void set_gradient_checkpointing(bool enabled) { gradient_checkpointing_ = enabled; }
    bool gradient_checkpointing() const { return gradient_checkpointing_; }
    // With adapters disabled the model is the base model (TRL's reference for PEFT runs): attached
    // adapters are skipped and modules_to_save compute with their original weights.
    void set_adapters_enabled(bool enabled);
    // W += each attached adapter's merged_delta, then the adapters are detached (merging a checkpoint);
    // the modules_to_save keep their trained weights.
    void merge_adapters();
    // Adapter parameters under their saved (PEFT) names, then the modules_to_save's weights, then
    // the trained token rows.
    std::vector<std::pair<std::string, at::Tensor>> adapter_parameters() const;
    // adapter_parameters() as PEFT's adapter file holds them: a tied embedding trained whole is
    // saved under lm_head's name too, as PEFT saves it with ensure_weight_tying.
    std::vector<std::pair<std::string, at::Tensor>> saved_adapter_tensors() const;
    // What trains beside the attached adapter (PEFT's additional trainable modules); the reference
    // pass (adapters disabled) computes with the original weights. Refusals name the setting.
    //  - modules_to_save: every module whose name ends with one of them (as a string, PEFT's rule;
    //    e.g. "lm_head", "embed_tokens") trains whole, saved as base_model.model.<tensor>, beside a
    //    frozen copy of its original. On a model that ties lm_head to embed_tokens, Grove keeps one
    //    matrix for both: it trains whole with ensure_weight_tying and "embed_tokens" named without
    //    "lm_head" (PEFT's only way that keeps them tied). Refused: a name that ends no module's, a
    //    module holding an adapted layer, a tied lm_head / embed_tokens otherwise.
    //  - trainable_token_indices: those rows of the token embedding (and of a tied lm_head) train,
    //    as PEFT's trainable tokens: a [k, hidden] tensor that replaces them, starting from their
    //    values. Refused: an index outside the vocabulary, one given twice, the embedding also
    //    trained whole.
    void train_beside_adapter(const BesideAdapter& beside);
    const BesideAdapter& beside_adapter() const { return beside_adapter_; }

    // Writes config.json, generation_config.json and model.safetensors (atomically) into folder.
    void save(const std::string& folder) const;

private:
    struct Layer;
    struct Attention;
    struct CheckpointedLayer;
    struct RotaryTables;
    Model() = default;
    // the output layer's product (in float32 under cast_lm_head_to_fp32), before any soft-capping
    at::Tensor uncapped_logits(const at::Tensor& hidden) const;
    // One decoder layer: h [B, T, H] -> h. cos/sin [B, 1, T, D] rotary tables.
    at::Tensor layer_forward(size_t index, const at::Tensor& h, const at::Tensor& cos, const at::Tensor& sin,
                             const Attention& attention, KVCache* cache) const;
    // ATen's attention [B, heads, T, D] -> [B, heads, T, D], soft-capped when the config asks
    at::Tensor scaled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& visible, bool causal, bool grouped) const;
    // [B, heads, T, D] each -> [B, T, heads * D], under `visible` (the layer's mask in `attention`)
    at::Tensor attend(at::Tensor q, at::Tensor k, at::Tensor v, const Attention& attention, const at::Tensor& visible,
                      KVCache* cache, size_t index) const;
    // the layer's gated MLP block, or its experts (recording the routing into `router_load` if given)
    at::Tensor mlp(const Layer& layer, const at::Tensor& x, RouterLoad* router_load) const;
    at::Tensor experts_mlp(const Layer& layer, const at::Tensor& x, RouterLoad* router_load) const;
    at::Tensor norm(const at::Tensor& x, const at::Tensor& weight) const;  // the family's RMS norm
    RotaryTables rotary_tables(const at::Tensor& position_ids) const;      // position_ids [B, T]
    // Embedded tokens [B, T, H] through the rotary tables, every layer and the final norm.
    at::Tensor decoder_stack(at::Tensor h, const at::Tensor& position_ids, const Attention& attention, KVCache* cache) const;
    static std::unique_ptr<Model> build(const std::string& folder,
                                        const std::function<at::Tensor(const std::string&, std::vector<int64_t>)>& source,
                                        const std::string& device, const std::string& dtype);
    ModelConfig config_;
    at::Tensor embed_tokens_;
    std::vector<std::unique_ptr<Layer>> layers_;
    at::Tensor norm_;
    std::optional<at::Tensor> lm_head_;  // absent when tied, or for a sequence classifier
    at::Tensor score_;                   // a sequence classifier's head
    at::Tensor inv_freq_;                // [head_dim / 2], float32
    at::Tensor local_inv_freq_;          // Gemma 3's sliding layers' (rope_local_base_freq); undefined otherwise
    bool adapters_enabled_ = true;
    // a module_to_save's tensor: the model's own (trained), an alias of its storage, and the original
    struct WholeModuleTensor {
        std::string name;
        at::Tensor trained, trained_storage, original;
    };
    // rows of the embedding that train (PEFT's trainable tokens): `values` [k, hidden] replace rows
    // `indices` [k]; row_of [vocab] maps a token to its row of `values`, -1 for the others
    struct TrainedTokenRows {
        at::Tensor indices, values, row_of;
    };
    void train_whole_modules(const std::vector<std::string>& targets, bool ensure_weight_tying);
    void train_token_rows(const std::vector<int64_t>& indices);
    // the embedding matrix with the trained token rows in it while adapters are enabled
    at::Tensor embedding_with_trained_rows() const;
    bool embedding_trains_whole() const;  // a modules_to_save target took in the embedding
    BesideAdapter beside_adapter_;
    std::vector<WholeModuleTensor> whole_module_tensors_;
    std::optional<TrainedTokenRows> token_rows_;
    bool gradient_checkpointing_ = false;
    bool lm_head_float32_ = false;
    // Gemma3ForConditionalGeneration: the tensors Grove does not compute with (vision tower,
    // projector), written back by save() from the folder the model was loaded from
    std::string passthrough_folder_;
    std::vector<std::string> passthrough_tensors_;
    // token embeddings in the model's dtype, through `hook` (see packed_hidden_states) when set
    at::Tensor embed(const at::Tensor& ids, const EmbeddingHook& hook = {}) const;
};

}  // namespace grove
