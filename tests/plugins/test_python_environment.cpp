// Environments written in Python through the real plugin host (the python_environment plugin):
// TRL's environment_factory classes (tools from Hermes tool calls, state per episode, reset with the
// dataset row, get_reward) and Grove's own contract in Python; their errors name the class.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <memory>

#include "grove/environment_host.hpp"
#include "grove/error.hpp"
#include "grove/manifest.hpp"
#include "grove/reward_set.hpp"
#include "grove/run_config.hpp"
#include "plugin_test_support.hpp"

namespace {

const std::string kModule = std::string(GROVE_TEST_SOURCE_DIR) + "/tests/plugins/python/environments.py";

grove::Environment python_environment(const std::string& class_name, const std::string& extra = "") {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    auto info = host.find("python_environment", GROVE_PLUGIN_KIND_ENVIRONMENT);
    const std::string config =
        "module = \"" + kModule + "\"\n" + (class_name.empty() ? "" : "class = \"" + class_name + "\"\n") + extra;
    return grove::Environment(grove::PluginInstance(info, grove::PluginConfig::from_toml_text(info, config, "test")));
}

std::string call(const std::string& name, const std::string& arguments) {
    return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + arguments + "}\n</tool_call>";
}

std::string tool_turn(const std::vector<std::string>& responses) {  // ChatML's tool turn, as Qwen2.5 renders it
    std::string out = "\n<|im_start|>user";
    for (const auto& r : responses) out += "\n<tool_response>\n" + r + "\n</tool_response>";
    return out + "<|im_end|>\n<|im_start|>assistant\n";
}

// one step() over these turns (episode i = i), every row asking for `target`
grove::EnvironmentTurns turns(const std::vector<std::string>& texts, uint32_t turn, uint64_t seed, int target = 7) {
    grove::EnvironmentTurns waiting;
    waiting.seed = seed;
    for (size_t i = 0; i < texts.size(); ++i)
        waiting.add(i, turn, texts[i], {5, 6}, true, "<|im_start|>user\nCount to 7<|im_end|>\n",
                    "{\"target\": " + std::to_string(target) + "}", "[{\"role\": \"user\", \"content\": \"Count to 7\"}]");
    return waiting;
}

}  // namespace

TEST(PythonEnvironment, TrlToolsAnswerHermesCallsAndKeepStatePerEpisode) {
    auto env = python_environment("Counter");
    EXPECT_TRUE(env.stop_strings().empty()) << "TRL reads a whole turn's tool calls, at EOS";
    auto first =
        turns({"Let me add. " + call("add", "{\"amount\": 2}") + "<|im_end|>",
               call("add", "{\"amount\": 3}") + call("subtract", "{\"amount\": 1}") + "<|im_end|>", "It is 7.<|im_end|>",
               call("add", "{\"amount\": -1}") + "<|im_end|>", call("echo_prompt", "{}") + "<|im_end|>",
               call("add", "{\"amount\": 1}") + call("add", "{not json") + "<|im_end|>"},
              1, 11);
    auto a = env.step(first);
    EXPECT_EQ(a.observations[0], tool_turn({"2"}));
    EXPECT_EQ(a.observations[1], tool_turn({"3", "{'error': 'Tool subtract not found.'}"}));
    EXPECT_EQ(a.observations[2], "") << "no tool call ends the episode";
    EXPECT_EQ(a.observations[3], tool_turn({"{'error': 'amount must be >= 0'}"}));
    EXPECT_EQ(a.observations[4], tool_turn({"Count to 7"})) << "reset got the prompt as messages; async tools are awaited";
    EXPECT_EQ(a.observations[5], "") << "as in TRL, a turn whose calls do not parse calls nothing and ends the episode";
    EXPECT_EQ(a.done, (std::vector<uint8_t>{0, 0, 1, 0, 0, 1}));
    EXPECT_EQ(a.tool_calls, (std::vector<uint32_t>{1, 2, 0, 1, 1, 0}));
    EXPECT_EQ(a.tool_failures, (std::vector<uint32_t>{0, 1, 0, 1, 0, 0}));

    // turn 2 of the same batch: each episode's instance kept its total
    auto second = turns({call("add", "{\"amount\": 5}") + "<|im_end|>", call("add", "{\"amount\": 4}") + "<|im_end|>"}, 2, 11);
    a = env.step(second);
    EXPECT_EQ(a.observations, (std::vector<std::string>{tool_turn({"7"}), tool_turn({"7"})}));
    // get_reward on the whole episodes: 1 where the total reached the row's target
    auto whole = turns({"", "", "", "", ""}, 2, 11);
    EXPECT_EQ(env.score_episodes(whole), (std::vector<float>{1.0f, 1.0f, 0.0f, 0.0f, 0.0f}));

    // the next generation batch resets every episode it reaches
    a = env.step(*std::make_unique<grove::EnvironmentTurns>(turns({call("add", "{\"amount\": 1}") + "<|im_end|>"}, 1, 12)));
    EXPECT_EQ(a.observations[0], tool_turn({"1"}));
}

