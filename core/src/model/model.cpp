#include "grove/model.hpp"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/Parallel.h>  // at::get_num_threads
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <functional>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "grove/adapter_host.hpp"
#include "grove/error.hpp"
#include "grove/hub_cache.hpp"
#include "grove/safetensors.hpp"
#include "grove/tokenizer.hpp"
#include "io/json_values.hpp"
#include "model/tensor_io.hpp"
#include "text/text_util.hpp"
#include "model/autocast.hpp"
#include "model/decode_kernels.hpp"
#include "model/layer.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace grove {

// ---------------------------------------------------------------------------------------------
// safetensors <-> at::Tensor
at::ScalarType scalar_type_of(DType dtype) {
    switch (dtype) {
        case DType::f64:
            return at::kDouble;
        case DType::f32:
            return at::kFloat;
        case DType::f16:
            return at::kHalf;
        case DType::bf16:
            return at::kBFloat16;
        case DType::i64:
            return at::kLong;
        case DType::i32:
            return at::kInt;
        case DType::i16:
            return at::kShort;
        case DType::i8:
            return at::kChar;
        case DType::u8:
            return at::kByte;
        case DType::boolean:
            return at::kBool;
    }
    return at::kFloat;
}

DType dtype_of(at::ScalarType type) {
    switch (type) {
        case at::kDouble:
            return DType::f64;
        case at::kFloat:
            return DType::f32;
        case at::kHalf:
            return DType::f16;
        case at::kBFloat16:
            return DType::bf16;
        case at::kLong:
            return DType::i64;
        case at::kInt:
            return DType::i32;
        case at::kShort:
            return DType::i16;
        case at::kChar:
            return DType::i8;
        case at::kByte:
            return DType::u8;
        case at::kBool:
            return DType::boolean;
        default:
            throw Error(ErrorKind::runtime, std::string("safetensors cannot store dtype ") + c10::toString(type));
    }
}

at::Tensor tensor_from_entry(const TensorEntry& entry, const std::string&) {
    auto options = at::TensorOptions().dtype(scalar_type_of(entry.dtype));
    if (entry.numel() == 0) return at::empty(entry.shape, options);
    return at::from_blob(const_cast<uint8_t*>(entry.data), entry.shape, options).clone();
}

void save_tensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  const std::map<std::string, std::string>& metadata) {
    std::vector<TensorBytes> layout;
    for (const auto& [name, tensor] : tensors)
        layout.push_back({name, dtype_of(tensor.scalar_type()), tensor.sizes().vec(), nullptr,
                          size_t(tensor.numel()) * tensor.element_size()});
    at::Tensor current;  // one tensor on the CPU at a time: a GPU model's copy never exists whole in host memory
    write_safetensors(path, layout, metadata, [&](size_t i) {
        current = tensors[i].second.detach().to(at::kCPU).contiguous();
        return static_cast<const void*>(current.data_ptr());
    });
}

// ---------------------------------------------------------------------------------------------
// config.json
namespace {

json read_json(const fs::path& path) {
    std::ifstream file(path);
    std::error_code error;
    if (!file && !fs::exists(path.parent_path(), error))
        throw Error(ErrorKind::input, path.parent_path().string() +
                                          ": no such folder; give a Hugging Face model folder, or the Hub id of a model in "
                                          "the local Hugging Face cache (" +
                                          hub_cache_directory() + "; `hf download ID` puts it there)");
    if (!file) throw Error(ErrorKind::input, path.string() + ": cannot read (is this a Hugging Face model folder?)");
    try {
        return json::parse(file);
    } catch (const json::exception& e) {
        throw Error(ErrorKind::input, path.string() + ": invalid JSON: " + e.what());
    }
}

const std::map<std::string, std::string> kSupported = {
    {"LlamaForCausalLM", "llama"},
    {"Qwen2ForCausalLM", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3"},
    {"MistralForCausalLM", "mistral"},
    {"Phi3ForCausalLM", "phi3"},
    {"SmolLM3ForCausalLM", "smollm3"},
    {"Gemma2ForCausalLM", "gemma2"},
    {"Gemma3ForCausalLM", "gemma3_text"},
    {"Gemma3ForConditionalGeneration", "gemma3"},  // its text model only; the vision tower is kept as it is
    {"Olmo2ForCausalLM", "olmo2"},
    {"Olmo3ForCausalLM", "olmo3"},
    {"Qwen3MoeForCausalLM", "qwen3_moe"},  // mixtures of experts (ModelConfig::num_experts)
    {"MixtralForCausalLM", "mixtral"},
    {"OlmoeForCausalLM", "olmoe"},
    {"Qwen2MoeForCausalLM", "qwen2_moe"},
    {"LlamaForSequenceClassification", "llama"},  // reward models ([[rewards]] model = ...)
    {"Qwen2ForSequenceClassification", "qwen2"},
    {"Qwen3ForSequenceClassification", "qwen3"},
    {"MistralForSequenceClassification", "mistral"},
    {"Phi3ForSequenceClassification", "phi3"},
    {"SmolLM3ForSequenceClassification", "smollm3"},
    {"Gemma2ForSequenceClassification", "gemma2"},
    {"Gemma3TextForSequenceClassification", "gemma3_text"},
    {"Qwen3MoeForSequenceClassification", "qwen3_moe"},
    {"Qwen2MoeForSequenceClassification", "qwen2_moe"},
    {"MixtralForSequenceClassification", "mixtral"}};

std::string supported_list() {
    std::vector<std::string> names;
    for (const auto& [arch, type] : kSupported) names.push_back(arch + " (" + type + ")");
    return join(names, ", ");
}

template <class T>
T get(const json& j, const std::string& key, const std::string& file) {
    if (!j.contains(key) || j[key].is_null()) throw Error(ErrorKind::input, file + ": missing key \"" + key + "\"");
    // integers through the checked read: get<int64_t>() of a float like 1e300 is undefined behaviour
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
        return T(json_integer(j[key], file + ": key \"" + key + "\""));
    try {
        return j[key].get<T>();
    } catch (const json::exception&) {
        throw Error(ErrorKind::input, file + ": key \"" + key + "\" has the wrong type (" + j[key].dump() + ")");
    }
}
template <class T>
T get_or(const json& j, const std::string& key, T fallback, const std::string& file) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    return get<T>(j, key, file);
}

void add_ids(const json& value, std::vector<int64_t>& out) {
    if (value.is_number_integer())
        out.push_back(value.get<int64_t>());
    else if (value.is_array())
        for (const auto& v : value)
            if (v.is_number_integer()) out.push_back(v.get<int64_t>());
}

// Phi-3: fused projections, no biases; what Grove does not compute is refused by name
void read_phi3_specifics(const json& j, const std::string& file, ModelConfig& c) {
    c.fused_projections = true;
    for (const char* key : {"resid_pdrop", "embd_pdrop", "attention_dropout"})
        if (get_or<double>(j, key, 0.0, file) != 0.0)
            throw Error(ErrorKind::input, file + ": " + key +
                                              " is not 0: Grove applies no dropout inside the model; set it to 0.0 "
                                              "(as released Phi-3 checkpoints have it)");
    // transformers: int(head_dim * partial_rotary_factor) leading dimensions of each head are rotated
    double partial = get_or<double>(j, "partial_rotary_factor", 1.0, file);
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object())  // transformers 5 keeps it there
        partial = get_or<double>(j["rope_parameters"], "partial_rotary_factor", partial, file + " rope_parameters");
    c.rotary_dim = int64_t(double(c.head_dim) * partial);
    if (!(partial > 0 && partial <= 1) || c.rotary_dim % 2 != 0 || c.rotary_dim == 0)
        throw Error(ErrorKind::input, file + ": partial_rotary_factor " + std::to_string(partial) +
                                          " must be in (0, 1] and leave an even, non-zero number of dimensions of "
                                          "head_dim " +
                                          std::to_string(c.head_dim) + " to rotate");
}

// Grove computes no dropout inside the model (OLMo 2, the mixtures of experts, Gemma)
void refuse_attention_dropout(const json& j, const std::string& file) {
    if (get_or<double>(j, "attention_dropout", 0.0, file) != 0.0)
        throw Error(ErrorKind::input,
                    file + ": attention_dropout is not 0: Grove applies no dropout inside the model; set it to 0.0");
}

// OLMo 2 (Olmo2Config): norms after the attention and the MLP instead of before, q and k normed
// over the whole projection, every norm scaled in float32 before the cast
void read_olmo2_specifics(const json& j, const std::string& file, ModelConfig& c) {
    c.post_norms_only = true;
    c.norm_scaling = ModelConfig::NormScaling::in_float32;
    c.qk_norm = c.qk_norm_whole = true;
    c.rotary_in_float32 = true;
    c.attention_bias = c.o_proj_bias = get_or<bool>(j, "attention_bias", false, file);
    refuse_attention_dropout(j, file);
}

// Qwen3-MoE's, Mixtral's, OLMoE's and Qwen2-MoE's experts (Qwen3MoeConfig, MixtralConfig, OlmoeConfig,
// Qwen2MoeConfig, with their defaults): which layers are sparse, how many experts a token takes, and the router's settings
void read_moe_specifics(const json& j, const std::string& file, ModelConfig& c) {
    const bool qwen2 = c.model_type == "qwen2_moe", qwen = qwen2 || c.model_type == "qwen3_moe";
    const bool mixtral = c.model_type == "mixtral", olmoe = c.model_type == "olmoe";
    c.num_experts = get_or<int64_t>(j, mixtral ? "num_local_experts" : "num_experts",
                                    qwen2   ? 60
                                    : qwen  ? 128
                                    : olmoe ? 64
                                            : 8,
                                    file);
    c.experts_per_token = get_or<int64_t>(j, "num_experts_per_tok", mixtral ? 2 : qwen2 ? 4 : 8, file);
    c.moe_intermediate_size =
        qwen ? get_or<int64_t>(j, "moe_intermediate_size", qwen2 ? 1408 : 768, file) : c.intermediate_size;
    if (qwen2) {
        c.shared_expert_intermediate_size = get_or<int64_t>(j, "shared_expert_intermediate_size", 5632, file);
        if (c.shared_expert_intermediate_size < 1)
            throw Error(ErrorKind::input, file + ": shared_expert_intermediate_size must be positive");
        // transformers' Qwen2-MoE windows all layers or only those from max_window_layers on, depending on
        // the attention implementation; released configs leave it off
        if (get_or<bool>(j, "use_sliding_window", false, file))
            throw Error(ErrorKind::input, file +
                                              ": use_sliding_window is true: Grove does not run Qwen2-MoE's sliding "
                                              "window; set it to false (as released Qwen2-MoE checkpoints have it)");
    }
    c.norm_topk_prob = mixtral || get_or<bool>(j, "norm_topk_prob", false, file);  // Mixtral always renormalizes
    c.router_aux_loss_coef = get_or<double>(j, "router_aux_loss_coef", olmoe ? 0.01 : 0.001, file);
    if (c.num_experts < 1 || c.experts_per_token < 1 || c.experts_per_token > c.num_experts || c.moe_intermediate_size < 1)
        throw Error(ErrorKind::input, file + ": num_experts_per_tok (" + std::to_string(c.experts_per_token) +
                                          ") must be between 1 and the number of experts (" + std::to_string(c.num_experts) +
                                          "), and the experts' sizes positive");
    c.sparse_layers.assign(size_t(c.num_hidden_layers), true);
    if (qwen) {  // Qwen3MoeDecoderLayer: sparse unless listed in mlp_only_layers or off decoder_sparse_step
        const int64_t step = get_or<int64_t>(j, "decoder_sparse_step", 1, file);
        if (step < 1) throw Error(ErrorKind::input, file + ": decoder_sparse_step must be at least 1");
        for (int64_t l = 0; l < c.num_hidden_layers; ++l) c.sparse_layers[size_t(l)] = (l + 1) % step == 0;
        if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array())
            for (const json& l : j["mlp_only_layers"])
                if (l.is_number_integer() && l.get<int64_t>() >= 0 && l.get<int64_t>() < c.num_hidden_layers)
                    c.sparse_layers[size_t(l.get<int64_t>())] = false;
        if (qwen2) {
            c.attention_bias = get_or<bool>(j, "qkv_bias", true, file);  // Qwen2's q/k/v biases; o_proj has none
        } else {
            c.attention_bias = c.o_proj_bias = get_or<bool>(j, "attention_bias", false, file);
            c.qk_norm = true;  // Qwen3's q_norm / k_norm over each head
        }
    } else if (olmoe) {  // OLMo 2's q_norm / k_norm over the whole projection, Llama's norms before each block
        c.attention_bias = c.o_proj_bias = get_or<bool>(j, "attention_bias", false, file);
        c.qk_norm = c.qk_norm_whole = true;
        // OlmoeAttention ignores head_dim: its heads are hidden_size / num_attention_heads wide
        if (c.num_attention_heads > 0 && c.head_dim != c.hidden_size / c.num_attention_heads)
            throw Error(ErrorKind::input, file + ": head_dim " + std::to_string(c.head_dim) +
                                              " differs from hidden_size / num_attention_heads (" +
                                              std::to_string(c.hidden_size / c.num_attention_heads) +
                                              "), the width transformers' OLMoE gives its heads whatever head_dim "
                                              "says; remove the key");
        if (j.contains("clip_qkv") && !j["clip_qkv"].is_null())
            throw Error(ErrorKind::input, file +
                                              ": clip_qkv is set: Grove does not clamp q, k and v; released OLMoE "
                                              "checkpoints have it null");
    } else if (get_or<double>(j, "router_jitter_noise", 0.0, file) != 0.0) {
        throw Error(ErrorKind::input, file +
                                          ": router_jitter_noise is not 0: Grove's router adds no noise in training; "
                                          "set it to 0.0 (as released Mixtral checkpoints have it)");
    }
    refuse_attention_dropout(j, file);
}

