#include "grove/manifest.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>

#include <toml++/toml.h>

#include "config/toml_input.hpp"
#include "grove/error.hpp"
#include "grove/hub_cache.hpp"
#include "text/text_util.hpp"

namespace fs = std::filesystem;

namespace grove {

namespace {

Error manifest_error(const std::string& where, const std::string& what) {
    return Error(ErrorKind::manifest, where + ": error: " + what);
}

std::vector<std::string> split(const std::string& text, char separator) {
    std::vector<std::string> parts;
    std::stringstream stream(text);
    std::string part;
    while (std::getline(stream, part, separator)) parts.push_back(part);
    return parts;
}

const char* type_phrase(KeyType type) {
    switch (type) {
        case KeyType::string:
            return "a string";
        case KeyType::integer:
            return "an integer";
        case KeyType::number:
            return "a number";
        case KeyType::boolean:
            return "true or false";
        case KeyType::string_array:
            return "an array of strings";
        case KeyType::table:
            return "a table, e.g. { key = value }";
        case KeyType::integer_array:
            return "an array of integers";
    }
    return "?";
}

// The user-facing name of a section as written in TOML.
std::string section_header(const std::string& section) { return section == "rewards[]" ? "[[rewards]]" : "[" + section + "]"; }

std::vector<std::string> section_names() {
    std::vector<std::string> names;
    for (const auto& spec : manifest_schema()) {
        std::string s = spec.section;
        if (s.empty()) continue;
        if (s == "rewards[]") s = "rewards";
        if (std::find(names.begin(), names.end(), s) == names.end()) names.push_back(s);
    }
    return names;
}

const KeySpec* find_spec(const std::string& section, const std::string& name) {
    for (const auto& spec : manifest_schema())
        if (section == spec.section && name == spec.key) return &spec;
    return nullptr;
}

std::vector<std::string> keys_of(const std::string& section) {
    std::vector<std::string> names;
    for (const auto& spec : manifest_schema())
        if (section == spec.section) names.push_back(spec.key);
    return names;
}

// Parses the value part of --set: any TOML value; anything that is not valid TOML is a string.
toml::table parse_override_value(const std::string& value) {
    try {
        return parse_toml("value = " + value, std::string_view("--set"));
    } catch (const toml::parse_error&) {
        toml::table t;
        t.insert("value", value);
        return t;
    }
}

class Validator {
public:
    Validator(std::string path, std::set<std::string> overridden)
            : path_(std::move(path)), overridden_(std::move(overridden)) {}

    std::string where(const toml::node& node, const std::string& dotted) const {
        const auto& source = node.source();
        if (source.path && source.begin.line > 0)
            return *source.path + ":" + std::to_string(source.begin.line) + ":" + std::to_string(source.begin.column);
        if (overridden_.count(dotted)) return "--set " + dotted;
        return path_;
    }

    std::string key_where(const toml::key& key, const toml::node& value, const std::string& dotted) const {
        const auto& source = key.source();
        if (source.path && source.begin.line > 0)
            return *source.path + ":" + std::to_string(source.begin.line) + ":" + std::to_string(source.begin.column);
        return where(value, dotted);
    }

    // Checks one value against its spec; returns the value to store (numbers widened to float).
    // `at` is the key's position: that is the line a user fixes.
    std::unique_ptr<toml::node> check(const KeySpec& spec, const toml::node& node, const std::string& dotted,
                                      const std::string& at) const {
        std::string name = dotted;
        auto wrong_type = [&]() {
            return manifest_error(at, name + " must be " + type_phrase(spec.type) + " (" + spec.help + ")");
        };
        switch (spec.type) {
            case KeyType::string: {
                if (!node.is_string()) {
                    if (spec.choices) {
                        std::string hint = name == "loss.scale_rewards" && node.is_boolean()
                                               ? " (TRL's true is \"group\", false is \"none\")"
                                               : "";
                        throw manifest_error(at, name + " must be one of " + choices_text(spec) + hint);
                    }
                    throw wrong_type();
                }
                std::string value = *node.value<std::string>();
                if (spec.choices) {
                    auto options = split(spec.choices, '|');
                    if (std::find(options.begin(), options.end(), value) == options.end())
                        throw manifest_error(at, name + " = \"" + value + "\" is not valid; use one of " + choices_text(spec) +
                                                     did_you_mean(value, options));
                }
                return std::make_unique<toml::value<std::string>>(value);
            }
            case KeyType::boolean:
                if (!node.is_boolean()) throw wrong_type();
                return std::make_unique<toml::value<bool>>(*node.value<bool>());
            case KeyType::integer: {
                if (!node.is_integer()) throw wrong_type();
                int64_t value = *node.value<int64_t>();
                check_range(spec, double(value), at, name);
                return std::make_unique<toml::value<int64_t>>(value);
            }
            case KeyType::number: {
                if (!node.is_number()) throw wrong_type();
                double value = *node.value<double>();
                if (!std::isfinite(value)) throw manifest_error(at, name + " must be a finite number");
                check_range(spec, value, at, name);
                return std::make_unique<toml::value<double>>(value);
            }
            case KeyType::string_array:
            case KeyType::integer_array: {
                const toml::array* array = node.as_array();
                const bool strings = spec.type == KeyType::string_array;
                auto element_fits = [&](const toml::node& e) { return strings ? e.is_string() : e.is_integer(); };
                if (!array || !std::all_of(array->begin(), array->end(), element_fits)) throw wrong_type();
                return std::make_unique<toml::array>(*array);
            }
            case KeyType::table: {
                const toml::table* table = node.as_table();
                if (!table) throw wrong_type();
                return std::make_unique<toml::table>(*table);
            }
        }
        throw std::logic_error("unhandled key type");
    }

