// Helpers for tests that exercise one plugin through the real plugin host (the same loading,
// config checking and error reporting `grove` uses; plugins are found in the build's plugin
// folder), run the built `grove`, or check an error's text.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace grove::test {

// One completion to score. row_json: the dataset row's other columns, a JSON object.
struct RewardRow {
    std::string prompt;
    std::string completion;
    std::vector<int32_t> tokens;  // completion token ids; empty means "one token per byte"
    bool truncated = false;
    std::string row_json = "{}";
};

struct RewardResult {
    std::vector<float> scores;                // one per row (NaN = not applicable)
    std::vector<std::string> metric_names;    // as declared by the plugin
    std::vector<std::vector<float>> metrics;  // metrics[m][row]
};

// Creates an instance of `plugin` from `config_toml` (the body of its `config` table, e.g.
// "preset = \"think_answer\"") and scores all rows as one group-major batch.
// Throws grove::Error (what() = the message `grove` would print) when loading, config checking,
// create or score fails.
RewardResult score_rewards(const std::string& plugin, const std::string& config_toml, const std::vector<RewardRow>& rows,
                           uint32_t num_generations = 1);

// Path of the build's plugin folder (lib/grove/plugins).
std::string build_plugin_dir();

// Runs a shell command; returns its exit code and stdout + stderr together.
struct CommandResult {
    int exit_code;
    std::string out;
};
CommandResult run_command(const std::string& command);

// Runs the built `grove` with `args`, from the source tree's root.
CommandResult run_grove(const std::string& args);

// The message of the grove::Error that `f` throws, or "(no error)".
std::string error_message(const std::function<void()>& f);

// The steps of the checkpoint folders (checkpoint-N) a run's output folder holds.
std::set<int64_t> checkpoint_steps_in(const std::string& output);

}  // namespace grove::test

// Expects `part` in the string `text`, and prints the text when it is not there.
#define EXPECT_CONTAINS(text, part) EXPECT_NE((text).find(part), std::string::npos) << "in: " << (text)