// A soft-capping key (Gemma 2): its value, the config class's default when absent, 0 (none) when null
double read_softcap(const json& j, const char* key, double absent, const std::string& file) {
    if (!j.contains(key)) return absent;
    if (j[key].is_null()) return 0.0;
    const double cap = get_or<double>(j, key, absent, file);
    if (!(cap > 0 && std::isfinite(cap))) throw Error(ErrorKind::input, file + ": " + key + " must be positive or null");
    return cap;
}

// What Gemma 2's and Gemma 3's layers share: (1 + weight) norms in float32, four per layer, embeddings
// scaled by sqrt(hidden_size), queries by query_pre_attn_scalar^-1/2, optional attention biases
void read_gemma_layers(const json& j, const std::string& file, ModelConfig& c) {
    c.gemma_norms = true;
    c.norm_scaling = ModelConfig::NormScaling::one_plus_in_float32;
    c.embedding_scale = std::sqrt(double(c.hidden_size));
    c.attention_scale = std::pow(get_or<double>(j, "query_pre_attn_scalar", 256.0, file), -0.5);
    if (!(c.attention_scale > 0 && std::isfinite(c.attention_scale)))
        throw Error(ErrorKind::input, file + ": query_pre_attn_scalar must be positive");
    c.attention_bias = c.o_proj_bias = get_or<bool>(j, "attention_bias", false, file);
}

// Gemma 2: Gemma's layers without q_norm / k_norm or a local rotary base, and with tanh soft-capping
// of the attention scores and of the final logits
void read_gemma2_specifics(const json& j, const std::string& file, ModelConfig& c) {
    read_gemma_layers(j, file, c);
    c.attention_logit_softcap = read_softcap(j, "attn_logit_softcapping", 50.0, file);
    c.final_logit_softcap = read_softcap(j, "final_logit_softcapping", 30.0, file);
    refuse_attention_dropout(j, file);
}

// Gemma 3's text model (Gemma3TextConfig): what differs from Llama's layers, and what Grove does not
// compute refused by name.
void read_gemma3_specifics(const json& j, const std::string& file, ModelConfig& c) {
    read_gemma_layers(j, file, c);
    c.local_rope_theta = get_or<double>(j, "rope_local_base_freq", 10000.0, file);
    c.qk_norm = true;  // q_norm / k_norm over each head, before the rotary embedding, as Qwen3
    // transformers' Gemma 3 never applies the attention cap and applies the final one only in
    // Gemma3ForCausalLM: a set cap is refused rather than computed another way
    for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"})
        if (j.contains(key) && !j[key].is_null())
            throw Error(ErrorKind::input, file + ": " + key +
                                              " is set: Grove soft-caps Gemma 2's logits, not Gemma 3's (its checkpoints "
                                              "have it null); set it to null");
    if (get_or<bool>(j, "use_bidirectional_attention", false, file))
        throw Error(ErrorKind::input, file +
                                          ": use_bidirectional_attention is true (an embedding model's "
                                          "attention); Grove trains causal language models: set it to false");
    refuse_attention_dropout(j, file);
}

// transformers 5 keeps Gemma 3's rotary settings per layer type: rope_parameters.full_attention (the
// global layers' base and scaling, returned) and .sliding_attention (the local base; no scaling)
const json* gemma3_rope_parameters(const json& parameters, const std::string& file, ModelConfig& c) {
    const json& full = parameters["full_attention"];
    c.rope_theta = get_or<double>(full, "rope_theta", c.rope_theta, file + " rope_parameters.full_attention");
    if (parameters.contains("sliding_attention") && parameters["sliding_attention"].is_object()) {
        const json& sliding = parameters["sliding_attention"];
        const std::string where = file + " rope_parameters.sliding_attention";
        c.local_rope_theta = get_or<double>(sliding, "rope_theta", c.local_rope_theta, where);
        if (get_or<std::string>(sliding, "rope_type", "default", where) != "default")
            throw Error(ErrorKind::input, where + ": rope_type \"" + sliding["rope_type"].get<std::string>() +
                                              "\" is not supported: Gemma 3's sliding layers rotate without scaling");
    }
    return full.is_object() ? &full : nullptr;
}

// A list with one entry per layer (no_rope_layers, layer_types), its length checked.
template <class T>
std::vector<T> per_layer_list(const json& j, const std::string& key, const std::string& file, const ModelConfig& c) {
    auto values = get<std::vector<T>>(j, key, file);
    if (int64_t(values.size()) != c.num_hidden_layers)
        throw Error(ErrorKind::input, file + ": " + key + " has " + std::to_string(values.size()) +
                                          " entries; num_hidden_layers is " + std::to_string(c.num_hidden_layers));
    return values;
}

// SmolLM3's NoPE layers: no_rope_layers holds 1 for a layer that rotates, 0 for one that does not;
// without it every no_rope_layer_interval-th layer is NoPE (SmolLM3Config's rule).
void read_nope_layers(const json& j, const std::string& file, ModelConfig& c) {
    const size_t layers = size_t(c.num_hidden_layers);
    c.nope_layers.assign(layers, false);
    if (j.contains("no_rope_layers") && !j["no_rope_layers"].is_null()) {
        const auto flags = per_layer_list<int64_t>(j, "no_rope_layers", file, c);
        for (size_t l = 0; l < layers; ++l) c.nope_layers[l] = flags[l] == 0;
        return;
    }
    const int64_t interval = get_or<int64_t>(j, "no_rope_layer_interval", 4, file);
    if (interval <= 0) throw Error(ErrorKind::input, file + ": no_rope_layer_interval must be positive");
    for (size_t l = 0; l < layers; ++l) c.nope_layers[l] = int64_t(l + 1) % interval == 0;
}

// layer_types' entries: true for "sliding_attention", false for "full_attention"
std::vector<bool> sliding_layer_types(const json& j, const std::string& file, const ModelConfig& c) {
    const auto types = per_layer_list<std::string>(j, "layer_types", file, c);
    std::vector<bool> sliding(types.size());
    for (size_t l = 0; l < types.size(); ++l) {
        if (types[l] != "sliding_attention" && types[l] != "full_attention")
            throw Error(ErrorKind::input, file + ": layer_types entry \"" + types[l] +
                                              "\" is not supported (supported: full_attention, sliding_attention)");
        sliding[l] = types[l] == "sliding_attention";
    }
    return sliding;
}

// Gemma 3's and OLMo 3's sliding layers: those layer_types names, else every layer but each
// pattern-th, with the window sliding_window (4096, their config classes' default, without the key;
// none when it is null). Gemma 3's sliding layers also take the local rotary embedding.
void read_sliding_layer_types(const json& j, const std::string& file, ModelConfig& c, int64_t pattern) {
    if (j.contains("layer_types") && !j["layer_types"].is_null()) {
        c.windowed_layers = sliding_layer_types(j, file, c);
    } else {
        if (pattern <= 0) throw Error(ErrorKind::input, file + ": sliding_window_pattern must be positive");
        for (size_t l = 0; l < c.windowed_layers.size(); ++l) c.windowed_layers[l] = int64_t(l + 1) % pattern != 0;
    }
    c.sliding_window = j.contains("sliding_window") ? get_or<int64_t>(j, "sliding_window", 0, file) : 4096;
    if (c.sliding_window < 0) throw Error(ErrorKind::input, file + ": sliding_window must be positive or null");
    // transformers' Olmo3 and Gemma2 fail on such a config
    if ((c.model_type == "olmo3" || c.model_type == "gemma2") && c.sliding_window == 0) {
        const bool olmo3 = c.model_type == "olmo3";
        throw Error(ErrorKind::input, file + ": sliding_window is null or 0, which transformers' " +
                                          (olmo3 ? "Olmo3" : "Gemma2") +
                                          " cannot run; set the window of its sliding layers (4096 in " +
                                          (olmo3 ? "OLMo 3's" : "Gemma 2's") + " configs)");
    }
}

// Sliding-window attention as transformers applies it: Mistral's, Mixtral's and Phi-3's sliding_window
// on every layer (Mistral without the key: MistralConfig's default, 4096; Mixtral's is none), and
// Qwen3-MoE's on every layer under use_sliding_window. Qwen2 / Qwen3 only under
// use_sliding_window; SmolLM3 under it or an explicit layer_types (its config keeps the window
// either way, the flag only choosing the layers when layer_types is absent). The layers are those
// layer_types names "sliding_attention", or else by the config classes' rule: Qwen from
// max_window_layers on, SmolLM3 its NoPE layers.
void read_sliding_window(const json& j, const std::string& file, ModelConfig& c) {
    const size_t layers = size_t(c.num_hidden_layers);  // positive: the sizes are checked first
    c.windowed_layers.assign(layers, false);
    if (c.gemma_norms || c.model_type == "olmo3") {  // OLMo 3: three of every four layers slide
        // Gemma 2: every other layer slides, from the first
        const int64_t pattern = c.model_type == "gemma2" ? 2
                                : c.gemma_norms          ? get_or<int64_t>(j, "sliding_window_pattern", 6, file)
                                                         : 4;
        read_sliding_layer_types(j, file, c, pattern);
        return;
    }
    const bool qwen = c.model_type == "qwen2" || c.model_type == "qwen3";
    const bool per_layer = qwen || c.model_type == "smollm3";
    const bool listed = j.contains("layer_types") && !j["layer_types"].is_null();
    const bool switched_on = get_or<bool>(j, "use_sliding_window", false, file);
    if (per_layer && !switched_on && (qwen || !listed)) return;
    // Qwen3-MoE: use_sliding_window puts the window on every layer (its max_window_layers is unused)
    if (c.model_type == "qwen3_moe" && !switched_on) return;
    if (!per_layer && c.model_type != "mistral" && c.model_type != "phi3" && c.model_type != "mixtral" &&
        c.model_type != "qwen3_moe")
        return;
    const bool absent = !j.contains("sliding_window");
    c.sliding_window = absent && (qwen || c.model_type == "mistral" || c.model_type == "qwen3_moe")
                           ? 4096
                           : get_or<int64_t>(j, "sliding_window", 0, file);
    if (c.sliding_window < 0) throw Error(ErrorKind::input, file + ": sliding_window must be positive or null");
    if (c.sliding_window == 0) return;
    if (!per_layer) {
        c.windowed_layers.assign(layers, true);
        return;
    }
    if (listed) {
        c.windowed_layers = sliding_layer_types(j, file, c);
        return;
    }
    if (!qwen) {
        for (size_t l = 0; l < layers; ++l) c.windowed_layers[l] = !c.layer_rotated(l);
        return;
    }
    const int64_t first = get_or<int64_t>(j, "max_window_layers", 28, file);
    for (size_t l = size_t(std::max<int64_t>(first, 0)); l < layers; ++l) c.windowed_layers[l] = true;
}

// transformers' _compute_yarn_parameters: the frequencies' blend (computed at load) and the cos /
// sin scale, given or from factor (and DeepSeek's mscale / mscale_all_dim)
void read_yarn(const json& scaling, const std::string& file, ModelConfig& c) {
    const std::string where = file + " rope_scaling";
    RopeScaling& s = c.rope_scaling;
    s.type = "yarn";
    s.factor = get<double>(scaling, "factor", where);
    if (!(s.factor > 0)) throw Error(ErrorKind::input, where + ": factor must be positive");
    s.original_max_position_embeddings = get_or<int64_t>(scaling, "original_max_position_embeddings", 0, where);
    if (s.original_max_position_embeddings <= 0) s.original_max_position_embeddings = c.max_position_embeddings;
    // transformers reads these with `or`: 0 counts as absent
    s.beta_fast = get_or<double>(scaling, "beta_fast", 0.0, where);
    s.beta_slow = get_or<double>(scaling, "beta_slow", 0.0, where);
    if (s.beta_fast == 0) s.beta_fast = 32;
    if (s.beta_slow == 0) s.beta_slow = 1;
    s.truncate = get_or<bool>(scaling, "truncate", true, where);
    auto mscale = [&](double scale) { return s.factor <= 1 ? 1.0 : 0.1 * scale * std::log(s.factor) + 1.0; };
    const double m = get_or<double>(scaling, "mscale", 0.0, where), all = get_or<double>(scaling, "mscale_all_dim", 0.0, where);
    s.attention_factor =
        get_or<double>(scaling, "attention_factor", m != 0 && all != 0 ? mscale(m) / mscale(all) : mscale(1), where);
}

// transformers' _compute_longrope_parameters, for sequences up to original_max_position_embeddings
// (the short factors)
void read_longrope(const json& j, const json& scaling, const std::string& file, ModelConfig& c) {
    const std::string where = file + " rope_scaling";
    RopeScaling& s = c.rope_scaling;
    s.type = "longrope";
    s.short_factor = get<std::vector<double>>(scaling, "short_factor", where);
    if (int64_t(s.short_factor.size()) != c.rotary_dim / 2)
        throw Error(ErrorKind::input, where + ": short_factor has " + std::to_string(s.short_factor.size()) + " values; " +
                                          std::to_string(c.rotary_dim / 2) +
                                          " expected (half the rotated dimensions of a head)");
    // The pre-training length: config.json's top level (Phi3Config: 4096 when absent), which
    // transformers reads before rope_parameters' (its version 5 layout); the attention factor then
    // follows from the ratio of the two lengths rather than "factor"
    int64_t original = get_or<int64_t>(j, "original_max_position_embeddings", 0, file);
    if (original == 0) original = get_or<int64_t>(scaling, "original_max_position_embeddings", 0, where);
    if (original == 0 && c.model_type == "phi3") original = 4096;
    double factor = 0;
    if (original > 0) {
        factor = double(c.max_position_embeddings) / double(original);
    } else {
        original = c.max_position_embeddings;
        factor = get<double>(scaling, "factor", where);
    }
    s.original_max_position_embeddings = original;
    s.factor = factor;
    const double suggested = factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(double(original)));
    s.attention_factor = get_or<double>(scaling, "attention_factor", suggested, where);
}

}  // namespace

