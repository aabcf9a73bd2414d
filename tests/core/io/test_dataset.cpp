// The built-in arithmetic task: every worked step of every reference completion is checked by
// re-doing the column arithmetic independently, the answer column equals the true result, the
// splits are disjoint and stable, and difficulty options are validated.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "grove/dataset.hpp"
#include "grove/error.hpp"
#include "plugin_test_support.hpp"

namespace {

struct Parsed {
    long a, b;
    char op;
};

Parsed parse_question(const std::string& q) {
    std::smatch m;
    static const std::regex re(R"(What is (\d+) ([-+*]) (\d+)\?)");
    EXPECT_TRUE(std::regex_match(q, m, re)) << q;
    return {std::stol(m[1]), std::stol(m[3]), m[2].str()[0]};
}

// Checks each "x op y [op c]=r" step against the column it should describe.
void check_steps(const Parsed& p, const std::string& completion) {
    std::smatch m;
    static const std::regex shape(R"(<think>(.*)</think><answer>(-?\d+)</answer>)");
    ASSERT_TRUE(std::regex_match(completion, m, shape)) << completion;
    std::string steps = m[1];
    static const std::regex step_re(R"((\d+)([-+*])(\d+)(?:[-+](\d+))?=(\d+))");
    long carry = 0, column = 0, place = 1, rebuilt = 0;
    for (auto it = std::sregex_iterator(steps.begin(), steps.end(), step_re); it != std::sregex_iterator();
         ++it, ++column, place *= 10) {
        const std::smatch& s = *it;
        long x = std::stol(s[1]), y = std::stol(s[3]), r = std::stol(s[5]);
        long c = s[4].matched ? std::stol(s[4]) : 0;
        EXPECT_EQ(c, carry) << completion;
        if (column > 0) {
            EXPECT_TRUE(s[4].matched) << "every column after the first names its carry: " << completion;
        }
        if (p.op == '+') {
            EXPECT_EQ(x, p.a / place % 10);
            EXPECT_EQ(y, p.b / place % 10);
            EXPECT_EQ(r, x + y + c);
            carry = r / 10;
            rebuilt += (r % 10) * place + (r / 10) * place * 10 * (std::next(it) == std::sregex_iterator());
        } else if (p.op == '-') {
            bool borrow = x >= 10;
            EXPECT_EQ(x % 10, p.a / place % 10) << completion;
            EXPECT_EQ(y, p.b / place % 10);
            EXPECT_EQ(r, x - y - c);
            EXPECT_TRUE(r >= 0 && r <= 9) << completion;
            EXPECT_EQ(borrow, p.a / place % 10 - y - c < 0) << "borrow only when needed: " << completion;
            carry = borrow;
            rebuilt += r * place;
        } else {
            EXPECT_EQ(x, p.a / place % 10);
            EXPECT_EQ(y, p.b);
            EXPECT_EQ(r, x * y + c);
            carry = r / 10;
            rebuilt += (std::next(it) == std::sregex_iterator() ? r : r % 10) * place;
        }
    }
    EXPECT_GT(column, 0) << completion;
    EXPECT_EQ(rebuilt, std::stol(m[2])) << "the answer is assembled from the steps: " << completion;
}

}  // namespace

TEST(Arithmetic, EveryWorkedStepIsRightAndTheAnswerIsTheResult) {
    for (std::string source : {"builtin:arithmetic", "builtin:arithmetic-test", "builtin:arithmetic?digits=3&ops=-*",
                               "builtin:arithmetic-test?digits=1"}) {
        auto rows = grove::load_prompts(source);
        ASSERT_FALSE(rows.empty()) << source;
        std::set<char> ops;
        for (const auto& row : rows) {
            auto columns = nlohmann::json::parse(row.columns_json);
            Parsed p = parse_question(columns["question"]);
            ops.insert(p.op);
            long truth = p.op == '+' ? p.a + p.b : p.op == '-' ? p.a - p.b : p.a * p.b;
            EXPECT_EQ(columns["answer"].get<std::string>(), std::to_string(truth));
            EXPECT_GE(truth, 0);
            check_steps(p, columns["completion"]);
            ASSERT_EQ(row.messages.size(), 2u);
            EXPECT_EQ(row.messages[1].content, columns["question"].get<std::string>());
        }
        if (source.find("ops=-*") != std::string::npos)
            EXPECT_EQ(ops, (std::set<char>{'-', '*'})) << source;
        else
            EXPECT_EQ(ops, (std::set<char>{'+', '-', '*'})) << source;
    }
}

