// `grove eval` on a tiny checkpoint: its summary agrees with its own rows, greedy decoding is
// deterministic, and accuracy / format rate come from the correctness / format rewards.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "plugin_test_support.hpp"

namespace {
const std::string kModel = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/llama_gqa";

nlohmann::json eval(const std::string& args) {
    auto r = grove::test::run_grove("eval --model " + kModel + " " + args + " --json 2>/dev/null");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return nlohmann::json::parse(r.out);
}
}  // namespace

TEST(Eval, SummaryIsTheMeanOfItsRowsAndGreedyIsDeterministic) {
    std::string args =
        "--data builtin:arithmetic-test --limit 12 --greedy --max-new-tokens 6 --reward format --reward correctness:2";
    auto a = eval(args), b = eval(args);
    EXPECT_EQ(a["rows"], b["rows"]);
    ASSERT_EQ(a["rows"].size(), 12u);
    EXPECT_EQ(a["prompts"], 12);
    double format = 0, correct = 0, weighted = 0, length = 0;
    for (const auto& row : a["rows"]) {
        format += row["rewards"]["format"].get<double>();
        correct += row["rewards"]["correctness"].get<double>();
        weighted += row["rewards"]["format"].get<double>() + 2 * row["rewards"]["correctness"].get<double>();
        length += row["length"].get<double>();
        EXPECT_LE(row["length"].get<int>(), 6);
    }
    EXPECT_NEAR(a["format_rate"].get<double>(), format / 12, 1e-9);
    EXPECT_NEAR(a["accuracy"].get<double>(), correct / 12, 1e-9);
    EXPECT_NEAR(a["reward"].get<double>(), weighted / 12, 1e-6);
    EXPECT_NEAR(a["mean_length"].get<double>(), length / 12, 1e-9);
}

TEST(Eval, SamplesPerPromptAndManifestMode) {
    auto sampled = eval("--data builtin:arithmetic-test --limit 5 --samples 3 --max-new-tokens 4 --reward format --seed 4");
    EXPECT_EQ(sampled["rows"].size(), 15u);
    EXPECT_TRUE(sampled["accuracy"].is_null());  // no correctness reward
    std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/models/eval_manifest";
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/grove.toml")
        << "[model]\npath = \"" << kModel << "\"\nchat_template = \"none\"\n"
        << "[data]\nsource = \"builtin:arithmetic\"\neval_source = \"builtin:arithmetic-test\"\n"
        << "[generation]\nmax_completion_length = 5\n"
        << "[[rewards]]\nplugin = \"length_penalty\"\nconfig = { mode = \"target\", target = 2 }\n";
    auto r = grove::test::run_grove("eval " + dir + "/grove.toml --greedy --limit 4 --json 2>/dev/null");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    auto j = nlohmann::json::parse(r.out);
    for (const auto& row : j["rows"])  // target mode: -|len - 2|
        EXPECT_DOUBLE_EQ(row["rewards"]["length_penalty"].get<double>(), -std::abs(row["length"].get<double>() - 2));
    // the manifest's train.num_generations_eval is the default of --samples (not for --greedy)
    auto rows_of = [&](const std::string& args) {
        auto run = grove::test::run_grove("eval " + dir + "/grove.toml --limit 3 --set train.num_generations_eval=2 " + args +
                                          " --json 2>/dev/null");
        EXPECT_EQ(run.exit_code, 0) << run.out;
        return nlohmann::json::parse(run.out)["rows"].size();
    };
    EXPECT_EQ(rows_of(""), 6u);
    EXPECT_EQ(rows_of("--samples 1"), 3u);
    EXPECT_EQ(rows_of("--greedy"), 3u);
    auto bad = grove::test::run_grove("eval --model " + kModel + " --data builtin:arithmetic-test");
    EXPECT_EQ(bad.exit_code, 2);
    EXPECT_NE(bad.out.find("give a MANIFEST, or --model, --data and at least one --reward"), std::string::npos) << bad.out;
}

