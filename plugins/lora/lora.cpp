// Adapter "lora": low-rank adaptation (Hu et al. 2021), as PEFT's LoraConfig does it:
//   y = W x + b + s * B A dropout(x),   A [r, in] Kaiming-uniform(a = sqrt(5)), B [out, r] zeros,
//   s = alpha / r   (or alpha / sqrt(r) with use_rslora)
// With use_dora (DoRA, Liu et al. 2024) each output row of W + s B A is rescaled to a trained
// magnitude m, which starts as the row norms of W:
//   y = b + (m / n) * (W + s B A) x,   n = ||W + s B A|| per row, held constant in backward (DoRA 4.3)
// Merging adds the layer's weight change to W. Parameters are saved under PEFT's names
// (base_model.model.<module>.lora_A.weight / lora_B.weight / lora_magnitude_vector) with PEFT's
// adapter_config.json, so Python's PeftModel.from_pretrained loads the result.
#include <grove/plugin.hpp>

#include <algorithm>
#include <cmath>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <type_traits>

namespace {
using grove::sdk::config_error;

// rank_pattern / alpha_pattern: {pattern: value}, matched as PEFT's get_pattern_key matches them
// (the first pattern that ends the module's name on a component boundary wins)
template <class Value>
struct Patterns {
    std::vector<std::pair<std::string, std::regex>> patterns;
    std::vector<Value> values;
    nlohmann::json saved = nlohmann::json::object();

    Patterns(const grove::sdk::Config& config, const char* key) {
        if (!config.has(key)) return;
        saved = nlohmann::json::parse(config.get_string(key, "{}"));
        for (const auto& [pattern, value] : saved.items()) {
            if (!value.is_number() || (std::is_integral_v<Value> && !value.is_number_integer()))
                throw config_error(key, "'" + pattern + "' needs a number" +
                                            (std::is_integral_v<Value> ? std::string(" (a whole rank)") : ""));
            try {
                patterns.emplace_back(pattern, std::regex("(.*\\.)?(" + pattern + ")"));
            } catch (const std::regex_error& e) {
                throw config_error(key, "'" + pattern + "' is not a regular expression: " + e.what());
            }
            values.push_back(value.template get<Value>());
        }
    }
    // PEFT takes the first matching pattern in its file's order, which a TOML table does not keep:
    // two patterns that give one module different values are refused rather than ordered.
    Value for_module(const std::string& name, Value fallback, const char* key) const {
        std::optional<size_t> chosen;
        for (size_t i = 0; i < patterns.size(); ++i) {
            if (!std::regex_match(name, patterns[i].second)) continue;
            if (chosen && values[*chosen] != values[i])
                throw config_error(key, "'" + patterns[*chosen].first + "' and '" + patterns[i].first + "' both match " + name +
                                            " with different values; make the patterns exclusive");
            if (!chosen) chosen = i;
        }
        return chosen ? values[*chosen] : fallback;
    }
};

// target_modules_regex / exclude_modules_regex: PEFT's target_modules or exclude_modules given as
// one string, a regular expression the module's whole name must match (Python's re.fullmatch)
struct WholeNameRegex {
    std::string pattern;
    std::optional<std::regex> regex;

