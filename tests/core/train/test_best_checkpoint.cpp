// train.metric_for_best_model, greater_is_better, load_best_model_at_end and save_total_limit's
// rotation, each decided as transformers decides it: the cases go through transformers' own
// TrainingArguments, Trainer._determine_best_metric and Trainer._rotate_checkpoints
// (transformers_best_checkpoint.py), and Grove's answers must be the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grove/error.hpp"
#include "grove/manifest.hpp"
#include "grove/run_config.hpp"
#include "plugin_test_support.hpp"
#include "train/best_checkpoint.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
const std::string kHeldOut = R"(
[model]
path = "models/tiny"
[data]
source = "prompts.jsonl"
eval_source = "held_out.jsonl"
[[rewards]]
plugin = "correctness"
)";

// TrainingArguments' keyword arguments as manifest settings
std::vector<std::string> overrides_of(const json& kwargs) {
    const std::map<std::string, std::string> keys = {{"save_strategy", "output.save_strategy"},
                                                     {"save_steps", "output.save_steps"},
                                                     {"eval_strategy", "train.eval_strategy"},
                                                     {"eval_steps", "train.eval_steps"},
                                                     {"load_best_model_at_end", "train.load_best_model_at_end"},
                                                     {"metric_for_best_model", "train.metric_for_best_model"},
                                                     {"greater_is_better", "train.greater_is_better"}};
    std::vector<std::string> overrides;
    for (const auto& [name, value] : kwargs.items()) overrides.push_back(keys.at(name) + "=" + value.dump());
    return overrides;
}

// transformers' answers to `cases` (transformers_best_checkpoint.py)
json transformers_answers(const json& cases) {
    const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/best_checkpoint";
    fs::create_directories(dir);
    std::ofstream(dir + "/cases.json") << cases.dump();
    const auto r = grove::test::run_command(std::string(GROVE_PYTHON) + " " + GROVE_TEST_SOURCE_DIR +
                                            "/tests/core/train/transformers_best_checkpoint.py " + dir + "/cases.json " + dir +
                                            "/answers.json 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    std::ifstream in(dir + "/answers.json");
    return json::parse(in);
}
}  // namespace

