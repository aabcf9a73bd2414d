// grove eval: held-out evaluation with reward plugins, --save and --compare.
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "cli.hpp"
#include "grove/error.hpp"
#include "grove/evaluation.hpp"
#include "grove/hub_cache.hpp"
#include "grove/manifest.hpp"

namespace grove::cli {

using nlohmann::json;

int eval(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("manifest", po::value<std::string>(), "take model, data, rewards and generation from a manifest")(
        "set", po::value<std::vector<std::string>>()->composing(), "override a manifest key (repeatable)")(
        "model", po::value<std::string>(), "Hugging Face model folder, or a cached Hub id (without a manifest)")(
        "data", po::value<std::string>(), "prompts: JSONL file or builtin:NAME (without a manifest)")(
        "reward", po::value<std::vector<std::string>>()->composing(), "PLUGIN[:weight] (repeatable; without a manifest)")(
        "greedy", "argmax decoding (default: sample at the manifest's temperature)")(
        "samples", po::value<int64_t>()->default_value(1),
        "completions per prompt (default: the manifest's train.num_generations_eval, else 1)")(
        "max-new-tokens", po::value<int64_t>(), "longest completion")(
        "temperature", po::value<double>(), "sampling temperature")("limit", po::value<int64_t>()->default_value(0),
                                                                    "evaluate the first N prompts only")(
        "seed", po::value<uint64_t>(), "sampling seed")("json", "print JSON with every row")("save", po::value<std::string>(),
                                                                                             "also write that JSON to a file")(
        "compare", po::value<std::string>(), "a file from an earlier --save: print before, after and change")(
        "no-environment", "single-turn completions even when the manifest names an [environment] (the model without its tool)");
    add_revision_option(options);
    po::positional_options_description positional;
    positional.add("manifest", 1);
    auto vm =
        parse("eval", args, options, positional,
              "(MANIFEST | --model DIR --data FILE|builtin:NAME --reward PLUGIN[:weight] ...) [--greedy|--samples K] [--json] "
              "[--save F.json] [--compare F.json]");
    EvaluationRequest q;
    std::optional<int64_t> manifest_samples;  // train.num_generations_eval, when the manifest sets it
    if (vm.count("manifest")) {
        if (!vm["revision"].defaulted())
            throw Error(ErrorKind::usage,
                        "grove eval: with a MANIFEST, its model.revision names the revision "
                        "(--set 'model.revision=\"" +
                            vm["revision"].as<std::string>() + "\"'), not --revision");
        std::vector<std::string> overrides;
        if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
        const Manifest manifest = Manifest::load(vm["manifest"].as<std::string>(), overrides, world_size_from_environment());
        q = evaluation_request(manifest);
        manifest_samples = manifest.optional_integer("train.num_generations_eval");
    } else {
        if (!vm.count("model") || !vm.count("data") || !vm.count("reward"))
            throw Error(ErrorKind::usage, "grove eval: give a MANIFEST, or --model, --data and at least one --reward");
        q.model_dir = model_option_folder(vm);
        q.data_source = vm["data"].as<std::string>();
        q.sampling.max_new_tokens = 256;
        for (const auto& spec : vm["reward"].as<std::vector<std::string>>()) {
            PluginUse use;
            use.plugin = spec;
            auto colon = spec.rfind(':');
            if (colon != std::string::npos) {
                char* end = nullptr;
                double weight = std::strtod(spec.c_str() + colon + 1, &end);
                if (*end)
                    throw Error(ErrorKind::usage, "grove eval: --reward " + spec + ": the weight after ':' must be a number");
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
    // without --samples, a sampled evaluation takes the manifest's num_generations_eval, as training's does
    q.samples =
        vm["samples"].defaulted() && manifest_samples && !q.sampling.greedy ? *manifest_samples : vm["samples"].as<int64_t>();
    q.limit = vm["limit"].as<int64_t>();
    if (vm.count("no-environment")) q.environment.reset();
    if (q.samples < 1) throw Error(ErrorKind::usage, "grove eval: --samples must be >= 1");
    if (q.sampling.greedy && q.samples > 1)
        throw Error(ErrorKind::usage, "grove eval: --greedy gives one completion per prompt; drop --samples");
    EvaluationResult r = evaluate(q);
    size_t prompts = r.rows.size() / size_t(q.samples);
    json rows = json::array();
    for (const auto& row : r.rows) {
        rows.push_back({{"prompt", row.prompt},
                        {"completion", row.completion},
                        {"length", row.length},
                        {"truncated", row.truncated},
                        {"rewards", row.rewards}});
        if (!q.environment) continue;
        json turns = json::array();
        for (const EpisodeTurn& turn : row.turns)
            turns.push_back({{"role", turn.from_model ? "model" : "environment"}, {"text", turn.text}});
        rows.back()["turns"] = turns;
        rows.back()["tool_calls"] = row.tool_calls;
        rows.back()["tool_failures"] = row.tool_failures;
    }
    json out = {{"model", q.model_dir},
                {"data", q.data_source},
                {"prompts", prompts},
                {"samples", q.samples},
                {"greedy", q.sampling.greedy},
                {"reward", r.reward},
                {"rewards", r.reward_mean},
                {"mean_length", r.mean_length},
                {"truncated_ratio", r.truncated_ratio},
                {"accuracy", r.accuracy >= 0 ? json(r.accuracy) : json(nullptr)},
                {"format_rate", r.format_rate >= 0 ? json(r.format_rate) : json(nullptr)},
                {"environment", q.environment ? json(q.environment->plugin) : json(nullptr)},
                {"tool_call_frequency", r.tool_call_frequency >= 0 ? json(r.tool_call_frequency) : json(nullptr)},
                {"rows", rows}};
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
        if (!in)
            throw Error(ErrorKind::input, compared + ": cannot read the evaluation to compare with (write one with --save)");
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
              << " from " << q.data_source
              << (q.environment ? ", episodes with environment " + q.environment->plugin : std::string()) << "\n";
    auto number = [](double v) {
        std::ostringstream s;
        s << std::fixed << std::setprecision(4) << v;
        return s.str();
    };
    if (!compared.empty())
        std::cout << "  " << std::left << std::setw(26) << "" << std::right << std::setw(9) << "before" << std::setw(10)
                  << "after" << std::setw(10) << "change" << "   (before: " << compared << ")\n";
    auto row = [&](const std::string& name, double value, const json* previous, const std::string& note = "") {
        std::cout << "  " << std::left << std::setw(26) << name << std::right;
        if (!compared.empty()) {
            bool known = previous && previous->is_number();
            std::cout << std::setw(9) << (known ? number(previous->get<double>()) : "-") << std::setw(10) << number(value)
                      << std::setw(10)
                      << (known ? (value >= previous->get<double>() ? "+" : "") + number(value - previous->get<double>()) : "");
        } else {
            std::cout << std::setw(9) << number(value);
        }
        std::cout << (note.empty() ? "" : "   " + note) << "\n";
    };
    auto field = [&](const json& j, const std::string& key) -> const json* {
        return j.is_object() && j.contains(key) ? &j[key] : nullptr;
    };
    row("reward (weighted sum)", r.reward, field(before, "reward"));
    for (const std::string& name : r.reward_names) {
        const json* per = field(before, "rewards");
        row("rewards/" + name, r.reward_mean.at(name), per ? field(*per, name) : nullptr);
    }
    if (r.accuracy >= 0) row("accuracy", r.accuracy, field(before, "accuracy"));
    if (r.format_rate >= 0) row("format rate", r.format_rate, field(before, "format_rate"));
    if (r.tool_call_frequency >= 0) row("tool calls per episode", r.tool_call_frequency, field(before, "tool_call_frequency"));
    row("mean completion length", r.mean_length, field(before, "mean_length"), q.environment ? "model tokens" : "tokens");
    row("truncated", r.truncated_ratio, field(before, "truncated_ratio"), "(no EOS within the limit)");
    return 0;
}

}  // namespace grove::cli
