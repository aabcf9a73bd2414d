// Multi-turn episodes with an environment plugin (train/episodes.cpp) on the tiny checkpoint: the
// history stays in token space (the sampler's log-probabilities are the trainer's over the whole
// episode), observations are context, the budget and max_turns hold, and a failing environment is
// reported with its name and rows.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <toml++/toml.h>

#include "grove/environment_host.hpp"
#include "grove/episodes.hpp"
#include "grove/error.hpp"
#include "grove/generation.hpp"
#include "grove/model.hpp"
#include "grove/manifest.hpp"
#include "grove/reward_set.hpp"
#include "grove/run_config.hpp"
#include "plugin_test_support.hpp"
#include "grove/tokenizer.hpp"
#include "train/episodes.hpp"
#include "train/scoring.hpp"

namespace {
const std::string kModel = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/llama_gqa";

grove::Environment scripted(const std::string& config) {
    grove::PluginHost host({});
    auto info = host.find(GROVE_TEST_SCRIPTED_ENV_PLUGIN, GROVE_PLUGIN_KIND_ENVIRONMENT);
    return grove::Environment(grove::PluginInstance(info, grove::PluginConfig::from_toml_text(info, config, "test")));
}

struct Fixture {
    std::unique_ptr<grove::Model> model = grove::Model::load(kModel);
    std::unique_ptr<grove::Tokenizer> tokenizer = grove::Tokenizer::load(kModel);

    std::vector<grove::BatchRow> rows(int n) const {
        std::vector<grove::BatchRow> out;
        for (int i = 0; i < n; ++i) {
            grove::BatchRow r;
            r.prompt_text = "What is " + std::to_string(i) + " + 2?";
            r.prompt_ids = tokenizer->encode(r.prompt_text, true);
            r.columns_json = "{}";
            out.push_back(r);
        }
        return out;
    }
    grove::Rollout run(const grove::Environment& env, int n, int64_t max_turns, int64_t budget) const {
        grove::SamplingOptions o;
        o.eos_token_ids = {2};
        o.seed = 11;
        return grove::generate_episodes(*model, *tokenizer, env, rows(n), o, {max_turns, budget, 0}, 0);
    }
};

std::vector<int64_t> row_of(const at::Tensor& t, int64_t i, int64_t length) {
    at::Tensor c = t[i].narrow(0, 0, length).to(at::kLong).contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + length);
}
}  // namespace

TEST(Episodes, ObservationsAreContextAndTheSamplersLogprobsAreTheTrainers) {
    Fixture f;
    auto env = scripted("observation = \" ok\"\nstop = \"e\"\nturns = 3");
    auto rollout = f.run(env, 8, 3, 40);
    const auto& c = rollout.completions;
    const auto observation = f.tokenizer->encode(" ok", false);
    int64_t observed_rows = 0;
    for (int64_t i = 0; i < 8; ++i) {
        const int64_t n = c.lengths[size_t(i)];
        ASSERT_LE(n, 40);
        auto ids = row_of(c.completion_ids, i, n), model = row_of(rollout.model_token_mask, i, n);
        // every run of environment tokens is exactly the tokenized observation
        std::vector<int64_t> run;
        int64_t observations = 0;
        for (int64_t t = 0; t <= n; ++t) {
            if (t < n && model[size_t(t)] == 0) {
                run.push_back(ids[size_t(t)]);
                continue;
            }
            if (!run.empty()) {
                EXPECT_EQ(run, observation) << "row " << i;
                ++observations;
                run.clear();
            }
        }
        EXPECT_EQ(observations, rollout.episodes[size_t(i)].tool_calls);
        EXPECT_EQ(observations * int64_t(observation.size()), rollout.episodes[size_t(i)].observation_tokens);
        EXPECT_LE(rollout.episodes[size_t(i)].turns, 3);
        observed_rows += observations > 0;
    }
    ASSERT_GT(observed_rows, 0) << "no episode reached the environment: the test exercised nothing";

    // the trainer's log-probabilities of the whole episode, at the sampler's temperature (1): equal
    // on the model's tokens, so the history each turn was generated from is the completion itself
    at::Tensor prompt_ids = at::zeros({8, 8}, at::kLong), prompt_mask = at::zeros({8, 8}, at::kLong);
    auto rows = f.rows(8);
    for (int64_t i = 0; i < 8; ++i) {
        const int64_t p = int64_t(rows[size_t(i)].prompt_ids.size());
        prompt_ids[i].narrow(0, 8 - p, p).copy_(at::tensor(rows[size_t(i)].prompt_ids, at::kLong));
        prompt_mask[i].narrow(0, 8 - p, p).fill_(1);
    }
    at::Tensor trainer =
        grove::completion_logprobs(*f.model, prompt_ids, prompt_mask, c.completion_ids, c.completion_mask, 1.0);
    at::Tensor model_tokens = rollout.model_token_mask.to(at::kFloat);
    EXPECT_LT(((trainer - c.sampled_logprobs).abs() * model_tokens).max().item<double>(), 1e-4);
}