// TRL's standalone tools (GRPOTrainer(tools=[...])): the module's functions, alone or before a
// class's methods; a turn's synchronous calls are answered first, in call order, then its async
// ones, as TRL's tool loop answers them.
TEST(PythonEnvironment, StandaloneToolsAloneOrBeforeAClassesMethods) {
    auto tools = python_environment("", "tools = [\"multiply\", \"say_later\"]");
    EXPECT_EQ(tools.tools_json().substr(0, 45), "[{\"type\": \"function\", \"function\": {\"name\": \"m") << tools.tools_json();
    EXPECT_NE(tools.tools_json().find("\"name\": \"say_later\""), std::string::npos) << tools.tools_json();
    EXPECT_FALSE(tools.reward_by_default()) << "tools alone judge nothing";
    auto a = tools.step(*std::make_unique<grove::EnvironmentTurns>(
        turns({call("multiply", "{\"a\": 6, \"b\": 7}") + "<|im_end|>",
               call("say_later", "{\"text\": \"first\"}") + call("multiply", "{\"a\": 2, \"b\": 3}") +
                   call("say_later", "{\"text\": \"late\"}") + call("add", "{\"amount\": 1}") + "<|im_end|>",
               "No call.<|im_end|>"},
              1, 3)));
    EXPECT_EQ(a.observations[0], tool_turn({"42"}));
    EXPECT_EQ(a.observations[1], tool_turn({"6", "{'error': 'Tool add not found.'}", "first", "late"}))
        << "the async tools' results come last, in their calls' order";
    EXPECT_EQ(a.done, (std::vector<uint8_t>{0, 0, 1}));
    EXPECT_EQ(a.tool_calls, (std::vector<uint32_t>{1, 4, 0}));
    EXPECT_EQ(a.tool_failures, (std::vector<uint32_t>{0, 1, 0}));
    auto start = turns({""}, 0, 3);
    EXPECT_EQ(tools.begin_episodes(start), std::vector<std::string>{""}) << "nothing to reset: the prompt as it is";

    // with a class: the functions first, then its methods; each episode's instance keeps its state
    auto counter = python_environment("Counter", "tools = [\"multiply\"]");
    const std::string& listed = counter.tools_json();
    EXPECT_LT(listed.find("\"name\": \"multiply\""), listed.find("\"name\": \"add\"")) << listed;
    a = counter.step(*std::make_unique<grove::EnvironmentTurns>(turns(
        {call("echo_prompt", "{}") + call("multiply", "{\"a\": 3, \"b\": 3}") + call("add", "{\"amount\": 2}") + "<|im_end|>"},
        1, 4)));
    EXPECT_EQ(a.observations[0], tool_turn({"9", "2", "Count to 7"}));

    const auto message = grove::test::error_message;
    std::string unknown = message([] { python_environment("", "tools = [\"multiply\", \"divide\"]"); });
    EXPECT_NE(unknown.find("has no tool 'divide'; it has: "), std::string::npos) << unknown;
    std::string with_step = message([] { python_environment("Echo", "tools = [\"multiply\"]"); });
    EXPECT_NE(with_step.find("'Echo' follows Grove's environment contract (it has step())"), std::string::npos) << with_step;
    std::string nothing = message([] { python_environment(""); });
    EXPECT_NE(nothing.find("give `class` (the environment), `classes` (several"), std::string::npos) << nothing;
    // without data.source every prompt is an empty user message, and a row may have no prompt (""):
    // tools alone complete neither
    for (const std::string& prompt_json : {std::string("[{\"role\": \"user\", \"content\": \"\"}]"), std::string()}) {
        std::string no_prompts = message([&] {
            auto tools_only = python_environment("", "tools = [\"multiply\"]");
            grove::EnvironmentTurns placeholders;
            placeholders.add(0, 0, "", {}, false, "<|im_start|>user\n<|im_end|>\n", "{}", prompt_json);
            tools_only.begin_episodes(placeholders);
        });
        EXPECT_NE(no_prompts.find("an environment of `tools` alone writes no prompts: every row needs one"), std::string::npos)
            << no_prompts;
    }
}