    static std::string choices_text(const KeySpec& spec) {
        std::vector<std::string> quoted;
        for (const auto& c : split(spec.choices, '|')) quoted.push_back("\"" + c + "\"");
        return join(quoted, ", ");
    }

    static void check_range(const KeySpec& spec, double value, const std::string& at, const std::string& name) {
        bool low = spec.min_exclusive ? value <= spec.min : value < spec.min;
        if (low || value > spec.max) {
            std::string lower = spec.min <= -1e299 ? "" : (spec.min_exclusive ? "> " : ">= ") + format_number(spec.min);
            std::string upper = spec.max >= 1e299 ? "" : "<= " + format_number(spec.max);
            std::string valid = lower.empty() ? upper : upper.empty() ? lower : lower + " and " + upper;
            throw manifest_error(
                at, name + " = " + format_number(value) + " is out of range; it must be " + valid + " (" + spec.help + ")");
        }
    }

    // Validates the keys of one section table into `out`, filling defaults.
    void section(const std::string& section, const toml::table* in, toml::table& out, const std::string& dotted_prefix,
                 const std::string& table_where) const {
        if (in) {
            for (const auto& [key_node, node] : *in) {
                std::string key(key_node.str());
                const KeySpec* spec = find_spec(section, key);
                std::string dotted = dotted_prefix + key;
                std::string at = key_where(key_node, node, dotted);
                if (!spec) {
                    auto known = keys_of(section);
                    std::string header = section.empty() ? "at the top level" : "in " + section_header(section);
                    throw manifest_error(at, "unknown key '" + key + "' " + header + did_you_mean(key, known) +
                                                 "; valid keys: " + join(known, ", "));
                }
                out.insert_or_assign(key, *check(*spec, node, dotted, at));
            }
        }
        for (const auto& spec : manifest_schema()) {
            if (section != spec.section || out.contains(spec.key)) continue;
            if (spec.required)
                throw manifest_error(table_where, "missing required key " + dotted_prefix + spec.key + " (" + spec.help + ")" +
                                                      (section.empty() ? "" : " in " + section_header(section)));
            if (spec.default_toml) {
                toml::table parsed = toml::parse(std::string("v = ") + spec.default_toml);
                const toml::node& value = *parsed.get("v");
                // a number's default written as a whole number ("500") is the float a given 500 reads as
                if (spec.type == KeyType::number && value.is_integer())
                    out.insert_or_assign(spec.key, double(*value.value<int64_t>()));
                else
                    out.insert_or_assign(spec.key, value);
            }
        }
    }

private:
    std::string path_;
    std::set<std::string> overridden_;
};

void apply_override(toml::table& root, const std::string& assignment, std::set<std::string>& overridden) {
    auto eq = assignment.find('=');
    if (eq == std::string::npos || eq == 0)
        throw Error(ErrorKind::usage, "--set " + assignment + ": expected section.key=value, e.g. --set loss.beta=0.001");
    std::string dotted = assignment.substr(0, eq);
    auto parts = split(dotted, '.');
    toml::node* current = &root;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
        const std::string& part = parts[i];
        if (auto* table = current->as_table()) {
            if (!table->contains(part)) table->insert(part, toml::table{});
            current = table->get(part);
        } else if (auto* array = current->as_array()) {
            char* end = nullptr;
            long index = std::strtol(part.c_str(), &end, 10);
            if (*end || index < 0 || size_t(index) >= array->size())
                throw Error(ErrorKind::usage, "--set " + assignment + ": '" + part + "' is not an index of the " +
                                                  std::to_string(array->size()) + " entries there (0-based)");
            current = array->get(size_t(index));
        } else {
            throw Error(ErrorKind::usage, "--set " + assignment + ": '" + parts[i - 1] + "' is a value, not a table");
        }
    }
    auto* table = current->as_table();
    if (!table) throw Error(ErrorKind::usage, "--set " + assignment + ": the parent of '" + parts.back() + "' is not a table");
    toml::table value = parse_override_value(assignment.substr(eq + 1));
    table->insert_or_assign(parts.back(), *value.get("value"));
    overridden.insert(dotted);
}

std::string resolve_path(const std::string& directory, const std::string& value) {
    if (value.empty() || value.rfind("builtin:", 0) == 0) return value;
    fs::path p(value);
    if (p.is_absolute()) return value;
    return (fs::path(directory) / p).lexically_normal().string();
}

// model.path (and model.revision) naming a Hub model that is no folder here but is in the local
// Hugging Face cache: the cached snapshot's folder. A revision other than main needs the cache.
void use_cached_hub_model(const std::string& directory, toml::table& model, const std::string& source_name) {
    const auto given = model["path"].value<std::string>();
    if (!given) return;
    const std::string folder = resolve_path(directory, *given);
    const std::string revision = model["revision"].value_or(std::string("main"));
    if (const std::string why = revision_refusal(*given, folder, revision); !why.empty())
        throw manifest_error(source_name, "model.revision = \"" + revision + "\": " + why);
    const std::string chosen = local_or_cached_model_folder(*given, folder, revision);
    if (chosen != folder) model.insert_or_assign("path", fs::absolute(chosen).string());
}

bool looks_like_plugin_path(const std::string& reference) {
    return reference.find('/') != std::string::npos ||
           (reference.size() > 3 && reference.compare(reference.size() - 3, 3, ".so") == 0);
}

}  // namespace

