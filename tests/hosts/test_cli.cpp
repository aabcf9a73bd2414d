// The `grove` program as a user runs it: output, messages and exit codes.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "plugin_test_support.hpp"

namespace {

using grove::test::run_grove;

std::string write(const std::string& name, const std::string& text) {
    std::string path = std::string(GROVE_TEST_BINARY_DIR) + "/" + name;
    std::ofstream(path) << text;
    return path;
}

const std::string kManifest = R"([model]
path = "model"
[data]
source = "builtin:arithmetic"
[[rewards]]
plugin = "format"
[reduction]
plugin = "grpo"
)";

}  // namespace

TEST(Cli, VersionAndHelp) {
    auto r = run_grove("--version");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_CONTAINS(r.out, "(plugin ABI 1.13)");
    r = run_grove("--help");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_CONTAINS(r.out, "check MANIFEST");
    r = run_grove("check --help");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_CONTAINS(r.out, "--set");
}

TEST(Cli, UsageErrorsExitWithTwo) {
    EXPECT_EQ(run_grove("").exit_code, 2);
    auto r = run_grove("frobnicate");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_CONTAINS(r.out, "unknown command 'frobnicate'");
    r = run_grove("check");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_CONTAINS(r.out, "usage: grove check MANIFEST");
}

TEST(Cli, PluginsListJsonHasEveryReferencePlugin) {
    auto r = run_grove("plugins list --json 2>/dev/null");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    auto list = nlohmann::json::parse(r.out);
    std::map<std::string, std::string> kinds;
    for (const auto& p : list) kinds[p["name"]] = p["kind"];
    EXPECT_EQ(kinds["grpo"], "reduction");
    EXPECT_EQ(kinds["bnpo"], "reduction");
    EXPECT_EQ(kinds["dr_grpo"], "reduction");
    EXPECT_EQ(kinds["dapo"], "reduction");
    EXPECT_EQ(kinds["full"], "adapter");
    EXPECT_EQ(kinds["lora"], "adapter");
    EXPECT_EQ(kinds["format"], "reward");
    EXPECT_EQ(kinds["correctness"], "reward");
    EXPECT_EQ(kinds["length_penalty"], "reward");
}

TEST(Cli, PluginsInfoShowsKeysAndDefaults) {
    auto r = run_grove("plugins info lora");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_CONTAINS(r.out, "target_modules");
    EXPECT_CONTAINS(r.out, "default 8");
    r = run_grove("plugins info loar");
    EXPECT_EQ(r.exit_code, 4);
    EXPECT_CONTAINS(r.out, "did you mean 'lora'?");
}

TEST(Cli, CheckPrintsResolvedConfigurationThatChecksAgain) {
    auto r = run_grove("check " + write("ok.toml", kManifest) + " --set generation.num_generations=4 2>/dev/null");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_CONTAINS(r.out, "num_generations = 4");
    EXPECT_CONTAINS(r.out, "# learning_rate = (unset)");  // grove train's 1e-6, grove sft's 2e-5
    EXPECT_CONTAINS(r.out, "max_grad_norm = 1.0");
    EXPECT_CONTAINS(r.out, "reduction  grpo 1.0.0");
    auto again = run_grove("check " + write("resolved.toml", r.out));
    EXPECT_EQ(again.exit_code, 0) << again.out;
}

