// grove — the command-line host.
//
//   grove --version | --help
//   grove plugins list [--json]          every plugin on the search path
//   grove plugins info NAME|PATH         its config keys and metrics
//   grove plugins score NAME|PATH ...    one reward plugin's scores for fixed completions
//   grove check MANIFEST [--set k=v ...] validate, load and create every plugin, print the resolved TOML
//   grove manifest-reference             the manifest reference (docs/manifest.md) from the schema
//   grove generate / logprobs            sampling and log-probabilities (commands_model.cpp)
//
// Exit codes: 0 success, 1 run failure, 2 bad command line, 3 invalid manifest, 4 plugin failure,
// 5 invalid model, tokenizer or data file.
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "grove/error.hpp"
#include "grove/manifest.hpp"
#include "grove/plugin_host.hpp"
#include "grove/version.hpp"
#include "cli.hpp"

using grove::Error;
using grove::ErrorKind;

namespace {

const char* kUsage =
    "usage: grove [--version] [--help] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  plugins list [--json]           list every plugin on the search path\n"
    "  plugins info NAME|PATH          show a plugin's configuration keys and metrics\n"
    "  plugins score NAME|PATH ...     score fixed completions (JSONL) with one reward plugin\n"
    "  check MANIFEST [--set k=v ...]  validate a manifest, create every plugin, print the resolved configuration\n"
    "  manifest-reference              print the manifest reference (Markdown) generated from the schema\n"
    "  generate --model DIR ...        sample completions from a Hugging Face model folder\n"
    "  logprobs --model DIR --input F  per-token log-probabilities of completions (JSONL in, JSONL out)\n"
    "  convert gguf FILE.gguf OUT_DIR  import a llama-family GGUF as a Hugging Face folder\n"
    "  train MANIFEST [--resume] ...   GRPO training (metrics.jsonl, checkpoints in output.dir)\n"
    "  export --merge A --base M OUT   merge a LoRA checkpoint into its base model\n"
    "  eval MANIFEST | --model ...     mean reward per function, accuracy, format rate, lengths\n"
    "  tokenizer train --input ...     train a sentencepiece tokenizer (tokenizer.model)\n"
    "  init-model OUT --tokenizer DIR  a freshly initialised Llama sized by flags\n"
    "  sft MANIFEST                    supervised warm-start on reference completions\n"
    "  plot RUN_DIR                    a PNG of a run's metrics (reward per function, accuracy, kl, ...) via gnuplot\n"
    "\n"
    "Run `grove COMMAND --help` for a command's options.\n"
    "Plugins are searched in the manifest's plugin_dirs, then $GROVE_PLUGIN_PATH, then <prefix>/lib/grove/plugins.\n"
    "Exit codes: 0 success, 1 run failure, 2 bad command line, 3 invalid manifest, 4 plugin failure,\n"
    "5 invalid model, tokenizer or data file; 130/143 train stopped by SIGINT/SIGTERM (checkpoint written).\n";

int run(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty()) {
        std::cerr << kUsage;
        return int(ErrorKind::usage);
    }
    const std::string& first = args[0];
    if (first == "--help" || first == "-h" || first == "help") {
        std::cout << kUsage;
        return 0;
    }
    if (first == "--version" || first == "-V") {
        std::cout << "grove " << grove::kGroveVersion << " (plugin ABI " << GROVE_ABI_MAJOR << "." << GROVE_ABI_MINOR << ")\n";
        return 0;
    }
    std::vector<std::string> rest(args.begin() + 1, args.end());
    if (first == "check") return grove::cli::check(rest);
    if (first == "generate") return grove::cli::generate(rest);
    if (first == "logprobs") return grove::cli::logprobs(rest);
    if (first == "convert") return grove::cli::convert(rest);
    if (first == "train") return grove::cli::train(rest);
    if (first == "export") return grove::cli::export_model(rest);
    if (first == "eval") return grove::cli::eval(rest);
    if (first == "tokenizer") return grove::cli::tokenizer(rest);
    if (first == "sft") return grove::cli::sft(rest);
    if (first == "init-model") return grove::cli::init_model(rest);
    if (first == "plot") return grove::cli::plot(rest);
    if (first == "manifest-reference") {
        std::cout << grove::manifest_reference_markdown();
        return 0;
    }
    if (first == "plugins") {
        if (rest.empty() || rest[0] == "--help" || rest[0] == "-h") {
            std::cout << "usage: grove plugins list [--json]\n       grove plugins info NAME|PATH\n"
                         "       grove plugins score NAME|PATH --input ROWS.jsonl [--config TOML] [--num-generations G]\n";
            return rest.empty() ? int(ErrorKind::usage) : 0;
        }
        std::vector<std::string> sub(rest.begin() + 1, rest.end());
        if (rest[0] == "list") return grove::cli::plugins_list(sub);
        if (rest[0] == "info") return grove::cli::plugins_info(sub);
        if (rest[0] == "score") return grove::cli::plugins_score(sub);
        throw Error(ErrorKind::usage, "unknown command 'grove plugins " + rest[0] + "'; use list, info or score");
    }
    throw Error(ErrorKind::usage, "unknown command '" + first + "'\n" + kUsage);
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const Error& e) {
        std::cerr << "grove: " << e.what() << "\n";
        return e.exit_code();
    } catch (const std::exception& e) {
        std::cerr << "grove: internal error: " << e.what() << "\n";
        return int(ErrorKind::runtime);
    }
}
