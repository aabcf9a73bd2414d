// The out-of-tree example plugin (examples/custom-reward, plain C), loaded by path and scored.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "plugin_test_support.hpp"

namespace {
const std::string kPlugin = std::string(GROVE_TEST_BINARY_DIR) + "/examples/custom-reward/build/libkeyword_reward.so";
}

TEST(CustomRewardExample, ScoresThroughTheHost) {
    std::vector<grove::test::RewardRow> rows(4);
    rows[0].completion = "<answer>4</answer>";
    rows[1].completion = "no tags here";
    rows[2].completion = "<answer>1</answer><answer>2</answer>";
    rows[3].completion = "<answer>5</answer>";
    rows[3].row_json = R"({"keyword_applies": false})";
    auto result = grove::test::score_rewards(kPlugin, "keyword = \"<answer>\"", rows, 2);
    ASSERT_EQ(result.scores.size(), 4u);
    EXPECT_FLOAT_EQ(result.scores[0], 1.0f);
    EXPECT_FLOAT_EQ(result.scores[1], 0.0f);
    EXPECT_FLOAT_EQ(result.scores[2], 1.0f);
    EXPECT_TRUE(std::isnan(result.scores[3]));
    ASSERT_EQ(result.metric_names, std::vector<std::string>{"occurrences"});
    EXPECT_FLOAT_EQ(result.metrics[0][2], 2.0f);
    auto strict = grove::test::score_rewards(kPlugin, "keyword = \"<answer>\"\nmin_count = 2", rows, 2);
    EXPECT_FLOAT_EQ(strict.scores[0], 0.0f);
    EXPECT_FLOAT_EQ(strict.scores[2], 1.0f);
}

TEST(CustomRewardExample, RequiredKeyAndItsValidation) {
    std::vector<grove::test::RewardRow> rows(1);
    try {
        grove::test::score_rewards(kPlugin, "", rows);
        FAIL() << "accepted a config without the required key";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("missing required key 'keyword'"), std::string::npos) << e.what();
    }
    try {
        grove::test::score_rewards(kPlugin, "keyword = \"x\"\nmin_count = 0", rows);
        FAIL() << "accepted min_count = 0";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("'min_count': must be at least 1"), std::string::npos) << e.what();
    }
}

// The C++ example (worked_steps_reward.cpp): the share of true equations inside <think>.
namespace {
const std::string kCppPlugin = std::string(GROVE_TEST_BINARY_DIR) + "/examples/custom-reward/build/libworked_steps_reward.so";
}

TEST(CustomRewardExample, WorkedStepsScoresTheShareOfTrueEquations) {
    std::vector<grove::test::RewardRow> rows(7);
    rows[0].completion = "<think>7+8=15 3+4+1=8</think><answer>85</answer>";             // both true
    rows[1].completion = "<think>7+8=15 3+4+1=9</think><answer>95</answer>";             // one slip
    rows[2].completion = "<think>13-8=5 4-2-1=1</think><answer>15</answer>";             // borrow notation
    rows[3].completion = "<think>7*6=42 3*6+4=22 2+3*4=14</think><answer>222</answer>";  // * before +
    rows[4].completion = "<answer>85</answer>";                                          // no <think>
    rows[5].completion = "<think>carry the one, 7+8 is 15</think>";                      // words, no equation
    rows[6].completion = "<think>99999999999999999999+1=1</think>";                      // overflow is not an equation
    auto result = grove::test::score_rewards(kCppPlugin, "", rows, 1);
    ASSERT_EQ(result.scores.size(), 7u);
    EXPECT_FLOAT_EQ(result.scores[0], 1.0f);
    EXPECT_FLOAT_EQ(result.scores[1], 0.5f);
    EXPECT_FLOAT_EQ(result.scores[2], 1.0f);
    EXPECT_FLOAT_EQ(result.scores[3], 1.0f);
    EXPECT_FLOAT_EQ(result.scores[4], 0.0f);
    EXPECT_FLOAT_EQ(result.scores[5], 0.0f);
    EXPECT_FLOAT_EQ(result.scores[6], 0.0f);
    ASSERT_EQ(result.metric_names, std::vector<std::string>{"steps"});
    EXPECT_FLOAT_EQ(result.metrics[0][0], 2.0f);
    EXPECT_FLOAT_EQ(result.metrics[0][3], 3.0f);
    EXPECT_FLOAT_EQ(result.metrics[0][5], 0.0f);

    auto strict = grove::test::score_rewards(kCppPlugin, "min_steps = 3", rows, 1);
    EXPECT_FLOAT_EQ(strict.scores[0], 0.0f) << "two steps are fewer than min_steps = 3";
    EXPECT_FLOAT_EQ(strict.scores[3], 1.0f);
}