// Rewards see the whole episode and which of its tokens the environment wrote (ABI 1.4's
// model_token_mask): a reward counting the model's tokens gets the rollout's model-token counts, and
// its metric the observations' tokens.
TEST(Episodes, RewardsSeeWhichTokensTheEnvironmentWrote) {
    Fixture f;
    auto env = scripted("observation = \" ok\"\nstop = \"e\"\nturns = 3");
    auto rollout = f.run(env, 8, 3, 40);
    grove::PluginHost host({});
    grove::PluginUse use;
    use.plugin = GROVE_TEST_MODEL_TOKENS_PLUGIN;
    use.name = "model_tokens";
    use.config = std::make_shared<toml::table>();
    grove::RewardSet rewards(host, {use});
    auto scored = grove::score_rollout(rollout, rewards, *f.tokenizer, {4}, {});
    const auto model_counts = grove::model_token_counts(rollout);
    int64_t environment_tokens = 0;
    for (size_t i = 0; i < 8; ++i) {
        EXPECT_EQ(scored.rewards[0][i], float(model_counts[i])) << "row " << i;
        environment_tokens += rollout.completions.lengths[i] - model_counts[i];
    }
    ASSERT_GT(environment_tokens, 0) << "no episode has an observation: the test exercised nothing";
    EXPECT_NEAR(scored.plugin_metrics.at("rewards/model_tokens/environment_tokens"), double(environment_tokens) / 8, 1e-6);

    // the episode cut into its turns (ABI 1.10): one per run of one author, alternating from the
    // model's, whose texts together are the whole episode's (special tokens kept)
    auto metric_row = [&](const std::string& name) {
        for (size_t m = 0; m < scored.plugin_metric_names.size(); ++m)
            if (scored.plugin_metric_names[m] == "rewards/model_tokens/" + name) return scored.plugin_metric_rows[m];
        ADD_FAILURE() << "no metric " << name;
        return std::vector<double>(8, 0.0);
    };
    const auto turns = metric_row("turns"), bytes = metric_row("turn_bytes");
    const at::Tensor mask = rollout.model_token_mask.to(at::kLong);
    for (int64_t i = 0; i < 8; ++i) {
        const int64_t length = rollout.completions.lengths[size_t(i)];
        const auto ids = row_of(rollout.completions.completion_ids, i, length), authors = row_of(mask, i, length);
        int64_t runs = length > 0 ? 1 : 0;
        for (int64_t t = 1; t < length; ++t) runs += authors[size_t(t)] != authors[size_t(t - 1)];
        EXPECT_EQ(turns[size_t(i)], double(std::max<int64_t>(runs, 1))) << "row " << i;
        EXPECT_EQ(bytes[size_t(i)], double(f.tokenizer->decode(ids, false).size())) << "row " << i;
    }
    const std::vector<std::string> texts = grove::reward_turn_texts({5, 6, 7}, {0, 1, 1}, *f.tokenizer);
    ASSERT_EQ(texts.size(), 3u) << "the environment's tokens first: an empty model turn before them";
    EXPECT_EQ(texts[0], "");
    EXPECT_EQ(texts[1], f.tokenizer->decode({5}, false));
    EXPECT_EQ(grove::reward_turn_texts({}, {}, *f.tokenizer), std::vector<std::string>{""}) << "an episode has its first turn";
}