// TRL's get_reward column is the probed class's: a rollout is scored only when its instance is
// exactly that class, so a factory that also makes another one (here a subclass) leaves its rows NaN.
TEST(PythonEnvironment, GetRewardScoresOnlyInstancesOfTheProbedClass) {
    auto env = python_environment("alternating_counters");  // probed: a Counter; then a Tally, a Counter
    env.step(*std::make_unique<grove::EnvironmentTurns>(turns({"No.<|im_end|>", "No.<|im_end|>", "No.<|im_end|>"}, 1, 5, 0)));
    const auto scores = env.score_episodes(*std::make_unique<grove::EnvironmentTurns>(turns({"", "", ""}, 1, 5, 0)));
    EXPECT_EQ(scores[0], 1.0f);
    EXPECT_TRUE(std::isnan(scores[1])) << "the Tally's episode";
    EXPECT_EQ(scores[2], 1.0f);
}

TEST(PythonEnvironment, ClassKeywordArgumentsReachTheFactory) {
    auto env = python_environment("Counter", "kwargs = { start = 100 }");
    auto batch = turns({call("add", "{\"amount\": 1}") + "<|im_end|>"}, 1, 3);
    EXPECT_EQ(env.step(batch).observations[0], tool_turn({"101"}));
}

TEST(PythonEnvironment, GroveContractInPython) {
    auto env = python_environment("Echo");
    EXPECT_EQ(env.stop_strings(), (std::vector<std::string>{"</say>"}));
    auto batch = turns({"<say>hello</say>", "<say></say>", "nothing to say"}, 1, 1);
    auto a = env.step(batch);
    EXPECT_EQ(a.observations, (std::vector<std::string>{"<heard>hello</heard>", "<heard></heard>", ""}));
    EXPECT_EQ(a.done, (std::vector<uint8_t>{0, 0, 1}));
    EXPECT_EQ(a.tool_calls, (std::vector<uint32_t>{1, 1, 0}));
    EXPECT_EQ(a.tool_failures, (std::vector<uint32_t>{0, 1, 0}));
    auto whole = turns({"<say>a</say><heard>a</heard><say>b</say><heard>b</heard>", "no"}, 2, 1);
    EXPECT_EQ(env.score_episodes(whole), (std::vector<float>{2.0f, 0.0f}));
}

