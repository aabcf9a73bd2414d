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

}  // namespace

// ---- format -------------------------------------------------------------------------------------
TEST(FormatReward, ThinkAnswerPreset) {
    struct Case {
        const char* text;
        float expected;
    } cases[] = {
        {"<think>7 + 8 = 15</think><answer>15</answer>", 1},
        {"<think>multi\nline\nreasoning</think>\n<answer>15</answer>\n", 1},  // newlines between and after
        {"<think>答案很简单 🙂</think><answer>四十二</answer>", 1},           // unicode inside
        {"<think>café, naïve, Ærø</think> <answer>déjà vu</answer>", 1},      // accented letters, a space
        {" \t\n<think>x</think>\t<answer>1</answer>\n\n", 1},                 // whitespace around the blocks
        {"<think>x</think><answer></answer>", 1},                             // empty blocks still have the format
        {"<answer>15</answer>", 0},                                           // no think block
        {"<think>x</think>", 0},                                              // no answer
        {"Sure! <think>x</think><answer>1</answer>", 0},                      // text before
        {"<think>x</think><answer>1</answer> trailing words", 0},             // text after
        {"", 0},                                                              // empty completion
    };
    std::vector<RewardRow> rows;
    for (const auto& c : cases) rows.push_back(completion(c.text));
    auto result = score_rewards("format", "", rows);
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(result.scores[i], cases[i].expected) << cases[i].text;
    ASSERT_EQ(result.metric_names, std::vector<std::string>{"matched"});
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(result.metrics[0][i], cases[i].expected) << cases[i].text;
}

TEST(FormatReward, TruncatedCompletionsGetNoSpecialCase) {
    RewardRow cut = completion("<think>still thinking about 答案");  // hit the length limit: no closing tags
    cut.truncated = true;
    RewardRow whole = completion("<think>x</think><answer>1</answer>");
    whole.truncated = true;  // the flag alone changes nothing
    auto result = score_rewards("format", "", {cut, whole});
    EXPECT_EQ(result.scores, (std::vector<float>{0, 1}));
}

TEST(FormatReward, TrlThinkPresetRejectsNestedThink) {
    auto result =
        score_rewards("format", "preset = \"think\"",
                      {completion("<think>a</think> rest"), completion("<think>a<think>b</think>"), completion("no tags")});
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
    // UCP: \w is Unicode-aware; '.' is one code point, so an emoji is one character
    auto ucp =
        score_rewards("format", "pattern = '\\w+ .'", {completion("naïve 🙂"), completion("答案 x"), completion("a 🙂🙂")});
    EXPECT_EQ(ucp.scores, (std::vector<float>{1, 1, 0}));
    // an explicit pattern replaces the preset, even an empty one (which matches only "")
    auto empty = score_rewards("format", "pattern = ''", {completion(""), completion("<think>x</think><answer>1</answer>")});
    EXPECT_EQ(empty.scores, (std::vector<float>{1, 0}));
}

TEST(FormatReward, LongCompletionsMatchAndPathologicalPatternsFailLoudly) {
    // a repeated capture group over 40 KB needs more than PCRE2's default 32 KiB JIT stack
    std::string think(20000, 'x'), answer(20000, 'y');
    auto long_row = score_rewards("format", "pattern = '<think>(?:x|y)*</think>\\s*<answer>(x|y)*</answer>'",
                                  {completion("<think>" + think + "</think>\n<answer>" + answer + "</answer>")});
    EXPECT_EQ(long_row.scores[0], 1.0f);
    auto preset = score_rewards("format", "", {completion("<think>" + think + think + "</think><answer>1</answer>")});
    EXPECT_EQ(preset.scores[0], 1.0f);
    // exponential backtracking hits PCRE2's match limit: an error naming the row, not a silent miss
    try {
        score_rewards("format", "pattern = '(x+x+)+[yz]'", {completion("ok"), completion(std::string(40, 'x') + "w")});
        FAIL() << "accepted";
    } catch (const grove::Error& e) {
        EXPECT_CONTAINS(std::string(e.what()), "row 1: PCRE2 could not finish matching");
    }
}