TEST(BestCheckpoint, SettingsNewBestsAndRotationAreTransformers) {
    const json settings = json::array({
        json::object(),
        {{"load_best_model_at_end", true}, {"eval_strategy", "steps"}, {"eval_steps", 5}, {"save_steps", 10}},
        {{"load_best_model_at_end", true}, {"eval_strategy", "steps"}, {"eval_steps", 5}, {"save_steps", 7}},
        {{"load_best_model_at_end", true}, {"eval_strategy", "steps"}, {"eval_steps", 0.1}, {"save_steps", 0.3}},
        {{"load_best_model_at_end", true}, {"eval_strategy", "steps"}, {"eval_steps", 0.1}, {"save_steps", 0.25}},
        {{"load_best_model_at_end", true}, {"eval_strategy", "steps"}, {"eval_steps", 0.1}, {"save_steps", 10}},
        {{"load_best_model_at_end", true}, {"eval_strategy", "steps"}, {"eval_steps", 0.25}, {"save_steps", 1}},
        {{"load_best_model_at_end", true}, {"eval_strategy", "steps"}, {"eval_steps", 0.3}, {"save_steps", 1}},
        {{"load_best_model_at_end", true}, {"eval_strategy", "epoch"}, {"save_strategy", "steps"}},
        {{"load_best_model_at_end", true}, {"eval_strategy", "epoch"}, {"save_strategy", "epoch"}},
        {{"load_best_model_at_end", true}, {"eval_strategy", "steps"}, {"save_steps", 20}},  // eval_steps: logging_steps (10)
        {{"load_best_model_at_end", true}, {"eval_strategy", "steps"}, {"save_steps", 15}},
        {{"save_strategy", "best"}, {"metric_for_best_model", "reward"}, {"eval_strategy", "steps"}, {"eval_steps", 5}},
        {{"save_strategy", "best"}, {"eval_strategy", "steps"}, {"eval_steps", 5}},
        {{"save_strategy", "best"}, {"load_best_model_at_end", true}, {"eval_strategy", "steps"}, {"eval_steps", 5}},
        {{"metric_for_best_model", "eval_reward"}, {"eval_strategy", "steps"}, {"eval_steps", 5}},
        {{"metric_for_best_model", "rewards/accuracy/mean"}, {"greater_is_better", false}, {"eval_strategy", "epoch"}},
        {{"metric_for_best_model", "loss"}, {"greater_is_better", true}, {"eval_strategy", "epoch"}},
    });
    // where transformers lets a setting do nothing without a word, Grove refuses it
    const json refused_by_grove_alone = json::array({
        {{"metric_for_best_model", "reward"}},                        // never evaluated: nothing compared
        {{"greater_is_better", true}},                                // no metric to compare
        {{"load_best_model_at_end", true}, {"save_strategy", "no"}},  // never evaluated, never saved
    });
    json evaluations = json::array();
    for (bool greater : {false, true})
        for (const json& values : {json::array({3.0, 2.0, 2.0, 1.0, 4.0, 4.5, 0.9, 0.95}),
                                   json::array({-1.0, -1.0, 0.5, 0.25, 0.5, 0.6, 0.65, 0.3})})
            for (const auto& [patience, threshold] :
                 std::vector<std::pair<json, double>>{{nullptr, 0.0}, {1, 0.0}, {2, 0.0}, {2, 0.08}, {3, 1.5}})
                evaluations.push_back(
                    {{"greater_is_better", greater}, {"values", values}, {"patience", patience}, {"threshold", threshold}});
    json rotations = json::array();
    for (const json& steps : {json::array({2, 4, 6, 8, 10, 12}), json::array({5}), json::array({3, 9})})
        for (int limit : {1, 2, 3, 5, 6})
            for (const json& best : {json(nullptr), json(2), json(3), json(4), json(8), json(10), json(12), json(7)})
                rotations.push_back({{"steps", steps}, {"limit", limit}, {"best", best}});
    json all_settings = settings;
    for (const json& s : refused_by_grove_alone) all_settings.push_back(s);
    const json answers =
        transformers_answers({{"settings", all_settings}, {"evaluations", evaluations}, {"rotations", rotations}});
    ASSERT_TRUE(answers.is_object());

    auto grove_settings = [](const json& kwargs) {
        return grove::RunConfig::from(grove::Manifest::parse(kHeldOut, "/runs/exp/grove.toml", overrides_of(kwargs)))
            .train.best_model;
    };
    size_t errors = 0;
    for (size_t i = 0; i < settings.size(); ++i) {
        const json& expected = answers["settings"][i];
        SCOPED_TRACE(settings[i].dump() + " -> transformers: " + expected.dump());
        if (expected.contains("error")) {
            ++errors;
            const std::string message = grove::test::error_message([&] { grove_settings(settings[i]); });
            EXPECT_NE(message.find("/runs/exp/grove.toml: "), std::string::npos) << message;
            EXPECT_TRUE(message.find("train.") != std::string::npos || message.find("output.") != std::string::npos)
                << "names the key: " << message;
            continue;
        }
        const grove::BestModelSettings grove = grove_settings(settings[i]);
        if (expected["metric_for_best_model"].is_null()) {
            EXPECT_FALSE(grove.metric);
            continue;
        }
        const std::string metric = expected["metric_for_best_model"];
        EXPECT_EQ(grove.metric.value_or("(unset)"), metric.rfind("eval_", 0) == 0 ? metric : "eval_" + metric);
        EXPECT_EQ(grove.greater_is_better, expected["greater_is_better"].get<bool>());
    }
    EXPECT_GE(errors, 7u) << "the refused cases are refused by transformers too";
    for (size_t i = 0; i < refused_by_grove_alone.size(); ++i) {
        SCOPED_TRACE(refused_by_grove_alone[i].dump());
        EXPECT_FALSE(answers["settings"][settings.size() + i].contains("error")) << "transformers takes it";
        EXPECT_NE(grove::test::error_message([&] { grove_settings(refused_by_grove_alone[i]); }).find("grove.toml: "),
                  std::string::npos);
    }

    size_t stops = 0;
    for (size_t i = 0; i < evaluations.size(); ++i) {
        grove::BestModelSettings s;
        s.metric = "eval_m";
        s.greater_is_better = evaluations[i]["greater_is_better"];
        if (!evaluations[i]["patience"].is_null()) s.early_stopping_patience = evaluations[i]["patience"].get<int64_t>();
        s.early_stopping_threshold = evaluations[i]["threshold"];
        grove::BestSoFar best;
        std::vector<std::vector<bool>> found;
        int64_t step = 0;
        for (const json& value : evaluations[i]["values"]) {
            const auto outcome = grove::record_evaluation(s, {{"eval_m", value.get<double>()}}, ++step, best);
            found.push_back({outcome.new_best, outcome.stop_early});
            stops += outcome.stop_early;
            if (outcome.stop_early) break;  // the run ends there
        }
        auto expected = answers["evaluations"][i].get<std::vector<std::vector<bool>>>();
        expected.resize(std::min(expected.size(), found.size()));
        EXPECT_EQ(found, expected) << evaluations[i].dump();
    }
    EXPECT_GT(stops, 10u) << "the cases stop early in places";

    size_t kept_best_by_moving = 0;
    for (size_t i = 0; i < rotations.size(); ++i) {
        const json& r = rotations[i];
        const auto deleted = grove::checkpoints_beyond_limit(
            r["steps"].get<std::vector<int64_t>>(), r["limit"],
            r["best"].is_null() ? std::nullopt : std::optional<int64_t>(r["best"].get<int64_t>()));
        const auto expected = answers["rotations"][i].get<std::vector<int64_t>>();
        EXPECT_EQ(deleted, expected) << r.dump();
        if (!r["best"].is_null() && r["best"] == 2 && r["limit"] == 2 && r["steps"].size() == 6) ++kept_best_by_moving;
    }
    EXPECT_EQ(kept_best_by_moving, 1u);
}

// A metric the evaluation does not log is named with the ones it does, before any step runs.
TEST(BestCheckpoint, AMetricTheEvaluationDoesNotLogIsRefusedWithTheOnesItDoes) {
    grove::BestModelSettings s;
    s.metric = "eval_loss";
    const std::string message = grove::test::error_message(
        [&] { grove::check_metric_is_evaluated(s, {"eval_reward", "eval_rewards/correctness/mean"}, "/runs/exp/grove.toml"); });
    EXPECT_NE(message.find("/runs/exp/grove.toml: train.metric_for_best_model = \"loss\": the run's evaluation logs no "
                           "eval_loss; it logs reward, rewards/correctness/mean"),
              std::string::npos)
        << message;
    EXPECT_NO_THROW(grove::check_metric_is_evaluated(s, {"eval_reward", "eval_loss"}, "x"));
    grove::BestSoFar best;
    EXPECT_NE(grove::test::error_message([&] {
                  grove::record_evaluation(s, {{"eval_reward", 1.0}}, 3, best);
              }).find("logs no eval_loss; it logs reward"),
              std::string::npos);
}