TEST(PythonEnvironment, ErrorsNameTheClassAndWhatToDo) {
    const auto message = grove::test::error_message;
    std::string neither = message([] { python_environment("Nothing"); });
    EXPECT_NE(neither.find("has neither step() (Grove's environment contract) nor reset() (TRL's environment_factory)"),
              std::string::npos)
        << neither;
    std::string missing = message([] { python_environment("Missing"); });
    EXPECT_NE(missing.find("has no class 'Missing'; it has: Abacus, Census, Chatty, Counter, Echo, Narrator, Nothing, Tally, "
                           "alternating_counters, multiply, say_later"),
              std::string::npos)
        << missing;

    // one class or several (TRL's environment_factory={name: factory}), never both; several are TRL's
    std::string both = message([] { python_environment("Counter", "classes = { a = \"Abacus\" }"); });
    EXPECT_NE(both.find("give `class` (the environment) or `classes` (several, chosen by each row's `environment` column"),
              std::string::npos)
        << both;
    std::string grove_contract = message([] {
        grove::PluginHost host({grove::test::build_plugin_dir()});
        auto info = host.find("python_environment", GROVE_PLUGIN_KIND_ENVIRONMENT);
        const std::string config = "module = \"" + kModule + "\"\nclasses = { a = \"Counter\", b = \"Echo\" }\n";
        grove::Environment(grove::PluginInstance(info, grove::PluginConfig::from_toml_text(info, config, "test")));
    });
    EXPECT_NE(grove_contract.find("'Echo' has no reset(): several environments are TRL environment_factory classes"),
              std::string::npos)
        << grove_contract;

    std::string bad_kwargs = message([] { python_environment("Echo", "kwargs = { unknown = 1 }"); });
    EXPECT_NE(bad_kwargs.find("loading Echo from " + kModule + ": TypeError: Echo() takes no arguments"), std::string::npos)
        << bad_kwargs;

    auto echo = python_environment("Echo");
    auto batch = turns({"<say>x</say>"}, 1, 1, 7);
    batch.row_json[0] = "{\"scored\": false}";
    EXPECT_TRUE(std::isnan(echo.score_episodes(batch)[0])) << "None is NaN: no score";
}

// grove eval numbers every batch's episodes afresh: the instances of an earlier batch go back to the
// pool, so a batch of new episode numbers reuses them rather than making more (as TRL reuses its).
TEST(PythonEnvironment, ABatchReusesTheInstancesOfTheBatchBefore) {
    auto env = python_environment("Census");
    auto begin = [&](uint64_t first_episode, uint64_t seed) {
        grove::EnvironmentTurns waiting;
        waiting.seed = seed;
        for (uint64_t i = first_episode; i < first_episode + 3; ++i)
            waiting.add(i, 0, "", {}, false, "<|im_start|>user\nCount to 7<|im_end|>\n", "{\"target\": 7}",
                        "[{\"role\": \"user\", \"content\": \"Count to 7\"}]");
        return env.begin_episodes(waiting);
    };
    EXPECT_EQ(begin(0, 1), (std::vector<std::string>{"1 made", "2 made", "3 made"}));
    const std::vector<std::string> reused{"3 made", "3 made", "3 made"};
    EXPECT_EQ(begin(3, 2), reused) << "the second batch made instances of its own";
    EXPECT_EQ(begin(6, 3), reused);
    EXPECT_EQ(begin(0, 4), reused) << "episodes numbered as a batch before";
}

TEST(PythonEnvironment, ResetsBeforeGenerationAndItsTextJoinsThePrompt) {
    auto env = python_environment("Chatty");
    ASSERT_TRUE(env.begins_episodes());
    auto start = turns({"", ""}, 0, 21);
    EXPECT_EQ(env.begin_episodes(start), (std::vector<std::string>{"Your total starts at 0.", "Your total starts at 0."}));
    // the instances begin_episodes reset are the ones the episodes' tool calls reach
    auto first = turns({call("add", "{\"amount\": 7}") + "<|im_end|>", call("echo_prompt", "{}") + "<|im_end|>"}, 1, 21);
    EXPECT_EQ(env.step(first).observations, (std::vector<std::string>{tool_turn({"7"}), tool_turn({"Count to 7"})}));
    auto whole = turns({"", ""}, 1, 21);
    EXPECT_EQ(env.score_episodes(whole), (std::vector<float>{1.0f, 0.0f}));

    // through the host: the text joins the last user message, rendered again with the chat template
    const std::string rows = std::string(GROVE_TEST_BINARY_DIR) + "/python_environment_reset.jsonl";
    {
        std::ofstream out(rows);
        out << "{\"prompt\": [{\"role\": \"user\", \"content\": \"Count to 3. \"}], \"target\": 3}\n";
    }
    auto r = grove::test::run_grove(
        "generate --model " + std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/llama_gqa --input " + rows +
        " --chat-template chatml --max-new-tokens 8 --max-turns 2 --json --seed 1 " +
        "--environment python_environment --environment-config 'module = \"" + kModule + "\"\nclass = \"Chatty\"'");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    // after the system turn that describes its tools (tests/plugins/python/check_environment_tools.py)
    EXPECT_NE(r.out.find("</tool_call><|im_end|>\\n<|im_start|>user\\nCount to 3. Your total starts at 0.<|im_end|>\\n"
                         "<|im_start|>assistant\\n\""),
              std::string::npos)
        << r.out;
}