TEST(Arithmetic, SplitsAreDisjointSizedAndStable) {
    auto question = [](const grove::PromptRow& r) {
        return nlohmann::json::parse(r.columns_json)["question"].get<std::string>();
    };
    auto train = grove::load_prompts("builtin:arithmetic"), test = grove::load_prompts("builtin:arithmetic-test");
    EXPECT_EQ(test.size(), 200u);
    // digits=2: 100*100 sums + 5050 differences + 800 products, less the held-out 200
    EXPECT_EQ(train.size(), 10000u + 5050u + 800u - 200u);
    std::set<std::string> seen;
    for (const auto& r : train) EXPECT_TRUE(seen.insert(question(r)).second) << "duplicate " << question(r);
    for (const auto& r : test) EXPECT_FALSE(seen.count(question(r))) << question(r) << " is in both splits";
    EXPECT_EQ(question(grove::load_prompts("builtin:arithmetic-test")[17]), question(test[17]));
    // a small space holds out a fifth; a large one caps training at 20000 problems
    auto one_digit = grove::load_prompts("builtin:arithmetic-test?digits=1&ops=+");
    EXPECT_EQ(one_digit.size(), 20u);
    EXPECT_EQ(grove::load_prompts("builtin:arithmetic?digits=3").size(), 20000u);
}

