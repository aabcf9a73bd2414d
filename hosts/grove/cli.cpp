// Option parsing shared by the grove subcommands.
#include "cli.hpp"

#include <cstdlib>
#include <iostream>

#include "grove/error.hpp"
#include "grove/hub_cache.hpp"

namespace grove::cli {

using grove::Error;
using grove::ErrorKind;

int integer_from_environment(const char* name, int fallback, int minimum) {
    const char* env = std::getenv(name);
    if (!env || !*env) return fallback;
    char* end = nullptr;
    long value = std::strtol(env, &end, 10);
    if (*end || value < minimum)
        throw Error(ErrorKind::usage, std::string(name) + "='" + env + "' is not an integer >= " + std::to_string(minimum));
    return int(value);
}

int world_size_from_environment() { return integer_from_environment("WORLD_SIZE", 1, 1); }

void add_revision_option(po::options_description& options, const std::string& model_option) {
    options.add_options()("revision", po::value<std::string>()->default_value("main"),
                          ("with a Hub id as " + model_option + ": the branch, tag or commit of the cached model").c_str());
}

std::string model_folder_at(const std::string& given, const std::string& revision) {
    if (const std::string why = revision_refusal(given, given, revision); !why.empty())
        throw Error(ErrorKind::usage, "--revision " + revision + ": " + why);
    return local_or_cached_model_folder(given, given, revision);
}

std::string model_option_folder(const po::variables_map& vm) {
    return model_folder_at(vm["model"].as<std::string>(), vm["revision"].as<std::string>());
}

po::variables_map parse(const std::string& command, const std::vector<std::string>& args, po::options_description& options,
                        const po::positional_options_description& positional, const std::string& synopsis) {
    options.add_options()("help,h", "show this help");
    po::variables_map vm;
    try {
        po::store(po::command_line_parser(args).options(options).positional(positional).run(), vm);
        if (vm.count("help")) {
            std::cout << "usage: grove " << command << " " << synopsis << "\n\n" << options;
            std::exit(0);
        }
        po::notify(vm);
    } catch (const po::error& e) {
        throw Error(ErrorKind::usage, "grove " + command + ": " + e.what() + "\nusage: grove " + command + " " + synopsis);
    }
    return vm;
}

}  // namespace grove::cli