ModelConfig load_model_config(const std::string& folder) {
    fs::path path = fs::path(folder) / "config.json";
    std::string file = path.string();
    json j = read_json(path);
    ModelConfig c;
    c.config_json = j.dump(2);
    if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty())
        c.architecture = j["architectures"][0].get<std::string>();
    c.model_type = get_or<std::string>(j, "model_type", "", file);
    bool known_arch = kSupported.count(c.architecture) > 0;
    bool known_type = false;
    for (const auto& [arch, type] : kSupported) known_type |= type == c.model_type;
    if (!known_arch || !known_type)
        throw Error(ErrorKind::input, file + ": unsupported model (architectures: \"" + c.architecture + "\", model_type: \"" +
                                          c.model_type + "\"); Grove supports " + supported_list());
    const json top = j;              // a multimodal checkpoint's own keys (its EOS ids)
    if (c.model_type == "gemma3") {  // Gemma 3 4B and larger: the text model's keys are under text_config
        c.nested_text_model = true;
        j = j.contains("text_config") && j["text_config"].is_object() ? j["text_config"] : json::object();
        file += " text_config";
    }
    const bool gemma2 = c.model_type == "gemma2";
    const bool gemma = c.model_type == "gemma3_text" || c.nested_text_model || gemma2;
    if (gemma)  // Gemma2Config's and Gemma3TextConfig's defaults for the keys Grove otherwise requires
        for (const auto& [key, value] : {std::pair<const char*, int64_t>{"vocab_size", gemma2 ? 256000 : 262208},
                                         {"hidden_size", 2304},
                                         {"intermediate_size", 9216},
                                         {"num_hidden_layers", 26},
                                         {"num_attention_heads", 8},
                                         {"num_key_value_heads", 4}})
            if (!j.contains(key) || j[key].is_null()) j[key] = value;
    c.sequence_classifier = c.architecture.find("ForSequenceClassification") != std::string::npos;
    if (c.sequence_classifier)  // transformers: num_labels is the size of id2label, 2 by default
        c.num_labels = j.contains("id2label") && j["id2label"].is_object() ? int64_t(j["id2label"].size())
                                                                           : get_or<int64_t>(j, "num_labels", 2, file);
    c.vocab_size = get<int64_t>(j, "vocab_size", file);
    c.hidden_size = get<int64_t>(j, "hidden_size", file);
    c.intermediate_size = get<int64_t>(j, "intermediate_size", file);
    c.num_hidden_layers = get<int64_t>(j, "num_hidden_layers", file);
    c.num_attention_heads = get<int64_t>(j, "num_attention_heads", file);
    // the config classes' defaults (Qwen3-MoE's 4, Mixtral's 8, Qwen2-MoE's 16); null, or the others':
    // multi-head attention
    const bool kv_heads_null = j.contains("num_key_value_heads") && j["num_key_value_heads"].is_null();
    c.num_key_value_heads = get_or<int64_t>(j, "num_key_value_heads",
                                            kv_heads_null                 ? c.num_attention_heads
                                            : c.model_type == "qwen3_moe" ? 4
                                            : c.model_type == "mixtral"   ? 8
                                            : c.model_type == "qwen2_moe" ? 16
                                                                          : c.num_attention_heads,
                                            file);
    // Qwen3Config's head_dim defaults to 128 rather than hidden_size / heads
    const int64_t default_head_dim = c.model_type == "qwen3" ? 128
                                     : gemma                 ? 256
                                                             : c.hidden_size / std::max<int64_t>(1, c.num_attention_heads);
    c.head_dim = get_or<int64_t>(j, "head_dim", default_head_dim, file);
    const bool olmo = c.model_type == "olmo2" || c.model_type == "olmo3";
    const bool mixtral = c.model_type == "mixtral";
    // the config classes' defaults (Phi3Config's and OlmoeConfig's 4096)
    const bool qwen_like = c.model_type == "qwen2" || c.model_type == "qwen3" || c.model_type == "qwen2_moe" ||
                           c.model_type == "qwen3_moe" || c.model_type == "smollm3";
    c.max_position_embeddings = get_or<int64_t>(j, "max_position_embeddings",
                                                gemma2                                 ? 8192
                                                : gemma                                ? 131072
                                                : olmo || c.model_type == "llama"      ? 2048
                                                : mixtral || c.model_type == "mistral" ? 131072
                                                : qwen_like                            ? 32768
                                                                                       : 4096,
                                                file);
    // the config classes' defaults
    c.rms_norm_eps = get_or<double>(j, "rms_norm_eps",
                                    c.model_type == "phi3" || olmo || mixtral || c.model_type == "olmoe" ? 1e-5 : 1e-6, file);
    c.rope_theta = get_or<double>(j, "rope_theta",
                                  c.model_type == "smollm3" ? 2000000.0
                                  : gemma2                  ? 10000.0
                                  : gemma || mixtral        ? 1000000.0
                                                            : 10000.0,
                                  file);
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object() && j["rope_parameters"].contains("rope_theta"))
        c.rope_theta = j["rope_parameters"]["rope_theta"].get<double>();  // transformers 5 layout
    // the config classes' defaults: SmolLM3Config leaves it to PretrainedConfig's true
    c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", c.model_type == "smollm3" || gemma, file);
    if (c.model_type == "qwen2") {
        c.attention_bias = true;  // Qwen2: q/k/v have biases, o_proj has none
    } else if (c.model_type == "llama" || c.model_type == "smollm3") {
        c.attention_bias = c.o_proj_bias = get_or<bool>(j, "attention_bias", false, file);
        c.mlp_bias = get_or<bool>(j, "mlp_bias", false, file);
    } else if (c.model_type == "qwen3") {
        c.attention_bias = c.o_proj_bias = get_or<bool>(j, "attention_bias", false, file);
        c.qk_norm = true;  // Qwen3: an RMS norm over each head of q and k, before the rotary embedding
    } else if (c.model_type == "phi3") {
        read_phi3_specifics(j, file, c);
    } else if (gemma2) {
        read_gemma2_specifics(j, file, c);
    } else if (gemma) {
        read_gemma3_specifics(j, file, c);
    } else if (c.model_type == "qwen3_moe" || c.model_type == "mixtral" || c.model_type == "olmoe" ||
               c.model_type == "qwen2_moe") {
        read_moe_specifics(j, file, c);
    } else if (olmo) {
        read_olmo2_specifics(j, file, c);
        // OLMo 3's sliding layers rotate without the rope scaling its full layers take
        if (c.model_type == "olmo3") c.local_rope_theta = c.rope_theta;
    }
    // Gemma2Config and Gemma3TextConfig name it hidden_activation (and ignore hidden_act)
    const std::string activation_key = gemma ? "hidden_activation" : "hidden_act";
    const std::string activation = get_or<std::string>(j, activation_key, gemma ? "gelu_pytorch_tanh" : "silu", file);
    if (activation == "gelu_pytorch_tanh")  // ACT2FN: gelu(x, approximate="tanh")
        c.activation = ModelConfig::Activation::gelu_tanh;
    else if (activation != "silu" && activation != "swish")  // ACT2FN: both are nn.SiLU
        throw Error(ErrorKind::input, file + ": " + activation_key + " \"" + activation +
                                          "\" is not supported (supported: silu, swish, gelu_pytorch_tanh)");
    for (int64_t v : {c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
                      c.num_key_value_heads, c.head_dim})
        if (v <= 0) throw Error(ErrorKind::input, file + ": sizes must be positive");
    if (c.num_attention_heads % c.num_key_value_heads != 0)
        throw Error(ErrorKind::input, file + ": num_attention_heads (" + std::to_string(c.num_attention_heads) +
                                          ") must be a multiple of num_key_value_heads (" +
                                          std::to_string(c.num_key_value_heads) + ")");
    if (c.head_dim % 2 != 0) throw Error(ErrorKind::input, file + ": head_dim must be even for rotary embeddings");
    if (c.attention_scale == 0) c.attention_scale = 1.0 / std::sqrt(double(c.head_dim));  // SDPA's own default
    if (c.model_type == "smollm3") read_nope_layers(j, file, c);
    read_sliding_window(j, file, c);
    if (c.rotary_dim == 0) c.rotary_dim = c.head_dim;
    const json* rope_parameters =
        j.contains("rope_parameters") && j["rope_parameters"].is_object() ? &j["rope_parameters"] : nullptr;
    if (gemma && !gemma2 && rope_parameters && rope_parameters->contains("full_attention"))
        rope_parameters = gemma3_rope_parameters(*rope_parameters, file, c);
    const json* scaling = nullptr;
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object())
        scaling = &j["rope_scaling"];
    else if (rope_parameters && rope_parameters->value("rope_type", "default") != "default")
        scaling = rope_parameters;
    if (scaling) {
        std::string type = scaling->value("rope_type", scaling->value("type", std::string("default")));
        if (type == "llama3") {
            c.rope_scaling.type = type;
            c.rope_scaling.factor = get<double>(*scaling, "factor", file + " rope_scaling");
            c.rope_scaling.low_freq_factor = get<double>(*scaling, "low_freq_factor", file + " rope_scaling");
            c.rope_scaling.high_freq_factor = get<double>(*scaling, "high_freq_factor", file + " rope_scaling");
            c.rope_scaling.original_max_position_embeddings =
                get<int64_t>(*scaling, "original_max_position_embeddings", file + " rope_scaling");
        } else if (type == "longrope" || (c.model_type == "phi3" && (type == "su" || type == "yarn"))) {
            // Phi3Config renames its older configs' "su" and "yarn" to longrope
            read_longrope(j, *scaling, file, c);
        } else if (type == "yarn") {
            read_yarn(*scaling, file, c);
        } else if (type == "linear") {  // position interpolation: every frequency divided by factor
            c.rope_scaling.type = type;
            c.rope_scaling.factor = get<double>(*scaling, "factor", file + " rope_scaling");
            if (!(c.rope_scaling.factor > 0)) throw Error(ErrorKind::input, file + " rope_scaling: factor must be positive");
        } else if (type != "default") {
            throw Error(ErrorKind::input, file + ": rope_scaling type \"" + type +
                                              "\" is not supported (supported: none, llama3, longrope, linear, yarn)");
        }
    }
    if (j.contains("eos_token_id")) add_ids(j["eos_token_id"], c.eos_token_ids);
    if (c.nested_text_model && top.contains("eos_token_id")) add_ids(top["eos_token_id"], c.eos_token_ids);
    if (gemma) {  // Gemma2Config's and Gemma3TextConfig's ids where the keys are absent
        if (!j.contains("eos_token_id")) c.eos_token_ids.push_back(1);
        if (!j.contains("bos_token_id")) c.bos_token_id = 2;
        if (!j.contains("pad_token_id")) c.pad_token_id = 0;
    }
    if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"].get<int64_t>();
    if (j.contains("pad_token_id") && j["pad_token_id"].is_number_integer()) c.pad_token_id = j["pad_token_id"].get<int64_t>();
    fs::path generation = fs::path(folder) / "generation_config.json";
    if (fs::exists(generation)) {
        json g = read_json(generation);
        c.generation_config_json = g.dump(2);
        if (g.contains("eos_token_id")) add_ids(g["eos_token_id"], c.eos_token_ids);
        if (!c.pad_token_id && g.contains("pad_token_id") && g["pad_token_id"].is_number_integer())
            c.pad_token_id = g["pad_token_id"].get<int64_t>();
    }
    std::sort(c.eos_token_ids.begin(), c.eos_token_ids.end());
    c.eos_token_ids.erase(std::unique(c.eos_token_ids.begin(), c.eos_token_ids.end()), c.eos_token_ids.end());
    check_tokenizer_files(folder);  // a damaged tokenizer is named now, even by commands that never tokenize
    return c;
}

// ---------------------------------------------------------------------------------------------
namespace {
thread_local bool t_decode_kernels = false;

// Inside a DecodeKernelScope, gradient-free CPU float32 work goes to the decode kernels
bool decode_kernels_apply(const at::Tensor& t) {
    return t_decode_kernels && !at::GradMode::is_enabled() && t.device().is_cpu() && t.scalar_type() == at::kFloat &&
           !at::autocast::is_autocast_enabled(at::kCPU);
}

// Products of at most this many rows go to kernels::small_batch_linear; larger ones (prefill) are
// real GEMMs, where the BLAS wins
constexpr int64_t kSmallBatchMaxRows = 32;

at::Tensor linear_for_scope(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
    if (decode_kernels_apply(x) && weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.is_contiguous() &&
        x.dim() >= 1 && x.size(-1) == weight.size(1) &&
        (!bias || (bias->scalar_type() == at::kFloat && bias->is_contiguous()))) {
        const int64_t K = weight.size(1), N = weight.size(0), rows = K > 0 ? x.numel() / K : 0;
        if (rows >= 1 && rows <= kSmallBatchMaxRows) {
            at::Tensor input = x.reshape({rows, K}).contiguous();
            std::vector<int64_t> sizes = x.sizes().vec();
            sizes.back() = N;
            at::Tensor y = at::empty(sizes, x.options());
            kernels::small_batch_linear(input.data_ptr<float>(), K, weight.data_ptr<float>(),
                                        bias ? bias->data_ptr<float>() : nullptr, y.data_ptr<float>(), N, rows, K, N,
                                        at::get_num_threads());
            return y;
        }
    }
    return bias ? at::linear(x, weight, *bias) : at::linear(x, weight);
}
}  // namespace

