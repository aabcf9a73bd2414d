// grove export --merge, grove init-model: model folders made from others.
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "cli.hpp"
#include "grove/adapter_checkpoint.hpp"
#include "grove/error.hpp"
#include "grove/hub_cache.hpp"
#include "grove/model.hpp"
#include "grove/tokenizer.hpp"

namespace grove::cli {

using nlohmann::json;

int export_model(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("merge", po::value<std::string>()->required(), "the LoRA adapter folder (a checkpoint)")(
        "base", po::value<std::string>(),
        "the base model folder (or a cached Hub id); default: the one the adapter's adapter_config.json names")(
        "output", po::value<std::string>()->required(), "where to write the merged Hugging Face folder");
    add_revision_option(options, "--base");
    po::positional_options_description positional;
    positional.add("output", 1);
    auto vm = parse("export", args, options, positional, "--merge ADAPTER_DIR [--base MODEL_DIR] OUT_DIR");
    const std::string adapter = vm["merge"].as<std::string>();
    std::string base_folder;
    if (!vm.count("base")) {
        if (!vm["revision"].defaulted())
            throw Error(ErrorKind::usage,
                        "grove export: --revision goes with --base (without it, the adapter's "
                        "adapter_config.json names the base and its revision)");
        base_folder = adapter_base_folder(adapter);
    } else {
        const std::string base = vm["base"].as<std::string>();
        std::string revision = vm["revision"].as<std::string>();
        // the adapter's own base: at the commit it was trained on (PEFT records it), not main, which may have moved
        const auto recorded = recorded_adapter_base(adapter);
        if (vm["revision"].defaulted() && recorded && recorded->name_or_path == base && !std::filesystem::exists(base))
            revision = recorded->revision;
        base_folder = model_folder_at(base, revision);
    }
    export_merged(adapter, base_folder, vm["output"].as<std::string>());
    std::cout << "wrote " << vm["output"].as<std::string>() << "\n";
    return 0;
}

}  // namespace grove::cli

namespace grove::cli {

int init_model(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("output", po::value<std::string>()->required(), "folder to write")(
        "tokenizer", po::value<std::string>()->required(),
        "folder with the tokenizer, or a cached Hub id (its vocabulary sizes the model)")(
        "hidden", po::value<int64_t>()->default_value(128), "hidden size")("layers", po::value<int64_t>()->default_value(4),
                                                                           "decoder layers")(
        "heads", po::value<int64_t>()->default_value(4), "attention heads")("kv-heads", po::value<int64_t>()->default_value(2),
                                                                            "key/value heads")(
        "intermediate", po::value<int64_t>()->default_value(384), "MLP width")(
        "max-positions", po::value<int64_t>()->default_value(512), "longest sequence")(
        "seed", po::value<uint64_t>()->default_value(0), "initialisation seed");
    po::positional_options_description positional;
    positional.add("output", 1);
    auto vm = parse("init-model", args, options, positional, "OUT_DIR --tokenizer DIR [--hidden N --layers N ...]");
    const std::string out = vm["output"].as<std::string>(), tokenizer_given = vm["tokenizer"].as<std::string>();
    const std::string tokenizer_dir = grove::local_or_cached_model_folder(tokenizer_given, tokenizer_given);
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
    std::cout << "wrote " << out << ": a " << parameters << "-parameter Llama initialised with seed "
              << vm["seed"].as<uint64_t>() << "\n";
    return 0;
}

}  // namespace grove::cli