std::string format_number(double value) {
    std::string text;
    for (int digits = 15; digits <= 17; ++digits) {
        std::ostringstream os;
        os.precision(digits);
        os << value;
        text = os.str();
        if (std::strtod(text.c_str(), nullptr) == value) break;
    }
    return text;
}

// ---------------------------------------------------------------------------------------------
Manifest Manifest::load(const std::string& path, const std::vector<std::string>& overrides, int world_size, ManifestUse use) {
    std::ifstream file(path, std::ios::binary);
    if (!file) throw Error(ErrorKind::manifest, path + ": error: cannot read the manifest (does the file exist?)");
    std::stringstream text;
    text << file.rdbuf();
    return parse(text.str(), path, overrides, world_size, use);
}

namespace {
// [[rewards]]: an array of tables with unique metric names, or none (GRPO needs one:
// RunConfig::from checks, since grove sft does not).
std::vector<PluginUse> parse_rewards(const toml::table& root, Validator& v, const std::string& directory) {
    const toml::node* rewards = root.get("rewards");
    if (!rewards) return {};
    const toml::array* reward_array = rewards->as_array();
    if (!reward_array || !reward_array->is_array_of_tables() || reward_array->empty())
        throw manifest_error(v.where(*rewards, "rewards"), "'rewards' must be one or more [[rewards]] tables");
    std::vector<PluginUse> uses;
    std::set<std::string> reward_names;
    for (size_t i = 0; i < reward_array->size(); ++i) {
        const toml::node& node = *reward_array->get(i);
        std::string prefix = "rewards." + std::to_string(i) + ".";
        std::string at = v.where(node, "rewards." + std::to_string(i));
        toml::table out;
        v.section("rewards[]", node.as_table(), out, prefix, at);
        PluginUse use;
        if (out.contains("plugin") == out.contains("model"))
            throw manifest_error(at, "[[rewards]] #" + std::to_string(i + 1) +
                                         " needs exactly one of plugin = \"NAME\" (a reward plugin) and model = \"DIR\" "
                                         "(a reward model's folder)");
        if (out.contains("model")) {  // TRL names a reward model by its folder's (or Hub id's) last part
            const std::string given = *out["model"].value<std::string>(), folder = resolve_path(directory, given);
            const std::string revision = out["revision"].value_or(std::string("main"));
            if (const std::string why = revision_refusal(given, folder, revision); !why.empty())
                throw manifest_error(at, prefix + "revision = \"" + revision + "\": " + why);
            use.model = local_or_cached_model_folder(given, folder, revision);
            use.name = out.contains("name") ? *out["name"].value<std::string>()
                                            : fs::path(folder).lexically_normal().filename().string();
            if (use.name.empty()) use.name = fs::path(folder).lexically_normal().parent_path().filename().string();
        } else {
            if (out.contains("revision"))
                throw manifest_error(at, prefix +
                                             "revision names the Hub revision of a reward model (model = \"ID\"); a "
                                             "plugin has none: remove it");
            use.plugin = *out["plugin"].value<std::string>();
            if (looks_like_plugin_path(use.plugin)) use.plugin = resolve_path(directory, use.plugin);
            use.name = out.contains("name") ? *out["name"].value<std::string>() : use.plugin;
            if (looks_like_plugin_path(use.name)) use.name = fs::path(use.name).stem().string();
        }
        use.weight = *out["weight"].value<double>();
        if (out.contains("role")) use.role = *out["role"].value<std::string>();
        use.config = std::make_shared<toml::table>(*out["config"].as_table());
        // a Python reward is named by its function, as TRL names reward_funcs by __name__
        if (use.plugin == "python" && !out.contains("name"))
            if (auto function = (*use.config)["function"].value<std::string>()) use.name = *function;
        use.origin = at + " [[rewards]] #" + std::to_string(i + 1);
        use.base_dir = directory;
        use.isolation.process = *out["isolation"].value<std::string>() == "process";
        use.isolation.timeout_seconds = *out["timeout"].value<double>();
        use.isolation.failures_are_nan = *out["on_failure"].value<std::string>() == "nan";
        if (!use.isolation.process && (use.isolation.timeout_seconds > 0 || use.isolation.failures_are_nan))
            throw manifest_error(at,
                                 "timeout and on_failure take effect only in a worker process: add isolation = "
                                 "\"process\" to [[rewards]] #" +
                                     std::to_string(i + 1));
        if (use.isolation.process && !use.model.empty())
            throw manifest_error(at, "isolation = \"process\" is for reward plugins; a reward model runs in Grove");
        if (!reward_names.insert(use.name).second)
            throw manifest_error(
                at, "two rewards are named '" + use.name + "'; metric names must be unique: give one of them name = \"...\"");
        uses.push_back(std::move(use));
    }

    return uses;
}

// The batch arithmetic of docs/grpo.md#batching-and-grouping: resolves generation_batch_size and
// steps_per_generation into `train`, or says which setting to change.
void resolve_batch_sizes(const Manifest& m, toml::table& train, const toml::table& root, Validator& v,
                         const std::string& source_name, int world_size, ManifestUse use) {
    auto at = [&](const std::string& dotted) {
        const toml::node* n = root.at_path(dotted).node();
        return n ? v.where(*n, dotted) : source_name;
    };
    int64_t batch = m.integer("train.per_device_train_batch_size");
    int64_t accumulation = m.integer("train.gradient_accumulation_steps");
    int64_t generations = m.integer("generation.num_generations");
    auto gbs = m.optional_integer("train.generation_batch_size");
    auto spg = m.optional_integer("train.steps_per_generation");
    int64_t per_step = batch * world_size;
    // TRL refuses both; Grove accepts both when they agree, so a resolved manifest checks again
    if (gbs && spg && *gbs != per_step * *spg)
        throw manifest_error(at("train.steps_per_generation"),
                             "train.generation_batch_size = " + std::to_string(*gbs) +
                                 " and train.steps_per_generation = " + std::to_string(*spg) +
                                 " disagree: generation_batch_size must be per_device_train_batch_size "
                                 "x world size x steps_per_generation = " +
                                 std::to_string(per_step * *spg) + "; set only one of them");
    if (gbs) {
        if (*gbs % per_step != 0)
            throw manifest_error(
                at("train.generation_batch_size"),
                "train.generation_batch_size = " + std::to_string(*gbs) +
                    " must be a multiple of per_device_train_batch_size x world size = " + std::to_string(per_step) +
                    " (e.g. " + std::to_string(per_step * std::max<int64_t>(1, *gbs / per_step)) + ")");
        spg = *gbs / per_step;
    } else {
        if (!spg) spg = accumulation;
        gbs = per_step * *spg;
    }
    if (use == ManifestUse::grpo && *gbs % generations != 0) {
        std::vector<std::string> divisors;  // the first few only: the batch may be large
        for (int64_t g = 2; g <= *gbs && g <= 4096 && divisors.size() < 12; ++g)
            if (*gbs % g == 0) divisors.push_back(std::to_string(g));
        int64_t multiple = std::lcm(*gbs, generations);
        throw manifest_error(
            at("generation.num_generations"),
            "the generation batch of " + std::to_string(*gbs) + " completions (per_device_train_batch_size " +
                std::to_string(batch) + " x world size " + std::to_string(world_size) + " x steps_per_generation " +
                std::to_string(*spg) + ") cannot hold whole groups of num_generations = " + std::to_string(generations) +
                "; use num_generations in {" + join(divisors, ", ") + "} or a generation batch that is a multiple of " +
                std::to_string(generations) + " (e.g. train.generation_batch_size = " + std::to_string(multiple) + ")");
    }
    train.insert_or_assign("generation_batch_size", *gbs);
    train.insert_or_assign("steps_per_generation", *spg);
}

// Where the training prompts come from: data.source, replayed rollouts, or, as TRL without a
// train_dataset, an environment that writes each prompt itself (then only max_steps can end the run).
void check_prompt_source(const Manifest& m, const std::string& source_name) {
    if (m.optional_string("data.source") || m.optional_string("rollouts.path")) return;
    if (!m.optional_string("environment.plugin"))
        throw manifest_error(source_name,
                             "missing data.source (the training prompts: a JSONL file or builtin:NAME), "
                             "or rollouts.path to replay rollouts made elsewhere, or an [environment] that writes the "
                             "prompts (with train.max_steps)");
    if (m.integer("train.max_steps") <= 0)
        throw manifest_error(source_name,
                             "without data.source the [environment] writes every prompt, so there are no epochs to "
                             "count: set train.max_steps (as TRL asks for max_steps without a train_dataset), or "
                             "set data.source");
}

// TRL's rules for combining loss options (docs/objectives.md#which-options-combine), as errors
// that name the keys and the combination that is valid.
void check_loss_combinations(const Manifest& m, const toml::table& root, Validator& v, const std::string& source_name) {
    auto at = [&](const std::string& dotted) {
        const toml::node* n = root.at_path(dotted).node();
        return n ? v.where(*n, dotted) : source_name;
    };
    const std::string level = m.string("loss.importance_sampling_level"),
                      correction = m.string("loss.importance_sampling_correction");
    if (m.objective().plugin == "vespo" && level != "token")
        throw manifest_error(at("loss.importance_sampling_level"),
                             "objective vespo computes each row's whole importance ratio itself: it needs "
                             "loss.importance_sampling_level = \"token\" (TRL's rule), not \"" +
                                 level + "\"");
    if (m.objective().plugin == "vespo" && correction.rfind("sequence_", 0) == 0)
        throw manifest_error(at("loss.importance_sampling_correction"),
                             "objective vespo folds a per-token sampling ratio into its row weight: use "
                             "loss.importance_sampling_correction = \"token_truncate\" or \"token_mask\", not \"" +
                                 correction + "\"");
    if (m.reduction().plugin == "luspo" && level != "sequence")
        throw manifest_error(at("loss.importance_sampling_level"),
                             "reduction luspo is the sequence-level objective of the LUSPO paper: set "
                             "loss.importance_sampling_level = \"sequence\"");
    if (m.boolean("generation.dynamic_sampling") && m.world_size() > 1)
        throw manifest_error(at("generation.dynamic_sampling"),
                             "generation.dynamic_sampling runs on one process for now (this run has " +
                                 std::to_string(m.world_size()) + "): unset it or train with one process");
    if (m.number("loss.entropy_coef_min") > m.number("loss.entropy_coef_max"))
        throw manifest_error(at("loss.entropy_coef_min"), "loss.entropy_coef_min must be <= loss.entropy_coef_max");
    const auto clip_min = m.optional_number("loss.importance_sampling_clip_min");
    if (clip_min && *clip_min >= m.number("loss.importance_sampling_clip_max"))
        throw manifest_error(at("loss.importance_sampling_clip_min"),
                             "loss.importance_sampling_clip_min must be below loss.importance_sampling_clip_max (" +
                                 format_number(m.number("loss.importance_sampling_clip_max")) + ")");
}

}  // namespace

