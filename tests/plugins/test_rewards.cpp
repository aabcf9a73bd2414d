// The three reward plugins on tables of cases, through the real plugin host.
#include <gtest/gtest.h>

#include <cmath>

#include "grove/error.hpp"
#include "plugin_test_support.hpp"

namespace {

using grove::test::RewardRow;
using grove::test::score_rewards;

RewardRow completion(std::string text, std::string row_json = "{}") {
    RewardRow r;
    r.completion = std::move(text);
    r.row_json = std::move(row_json);
    return r;
}
RewardRow tokens(int64_t n, bool truncated = false) {
    RewardRow r;
    r.tokens.assign(size_t(n), 7);
    r.completion = std::string(size_t(n), 'x');
    r.truncated = truncated;
    return r;
}

std::string config_error(const std::string& plugin, const std::string& config) {
    try {
        score_rewards(plugin, config, {completion("x")});
    } catch (const grove::Error& e) {
        return e.what();
    }
    return "(accepted)";
}

#define EXPECT_CONTAINS(text, part) EXPECT_NE((text).find(part), std::string::npos) << "in: " << (text)

}  // namespace

// ---- format -------------------------------------------------------------------------------------
TEST(FormatReward, ThinkAnswerPreset) {
    struct Case {
        const char* text;
        float expected;
    } cases[] = {
        {"<think>7 + 8 = 15</think><answer>15</answer>", 1},
        {"<think>multi\nline\nreasoning</think>\n<answer>15</answer>\n", 1},  // newlines between and after
        {"<think>答案很简单 🙂</think><answer>四十二</answer>", 1},             // unicode inside
        {"<answer>15</answer>", 0},                                            // no think block
        {"<think>x</think>", 0},                                               // no answer
        {"Sure! <think>x</think><answer>1</answer>", 0},                       // text before
        {"<think>x</think><answer>1</answer> trailing words", 0},              // text after
        {"", 0},                                                               // empty completion
    };
    std::vector<RewardRow> rows;
    for (const auto& c : cases) rows.push_back(completion(c.text));
    auto result = score_rewards("format", "", rows);
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(result.scores[i], cases[i].expected) << cases[i].text;
    ASSERT_EQ(result.metric_names, std::vector<std::string>{"matched"});
    EXPECT_EQ(result.metrics[0][0], 1.0f);
    EXPECT_EQ(result.metrics[0][3], 0.0f);
}

TEST(FormatReward, TrlThinkPresetRejectsNestedThink) {
    auto result = score_rewards("format", "preset = \"think\"",
                                {completion("<think>a</think> rest"), completion("<think>a<think>b</think>"),
                                 completion("no tags")});
    EXPECT_EQ(result.scores, (std::vector<float>{1, 0, 0}));
}

TEST(FormatReward, CustomPatternScoresAndSearchMode) {
    auto full = score_rewards("format", "pattern = '\\d+'\nscore_match = 2.0\nscore_miss = -1.0",
                              {completion("123"), completion("a 123 b")});
    EXPECT_EQ(full.scores, (std::vector<float>{2, -1}));
    auto search = score_rewards("format", "pattern = '\\d+'\nfull_match = false", {completion("a 123 b"), completion("none")});
    EXPECT_EQ(search.scores, (std::vector<float>{1, 0}));
    // \p{L} is Unicode-aware
    auto unicode = score_rewards("format", "pattern = '\\p{L}+'", {completion("Ärger"), completion("東京"), completion("a1")});
    EXPECT_EQ(unicode.scores, (std::vector<float>{1, 1, 0}));
}

TEST(FormatReward, InvalidUtf8NeverMatchesButTheValidPartsDo) {
    // '.' cannot cover a broken byte inside the think block; a search still finds "ok" in the valid parts
    auto broken = score_rewards("format", "", {completion("<think>\xff</think><answer>1</answer>")});
    EXPECT_EQ(broken.scores[0], 0.0f);
    auto search = score_rewards("format", "pattern = 'ok'\nfull_match = false",
                                {completion(std::string("\xff ok \xe6\x97", 7))});
    EXPECT_EQ(search.scores[0], 1.0f);
}

