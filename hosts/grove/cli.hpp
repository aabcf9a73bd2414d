// Shared by the grove subcommands: option parsing with uniform --help and usage errors.
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <vector>

namespace grove::cli {

namespace po = boost::program_options;

// Parses a subcommand's options; --help prints them and exits 0; mistakes are usage errors (exit 2).
po::variables_map parse(const std::string& command, const std::vector<std::string>& args, po::options_description& options,
                        const po::positional_options_description& positional, const std::string& synopsis);

// --revision, for the commands that take a model (--model; export's --base): with a Hub id, the
// branch, tag or commit.
void add_revision_option(po::options_description& options, const std::string& model_option = "--model");
// A model given on the command line: the folder itself, or the cached snapshot of a Hub id at the
// revision. A revision that cannot apply (a folder; one the cache lacks) is a usage error that says why.
std::string model_folder_at(const std::string& given, const std::string& revision);
// That of --model at --revision.
std::string model_option_folder(const po::variables_map& vm);

// An integer environment variable (torchrun's RANK, WORLD_SIZE, MASTER_PORT...): fallback when unset,
// a usage error naming it when it is not an integer >= minimum.
int integer_from_environment(const char* name, int fallback, int minimum);
int world_size_from_environment();

// Runs `grove COMMAND...` as nproc local ranks (torchrun-style environment); the worst exit code.
int launch_local_processes(int nproc, const std::vector<std::string>& command);

// commands: each in the file named after it (generate_logprobs.cpp, train_sft.cpp, ...)
int plugins_list(const std::vector<std::string>& args);
int plugins_info(const std::vector<std::string>& args);
int plugins_score(const std::vector<std::string>& args);
int check(const std::vector<std::string>& args);
int generate(const std::vector<std::string>& args);
int logprobs(const std::vector<std::string>& args);
int convert(const std::vector<std::string>& args);
int train(const std::vector<std::string>& args);
int export_model(const std::vector<std::string>& args);
int eval(const std::vector<std::string>& args);
int tokenizer(const std::vector<std::string>& args);
int sft(const std::vector<std::string>& args);
int init_model(const std::vector<std::string>& args);
int plot(const std::vector<std::string>& args);

}  // namespace grove::cli
