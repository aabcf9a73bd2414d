// The calculator environment through the real plugin host: its answers, its failures (which the model
// sees and which are counted) and its configuration errors.
#include <gtest/gtest.h>

#include "grove/environment_host.hpp"
#include "grove/error.hpp"
#include "plugin_test_support.hpp"

namespace {

grove::Environment calculator(const std::string& config = "") {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    auto info = host.find("calculator", GROVE_PLUGIN_KIND_ENVIRONMENT);
    return grove::Environment(grove::PluginInstance(info, grove::PluginConfig::from_toml_text(info, config, "test")));
}

// One step() over these model turns; each as its own waiting episode.
grove::EnvironmentAnswers answer(const grove::Environment& environment, const std::vector<std::string>& turns) {
    grove::EnvironmentTurns waiting;
    for (size_t i = 0; i < turns.size(); ++i) waiting.add(i, 1, turns[i], {5, 6}, false, "prompt", "{}");
    return environment.step(waiting);
}

}  // namespace

TEST(Calculator, AnswersTheLastCallOfTheTurn) {
    auto env = calculator();
    EXPECT_EQ(env.stop_strings(), (std::vector<std::string>{"</calc>"}));
    auto a = answer(env, {"I need 12 * (3 + 4): <calc>12 * (3 + 4)</calc>", "<calc>1</calc> then <calc>-2.5*4</calc>",
                          "<calc> 7 / 2 </calc>", "<calc>123456789*1000</calc>"});
    EXPECT_EQ(a.observations, (std::vector<std::string>{"<result>84</result>", "<result>-10</result>", "<result>3.5</result>",
                                                        "<result>123456789000</result>"}));
    EXPECT_EQ(a.tool_calls, (std::vector<uint32_t>{1, 1, 1, 1}));
    EXPECT_EQ(a.tool_failures, (std::vector<uint32_t>{0, 0, 0, 0}));
    EXPECT_EQ(a.done, (std::vector<uint8_t>{0, 0, 0, 0}));
}

TEST(Calculator, BadCallsGetAnErrorTheModelCanReadAndCountAsFailures) {
    auto a = answer(calculator(), {"<calc>1/0</calc>", "<calc>2+</calc>", "<calc>import os</calc>", "<calc>(1+2</calc>",
                                   "<calc>1..2</calc>", "<calc>" + std::string(300, '1') + "</calc>"});
    EXPECT_EQ(a.observations,
              (std::vector<std::string>{"<result>error: division by zero</result>", "<result>error: missing a number</result>",
                                        "<result>error: unexpected 'i'</result>", "<result>error: missing ')'</result>",
                                        "<result>error: malformed number '1..2'</result>",
                                        "<result>error: expression too long</result>"}));
    EXPECT_EQ(a.tool_failures, (std::vector<uint32_t>(6, 1)));
    EXPECT_EQ(a.done, (std::vector<uint8_t>(6, 0))) << "the episode goes on: the model may try again";
}

TEST(Calculator, ATurnWithoutACallEndsTheEpisode) {
    auto a = answer(calculator(), {"The answer is 42.", "<calc>3 * 4"});
    EXPECT_EQ(a.observations, (std::vector<std::string>{"", ""}));
    EXPECT_EQ(a.done, (std::vector<uint8_t>{1, 1}));
    EXPECT_EQ(a.tool_calls, (std::vector<uint32_t>{0, 1}));
    EXPECT_EQ(a.tool_failures, (std::vector<uint32_t>{0, 1})) << "a call never closed is a failed call";
}

TEST(Calculator, TagsAreConfigurableAndAnEmptyTagIsRefused) {
    auto env = calculator("open_tag = \"[\"\nclose_tag = \"]\"\nresult_open_tag = \"=\"\nresult_close_tag = \";\"");
    EXPECT_EQ(env.stop_strings(), (std::vector<std::string>{"]"}));
    EXPECT_EQ(answer(env, {"[6*7]"}).observations, (std::vector<std::string>{"=42;"}));
    try {
        calculator("close_tag = \"\"");
        FAIL() << "accepted an empty close_tag";
    } catch (const grove::Error& e) {
        EXPECT_NE(std::string(e.what()).find("close_tag"), std::string::npos) << e.what();
    }
}