TEST(PythonEnvironment, EpisodesThroughTheHostSeeTheDatasetPromptAsMessages) {
    const std::string rows = std::string(GROVE_TEST_BINARY_DIR) + "/python_environment_prompt.jsonl";
    {
        std::ofstream out(rows);
        out << "{\"prompt\": [{\"role\": \"user\", \"content\": \"Say something\"}]}\n";
    }
    auto r = grove::test::run_grove("generate --model " + std::string(GROVE_TEST_BINARY_DIR) +
                                    "/models/tiny/llama_gqa --input " + rows +
                                    " --chat-template chatml --max-new-tokens 60 --max-turns 3 --json --seed 1 "
                                    "--environment python_environment --environment-config 'module = \"" +
                                    kModule + "\"\nclass = \"Narrator\"'");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    // the observation is context: its tokens are env_mask 0, and it quotes the prompt's first message
    EXPECT_NE(r.out.find("{\"role\":\"environment\",\"text\":\"[turn 1: Say something]\"}"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(",0,0,0,"), std::string::npos) << r.out;
}

TEST(PythonEnvironment, ToolsNeedAChatTemplateThatCanShowThem) {
    const std::string rows = std::string(GROVE_TEST_BINARY_DIR) + "/python_environment_plain.jsonl";
    {
        std::ofstream out(rows);
        out << "{\"prompt\": [{\"role\": \"user\", \"content\": \"Count to 3.\"}], \"target\": 3}\n";
    }
    auto r =
        grove::test::run_grove("generate --model " + std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/llama_gqa --input " +
                               rows + " --chat-template plain --max-new-tokens 4 --json --environment python_environment " +
                               "--environment-config 'module = \"" + kModule + "\"\nclass = \"Counter\"'");
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("which Grove writes only as Qwen's templates write them (the Hermes format: chatml, qwen3"),
              std::string::npos)
        << r.out;
}

namespace {
// The [environment] section and [[rewards]] of a manifest with this Python class, as the trainer reads them.
grove::RunConfig environment_config(const std::string& class_name, bool isolated, const std::string& more = "",
                                    const std::string& rewards = "[[rewards]]\nplugin = \"format\"\n") {
    const std::string text =
        "[model]\npath = \"m\"\n[data]\nsource = \"d.jsonl\"\n[environment]\nplugin = "
        "\"python_environment\"\nconfig = { module = \"" +
        kModule + "\", class = \"" + class_name + "\" }\n" + (isolated ? "isolation = \"process\"\n" : "") + more + rewards;
    return grove::RunConfig::from(grove::Manifest::parse(text, "/runs/grove.toml"));
}

std::unique_ptr<grove::Environment> make(const grove::RunConfig& c) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    return grove::make_environment(host, *c.environment.use, c.environment.reward, c.rewards, c.rewards.empty());
}
}  // namespace