    WholeNameRegex(const grove::sdk::Config& config, const char* key) {
        if (!config.has(key)) return;
        pattern = config.get_string(key, "");
        try {
            regex.emplace(pattern);
        } catch (const std::regex_error& e) {
            throw config_error(key, "'" + pattern + "' is not a regular expression: " + e.what());
        }
    }
    bool set() const { return regex.has_value(); }
    bool matches(const std::string& name) const { return regex && std::regex_match(name, *regex); }
};

// What one adapted layer uses: its rank and scale (rank_pattern / alpha_pattern may differ per layer)
struct LayerSpec {
    int64_t r;
    double scaling;
};

struct Lora {
    explicit Lora(const grove::sdk::Config& config)
            : r(config.get_int("r", 8)),
              alpha(config.get_float("alpha", 8.0)),
              dropout(config.get_float("dropout", 0.0)),
              use_rslora(config.get_bool("use_rslora", false)),
              use_dora(config.get_bool("use_dora", false)),
              init(config.get_string("init_lora_weights", "true")),
              targets(config.get_strings("target_modules", {"q_proj", "v_proj"})),
              excluded(config.get_strings("exclude_modules", {})),
              target_regex(config, "target_modules_regex"),
              exclude_regex(config, "exclude_modules_regex"),
              rank_pattern(config, "rank_pattern"),
              alpha_pattern(config, "alpha_pattern"),
              layers_to_transform(config.get_ints("layers_to_transform", {})) {
        if (r <= 0) throw config_error("r", "the rank must be a positive integer (typical: 8, 16, 64)");
        if (!(alpha > 0)) throw config_error("alpha", "must be > 0 (typical: r or 2*r)");
        if (!(dropout >= 0 && dropout < 1)) throw config_error("dropout", "must be in [0, 1)");
        if (target_regex.set() && config.has("target_modules"))
            throw config_error("target_modules_regex",
                               "is PEFT's target_modules as one regular expression: give it or "
                               "target_modules, not both");
        if (exclude_regex.set() && config.has("exclude_modules"))
            throw config_error("exclude_modules_regex",
                               "is PEFT's exclude_modules as one regular expression: give it or "
                               "exclude_modules, not both");
        if (target_regex.set() && !layers_to_transform.empty())  // PEFT's LoraConfig refuses it too
            throw config_error("layers_to_transform",
                               "does not narrow target_modules_regex (PEFT refuses it with a string "
                               "target_modules); write the layers into the expression");
        if (targets.empty())
            throw config_error("target_modules", "name at least one module, e.g. [\"q_proj\", \"v_proj\"] or [\"all-linear\"]");
        if (init != "true" && init != "false" && init != "gaussian")
            throw config_error("init_lora_weights", "'" + init +
                                                        "' is not available: \"true\" (PEFT's default: A Kaiming-uniform, "
                                                        "B zeros), \"gaussian\" (A normal with std 1/r) or \"false\" (A "
                                                        "and B random: the adapter changes the model from the start)");
        for (int64_t rank : rank_pattern.values)
            if (rank <= 0) throw config_error("rank_pattern", "every rank must be a positive integer");
        for (double a : alpha_pattern.values)
            if (!(a > 0)) throw config_error("alpha_pattern", "every alpha must be > 0");
        for (int64_t index : layers_to_transform)
            if (index < 0) throw config_error("layers_to_transform", "decoder layers are numbered from 0");
        if (all_linear() && !layers_to_transform.empty())  // PEFT's LoraConfig refuses it too
            throw config_error("layers_to_transform",
                               "cannot narrow [\"all-linear\"]: list the modules in target_modules instead, e.g. "
                               "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]");
    }
    bool all_linear() const { return !target_regex.set() && targets.size() == 1 && targets[0] == "all-linear"; }

    // PEFT's check_target_module_exists for a list: the whole name, or its ending after a dot
    static bool names_whole(const std::vector<std::string>& list, const std::string& name) {
        return std::find(list.begin(), list.end(), name) != list.end();
    }
    static bool names_ending(const std::vector<std::string>& list, const std::string& name) {
        return std::any_of(list.begin(), list.end(), [&](const std::string& t) {
            return name.size() > t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0 &&
                   name[name.size() - t.size() - 1] == '.';
        });
    }
    bool targets_layer(const grove_linear_info& layer) const {
        if (names_whole(excluded, layer.name) || names_ending(excluded, layer.name)) return false;
        if (exclude_regex.matches(layer.name)) return false;
        if (target_regex.set()) return target_regex.matches(layer.name);
        if (all_linear()) return std::string(layer.short_name) != "lm_head";
        if (names_whole(targets, layer.name)) return true;  // as in PEFT, layers_to_transform does not narrow a whole name
        if (!names_ending(targets, layer.name)) return false;
        return layers_to_transform.empty() || std::find(layers_to_transform.begin(), layers_to_transform.end(),
                                                        int64_t(layer.layer_index)) != layers_to_transform.end();
    }

