// Adapter "lora": low-rank adaptation (Hu et al. 2021), as PEFT's LoraConfig does it:
//   y = W x + b + s * B A dropout(x),   A [r, in] Kaiming-uniform(a = sqrt(5)), B [out, r] zeros,
//   s = alpha / r   (or alpha / sqrt(r) with use_rslora)
// Merging adds s * B A to W. Parameters are saved under PEFT's names
// (base_model.model.<module>.lora_A.weight / lora_B.weight) with PEFT's adapter_config.json, so
// Python's PeftModel.from_pretrained loads the result.
#include <grove/plugin.hpp>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace {
using grove::sdk::config_error;

struct Lora {
    explicit Lora(const grove::sdk::Config& config)
            : r(config.get_int("r", 8)),
              alpha(config.get_float("alpha", 8.0)),
              dropout(config.get_float("dropout", 0.0)),
              use_rslora(config.get_bool("use_rslora", false)),
              targets(config.get_strings("target_modules", {"q_proj", "v_proj"})) {
        if (r <= 0) throw config_error("r", "the rank must be a positive integer (typical: 8, 16, 64)");
        if (!(alpha > 0)) throw config_error("alpha", "must be > 0 (typical: r or 2*r)");
        if (!(dropout >= 0 && dropout < 1)) throw config_error("dropout", "must be in [0, 1)");
        if (targets.empty())
            throw config_error("target_modules", "name at least one module, e.g. [\"q_proj\", \"v_proj\"] or [\"all-linear\"]");
        scaling = use_rslora ? alpha / std::sqrt(double(r)) : alpha / double(r);
    }

    bool targets_layer(const std::string& short_name) const {
        if (targets.size() == 1 && targets[0] == "all-linear") return short_name != "lm_head";
        return std::find(targets.begin(), targets.end(), short_name) != targets.end();
    }

    void* attach(const grove_linear_info& layer, const grove::sdk::Ops& ops) {
        if (!targets_layer(layer.short_name)) return nullptr;
        ops.parameter("lora_A.weight", {r, layer.in_features}, GROVE_INIT_KAIMING_UNIFORM, std::sqrt(5.0));
        ops.parameter("lora_B.weight", {layer.out_features, r}, GROVE_INIT_ZEROS);
        attached.push_back(layer.name);
        return this;  // any non-null token; per-layer state is not needed
    }
    grove_tensor forward(void*, const grove::sdk::Ops& ops, const grove_tensor* p, uint32_t n, grove_tensor x) {
        if (n != 2) throw grove::sdk::Error(GROVE_ERROR_INVALID_ARGUMENT, "expected the two LoRA parameters");
        grove_tensor h = ops.linear(ops.dropout(x, dropout), p[0]);  // [.., r]
        return ops.scale(ops.linear(h, p[1]), scaling);              // [.., out]
    }
    grove_tensor merged_delta(void*, const grove::sdk::Ops& ops, const grove_tensor* p, uint32_t n) {
        if (n != 2) throw grove::sdk::Error(GROVE_ERROR_INVALID_ARGUMENT, "expected the two LoRA parameters");
        return ops.scale(ops.matmul(p[1], p[0]), scaling);  // [out, r] @ [r, in]
    }
    void detach(void*) {}
    std::string saved_config_json() const {
        // PEFT LoraConfig fields (peft >= 0.7); base_model_name_or_path is filled in by the host
        nlohmann::json j = {{"peft_type", "LORA"},
                            {"task_type", "CAUSAL_LM"},
                            {"r", r},
                            {"lora_alpha", alpha},
                            {"lora_dropout", dropout},
                            {"use_rslora", use_rslora},
                            {"target_modules", targets.size() == 1 && targets[0] == "all-linear" ? nlohmann::json("all-linear")
                                                                                                 : nlohmann::json(targets)},
                            {"bias", "none"},
                            {"fan_in_fan_out", false},
                            {"inference_mode", true},
                            {"init_lora_weights", true},
                            {"modules_to_save", nullptr},
                            {"base_model_name_or_path", nullptr}};
        return j.dump(2);
    }

    int64_t r;
    double alpha, dropout;
    bool use_rslora;
    std::vector<std::string> targets;
    double scaling = 1.0;
    std::vector<std::string> attached;
};

const grove_config_key kLoraKeys[] = {
    grove::sdk::key("r", GROVE_VALUE_INT, "8", "rank of the update"),
    grove::sdk::key("alpha", GROVE_VALUE_FLOAT, "8.0", "scale numerator: delta = (alpha / r) B A x"),
    grove::sdk::key("dropout", GROVE_VALUE_FLOAT, "0.0", "dropout on the adapter's input while training"),
    grove::sdk::key("target_modules", GROVE_VALUE_STRING_ARRAY, "[\"q_proj\", \"v_proj\"]",
                    "linear layers to adapt by name, or [\"all-linear\"] (all but lm_head)"),
    grove::sdk::key("use_rslora", GROVE_VALUE_BOOL, "false", "rank-stabilised scaling alpha / sqrt(r)"),
};
constexpr auto kLora =
    grove::sdk::adapter_descriptor<Lora>("lora", "1.0.0", "low-rank adapters on selected linear layers, saved in PEFT's layout",
                                         GROVE_PLUGIN_DETERMINISTIC, kLoraKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kLora)