TEST(FormatReward, InvalidUtf8NeverMatchesButTheValidPartsDo) {
    // '.' cannot cover a broken byte inside the think block; a search still finds "ok" in the valid parts
    auto broken = score_rewards("format", "", {completion("<think>\xff</think><answer>1</answer>")});
    EXPECT_EQ(broken.scores[0], 0.0f);
    auto search =
        score_rewards("format", "pattern = 'ok'\nfull_match = false", {completion(std::string("\xff ok \xe6\x97", 7))});
    EXPECT_EQ(search.scores[0], 1.0f);
}

TEST(FormatReward, ConfigErrorsNameTheKey) {
    EXPECT_CONTAINS(config_error("format", "pattern = '(unclosed'"), "'pattern': the regex does not compile at offset");
    EXPECT_CONTAINS(config_error("format", "preset = \"xml\""), "'preset': unknown preset 'xml'");
    EXPECT_CONTAINS(config_error("format", "pattern = 'a{2,1}'"), "'pattern': the regex does not compile at offset");
    // a typo in preset is an error even when pattern overrides it
    EXPECT_CONTAINS(config_error("format", "preset = \"Think\"\npattern = 'x'"), "'preset': unknown preset 'Think'");
    EXPECT_CONTAINS(config_error("format", "full_match = \"yes\""), "'full_match' must be a boolean");
    EXPECT_CONTAINS(config_error("format", "score_match = nan"), "'score_match': must be a finite number");
    EXPECT_CONTAINS(config_error("format", "score_miss = -inf"), "'score_miss': must be a finite number");
    EXPECT_CONTAINS(config_error("format", "score_match = \"1\""), "'score_match'");
    EXPECT_CONTAINS(config_error("format", "pattern = 3"), "'pattern'");
}

