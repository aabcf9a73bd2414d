// grove generate, grove logprobs: the model, tokenizer and sampler from the command line.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <iomanip>
#include <sstream>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "cli.hpp"
#include "grove/dataset.hpp"
#include "grove/distributed.hpp"
#include "grove/error.hpp"
#include "grove/evaluation.hpp"
#include "grove/sft.hpp"
#include "grove/generation.hpp"
#include "grove/manifest.hpp"
#include "grove/trainer.hpp"
#include "grove/model.hpp"
#include "grove/tokenizer.hpp"

namespace grove::cli {

using nlohmann::json;

namespace {

std::vector<int64_t> to_vector(const at::Tensor& t) {
    at::Tensor c = t.to(at::kLong).contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace

int generate(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("model", po::value<std::string>()->required(), "Hugging Face model folder")(
        "prompt", po::value<std::string>(), "one prompt")("input", po::value<std::string>(),
                                                          "JSONL file, one {\"prompt\": text or messages} per line")(
        "chat", "wrap text prompts as a user message and apply the chat template")(
        "chat-template", po::value<std::string>()->default_value("auto"), "auto, chatml, llama3, llama2, plain")(
        "n", po::value<int64_t>()->default_value(1), "completions per prompt")(
        "max-new-tokens", po::value<int64_t>()->default_value(128), "longest completion")(
        "greedy", "argmax decoding")("temperature", po::value<double>()->default_value(1.0), "sampling temperature")(
        "top-p", po::value<double>()->default_value(1.0), "nucleus mass")("top-k", po::value<int64_t>()->default_value(0),
                                                                          "top-k; 0 disables")(
        "min-p", po::value<double>()->default_value(0.0), "min-p; 0 disables")(
        "repetition-penalty", po::value<double>()->default_value(1.0), "1 disables")(
        "seed", po::value<uint64_t>()->default_value(0), "sampling seed")(
        "device", po::value<std::string>()->default_value("auto"), "cpu, cuda, auto")(
        "dtype", po::value<std::string>()->default_value("float32"), "float32 or bfloat16")(
        "json", "one JSON object per completion");
    auto vm = parse("generate", args, options, {}, "--model DIR (--prompt TEXT | --input FILE.jsonl) [options]");
    if (vm.count("prompt") == vm.count("input"))
        throw Error(ErrorKind::usage, "grove generate: give exactly one of --prompt and --input");
    int64_t n = vm["n"].as<int64_t>();
    if (n < 1) throw Error(ErrorKind::usage, "grove generate: --n must be >= 1");

    std::string folder = vm["model"].as<std::string>();
    auto model = grove::load_model_or_lora_checkpoint(folder, vm["device"].as<std::string>(), vm["dtype"].as<std::string>());
    auto tokenizer = Tokenizer::load(folder);
    std::vector<PromptRow> rows;
    if (vm.count("prompt")) rows.push_back({vm["prompt"].as<std::string>(), {}, "{}", "--prompt"});
    else rows = load_prompts(vm["input"].as<std::string>());
    ChatTemplate family = chat_template_from_name(vm["chat-template"].as<std::string>(), tokenizer->config());

    std::vector<std::vector<int64_t>> prompts;
    std::vector<std::string> texts;
    for (auto& row : rows) {
        bool chat = !row.messages.empty() || vm.count("chat");
        if (row.messages.empty() && chat) row.messages.push_back({"user", row.text});
        std::string text = prompt_text(row, family, tokenizer->config());
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
    set_stop_tokens(o, *model, tokenizer->config());
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
    options.add_options()("model", po::value<std::string>()->required(), "Hugging Face model folder")(
        "input", po::value<std::string>()->required(),
        "JSONL: {\"prompt_ids\": [...], \"completion_ids\": [...]} or {\"prompt\": \"...\", \"completion\": \"...\"}")(
        "temperature", po::value<double>()->default_value(1.0), "logits are divided by it, as in training")(
        "output", po::value<std::string>(), "write JSONL here instead of stdout")(
        "device", po::value<std::string>()->default_value("auto"), "cpu, cuda, auto")(
        "dtype", po::value<std::string>()->default_value("float32"), "float32 or bfloat16");
    auto vm = parse("logprobs", args, options, {}, "--model DIR --input FILE.jsonl [--temperature T] [--output FILE]");
    std::string folder = vm["model"].as<std::string>(), path = vm["input"].as<std::string>();
    double temperature = vm["temperature"].as<double>();
    if (!(temperature > 0)) throw Error(ErrorKind::usage, "grove logprobs: --temperature must be > 0");
    auto model = grove::load_model_or_lora_checkpoint(folder, vm["device"].as<std::string>(), vm["dtype"].as<std::string>());
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

namespace grove::cli {

int train(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("manifest", po::value<std::string>()->required(), "the run's TOML manifest")(
        "set", po::value<std::vector<std::string>>()->composing(), "override a key: --set section.key=value (repeatable)")(
        "resume", po::value<std::string>()->implicit_value("latest"), "continue from the latest checkpoint, or from DIR")(
        "overwrite", "replace an output folder that holds another run")(
        "nproc", po::value<int>()->default_value(1), "train with N local processes (torch.distributed, Gloo)");
    po::positional_options_description positional;
    positional.add("manifest", 1);
    auto vm = parse("train", args, options, positional,
                    "MANIFEST [--set k=v ...] [--resume [DIR|latest]] [--overwrite] [--nproc N]");
    std::vector<std::string> overrides;
    if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
    int nproc = vm["nproc"].as<int>();
    if (nproc < 1) throw Error(ErrorKind::usage, "grove train: --nproc must be >= 1");
    if (nproc > 1) {
        Manifest::load(vm["manifest"].as<std::string>(), overrides, nproc);  // one clear error before any rank starts
        std::vector<std::string> command{"train"};
        for (size_t i = 0; i < args.size(); ++i) {
            if (args[i] == "--nproc") ++i;  // the ranks run one process each
            else if (args[i].rfind("--nproc=", 0) != 0) command.push_back(args[i]);
        }
        return launch_local_processes(nproc, command);
    }
    auto manifest = Manifest::load(vm["manifest"].as<std::string>(), overrides, world_size_from_environment());
    TrainerOptions o;
    o.overwrite = vm.count("overwrite") > 0;
    if (vm.count("resume")) o.resume = vm["resume"].as<std::string>();
    o.world_size = manifest.world_size();
    std::unique_ptr<ProcessGroup> group;
    if (o.world_size > 1) {  // torchrun's environment (or --nproc's)
        ProcessGroupConfig c;
        c.world_size = o.world_size;
        c.rank = integer_from_environment("RANK", -1, 0);
        if (c.rank < 0) throw Error(ErrorKind::usage, "WORLD_SIZE=" + std::to_string(o.world_size) + " needs RANK as well");
        if (const char* addr = std::getenv("MASTER_ADDR"); addr && *addr) c.master_addr = addr;
        c.master_port = integer_from_environment("MASTER_PORT", c.master_port, 1);
        group = std::make_unique<ProcessGroup>(c);
        o.rank = c.rank;
        o.group = group.get();
    }
    o.log = &std::cerr;
    o.progress_bar = ::isatty(2) != 0;
    Trainer trainer(manifest, o);
    if (o.rank == 0)
        std::cerr << "grove: training " << manifest.path() << ": " << trainer.total_steps() << " steps, output "
                  << manifest.string("output.dir") << (o.world_size > 1 ? ", " + std::to_string(o.world_size) + " processes" : "")
                  << "\n";
    trainer.run();  // prints its own summary
    return 0;
}

int export_model(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("merge", po::value<std::string>()->required(), "the LoRA adapter folder (a checkpoint)")(
        "base", po::value<std::string>()->required(), "the base model folder")(
        "output", po::value<std::string>()->required(), "where to write the merged Hugging Face folder");
    po::positional_options_description positional;
    positional.add("output", 1);
    auto vm = parse("export", args, options, positional, "--merge ADAPTER_DIR --base MODEL_DIR OUT_DIR");
    export_merged(vm["merge"].as<std::string>(), vm["base"].as<std::string>(), vm["output"].as<std::string>());
    std::cout << "wrote " << vm["output"].as<std::string>() << "\n";
    return 0;
}

}  // namespace grove::cli

namespace grove::cli {

int eval(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("manifest", po::value<std::string>(), "take model, data, rewards and generation from a manifest")(
        "set", po::value<std::vector<std::string>>()->composing(), "override a manifest key (repeatable)")(
        "model", po::value<std::string>(), "Hugging Face model folder (without a manifest)")(
        "data", po::value<std::string>(), "prompts: JSONL file or builtin:NAME (without a manifest)")(
        "reward", po::value<std::vector<std::string>>()->composing(), "PLUGIN[:weight] (repeatable; without a manifest)")(
        "greedy", "argmax decoding (default: sample at the manifest's temperature)")(
        "samples", po::value<int64_t>()->default_value(1), "completions per prompt")(
        "max-new-tokens", po::value<int64_t>(), "longest completion")(
        "temperature", po::value<double>(), "sampling temperature")(
        "limit", po::value<int64_t>()->default_value(0), "evaluate the first N prompts only")(
        "seed", po::value<uint64_t>(), "sampling seed")("json", "print JSON with every row")(
        "save", po::value<std::string>(), "also write that JSON to a file")(
        "compare", po::value<std::string>(), "a file from an earlier --save: print before, after and change");
    po::positional_options_description positional;
    positional.add("manifest", 1);
    auto vm = parse("eval", args, options, positional,
                    "(MANIFEST | --model DIR --data FILE|builtin:NAME --reward PLUGIN[:weight] ...) [--greedy|--samples K] [--json] "
                    "[--save F.json] [--compare F.json]");
    EvaluationRequest q;
    if (vm.count("manifest")) {
        std::vector<std::string> overrides;
        if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
        q = evaluation_request(Manifest::load(vm["manifest"].as<std::string>(), overrides, world_size_from_environment()));
    } else {
        if (!vm.count("model") || !vm.count("data") || !vm.count("reward"))
            throw Error(ErrorKind::usage, "grove eval: give a MANIFEST, or --model, --data and at least one --reward");
        q.model_dir = vm["model"].as<std::string>();
        q.data_source = vm["data"].as<std::string>();
        q.sampling.max_new_tokens = 256;
        for (const auto& spec : vm["reward"].as<std::vector<std::string>>()) {
            PluginUse use;
            use.plugin = spec;
            auto colon = spec.rfind(':');
            if (colon != std::string::npos) {
                char* end = nullptr;
                double weight = std::strtod(spec.c_str() + colon + 1, &end);
                if (*end) throw Error(ErrorKind::usage, "grove eval: --reward " + spec + ": the weight after ':' must be a number");
                use.plugin = spec.substr(0, colon);
                use.weight = weight;
            }
            use.name = use.plugin;
            use.config = std::make_shared<toml::table>();
            use.origin = "--reward " + spec;
            q.rewards.push_back(use);
        }
    }
    if (vm.count("max-new-tokens")) q.sampling.max_new_tokens = vm["max-new-tokens"].as<int64_t>();
    if (vm.count("temperature")) q.sampling.temperature = vm["temperature"].as<double>();
    if (vm.count("seed")) q.sampling.seed = vm["seed"].as<uint64_t>();
    q.sampling.greedy = vm.count("greedy") > 0;
    q.samples = vm["samples"].as<int64_t>();
    q.limit = vm["limit"].as<int64_t>();
    if (q.samples < 1) throw Error(ErrorKind::usage, "grove eval: --samples must be >= 1");
    if (q.sampling.greedy && q.samples > 1) throw Error(ErrorKind::usage, "grove eval: --greedy gives one completion per prompt; drop --samples");
    EvaluationResult r = evaluate(q);
    size_t prompts = r.rows.size() / size_t(q.samples);
    json rows = json::array();
    for (const auto& row : r.rows)
        rows.push_back({{"prompt", row.prompt}, {"completion", row.completion}, {"length", row.length},
                        {"truncated", row.truncated}, {"rewards", row.rewards}});
    json out = {{"model", q.model_dir}, {"data", q.data_source}, {"prompts", prompts}, {"samples", q.samples},
                {"greedy", q.sampling.greedy}, {"reward", r.reward}, {"rewards", r.reward_mean}, {"mean_length", r.mean_length},
                {"truncated_ratio", r.truncated_ratio}, {"accuracy", r.accuracy >= 0 ? json(r.accuracy) : json(nullptr)},
                {"format_rate", r.format_rate >= 0 ? json(r.format_rate) : json(nullptr)}, {"rows", rows}};
    std::string text = out.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
    if (vm.count("save")) {
        std::string path = vm["save"].as<std::string>();
        std::ofstream file(path);
        if (!(file << text)) throw Error(ErrorKind::runtime, path + ": cannot write the evaluation (--save)");
    }
    if (vm.count("json")) {
        std::cout << text;
        return 0;
    }
    // --compare: a previous --save of the same evaluation becomes the "before" column
    json before;
    std::string compared;
    if (vm.count("compare")) {
        compared = vm["compare"].as<std::string>();
        std::ifstream in(compared);
        if (!in) throw Error(ErrorKind::input, compared + ": cannot read the evaluation to compare with (write one with --save)");
        try {
            before = json::parse(in);
        } catch (const json::exception& e) {
            throw Error(ErrorKind::input, compared + ": not an evaluation saved by grove eval --save: " + e.what());
        }
        if (before.value("data", "") != q.data_source || before.value("prompts", size_t(0)) != prompts ||
            before.value("greedy", false) != q.sampling.greedy)
            throw Error(ErrorKind::input, compared + ": evaluated " + std::to_string(before.value("prompts", size_t(0))) +
                                              " prompts of " + before.value("data", "?") +
                                              (before.value("greedy", false) ? " greedily" : " sampled") + ", this run " +
                                              std::to_string(prompts) + " of " + q.data_source +
                                              (q.sampling.greedy ? " greedily" : " sampled") + ": compare like with like");
    }
    std::cout << "grove eval: " << prompts << " prompts x " << q.samples << (q.sampling.greedy ? " (greedy)" : " (sampled)")
              << " from " << q.data_source << "\n";
    auto number = [](double v) {
        std::ostringstream s;
        s << std::fixed << std::setprecision(4) << v;
        return s.str();
    };
    if (!compared.empty())
        std::cout << "  " << std::left << std::setw(26) << "" << std::right << std::setw(9) << "before" << std::setw(10) << "after"
                  << std::setw(10) << "change" << "   (before: " << compared << ")\n";
    auto row = [&](const std::string& name, double value, const json* previous, const std::string& note = "") {
        std::cout << "  " << std::left << std::setw(26) << name << std::right;
        if (!compared.empty()) {
            bool known = previous && previous->is_number();
            std::cout << std::setw(9) << (known ? number(previous->get<double>()) : "-") << std::setw(10) << number(value)
                      << std::setw(10) << (known ? (value >= previous->get<double>() ? "+" : "") + number(value - previous->get<double>()) : "");
        } else {
            std::cout << std::setw(9) << number(value);
        }
        std::cout << (note.empty() ? "" : "   " + note) << "\n";
    };
    auto field = [&](const json& j, const std::string& key) -> const json* { return j.is_object() && j.contains(key) ? &j[key] : nullptr; };
    row("reward (weighted sum)", r.reward, field(before, "reward"));
    for (const auto& use : q.rewards) {
        const json* per = field(before, "rewards");
        row("rewards/" + use.name, r.reward_mean.at(use.name), per ? field(*per, use.name) : nullptr);
    }
    if (r.accuracy >= 0) row("accuracy", r.accuracy, field(before, "accuracy"));
    if (r.format_rate >= 0) row("format rate", r.format_rate, field(before, "format_rate"));
    row("mean completion length", r.mean_length, field(before, "mean_length"), "tokens");
    row("truncated", r.truncated_ratio, field(before, "truncated_ratio"), "(no EOS within the limit)");
    return 0;
}

}  // namespace grove::cli

namespace grove::cli {

int sft(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("manifest", po::value<std::string>()->required(), "model, data (with a completion column), train, output")(
        "set", po::value<std::vector<std::string>>()->composing(), "override a key: --set section.key=value (repeatable)");
    po::positional_options_description positional;
    positional.add("manifest", 1);
    auto vm = parse("sft", args, options, positional, "MANIFEST [--set section.key=value ...]");
    std::vector<std::string> overrides;
    if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
    auto manifest = Manifest::load(vm["manifest"].as<std::string>(), overrides, world_size_from_environment());
    auto result = run_sft(manifest, &std::cerr);
    std::cerr << "grove: sft done: loss " << result.losses.front() << " -> " << result.losses.back() << "; model in "
              << result.output << "\n";
    return 0;
}

int init_model(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("output", po::value<std::string>()->required(), "folder to write")(
        "tokenizer", po::value<std::string>()->required(), "folder with the tokenizer (its vocabulary sizes the model)")(
        "hidden", po::value<int64_t>()->default_value(128), "hidden size")(
        "layers", po::value<int64_t>()->default_value(4), "decoder layers")(
        "heads", po::value<int64_t>()->default_value(4), "attention heads")(
        "kv-heads", po::value<int64_t>()->default_value(2), "key/value heads")(
        "intermediate", po::value<int64_t>()->default_value(384), "MLP width")(
        "max-positions", po::value<int64_t>()->default_value(512), "longest sequence")(
        "seed", po::value<uint64_t>()->default_value(0), "initialisation seed");
    po::positional_options_description positional;
    positional.add("output", 1);
    auto vm = parse("init-model", args, options, positional, "OUT_DIR --tokenizer DIR [--hidden N --layers N ...]");
    std::string out = vm["output"].as<std::string>(), tokenizer_dir = vm["tokenizer"].as<std::string>();
    auto tokenizer = Tokenizer::load(tokenizer_dir);
    std::filesystem::create_directories(out);
    json config = {{"architectures", {"LlamaForCausalLM"}},
                   {"model_type", "llama"},
                   {"vocab_size", tokenizer->vocab_size()},
                   {"hidden_size", vm["hidden"].as<int64_t>()},
                   {"intermediate_size", vm["intermediate"].as<int64_t>()},
                   {"num_hidden_layers", vm["layers"].as<int64_t>()},
                   {"num_attention_heads", vm["heads"].as<int64_t>()},
                   {"num_key_value_heads", vm["kv-heads"].as<int64_t>()},
                   {"max_position_embeddings", vm["max-positions"].as<int64_t>()},
                   {"rms_norm_eps", 1e-5},
                   {"rope_theta", 10000.0},
                   {"tie_word_embeddings", true},
                   {"hidden_act", "silu"},
                   {"torch_dtype", "float32"}};
    const auto& c = tokenizer->config();
    if (c.bos_id) config["bos_token_id"] = *c.bos_id;
    if (c.eos_id) config["eos_token_id"] = *c.eos_id;
    if (c.pad_id) config["pad_token_id"] = *c.pad_id;
    std::ofstream(std::filesystem::path(out) / "config.json") << config.dump(2) << "\n";
    auto model = Model::initialize(out, vm["seed"].as<uint64_t>());
    model->save(out);
    copy_tokenizer_files(tokenizer_dir, out);
    int64_t parameters = 0;
    for (const auto& [name, t] : model->named_parameters()) parameters += t.numel();
    std::cout << "wrote " << out << ": a " << parameters << "-parameter Llama initialised with seed " << vm["seed"].as<uint64_t>() << "\n";
    return 0;
}

}  // namespace grove::cli
