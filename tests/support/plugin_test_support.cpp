#include "plugin_test_support.hpp"
#include "test_paths.hpp"

#include <sys/wait.h>

#include <array>
#include <filesystem>
#include <cstdio>

#include "grove/error.hpp"
#include "grove/plugin_host.hpp"

namespace grove::test {

std::string build_plugin_dir() { return GROVE_TEST_PLUGIN_DIR; }

CommandResult run_command(const std::string& command) {
    CommandResult r{-1, ""};
    FILE* pipe = popen((command + " 2>&1").c_str(), "r");
    if (!pipe) return r;
    std::array<char, 4096> buffer;
    size_t n;
    while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.out.append(buffer.data(), n);
    int status = pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

CommandResult run_grove(const std::string& args) {
    return run_command(std::string("cd ") + GROVE_TEST_SOURCE_DIR + " && " + GROVE_EXECUTABLE + " " + args);
}

RewardResult score_rewards(const std::string& plugin, const std::string& config_toml, const std::vector<RewardRow>& rows,
                           uint32_t num_generations) {
    PluginHost host({build_plugin_dir()});
    PluginInfo info = host.find(plugin, GROVE_PLUGIN_KIND_REWARD);
    PluginConfig config = PluginConfig::from_toml_text(info, config_toml, "test config");
    PluginInstance instance(info, std::move(config));

    RewardRows batch;
    batch.num_generations = num_generations;
    batch.seed = 1234;
    for (const auto& row : rows) {
        std::vector<int32_t> tokens = row.tokens;
        if (tokens.empty())
            for (unsigned char c : row.completion) tokens.push_back(c);
        batch.add(row.prompt, row.completion, tokens, row.truncated, row.row_json);
    }

    RewardResult result;
    std::vector<float> metrics;
    instance.score(batch.view(), result.scores, metrics);
    result.metric_names = instance.info().metric_names;
    for (size_t m = 0; m < result.metric_names.size(); ++m)
        result.metrics.emplace_back(metrics.begin() + m * rows.size(), metrics.begin() + (m + 1) * rows.size());
    return result;
}

std::string error_message(const std::function<void()>& f) {
    try {
        f();
    } catch (const grove::Error& e) {
        return e.what();
    }
    return "(no error)";
}

std::set<int64_t> checkpoint_steps_in(const std::string& output) {
    std::set<int64_t> steps;
    for (const auto& entry : std::filesystem::directory_iterator(output))
        if (const std::string folder = entry.path().filename().string(); folder.rfind("checkpoint-", 0) == 0)
            steps.insert(std::stoll(folder.substr(11)));
    return steps;
}

}  // namespace grove::test