// ---- correctness ---------------------------------------------------------------------------------
TEST(CorrectnessReward, ExtractionAndComparisonTable) {
    struct Case {
        const char* text;
        const char* row;
        float expected;
    } cases[] = {
        {"<think>37+48</think><answer>85</answer>", R"({"answer": "85"})", 1},
        {"<answer> 85 </answer>", R"({"answer": 85})", 1},    // numeric reference, spaces
        {"<answer>85.0</answer>", R"({"answer": "85"})", 1},  // numerically equal
        {"<answer>86</answer>", R"({"answer": "85"})", 0},
        {"<answer>1,234</answer>", R"({"answer": 1234})", 1},  // thousands separator
        {"<answer>$12</answer>", R"({"answer": "12"})", 1},
        {"<answer>50%</answer>", R"({"answer": "50"})", 1},
        {"<answer>3/4</answer>", R"({"answer": 0.75})", 1},                              // fraction
        {"The answer is \\boxed{\\frac{1}{2}} ok", R"({"answer": "\\frac{1}{2}"})", 1},  // nested braces, text compare
        {"first 3 then -42", R"({"answer": "-42"})", 1},                                 // last number, negative
        {"total: 1,000,000 apples", R"({"answer": "1000000"})", 1},
        {"<answer>Paris.</answer>", R"({"answer": "  paris "})", 1},  // normalised text
        {"<answer>東京</answer>", R"({"answer": "東京"})", 1},        // unicode text
        {"<answer>東京</answer>", R"({"answer": "京都"})", 0},
        {"no answer at all", R"({"answer": "5"})", 0},  // nothing extracted: wrong
        {"", R"({"answer": "5"})", 0},                  // empty completion
        // last number: a sign only right before the digits and not after a letter or digit
        {"so 5-3 is", R"({"answer": 3})", 1},
        {"x = -3.", R"({"answer": -3})", 1},
        {"it is (-2,500) units", R"({"answer": -2500})", 1},
        {"\xe2\x88\x92"
         "7 degrees",
         R"({"answer": -7})", 1},  // U+2212 minus sign
        {"costs -$12 total", R"({"answer": -12})", 1},
        {"the list 1,2,3", R"({"answer": 3})", 1},  // not one number 123
        {"about 1e3 items", R"({"answer": 1000})", 1},
        {"version 1.2.3", R"({"answer": 1.2})", 1},
        {"答案是 42。", R"({"answer": 42})", 1},  // number among CJK text
        // answer tag: the last complete one
        {"<answer>1</answer> no wait <answer>2", R"({"answer": 1})", 1},
        // boxed: nested braces, and the last balanced one when the last is cut off
        {"\\boxed{\\frac{1}{2}}", R"({"answer": 0.5})", 1},  // \frac read as a number
        {"\\boxed{\\dfrac{-3}{4}}", R"({"answer": "-0.75"})", 1},
        {"\\boxed{7} and \\boxed{8", R"({"answer": 7})", 1},
        {"\\boxed{\\text{Paris}}", R"({"answer": "paris"})", 1},  // \text{} unwrapped for text
        {"\\boxed{{1,2}}", R"({"answer": "{1,2}"})", 1},          // braces inside kept
        // numbers inside tags
        {"<answer>50\\%</answer>", R"({"answer": 50})", 1},
        {"<answer>$-5</answer>", R"({"answer": -5})", 1},
        {"<answer>.5</answer>", R"({"answer": "1/2"})", 1},
        {"<answer>1,23</answer>", R"({"answer": 123})", 0},           // bad grouping: text "1,23"
        {"<answer>0x10</answer>", R"({"answer": 16})", 0},            // no hex
        {"<answer>12 apples</answer>", R"({"answer": 12})", 0},       // units: not a number
        {"<answer>1000000.5</answer>", R"({"answer": 1000000})", 1},  // relative tolerance
        {"<answer>0.0000005</answer>", R"({"answer": 0})", 1},        // absolute near zero
        {"<answer>0.00001</answer>", R"({"answer": 0})", 0},
        // text: ASCII case-folded only
        {"<answer>Café</answer>", R"({"answer": "café"})", 1},
        {"<answer>CAFÉ</answer>", R"({"answer": "café"})", 0},
        {"<answer>Paris .</answer>", R"({"answer": "paris"})", 1},
        {"<answer>New   York\n</answer>", R"({"answer": "new york."})", 1},
    };
    std::vector<RewardRow> rows;
    for (const auto& c : cases) rows.push_back(completion(c.text, c.row));
    auto result = score_rewards("correctness", "", rows);
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(result.scores[i], cases[i].expected) << cases[i].text;
    ASSERT_EQ(result.metric_names, std::vector<std::string>{"extracted"});
    for (size_t i = 0; i < rows.size(); ++i)  // only the two rows without any answer extract nothing
        EXPECT_EQ(result.metrics[0][i], (i == 14 || i == 15) ? 0.0f : 1.0f) << cases[i].text;
}

TEST(CorrectnessReward, MissingOrNullReferenceIsNotApplicable) {
    auto result = score_rewards(
        "correctness", "",
        {completion("<answer>1</answer>", R"({"question": "q"})"), completion("<answer>1</answer>", R"({"answer": null})"),
         completion("<answer>1</answer>", R"({"answer": "1"})")});
    EXPECT_TRUE(std::isnan(result.scores[0]));
    EXPECT_TRUE(std::isnan(result.scores[1]));
    EXPECT_EQ(result.scores[2], 1.0f);
    // the "extracted" metric does not depend on the reference
    EXPECT_EQ(result.metrics[0], (std::vector<float>{1, 1, 1}));
    auto other_column = score_rewards("correctness", "reference_column = \"solution\"",
                                      {completion("<answer>7</answer>", R"({"answer": "1", "solution": "7"})")});
    EXPECT_EQ(other_column.scores[0], 1.0f);
}