// A manifest without a reward is grove sft's: grove check says so, grove train refuses it.
TEST(Cli, CheckNamesAManifestWithoutRewardsAsGroveSfts) {
    const std::string manifest = write("sft_only.toml", "[model]\npath = \"model\"\n[data]\nsource = \"builtin:arithmetic\"\n");
    auto r = run_grove("check " + manifest + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_CONTAINS(r.out, "no reward: valid for grove sft only");
    // its model folder is not there (yet): valid, but said
    EXPECT_CONTAINS(r.out, "model.path = a Hub id the local cache holds");
    EXPECT_CONTAINS(r.out, "/model holds no config.json yet");
    r = run_grove("train " + manifest + " 2>&1");
    EXPECT_EQ(r.exit_code, 3) << r.out;
    EXPECT_CONTAINS(r.out, "sft_only.toml: error: no reward: add at least one [[rewards]] table");
}

TEST(Cli, CheckTheShippedExample) {
    auto r = run_grove("check examples/arithmetic/grove.toml");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_CONTAINS(r.out, "is valid");
}

TEST(Cli, ManifestErrorsExitWithThreeAndPointAtTheLine) {
    auto r = run_grove("check " + write("typo.toml", kManifest + "[loss]\nbeta = 0.0\nepsilon_hihg = 0.28\n"));
    EXPECT_EQ(r.exit_code, 3);
    EXPECT_CONTAINS(r.out, "typo.toml:11:1: error: unknown key 'epsilon_hihg' in [loss]; did you mean 'epsilon_high'?");
    EXPECT_EQ(r.out.find("terminate"), std::string::npos);  // no crash, no stack trace
    r = run_grove("check " + write("badcfg.toml", kManifest + "[adapter]\nplugin = \"lora\"\nconfig = { rank = 8 }\n"));
    EXPECT_EQ(r.exit_code, 3);
    EXPECT_CONTAINS(r.out, "unknown key 'rank' for plugin 'lora'");
    r = run_grove("check " + write("missing.toml", kManifest) + " --set data.source=");
    EXPECT_EQ(r.exit_code, 0) << r.out;  // an empty string is a string; the data issue decides existence
    r = run_grove("check /nonexistent/grove.toml");
    EXPECT_EQ(r.exit_code, 3);
    EXPECT_CONTAINS(r.out, "cannot read the manifest");
}

TEST(Cli, PluginErrorsExitWithFour) {
    auto r = run_grove("check " + write("noplugin.toml", kManifest) + " --set rewards.0.plugin=formt");
    EXPECT_EQ(r.exit_code, 4);
    EXPECT_CONTAINS(r.out, "no plugin named 'formt'; did you mean 'format'?");
    r = run_grove("check " + write("kind.toml", kManifest) + " --set reduction.plugin=lora");
    EXPECT_EQ(r.exit_code, 4);
    EXPECT_CONTAINS(r.out, "is of kind 'adapter', but a reduction plugin is needed here");
}

// `grove plugins score` passes an episode's env_mask (as `grove generate --environment --json` prints
// it) to the reward as model_token_mask: the test reward counts the model's tokens (score) and the
// environment's (metric); a mask of the wrong length is an input error naming the row.
TEST(Cli, PluginsScorePassesAnEpisodesEnvMask) {
    const std::string rows =
        write("episode_rows.jsonl",
              "{\"completion\": \"ab <r>5</r> c\", \"completion_ids\": [1, 2, 3, 4, 5], "
              "\"env_mask\": [1, 1, 0, 0, 1], \"turns\": [{\"role\": \"model\", \"text\": \"ab \"}, "
              "{\"role\": \"environment\", \"text\": \"<r>5</r>\"}, {\"role\": \"model\", \"text\": \" c\"}]}\n"
              "{\"completion\": \"x\", \"completion_ids\": [7]}\n");
    auto r = run_grove(std::string("plugins score ") + GROVE_TEST_MODEL_TOKENS_PLUGIN + " --input " + rows);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    // and its turns (as grove generate --json prints them) as episode_turns: 3 turns of 13 bytes
    EXPECT_CONTAINS(r.out,
                    "{\"metrics\":{\"environment_tokens\":2.0,\"turn_bytes\":13.0,\"turns\":3.0},\"row\":0,\"score\":3.0}");
    EXPECT_CONTAINS(r.out,
                    "{\"metrics\":{\"environment_tokens\":0.0,\"turn_bytes\":0.0,\"turns\":0.0},\"row\":1,\"score\":1.0}");
    const std::string bad =
        write("episode_bad.jsonl", "{\"completion\": \"ab\", \"completion_ids\": [1, 2], \"env_mask\": [1]}\n");
    r = run_grove(std::string("plugins score ") + GROVE_TEST_MODEL_TOKENS_PLUGIN + " --input " + bad);
    EXPECT_EQ(r.exit_code, 5);
    EXPECT_CONTAINS(r.out, "episode_bad.jsonl:1: \"env_mask\" needs \"completion_ids\" of the same length");
    const std::string twice = write("episode_twice.jsonl",
                                    "{\"completion\": \"ab\", \"turns\": [{\"role\": \"model\", "
                                    "\"text\": \"a\"}, {\"role\": \"model\", \"text\": \"b\"}]}\n");
    r = run_grove(std::string("plugins score ") + GROVE_TEST_MODEL_TOKENS_PLUGIN + " --input " + twice);
    EXPECT_EQ(r.exit_code, 5);
    EXPECT_CONTAINS(r.out, "episode_twice.jsonl:1: \"turns\" must be a list of {\"role\": \"model\" or \"environment\"");
}