TEST(FormatReward, ConfigErrorsNameTheKey) {
    EXPECT_CONTAINS(config_error("format", "pattern = '(unclosed'"), "'pattern': the regex does not compile at offset");
    EXPECT_CONTAINS(config_error("format", "preset = \"xml\""), "'preset': unknown preset 'xml'");
    EXPECT_CONTAINS(config_error("format", "full_match = \"yes\""), "'full_match' must be a boolean");
}

// ---- correctness ---------------------------------------------------------------------------------
TEST(CorrectnessReward, ExtractionAndComparisonTable) {
    struct Case {
        const char* text;
        const char* row;
        float expected;
    } cases[] = {
        {"<think>37+48</think><answer>85</answer>", R"({"answer": "85"})", 1},
        {"<answer> 85 </answer>", R"({"answer": 85})", 1},                       // numeric reference, spaces
        {"<answer>85.0</answer>", R"({"answer": "85"})", 1},                     // numerically equal
        {"<answer>86</answer>", R"({"answer": "85"})", 0},
        {"<answer>1,234</answer>", R"({"answer": 1234})", 1},                   // thousands separator
        {"<answer>$12</answer>", R"({"answer": "12"})", 1},
        {"<answer>50%</answer>", R"({"answer": "50"})", 1},
        {"<answer>3/4</answer>", R"({"answer": 0.75})", 1},                     // fraction
        {"The answer is \\boxed{\\frac{1}{2}} ok", R"({"answer": "\\frac{1}{2}"})", 1},  // nested braces, text compare
        {"first 3 then -42", R"({"answer": "-42"})", 1},                        // last number, negative
        {"total: 1,000,000 apples", R"({"answer": "1000000"})", 1},
        {"<answer>Paris.</answer>", R"({"answer": "  paris "})", 1},            // normalised text
        {"<answer>東京</answer>", R"({"answer": "東京"})", 1},                  // unicode text
        {"<answer>東京</answer>", R"({"answer": "京都"})", 0},
        {"no answer at all", R"({"answer": "5"})", 0},                         // nothing extracted: wrong
        {"", R"({"answer": "5"})", 0},                                         // empty completion
    };
    std::vector<RewardRow> rows;
    for (const auto& c : cases) rows.push_back(completion(c.text, c.row));
    auto result = score_rewards("correctness", "", rows);
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(result.scores[i], cases[i].expected) << cases[i].text;
    EXPECT_EQ(result.metrics[0][14], 0.0f);  // "extracted" metric
    EXPECT_EQ(result.metrics[0][0], 1.0f);
}

TEST(CorrectnessReward, MissingOrNullReferenceIsNotApplicable) {
    auto result = score_rewards("correctness", "", {completion("<answer>1</answer>", R"({"question": "q"})"),
                                                     completion("<answer>1</answer>", R"({"answer": null})"),
                                                     completion("<answer>1</answer>", R"({"answer": "1"})")});
    EXPECT_TRUE(std::isnan(result.scores[0]));
    EXPECT_TRUE(std::isnan(result.scores[1]));
    EXPECT_EQ(result.scores[2], 1.0f);
    auto other_column = score_rewards("correctness", "reference_column = \"solution\"",
                                      {completion("<answer>7</answer>", R"({"answer": "1", "solution": "7"})")});
    EXPECT_EQ(other_column.scores[0], 1.0f);
}

TEST(CorrectnessReward, ForcedModesToleranceAndScores) {
    auto boxed_only = score_rewards("correctness", "extract = \"boxed\"",
                                    {completion("<answer>5</answer>", R"({"answer": 5})")});
    EXPECT_EQ(boxed_only.scores[0], 0.0f);  // the answer tag is ignored
    auto text = score_rewards("correctness", "compare = \"text\"", {completion("<answer>5.0</answer>", R"({"answer": "5"})")});
    EXPECT_EQ(text.scores[0], 0.0f);
    auto loose = score_rewards("correctness", "tolerance = 0.01\nscore_correct = 2.0\nscore_wrong = -0.5",
                               {completion("<answer>100.5</answer>", R"({"answer": 100})"),
                                completion("<answer>102</answer>", R"({"answer": 100})")});
    EXPECT_EQ(loose.scores, (std::vector<float>{2.0f, -0.5f}));
}

