// The out-of-tree example plugin (examples/custom-reward, plain C), loaded by path and scored.
#include <gtest/gtest.h>

#include <cmath>

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