DecodeKernelScope::DecodeKernelScope() : previous_(t_decode_kernels) { t_decode_kernels = kernels::decode_kernels_available(); }
DecodeKernelScope::~DecodeKernelScope() { t_decode_kernels = previous_; }

at::Tensor Linear::base(const at::Tensor& x) const { return linear_for_scope(x, weight, bias); }

at::Tensor Linear::operator()(const at::Tensor& x) const {
    at::Tensor y = base(x);
    if (adapter && (!adapters_enabled || *adapters_enabled)) y = y + adapter->delta(x, y);
    return y;
}

Model::~Model() = default;

namespace {

// Every weight of the checkpoint, by name, from model.safetensors or the sharded index.
class WeightSource {
public:
    explicit WeightSource(const std::string& folder) {
        fs::path single = fs::path(folder) / "model.safetensors";
        fs::path index = fs::path(folder) / "model.safetensors.index.json";
        if (fs::exists(single)) {
            open(single.string());
        } else if (fs::exists(index)) {
            json j = read_json(index);
            if (!j.contains("weight_map") || !j["weight_map"].is_object())
                throw Error(ErrorKind::input, index.string() + ": missing \"weight_map\"");
            std::set<std::string> shards;
            for (const auto& [name, shard] : j["weight_map"].items()) shards.insert(shard.get<std::string>());
            for (const auto& shard : shards) {
                if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos)
                    throw Error(ErrorKind::input,
                                index.string() + ": shard name \"" + shard + "\" must be a file in the folder");
                open((fs::path(folder) / shard).string());
            }
        } else {
            throw Error(ErrorKind::input, folder +
                                              ": no model.safetensors or model.safetensors.index.json "
                                              "(only safetensors checkpoints are supported; convert .bin with transformers)");
        }
    }
    at::Tensor take(const std::string& name, std::vector<int64_t> shape) {
        const auto [file, entry] = locate(name);
        if (entry->shape != shape) {
            std::ostringstream os;
            os << file->path() << ": tensor \"" << name << "\" has shape " << c10::IntArrayRef(entry->shape)
               << " but config.json implies " << c10::IntArrayRef(shape);
            throw Error(ErrorKind::input, os.str());
        }
        if (entry->dtype != DType::f32 && entry->dtype != DType::f16 && entry->dtype != DType::bf16)
            throw Error(ErrorKind::input, file->path() + ": tensor \"" + name + "\" has dtype " + dtype_name(entry->dtype) +
                                              "; weights must be F32, F16 or BF16");
        used_.insert(name);
        return tensor_from_entry(*entry, file->path());
    }
    bool has(const std::string& name) const { return where_.count(name) > 0; }
    // A tensor as the file holds it, any dtype or shape (one the model does not compute with)
    at::Tensor take_as_stored(const std::string& name) {
        const auto [file, entry] = locate(name);
        return tensor_from_entry(*entry, file->path());
    }
    std::vector<std::string> unused() const {
        std::vector<std::string> names;
        for (const auto& [name, file] : where_)
            if (!used_.count(name)) names.push_back(name);
        return names;
    }

private:
    // the file holding the tensor and its entry; a missing tensor is an input error naming it
    std::pair<const SafetensorsFile*, const TensorEntry*> locate(const std::string& name) const {
        auto it = where_.find(name);
        if (it == where_.end()) throw Error(ErrorKind::input, files_.front()->path() + ": missing tensor \"" + name + "\"");
        const SafetensorsFile* file = files_[it->second].get();
        return {file, file->find(name)};
    }
    void open(const std::string& path) {
        files_.push_back(std::make_unique<SafetensorsFile>(path));
        for (const auto& t : files_.back()->tensors()) where_[t.name] = files_.size() - 1;
    }
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, size_t> where_;
    std::set<std::string> used_;
};

// The decoder's module path: "model." (transformers' model.language_model. in a Gemma 3 multimodal model)
std::string decoder_path(const ModelConfig& c) { return c.nested_text_model ? "model.language_model." : "model."; }

// A module's parameter as the checkpoint names it: the module path itself, except in a Gemma 3
// multimodal checkpoint, which stores transformers' model.language_model.* as language_model.model.*
// (and lm_head as language_model.lm_head)
std::string checkpoint_tensor_name(const ModelConfig& c, const std::string& module_path) {
    if (!c.nested_text_model) return module_path;
    const std::string nested = decoder_path(c);
    if (module_path.compare(0, nested.size(), nested) == 0) return "language_model.model." + module_path.substr(nested.size());
    return "language_model." + module_path;
}