TEST(CorrectnessReward, TruncatedRowsAreScoredOnWhatTheyContain) {
    RewardRow cut = completion("<think>working 12 + 30 = 42", R"({"answer": 42})");
    cut.truncated = true;
    auto result = score_rewards("correctness", "", {cut});
    EXPECT_EQ(result.scores[0], 1.0f);  // last number 42, extracted from a truncated completion
}

TEST(CorrectnessReward, ErrorsNameTheKeyOrRow) {
    EXPECT_CONTAINS(config_error("correctness", "extract = \"regex\""), "'extract': 'regex' is not valid");
    EXPECT_CONTAINS(config_error("correctness", "compare = \"fuzzy\""), "'compare': 'fuzzy' is not valid");
    EXPECT_CONTAINS(config_error("correctness", "tolerance = -1.0"), "'tolerance': must be >= 0");
    try {
        score_rewards("correctness", "", {completion("x", "{}"), completion("x", "{broken")});
        FAIL();
    } catch (const grove::Error& e) {
        EXPECT_CONTAINS(std::string(e.what()), "row 1: the dataset row is not valid JSON");
    }
}

// ---- length_penalty ------------------------------------------------------------------------------
TEST(LengthPenaltyReward, OverlongMatchesTrlIncludingItsDocExample) {
    // TRL docs: L = 100, C = 20, len 90 -> -0.5
    auto result = score_rewards("length_penalty", "max_length = 100\ncache = 20",
                                {tokens(0), tokens(80), tokens(90), tokens(100), tokens(101, true), tokens(81)});
    std::vector<float> expected{0.0f, 0.0f, -0.5f, -1.0f, -1.0f, -0.05f};
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_FLOAT_EQ(result.scores[i], expected[i]) << i;
}

TEST(LengthPenaltyReward, TargetModeInTokensAndCharacters) {
    auto by_tokens = score_rewards("length_penalty", "mode = \"target\"\ntarget = 10\nscale = 5.0",
                                   {tokens(10), tokens(0), tokens(20)});
    EXPECT_EQ(by_tokens.scores, (std::vector<float>{0.0f, -2.0f, -2.0f}));
    // "東京🙂" is 3 code points but 10 bytes
    auto by_characters = score_rewards("length_penalty", "mode = \"target\"\ntarget = 3\nunit = \"characters\"",
                                       {completion("東京🙂"), completion("abcde"), completion("")});
    EXPECT_EQ(by_characters.scores, (std::vector<float>{0.0f, -2.0f, -3.0f}));
}

TEST(LengthPenaltyReward, ConfigErrorsNameTheKey) {
    EXPECT_CONTAINS(config_error("length_penalty", ""), "'max_length': mode \"overlong\" needs max_length");
    EXPECT_CONTAINS(config_error("length_penalty", "max_length = 10"), "'cache': mode \"overlong\" needs cache");
    EXPECT_CONTAINS(config_error("length_penalty", "max_length = 10\ncache = 11"), "'cache': must be in [1, max_length]");
    EXPECT_CONTAINS(config_error("length_penalty", "max_length = 10\ncache = 5\ntarget = 3"),
                    "'target': 'target' does not apply to mode \"overlong\"");
    EXPECT_CONTAINS(config_error("length_penalty", "mode = \"target\""), "'target': mode \"target\" needs target");
    EXPECT_CONTAINS(config_error("length_penalty", "mode = \"target\"\ntarget = 3\nscale = 0.0"), "'scale': must be > 0");
    EXPECT_CONTAINS(config_error("length_penalty", "mode = \"target\"\ntarget = 3\nunit = \"bytes\""), "'unit': 'bytes'");
    EXPECT_CONTAINS(config_error("length_penalty", "mode = \"quadratic\""), "'mode': 'quadratic' is not valid");
    EXPECT_CONTAINS(config_error("length_penalty", "max_lenght = 10"), "did you mean 'max_length'?");
}