TEST(Arithmetic, BadOptionsNameTheSourceAndTheFix) {
    auto message = [](const std::string& source) {
        try {
            grove::load_prompts(source);
        } catch (const grove::Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(message("builtin:arithmetic?digits=4").find("digits must be 1, 2 or 3"), std::string::npos);
    EXPECT_NE(message("builtin:arithmetic?ops=/").find("ops is a non-empty set of + - *"), std::string::npos);
    std::string unknown = message("builtin:arithmetic?digit=2");
    EXPECT_NE(unknown.find("builtin:arithmetic?digit=2: unknown option 'digit'"), std::string::npos) << unknown;
    EXPECT_NE(unknown.find("did you mean 'digits'"), std::string::npos) << unknown;
    EXPECT_NE(message("builtin:arithmetic?style=terse").find("style is worked or short, not 'terse'"), std::string::npos);
}

TEST(Arithmetic, ShortStyleChangesOnlyTheInstruction) {
    auto worked = grove::load_prompts("builtin:arithmetic-test?digits=1&ops=+-");
    auto short_style = grove::load_prompts("builtin:arithmetic-test?digits=1&ops=+-&style=short");
    ASSERT_EQ(worked.size(), short_style.size());
    for (size_t i = 0; i < worked.size(); ++i) {
        ASSERT_EQ(short_style[i].messages.size(), 2u);
        EXPECT_EQ(short_style[i].messages[1].content, worked[i].messages[1].content) << "same problems, same order";
        EXPECT_EQ(short_style[i].columns_json, worked[i].columns_json) << "same answers";
        EXPECT_EQ(short_style[i].messages[0].content.find("<think>"), std::string::npos)
            << "the short instruction does not mention tags";
        EXPECT_NE(worked[i].messages[0].content.find("<think>"), std::string::npos);
    }
}

// builtin:multiplication: products of two 3-digit (or 2-digit) numbers, held-out problems never in
// training, and a reference episode whose turns are the calculator call, its answer and the reply.
TEST(Multiplication, EpisodesAreRightAndTheSplitsDisjoint) {
    auto train = grove::load_prompts("builtin:multiplication"), test = grove::load_prompts("builtin:multiplication-test");
    EXPECT_EQ(test.size(), 200u);
    EXPECT_EQ(train.size(), 20000u);
    std::set<std::string> seen;
    const std::regex question(R"(What is (\d+) \* (\d+)\?)");
    for (const auto* split : {&train, &test})
        for (const auto& row : *split) {
            auto columns = nlohmann::json::parse(row.columns_json);
            const std::string q = columns["question"];
            std::smatch m;
            ASSERT_TRUE(std::regex_match(q, m, question)) << q;
            const long a = std::stol(m[1]), b = std::stol(m[2]);
            EXPECT_TRUE(seen.insert(std::to_string(std::min(a, b)) + "*" + std::to_string(std::max(a, b))).second)
                << q << " twice (either order)";
            EXPECT_TRUE(a >= 100 && a <= 999 && b >= 100 && b <= 999) << q;
            const std::string product = std::to_string(a * b);
            EXPECT_EQ(product.size(), 6u) << q << ": every product has six digits";
            EXPECT_EQ(columns["answer"], product);
            const auto& episode = columns["episode"];
            ASSERT_EQ(episode.size(), 3u);
            EXPECT_EQ(episode[0],
                      nlohmann::json(
                          {{"role", "model"}, {"text", "<calc>" + std::string(m[1]) + " * " + std::string(m[2]) + "</calc>"}}));
            EXPECT_EQ(episode[1], nlohmann::json({{"role", "environment"}, {"text", "<result>" + product + "</result>"}}));
            EXPECT_EQ(episode[2], nlohmann::json({{"role", "model"}, {"text", "<answer>" + product + "</answer>"}}));
            EXPECT_EQ(columns["completion"].get<std::string>(), episode[0]["text"].get<std::string>() +
                                                                    episode[1]["text"].get<std::string>() +
                                                                    episode[2]["text"].get<std::string>());
        }
    // tool=20: a fifth of the rows' episodes call the calculator, the others answer at once
    size_t with_tool = 0;
    for (const auto& row : grove::load_prompts("builtin:multiplication?tool=20")) {
        auto columns = nlohmann::json::parse(row.columns_json);
        const auto& episode = columns["episode"];
        if (episode.size() == 3) {
            ++with_tool;
            continue;
        }
        ASSERT_EQ(episode.size(), 1u);
        EXPECT_EQ(episode[0]["text"], "<answer>" + columns["answer"].get<std::string>() + "</answer>");
        EXPECT_EQ(columns["completion"], episode[0]["text"]);
    }
    EXPECT_EQ(with_tool, 4000u);
    auto two = grove::load_prompts("builtin:multiplication?digits=2");
    EXPECT_EQ(two.size(), 68u * 69u / 2 - 200u);  // every unordered pair of 32..99 (four-digit products) but the held-out ones
    try {
        grove::load_prompts("builtin:multiplication?digits=4");
        FAIL() << "digits=4 was accepted";
    } catch (const grove::Error& e) {
        EXPECT_NE(std::string(e.what()).find("takes digits=2|3 and tool=0..100, not 'digits=4'"), std::string::npos)
            << e.what();
    }
}

// The prompt as rewards and environments see it (grove_reward_batch.prompt_json): a string or the
// messages, as JSON; bytes that are not UTF-8 (a prompt decoded from token ids) become U+FFFD.
TEST(Dataset, PromptAsJsonIsTheDatasetsForm) {
    EXPECT_EQ(grove::prompt_json("What is 2 + 2?", {}), "\"What is 2 + 2?\"");
    EXPECT_EQ(grove::prompt_json("ignored", {{"system", "Be brief."}, {"user", "Hi"}}),
              "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"}]");
    EXPECT_EQ(grove::prompt_json("a\xff"
                                 "b",
                                 {}),
              "\"a\xef\xbf\xbd"
              "b\"");
    EXPECT_EQ(nlohmann::json::parse(grove::prompt_json("é 中", {})).get<std::string>(), "é 中");
}

// An assistant's tool calls load in either of transformers' forms, their arguments' keys in the
// file's order (templates write them so) and null content allowed; an empty tool_calls list is false
// in Jinja, so nothing; an assistant's reasoning_content is kept apart. Calls or reasoning on another
// role, a call without a name, and reasoning that is not text are refused.
TEST(Dataset, ToolCallsLoadInTheFilesOrder) {
    const std::string file = std::string(GROVE_TEST_BINARY_DIR) + "/dataset_tool_calls.jsonl";
    std::ofstream(file) << R"({"prompt": [{"role": "user", "content": "2+2?", "tool_calls": []}, )"
                        << R"({"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": )"
                        << R"({"name": "add", "arguments": {"b": 2, "a": 2}}}, {"name": "now", "arguments": "{}"}]}]})"
                        << "\n";
    const auto rows = grove::load_prompts(file);
    ASSERT_EQ(rows.size(), 1u);
    ASSERT_EQ(rows[0].messages.size(), 2u);
    EXPECT_EQ(rows[0].messages[0].content, "2+2?");
    EXPECT_TRUE(rows[0].messages[0].tool_calls.empty());
    const auto& calls = rows[0].messages[1].tool_calls;
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_EQ(rows[0].messages[1].content, "");
    EXPECT_EQ(calls[0].name, "add");
    EXPECT_EQ(calls[0].arguments_json, R"({"b":2,"a":2})");
    EXPECT_EQ(calls[1].arguments_json, R"("{}")");
    // reward plugins see the calls in transformers' form
    EXPECT_EQ(nlohmann::json::parse(grove::prompt_json("", rows[0].messages))[1]["tool_calls"][1]["function"]["name"], "now");
    std::ofstream(file) << R"({"prompt": [{"role": "user", "content": "2+2?"}, )"
                        << R"({"role": "assistant", "content": "4", "reasoning_content": "Add."}]})" << "\n";
    const auto reasoned = grove::load_prompts(file);
    EXPECT_FALSE(reasoned[0].messages[0].reasoning_content);
    EXPECT_EQ(reasoned[0].messages[1].reasoning_content.value_or("none"), "Add.");
    EXPECT_EQ(nlohmann::json::parse(grove::prompt_json("", reasoned[0].messages))[1]["reasoning_content"], "Add.");
    for (const char* message :
         {R"({"role": "user", "content": "2+2?", "tool_calls": [{"name": "add", "arguments": {}}]})",
          R"({"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]})",
          R"({"role": "assistant", "content": null})", R"({"role": "user", "content": "4", "reasoning_content": "r"})",
          R"({"role": "assistant", "content": "4", "reasoning_content": 4})"}) {
        std::ofstream(file) << R"({"prompt": [)" << message << "]}\n";
        EXPECT_CONTAINS(grove::test::error_message([&] { grove::load_prompts(file); }), "dataset_tool_calls.jsonl:1: ")
            << message;
    }
}