// transformers' _compute_llama3_parameters
at::Tensor llama3_inv_freq(const at::Tensor& inv_freq, const RopeScaling& s) {
    double low_wavelen = double(s.original_max_position_embeddings) / s.low_freq_factor;
    double high_wavelen = double(s.original_max_position_embeddings) / s.high_freq_factor;
    at::Tensor wavelen = 2 * M_PI / inv_freq;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
    at::Tensor smooth =
        (double(s.original_max_position_embeddings) / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
    at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    return at::where(medium, smoothed, scaled);
}

// transformers' _compute_yarn_parameters: the original frequencies (extrapolation) for the fast
// dimensions, divided by factor (interpolation) for the slow ones, a linear ramp between
at::Tensor yarn_inv_freq(const at::Tensor& frequency_powers, const ModelConfig& c) {
    const RopeScaling& s = c.rope_scaling;
    const double dim = double(c.rotary_dim);
    auto correction_dim = [&](double rotations) {  // the dimension that turns `rotations` times over the original length
        return dim * std::log(double(s.original_max_position_embeddings) / (rotations * 2 * M_PI)) /
               (2 * std::log(c.rope_theta));
    };
    double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
    if (s.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;
    const at::Tensor ramp = ((at::arange(c.rotary_dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
    const at::Tensor extrapolation_share = 1 - ramp;
    const at::Tensor extrapolation = 1.0 / frequency_powers, interpolation = 1.0 / (s.factor * frequency_powers);
    return interpolation * (1 - extrapolation_share) + extrapolation * extrapolation_share;
}

at::Device parse_device(const std::string& device) {
    if (device == "auto") return at::hasCUDA() ? at::Device("cuda") : at::Device("cpu");
    try {
        at::Device d(device);
        if (d.is_cuda() && !at::hasCUDA())
            throw Error(ErrorKind::usage, "device \"" + device + "\" requested, but no CUDA device is available");
        return d;
    } catch (const c10::Error&) {
        throw Error(ErrorKind::usage, "unknown device \"" + device + "\"; use cpu, cuda, cuda:N or auto");
    }
}

at::ScalarType parse_dtype_name(const std::string& dtype) {
    if (dtype == "float32") return at::kFloat;
    if (dtype == "bfloat16") return at::kBFloat16;
    throw Error(ErrorKind::usage, "unknown dtype \"" + dtype + "\"; use float32 or bfloat16");
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& folder, const std::string& device_name, const std::string& dtype_name) {
    load_model_config(folder);  // a folder that is not a model is reported by its config.json first
    WeightSource weights(folder);
    auto m = build(
        folder, [&](const std::string& name, std::vector<int64_t> shape) { return weights.take(name, shape); }, device_name,
        dtype_name);
    if (m->config_.nested_text_model) {  // the vision tower and projector, written back by save()
        m->passthrough_folder_ = fs::absolute(folder).string();
        m->passthrough_tensors_ = weights.unused();
    }
    return m;
}

std::unique_ptr<Model> Model::initialize(const std::string& folder, uint64_t seed, const std::string& device,
                                         const std::string& dtype) {
    // transformers' LlamaPreTrainedModel._init_weights: N(0, 0.02) weights, zero biases, unit norms
    // (Gemma's norms scale by 1 + weight: zero)
    at::Generator g = at::detail::createCPUGenerator(seed);
    const ModelConfig config = load_model_config(folder);
    if (config.nested_text_model)
        throw Error(ErrorKind::input, folder + "/config.json: " + config.architecture +
                                          " cannot be initialised from scratch (its vision tower is not Grove's to "
                                          "create); start from the checkpoint's weights");
    const bool gemma_norms = config.gemma_norms;
    auto random = [&](const std::string& name, std::vector<int64_t> shape) {
        if (name.find("norm") != std::string::npos)
            return gemma_norms ? at::zeros(shape, at::kFloat) : at::ones(shape, at::kFloat);
        if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) return at::zeros(shape, at::kFloat);
        return at::empty(shape, at::kFloat).normal_(0.0, 0.02, g);
    };
    return build(folder, random, device, dtype);
}

std::unique_ptr<Model> Model::build(const std::string& folder,
                                    const std::function<at::Tensor(const std::string&, std::vector<int64_t>)>& source,
                                    const std::string& device_name, const std::string& dtype_name) {
    std::unique_ptr<Model> m(new Model());
    m->config_ = load_model_config(folder);
    const ModelConfig& c = m->config_;
    at::Device device = parse_device(device_name);
    at::ScalarType dtype = parse_dtype_name(dtype_name);
    auto place = [&](at::Tensor t) { return t.to(device, dtype).contiguous(); };
    struct {
        const std::function<at::Tensor(const std::string&, std::vector<int64_t>)>& f;
        at::Tensor take(const std::string& name, std::vector<int64_t> shape) { return f(name, std::move(shape)); }
    } weights{source};
    int64_t q_out = c.num_attention_heads * c.head_dim, kv_out = c.num_key_value_heads * c.head_dim;
    // parameters by module path (transformers' module tree: PEFT's names), read under the checkpoint's name
    auto parameter = [&](const std::string& module_path, std::vector<int64_t> shape) {
        return place(weights.take(checkpoint_tensor_name(c, module_path), std::move(shape)));
    };
    const std::string decoder = decoder_path(c);
    m->embed_tokens_ = parameter(decoder + "embed_tokens.weight", {c.vocab_size, c.hidden_size});
    auto linear = [&](const std::string& name, int64_t out, int64_t in, bool bias) {
        Linear l;
        l.name = name;
        l.weight = parameter(name + ".weight", {out, in});
        if (bias) l.bias = parameter(name + ".bias", {out});
        return l;
    };
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        std::string p = decoder + "layers." + std::to_string(i);
        auto layer = std::make_unique<Layer>();
        if (!c.post_norms_only) layer->input_norm = parameter(p + ".input_layernorm.weight", {c.hidden_size});
        layer->post_attention_norm = parameter(p + ".post_attention_layernorm.weight", {c.hidden_size});
        if (c.gemma_norms) layer->pre_feedforward_norm = parameter(p + ".pre_feedforward_layernorm.weight", {c.hidden_size});
        if (c.gemma_norms || c.post_norms_only)
            layer->post_feedforward_norm = parameter(p + ".post_feedforward_layernorm.weight", {c.hidden_size});
        if (c.qk_norm) {
            layer->q_norm = parameter(p + ".self_attn.q_norm.weight", {c.qk_norm_whole ? q_out : c.head_dim});
            layer->k_norm = parameter(p + ".self_attn.k_norm.weight", {c.qk_norm_whole ? kv_out : c.head_dim});
        }
        // in checkpoint order: Model::initialize draws its random weights in this order
        if (c.fused_projections) {
            layer->qkv = linear(p + ".self_attn.qkv_proj", q_out + 2 * kv_out, c.hidden_size, c.attention_bias);
        } else {
            layer->q = linear(p + ".self_attn.q_proj", q_out, c.hidden_size, c.attention_bias);
            layer->k = linear(p + ".self_attn.k_proj", kv_out, c.hidden_size, c.attention_bias);
            layer->v = linear(p + ".self_attn.v_proj", kv_out, c.hidden_size, c.attention_bias);
        }
        layer->o = linear(p + ".self_attn.o_proj", c.hidden_size, q_out, c.o_proj_bias);
        if (c.layer_sparse(size_t(i))) {
            const bool mixtral = c.model_type == "mixtral";
            const std::string block = p + (mixtral ? ".block_sparse_moe" : ".mlp");
            layer->router = linear(block + ".gate", c.num_experts, c.hidden_size, false);
            auto expert = [&](const std::string& path, int64_t width) {  // a SwiGLU under its checkpoint names
                Layer::Expert x;
                x.gate = linear(path + (mixtral ? ".w1" : ".gate_proj"), width, c.hidden_size, false);
                x.up = linear(path + (mixtral ? ".w3" : ".up_proj"), width, c.hidden_size, false);
                x.down = linear(path + (mixtral ? ".w2" : ".down_proj"), c.hidden_size, width, false);
                return x;
            };
            for (int64_t e = 0; e < c.num_experts; ++e)
                layer->experts.push_back(expert(block + ".experts." + std::to_string(e), c.moe_intermediate_size));
            if (c.shared_expert_intermediate_size > 0) {
                layer->shared_expert = expert(block + ".shared_expert", c.shared_expert_intermediate_size);
                layer->shared_expert_gate = linear(block + ".shared_expert_gate", 1, c.hidden_size, false);
            }
        } else if (c.fused_projections) {
            layer->gate_up = linear(p + ".mlp.gate_up_proj", 2 * c.intermediate_size, c.hidden_size, c.mlp_bias);
        } else {
            layer->gate = linear(p + ".mlp.gate_proj", c.intermediate_size, c.hidden_size, c.mlp_bias);
            layer->up = linear(p + ".mlp.up_proj", c.intermediate_size, c.hidden_size, c.mlp_bias);
        }
        if (!layer->sparse()) layer->down = linear(p + ".mlp.down_proj", c.hidden_size, c.intermediate_size, c.mlp_bias);
        m->layers_.push_back(std::move(layer));
    }
    m->norm_ = parameter(decoder + "norm.weight", {c.hidden_size});
    if (c.sequence_classifier)
        m->score_ = parameter("score.weight", {c.num_labels, c.hidden_size});
    else if (!c.tie_word_embeddings)
        m->lm_head_ = parameter("lm_head.weight", {c.vocab_size, c.hidden_size});
    // theta^(2i / rotary_dim), float32 as transformers computes it
    auto powers_of = [&](double theta) {
        return at::pow(theta, at::arange(0, c.rotary_dim, 2, at::kLong).to(at::kFloat) / double(c.rotary_dim));
    };
    const at::Tensor frequency_powers = powers_of(c.rope_theta);
    at::Tensor inv_freq = 1.0 / frequency_powers;
    if (c.rope_scaling.type == "llama3") inv_freq = llama3_inv_freq(inv_freq, c.rope_scaling);
    if (c.rope_scaling.type == "linear") inv_freq = inv_freq / c.rope_scaling.factor;
    if (c.rope_scaling.type == "yarn") inv_freq = yarn_inv_freq(frequency_powers, c);
    if (c.rope_scaling.type == "longrope")
        inv_freq = 1.0 / (at::tensor(c.rope_scaling.short_factor, at::kDouble).to(at::kFloat) * frequency_powers);
    m->inv_freq_ = inv_freq.to(device);
    if (c.local_rope_theta > 0)  // Gemma 3's sliding layers: the plain rotation with their own base
        m->local_inv_freq_ = (1.0 / powers_of(c.local_rope_theta)).to(device);
    // cuDNN's attention builds a graph per shape, on the host: decoding grows the key length every
    // step, and that planning took 2.3 ms per call, 60% of a decode step (measured on an H100). The
    // memory-efficient and flash kernels have no such cost.
    if (device.is_cuda()) at::globalContext().setSDPUseCuDNN(false);
    return m;
}

at::Device Model::device() const { return embed_tokens_.device(); }
at::ScalarType Model::dtype() const { return norm_.scalar_type(); }  // the embedding may be a float32 head
at::Tensor Model::lm_head_weight() const { return lm_head_ ? *lm_head_ : embedding_with_trained_rows(); }

at::Tensor Model::embedding_with_trained_rows() const {
    if (!token_rows_ || !adapters_enabled_) return embed_tokens_;
    // PEFT's get_merged_weights: the rows replaced, differentiable in the trained ones
    return embed_tokens_.index_copy(0, token_rows_->indices, token_rows_->values.to(embed_tokens_.scalar_type()));
}

void Model::check_sequence_length(int64_t tokens) const {
    const ModelConfig& c = config_;
    const int64_t original = c.rope_scaling.original_max_position_embeddings;
    if (c.rope_scaling.type == "longrope" && tokens > original)
        throw Error(ErrorKind::input,
                    "a sequence of " + std::to_string(tokens) + " tokens (padding included) is longer than this " +
                        c.architecture + " (" + c.model_type + ") checkpoint's original_max_position_embeddings (" +
                        std::to_string(original) +
                        "), where transformers switches its longrope rotary embedding to the long factors, which Grove "
                        "does not apply; shorten the prompts or generation.max_completion_length so that prompt + completion "
                        "stays within " +
                        std::to_string(original) + " tokens");
}

KVCache Model::make_cache(int64_t batch, int64_t capacity) const {
    KVCache cache;
    cache.capacity = capacity;
    auto options = norm_.options();
    for (size_t i = 0; i < layers_.size(); ++i) {
        cache.keys.push_back(at::empty({batch, config_.num_key_value_heads, capacity, config_.head_dim}, options));
        cache.values.push_back(at::empty({batch, config_.num_key_value_heads, capacity, config_.head_dim}, options));
    }
    return cache;
}

namespace {
// The linears' weights (and biases) as one matrix whose rows are theirs in order; each linear's
// weight then views its rows. Nothing when only some of them have a bias.
void concatenate(const std::vector<Linear*>& linears, at::Tensor& weight, std::optional<at::Tensor>& bias) {
    std::vector<at::Tensor> weights, biases;
    for (const Linear* l : linears) {
        weights.push_back(l->weight);
        if (l->bias) biases.push_back(*l->bias);
    }
    if (!biases.empty() && biases.size() != linears.size()) return;
    weight = at::cat(weights);
    if (!biases.empty()) bias = at::cat(biases);
    int64_t row = 0;
    for (Linear* l : linears) {
        const int64_t rows = l->weight.size(0);
        l->weight = weight.narrow(0, row, rows);
        if (bias) l->bias = bias->narrow(0, row, rows);
        row += rows;
    }
}

// The inverse for a fused linear (Phi-3's qkv_proj, gate_up_proj): its weight (and bias) becomes the
// matrix, and each part views its rows in order.
void split(const Linear& fused, const std::vector<std::pair<Linear*, int64_t>>& parts, at::Tensor& weight,
           std::optional<at::Tensor>& bias) {
    weight = fused.weight;
    bias = fused.bias;
    int64_t row = 0;
    for (auto [part, rows] : parts) {
        part->name = fused.name;
        part->weight = weight.narrow(0, row, rows);
        if (bias) part->bias = bias->narrow(0, row, rows);
        row += rows;
    }
}
}  // namespace

std::unique_ptr<Model> Model::generation_copy(at::ScalarType dtype) const {
    at::NoGradGuard no_grad;
    std::unique_ptr<Model> m(new Model());
    m->config_ = config_;
    auto cast = [&](const at::Tensor& t) { return t.detach().to(dtype, /*non_blocking=*/false, /*copy=*/true); };
    auto copy_linear = [&](const Linear& from) {
        Linear l;
        l.name = from.name;
        l.weight =
            from.adapter && adapters_enabled_
                ? (from.weight.detach().to(at::kFloat) + from.adapter->merged_delta().to(from.weight.device(), at::kFloat))
                      .to(dtype)
                : cast(from.weight);
        if (from.bias) l.bias = cast(*from.bias);
        return l;
    };
    // a float32 head stays float32 (a tied one is the embedding matrix)
    m->lm_head_float32_ = lm_head_float32_;
    const at::Tensor embedding = embedding_with_trained_rows().detach();
    m->embed_tokens_ = lm_head_float32_ && !lm_head_ ? embedding.clone() : cast(embedding);
    for (const auto& from : layers_) {
        auto layer = std::make_unique<Layer>();
        if (from->input_norm.defined()) layer->input_norm = cast(from->input_norm);
        layer->post_attention_norm = cast(from->post_attention_norm);
        if (from->pre_feedforward_norm.defined()) layer->pre_feedforward_norm = cast(from->pre_feedforward_norm);
        if (from->post_feedforward_norm.defined()) layer->post_feedforward_norm = cast(from->post_feedforward_norm);
        if (from->q_norm.defined()) {
            layer->q_norm = cast(from->q_norm);
            layer->k_norm = cast(from->k_norm);
        }
        layer->o = copy_linear(from->o);
        if (from->sparse()) {
            layer->router = copy_linear(from->router);
            auto copy_expert = [&](const Layer::Expert& e) {
                return Layer::Expert{copy_linear(e.gate), copy_linear(e.up), copy_linear(e.down)};
            };
            for (const auto& expert : from->experts) layer->experts.push_back(copy_expert(expert));
            if (from->shared_expert_gate.weight.defined()) {
                layer->shared_expert = copy_expert(from->shared_expert);
                layer->shared_expert_gate = copy_linear(from->shared_expert_gate);
            }
        } else {
            layer->down = copy_linear(from->down);
        }
        if (from->fused()) {  // the copy's layout either way: separate linears viewing one matrix
            const int64_t q_rows = config_.num_attention_heads * config_.head_dim,
                          kv_rows = config_.num_key_value_heads * config_.head_dim;
            split(copy_linear(from->qkv), {{&layer->q, q_rows}, {&layer->k, kv_rows}, {&layer->v, kv_rows}}, layer->qkv_weight,
                  layer->qkv_bias);
            split(copy_linear(from->gate_up),
                  {{&layer->gate, config_.intermediate_size}, {&layer->up, config_.intermediate_size}}, layer->gate_up_weight,
                  layer->gate_up_bias);
        } else {
            for (auto [to, source] : {std::pair{&layer->q, &from->q}, {&layer->k, &from->k}, {&layer->v, &from->v}})
                *to = copy_linear(*source);
            if (!from->sparse()) {
                layer->gate = copy_linear(from->gate);
                layer->up = copy_linear(from->up);
            }
        }
        m->layers_.push_back(std::move(layer));
    }
    m->norm_ = cast(norm_);
    if (lm_head_) m->lm_head_ = lm_head_float32_ ? lm_head_->detach().clone() : cast(*lm_head_);
    m->inv_freq_ = inv_freq_;
    m->local_inv_freq_ = local_inv_freq_;
    m->concatenate_projections();
    return m;
}

void Model::concatenate_projections() {
    // an adapter's merged delta is added to its linear's own weight: views of a shared matrix would
    // take the update in place for one linear and not the others
    if (has_adapters())
        throw Error(ErrorKind::usage, "concatenate_projections: the model has adapters; generate from a generation copy");
    at::NoGradGuard no_grad;
    for (auto& layer : layers_) {
        if (layer->fused()) continue;  // Phi-3: one checkpoint tensor per group already
        if (!layer->qkv_weight.defined()) concatenate({&layer->q, &layer->k, &layer->v}, layer->qkv_weight, layer->qkv_bias);
        if (!layer->gate_up_weight.defined() && !layer->sparse())
            concatenate({&layer->gate, &layer->up}, layer->gate_up_weight, layer->gate_up_bias);
    }
}

std::vector<Linear*> Model::Layer::attention_linears() {
    if (fused()) return {&qkv, &o};
    return {&q, &k, &v, &o};
}

std::vector<Linear*> Model::Layer::mlp_linears() {
    if (sparse()) {
        std::vector<Linear*> all{&router};
        for (Expert& e : experts) all.insert(all.end(), {&e.gate, &e.up, &e.down});
        if (shared_expert_gate.weight.defined())
            all.insert(all.end(), {&shared_expert.gate, &shared_expert.up, &shared_expert.down, &shared_expert_gate});
        return all;
    }
    if (fused()) return {&gate_up, &down};
    return {&gate, &up, &down};
}

std::vector<Linear*> Model::Layer::linears() {
    std::vector<Linear*> all = attention_linears(), mlp = mlp_linears();
    all.insert(all.end(), mlp.begin(), mlp.end());
    return all;
}

std::vector<at::Tensor> split_columns(const at::Tensor& y, const std::vector<int64_t>& widths) {
    std::vector<at::Tensor> out;
    int64_t column = 0;
    for (int64_t width : widths) {
        out.push_back(y.narrow(-1, column, width));
        column += width;
    }
    return out;
}

// Phi-3 slices qkv_proj's output [q | k | v] and chunks gate_up_proj's [gate | up] in halves
std::vector<at::Tensor> Model::Layer::project_qkv(const at::Tensor& x) const {
    if (!fused()) return {q(x), k(x), v(x)};
    const int64_t q_width = o.weight.size(1), kv_width = (qkv.weight.size(0) - q_width) / 2;
    return split_columns(qkv(x), {q_width, kv_width, kv_width});
}

std::vector<at::Tensor> Model::Layer::project_gate_up(const at::Tensor& x) const {
    if (!fused()) return {gate(x), up(x)};
    const int64_t width = down.weight.size(1);
    return split_columns(gate_up(x), {width, width});
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const int64_t rotated = cos.size(-1), width = x.size(-1);
    if (rotated < width)  // a partial rotary embedding: the rest of each head passes through
        return at::cat({apply_rotary(x.narrow(-1, 0, rotated), cos, sin), x.narrow(-1, rotated, width - rotated)}, -1);
    const int64_t half = x.size(-1) / 2;
    return x * cos + at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1) * sin;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, NormScaling scaling) {
    if (scaling != NormScaling::after_cast) {
        const at::Tensor scale =
            scaling == NormScaling::one_plus_in_float32 ? weight.to(at::kFloat) + 1.0 : weight.to(at::kFloat);
        // in float32 the product below is the same one, so the decode kernel may compute it
        if (x.scalar_type() == at::kFloat) return rms_norm(x, scale, eps);
        at::Tensor h = x.to(at::kFloat);
        return (h * at::rsqrt(h.pow(2).mean(-1, true) + eps) * scale).to(x.scalar_type());
    }
    if (decode_kernels_apply(x) && x.is_contiguous() && weight.scalar_type() == at::kFloat && weight.is_contiguous()) {
        const int64_t H = x.size(-1);
        at::Tensor y = at::empty_like(x);
        kernels::rms_norm(x.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(), x.numel() / H, H, float(eps));
        return y;
    }
    at::Tensor h = x.to(at::kFloat);
    h = h * at::rsqrt(h.pow(2).mean(-1, true) + eps);
    return weight * h.to(x.scalar_type());
}

at::Tensor head_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, NormScaling scaling) {
    return rms_norm(x.unflatten(-1, {-1, weight.size(0)}), weight, eps, scaling).flatten(-2);
}

at::Tensor gated_activation(const at::Tensor& gate, const at::Tensor& up, ModelConfig::Activation activation) {
    if (activation == ModelConfig::Activation::gelu_tanh) return at::gelu(gate, "tanh") * up;
    return at::silu(gate) * up;
}

at::Tensor Model::norm(const at::Tensor& x, const at::Tensor& weight) const {
    return rms_norm(x, weight, config_.rms_norm_eps, config_.norm_scaling);
}

// How the positions of one forward pass see each other.
struct Model::Attention {
    // a padded batch: [B, 1, T, S], key j visible to query i
    at::Tensor visible;
    // the sliding-window layers' mask, undefined where the window hides no key: a padded batch's
    // visible less the keys sliding_window or more real tokens before the query ([B, 1, T, S]);
    // packed rows: the causal band of the window ([1, 1, width, width])
    at::Tensor windowed;
    // packed rows (h is [1, N, H]): token n sits in slot slots[n] of a right-padded [rows, width]
    // batch, in which plain causal attention is the padded batch's masked attention
    at::Tensor slots;
    int64_t rows = 0, width = 0;
    // where a mixture of experts records its routing (a packed training pass); null: nowhere
    RouterLoad* router_load = nullptr;
};

at::Tensor Model::layer_forward(size_t index, const at::Tensor& h_in, const at::Tensor& cos, const at::Tensor& sin,
                                const Attention& attention, KVCache* cache) const {
    const ModelConfig& c = config_;
    const Layer& layer = *layers_[index];
    const int64_t B = h_in.size(0), T = h_in.size(1), S = (cache ? cache->length : 0) + T;
    at::Tensor h = h_in;
    at::Tensor x = c.post_norms_only ? h : norm(h, layer.input_norm);
    auto qkv = layer.project_qkv(x);  // [B, T, heads * head_dim] each
    at::Tensor q = qkv[0], k = qkv[1], v = qkv[2];
    if (layer.q_norm.defined()) {
        q = head_rms_norm(q, layer.q_norm, c.rms_norm_eps, c.norm_scaling);
        k = head_rms_norm(k, layer.k_norm, c.rms_norm_eps, c.norm_scaling);
    }
    // the decode kernels: rotary in place on the fresh projections, and (one new position with a
    // cache) the attention on the cache
    const bool rotary_kernel = decode_kernels_apply(q) && q.is_contiguous() && k.is_contiguous() && cos.is_contiguous() &&
                               sin.is_contiguous() && cos.scalar_type() == at::kFloat && cos.numel() == B * T * c.head_dim;
    if (rotary_kernel) {
        kernels::rotary(q.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(), B * T, c.num_attention_heads,
                        c.head_dim);
        kernels::rotary(k.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(), B * T, c.num_key_value_heads,
                        c.head_dim);
    }
    const at::Tensor& visible =
        c.layer_windowed(index) && attention.windowed.defined() ? attention.windowed : attention.visible;
    const bool attention_kernel = rotary_kernel && cache && T == 1 && !attention.slots.defined() && v.is_contiguous() &&
                                  cache->keys[index].is_contiguous() && cache->values[index].is_contiguous() &&
                                  visible.is_contiguous() && visible.scalar_type() == at::kBool && visible.numel() == B * S;
    at::Tensor attn;  // [B, T, heads * head_dim]
    if (attention_kernel) {
        attn = at::empty({B, 1, c.num_attention_heads * c.head_dim}, q.options());
        kernels::decode_attention(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                  cache->keys[index].data_ptr<float>(), cache->values[index].data_ptr<float>(), cache->capacity,
                                  visible.data_ptr<bool>(), attn.data_ptr<float>(), B, c.num_attention_heads,
                                  c.num_key_value_heads, S, c.head_dim, float(c.attention_scale),
                                  float(c.attention_logit_softcap), at::get_num_threads());
    } else {
        q = q.view({B, T, c.num_attention_heads, c.head_dim}).transpose(1, 2);
        k = k.view({B, T, c.num_key_value_heads, c.head_dim}).transpose(1, 2);
        v = v.view({B, T, c.num_key_value_heads, c.head_dim}).transpose(1, 2);
        if (!rotary_kernel) {
            q = apply_rotary(q, cos, sin);
            k = apply_rotary(k, cos, sin);
            if (c.rotary_in_float32) q = q.to(v.scalar_type()), k = k.to(v.scalar_type());  // v: their own dtype
        }
        attn = attend(q, k, v, attention, visible, cache, index);
    }
    if (c.post_norms_only) {
        h = h + norm(layer.o(attn), layer.post_attention_norm);
        return h + norm(mlp(layer, h, attention.router_load), layer.post_feedforward_norm);
    }
    if (!c.gemma_norms) {
        h = h + layer.o(attn);
        return h + mlp(layer, norm(h, layer.post_attention_norm), attention.router_load);
    }
    h = h + norm(layer.o(attn), layer.post_attention_norm);
    return h + norm(mlp(layer, norm(h, layer.pre_feedforward_norm), attention.router_load), layer.post_feedforward_norm);
}

namespace {
// Attention with soft-capped scores (Gemma 2), in the order of transformers' eager attention, the
// only one of its implementations that applies the cap: the scaled product and the cap in q's
// dtype, masked keys at the dtype's lowest value, the softmax in float32 cast back. q [B, heads, T,
// D]; k, v [B, kv_heads, S, D] (heads a multiple of kv_heads); visible [B or 1, 1, T, S], key j
// visible to query i, or none: causal (the last T of S positions).
at::Tensor softcapped_attention(const at::Tensor& q, at::Tensor k, at::Tensor v, const std::optional<at::Tensor>& visible,
                                double scale, double cap) {
    const int64_t group = q.size(1) / k.size(1), T = q.size(2), S = k.size(2);
    if (group > 1) k = k.repeat_interleave(group, 1), v = v.repeat_interleave(group, 1);
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
    scores = (scores / cap).tanh() * cap;
    at::Tensor mask = visible ? *visible : at::ones({T, S}, q.options().dtype(at::kBool)).tril(S - T);
    // finite, so that a fully masked row (a padding query) stays finite rather than NaN
    const at::Scalar lowest = scores.scalar_type() == at::kBFloat16 ? at::Scalar(std::numeric_limits<c10::BFloat16>::lowest())
                              : scores.scalar_type() == at::kHalf   ? at::Scalar(std::numeric_limits<c10::Half>::lowest())
                                                                    : at::Scalar(std::numeric_limits<float>::lowest());
    scores = scores.masked_fill(mask.logical_not(), lowest);
    return at::matmul(at::softmax(scores, -1, at::kFloat).to(q.scalar_type()), v);
}
}  // namespace

// The attention of layer_forward's ATen path: scaled dot-product attention, or its soft-capped form
at::Tensor Model::scaled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const std::optional<at::Tensor>& visible, bool causal, bool grouped) const {
    const ModelConfig& c = config_;
    if (c.attention_logit_softcap > 0)
        return softcapped_attention(q, k, v, causal ? std::nullopt : visible, c.attention_scale, c.attention_logit_softcap);
    return at::scaled_dot_product_attention(q, k, v, visible, 0.0, causal, c.attention_scale, grouped);
}