// TRL adds an environment_factory class's get_reward() to the rewards, weight 1, named after the
// class (tests/plugins/python/check_environment_reward.py compares with TRL's trainer); the
// manifest's reward_weight and reward_name override both. Grove's contract in Python
// (score_episodes) counts when the manifest asks, as a C plugin's does.
TEST(PythonEnvironment, GetRewardIsARewardColumnNamedAfterTheClass) {
    for (bool isolated : {false, true}) {
        auto counter = make(environment_config("Counter", isolated));
        ASSERT_NE(counter->reward_column(), nullptr) << (isolated ? "in a worker" : "in process");
        EXPECT_EQ(counter->reward_column()->name, "Counter");
        EXPECT_EQ(counter->reward_column()->weight, 1.0);
    }
    auto renamed = make(environment_config("Counter", false, "reward_weight = 0.5\nreward_name = \"total\"\n"));
    ASSERT_NE(renamed->reward_column(), nullptr);
    EXPECT_EQ(renamed->reward_column()->name, "total");
    EXPECT_EQ(renamed->reward_column()->weight, 0.5);
    auto alone = make(environment_config("Counter", false, "", ""));
    EXPECT_NE(alone->reward_column(), nullptr) << "get_reward() alone is the run's reward";

    auto echo = make(environment_config("Echo", false));
    EXPECT_TRUE(echo->scores_episodes());
    EXPECT_EQ(echo->reward_column(), nullptr) << "score_episodes() became a reward without reward_weight";
    auto asked = make(environment_config("Echo", true, "reward_weight = 2.0\n"));
    ASSERT_NE(asked->reward_column(), nullptr);
    EXPECT_EQ(asked->reward_column()->name, "environment") << "Grove's contract: named as a C plugin's column";
    EXPECT_EQ(asked->reward_column()->weight, 2.0);

    const auto message = grove::test::error_message;
    const std::string narrator = message([] { make(environment_config("Narrator", false, "reward_weight = 1.0\n")); });
    EXPECT_NE(narrator.find("'python_environment'"), std::string::npos) << narrator;
    EXPECT_NE(narrator.find("does not score whole episodes"), std::string::npos) << narrator;
    EXPECT_FALSE(make(environment_config("Narrator", false))->scores_episodes());
    const std::string clash = message(
        [] { make(environment_config("Counter", false, "", "[[rewards]]\nplugin = \"format\"\nname = \"Counter\"\n")); });
    EXPECT_NE(clash.find("the environment's reward column \"Counter\" has the name of the reward at"), std::string::npos)
        << clash;
    const std::string none = message([] { make(environment_config("Abacus", false, "", "")); });
    EXPECT_NE(none.find("(Abacus) is no reward: error: no reward: add at least one [[rewards]] table"), std::string::npos)
        << none;
    const std::string name_alone = message([] { make(environment_config("Echo", false, "reward_name = \"heard\"\n")); });
    EXPECT_NE(name_alone.find("reward_name names the environment's reward column, but plugin 'python_environment'"),
              std::string::npos)
        << name_alone;
    EXPECT_NE(name_alone.find("is no reward unless reward_weight is set: set it too"), std::string::npos) << name_alone;
    // get_reward() inherited is the class's own, as TRL finds it on the class: named after the subclass
    auto chatty = make(environment_config("Chatty", false));
    ASSERT_NE(chatty->reward_column(), nullptr);
    EXPECT_EQ(chatty->reward_column()->name, "Chatty");
}

namespace {
bool python_is_loaded() {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line))
        if (line.find("libpython") != std::string::npos) return true;
    return false;
}
}  // namespace

// Grove loads every library in its plugin folders to find a plugin by name; the python plugins'
// library links no Python, so only a run that uses one loads libpython.
TEST(PythonEnvironment, ListingPluginsLoadsNoPythonUsingOneDoes) {
    ASSERT_FALSE(python_is_loaded()) << "this test process loaded Python before the test";
    grove::PluginHost host({grove::test::build_plugin_dir()});
    size_t python_plugins = 0;
    for (const auto& plugin : host.list()) python_plugins += plugin.name == "python" || plugin.name == "python_environment";
    EXPECT_EQ(python_plugins, 2u);
    EXPECT_FALSE(python_is_loaded()) << "listing the plugins loaded libpython";
    auto env = python_environment("Echo");
    EXPECT_TRUE(python_is_loaded());
}

