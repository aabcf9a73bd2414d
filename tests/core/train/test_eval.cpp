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
    auto bad = grove::test::run_grove("eval --model " + kModel + " --data builtin:arithmetic-test");
    EXPECT_EQ(bad.exit_code, 2);
    EXPECT_NE(bad.out.find("give a MANIFEST, or --model, --data and at least one --reward"), std::string::npos) << bad.out;
}
