// grove convert gguf FILE.gguf OUT_DIR
#include <iostream>

#include "cli.hpp"
#include "grove/error.hpp"
#include "grove/gguf.hpp"

namespace grove::cli {

int convert(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("format", po::value<std::string>()->required(), "source format: gguf")(
        "input", po::value<std::string>()->required(), "the file to convert")(
        "output", po::value<std::string>()->required(), "the Hugging Face folder to write");
    po::positional_options_description positional;
    positional.add("format", 1).add("input", 1).add("output", 1);
    auto vm = parse("convert", args, options, positional, "gguf FILE.gguf OUT_DIR");
    if (vm["format"].as<std::string>() != "gguf")
        throw Error(ErrorKind::usage, "grove convert: unknown format '" + vm["format"].as<std::string>() + "' (supported: gguf)");
    convert_gguf_to_hf(vm["input"].as<std::string>(), vm["output"].as<std::string>());
    std::cout << "wrote " << vm["output"].as<std::string>() << " (config.json, model.safetensors, tokenizer.json)\n";
    return 0;
}

}  // namespace grove::cli