// A Python environment in a worker process ([environment] isolation = "process"): it answers as in
// process, and when the interpreter itself crashes (a segfault) the error names the environment,
// the signal and the call, and this process goes on.
TEST(PythonEnvironment, ACrashInAWorkerProcessIsNamedAndTheRunSurvivesIt) {
    const std::string module = std::string(GROVE_TEST_SOURCE_DIR) + "/tests/plugins/python/crashing_environment.py";
    const std::string text =
        "[model]\npath = \"m\"\n[data]\nsource = \"d.jsonl\"\n[environment]\nplugin = "
        "\"python_environment\"\nconfig = { module = \"" +
        module + "\", class = \"Segfaults\" }\nisolation = \"process\"\ntimeout = 60\n[[rewards]]\nplugin = \"format\"\n";
    const grove::PluginUse use = *grove::RunConfig::from(grove::Manifest::parse(text, "/runs/grove.toml")).environment.use;
    grove::PluginHost host({grove::test::build_plugin_dir()});
    auto environment = grove::make_environment(host, use, {}, {}, false);
    EXPECT_EQ(environment->stop_strings(), (std::vector<std::string>{"</say>"}));
    auto fine = turns({"<say>a</say>", "<say>b</say>"}, 1, 1);
    EXPECT_EQ(environment->step(fine).observations, (std::vector<std::string>{"<heard/>", "<heard/>"}));
    auto crashing = turns({"<say>a</say>", "<say>crash</say>"}, 2, 1);
    crashing.step = 4;
    try {
        environment->step(crashing);
        ADD_FAILURE() << "no error";
    } catch (const grove::Error& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("[environment]: environment plugin 'python_environment'"), std::string::npos) << message;
        EXPECT_NE(message.find("crashed with signal 11 (Segmentation fault) while step for the episodes of "
                               "generation-batch rows 0 to 1 (step 4)"),
                  std::string::npos)
            << message;
    }
}

namespace {
// One [[rewards]] use of the python plugin with a function of tests/plugins/python/environment_rewards.py.
std::unique_ptr<grove::RewardSet> python_reward(grove::PluginHost& host, const std::string& function,
                                                const std::string& more = "") {
    const std::string text =
        "[model]\npath = \"m\"\n[data]\nsource = \"d.jsonl\"\n[[rewards]]\nplugin = \"python\"\n"
        "config = { module = \"" +
        std::string(GROVE_TEST_SOURCE_DIR) + "/tests/plugins/python/environment_rewards.py\", function = \"" + function +
        "\" }\n" + more;
    return std::make_unique<grove::RewardSet>(host,
                                              grove::RunConfig::from(grove::Manifest::parse(text, "/runs/grove.toml")).rewards);
}

// The reward rows rows first_row .. first_row + n - 1 of generation batch (step 0, seed).
std::vector<float> score_rows(const grove::RewardSet& reward, uint64_t first_row, size_t n, uint64_t seed) {
    grove::RewardRows rows;
    rows.num_generations = 1;
    rows.seed = seed;
    rows.global_row_offset = first_row;
    for (size_t i = 0; i < n; ++i) rows.add("Count to 7", "done", {1, 2}, false, "{\"target\": 7}");
    return reward.score(rows.view()).values[0];
}
}  // namespace

// TRL passes every reward function `environments`: the instance each completion's episode ran in,
// as the episode left it. Rows find their episodes by number (global_row_offset + i) in the
// generation batch of the same step and seed. A function requiring it without an environment in
// its process is refused when made.
TEST(PythonEnvironment, RewardFunctionsGetTheEnvironmentEachRowRanIn) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    auto given = python_reward(host, "given_environments");  // `environments` optional: made without one
    std::unique_ptr<grove::RewardSet> totals;
    {
        auto env = python_environment("Counter");  // first, as the hosts make it: totals requires it
        totals = python_reward(host, "totals");
        env.step(*std::make_unique<grove::EnvironmentTurns>(turns(
            {call("add", "{\"amount\": 2}") + "<|im_end|>", call("add", "{\"amount\": 5}") + "<|im_end|>", "No.<|im_end|>"}, 1,
            31)));
        EXPECT_EQ(score_rows(*totals, 0, 3, 31), (std::vector<float>{2.0f, 5.0f, 0.0f}));
        EXPECT_EQ(score_rows(*totals, 1, 2, 31), (std::vector<float>{5.0f, 0.0f})) << "rows 1 and 2 of the batch";
        const auto other_batch = score_rows(*totals, 0, 2, 32);
        EXPECT_TRUE(std::isnan(other_batch[0]) && std::isnan(other_batch[1])) << "no instance ran these rows: None";
        EXPECT_EQ(score_rows(*given, 0, 2, 31), (std::vector<float>{1.0f, 1.0f}));
    }
    {
        auto echo = python_environment("Echo");
        EXPECT_EQ(score_rows(*python_reward(host, "one_echo"), 5, 2, 1), (std::vector<float>{1.0f, 1.0f}))
            << "Grove's contract: the one object for every row";
    }
    // no python_environment in this process (none, or one in a worker): a function requiring
    // `environments` is refused when it is made, before any model loads, and one made while an
    // environment lived is told why at its next batch; one that does not require it runs without it
    EXPECT_EQ(score_rows(*given, 0, 2, 31), (std::vector<float>{0.0f, 0.0f}));
    auto isolated = make(environment_config("Counter", true));
    const std::string why =
        "it takes `environments` (TRL's environment instances, one per completion), which Grove "
        "passes only when the run's [environment] is a python_environment with a class running in the same process";
    const std::string refused = grove::test::error_message([&] { python_reward(host, "totals"); });
    EXPECT_NE(refused.find("function"), std::string::npos) << refused;
    EXPECT_NE(refused.find(why), std::string::npos) << refused;
    const std::string missing = grove::test::error_message([&] { score_rows(*totals, 0, 1, 31); });
    EXPECT_NE(missing.find("reward function totals"), std::string::npos) << missing;
    EXPECT_NE(missing.find(why), std::string::npos) << missing;
}