Manifest Manifest::parse(const std::string& text, const std::string& source_name, const std::vector<std::string>& overrides,
                         int world_size, ManifestUse use) {
    Manifest m;
    m.path_ = source_name;
    m.directory_ = fs::path(source_name).parent_path().string();
    if (m.directory_.empty()) m.directory_ = ".";
    m.world_size_ = world_size;
    if (world_size < 1)
        throw Error(ErrorKind::usage, "world size must be >= 1 (WORLD_SIZE=" + std::to_string(world_size) + ")");

    toml::table root;
    try {
        root = parse_toml(std::string_view(text), std::string_view(source_name));
    } catch (const toml::parse_error& e) {
        const auto& where = e.source();
        throw manifest_error(source_name + ":" + std::to_string(where.begin.line) + ":" + std::to_string(where.begin.column),
                             "invalid TOML: " + std::string(e.description()));
    }
    std::set<std::string> overridden;
    for (const auto& assignment : overrides) apply_override(root, assignment, overridden);

    Validator v(source_name, overridden);
    auto values = std::make_shared<toml::table>();
    auto sections = section_names();

    // top level: sections and top-level keys
    toml::table top_scalars;
    for (const auto& [key_node, node] : root) {
        std::string key(key_node.str());
        bool is_section = std::find(sections.begin(), sections.end(), key) != sections.end();
        if (!is_section && !find_spec("", key)) {
            auto candidates = sections;
            for (const auto& k : keys_of("")) candidates.push_back(k);
            throw manifest_error(
                v.key_where(key_node, node, key),
                "unknown section or key '" + key + "'" + did_you_mean(key, candidates) + "; valid: " + join(candidates, ", "));
        }
        if (!is_section) top_scalars.insert(key, node);
    }
    toml::table top;
    v.section("", &top_scalars, top, "", source_name);
    values->insert("", top);

    for (const auto& section : sections) {
        if (section == "rewards") continue;
        const toml::node* node = root.get(section);
        if (node && !node->is_table())
            throw manifest_error(v.where(*node, section), "'" + section + "' must be a table: write [" + section + "]");
        toml::table out;
        v.section(section, node ? node->as_table() : nullptr, out, section + ".", node ? v.where(*node, section) : source_name);
        values->insert(section, out);
    }

    m.rewards_ = parse_rewards(root, v, m.directory_);

    for (auto [section, use] : {std::pair<const char*, PluginUse*>{"adapter", &m.adapter_},
                                std::pair<const char*, PluginUse*>{"reduction", &m.reduction_},
                                std::pair<const char*, PluginUse*>{"objective", &m.objective_}}) {
        const toml::table& t = *values->get(section)->as_table();
        use->plugin = *t["plugin"].value<std::string>();
        if (looks_like_plugin_path(use->plugin)) use->plugin = resolve_path(m.directory_, use->plugin);
        use->name = use->plugin;
        use->config = std::make_shared<toml::table>(*t["config"].as_table());
        const toml::node* declared = root.get(section);
        use->origin = (declared ? v.where(*declared, section) : source_name) + " [" + section + "]";
        use->base_dir = m.directory_;
    }

    {
        const toml::table& t = *values->get("environment")->as_table();
        const toml::node* declared = root.get("environment");
        if (declared && !t["plugin"])
            throw manifest_error(v.where(*declared, "environment"),
                                 "[environment] needs plugin = \"NAME\" (e.g. \"calculator\"), or remove the section for "
                                 "single-turn completions");
        if (auto plugin = t["plugin"].value<std::string>()) {
            PluginUse use;
            use.plugin = looks_like_plugin_path(*plugin) ? resolve_path(m.directory_, *plugin) : *plugin;
            use.name = use.plugin;
            use.config = std::make_shared<toml::table>(*t["config"].as_table());
            use.origin = (declared ? v.where(*declared, "environment") : source_name) + " [environment]";
            use.base_dir = m.directory_;
            m.environment_ = std::move(use);
        }
    }

    // model.path may name a Hub model that the local Hugging Face cache holds
    use_cached_hub_model(m.directory_, *values->get("model")->as_table(), source_name);
    // paths relative to the manifest's folder
    for (const auto& spec : manifest_schema()) {
        if (!spec.is_path) continue;
        toml::table& t = *values->get(spec.section)->as_table();
        if (auto* s = t.get(spec.key); s && s->is_string())
            t.insert_or_assign(spec.key, resolve_path(m.directory_, *s->value<std::string>()));
        if (auto* a = t.get(spec.key); a && a->is_array())
            for (auto& element : *a->as_array())
                element.ref<std::string>() = resolve_path(m.directory_, element.ref<std::string>());
    }
    m.values_ = values;

    check_prompt_source(m, source_name);

    resolve_batch_sizes(m, *values->get("train")->as_table(), root, v, source_name, world_size, use);
    check_loss_combinations(m, root, v, source_name);
    toml::table& loss = *values->get("loss")->as_table();
    if (!loss.contains("epsilon_high")) loss.insert("epsilon_high", m.number("loss.epsilon"));
    m.keys_read_->clear();  // validation's reads do not count as the run's use of a key
    return m;
}