TEST(CustomRewardExample, WorkedStepsNotApplicableRowsStayNaN) {
    std::vector<grove::test::RewardRow> rows(2);
    rows[0].completion = rows[1].completion = "<think>1+1=2</think>";
    rows[0].row_json = R"({"answer" : "2"})";
    rows[1].row_json = R"({"question": "\"answer\" is a word here"})";
    auto result = grove::test::score_rewards(kCppPlugin, "only_if_column = \"answer\"", rows, 2);
    EXPECT_FLOAT_EQ(result.scores[0], 1.0f);
    EXPECT_TRUE(std::isnan(result.scores[1])) << "a row without the column is not applicable";
}

TEST(CustomRewardExample, WorkedStepsConfigErrorNamesTheKey) {
    std::vector<grove::test::RewardRow> rows(1);
    try {
        grove::test::score_rewards(kCppPlugin, "min_steps = 0", rows);
        FAIL() << "accepted min_steps = 0";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("'min_steps': must be at least 1"), std::string::npos) << e.what();
    }
}

// `grove plugins score`: the documented way to test a reward without a model (docs/plugins.md).
namespace {
std::string write_rows(const std::string& name, const std::string& text) {
    std::string path = std::string(GROVE_TEST_BINARY_DIR) + "/examples/" + name;
    std::ofstream(path) << text;
    return path;
}
}  // namespace

TEST(CustomRewardExample, PluginsScoreCommandPrintsOneLinePerRow) {
    std::string rows = write_rows("score_rows.jsonl",
                                  "{\"completion\": \"<think>7+8=15 3+4+1=8</think><answer>85</answer>\", \"answer\": \"85\"}\n"
                                  "{\"completion\": \"<think>7+8=15 3+4+1=9</think><answer>95</answer>\", \"answer\": \"85\"}\n"
                                  "\n"
                                  "{\"completion\": \"<answer>85</answer>\"}\n");
    auto r =
        grove::test::run_grove("plugins score " + kCppPlugin + " --input " + rows + " --config 'only_if_column = \"answer\"'");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_EQ(r.out,
              "{\"metrics\":{\"steps\":2.0},\"row\":0,\"score\":1.0}\n"
              "{\"metrics\":{\"steps\":2.0},\"row\":1,\"score\":0.5}\n"
              "{\"metrics\":{\"steps\":null},\"row\":2,\"score\":null}\n");

    // the built-in correctness reward by name, reading the row's other columns
    auto named = grove::test::run_grove("plugins score correctness --input " + rows);
    ASSERT_EQ(named.exit_code, 0) << named.out;
    EXPECT_NE(named.out.find("\"row\":0,\"score\":1.0"), std::string::npos) << named.out;
    EXPECT_NE(named.out.find("\"row\":1,\"score\":0.0"), std::string::npos) << named.out;
}

TEST(CustomRewardExample, PluginsScoreCommandErrorsNameTheProblem) {
    std::string rows = write_rows("score_bad.jsonl", "{\"completion\": \"a\"}\n{\"text\": \"b\"}\n");
    auto missing = grove::test::run_grove("plugins score " + kCppPlugin + " --input " + rows);
    EXPECT_EQ(missing.exit_code, 5) << missing.out;
    EXPECT_NE(missing.out.find("score_bad.jsonl:2: the row needs a \"completion\""), std::string::npos) << missing.out;

    std::string three =
        write_rows("score_three.jsonl", "{\"completion\": \"a\"}\n{\"completion\": \"b\"}\n{\"completion\": \"c\"}\n");
    auto groups = grove::test::run_grove("plugins score " + kCppPlugin + " --input " + three + " --num-generations 2");
    EXPECT_EQ(groups.exit_code, 5) << groups.out;
    EXPECT_NE(groups.out.find("3 rows do not form groups of 2"), std::string::npos) << groups.out;

    auto config = grove::test::run_grove("plugins score " + kCppPlugin + " --input " + three + " --config 'min_step = 2'");
    EXPECT_EQ(config.exit_code, 3) << config.out;  // a configuration error, as in a manifest
    EXPECT_NE(config.out.find("min_step"), std::string::npos) << config.out;
    EXPECT_NE(config.out.find("did you mean 'min_steps'"), std::string::npos) << config.out;

    auto not_reward = grove::test::run_grove("plugins score dapo --input " + three);
    EXPECT_NE(not_reward.exit_code, 0) << not_reward.out;
}
