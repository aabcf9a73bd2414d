// grove generate, grove logprobs: the model, tokenizer and sampler from the command line.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <iomanip>
#include <memory>
#include <sstream>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "cli.hpp"
#include "grove/dataset.hpp"
#include "grove/environment_host.hpp"
#include "grove/episodes.hpp"
#include "grove/error.hpp"
#include "grove/generation.hpp"
#include "grove/hub_cache.hpp"
#include "grove/manifest.hpp"
#include "grove/adapter_checkpoint.hpp"
#include "grove/model.hpp"
#include "grove/plugin_host.hpp"
#include "grove/tokenizer.hpp"

namespace grove::cli {

using nlohmann::json;

namespace {

std::vector<int64_t> to_vector(const at::Tensor& t) {
    at::Tensor c = t.to(at::kLong).contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// `grove generate --environment`: whole episodes, printed turn by turn with the environment's parts
// marked (text), or with their turns and env_mask (--json).
// --environment with its --environment-config, or null without one
std::unique_ptr<Environment> environment_option(const po::variables_map& vm) {
    if (!vm.count("environment")) return nullptr;
    std::vector<std::string> dirs;
    if (vm.count("plugin-dir")) dirs = vm["plugin-dir"].as<std::vector<std::string>>();
    PluginHost host(plugin_search_path(dirs));
    PluginInfo info = host.find(vm["environment"].as<std::string>(), GROVE_PLUGIN_KIND_ENVIRONMENT, "--environment");
    PluginConfig config =
        PluginConfig::from_toml_text(info, vm["environment-config"].as<std::string>(), "--environment-config");
    return std::make_unique<Environment>(PluginInstance(info, std::move(config)));
}

int print_episodes(const po::variables_map& vm, const Model& model, const Tokenizer& tokenizer, const Environment& environment,
                   const std::vector<PromptRow>& rows, const std::vector<std::vector<int64_t>>& prompts,
                   const std::vector<std::string>& texts, int64_t n, const SamplingOptions& options, ChatTemplate family) {
    const int64_t max_turns = vm.count("max-turns") ? vm["max-turns"].as<int64_t>() : kNoTurnLimit;
    if (max_turns < 1) throw Error(ErrorKind::usage, "grove generate: --max-turns must be >= 1");
    std::vector<EpisodeStart> starts;
    for (size_t i = 0; i < prompts.size(); ++i) {
        const PromptRow& row = rows[i / size_t(n)];
        starts.push_back({prompts[i], texts[i], row.columns_json, row.messages, row.prompt_given});
    }
    const auto episodes =
        run_episodes(model, tokenizer, environment, starts, options, {max_turns, options.max_new_tokens, 0, family});
    for (size_t i = 0; i < episodes.size(); ++i) {
        const Episode& e = episodes[i];
        json turns = json::array();
        for (const EpisodeTurn& turn : episode_turns(e, tokenizer))
            turns.push_back({{"role", turn.from_model ? "model" : "environment"}, {"text", turn.text}});
        if (vm.count("json")) {
            json out = {
                {"prompt_index", i / size_t(n)}, {"sample", i % size_t(n)},          {"prompt", starts[i].prompt_text},
                {"completion_ids", e.ids},       {"env_mask", e.model_tokens},       {"turns", turns},
                {"model_turns", e.stats.turns},  {"tool_calls", e.stats.tool_calls}, {"tool_failures", e.stats.tool_failures}};
            std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
            continue;
        }
        for (const auto& turn : turns)
            std::cout << (turn["role"] == "model" ? "" : "[environment] ") << turn["text"].get<std::string>() << "\n";
        std::cout << "---\n";
    }
    return 0;
}

}  // namespace

int generate(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("model", po::value<std::string>()->required(),
                          "Hugging Face model folder, or the Hub id of a cached model")(
        "prompt", po::value<std::string>(), "one prompt")("input", po::value<std::string>(),
                                                          "JSONL file, one {\"prompt\": text or messages} per line")(
        "chat", "wrap text prompts as a user message and apply the chat template")(
        "chat-template", po::value<std::string>()->default_value("auto"),
        "auto, chatml, qwen3, qwen3_instruct, qwen3_thinking, llama3, llama3_1, llama3_2, llama2, phi3, phi4, phi4_mini, "
        "smollm3, gemma, tulu, "
        "mistral, deepseek_r1, "
        "plain")("no-thinking", "qwen3, smollm3: an empty <think> block ends the prompt (enable_thinking=False)")(
        "n", po::value<int64_t>()->default_value(1), "completions per prompt")(
        "max-new-tokens", po::value<int64_t>()->default_value(128), "longest completion")("greedy", "argmax decoding")(
        "temperature", po::value<double>()->default_value(1.0), "sampling temperature")(
        "top-p", po::value<double>()->default_value(1.0), "nucleus mass")(
        "top-k", po::value<int64_t>()->default_value(0), "top-k; 0 disables")("min-p", po::value<double>()->default_value(0.0),
                                                                              "min-p; 0 disables")(
        "repetition-penalty", po::value<double>()->default_value(1.0), "1 disables")(
        "seed", po::value<uint64_t>()->default_value(0), "sampling seed")(
        "device", po::value<std::string>()->default_value("auto"), "cpu, cuda, auto")(
        "dtype", po::value<std::string>()->default_value("float32"), "float32 or bfloat16")(
        "no-cuda-graphs", "on CUDA, decode with the eager loop instead of CUDA graphs")(
        "capture-sampling", "on CUDA, capture sampling in the decode step's graph too (no gain measured yet)")(
        "no-split-attention", "on CUDA, one decode attention block per KV head and row (no split of the columns)")(
        "json", "one JSON object per completion")("environment", po::value<std::string>(),
                                                  "multi-turn episodes with this environment plugin (name or path)")(
        "environment-config", po::value<std::string>()->default_value(""), "the environment's settings, as TOML")(
        "max-turns", po::value<int64_t>(), "model turns per episode at most (default: no limit, as TRL)")(
        "plugin-dir", po::value<std::vector<std::string>>()->composing(), "a folder to search for plugins (repeatable)");
    add_revision_option(options);
    auto vm = parse("generate", args, options, {}, "--model DIR (--prompt TEXT | --input FILE.jsonl) [options]");
    if (vm.count("prompt") == vm.count("input"))
        throw Error(ErrorKind::usage, "grove generate: give exactly one of --prompt and --input");
    int64_t n = vm["n"].as<int64_t>();
    if (n < 1) throw Error(ErrorKind::usage, "grove generate: --n must be >= 1");

    const std::string folder = model_option_folder(vm);
    auto model = grove::load_model_or_adapter_checkpoint(folder, vm["device"].as<std::string>(), vm["dtype"].as<std::string>());
    // The graph engine decodes with the model itself when it needs no bf16 copy: one GEMM for q/k/v
    // and one for gate/up, as a copy would have
    if (model->device().is_cuda() && !model->has_adapters() && vm.count("no-cuda-graphs") == 0)
        model->concatenate_projections();
    auto tokenizer = Tokenizer::load(folder);
    const std::unique_ptr<Environment> environment = environment_option(vm);  // its tools join the prompts
    std::vector<PromptRow> rows;
    if (vm.count("prompt"))
        rows.push_back({vm["prompt"].as<std::string>(), {}, "{}", "--prompt"});
    else
        rows = load_prompts(vm["input"].as<std::string>(), "prompt", Environment::rows_without_prompt(environment.get()));
    ChatTemplate family =
        chat_template_from_name(vm["chat-template"].as<std::string>(), tokenizer->config(), vm.count("no-thinking") == 0);

    std::vector<std::vector<int64_t>> prompts;
    std::vector<std::string> texts;
    for (auto& row : rows) {
        bool chat = !row.messages.empty() || vm.count("chat");
        if (row.messages.empty() && chat) row.messages.push_back({"user", row.text});
        std::string text = prompt_text(row, family, tokenizer->config(),
                                       environment ? environment->tools_for(row.columns_json, row.origin) : "");
        // a rendered template already holds its special tokens (as apply_chat_template does)
        std::vector<int64_t> ids = tokenizer->encode(text, !chat);
        for (int64_t i = 0; i < n; ++i) {
            prompts.push_back(ids);
            texts.push_back(text);
        }
    }
    SamplingOptions o;
    o.max_new_tokens = vm["max-new-tokens"].as<int64_t>();
    o.greedy = vm.count("greedy") > 0;
    o.temperature = vm["temperature"].as<double>();
    o.top_p = vm["top-p"].as<double>();
    o.top_k = vm["top-k"].as<int64_t>();
    o.min_p = vm["min-p"].as<double>();
    o.repetition_penalty = vm["repetition-penalty"].as<double>();
    o.seed = vm["seed"].as<uint64_t>();
    o.cuda_graphs = vm.count("no-cuda-graphs") == 0;
    o.capture_sampling = vm.count("capture-sampling") > 0;
    o.split_attention = vm.count("no-split-attention") == 0;
    set_stop_tokens(o, *model, tokenizer->config());
    if (environment) return print_episodes(vm, *model, *tokenizer, *environment, rows, prompts, texts, n, o, family);
    auto result = grove::generate(*model, prompts, o);

    for (size_t i = 0; i < prompts.size(); ++i) {
        int64_t length = result.lengths[i];
        std::vector<int64_t> ids = to_vector(result.completion_ids[int64_t(i)].narrow(0, 0, length));
        std::string completion = tokenizer->decode(ids, true);
        if (vm.count("json")) {
            at::Tensor lp = result.sampled_logprobs[int64_t(i)].narrow(0, 0, length).contiguous();
            json out = {{"prompt_index", i / size_t(n)},
                        {"sample", i % size_t(n)},
                        {"prompt", texts[i]},
                        {"prompt_ids", prompts[i]},
                        {"completion", completion},
                        {"completion_ids", ids},
                        {"truncated", result.truncated[int64_t(i)].item<bool>()},
                        {"logprobs", std::vector<float>(lp.data_ptr<float>(), lp.data_ptr<float>() + length)}};
            // completions can end mid-character: invalid UTF-8 becomes U+FFFD in JSON
            std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
        } else {
            std::cout << completion << (n > 1 || prompts.size() > 1 ? "\n---\n" : "\n");
        }
    }
    return 0;
}

int logprobs(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("model", po::value<std::string>()->required(),
                          "Hugging Face model folder, or the Hub id of a cached model")(
        "input", po::value<std::string>()->required(),
        "JSONL: {\"prompt_ids\": [...], \"completion_ids\": [...]} or {\"prompt\": \"...\", \"completion\": \"...\"}")(
        "temperature", po::value<double>()->default_value(1.0), "logits are divided by it, as in training")(
        "output", po::value<std::string>(), "write JSONL here instead of stdout")(
        "device", po::value<std::string>()->default_value("auto"), "cpu, cuda, auto")(
        "dtype", po::value<std::string>()->default_value("float32"), "float32 or bfloat16");
    add_revision_option(options);
    auto vm = parse("logprobs", args, options, {}, "--model DIR --input FILE.jsonl [--temperature T] [--output FILE]");
    const std::string folder = model_option_folder(vm);
    const std::string path = vm["input"].as<std::string>();
    double temperature = vm["temperature"].as<double>();
    if (!(temperature > 0)) throw Error(ErrorKind::usage, "grove logprobs: --temperature must be > 0");
    auto model = grove::load_model_or_adapter_checkpoint(folder, vm["device"].as<std::string>(), vm["dtype"].as<std::string>());
    std::unique_ptr<Tokenizer> tokenizer;  // only for text rows

    std::ofstream file;
    if (vm.count("output")) {
        file.open(vm["output"].as<std::string>());
        if (!file) throw Error(ErrorKind::runtime, vm["output"].as<std::string>() + ": cannot write");
    }
    std::ostream& out = vm.count("output") ? file : std::cout;
    at::NoGradGuard no_grad;
    for_each_jsonl(path, "the input", [&](json& j, const std::string& where) {
        std::vector<int64_t> prompt, completion;
        if (j.contains("prompt_ids") && j.contains("completion_ids")) {
            prompt = j["prompt_ids"].get<std::vector<int64_t>>();
            completion = j["completion_ids"].get<std::vector<int64_t>>();
        } else if (j.contains("prompt") && j.contains("completion")) {
            if (!tokenizer) tokenizer = Tokenizer::load(folder);
            prompt = tokenizer->encode(j["prompt"].get<std::string>(), true);
            completion = tokenizer->encode(j["completion"].get<std::string>(), false);
        } else {
            throw Error(ErrorKind::input, where + ": need prompt_ids + completion_ids, or prompt + completion");
        }
        if (prompt.empty() || completion.empty()) throw Error(ErrorKind::input, where + ": empty prompt or completion");
        for (int64_t id : prompt)
            if (id < 0 || id >= model->config().vocab_size)
                throw Error(ErrorKind::input, where + ": token id " + std::to_string(id) + " is outside the vocabulary");
        for (int64_t id : completion)
            if (id < 0 || id >= model->config().vocab_size)
                throw Error(ErrorKind::input, where + ": token id " + std::to_string(id) + " is outside the vocabulary");
        at::Tensor p = at::tensor(prompt).unsqueeze(0), c = at::tensor(completion).unsqueeze(0);
        at::Tensor lp = completion_logprobs(*model, p, at::ones_like(p), c, at::ones_like(c), temperature).cpu().contiguous();
        out << json({{"prompt_ids", prompt},
                     {"completion_ids", completion},
                     {"logprobs", std::vector<float>(lp.data_ptr<float>(), lp.data_ptr<float>() + lp.numel())}})
                   .dump()
            << "\n";
    });
    return 0;
}

}  // namespace grove::cli

namespace grove::cli {}  // namespace grove::cli
