// Option parsing shared by the grove subcommands.
#include "cli.hpp"

#include <cstdlib>
#include <iostream>

#include "grove/error.hpp"

namespace grove::cli {

using grove::Error;
using grove::ErrorKind;

int world_size_from_environment() {
    const char* env = std::getenv("WORLD_SIZE");
    if (!env || !*env) return 1;
    char* end = nullptr;
    long value = std::strtol(env, &end, 10);
    if (*end || value < 1) throw Error(ErrorKind::usage, "WORLD_SIZE='" + std::string(env) + "' is not a positive integer");
    return int(value);
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
