// grove plugins list|info, grove check: everything that needs the plugin host and the manifest
// but no libtorch.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "grove/dataset.hpp"
#include "grove/environment_host.hpp"
#include "grove/error.hpp"
#include "grove/hub_cache.hpp"
#include "grove/isolated_reward.hpp"
#include "grove/manifest.hpp"
#include "grove/model_config.hpp"
#include "grove/plugin_host.hpp"
#include "grove/reward_set.hpp"
#include "grove/run_config.hpp"
#include "grove/tokenizer.hpp"

namespace grove::cli {

using grove::Error;
using grove::ErrorKind;

namespace {
std::string flags_text(uint64_t flags) {
    std::vector<std::string> names;
    if (flags & GROVE_PLUGIN_THREAD_SAFE) names.push_back("thread-safe");
    if (flags & GROVE_PLUGIN_DETERMINISTIC) names.push_back("deterministic");
    if (flags & GROVE_PLUGIN_SPLIT_INVARIANT) names.push_back("split-invariant");
    if (flags & GROVE_PLUGIN_TRAINS_BASE_WEIGHTS) names.push_back("trains-base-weights");
    std::string out;
    for (size_t i = 0; i < names.size(); ++i) out += (i ? "," : "") + names[i];
    return out.empty() ? "-" : out;
}

const char* value_type_text(uint32_t type) {
    switch (type) {
        case GROVE_VALUE_STRING:
            return "string";
        case GROVE_VALUE_INT:
            return "integer";
        case GROVE_VALUE_FLOAT:
            return "number";
        case GROVE_VALUE_BOOL:
            return "boolean";
        case GROVE_VALUE_STRING_ARRAY:
            return "string array";
        case GROVE_VALUE_INT_ARRAY:
            return "integer array";
        case GROVE_VALUE_FLOAT_ARRAY:
            return "number array";
        case GROVE_VALUE_TABLE:
            return "table";
        default:
            return "?";
    }
}

}  // namespace

int plugins_list(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("json", "machine-readable output");
    auto vm = parse("plugins list", args, options, {}, "[--json]");
    grove::PluginHost host(grove::plugin_search_path({}));
    std::vector<std::string> skipped;
    auto plugins = host.list(&skipped);
    if (vm.count("json")) {
        nlohmann::json out = nlohmann::json::array();
        for (const auto& p : plugins)
            out.push_back({{"name", p.name},
                           {"kind", grove::plugin_kind_name(p.kind)},
                           {"version", p.version},
                           {"abi", std::to_string(p.abi_major) + "." + std::to_string(p.abi_minor)},
                           {"file", p.file},
                           {"description", p.description}});
        std::cout << out.dump(2) << "\n";
    } else {
        int name_width = 18;  // the longest name and a space
        for (const auto& p : plugins) name_width = std::max(name_width, int(p.name.size()) + 1);
        std::cout << std::left << std::setw(name_width) << "NAME" << std::setw(12) << "KIND" << std::setw(9) << "VERSION"
                  << std::setw(6) << "ABI" << "FILE\n";
        for (const auto& p : plugins)
            std::cout << std::setw(name_width) << p.name << std::setw(12) << grove::plugin_kind_name(p.kind) << std::setw(9)
                      << p.version << std::setw(6) << (std::to_string(p.abi_major) + "." + std::to_string(p.abi_minor))
                      << p.file << "\n";
        if (plugins.empty()) {
            std::cout << "(no plugins found in:";
            for (const auto& dir : host.search_dirs()) std::cout << " " << dir;
            std::cout << ")\n";
        }
    }
    for (const auto& s : skipped) std::cerr << "grove: warning: skipped " << s << "\n";
    return 0;
}

int plugins_info(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("plugin", po::value<std::string>()->required(), "plugin name or library path");
    po::positional_options_description positional;
    positional.add("plugin", 1);
    auto vm = parse("plugins info", args, options, positional, "NAME|PATH");
    grove::PluginHost host(grove::plugin_search_path({}));
    auto p = host.find(vm["plugin"].as<std::string>());
    std::cout << p.name << " " << p.version << " — " << p.description << "\n"
              << "  kind:    " << grove::plugin_kind_name(p.kind) << "\n"
              << "  file:    " << p.file << "\n"
              << "  ABI:     " << p.abi_major << "." << p.abi_minor << "\n"
              << "  flags:   " << flags_text(p.flags) << "\n"
              << "  config keys:" << (p.keys.empty() ? " (none)" : "") << "\n";
    for (const auto& k : p.keys)
        std::cout << "    " << std::left << std::setw(20) << k.name << std::setw(14) << value_type_text(k.type) << std::setw(28)
                  << (k.required ? "required" : "default " + std::string(k.default_text ? k.default_text : "-"))
                  << (k.help ? k.help : "") << "\n";
    if (!p.metric_names.empty()) {
        std::cout << "  metrics:";
        for (const auto& m : p.metric_names) std::cout << " " << m;
        std::cout << "\n";
    }
    return 0;
}

namespace {
// A row's completion: text, or TRL's conversational form, one assistant message.
std::string completion_text(const nlohmann::json& completion, const std::string& where) {
    if (completion.is_string()) return completion;
    const bool one_assistant_message = completion.is_array() && completion.size() == 1 && completion[0].is_object() &&
                                       completion[0].value("role", "") == "assistant" && completion[0].contains("content") &&
                                       completion[0]["content"].is_string();
    if (!one_assistant_message)
        throw Error(ErrorKind::input, where +
                                          ": \"completion\" must be text or one assistant message, e.g. "
                                          "[{\"role\": \"assistant\", \"content\": \"...\"}] (TRL's conversational form)");
    return completion[0]["content"];
}

// A row's "turns" as `grove generate --environment --json` prints them ([{"role": "model" or
// "environment", "text"}]) as the reward batch's episode_turns: alternating, the model's first.
std::vector<std::string> episode_turn_texts(const nlohmann::json& turns, const std::string& where) {
    const std::string expected = where +
                                 ": \"turns\" must be a list of {\"role\": \"model\" or \"environment\", "
                                 "\"text\": ...} that alternate (as grove generate --environment --json prints them)";
    if (!turns.is_array()) throw Error(ErrorKind::input, expected);
    std::vector<std::string> texts;
    for (const auto& turn : turns) {
        if (!turn.is_object() || !turn.contains("text") || !turn["text"].is_string()) throw Error(ErrorKind::input, expected);
        const std::string role = turn.value("role", "");
        if (role != "model" && role != "environment") throw Error(ErrorKind::input, expected);
        if ((role == "model") != (texts.size() % 2 == 0)) {
            if (!texts.empty()) throw Error(ErrorKind::input, expected);
            texts.emplace_back();  // the environment's first: an empty model turn before it
        }
        texts.push_back(turn["text"]);
    }
    if (texts.empty()) texts.emplace_back();
    return texts;
}

// A row's prompt as C plugins see it without a chat template: text as is, a conversation's message
// contents one per line (reward_batch.prompt_json keeps the messages themselves).
std::string prompt_as_text(const nlohmann::json& prompt, const std::string& where) {
    if (prompt.is_string()) return prompt;
    auto is_message = [](const nlohmann::json& m) {
        return m.is_object() && m.contains("role") && m["role"].is_string() && m.contains("content") &&
               m["content"].is_string();
    };
    if (!prompt.is_array() || prompt.empty() || !std::all_of(prompt.begin(), prompt.end(), is_message))
        throw Error(ErrorKind::input,
                    where + ": \"prompt\" must be text or a list of {\"role\": ..., \"content\": ...} messages (strings)");
    std::string text;
    for (const auto& m : prompt) text += (text.empty() ? "" : "\n") + m["content"].get<std::string>();
    return text;
}
}  // namespace

// Scores fixed completions with one reward plugin: the way to test a reward without a model.
int plugins_score(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("plugin", po::value<std::string>()->required(), "reward plugin name or library path")(
        "input", po::value<std::string>()->required(),
        "JSONL rows: \"completion\" (text, or [one assistant message]), optional \"prompt\" (text, or chat messages), "
        "\"truncated\", \"completion_ids\", other columns")("config", po::value<std::string>()->default_value(""),
                                                            "the plugin's config as TOML, e.g. 'min_steps = 2'")(
        "num-generations", po::value<uint32_t>()->default_value(1), "rows per group (G), as in training")(
        "seed", po::value<uint64_t>()->default_value(0), "the batch seed the plugin sees")(
        "repeat", po::value<uint32_t>()->default_value(1),
        "score the rows this many times and print the time per call to stderr (the first call apart)")(
        "isolation", po::value<std::string>()->default_value("none"),
        "process: score in a worker process, as [[rewards]] isolation = \"process\" does");
    po::positional_options_description positional;
    positional.add("plugin", 1);
    auto vm =
        parse("plugins score", args, options, positional, "NAME|PATH --input ROWS.jsonl [--config TOML] [--num-generations G]");
    const std::string input = vm["input"].as<std::string>();
    grove::PluginHost host(grove::plugin_search_path({}));
    grove::PluginInfo info = host.find(vm["plugin"].as<std::string>(), GROVE_PLUGIN_KIND_REWARD);
    const std::string isolation = vm["isolation"].as<std::string>();
    if (isolation != "none" && isolation != "process")
        throw Error(ErrorKind::usage, "--isolation is none or process, not '" + isolation + "'");
    std::unique_ptr<grove::IsolatedReward> isolated;
    std::optional<grove::PluginInstance> instance;
    if (isolation == "process") {
        grove::PluginUse use = grove::plugin_use_from_toml(info.file, vm["config"].as<std::string>(), "--config");
        use.isolation.process = true;
        isolated = std::make_unique<grove::IsolatedReward>(info, use);
    } else {
        instance.emplace(info, grove::PluginConfig::from_toml_text(info, vm["config"].as<std::string>(), "--config"));
    }

    grove::RewardRows rows;
    rows.num_generations = vm["num-generations"].as<uint32_t>();
    rows.seed = vm["seed"].as<uint64_t>();
    if (rows.num_generations == 0) throw Error(ErrorKind::usage, "--num-generations must be at least 1");
    grove::for_each_jsonl(
        input, "the rows to score (JSONL with a \"completion\" column)", [&](nlohmann::json& row, const std::string& where) {
            if (!row.is_object() || !row.contains("completion"))
                throw Error(ErrorKind::input, where + ": the row needs a \"completion\"");
            std::string completion = completion_text(row["completion"], where);
            std::string prompt_as_json = row.contains("prompt") ? row["prompt"].dump() : nlohmann::json("").dump();
            std::string prompt = prompt_as_text(row.value("prompt", nlohmann::json("")), where);
            bool truncated = row.value("truncated", false);
            // without a tokenizer the token ids are the completion's UTF-8 bytes unless the row gives them
            std::vector<int32_t> ids;
            if (row.contains("completion_ids")) {
                try {
                    ids = row["completion_ids"].get<std::vector<int32_t>>();
                } catch (const nlohmann::json::exception&) {
                    throw Error(ErrorKind::input, where + ": \"completion_ids\" must be a list of integers");
                }
            } else {
                for (unsigned char c : completion) ids.push_back(c);
            }
            // an episode's env_mask (grove generate --environment --json): 1 = the model's token
            std::vector<uint8_t> model_tokens;
            if (row.contains("env_mask")) {
                try {
                    model_tokens = row["env_mask"].get<std::vector<uint8_t>>();
                } catch (const nlohmann::json::exception&) {
                    throw Error(ErrorKind::input, where + ": \"env_mask\" must be a list of 0 and 1");
                }
                if (model_tokens.size() != ids.size() || !row.contains("completion_ids"))
                    throw Error(ErrorKind::input, where + ": \"env_mask\" needs \"completion_ids\" of the same length");
            }
            std::optional<std::vector<std::string>> turns;
            if (row.contains("turns")) turns = episode_turn_texts(row["turns"], where);
            for (const char* column : {"completion", "prompt", "truncated", "completion_ids", "env_mask", "turns"})
                row.erase(column);
            rows.add(std::move(prompt), std::move(completion), ids, truncated, row.dump(), model_tokens);
            rows.prompt_json.push_back(std::move(prompt_as_json));
            if (turns) rows.add_episode_turns(std::move(*turns));
        });
    if (rows.size() == 0) throw Error(ErrorKind::input, input + ": no rows to score");
    if (rows.size() % rows.num_generations != 0)
        throw Error(ErrorKind::input, input + ": " + std::to_string(rows.size()) + " rows do not form groups of " +
                                          std::to_string(rows.num_generations) + " (--num-generations)");

    std::vector<float> scores, metrics;
    RewardLogs logged;
    const uint32_t repeat = std::max(vm["repeat"].as<uint32_t>(), 1u);
    std::vector<double> seconds;
    for (uint32_t call = 0; call < repeat; ++call) {
        logged = RewardLogs{};
        const auto start = std::chrono::steady_clock::now();
        if (isolated)
            isolated->score(rows.view(), scores, metrics, &logged);
        else
            instance->score(rows.view(), scores, metrics, &logged);
        seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (repeat > 1) {  // the first call may import or compile what the plugin needs: reported apart
        const double rest = std::accumulate(seconds.begin() + 1, seconds.end(), 0.0) / double(repeat - 1);
        std::cerr << "grove: score of " << rows.size() << " rows: first call " << seconds[0] * 1e3 << " ms, then " << rest * 1e3
                  << " ms per call (mean of " << repeat - 1 << ")\n";
    }
    const ExtraColumns extra = extra_columns(logged, rows.size());
    const auto& metric_names = info.metric_names;
    auto number = [](float v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
    for (size_t i = 0; i < rows.size(); ++i) {
        nlohmann::json out{{"row", i}, {"score", number(scores[i])}};  // null = not applicable (NaN)
        for (size_t m = 0; m < metric_names.size(); ++m) out["metrics"][metric_names[m]] = number(metrics[m * rows.size() + i]);
        for (const auto& [column, values] : extra)  // what the reward logged per row (TRL's log_extra)
            if (!values[i].empty()) out["extra"][column] = nlohmann::json::parse(values[i]);
        std::cout << out.dump() << "\n";
    }
    if (!logged.metrics.empty()) {  // what the reward logged by name for the batch (TRL's log_metric): one more line
        nlohmann::json batch_metrics;
        for (const auto& [name, value] : logged.metrics) batch_metrics["logged"][name].push_back(value);
        std::cout << batch_metrics.dump() << "\n";
    }
    return 0;
}

// The training prompts rendered as `grove train` renders them, so a conversation the chat template
// refuses is named here rather than after the model has loaded; what was done, in a line. Nothing
// when the model folder or the dataset is not there yet (grove train names those).
std::string render_training_prompts(const grove::RunConfig& config, const grove::Environment* environment) {
    namespace fs = std::filesystem;
    if (config.rollouts_path || !fs::exists(fs::path(config.model.path) / "config.json")) return "";
    std::vector<std::string> sources;  // the training prompts, and those evaluation renders
    for (const auto& source : {config.data.source, config.data.eval_source})
        if (source && (source->rfind("builtin:", 0) == 0 || fs::exists(*source))) sources.push_back(*source);
    if (sources.empty()) return "";
    const auto tokenizer = grove::Tokenizer::load(config.model.path);
    const grove::ChatTemplate family = config.chat_template(tokenizer->config());
    size_t prompts = 0, conversations = 0;
    for (const std::string& source : sources)
        for (const grove::PromptRow& row :
             grove::load_prompts(source, config.data.prompt_column, grove::Environment::rows_without_prompt(environment))) {
            grove::prompt_text(row, family, tokenizer->config(),
                               environment ? environment->tools_for(row.columns_json, row.origin) : "");
            ++prompts;
            conversations += !row.messages.empty();
        }
    return "chat template " + grove::chat_template_name(family) + ": " + std::to_string(prompts) +
           " prompts render as grove train renders them (conversations: " + std::to_string(conversations) + ")";
}

// A mixture of experts' routing and the weight of its load-balancing loss, in a line; a weight set
// for a model without experts is refused here as grove train refuses it. Nothing when the model
// folder is not there yet.
std::string check_mixture_of_experts(const grove::RunConfig& config) {
    if (!std::filesystem::exists(std::filesystem::path(config.model.path) / "config.json")) return "";
    const grove::ModelConfig model = grove::load_model_config(config.model.path);
    const double coef = config.router_aux_loss_coef_for(model);
    if (!model.mixture_of_experts()) return "";
    std::ostringstream line;
    line << "mixture of experts: " << model.architecture << ", " << model.experts_per_token << " of " << model.num_experts
         << " experts per token; load-balancing loss weight " << coef;
    return line.str();
}

int check(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("manifest", po::value<std::string>()->required(), "the run's TOML manifest")(
        "set", po::value<std::vector<std::string>>()->composing(), "override a key: --set section.key=value (repeatable)");
    po::positional_options_description positional;
    positional.add("manifest", 1);
    auto vm = parse("check", args, options, positional, "MANIFEST [--set section.key=value ...]");
    std::vector<std::string> overrides;
    if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
    // without a reward a manifest is grove sft's, whose batches need not hold whole groups; the
    // environment may be the reward (TRL's get_reward()), which its plugin says once created
    const std::string path = vm["manifest"].as<std::string>();
    auto manifest = grove::Manifest::load(path, overrides, world_size_from_environment(), grove::ManifestUse::sft);
    if (!manifest.rewards().empty()) manifest = grove::Manifest::load(path, overrides, world_size_from_environment());

    grove::PluginHost host(grove::plugin_search_path(manifest.strings("plugin_dirs")));
    std::unique_ptr<grove::Environment> environment;
    if (const auto section = grove::RunConfig::from(manifest, grove::RunConfig::Kind::sft).environment; section.use)
        environment = grove::make_environment(host, *section.use, section.reward, manifest.rewards(), false);
    const bool sft_only = manifest.rewards().empty() && !(environment && environment->reward_column());
    if (manifest.rewards().empty() && !sft_only)
        manifest = grove::Manifest::load(path, overrides, world_size_from_environment());

    std::vector<grove::PluginInstance> instances;
    std::vector<std::string> reward_models;  // checked by their config.json; grove train loads them
    for (const auto& reward : manifest.rewards()) {
        if (reward.model.empty()) {
            instances.push_back(grove::create_plugin(host, reward, GROVE_PLUGIN_KIND_REWARD));
            continue;
        }
        const grove::ModelConfig model = grove::load_model_config(reward.model);
        if (!model.sequence_classifier)
            throw grove::Error(grove::ErrorKind::input, reward.origin + ": " + reward.model + " is a " + model.architecture +
                                                            ", not a reward model (a ...ForSequenceClassification)");
        reward_models.push_back(reward.name + " " + model.architecture + "  " + reward.model);
    }
    instances.push_back(grove::create_plugin(host, manifest.adapter(), GROVE_PLUGIN_KIND_ADAPTER));
    const grove::PluginInfo adapter = instances.back().info();
    instances.push_back(grove::create_plugin(host, manifest.reduction(), GROVE_PLUGIN_KIND_REDUCTION));
    instances.push_back(grove::create_plugin(host, manifest.objective(), GROVE_PLUGIN_KIND_OBJECTIVE));
    // the rules across keys
    const grove::RunConfig config =
        grove::RunConfig::from(manifest, sft_only ? grove::RunConfig::Kind::sft : grove::RunConfig::Kind::grpo);
    config.check_adapter(adapter.name, (adapter.flags & GROVE_PLUGIN_TRAINS_BASE_WEIGHTS) != 0);
    const std::string experts = check_mixture_of_experts(config);
    if (!config.model.enable_thinking) config.chat_template(grove::Tokenizer::load(config.model.path)->config());

    const std::string prompts = sft_only ? "" : render_training_prompts(config, environment.get());
    // a model made later (by grove sft or init-model, as the quickstart's) is no error here, but said
    const bool model_there = std::filesystem::exists(std::filesystem::path(config.model.path) / "config.json");
    std::cout << manifest.resolved_toml();
    std::cout << "\n# plugins (all created successfully)\n";
    auto list = [](const grove::PluginInfo& info) {
        std::cout << "#   " << std::left << std::setw(10) << grove::plugin_kind_name(info.kind) << " " << info.name << " "
                  << info.version << "  " << info.file << "\n";
    };
    for (const auto& instance : instances) list(instance.info());
    if (environment) list(environment->info());
    if (environment)
        for (const grove::PluginUse& column : environment->reward_columns())
            std::cout << "#   reward     " << column.name << " (the environment's judgement of whole "
                      << "episodes), weight " << column.weight << "\n";
    for (const std::string& m : reward_models) std::cout << "#   reward     " << m << "\n";
    if (!experts.empty()) std::cout << "# " << experts << "\n";
    if (!prompts.empty()) std::cout << "# " << prompts << "\n";
    if (!model_there)
        std::cout << "# model: " << config.model.path
                  << " holds no config.json yet: grove train and grove sft need a Hugging Face model folder there, or "
                     "model.path = a Hub id the local cache holds (`hf download ID`, cache "
                  << grove::hub_cache_directory() << ")\n";
    if (sft_only) std::cout << "# no reward: valid for grove sft only (grove train and grove eval need a reward)\n";
    std::cout << "# " << manifest.path() << " is valid\n";
    return 0;
}

}  // namespace grove::cli