// An observation that does not fit in what is left of the budget is left out whole and ends the
// episode, as TRL 1.16 rolls back a tool result that would pass max_completion_length; one that fits
// is kept whole. No episode ends in part of an observation.
TEST(Episodes, AnObservationPastTheBudgetIsDroppedWholeAndEndsTheEpisode) {
    Fixture f;
    std::string long_observation;
    for (int i = 0; i < 40; ++i) long_observation += " ok";
    auto never_fits = f.run(scripted("observation = \"" + long_observation + "\"\nstop = \"e\"\nturns = 3"), 8, 3, 12);
    int64_t dropped = 0;
    for (int64_t i = 0; i < 8; ++i) {
        const int64_t n = never_fits.completions.lengths[size_t(i)];
        const grove::EpisodeStats& e = never_fits.episodes[size_t(i)];
        EXPECT_LE(n, 12);
        EXPECT_EQ(e.observation_tokens, 0) << "row " << i;
        EXPECT_EQ(never_fits.model_token_mask[i].narrow(0, 0, n).sum().item<int64_t>(), n) << "row " << i;
        EXPECT_EQ(e.observation_dropped, e.tool_calls > 0) << "row " << i;
        if (e.observation_dropped) EXPECT_EQ(e.turns, 1) << "row " << i << ": the dropped observation ends it";
        dropped += e.observation_dropped;
    }
    ASSERT_GT(dropped, 0) << "no episode reached the environment: the test exercised nothing";
    EXPECT_DOUBLE_EQ(grove::episode_metrics(never_fits, nullptr)["episodes/dropped_observation_ratio"], double(dropped) / 8.0);

    const std::string short_observation = " ok";
    const auto observation = f.tokenizer->encode(short_observation, false);
    auto some_fit = f.run(scripted("observation = \"" + short_observation + "\"\nstop = \"e\"\nturns = 4"), 8, 4, 12);
    int64_t kept = 0;
    dropped = 0;
    for (int64_t i = 0; i < 8; ++i) {
        const int64_t n = some_fit.completions.lengths[size_t(i)];
        const grove::EpisodeStats& e = some_fit.episodes[size_t(i)];
        EXPECT_LE(n, 12);
        EXPECT_EQ(e.observation_tokens % int64_t(observation.size()), 0) << "row " << i << ": observations are whole";
        if (e.observation_dropped) EXPECT_GT(n + int64_t(observation.size()), 12) << "row " << i << ": it would fit";
        kept += e.observation_tokens > 0;
        dropped += e.observation_dropped;
    }
    EXPECT_GT(kept, 0) << "no observation fitted: the test exercised half of the rule";
    EXPECT_GT(dropped, 0) << "every observation fitted: the test exercised half of the rule";
}