// ATen's attention for layer_forward: packed rows (causal, or under the window's band), or a padded
// batch (with its cache) under its mask
at::Tensor Model::attend(at::Tensor q, at::Tensor k, at::Tensor v, const Attention& attention, const at::Tensor& visible,
                         KVCache* cache, size_t index) const {
    const ModelConfig& c = config_;
    const int64_t B = q.size(0), T = q.size(2), past = cache ? cache->length : 0, S = past + T;
    const bool gqa = c.num_key_value_heads != c.num_attention_heads;
    at::Tensor attn;  // [B, T, heads * head_dim]
    if (attention.slots.defined()) {
        // [1, heads, N, D] -> [rows, heads, width, D]: each row's tokens first, then zero slots that
        // no real token attends to (they come after it)
        auto to_rows = [&](const at::Tensor& tokens) {
            int64_t heads = tokens.size(1);
            return at::zeros({attention.rows * attention.width, heads, c.head_dim}, tokens.options())
                .index_copy(0, attention.slots, tokens.squeeze(0).transpose(0, 1))
                .view({attention.rows, attention.width, heads, c.head_dim})
                .transpose(1, 2);
        };
        const bool band = visible.defined();
        at::Tensor keys = to_rows(k), values = to_rows(v);
        if (band && gqa) {  // the fused kernels take a mask but no grouped heads: repeat the KV heads as GQA does
            const int64_t group = c.num_attention_heads / c.num_key_value_heads;
            keys = keys.repeat_interleave(group, 1);
            values = values.repeat_interleave(group, 1);
        }
        at::Tensor rows = scaled_attention(to_rows(q), keys, values, band ? std::optional<at::Tensor>(visible) : std::nullopt,
                                           !band, gqa && !band);
        attn = rows.transpose(1, 2)
                   .reshape({attention.rows * attention.width, c.num_attention_heads * c.head_dim})
                   .index_select(0, attention.slots)
                   .unsqueeze(0);
    } else {
        if (cache) {
            cache->keys[index].narrow(2, past, T).copy_(k);
            cache->values[index].narrow(2, past, T).copy_(v);
            k = cache->keys[index].narrow(2, 0, S);
            v = cache->values[index].narrow(2, 0, S);
        }
        if (gqa && T == 1) {
            // one query per head: each KV head's group of query heads becomes that head's queries
            // ([B, kv_heads, group, D]), plain attention under the same mask. Exact, and it keeps the
            // fused kernels, which take no grouped heads with a mask (ATen's math path would: 0.5 ms
            // of host time per call on an H100).
            const int64_t group = c.num_attention_heads / c.num_key_value_heads;
            attn = scaled_attention(q.reshape({B, c.num_key_value_heads, group, c.head_dim}), k, v, visible, false, false)
                       .reshape({B, 1, c.num_attention_heads * c.head_dim});
        } else {
            attn = scaled_attention(q, k, v, visible, false, gqa)
                       .transpose(1, 2)
                       .reshape({B, T, c.num_attention_heads * c.head_dim});
        }
    }
    return attn;
}

// SwiGLU: down(silu(gate(x)) * up(x)); Gemma's GeGLU with gelu
at::Tensor Model::mlp(const Layer& layer, const at::Tensor& x, RouterLoad* router_load) const {
    if (layer.sparse()) return experts_mlp(layer, x, router_load);
    const auto gate_up = layer.project_gate_up(x);
    const at::Tensor &gate = gate_up[0], &up = gate_up[1];
    if (config_.activation == ModelConfig::Activation::silu && decode_kernels_apply(gate) && gate.is_contiguous() &&
        up.is_contiguous()) {
        kernels::silu_mul(gate.data_ptr<float>(), up.data_ptr<float>(), gate.data_ptr<float>(), gate.numel());  // in place
        return layer.down(gate);
    }
    return layer.down(gated_activation(gate, up, config_.activation));
}

// A sparse layer as transformers' Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock computes it: the
// router's softmax in float32, each token's experts_per_token likeliest experts (their probabilities
// renormalized when norm_topk_prob), cast to x's dtype; each expert's SwiGLU runs on its tokens
// (those that picked it first, then second, ...), weighted, and is added into the output, the
// experts in order; Qwen2-MoE then adds its gated shared expert.
at::Tensor Model::experts_mlp(const Layer& layer, const at::Tensor& x, RouterLoad* router_load) const {
    const ModelConfig& c = config_;
    auto swiglu = [&](const Layer::Expert& expert, const at::Tensor& input) {
        return expert.down(gated_activation(expert.gate(input), expert.up(input), c.activation));
    };
    const at::Tensor tokens = x.reshape({-1, c.hidden_size});
    const int64_t N = tokens.size(0), K = c.experts_per_token;
    const at::Tensor router_logits = layer.router(tokens);  // [N, experts]
    if (router_load) router_load->record(router_logits, K);
    auto [weights, selected] = at::topk(at::softmax(router_logits, 1, at::kFloat), K, -1);  // [N, K]
    if (c.norm_topk_prob) weights = weights / weights.sum(-1, true);
    weights = weights.to(tokens.scalar_type()).reshape({-1});  // [N * K], token-major
    // (k, token) pairs k-major, grouped by expert in a stable order: each expert's pairs as
    // transformers' torch.where over its [K, N] mask lists them
    const at::Tensor expert_of_pair = selected.t().reshape({-1}).cpu();  // pair k * N + n
    const at::Tensor order = std::get<1>(expert_of_pair.sort(/*stable=*/true, 0, false));
    const at::Tensor counts = at::bincount(expert_of_pair, {}, c.num_experts);
    const int64_t* count = counts.data_ptr<int64_t>();
    at::Tensor out = at::zeros_like(tokens);
    int64_t start = 0;
    for (int64_t e = 0; e < c.num_experts; ++e) {
        if (count[e] == 0) continue;
        const at::Tensor pairs = order.narrow(0, start, count[e]);
        start += count[e];
        const at::Tensor token = pairs.remainder(N).to(tokens.device()), k = pairs.div(N, "floor").to(tokens.device());
        const at::Tensor y = swiglu(layer.experts[size_t(e)], tokens.index_select(0, token));
        out.index_add_(0, token, y * weights.index_select(0, token * K + k).unsqueeze(-1));
    }
    if (layer.shared_expert_gate.weight.defined())  // Qwen2-MoE: every token's shared expert, gated
        out = out + at::sigmoid(layer.shared_expert_gate(tokens)) * swiglu(layer.shared_expert, tokens);
    return out.view(x.sizes());
}

namespace {
// total += part, total starting undefined
void accumulate(at::Tensor& total, const at::Tensor& part) { total = total.defined() ? total + part : part; }
}  // namespace

void RouterLoad::record(const at::Tensor& router_logits, int64_t experts_per_token) {
    const at::Tensor probabilities = at::softmax(router_logits, -1);
    const at::Tensor picked = std::get<1>(at::topk(probabilities, experts_per_token, -1));  // [N, K]
    const int64_t experts = router_logits.size(-1);
    at::Tensor count = at::one_hot(picked.detach(), experts).to(at::kFloat).sum(0);  // [K, experts]
    at::Tensor sum = probabilities.sum(0).to(at::kFloat);  // in their dtype, as transformers sums them
    accumulate(probability_sum, sum);
    accumulate(selection_count, count);
    routed += router_logits.size(0);
}

at::Tensor RouterLoad::balancing_loss() const {
    if (routed == 0) return at::zeros({}, at::kFloat);
    const double n = double(routed);
    return (selection_count / n * (probability_sum / n).unsqueeze(0)).sum() * double(probability_sum.size(0));
}