// ---------------------------------------------------------------------------------------------
namespace {
const toml::node* lookup(const toml::table& values, const std::string& dotted, std::set<std::string>& keys_read) {
    auto dot = dotted.rfind('.');
    std::string section = dot == std::string::npos ? "" : dotted.substr(0, dot);
    std::string key = dot == std::string::npos ? dotted : dotted.substr(dot + 1);
    const KeySpec* spec = find_spec(section, key);
    if (!spec) throw std::logic_error("manifest key '" + dotted + "' is not in the schema");
    keys_read.insert(dotted);
    const toml::node* table = values.get(section);
    return table ? table->as_table()->get(key) : nullptr;
}
}  // namespace

std::vector<std::string> Manifest::keys_never_read() const {
    std::vector<std::string> unread;
    for (const KeySpec& spec : manifest_schema()) {
        std::string section = spec.section;
        if (section == "rewards[]" || section == "adapter" || section == "reduction" || section == "objective")
            continue;                                                                    // PluginUse
        if (section == "environment" && spec.key != std::string("max_turns")) continue;  // PluginUse
        std::string dotted = section.empty() ? spec.key : section + "." + spec.key;
        if (!keys_read_->count(dotted)) unread.push_back(dotted);
    }
    return unread;
}

std::optional<std::string> Manifest::optional_string(const std::string& key) const {
    const toml::node* n = lookup(*values_, key, *keys_read_);
    return n ? n->value<std::string>() : std::nullopt;
}