// A tool-using episode reaches a Python reward function as TRL's messages: the host's turns
// (grove_reward_batch.episode_turns), parsed by the bridge (check_episode_messages.py compares the
// messages with TRL's), in process and from a worker process alike. A row without turns, or whose
// observations are no tool turns (Grove's contract), is one assistant message as before.
TEST(PythonEnvironment, RewardFunctionsSeeAToolEpisodeAsTrlsMessages) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    const std::string prompt = "<|im_start|>user\nCount to 7<|im_end|>\n<|im_start|>assistant\n";
    const std::string messages = "[{\"role\": \"user\", \"content\": \"Count to 7\"}]";
    for (bool isolated : {false, true}) {
        auto reward = python_reward(host, "tool_messages", isolated ? "isolation = \"process\"\n" : "");
        grove::RewardRows rows;
        auto add = [&](const std::vector<std::string>& turns, bool episode = true) {
            rows.add(prompt, "the episode", {1, 2}, false, "{}");
            rows.prompt_json.push_back(messages);
            if (episode) rows.add_episode_turns(turns);
        };
        add({call("add", "{\"amount\": 2}") + call("add", "{\"amount\": 5}") + "<|im_end|>", tool_turn({"2", "7"}),
             "It is 7.<|im_end|>"});
        add({}, false);
        add({"<say>hi</say>", "<heard>hi</heard>", "bye<|im_end|>"});
        add({"It is 7.<|im_end|>"});
        EXPECT_EQ(reward->score(rows.view()).values[0], (std::vector<float>{2.0f, 0.0f, 0.0f, 0.0f}))
            << (isolated ? "in a worker" : "in process");
    }
}

// As TRL parses completions only when the run has tools: a one-turn episode is parsed when the
// prompt shows tools, and stays whole (the completion's text) when it does not, as a C
// environment's does; an ipython turn of free text is no tool turn, so its episode stays whole too.
TEST(PythonEnvironment, OnlyARunWithToolsParsesItsEpisodes) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    const std::string chatml = "<|im_start|>user\nCount to 7<|im_end|>\n<|im_start|>assistant\n";
    const std::string with_tools = "<|im_start|>system\n# Tools\n\n<tools>\n{}\n</tools><|im_end|>\n" + chatml;
    const std::string llama =
        "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nCount<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n";
    auto reward = python_reward(host, "parsed");
    grove::RewardRows rows;
    auto add = [&](const std::string& prompt, const std::vector<std::string>& turns) {
        rows.add(prompt, "the episode", {1, 2}, false, "{}");
        rows.prompt_json.push_back("[{\"role\": \"user\", \"content\": \"Count to 7\"}]");
        rows.add_episode_turns(turns);
    };
    add(with_tools, {"It is 7.<|im_end|>"});
    add(chatml, {"It is 7.<|im_end|>"});
    add(llama, {"{\"name\": \"add\", \"parameters\": {}}<|eot_id|>",
                "<|start_header_id|>ipython<|end_header_id|>\n\nnot JSON<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n",
                "Done.<|eot_id|>"});
    EXPECT_EQ(reward->score(rows.view()).values[0], (std::vector<float>{1.0f, 0.0f, 0.0f}));
}