// Reentrant checkpointing as torch.utils.checkpoint(use_reentrant=True): the forward keeps only the
// layer input; the backward recomputes the layer with gradients on and back-propagates through it,
// which accumulates the parameters' gradients directly (they are leaves) and returns the input's.
// A sparse layer recording its routing returns a second output, its probability_sum, whose graph the
// backward rebuilds too; its selection counts carry no gradient and are recorded in the forward.
struct Model::CheckpointedLayer : torch::autograd::Function<Model::CheckpointedLayer> {
    static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h,
                                                  const Model* model, int64_t index, const at::Tensor& cos,
                                                  const at::Tensor& sin, const Attention* attention) {
        ctx->saved_data["model"] = reinterpret_cast<int64_t>(model);
        ctx->saved_data["index"] = index;
        ctx->saved_data["rows"] = attention->rows;
        ctx->saved_data["width"] = attention->width;
        ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(h.device().type());
        ctx->saved_data["autocast_dtype"] = int64_t(at::autocast::get_autocast_dtype(h.device().type()));
        at::Generator generator = at::globalContext().defaultGenerator(h.device());
        {
            std::lock_guard<std::mutex> lock(generator.mutex());
            ctx->saved_data["rng"] = generator.get_state();  // dropout must draw the same masks again
        }
        ctx->save_for_backward({h, cos, sin, attention->visible, attention->windowed, attention->slots});
        const bool routed = attention->router_load && model->layers_[size_t(index)]->sparse();
        ctx->saved_data["routed"] = routed;
        if (!routed) return {model->layer_forward(size_t(index), h, cos, sin, *attention, nullptr)};  // grad mode is off here
        RouterLoad load;
        Attention recording = *attention;
        recording.router_load = &load;
        at::Tensor out = model->layer_forward(size_t(index), h, cos, sin, recording, nullptr);
        RouterLoad& total = *attention->router_load;
        accumulate(total.selection_count, load.selection_count);
        total.routed += load.routed;
        return {out, load.probability_sum};
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grad_outputs) {
        const Model* model = reinterpret_cast<const Model*>(ctx->saved_data["model"].toInt());
        int64_t index = ctx->saved_data["index"].toInt();
        auto saved = ctx->get_saved_variables();
        Attention attention{saved[3], saved[4], saved[5], ctx->saved_data["rows"].toInt(), ctx->saved_data["width"].toInt()};
        RouterLoad load;
        if (ctx->saved_data["routed"].toBool()) attention.router_load = &load;
        at::Tensor h = saved[0].detach().requires_grad_(true);
        at::Generator generator = at::globalContext().defaultGenerator(h.device());
        at::Tensor now;
        {
            std::lock_guard<std::mutex> lock(generator.mutex());
            now = generator.get_state();
            generator.set_state(ctx->saved_data["rng"].toTensor());
        }
        at::Tensor out;
        {
            at::AutoGradMode grad(true);
            // the forward's autocast state: the backward may run on a thread where autocast is off
            // (CUDA's autograd threads), and the recomputed layer must be the forward's computation
            AutocastScope autocast(h.device().type(), ctx->saved_data["autocast"].toBool(),
                                   at::ScalarType(ctx->saved_data["autocast_dtype"].toInt()));
            out = model->layer_forward(size_t(index), h, saved[1], saved[2], attention, nullptr);
        }
        {
            std::lock_guard<std::mutex> lock(generator.mutex());
            generator.set_state(now);
        }
        if (attention.router_load && grad_outputs.size() > 1 && grad_outputs[1].defined())
            torch::autograd::backward({out, load.probability_sum}, {grad_outputs[0], grad_outputs[1]});
        else
            torch::autograd::backward({out}, {grad_outputs[0]});
        return {h.grad(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
};

namespace {
// cos and sin [B, 1, T, D] of the positions [B, T] under inverse frequencies, in float32 (cast like
// transformers does), scaled by `scale` (longrope's, yarn's attention factor)
std::pair<at::Tensor, at::Tensor> rotation(const at::Tensor& positions, const at::Tensor& inv_freq, double scale,
                                           at::ScalarType dtype) {
    at::Tensor freqs = positions.to(inv_freq.device()).to(at::kFloat).unsqueeze(-1) * inv_freq.view({1, 1, -1});
    at::Tensor emb = at::cat({freqs, freqs}, -1);
    at::Tensor cos = emb.cos(), sin = emb.sin();
    if (scale != 1.0) {
        cos = cos * scale;
        sin = sin * scale;
    }
    return {cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)};
}
}  // namespace

Model::RotaryTables Model::rotary_tables(const at::Tensor& position_ids) const {
    RotaryTables t;
    const at::ScalarType table_dtype = config_.rotary_in_float32 ? at::kFloat : dtype();
    std::tie(t.cos, t.sin) = rotation(position_ids, inv_freq_, config_.rope_scaling.attention_factor, table_dtype);
    if (local_inv_freq_.defined())
        std::tie(t.local_cos, t.local_sin) = rotation(position_ids, local_inv_freq_, 1.0, table_dtype);
    if (!config_.nope_layers.empty()) t.identity_cos = at::ones_like(t.cos), t.identity_sin = at::zeros_like(t.sin);
    return t;
}

at::Tensor Model::decoder_stack(at::Tensor h, const at::Tensor& position_ids, const Attention& attention,
                                KVCache* cache) const {
    const RotaryTables tables = rotary_tables(position_ids);
    bool checkpoint = gradient_checkpointing_ && !cache && at::GradMode::is_enabled();
    if (checkpoint && !h.requires_grad()) h = h.detach().requires_grad_(true);  // frozen embeddings (LoRA): keep the graph
    for (size_t l = 0; l < layers_.size(); ++l) {
        const auto [layer_cos, layer_sin] = tables.layer(l, config_);
        if (!checkpoint) {
            h = layer_forward(l, h, layer_cos, layer_sin, attention, cache);
            continue;
        }
        const auto outputs = CheckpointedLayer::apply(h, this, int64_t(l), layer_cos, layer_sin, &attention);
        h = outputs[0];
        if (outputs.size() > 1) {  // a sparse layer's routing, with the graph the backward rebuilds
            RouterLoad& load = *attention.router_load;
            accumulate(load.probability_sum, outputs[1]);
        }
    }
    return norm(h, norm_);
}

at::Tensor Model::hidden_states(const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& position_ids,
                                KVCache* cache) const {
    int64_t B = input_ids.size(0), T = input_ids.size(1);
    at::Device device = embed_tokens_.device();
    int64_t past = cache ? cache->length : 0;
    int64_t S = past + T;
    if (attention_mask.size(0) != B || attention_mask.size(1) != S)
        throw Error(ErrorKind::runtime, "attention_mask must be [batch, cached + new positions]");
    if (cache && S > cache->capacity) throw Error(ErrorKind::runtime, "KV cache capacity exceeded");
    check_sequence_length(S);

    // [B, 1, T, S]: key j visible to query i iff j is not padding and j <= past + i. A query that
    // sees nothing (a padding position) sees itself, so softmax never divides by zero.
    Attention attention;
    if (T == 1) {  // one new position (decoding): every key is causal, and the query sees at least itself
        attention.visible = attention_mask.to(device).to(at::kBool, /*non_blocking=*/false, /*copy=*/true);
        attention.visible.select(1, S - 1).fill_(true);
        attention.visible = attention.visible.view({B, 1, 1, S});
    } else {
        at::Tensor query_pos = at::arange(past, S, at::TensorOptions().dtype(at::kLong).device(device)).view({1, 1, T, 1});
        at::Tensor key_pos = at::arange(0, S, at::TensorOptions().dtype(at::kLong).device(device)).view({1, 1, 1, S});
        attention.visible = (key_pos <= query_pos).logical_and(attention_mask.to(device).to(at::kBool).view({B, 1, 1, S}));
        attention.visible = attention.visible.logical_or(key_pos == query_pos);
    }
    if (config_.window_hides_keys(S)) {
        // counted in real tokens, so the columns a multi-turn episode rolled back (masked) do not count
        const at::Tensor rank = attention_mask.to(device).to(at::kLong).cumsum(1);  // [B, S]
        const at::Tensor in_window =
            rank.view({B, 1, 1, S}) > rank.narrow(1, past, T).view({B, 1, T, 1}) - config_.sliding_window;
        attention.windowed = attention.visible.logical_and(in_window);
    }
    at::Tensor hidden = decoder_stack(embed(input_ids.to(device)), position_ids, attention, cache);
    if (cache) cache->length = S;
    return hidden;
}

at::Tensor Model::packed_hidden_states(const at::Tensor& token_ids, const at::Tensor& position_ids,
                                       const std::vector<int64_t>& row_lengths, RouterLoad* router_load,
                                       const EmbeddingHook& embedding_hook) const {
    const int64_t N = token_ids.size(0);
    Attention attention;
    attention.router_load = config_.mixture_of_experts() ? router_load : nullptr;
    attention.rows = int64_t(row_lengths.size());
    attention.width = 1;
    for (int64_t length : row_lengths) attention.width = std::max(attention.width, length);
    check_sequence_length(attention.width);
    std::vector<int64_t> slots;
    slots.reserve(size_t(N));
    for (int64_t r = 0; r < attention.rows; ++r)
        for (int64_t i = 0; i < row_lengths[size_t(r)]; ++i) slots.push_back(r * attention.width + i);
    if (int64_t(slots.size()) != N || position_ids.size(0) != N)
        throw Error(ErrorKind::runtime,
                    "packed_hidden_states: row lengths and position ids must cover the " + std::to_string(N) + " tokens");
    at::Device device = embed_tokens_.device();
    attention.slots = at::tensor(slots, at::kLong).to(device);
    if (config_.window_hides_keys(attention.width)) {
        const at::Tensor column = at::arange(attention.width, at::TensorOptions().dtype(at::kLong).device(device));
        const at::Tensor query = column.view({-1, 1}), key = column.view({1, -1});
        attention.windowed =
            (key <= query).logical_and(key > query - config_.sliding_window).view({1, 1, attention.width, attention.width});
    }
    at::Tensor h = embed(token_ids.to(device), embedding_hook).unsqueeze(0);
    return decoder_stack(h, position_ids.view({1, N}), attention, nullptr).squeeze(0);
}

at::Tensor Model::embed(const at::Tensor& ids, const EmbeddingHook& hook) const {
    at::Tensor h = at::embedding(embed_tokens_, ids);
    if (token_rows_ && adapters_enabled_) {  // the trained rows where the tokens have one (PEFT's values)
        const at::Tensor rows = token_rows_->row_of.index({ids});
        const at::Tensor trained = at::embedding(token_rows_->values.to(h.scalar_type()), rows.clamp_min(0));
        h = at::where((rows >= 0).unsqueeze(-1), trained, h);
    }
    // transformers scales Gemma 3's embeddings inside its embedding module, Gemma 1 / 2's after it
    const bool scaled_in_module = config_.model_type.rfind("gemma3", 0) == 0;
    if (hook && !scaled_in_module) h = hook(h);
    // Gemma: transformers' scale is a buffer in the model's dtype, cast to the table's (a float32 table
    // under cast_lm_head_to_fp32 still multiplies by the bf16-rounded scale)
    if (config_.embedding_scale != 1.0)
        h = h * at::scalar_tensor(config_.embedding_scale, at::kFloat).to(dtype()).to(h.scalar_type());
    if (hook && scaled_in_module) h = hook(h);
    return h.scalar_type() == dtype() ? h : h.to(dtype());
}

at::Tensor Model::uncapped_logits(const at::Tensor& hidden) const {
    std::optional<AutocastScope> off;  // a float32 head: the product in float32, outside autocast
    if (lm_head_float32_) off.emplace(hidden.device().type(), false, at::kBFloat16);
    const at::Tensor h = lm_head_float32_ ? hidden.to(at::kFloat) : hidden;
    const bool tied_rows = !lm_head_ && token_rows_ && adapters_enabled_;
    if (!tied_rows || at::GradMode::is_enabled()) return linear_for_scope(h, lm_head_weight(), std::nullopt);
    // without gradients (decoding) the trained rows' columns are computed apart rather than a copy
    // of the whole matrix made per step
    at::Tensor logits = linear_for_scope(h, embed_tokens_, std::nullopt);
    const at::Tensor rows = token_rows_->values.to(embed_tokens_.scalar_type());
    return logits.index_copy_(-1, token_rows_->indices, linear_for_scope(h, rows, std::nullopt));
}

at::Tensor Model::logits(const at::Tensor& hidden) const { return soft_capped_logits(uncapped_logits(hidden)); }

at::Tensor Model::float32_logits(const at::Tensor& hidden) const {
    return soft_capped_logits(uncapped_logits(hidden).to(at::kFloat));
}

at::Tensor Model::soft_capped_logits(const at::Tensor& logits) const {
    const double cap = config_.final_logit_softcap;
    return cap > 0 ? (logits / cap).tanh() * cap : logits;  // in the logits' dtype, as transformers
}

void Model::keep_lm_head_in_float32() {
    at::NoGradGuard no_grad;
    at::Tensor& head = lm_head_ ? *lm_head_ : embed_tokens_;
    if (head.scalar_type() != at::kFloat) head = head.to(at::kFloat).requires_grad_(head.requires_grad());
    lm_head_float32_ = true;
}

std::vector<std::pair<std::string, at::Tensor>> Model::named_parameters() const {
    std::vector<std::pair<std::string, at::Tensor>> out = module_named_parameters();
    for (auto& [name, tensor] : out) name = checkpoint_tensor_name(config_, name);
    return out;
}

std::vector<std::pair<std::string, at::Tensor>> Model::module_named_parameters() const {
    std::vector<std::pair<std::string, at::Tensor>> out;
    const std::string decoder = decoder_path(config_);
    out.emplace_back(decoder + "embed_tokens.weight", embed_tokens_);
    for (size_t i = 0; i < layers_.size(); ++i) {
        const Layer& l = *layers_[i];
        std::string p = decoder + "layers." + std::to_string(i);
        if (l.input_norm.defined()) out.emplace_back(p + ".input_layernorm.weight", l.input_norm);
        for (const Linear* lin : layers_[i]->attention_linears()) {  // unique_ptr: a non-const Layer
            out.emplace_back(lin->name + ".weight", lin->weight);
            if (lin->bias) out.emplace_back(lin->name + ".bias", *lin->bias);
        }
        if (l.q_norm.defined()) {
            out.emplace_back(p + ".self_attn.q_norm.weight", l.q_norm);
            out.emplace_back(p + ".self_attn.k_norm.weight", l.k_norm);
        }
        out.emplace_back(p + ".post_attention_layernorm.weight", l.post_attention_norm);
        if (l.pre_feedforward_norm.defined()) out.emplace_back(p + ".pre_feedforward_layernorm.weight", l.pre_feedforward_norm);
        for (const Linear* lin : layers_[i]->mlp_linears()) {
            out.emplace_back(lin->name + ".weight", lin->weight);
            if (lin->bias) out.emplace_back(lin->name + ".bias", *lin->bias);
        }
        if (l.post_feedforward_norm.defined())
            out.emplace_back(p + ".post_feedforward_layernorm.weight", l.post_feedforward_norm);
    }
    out.emplace_back(decoder + "norm.weight", norm_);
    if (lm_head_) out.emplace_back("lm_head.weight", *lm_head_);
    return out;
}

void Model::set_base_trainable(bool trainable) {
    for (auto& [name, tensor] : named_parameters()) tensor.requires_grad_(trainable);
}

std::vector<std::pair<std::string, at::Tensor>> Model::trainable_named_parameters() const {
    if (!whole_module_tensors_.empty() || token_rows_ || has_adapters()) {  // adapters: named as saved
        std::vector<std::pair<std::string, at::Tensor>> out;
        for (const auto& named : adapter_parameters())
            if (named.second.requires_grad()) out.push_back(named);
        return out;
    }
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& named : named_parameters())
        if (named.second.requires_grad()) out.push_back(named);
    return out;
}