std::string Manifest::string(const std::string& key) const {
    const toml::node* n = lookup(*values_, key, *keys_read_);
    if (!n) throw std::logic_error("manifest key '" + key + "' is unset");
    return *n->value<std::string>();
}
int64_t Manifest::integer(const std::string& key) const {
    auto v = optional_integer(key);
    if (!v) throw std::logic_error("manifest key '" + key + "' is unset");
    return *v;
}
double Manifest::number(const std::string& key) const {
    auto v = optional_number(key);
    if (!v) throw std::logic_error("manifest key '" + key + "' is unset");
    return *v;
}
bool Manifest::boolean(const std::string& key) const {
    const toml::node* n = lookup(*values_, key, *keys_read_);
    if (!n) throw std::logic_error("manifest key '" + key + "' is unset");
    return *n->value<bool>();
}
std::optional<int64_t> Manifest::optional_integer(const std::string& key) const {
    const toml::node* n = lookup(*values_, key, *keys_read_);
    return n ? n->value<int64_t>() : std::nullopt;
}
std::optional<double> Manifest::optional_number(const std::string& key) const {
    const toml::node* n = lookup(*values_, key, *keys_read_);
    return n ? n->value<double>() : std::nullopt;
}
std::optional<bool> Manifest::optional_boolean(const std::string& key) const {
    const toml::node* n = lookup(*values_, key, *keys_read_);
    return n ? n->value<bool>() : std::nullopt;
}
namespace {
// an array key's elements (checked against their type when the manifest was read); none when unset
template <typename T>
std::vector<T> array_values(const toml::node* n) {
    std::vector<T> out;
    if (n)
        for (const auto& element : *n->as_array()) out.push_back(*element.value<T>());
    return out;
}
}  // namespace

std::vector<std::string> Manifest::strings(const std::string& key) const {
    return array_values<std::string>(lookup(*values_, key, *keys_read_));
}

std::vector<int64_t> Manifest::integers(const std::string& key) const {
    return array_values<int64_t>(lookup(*values_, key, *keys_read_));
}

namespace {
// A key as TOML writes it: bare when it can be, quoted otherwise ("top-p", "a.b" and "" are quoted
// apart from the first, which is bare).
std::string key_text(std::string_view key) {
    const bool bare = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    });
    if (bare) return std::string(key);
    std::ostringstream os;
    os << toml::toml_formatter(toml::value<std::string>(std::string(key)));
    return os.str();
}