// With the manifest's [environment], eval scores whole episodes (the environment's own score too,
// with reward_weight) and prints their turns; lengths count the model's tokens only.
// --no-environment evaluates the same model without its tool.
TEST(Eval, EpisodesWithTheManifestsEnvironmentAndWithout) {
    std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/models/eval_environment";
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/grove.toml") << "[model]\npath = \"" << kModel << "\"\nchat_template = \"none\"\n"
                                       << "[data]\nsource = \"builtin:arithmetic-test\"\n"
                                       << "[generation]\nmax_completion_length = 30\n"
                                       << "[environment]\nplugin = \"" << GROVE_TEST_SCRIPTED_ENV_PLUGIN << "\"\n"
                                       << "config = { stop = \"e\", turns = 3 }\nmax_turns = 3\n"
                                       << "reward_weight = 1.0\nreward_name = \"answered\"\n"
                                       << "[[rewards]]\nplugin = \"format\"\n";
    auto r = grove::test::run_grove("eval " + dir + "/grove.toml --limit 8 --seed 3 --json 2>/dev/null");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["rows"].size(), 8u);
    double calls = 0;
    int64_t observed = 0;
    for (const auto& row : j["rows"]) {
        std::string completion;
        int64_t environment_turns = 0;
        for (const auto& turn : row["turns"]) {
            completion += turn["text"].get<std::string>();
            if (turn["role"] == "environment") {
                EXPECT_EQ(turn["text"], " ok");
                ++environment_turns;
            }
        }
        EXPECT_EQ(environment_turns, row["tool_calls"].get<int64_t>());
        // the environment's own score of the episode (scripted_env: its observations in the text)
        EXPECT_EQ(row["rewards"]["answered"].get<double>(), double(environment_turns));
        EXPECT_LE(row["length"].get<int64_t>(), 30 - environment_turns) << "observation tokens are not counted";
        observed += environment_turns > 0;
        calls += row["tool_calls"].get<double>();
    }
    EXPECT_GT(observed, 0) << "no episode reached the environment: the test exercised nothing";
    EXPECT_NEAR(j["tool_call_frequency"].get<double>(), calls / 8, 1e-12);
    EXPECT_NEAR(j["rewards"]["answered"].get<double>(), calls / 8, 1e-12);
    EXPECT_EQ(j["environment"], GROVE_TEST_SCRIPTED_ENV_PLUGIN);

    auto without = grove::test::run_grove("eval " + dir + "/grove.toml --limit 8 --seed 3 --no-environment --json 2>/dev/null");
    ASSERT_EQ(without.exit_code, 0) << without.out;
    auto w = nlohmann::json::parse(without.out);
    EXPECT_TRUE(w["environment"].is_null());
    EXPECT_TRUE(w["tool_call_frequency"].is_null());
    for (const auto& row : w["rows"]) EXPECT_FALSE(row.contains("turns"));
    EXPECT_FALSE(w["rewards"].contains("answered")) << "no episodes, no environment score";

    // a plugin that makes its judgement a reward itself (SDK episode_reward, as TRL's get_reward())
    // is evaluated as one with no reward_weight; without the environment nothing is left to report
    std::ofstream(dir + "/alone.toml") << "[model]\npath = \"" << kModel << "\"\nchat_template = \"none\"\n"
                                       << "[data]\nsource = \"builtin:arithmetic-test\"\n"
                                       << "[generation]\nmax_completion_length = 30\n"
                                       << "[environment]\nplugin = \"" << GROVE_TEST_SCRIPTED_ENV_PLUGIN << "\"\n"
                                       << "config = { stop = \"e\", turns = 3, judgement = \"as_reward\", "
                                       << "reward_name = \"scripted\" }\nmax_turns = 3\n";
    auto alone = grove::test::run_grove("eval " + dir + "/alone.toml --limit 8 --seed 3 --json 2>/dev/null");
    ASSERT_EQ(alone.exit_code, 0) << alone.out;
    auto a = nlohmann::json::parse(alone.out);
    ASSERT_TRUE(a["rewards"].contains("scripted")) << alone.out;
    EXPECT_GT(a["tool_call_frequency"].get<double>(), 0.0);
    EXPECT_NEAR(a["rewards"]["scripted"].get<double>(), a["tool_call_frequency"].get<double>(), 1e-12);
    auto nothing = grove::test::run_grove("eval " + dir + "/alone.toml --limit 8 --no-environment 2>&1");
    EXPECT_NE(nothing.exit_code, 0);
    EXPECT_NE(nothing.out.find("grove eval: no reward to report"), std::string::npos) << nothing.out;
}
