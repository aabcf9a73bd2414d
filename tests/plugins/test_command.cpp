// The command environment through the real plugin host: a tool written in Python
// (examples/command-tool/arith_tool.py), and the tools that misbehave: hang, fail, flood stdout.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "grove/environment_host.hpp"
#include "grove/error.hpp"
#include "plugin_test_support.hpp"

namespace {

grove::Environment command(const std::string& config) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    auto info = host.find("command", GROVE_PLUGIN_KIND_ENVIRONMENT);
    return grove::Environment(grove::PluginInstance(info, grove::PluginConfig::from_toml_text(info, config, "test")));
}

std::string argv(const std::vector<std::string>& words) {
    std::string out = "argv = [";
    for (size_t i = 0; i < words.size(); ++i) out += (i ? ", " : "") + std::string("'") + words[i] + "'";
    return out + "]\n";
}

grove::EnvironmentAnswers call(const grove::Environment& env, const std::vector<std::string>& inputs) {
    grove::EnvironmentTurns waiting;
    for (size_t i = 0; i < inputs.size(); ++i) waiting.add(i, 1, "<tool>" + inputs[i] + "</tool>", {}, false, "p", "{}");
    return env.step(waiting);
}

const std::string kPythonTool = std::string(GROVE_TEST_SOURCE_DIR) + "/examples/command-tool/arith_tool.py";

}  // namespace

TEST(Command, APythonToolAnswersOnStdout) {
    auto env = command(argv({GROVE_PYTHON, kPythonTool}));
    EXPECT_EQ(env.stop_strings(), (std::vector<std::string>{"</tool>"}));
    auto a = call(env, {"2 * (3 + 4)", "7 / 2", "__import__('os')"});
    EXPECT_EQ(a.observations[0], "<output>14</output>");
    EXPECT_EQ(a.observations[1], "<output>3.5</output>");
    EXPECT_EQ(a.observations[2], "<output>error: the tool exited with status 1</output>") << "its refusal counts as failed";
    EXPECT_EQ(a.tool_failures, (std::vector<uint32_t>{0, 0, 1}));
    EXPECT_EQ(a.tool_calls, (std::vector<uint32_t>{1, 1, 1}));
}

TEST(Command, AHangingToolIsKilledAtItsTimeout) {
    // the shell's child would create the marker after 1 s, unless the whole process group dies
    const std::string marker = std::string(GROVE_TEST_BINARY_DIR) + "/command-timeout-marker";
    std::remove(marker.c_str());
    auto env = command(argv({"/bin/sh", "-c", "(sleep 1; touch " + marker + ") & sleep 30"}) + "timeout_seconds = 0.5\n");
    const auto start = std::chrono::steady_clock::now();
    auto a = call(env, {"x"});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 5.0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    EXPECT_FALSE(std::ifstream(marker).good()) << "a process of the tool's group outlived the time-out";
    EXPECT_NE(a.observations[0].find("error: timed out after 0.5"), std::string::npos) << a.observations[0];
    EXPECT_EQ(a.tool_failures[0], 1u);
    EXPECT_EQ(a.done[0], 0) << "the episode goes on";
}

TEST(Command, FailuresAndFloodsBecomeObservations) {
    auto exits = command(argv({"/bin/sh", "-c", "exit 3"}));
    EXPECT_EQ(call(exits, {"x"}).observations[0], "<output>error: the tool exited with status 3</output>");
    auto crashes = command(argv({"/bin/sh", "-c", "kill -9 $$"}));
    EXPECT_EQ(call(crashes, {"x"}).observations[0], "<output>error: the tool was killed by signal 9</output>");
    auto floods = command(argv({"/bin/sh", "-c", "yes x | head -c 100000"}) + "max_output_bytes = 6\n");
    auto a = call(floods, {"x"});
    EXPECT_EQ(a.observations[0], "<output>x\nx\nx\n[output cut at 6 bytes]</output>");
    EXPECT_EQ(a.tool_failures[0], 0u);
}

TEST(Command, TheToolSeesAScrubbedEnvironmentAndItsWorkingFolder) {
    auto env = command(
        argv({GROVE_PYTHON, "-c", "import os, sys; sys.stdout.write(str(sorted(os.environ)) + chr(32) + os.getcwd())"}) +
        "working_dir = '/tmp'\n");
    EXPECT_EQ(call(env, {""}).observations[0], "<output>['HOME', 'LANG', 'LC_ALL', 'PATH'] /tmp</output>");
}

TEST(Command, AMissingProgramIsAConfigurationError) {
    try {
        command(argv({"no-such-tool-anywhere"}));
        FAIL() << "accepted a program that does not exist";
    } catch (const grove::Error& e) {
        EXPECT_NE(std::string(e.what()).find("argv"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("no-such-tool-anywhere"), std::string::npos) << e.what();
    }
}