std::string toml_value_text(const toml::node& node) {
    std::ostringstream os;
    if (const auto* table = node.as_table()) {
        // inline table
        os << "{";
        bool first = true;
        for (const auto& [k, v] : *table) {
            os << (first ? " " : ", ") << key_text(k.str()) << " = " << toml_value_text(v);
            first = false;
        }
        os << (first ? "}" : " }");
    } else if (const auto* array = node.as_array()) {
        os << "[";
        for (size_t i = 0; i < array->size(); ++i) os << (i ? ", " : "") << toml_value_text(*array->get(i));
        os << "]";
    } else if (const auto* d = node.as_floating_point()) {
        double value = d->get();
        std::string text = format_number(value);
        if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
        os << text;
    } else {
        node.visit([&](const auto& value) { os << toml::toml_formatter(value); });
    }
    return os.str();
}

// A relative path made absolute against the current folder (built-in names and "" stay).
std::string absolute_path(const std::string& path) {
    if (path.empty() || path.rfind("builtin:", 0) == 0 || fs::path(path).is_absolute()) return path;
    return fs::absolute(path).lexically_normal().string();
}

// A key's value as TOML text; with `absolute`, a path key's relative paths made absolute.
std::string value_text(const KeySpec& spec, const toml::node& node, bool absolute) {
    if (!absolute || !spec.is_path) return toml_value_text(node);
    if (auto text = node.value<std::string>()) return toml_value_text(toml::value<std::string>(absolute_path(*text)));
    if (const auto* array = node.as_array()) {
        toml::array paths;
        for (const auto& element : *array) paths.push_back(absolute_path(element.value<std::string>().value_or("")));
        return toml_value_text(paths);
    }
    return toml_value_text(node);
}

void print_key(std::ostringstream& os, const KeySpec& spec, const toml::node* node, bool absolute) {
    std::string line =
        node ? std::string(spec.key) + " = " + value_text(spec, *node, absolute) : "# " + std::string(spec.key) + " = (unset)";
    os << line;
    if (line.size() < 40) os << std::string(40 - line.size(), ' ');
    os << "  # " << spec.help << "\n";
}
// A reward's keys as a manifest would declare them, every setting present; with `absolute`, its
// plugin's or model's path made absolute.
toml::table reward_table(const PluginUse& reward, bool absolute) {
    toml::table declared;
    if (!reward.model.empty())
        declared.insert("model", absolute ? absolute_path(reward.model) : reward.model);
    else
        declared.insert("plugin",
                        absolute && looks_like_plugin_path(reward.plugin) ? absolute_path(reward.plugin) : reward.plugin);
    declared.insert("name", reward.name);
    declared.insert("weight", reward.weight);
    if (!reward.role.empty()) declared.insert("role", reward.role);
    declared.insert("config", *reward.config);
    declared.insert("isolation", reward.isolation.process ? "process" : "none");
    declared.insert("timeout", reward.isolation.timeout_seconds);
    declared.insert("on_failure", reward.isolation.failures_are_nan ? "nan" : "stop");
    return declared;
}
}  // namespace

std::string Manifest::resolved_toml(bool absolute_paths) const {
    std::ostringstream os;
    os << "# " << path_ << ", resolved: every key with its value or default\n";
    for (const auto& spec : manifest_schema())
        if (std::string(spec.section).empty()) print_key(os, spec, values_->get("")->as_table()->get(spec.key), absolute_paths);
    std::string current = "\x01";
    for (const auto& spec : manifest_schema()) {
        std::string section = spec.section;
        if (section.empty() || section == "rewards[]") continue;
        // without an environment the section would read as one that forgot its plugin: shown as comments
        const bool commented = section == "environment" && !environment_;
        if (section != current) {
            current = section;
            os << "\n"
               << (commented ? "# " : "") << "[" << section << "]" << (commented ? "  (single-turn: none)" : "") << "\n";
        }
        if (commented) {
            std::ostringstream line;
            print_key(line, spec, values_->get(section)->as_table()->get(spec.key), absolute_paths);
            const std::string text = line.str();
            os << (text.rfind('#', 0) == 0 ? "" : "# ") << text;
        } else {
            print_key(os, spec, values_->get(section)->as_table()->get(spec.key), absolute_paths);
        }
    }
    for (const auto& reward : rewards_) {
        os << "\n[[rewards]]\n";
        const toml::table declared = reward_table(reward, absolute_paths);
        for (const auto& spec : manifest_schema())
            if (std::string(spec.section) == "rewards[]") print_key(os, spec, declared.get(spec.key), absolute_paths);
    }
    return os.str();
}

