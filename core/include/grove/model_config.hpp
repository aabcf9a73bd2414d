// A Hugging Face model folder's config.json as Grove reads it: the architecture (causal LMs and
// sequence classifiers of the Llama, Qwen2, Qwen3, Mistral, Phi-3 and SmolLM3 families, Gemma 3's
// text model and OLMo 2's causal LMs) and its sizes. No libtorch,
// so hosts can check a folder without loading the model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace grove {

struct RopeScaling {
    std::string type;  // "" (none), "llama3", "longrope", "linear" or "yarn"
    double factor = 1.0;
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    int64_t original_max_position_embeddings = 8192;
    // longrope (Phi-3.5, Phi-3 128k): each frequency divided by its short factor, cos and sin scaled
    // by attention_factor. transformers switches to the long factors past
    // original_max_position_embeddings; Grove refuses longer sequences (Model::check_sequence_length).
    std::vector<double> short_factor;
    double attention_factor = 1.0;         // cos and sin are scaled by it: 1 unless longrope or yarn
    double beta_fast = 32, beta_slow = 1;  // yarn: the ramp between original and interpolated frequencies
    bool truncate = true;                  // yarn: the ramp's ends rounded outwards
};

struct ModelConfig {
    std::string
        model_type;  // llama, qwen2, qwen3, mistral, phi3, smollm3, gemma2, gemma3_text, gemma3, olmo2, olmo3, qwen3_moe, mixtral, olmoe, qwen2_moe
    std::string architecture;          // LlamaForCausalLM, ..., or LlamaForSequenceClassification, ... (a reward model)
    bool sequence_classifier = false;  // a score head [num_labels, hidden] in place of the LM head
    int64_t num_labels = 0;
    int64_t vocab_size = 0;
    int64_t hidden_size = 0;
    int64_t intermediate_size = 0;
    int64_t num_hidden_layers = 0;
    int64_t num_attention_heads = 0;
    int64_t num_key_value_heads = 0;
    int64_t head_dim = 0;
    int64_t rotary_dim = 0;  // the leading dimensions of each head that are rotated: head_dim, or less (Phi-4-mini)
    int64_t max_position_embeddings = 0;
    double rms_norm_eps = 1e-6;
    double rope_theta = 10000.0;
    RopeScaling rope_scaling;
    bool tie_word_embeddings = false;
    bool attention_bias = false;  // q/k/v (and o for llama's attention_bias) projections have biases
    bool o_proj_bias = false;
    bool mlp_bias = false;
    bool qk_norm = false;            // q_norm / k_norm: the query and key RMS-normed (Qwen3, Gemma 3, OLMo 2)
    bool qk_norm_whole = false;      // OLMo 2: q_norm / k_norm norm the whole projection, not each head
    bool fused_projections = false;  // Phi-3: q, k, v as one qkv_proj, gate and up as one gate_up_proj
    // Gemma 3: every RMS norm scales by (1 + weight), in float32 before the cast back; each layer
    // also norms the attention's and the MLP's outputs (post_attention_layernorm,
    // post_feedforward_layernorm) and the MLP's input has its own norm (pre_feedforward_layernorm).
    bool gemma_norms = false;
    // How an RMS norm applies its weight: after the cast back to x's dtype (Llama), in float32
    // before the cast (OLMo 2), or as (1 + weight) in float32 before the cast (Gemma 3)
    enum class NormScaling { after_cast, in_float32, one_plus_in_float32 } norm_scaling = NormScaling::after_cast;
    // OLMo 2: a layer's input is not normed; the attention's and the MLP's outputs are
    // (post_attention_layernorm, post_feedforward_layernorm) before each is added
    bool post_norms_only = false;
    // OLMo 2: cos and sin stay float32 in every dtype, and the rotated q and k are cast back to their
    // own dtype (Llama's tables take the model's dtype and its products round in it)
    bool rotary_in_float32 = false;
    enum class Activation { silu, gelu_tanh } activation = Activation::silu;  // the gated MLP's: SwiGLU or GeGLU
    double embedding_scale = 1.0;  // token embeddings are multiplied by it (Gemma: sqrt(hidden_size))
    double attention_scale = 0.0;  // the queries' scale: head_dim^-1/2, Gemma's query_pre_attn_scalar^-1/2
    // Gemma 2's tanh soft-capping, cap * tanh(x / cap), of the scaled attention scores (before the
    // mask) and of the final logits (0: none)
    double attention_logit_softcap = 0.0;
    double final_logit_softcap = 0.0;
    // Gemma 3's sliding layers rotate with their own base and no scaling, OLMo 3's with rope_theta and
    // no scaling (0: every layer rotates alike)
    double local_rope_theta = 0.0;
    // Gemma 3 4B and larger (Gemma3ForConditionalGeneration): the text model, read from text_config,
    // is transformers' model.language_model (its tensors language_model.model.*); the vision tower's
    // and projector's tensors are written back unchanged when the model is saved
    bool nested_text_model = false;
    // Sliding-window attention (0: none): a query sees itself and the sliding_window - 1 tokens
    // before it, in the layers flagged in windowed_layers (every layer for Mistral and Phi-3; Qwen2 /
    // Qwen3 from layer_types or max_window_layers; SmolLM3 from layer_types or its NoPE layers; Gemma 3
    // and OLMo 3 from layer_types or their pattern).
    int64_t sliding_window = 0;
    std::vector<bool> windowed_layers;  // [num_hidden_layers]; Gemma 3, OLMo 3: their sliding layers even with no window
    // SmolLM3's NoPE layers: no rotary embedding on their queries and keys (empty: every layer rotates)
    std::vector<bool> nope_layers;
    bool layer_rotated(size_t layer) const { return layer >= nope_layers.size() || !nope_layers[layer]; }
    // Whether the layer takes the local rotary embedding (Gemma 3: its sliding layers, even without a window)
    bool layer_rotated_locally(size_t layer) const {
        return local_rope_theta > 0 && layer < windowed_layers.size() && windowed_layers[layer];
    }
    bool layer_windowed(size_t layer) const {
        return sliding_window > 0 && layer < windowed_layers.size() && windowed_layers[layer];
    }
    // Whether the window hides some key of a sequence `columns` long from some layer's queries.
    bool window_hides_keys(int64_t columns) const {
        return sliding_window > 0 && columns > sliding_window &&
               std::find(windowed_layers.begin(), windowed_layers.end(), true) != windowed_layers.end();
    }
    // Mixture of experts (Qwen3-MoE, Mixtral, OLMoE, Qwen2-MoE): the sparse layers' MLP is a router (a linear to
    // num_experts logits) and num_experts SwiGLU experts moe_intermediate_size wide; each token runs
    // through the experts_per_token with the highest softmax probabilities, weighted by them
    // (renormalized over those experts when norm_topk_prob). Qwen3-MoE's mlp_only_layers and
    // decoder_sparse_step leave some layers dense (intermediate_size). 0 experts: no MoE.
    int64_t num_experts = 0;
    int64_t experts_per_token = 0;
    int64_t moe_intermediate_size = 0;
    bool norm_topk_prob = false;
    // Qwen2-MoE: a shared SwiGLU expert this wide that every token also takes, its output scaled by
    // sigmoid(shared_expert_gate(x)); 0: none
    int64_t shared_expert_intermediate_size = 0;
    std::vector<bool> sparse_layers;  // [num_hidden_layers] when num_experts > 0
    // The load-balancing loss's coefficient in the config (router_aux_loss_coef); GRPO adds it as TRL does
    double router_aux_loss_coef = 0.0;
    bool mixture_of_experts() const { return num_experts > 0; }
    bool layer_sparse(size_t layer) const { return layer < sparse_layers.size() && sparse_layers[layer]; }
    std::vector<int64_t> eos_token_ids;  // config.json and generation_config.json, all of them
    std::optional<int64_t> bos_token_id;
    std::optional<int64_t> pad_token_id;
    std::string config_json;             // the original config.json, written back on save
    std::string generation_config_json;  // "" when the folder has none
};

// Reads config.json (+ generation_config.json). Unsupported architectures are refused with the list
// of supported ones; missing or ill-typed keys name the file and the key.
ModelConfig load_model_config(const std::string& folder);

}  // namespace grove