// ... and so is one that fits the budget but would bring the sequence (prompt, episode so far and
// observation) to the model's max_position_embeddings, as TRL drops a tool result at max_model_len.
TEST(Episodes, AnObservationReachingTheModelsContextIsDroppedToo) {
    Fixture f;
    const int64_t context = f.model->config().max_position_embeddings;
    ASSERT_EQ(context, 256) << "the tiny checkpoint's; the sizes below assume it";
    const auto rows = f.rows(8);
    int64_t shortest_prompt = context;
    for (const auto& r : rows) shortest_prompt = std::min(shortest_prompt, int64_t(r.prompt_ids.size()));
    // an observation that reaches the context after any turn, and a budget it fits after a short one
    std::string text;
    while (int64_t(f.tokenizer->encode(text, false).size()) < context - shortest_prompt - 1) text += " ok";
    const int64_t observation = int64_t(f.tokenizer->encode(text, false).size()), budget = observation + 8;
    auto rollout = f.run(scripted("observation = \"" + text + "\"\nstop = \"e\"\nturns = 2"), 8, 2, budget);
    int64_t only_the_context = 0;
    for (int64_t i = 0; i < 8; ++i) {
        const grove::EpisodeStats& e = rollout.episodes[size_t(i)];
        const int64_t n = rollout.completions.lengths[size_t(i)];
        EXPECT_EQ(e.observation_tokens, 0) << "row " << i;
        EXPECT_EQ(e.observation_dropped, e.tool_calls > 0) << "row " << i;
        const int64_t prompt = int64_t(rows[size_t(i)].prompt_ids.size());
        if (e.observation_dropped && n + observation <= budget) {
            EXPECT_GE(prompt + n + observation, context) << "row " << i;
            ++only_the_context;
        }
    }
    EXPECT_GT(only_the_context, 0) << "no observation fitted the budget: the context rule was not exercised";
}

TEST(Episodes, OneTurnNeverCallsTheEnvironmentAndAFailingOneNamesItsRows) {
    Fixture f;
    auto failing = scripted("stop = \"e\"\nfail_at_turn = 1");
    auto single = f.run(failing, 4, 1, 20);
    EXPECT_EQ(single.model_token_mask.sum().item<int64_t>(), single.completions.completion_mask.sum().item<int64_t>());
    try {
        f.run(failing, 4, 2, 20);
        FAIL() << "the environment's error was not reported";
    } catch (const grove::Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("scripted_env"), std::string::npos) << what;
        EXPECT_NE(what.find("scripted failure at turn 1"), std::string::npos) << what;
        EXPECT_NE(what.find("generation-batch rows"), std::string::npos) << what;
    }
}

TEST(Episodes, StopStringsCutATurnAfterTheTokenThatCompletesThem) {
    Fixture f;
    auto ids = f.tokenizer->encode("Hello world, hello there.", false);
    const size_t cut = grove::cut_at_stop_string(*f.tokenizer, ids, {"world"});
    ASSERT_LT(cut, ids.size());
    auto text = [&](size_t n) { return f.tokenizer->decode(std::vector<int64_t>(ids.begin(), ids.begin() + long(n)), false); };
    EXPECT_NE(text(cut).find("world"), std::string::npos);
    EXPECT_EQ(text(cut - 1).find("world"), std::string::npos);
    EXPECT_EQ(grove::cut_at_stop_string(*f.tokenizer, ids, {"absent"}), ids.size());
    EXPECT_EQ(grove::cut_at_stop_string(*f.tokenizer, ids, {}), ids.size());
}

// max_turns: an episode whose last allowed turn still ended at a stop string (it wanted the tool
// again) counts in episodes/max_turns_ratio; one that ended with EOS or the budget does not.
TEST(Episodes, EpisodesStillCallingAtTheirLastTurnCountAsHittingMaxTurns) {
    Fixture f;
    auto rollout = f.run(scripted("stop = \"e\"\nturns = 10"), 8, 2, 40);
    int64_t hit = 0;
    for (int64_t i = 0; i < 8; ++i) {
        const auto& e = rollout.episodes[size_t(i)];
        const int64_t n = rollout.completions.lengths[size_t(i)];
        const int64_t last = rollout.completions.completion_ids[i][n - 1].item<int64_t>();
        EXPECT_LE(e.turns, 2);
        EXPECT_EQ(e.hit_max_turns, e.turns == 2 && last != 2 && n < 40) << "row " << i;
        hit += e.hit_max_turns;
    }
    EXPECT_GT(hit, 0);
    EXPECT_DOUBLE_EQ(grove::episode_metrics(rollout, nullptr)["episodes/max_turns_ratio"], double(hit) / 8.0);
}