namespace {
// "section.key" -> its value's text, for every key of a resolved manifest's tables; an array of
// tables ([[rewards]]) by index as --set addresses it: "rewards.1.weight".
std::map<std::string, std::string> resolved_values(const std::string& text) {
    std::map<std::string, std::string> values;
    toml::table root;
    try {
        root = toml::parse(std::string_view(text), std::string_view("resolved manifest"));
    } catch (const toml::parse_error&) {
        return values;
    }
    for (const auto& [name, node] : root) {
        const auto* tables = node.as_array();
        if (const auto* section = node.as_table()) {
            for (const auto& [key, value] : *section)
                values[std::string(name.str()) + "." + std::string(key.str())] = toml_value_text(value);
        } else if (tables && tables->is_array_of_tables()) {
            for (size_t i = 0; i < tables->size(); ++i)
                for (const auto& [key, value] : *tables->get(i)->as_table())
                    values[std::string(name.str()) + "." + std::to_string(i) + "." + std::string(key.str())] =
                        toml_value_text(value);
        } else {
            values[std::string(name.str())] = toml_value_text(node);
        }
    }
    return values;
}
}  // namespace

namespace {
// The schema's default of a resolved key ("train.eval_steps", "rewards.0.timeout") as value text;
// nullopt for a key without one.
std::optional<std::string> default_text(const std::string& key) {
    const size_t dot = key.rfind('.');
    std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
    const std::string name = key.substr(dot == std::string::npos ? 0 : dot + 1);
    if (section.rfind("rewards.", 0) == 0) section = "rewards[]";
    for (const auto& spec : manifest_schema())
        if (spec.default_toml && section == spec.section && name == spec.key) {
            const toml::table parsed = toml::parse("v = " + std::string(spec.default_toml));
            const toml::node& value = *parsed.get("v");
            // a number key's default written as an integer ("0") reads back as the float it resolves to
            if (spec.type == KeyType::number)
                if (auto number = value.value<double>()) return toml_value_text(toml::value<double>(*number));
            return toml_value_text(value);
        }
    return std::nullopt;
}
}  // namespace

namespace {
// "500" and "500.0": a key that became a number (save_steps took fractions) changed no setting
bool same_number(const std::string& a, const std::string& b) {
    char *end_a = nullptr, *end_b = nullptr;
    const double x = std::strtod(a.c_str(), &end_a), y = std::strtod(b.c_str(), &end_b);
    return !a.empty() && !b.empty() && *end_a == '\0' && *end_b == '\0' && x == y;
}
}  // namespace

std::vector<std::string> Manifest::resolved_changes(const std::string& before, const std::string& now) {
    const auto old_values = resolved_values(before), new_values = resolved_values(now);
    std::set<std::string> keys;
    for (const auto* values : {&old_values, &new_values})
        for (const auto& [key, value] : *values) keys.insert(key);
    std::vector<std::string> changes;
    for (const std::string& key : keys) {
        const auto was = old_values.find(key), is = new_values.find(key);
        const std::string was_text = was == old_values.end() ? "unset" : was->second;
        const std::string is_text = is == new_values.end() ? "unset" : is->second;
        // a key newer than the checkpoint's Grove, at its default, is no change of the run's settings
        if (was == old_values.end() && !old_values.empty() && default_text(key) == is_text) continue;
        if (was_text != is_text && !same_number(was_text, is_text))
            changes.push_back(key + " = " + is_text + " (was " + was_text + ")");
    }
    return changes;
}

std::optional<std::string> Manifest::resolved_string(const std::string& resolved, const std::string& key) {
    try {
        const toml::table root = toml::parse(std::string_view(resolved), std::string_view("resolved manifest"));
        return root.at_path(key).value<std::string>();
    } catch (const toml::parse_error&) {
        return std::nullopt;
    }
}

void Manifest::use_model_folder(const std::string& folder) {
    values_ = std::make_shared<toml::table>(*values_);
    values_->get("model")->as_table()->insert_or_assign("path", folder);
}

std::string manifest_reference_markdown() {
    std::ostringstream os;
    os << "# Manifest reference\n\n"
       << "Generated from the schema in `core/src/config/manifest_schema.cpp` by `grove manifest-reference`;\n"
       << "a test keeps this file identical to what the validator accepts. Relative paths are resolved\n"
       << "against the manifest's folder. Any key can be overridden with `--set section.key=value`.\n";
    std::string current = "\x01";
    for (const auto& spec : manifest_schema()) {
        std::string section = spec.section;
        if (section != current) {
            current = section;
            os << "\n## " << (section.empty() ? "top level" : section_header(section)) << "\n\n"
               << "| key | type | default | valid | TRL option | meaning |\n|---|---|---|---|---|---|\n";
        }
        std::string valid;
        if (spec.choices)
            valid = Validator::choices_text(spec);
        else if (spec.type == KeyType::integer || spec.type == KeyType::number) {
            std::string lower = spec.min <= -1e299 ? "" : (spec.min_exclusive ? "> " : ">= ") + format_number(spec.min);
            std::string upper = spec.max >= 1e299 ? "" : "<= " + format_number(spec.max);
            valid = lower.empty() ? upper : upper.empty() ? lower : lower + ", " + upper;
        }
        std::string type = type_phrase(spec.type);
        os << "| `" << spec.key << "` | " << type << " | "
           << (spec.required       ? "required"
               : spec.default_toml ? "`" + std::string(spec.default_toml) + "`"
                                   : "unset")
           << " | " << valid << " | " << (spec.trl_name ? "`" + std::string(spec.trl_name) + "`" : "") << " | " << spec.help
           << " |\n";
    }
    return os.str();
}

}  // namespace grove