    void* attach(const grove_linear_info& layer, const grove::sdk::Ops& ops) {
        if (!targets_layer(layer)) return nullptr;
        const int64_t rank = rank_pattern.for_module(layer.name, r, "rank_pattern");
        const double layer_alpha = alpha_pattern.for_module(layer.name, alpha, "alpha_pattern");
        const LayerSpec& spec = specs.emplace_back(
            LayerSpec{rank, use_rslora ? layer_alpha / std::sqrt(double(rank)) : layer_alpha / double(rank)});
        // PEFT's inits; with "false" both keep nn.Linear's own (Kaiming-uniform, a = sqrt(5))
        grove_tensor p[2];
        p[0] = init == "gaussian"
                   ? ops.parameter("lora_A.weight", {rank, layer.in_features}, GROVE_INIT_NORMAL, 1.0 / double(rank))
                   : ops.parameter("lora_A.weight", {rank, layer.in_features}, GROVE_INIT_KAIMING_UNIFORM, std::sqrt(5.0));
        p[1] = init == "false"
                   ? ops.parameter("lora_B.weight", {layer.out_features, rank}, GROVE_INIT_KAIMING_UNIFORM, std::sqrt(5.0))
                   : ops.parameter("lora_B.weight", {layer.out_features, rank}, GROVE_INIT_ZEROS);
        // m starts as the row norms of W + s B A (of W alone while B is zero), as PEFT's DoRA init
        if (use_dora) ops.parameter_from("lora_magnitude_vector", row_norm_of_update(spec, ops, p));
        return const_cast<LayerSpec*>(&spec);
    }
    grove_tensor forward(void* state, const grove::sdk::Ops& ops, const grove_tensor* p, uint32_t n, grove_tensor x) {
        const LayerSpec& spec = *static_cast<const LayerSpec*>(state);
        check_count(n);
        grove_tensor dropped = ops.dropout(x, dropout);
        grove_tensor lora = ops.linear(ops.linear(dropped, p[0]), p[1]);  // B A x  [.., out]
        if (!use_dora) return ops.scale(lora, spec.scaling);
        // PEFT's DoRA: (m/n - 1) W x + (m/n) s B A x, with n constant in backward
        grove_tensor norm = ops.detach(row_norm_of_update(spec, ops, p));
        grove_tensor scale_minus_one = ops.div(ops.add(p[2], ops.scale(norm, -1.0)), norm);
        return ops.add(ops.mul(ops.base_output(dropped), scale_minus_one),
                       ops.mul(ops.scale(lora, spec.scaling), ops.div(p[2], norm)));
    }
    grove_tensor merged_delta(void* state, const grove::sdk::Ops& ops, const grove_tensor* p, uint32_t n) {
        const LayerSpec& spec = *static_cast<const LayerSpec*>(state);
        check_count(n);
        grove_tensor update = ops.scale(ops.matmul(p[1], p[0]), spec.scaling);  // [out, r] @ [r, in]
        if (!use_dora) return update;
        // (m / n) (W + s B A) - W, each row scaled as PEFT's merge scales it
        grove_tensor weight = ops.base_weight();
        grove_tensor rescaled = ops.add(weight, update);
        grove_tensor row_scale = ops.reshape(ops.div(p[2], ops.row_norm(rescaled)), {-1, 1});
        return ops.add(ops.mul(rescaled, row_scale), ops.scale(weight, -1.0));
    }
    void detach(void*) {}
    std::string saved_config_json() const {
        // PEFT LoraConfig fields (peft >= 0.7); use_dora (0.9) and exclude_modules (0.14) only when
        // set, so an older PEFT still loads a plain adapter. base_model_name_or_path: the host's
        nlohmann::json j = {
            {"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"r", r},
            {"lora_alpha", alpha},
            {"lora_dropout", dropout},
            {"use_rslora", use_rslora},
            {"target_modules", target_regex.set() ? nlohmann::json(target_regex.pattern)
                               : all_linear()     ? nlohmann::json("all-linear")
                                                  : nlohmann::json(targets)},
            {"layers_to_transform",
             layers_to_transform.empty() ? nlohmann::json(nullptr) : nlohmann::json(layers_to_transform)},
            {"layers_pattern", nullptr},
            {"rank_pattern", rank_pattern.saved},
            {"alpha_pattern", alpha_pattern.saved},
            {"bias", "none"},
            {"fan_in_fan_out", false},
            {"inference_mode", true},
            {"init_lora_weights", init == "gaussian" ? nlohmann::json("gaussian") : nlohmann::json(init == "true")},
            {"modules_to_save", nullptr},
            {"base_model_name_or_path", nullptr}};
        if (use_dora) j["use_dora"] = true;
        if (!excluded.empty()) j["exclude_modules"] = excluded;
        if (exclude_regex.set()) j["exclude_modules"] = exclude_regex.pattern;
        return j.dump(2);
    }

    // ||W + s B A|| per output row
    static grove_tensor row_norm_of_update(const LayerSpec& spec, const grove::sdk::Ops& ops, const grove_tensor* p) {
        return ops.row_norm(ops.add(ops.base_weight(), ops.scale(ops.matmul(p[1], p[0]), spec.scaling)));
    }
    void check_count(uint32_t n) const {
        if (n != (use_dora ? 3u : 2u))
            throw grove::sdk::Error(GROVE_ERROR_INVALID_ARGUMENT,
                                    use_dora ? "expected the three DoRA parameters" : "expected the two LoRA parameters");
    }

    int64_t r;
    double alpha, dropout;
    bool use_rslora, use_dora;
    std::string init;
    std::vector<std::string> targets, excluded;
    WholeNameRegex target_regex, exclude_regex;
    Patterns<int64_t> rank_pattern;
    Patterns<double> alpha_pattern;
    std::vector<int64_t> layers_to_transform;
    std::deque<LayerSpec> specs;  // a deque: attach() hands out pointers into it
};

const grove_config_key kLoraKeys[] = {
    grove::sdk::key("r", GROVE_VALUE_INT, "8", "rank of the update"),
    grove::sdk::key("alpha", GROVE_VALUE_FLOAT, "8.0", "scale numerator: delta = (alpha / r) B A x"),
    grove::sdk::key("dropout", GROVE_VALUE_FLOAT, "0.0", "dropout on the adapter's input while training"),
    grove::sdk::key("target_modules", GROVE_VALUE_STRING_ARRAY, "[\"q_proj\", \"v_proj\"]",
                    "linear layers to adapt: a module's name or its ending after a dot (\"q_proj\", \"mlp.down_proj\"), "
                    "or [\"all-linear\"] (all but lm_head); PEFT's string form (a regular expression): "
                    "target_modules_regex"),
    grove::sdk::key("target_modules_regex", GROVE_VALUE_STRING, "(unset)",
                    "instead of target_modules: a regular expression the layer's whole name matches, as PEFT takes a "
                    "string target_modules, e.g. 'model\\.layers\\.[0-3]\\..*_proj'"),
    grove::sdk::key("exclude_modules", GROVE_VALUE_STRING_ARRAY, "[]", "linear layers to leave alone, named as target_modules"),
    grove::sdk::key("exclude_modules_regex", GROVE_VALUE_STRING, "(unset)",
                    "instead of exclude_modules: a regular expression the layer's whole name matches"),
    grove::sdk::key("layers_to_transform", GROVE_VALUE_INT_ARRAY, "[]",
                    "adapt only these decoder layers, by index from 0 (empty: every layer)"),
    grove::sdk::key("use_rslora", GROVE_VALUE_BOOL, "false", "rank-stabilised scaling alpha / sqrt(r)"),
    grove::sdk::key("use_dora", GROVE_VALUE_BOOL, "false",
                    "DoRA: also train each output row's magnitude (saved as lora_magnitude_vector)"),
    grove::sdk::key("init_lora_weights", GROVE_VALUE_STRING, "\"true\"",
                    "\"true\" (A Kaiming-uniform, B zeros), \"gaussian\" (A normal, std 1/r) or \"false\" (B random too)"),
    grove::sdk::key("rank_pattern", GROVE_VALUE_TABLE, "{}",
                    "another r for modules whose name ends with a pattern, e.g. { \"down_proj\" = 16 }"),
    grove::sdk::key("alpha_pattern", GROVE_VALUE_TABLE, "{}", "another alpha for modules whose name ends with a pattern"),
};
constexpr auto kLora = grove::sdk::adapter_descriptor<Lora>(
    "lora", "1.2.0", "low-rank adapters (LoRA, DoRA) on selected linear layers, saved in PEFT's layout",
    GROVE_PLUGIN_DETERMINISTIC, kLoraKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kLora)