// Without a turn limit ([environment] max_turns unset, TRL's max_tool_calling_iterations = None)
// an episode ends when the environment is done (here after 6 model turns), at EOS or when the budget
// is spent: some run past the 4 turns that were once the default, and none counts as hitting a limit.
TEST(Episodes, WithoutATurnLimitTheEnvironmentEosOrTheBudgetEndsAnEpisode) {
    Fixture f;
    const int64_t budget = 200;
    auto rollout = f.run(scripted("stop = \"e\"\nturns = 6"), 8, grove::kNoTurnLimit, budget);
    int64_t longest = 0;
    for (int64_t i = 0; i < 8; ++i) {
        const auto& e = rollout.episodes[size_t(i)];
        const int64_t n = rollout.completions.lengths[size_t(i)];
        const bool eos = rollout.completions.completion_ids[i][n - 1].item<int64_t>() == 2;
        EXPECT_TRUE(e.turns == 6 || eos || n >= budget) << "row " << i << ": " << e.turns << " turns, " << n << " tokens";
        EXPECT_FALSE(e.hit_max_turns) << "row " << i;
        longest = std::max(longest, e.turns);
    }
    EXPECT_EQ(longest, 6);
    EXPECT_EQ(grove::EpisodeLimits{}.max_turns, grove::kNoTurnLimit);
}

// An environment whose tools_json() is an empty list has no tools, as TRL renders GRPO prompts with
// `tools or None` (Llama 3.1's template would write its tool-use turn for an empty list).
TEST(Episodes, AnEmptyToolListIsNoTools) {
    EXPECT_EQ(scripted("tools = \"[]\"").tools_json(), "");
    const std::string tools = R"([{"type": "function", "function": {"name": "add"}}])";
    EXPECT_EQ(scripted("tools = '" + tools + "'").tools_json(), tools);
}

// SDK 1.11: an environment that is several gives each row the tools its dataset column names (TRL's
// environment_factory={name: factory}); an empty list is no tools, and a row that names none of them
// is refused, naming the row (check_several_environments.py compares the prompts with TRL's).
TEST(Episodes, SeveralEnvironmentsGiveEachRowItsOwnTools) {
    const std::string add = R"([{"type": "function", "function": {"name": "add", "description": "Adds."}}])";
    const auto several = scripted(R"(tools = '{"select_by": "environment", "tools": {"math": )" + add + R"(, "chat": []}}')");
    EXPECT_EQ(several.tools_for(R"({"environment": "math", "target": 3})", "rows.jsonl:1"),
              R"([{"type":"function","function":{"name":"add","description":"Adds."}}])")
        << "the schema's keys keep the plugin's order";
    EXPECT_EQ(several.tools_for(R"({"environment": "chat"})", "rows.jsonl:2"), "");
    const auto refusal = [&](const std::string& columns) {
        return grove::test::error_message([&] { several.tools_for(columns, "rows.jsonl:3"); });
    };
    EXPECT_CONTAINS(refusal(R"({"target": 3})"), "rows.jsonl:3: environment plugin");
    EXPECT_CONTAINS(refusal(R"({"target": 3})"),
                    "\"environment\" column, which this row lacks; give it one of \"chat\", \"math\"");
    EXPECT_CONTAINS(refusal(R"({"environment": "game"})"), "rows.jsonl:3: \"environment\" is \"game\", which is none of");
    EXPECT_CONTAINS(refusal(R"({"environment": 2})"), "which this row does not give as text");
    EXPECT_EQ(scripted("tools = '" + add + "'").tools_for(R"({"environment": "game"})", "rows.jsonl:4"), add)
        << "one environment's tools are every row's, whatever its columns";
    const std::string malformed =
        grove::test::error_message([] { scripted(R"(tools = '{"select_by": "environment", "tools": {"math": {}}}')"); });
    EXPECT_CONTAINS(malformed, "tools_json()'s tools for \"math\" are not a JSON array of tool schemas");
    const std::string neither = grove::test::error_message([] { scripted(R"(tools = '{"tools": []}')"); });
    EXPECT_CONTAINS(neither, "tools_json() gave neither a JSON array of tool schemas nor");
}