std::vector<at::Tensor> Model::trainable_parameters() const {
    std::vector<at::Tensor> out;
    for (auto& [name, tensor] : trainable_named_parameters()) out.push_back(tensor);
    return out;
}

std::vector<Linear*> Model::linear_layers() {
    std::vector<Linear*> out;
    for (auto& l : layers_)
        for (Linear* lin : l->linears()) out.push_back(lin);
    return out;
}

std::vector<std::string> Model::linear_module_names() {
    std::vector<std::string> names;
    for (const Linear* lin : linear_layers()) {
        std::string name = lin->name.substr(lin->name.rfind('.') + 1);
        if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
    return names;
}

void Model::attach_adapter(AdapterHost& host) {
    for (size_t i = 0; i < layers_.size(); ++i)
        for (Linear* lin : layers_[i]->linears()) {
            LinearLayer layer{lin->name, uint32_t(i), lin->weight, lin->bias};
            lin->adapter = host.attach(layer);
            lin->adapters_enabled = &adapters_enabled_;
        }
}

bool Model::has_adapters() const {
    for (const auto& layer : layers_)
        for (const Linear* lin : layer->linears())
            if (lin->adapter) return true;
    return false;
}

bool Model::adapters_can_merge() const {
    for (const auto& layer : layers_)
        for (const Linear* lin : layer->linears())
            if (lin->adapter && !lin->adapter->can_merge()) return false;
    return true;
}

void Model::merge_adapters() {
    at::NoGradGuard no_grad;
    for (auto& layer : layers_)
        for (Linear* lin : layer->linears()) {
            if (!lin->adapter) continue;
            // summed in float32 and rounded once, as generation_copy merges: a bfloat16 weight would
            // otherwise round the delta and then the sum (DoRA's delta is nearly -W + its rescaling)
            lin->weight.copy_(lin->weight.to(at::kFloat) + lin->adapter->merged_delta().to(lin->weight.device(), at::kFloat));
            lin->adapter.reset();
        }
    for (WholeModuleTensor& t : whole_module_tensors_) t.trained.requires_grad_(false);
    whole_module_tensors_.clear();  // their trained weights are the model's now
    if (token_rows_)
        embed_tokens_.index_copy_(0, token_rows_->indices, token_rows_->values.detach().to(embed_tokens_.scalar_type()));
    token_rows_.reset();
    beside_adapter_ = BesideAdapter();
}

std::vector<std::pair<std::string, at::Tensor>> Model::adapter_parameters() const {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& layer : layers_)
        for (const Linear* lin : layer->linears())
            if (lin->adapter)
                for (const auto& p : lin->adapter->parameters()) out.push_back(p);
    for (const WholeModuleTensor& t : whole_module_tensors_) out.emplace_back("base_model.model." + t.name, t.trained);
    if (token_rows_)
        out.emplace_back("base_model.model." + decoder_path(config_) + "embed_tokens.token_adapter.trainable_tokens_delta",
                         token_rows_->values);
    return out;
}

std::vector<std::pair<std::string, at::Tensor>> Model::saved_adapter_tensors() const {
    std::vector<std::pair<std::string, at::Tensor>> out = adapter_parameters();
    if (beside_adapter_.ensure_weight_tying && config_.tie_word_embeddings && embedding_trains_whole())
        out.emplace_back("base_model.model.lm_head.weight", embed_tokens_);
    return out;
}

bool Model::embedding_trains_whole() const {
    return std::any_of(whole_module_tensors_.begin(), whole_module_tensors_.end(),
                       [&](const WholeModuleTensor& t) { return t.trained.is_same(embed_tokens_); });
}

namespace {
// PEFT's _set_trainable: a module whose name ends with the target, as a string ("lm_head",
// "embed_tokens", "norm" - which "input_layernorm" ends with too); a tensor is in every module
// whose name is a dotted prefix of its own
bool in_module_ending_with(const std::string& tensor, const std::string& target) {
    for (size_t dot = tensor.find('.'); dot != std::string::npos; dot = tensor.find('.', dot + 1))
        if (dot >= target.size() && tensor.compare(dot - target.size(), target.size(), target) == 0) return true;
    return false;
}

// PEFT 0.18.1's handling of lm_head and embed_tokens in modules_to_save (tuners_utils'
// _check_tied_modules, which looks for the exact names): Grove takes the one case that keeps a tied
// model's single matrix, and refuses those where PEFT would train an untied copy, fail, or tie a
// model that does not tie them.
void check_embedding_target(const std::string& target, bool names_head, bool tied, bool ensure_weight_tying) {
    const std::string named = "modules_to_save: \"" + target + "\" names ";
    if (!tied) {
        if (ensure_weight_tying && (target == "embed_tokens" || target == "lm_head"))
            throw Error(ErrorKind::input, named +
                                              "lm_head or embed_tokens, which this model does not tie "
                                              "(tie_word_embeddings = false), with ensure_weight_tying: PEFT 0.18.1 would "
                                              "tie them anyway (or fail), a PEFT bug; leave ensure_weight_tying out");
        return;
    }
    if (!ensure_weight_tying)
        throw Error(ErrorKind::input, named +
                                          "lm_head or embed_tokens, which this model ties (tie_word_embeddings): PEFT "
                                          "would train an untied copy of one of them, and Grove keeps one matrix for both; "
                                          "to train that matrix whole, set [adapter] ensure_weight_tying = true and name "
                                          "\"embed_tokens\" without \"lm_head\" (PEFT's ensure_weight_tying)");
    if (names_head)
        throw Error(ErrorKind::input, named +
                                          "lm_head, which this model ties to embed_tokens: with ensure_weight_tying, PEFT "
                                          "keeps them tied only when \"embed_tokens\" is named without \"lm_head\" (it "
                                          "unties them, or fails with lm_head alone); name \"embed_tokens\" alone, which "
                                          "trains lm_head with it");
    if (target != "embed_tokens")
        throw Error(ErrorKind::input, named +
                                          "embed_tokens, which this model ties to lm_head: with ensure_weight_tying, PEFT "
                                          "ties them only when modules_to_save holds \"embed_tokens\" exactly (it trains "
                                          "an untied copy otherwise); name it \"embed_tokens\"");
}
}  // namespace

void Model::train_whole_modules(const std::vector<std::string>& targets, bool ensure_weight_tying) {
    if (targets.empty()) return;
    // transformers' module names, as PEFT matches and saves them (Gemma 3's model.language_model.*)
    const std::vector<std::pair<std::string, at::Tensor>> tensors = module_named_parameters();
    const std::string embedding = tensors.front().first;  // <decoder>embed_tokens.weight
    for (const std::string& target : targets) {
        if (target.empty()) throw Error(ErrorKind::input, "modules_to_save: an empty module name");
        const bool names_head = in_module_ending_with("lm_head.weight", target);
        if (names_head || in_module_ending_with(embedding, target))
            check_embedding_target(target, names_head, config_.tie_word_embeddings, ensure_weight_tying);
        for (const Linear* lin : linear_layers())
            if (lin->adapter && in_module_ending_with(lin->name + ".weight", target))
                throw Error(ErrorKind::input, "modules_to_save: \"" + target + "\" takes in " + lin->name +
                                                  ", which the adapter already adapts; leave one of them out");
        const bool found = std::any_of(tensors.begin(), tensors.end(),
                                       [&](const auto& named) { return in_module_ending_with(named.first, target); });
        if (!found)
            throw Error(ErrorKind::input, "modules_to_save: \"" + target +
                                              "\" ends the name of no module of this model (e.g. \"lm_head\", "
                                              "\"embed_tokens\", \"model.norm\")");
    }
    // in the model's order, whatever the targets' order: a checkpoint lists trained tensors by position
    for (const auto& [name, tensor] : tensors) {
        const std::string& tensor_name = name;  // a structured binding cannot be captured in C++17
        auto ends_module = [&](const std::string& target) { return in_module_ending_with(tensor_name, target); };
        if (std::none_of(targets.begin(), targets.end(), ends_module)) continue;
        whole_module_tensors_.push_back({name, tensor, tensor.detach(), tensor.detach().clone()});
        whole_module_tensors_.back().trained.requires_grad_(true);
    }
}

void Model::train_token_rows(const std::vector<int64_t>& indices) {
    if (indices.empty()) return;
    const int64_t vocabulary = embed_tokens_.size(0);
    std::set<int64_t> seen;
    for (int64_t index : indices) {
        if (index < 0 || index >= vocabulary)
            throw Error(ErrorKind::input, "trainable_token_indices: " + std::to_string(index) +
                                              " is no token of this model (its vocabulary has " + std::to_string(vocabulary) +
                                              ": 0 to " + std::to_string(vocabulary - 1) + ")");
        if (!seen.insert(index).second)
            throw Error(ErrorKind::input, "trainable_token_indices: " + std::to_string(index) + " is given twice");
    }
    if (embedding_trains_whole())
        throw Error(ErrorKind::input,
                    "trainable_token_indices: the embedding trains whole already (modules_to_save); leave one of "
                    "them out, as PEFT requires");
    at::NoGradGuard no_grad;
    const auto on_device = at::TensorOptions().dtype(at::kLong).device(embed_tokens_.device());
    TrainedTokenRows rows;
    rows.indices = at::tensor(indices, at::kLong).to(embed_tokens_.device());
    rows.values = embed_tokens_.index_select(0, rows.indices).clone().requires_grad_(true);
    rows.row_of = at::full({vocabulary}, -1, on_device);
    rows.row_of.index_copy_(0, rows.indices, at::arange(int64_t(indices.size()), on_device));
    token_rows_ = std::move(rows);
}

void Model::train_beside_adapter(const BesideAdapter& beside) {
    train_whole_modules(beside.modules_to_save, beside.ensure_weight_tying);
    train_token_rows(beside.trainable_token_indices);
    beside_adapter_ = beside;
}

void Model::set_adapters_enabled(bool enabled) {
    if (enabled == adapters_enabled_) return;
    adapters_enabled_ = enabled;
    if (whole_module_tensors_.empty()) return;
    at::NoGradGuard no_grad;  // repoints the tensors the layers hold at the other weights; gradients stay
    for (WholeModuleTensor& t : whole_module_tensors_) t.trained.set_(enabled ? t.trained_storage : t.original);
    // autocast caches a weight's lower-precision cast by tensor, which now holds other values
    at::autocast::clear_cache();
}

void Model::save(const std::string& folder) const {
    fs::create_directories(folder);
    json config = json::parse(config_.config_json);
    config["torch_dtype"] = dtype() == at::kBFloat16 ? "bfloat16" : "float32";
    write_file_atomically((fs::path(folder) / "config.json").string(), config.dump(2) + "\n");
    if (!config_.generation_config_json.empty())
        write_file_atomically((fs::path(folder) / "generation_config.json").string(), config_.generation_config_json + "\n");
    auto tensors = named_parameters();
    std::unique_ptr<WeightSource> kept;  // a multimodal checkpoint's other tensors, as they were loaded
    if (!passthrough_tensors_.empty()) {
        if (!fs::exists(passthrough_folder_))
            throw Error(ErrorKind::runtime, "saving " + folder + ": the vision tower's tensors are read back from " +
                                                passthrough_folder_ + ", which no longer exists");
        kept = std::make_unique<WeightSource>(passthrough_folder_);
        for (const std::string& name : passthrough_tensors_) tensors.emplace_back(name, kept->take_as_stored(name));
    }
    save_tensors((fs::path(folder) / "model.safetensors").string(), tensors, {{"format", "pt"}});
}

}  // namespace grove
