// grove convert gguf FILE.gguf OUT_DIR
#include <fstream>
#include <iostream>

#include "cli.hpp"
#include "grove/error.hpp"
#include "grove/gguf.hpp"

namespace grove::cli {

int convert(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("format", po::value<std::string>()->required(), "source format: gguf")(
        "input", po::value<std::string>()->required(), "the file to convert")("output", po::value<std::string>()->required(),
                                                                              "the Hugging Face folder to write");
    po::positional_options_description positional;
    positional.add("format", 1).add("input", 1).add("output", 1);
    auto vm = parse("convert", args, options, positional, "gguf FILE.gguf OUT_DIR");
    if (vm["format"].as<std::string>() != "gguf")
        throw Error(ErrorKind::usage,
                    "grove convert: unknown format '" + vm["format"].as<std::string>() + "' (supported: gguf)");
    convert_gguf_to_hf(vm["input"].as<std::string>(), vm["output"].as<std::string>());
    std::cout << "wrote " << vm["output"].as<std::string>() << " (config.json, model.safetensors, tokenizer.json)\n";
    return 0;
}

}  // namespace grove::cli

#include "grove/dataset.hpp"
#include "grove/tokenizer.hpp"

namespace grove::cli {

int tokenizer(const std::vector<std::string>& args) {
    if (args.empty() || args[0] != "train")
        throw Error(ErrorKind::usage, "usage: grove tokenizer train --input FILE.txt|builtin:NAME --out DIR [--vocab-size N]");
    po::options_description options("options");
    options.add_options()("input", po::value<std::string>()->required(),
                          "a text file (one example per line), or builtin:NAME (its prompts and reference answers)")(
        "out", po::value<std::string>()->required(), "folder for tokenizer.model and tokenizer_config.json")(
        "vocab-size", po::value<int>()->default_value(512), "vocabulary size")(
        "model-type", po::value<std::string>()->default_value("bpe"), "bpe or unigram")(
        "symbol", po::value<std::vector<std::string>>()->composing(), "a piece kept whole, e.g. <answer> (repeatable)")(
        "no-split-digits", "let pieces join digits (by default each digit is its own piece, as in Llama)");
    auto vm = parse("tokenizer train", std::vector<std::string>(args.begin() + 1, args.end()), options, {},
                    "--input FILE.txt|builtin:NAME --out DIR [--vocab-size N] [--symbol S ...]");
    std::string input = vm["input"].as<std::string>();
    std::vector<std::string> corpus;
    if (input.rfind("builtin:", 0) == 0) {
        for (const auto& row : load_prompts(input)) {
            std::string text = row.text;
            for (const auto& m : row.messages) text += " " + m.content;
            corpus.push_back(text + " " + row.columns_json);
        }
    } else {
        std::ifstream in(input);
        if (!in) throw Error(ErrorKind::input, input + ": cannot read the corpus");
        for (std::string line; std::getline(in, line);) corpus.push_back(line);
    }
    TokenizerTrainOptions o;
    o.vocab_size = vm["vocab-size"].as<int>();
    o.model_type = vm["model-type"].as<std::string>();
    o.split_digits = !vm.count("no-split-digits");
    if (vm.count("symbol")) o.symbols = vm["symbol"].as<std::vector<std::string>>();
    train_sentencepiece(corpus, vm["out"].as<std::string>(), o);
    std::cout << "wrote " << vm["out"].as<std::string>() << "/tokenizer.model (" << o.vocab_size << " pieces)\n";
    return 0;
}

}  // namespace grove::cli