TEST(CorrectnessReward, ForcedModesToleranceAndScores) {
    auto boxed_only =
        score_rewards("correctness", "extract = \"boxed\"", {completion("<answer>5</answer>", R"({"answer": 5})")});
    EXPECT_EQ(boxed_only.scores[0], 0.0f);  // the answer tag is ignored
    auto text = score_rewards("correctness", "compare = \"text\"", {completion("<answer>5.0</answer>", R"({"answer": "5"})")});
    EXPECT_EQ(text.scores[0], 0.0f);
    auto loose = score_rewards(
        "correctness", "tolerance = 0.01\nscore_correct = 2.0\nscore_wrong = -0.5",
        {completion("<answer>100.5</answer>", R"({"answer": 100})"), completion("<answer>102</answer>", R"({"answer": 100})")});
    EXPECT_EQ(loose.scores, (std::vector<float>{2.0f, -0.5f}));
    auto numeric = score_rewards("correctness", "compare = \"numeric\"",
                                 {completion("<answer>Paris</answer>", R"({"answer": "Paris"})"),
                                  completion("<answer>7.0</answer>", R"({"answer": "7"})")});
    EXPECT_EQ(numeric.scores, (std::vector<float>{0.0f, 1.0f}));  // text never counts in numeric mode
    auto last = score_rewards("correctness", "extract = \"last_number\"",
                              {completion("<answer>5</answer> check: 6", R"({"answer": 6})")});
    EXPECT_EQ(last.scores[0], 1.0f);
    auto tag = score_rewards("correctness", "extract = \"answer_tag\"", {completion("\\boxed{5} 5", R"({"answer": 5})")});
    EXPECT_EQ(tag.scores[0], 0.0f);
    EXPECT_EQ(tag.metrics[0][0], 0.0f);
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
    EXPECT_CONTAINS(config_error("correctness", "tolerance = inf"), "'tolerance': must be >= 0 and finite");
    EXPECT_CONTAINS(config_error("correctness", "reference_column = \"\""), "'reference_column': must name a dataset column");
    EXPECT_CONTAINS(config_error("correctness", "score_correct = nan"), "'score_correct': must be a finite number");
    EXPECT_CONTAINS(config_error("correctness", "score_wrong = inf"), "'score_wrong': must be a finite number");
    try {
        score_rewards("correctness", "", {completion("x", "[1, 2]")});
        FAIL() << "accepted";
    } catch (const grove::Error& e) {
        EXPECT_CONTAINS(std::string(e.what()), "row 0: the dataset row is not a JSON object");
    }
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

TEST(LengthPenaltyReward, OverlongCountsTokensNotCharactersAndIgnoresTheTruncatedFlag) {
    RewardRow few_chars = completion("short");
    few_chars.tokens.assign(90, 5);  // 5 bytes of text, 90 tokens
    auto result = score_rewards("length_penalty", "max_length = 100\ncache = 20",
                                {few_chars, tokens(90, true), tokens(90, false), tokens(60, true)});
    EXPECT_FLOAT_EQ(result.scores[0], -0.5f);
    EXPECT_FLOAT_EQ(result.scores[1], -0.5f);
    EXPECT_FLOAT_EQ(result.scores[2], -0.5f);
    EXPECT_FLOAT_EQ(result.scores[3], 0.0f);
    // cache = max_length: the whole range is soft
    auto all_soft =
        score_rewards("length_penalty", "max_length = 10\ncache = 10", {tokens(0), tokens(5), tokens(10), tokens(11)});
    EXPECT_EQ(all_soft.scores, (std::vector<float>{0.0f, -0.5f, -1.0f, -1.0f}));
}

TEST(LengthPenaltyReward, TargetModeInTokensAndCharacters) {
    auto by_tokens =
        score_rewards("length_penalty", "mode = \"target\"\ntarget = 10\nscale = 5.0", {tokens(10), tokens(0), tokens(20)});
    EXPECT_EQ(by_tokens.scores, (std::vector<float>{0.0f, -2.0f, -2.0f}));
    // "東京🙂" is 3 code points but 10 bytes
    auto by_characters = score_rewards("length_penalty", "mode = \"target\"\ntarget = 3\nunit = \"characters\"",
                                       {completion("東京🙂"), completion("abcde"), completion("")});
    EXPECT_EQ(by_characters.scores, (std::vector<float>{0.0f, -2.0f, -3.0f}));
    // accented letters: "café" is 4 code points (5 bytes); "答案" 2 (6 bytes)
    auto accented = score_rewards("length_penalty", "mode = \"target\"\ntarget = 4\nunit = \"characters\"\nscale = 2.0",
                                  {completion("café"), completion("答案"), completion("naïve")});
    EXPECT_EQ(accented.scores, (std::vector<float>{0.0f, -1.0f, -0.5f}));
    // default unit is tokens: the text's length does not matter
    RewardRow row = completion("答案");
    row.tokens = {1, 2, 3, 4};
    auto default_unit = score_rewards("length_penalty", "mode = \"target\"\ntarget = 4", {row});
    EXPECT_EQ(default_unit.scores[0], 0.0f);
}

TEST(LengthPenaltyReward, ConfigErrorsNameTheKey) {
    EXPECT_CONTAINS(config_error("length_penalty", ""), "'max_length': mode \"overlong\" needs max_length");
    EXPECT_CONTAINS(config_error("length_penalty", "max_length = 10"), "'cache': mode \"overlong\" needs cache");
    EXPECT_CONTAINS(config_error("length_penalty", "max_length = 10\ncache = 11"), "'cache': must be in [1, max_length]");
    EXPECT_CONTAINS(config_error("length_penalty", "max_length = 10\ncache = 0"), "'cache': must be in [1, max_length]");
    EXPECT_CONTAINS(config_error("length_penalty", "max_length = 0\ncache = 1"), "'max_length': must be > 0");
    EXPECT_CONTAINS(config_error("length_penalty", "max_length = -5\ncache = 1"), "'max_length': must be > 0");
    EXPECT_CONTAINS(config_error("length_penalty", "max_length = 10\ncache = 5\nscale = 2.0"),
                    "'scale': 'scale' does not apply to mode \"overlong\"");
    EXPECT_CONTAINS(config_error("length_penalty", "max_length = 10\ncache = 5\nunit = \"tokens\""),
                    "'unit': 'unit' does not apply to mode \"overlong\"");
    EXPECT_CONTAINS(config_error("length_penalty", "mode = \"target\"\ntarget = 3\nmax_length = 10"),
                    "'max_length': 'max_length' does not apply to mode \"target\"");
    EXPECT_CONTAINS(config_error("length_penalty", "mode = \"target\"\ntarget = 3\ncache = 2"),
                    "'cache': 'cache' does not apply to mode \"target\"");
    EXPECT_CONTAINS(config_error("length_penalty", "mode = \"target\"\ntarget = -1"), "'target': must be >= 0");
    EXPECT_CONTAINS(config_error("length_penalty", "mode = \"target\"\ntarget = 3\nscale = -1.0"), "'scale': must be > 0");
    EXPECT_CONTAINS(config_error("length_penalty", "mode = \"target\"\ntarget = 3\nscale = inf"),
                    "'scale': must be > 0 and finite");
    EXPECT_CONTAINS(config_error("length_penalty", "max_length = 10.5\ncache = 2"), "'max_length'");
    EXPECT_CONTAINS(config_error("length_penalty", "max_length = 10\ncache = 5\ntarget = 3"),
                    "'target': 'target' does not apply to mode \"overlong\"");
    EXPECT_CONTAINS(config_error("length_penalty", "mode = \"target\""), "'target': mode \"target\" needs target");
    EXPECT_CONTAINS(config_error("length_penalty", "mode = \"target\"\ntarget = 3\nscale = 0.0"), "'scale': must be > 0");
    EXPECT_CONTAINS(config_error("length_penalty", "mode = \"target\"\ntarget = 3\nunit = \"bytes\""), "'unit': 'bytes'");
    EXPECT_CONTAINS(config_error("length_penalty", "mode = \"quadratic\""), "'mode': 'quadratic' is not valid");
    EXPECT_CONTAINS(config_error("length_penalty", "max_lenght = 10"), "did you mean 'max_length'?");
}