namespace {
// make_environment for the scripted plugin: the [environment] table's lines after `plugin`, and
// the [[rewards]] tables.
std::unique_ptr<grove::Environment> scripted_run(const std::string& environment, const std::string& rewards) {
    const std::string text = "[model]\npath = \"m\"\n[data]\nsource = \"d.jsonl\"\n[environment]\nplugin = \"" +
                             std::string(GROVE_TEST_SCRIPTED_ENV_PLUGIN) + "\"\n" + environment + rewards;
    const auto c = grove::RunConfig::from(grove::Manifest::parse(text, "/runs/grove.toml"));
    grove::PluginHost host({});
    return grove::make_environment(host, *c.environment.use, c.environment.reward, c.rewards, c.rewards.empty());
}
}  // namespace

// SDK 1.12: several environments may name a reward column each ("reward_names"), as TRL logs one per
// environment class with get_reward(): each row's score goes to its value's column (values sharing a
// name share it), a row of a value without one to none; the manifest's reward_name makes them one.
TEST(Episodes, SeveralEnvironmentsNameARewardColumnEach) {
    const std::string config =
        R"(config = { judgement = "as_reward", tools = '{"select_by": "environment", "tools": {"math": [], "chat": [], )"
        R"("game": [], "quiz": []}, "reward_names": {"math": "Math", "game": "Game", "quiz": "Math"}}' })"
        "\n";
    const std::string format = "[[rewards]]\nplugin = \"format\"\n";
    const auto split = scripted_run(config + "reward_weight = 0.5\n", format);
    ASSERT_EQ(split->reward_columns().size(), 2u);
    EXPECT_EQ(split->reward_columns()[0].name, "Game") << "in the order of the values";
    EXPECT_EQ(split->reward_columns()[1].name, "Math");
    EXPECT_EQ(split->reward_columns()[1].weight, 0.5);
    EXPECT_EQ(split->reward_column_of(R"({"environment": "math", "n": 1})"), 1u);
    EXPECT_EQ(split->reward_column_of(R"({"environment": "quiz"})"), 1u);
    EXPECT_EQ(split->reward_column_of(R"({"environment": "game"})"), 0u);
    EXPECT_EQ(split->reward_column_of(R"({"environment": "chat"})"), grove::Environment::no_column);

    const auto one = scripted_run(config + "reward_name = \"judge\"\n", format);
    ASSERT_EQ(one->reward_columns().size(), 1u);
    EXPECT_EQ(one->reward_columns()[0].name, "judge");
    EXPECT_EQ(one->reward_column_of(R"({"environment": "chat"})"), 0u) << "one column holds every row's score";

    const std::string clash =
        grove::test::error_message([&] { scripted_run(config, "[[rewards]]\nplugin = \"format\"\nname = \"Math\"\n"); });
    EXPECT_CONTAINS(clash, "the environment's reward column \"Math\" has the name of the reward at");
    EXPECT_CONTAINS(clash, "rename that reward (its `name`), or set reward_name to make the environments' columns one");
    // a name for a value no row can have, or an empty name, is the plugin's mistake
    for (const std::string& names : {std::string(R"({"dice": "Dice"})"), std::string(R"({"math": ""})")})
        EXPECT_CONTAINS(
            grove::test::error_message([&] {
                scripted(R"(tools = '{"select_by": "environment", "tools": {"math": []}, "reward_names": )" + names + "}'");
            }),
            "each key must be a value of \"tools\" and each name a reward column's")
            << names;
}