// A row without a prompt is refused, unless the run has an environment, which writes the prompt:
// then, as TRL's GRPOTrainer with an environment_factory, it is one empty user message, marked so
// that the environment's reset() gets no `prompt`; its other columns are kept.
TEST(Dataset, ARowWithoutAPromptIsTheEnvironmentsToWrite) {
    const std::string file = std::string(GROVE_TEST_BINARY_DIR) + "/dataset_without_prompt.jsonl";
    std::ofstream(file) << R"({"prompt": "Hi", "seed": 1})" << "\n" << R"({"seed": 2, "environment": "dial"})" << "\n";
    EXPECT_CONTAINS(grove::test::error_message([&] { grove::load_prompts(file); }),
                    "dataset_without_prompt.jsonl:2: the row has no \"prompt\" column (only an environment that writes "
                    "prompts");
    const auto rows = grove::load_prompts(file, "prompt", grove::MissingPrompt::environment_writes);
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_TRUE(rows[0].prompt_given);
    EXPECT_EQ(rows[0].text, "Hi");
    EXPECT_FALSE(rows[1].prompt_given);
    ASSERT_EQ(rows[1].messages.size(), 1u);
    EXPECT_EQ(grove::prompt_json("", rows[1].messages), R"([{"role":"user","content":""}])");
    EXPECT_EQ(rows[1].columns_json, R"({"environment":"dial","seed":2})");
    EXPECT_EQ(rows[1].origin, file + ":2");
}
