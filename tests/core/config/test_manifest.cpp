// The manifest: TRL defaults, strict keys with positions and suggestions, types, ranges, batch
// arithmetic, --set overrides, relative paths, and the generated reference in docs/.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <toml++/toml.h>
#include <unistd.h>

#include "grove/error.hpp"
#include "grove/hub_cache.hpp"
#include "grove/manifest.hpp"
#include "grove/run_config.hpp"

#include "plugin_test_support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kMinimal = R"(
[model]
path = "models/tiny"

[data]
source = "prompts.jsonl"

[[rewards]]
plugin = "correctness"
)";

std::string manifest_error(const std::string& text, const std::vector<std::string>& overrides = {},
                           grove::ErrorKind kind = grove::ErrorKind::manifest) {
    try {
        grove::Manifest::parse(text, "/runs/exp/grove.toml", overrides);
    } catch (const grove::Error& e) {
        EXPECT_EQ(int(e.kind()), int(kind)) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "manifest accepted";
    return "";
}

}  // namespace

TEST(Manifest, DefaultsFollowTrl) {
    auto m = grove::Manifest::parse(kMinimal, "/runs/exp/grove.toml");
    EXPECT_EQ(m.integer("generation.num_generations"), 8);
    EXPECT_EQ(m.integer("generation.max_completion_length"), 512);
    EXPECT_DOUBLE_EQ(m.number("generation.temperature"), 1.0);
    EXPECT_EQ(m.integer("generation.top_k"), 0);
    EXPECT_DOUBLE_EQ(m.number("loss.beta"), 0.0);
    EXPECT_DOUBLE_EQ(m.number("loss.epsilon"), 0.2);
    EXPECT_DOUBLE_EQ(m.number("loss.epsilon_high"), 0.2);  // unset -> epsilon
    EXPECT_FALSE(m.optional_number("loss.delta").has_value());
    EXPECT_EQ(m.string("loss.scale_rewards"), "group");
    EXPECT_EQ(m.reduction().plugin, "dapo");
    EXPECT_EQ(m.adapter().plugin, "full");
    // unset: GRPOConfig's 1e-6 for grove train, SFTConfig's 2e-5 for grove sft; SFTConfig's data options
    EXPECT_FALSE(m.optional_number("train.learning_rate").has_value());
    EXPECT_DOUBLE_EQ(grove::RunConfig::from(m).train.learning_rate, 1e-6);
    const auto sft = grove::RunConfig::from(m, grove::RunConfig::Kind::sft);
    EXPECT_DOUBLE_EQ(sft.train.learning_rate, 2e-5);
    EXPECT_EQ(sft.sft.max_length, 1024);
    EXPECT_FALSE(sft.sft.keep_end);
    EXPECT_TRUE(sft.sft.completion_only_loss);
    EXPECT_EQ(sft.data.text_column, "text");
    // unset: no turn limit, as TRL's max_tool_calling_iterations = None
    EXPECT_FALSE(m.optional_integer("environment.max_turns").has_value());
    EXPECT_EQ(grove::RunConfig::from(m).environment.max_turns, grove::kNoTurnLimit);
    auto set = grove::Manifest::parse(kMinimal + "\n[train]\nlearning_rate = 3e-4\n", "/runs/exp/grove.toml");
    EXPECT_DOUBLE_EQ(grove::RunConfig::from(set, grove::RunConfig::Kind::sft).train.learning_rate, 3e-4);
    EXPECT_EQ(m.integer("train.per_device_train_batch_size"), 8);
    EXPECT_EQ(m.integer("train.steps_per_generation"), 1);   // = gradient_accumulation_steps
    EXPECT_EQ(m.integer("train.generation_batch_size"), 8);  // = 8 x 1 process x 1
    EXPECT_DOUBLE_EQ(m.number("train.max_grad_norm"), 1.0);
    EXPECT_EQ(m.string("train.lr_scheduler_type"), "linear");
    EXPECT_EQ(m.integer("train.seed"), 42);
    EXPECT_EQ(m.integer("logging.logging_steps"), 10);
    ASSERT_EQ(m.rewards().size(), 1u);
    EXPECT_EQ(m.rewards()[0].name, "correctness");
    EXPECT_DOUBLE_EQ(m.rewards()[0].weight, 1.0);
}

TEST(Manifest, RelativePathsResolveAgainstTheManifestFolder) {
    auto m = grove::Manifest::parse(kMinimal + "\n[output]\ndir = \"../out\"\n", "/runs/exp/grove.toml");
    EXPECT_EQ(m.string("model.path"), "/runs/exp/models/tiny");
    EXPECT_EQ(m.string("data.source"), "/runs/exp/prompts.jsonl");
    EXPECT_EQ(m.string("output.dir"), "/runs/out");
    auto builtin = grove::Manifest::parse(kMinimal, "/runs/exp/grove.toml", {"data.source=builtin:arithmetic"});
    EXPECT_EQ(builtin.string("data.source"), "builtin:arithmetic");
}

TEST(Manifest, PromptsComeFromTheDataRolloutsOrAnEnvironmentWithMaxSteps) {
    const std::string without_data = "[model]\npath = \"m\"\n[[rewards]]\nplugin = \"correctness\"\n";
    const std::string environment = "[environment]\nplugin = \"python_environment\"\n";
    auto missing = manifest_error(without_data);
    EXPECT_CONTAINS(missing, "missing data.source");
    EXPECT_CONTAINS(missing, "or an [environment] that writes the prompts (with train.max_steps)");
    // as TRL without a train_dataset: the environment owns the data, and only max_steps ends the run
    auto epochs = manifest_error(without_data + environment);
    EXPECT_CONTAINS(epochs, "/runs/exp/grove.toml");
    EXPECT_CONTAINS(epochs, "set train.max_steps");
    auto m = grove::Manifest::parse(without_data + environment + "[train]\nmax_steps = 3\n", "/runs/exp/grove.toml");
    EXPECT_FALSE(m.optional_string("data.source"));
}

TEST(Manifest, UnknownKeyHasLineColumnAndSuggestion) {
    auto message = manifest_error(kMinimal + "\n[generation]\ntemprature = 0.7\n");
    EXPECT_CONTAINS(message, "/runs/exp/grove.toml:12:1: error: unknown key 'temprature' in [generation]");
    EXPECT_CONTAINS(message, "did you mean 'temperature'?");
}

TEST(Manifest, UnknownSectionHasSuggestion) {
    auto message = manifest_error(kMinimal + "\n[genration]\nnum_generations = 4\n");
    EXPECT_CONTAINS(message, "unknown section or key 'genration'");
    EXPECT_CONTAINS(message, "did you mean 'generation'?");
}

TEST(Manifest, UnknownKeyInsideARewardTable) {
    auto message = manifest_error(kMinimal + "wieght = 2.0\n");
    EXPECT_CONTAINS(message, "grove.toml:10:1");
    EXPECT_CONTAINS(message, "unknown key 'wieght' in [[rewards]]; did you mean 'weight'?");
}

TEST(Manifest, TypeErrorsSayWhatIsExpected) {
    auto message = manifest_error(kMinimal + "\n[generation]\nnum_generations = \"8\"\n");
    EXPECT_CONTAINS(message, "grove.toml:12:1");
    EXPECT_CONTAINS(message, "generation.num_generations must be an integer");
    message = manifest_error(kMinimal + "\n[loss]\nmask_truncated_completions = 1\n");
    EXPECT_CONTAINS(message, "loss.mask_truncated_completions must be true or false");
}

TEST(Manifest, RangeErrorsSayWhatIsValid) {
    auto message = manifest_error(kMinimal + "\n[generation]\nnum_generations = 1\n");
    EXPECT_CONTAINS(message, "generation.num_generations = 1 is out of range; it must be >= 2");
    message = manifest_error(kMinimal + "\n[generation]\ntop_p = 0.0\n");
    EXPECT_CONTAINS(message, "generation.top_p = 0 is out of range; it must be > 0 and <= 1");
    message = manifest_error(kMinimal + "\n[loss]\nbeta = -0.1\n");
    EXPECT_CONTAINS(message, "loss.beta = -0.1 is out of range; it must be >= 0");
}

TEST(Manifest, ChoicesAreListedWithSuggestion) {
    auto message = manifest_error(kMinimal + "\n[loss]\nscale_rewards = \"grup\"\n");
    EXPECT_CONTAINS(message, "use one of \"group\", \"batch\", \"none\"; did you mean 'group'?");
    message = manifest_error(kMinimal + "\n[loss]\nscale_rewards = true\n");
    EXPECT_CONTAINS(message, "TRL's true is \"group\", false is \"none\"");
}

TEST(Manifest, GenerationBatchMustHoldWholeGroups) {
    auto message = manifest_error(kMinimal + "\n[generation]\nnum_generations = 4\n[train]\nper_device_train_batch_size = 6\n");
    EXPECT_CONTAINS(message, "the generation batch of 6 completions");
    EXPECT_CONTAINS(message, "cannot hold whole groups of num_generations = 4");
    EXPECT_CONTAINS(message, "use num_generations in {2, 3, 6}");
    EXPECT_CONTAINS(message, "train.generation_batch_size = 12");
    // TRL's test_train_num_generations_larger_than_batch_size: bs 3, G 6, GA 2 is valid
    auto ok = grove::Manifest::parse(kMinimal +
                                         "\n[generation]\nnum_generations = 6\n[train]\n"
                                         "per_device_train_batch_size = 3\ngradient_accumulation_steps = 2\n",
                                     "grove.toml");
    EXPECT_EQ(ok.integer("train.generation_batch_size"), 6);
    EXPECT_EQ(ok.integer("train.steps_per_generation"), 2);
    // grove sft's batches have no groups: a batch of 6 with num_generations 4 is fine there
    auto sft =
        grove::Manifest::parse(kMinimal + "\n[generation]\nnum_generations = 4\n[train]\nper_device_train_batch_size = 6\n",
                               "grove.toml", {}, 1, grove::ManifestUse::sft);
    EXPECT_EQ(sft.integer("train.per_device_train_batch_size"), 6);
}

TEST(Manifest, BatchResolutionFollowsTrlAndCountsProcesses) {
    auto m = grove::Manifest::parse(kMinimal + "\n[train]\nper_device_train_batch_size = 4\ngeneration_batch_size = 32\n",
                                    "grove.toml", {}, 2);
    EXPECT_EQ(m.integer("train.steps_per_generation"), 4);  // 32 / (4 x 2 processes)
    auto message = manifest_error(kMinimal + "\n[train]\nper_device_train_batch_size = 4\ngeneration_batch_size = 10\n");
    EXPECT_CONTAINS(message, "must be a multiple of per_device_train_batch_size x world size = 4");
    message = manifest_error(kMinimal + "\n[train]\ngeneration_batch_size = 16\nsteps_per_generation = 1\n");
    EXPECT_CONTAINS(message,
                    "disagree: generation_batch_size must be per_device_train_batch_size x world size x "
                    "steps_per_generation = 8; set only one of them");
    auto both = grove::Manifest::parse(kMinimal +
                                           "\n[train]\ngeneration_batch_size = 16\nsteps_per_generation = 2\n"
                                           "per_device_train_batch_size = 8\n",
                                       "grove.toml");
    EXPECT_EQ(both.integer("train.generation_batch_size"), 16);
}

TEST(Manifest, SetOverridesValuesAndIsCheckedLikeTheFile) {
    auto m = grove::Manifest::parse(kMinimal, "grove.toml",
                                    {"generation.temperature=0.7", "rewards.0.weight=2", "model.dtype=bfloat16",
                                     "rewards.0.config.reference_column=\"solution\""});
    EXPECT_DOUBLE_EQ(m.number("generation.temperature"), 0.7);
    EXPECT_DOUBLE_EQ(m.rewards()[0].weight, 2.0);    // an integer widened to a number
    EXPECT_EQ(m.string("model.dtype"), "bfloat16");  // not TOML: taken as a string
    EXPECT_EQ(m.rewards()[0].config->at_path("reference_column").value<std::string>().value_or(""), "solution");
    auto message = manifest_error(kMinimal, {"generation.temprature=0.7"});
    EXPECT_CONTAINS(message, "--set generation.temprature: error: unknown key 'temprature'");
    EXPECT_CONTAINS(message, "did you mean 'temperature'?");
    message = manifest_error(kMinimal, {"loss.beta=-1"});
    EXPECT_CONTAINS(message, "--set loss.beta: error: loss.beta = -1 is out of range");
    message = manifest_error(kMinimal, {"rewards.3.weight=1"}, grove::ErrorKind::usage);
    EXPECT_CONTAINS(message, "'3' is not an index of the 1 entries there");
    message = manifest_error(kMinimal, {"nonsense"}, grove::ErrorKind::usage);
    EXPECT_CONTAINS(message, "expected section.key=value");
}

TEST(Manifest, RewardsAreRequiredAndUniquelyNamed) {
    // GRPO needs a reward, grove sft none
    const auto no_rewards = grove::Manifest::parse("[model]\npath = \"m\"\n[data]\nsource = \"d.jsonl\"\n", "grove.toml");
    auto message = grove::test::error_message([&] { grove::RunConfig::from(no_rewards); });
    EXPECT_CONTAINS(message, "grove.toml: error: no reward: add at least one [[rewards]] table");
    EXPECT_TRUE(grove::RunConfig::from(no_rewards, grove::RunConfig::Kind::sft).rewards.empty());
    message = manifest_error(kMinimal + "\n[[rewards]]\nplugin = \"correctness\"\n");
    EXPECT_CONTAINS(message, "two rewards are named 'correctness'");
    auto m = grove::Manifest::parse(kMinimal +
                                        "\n[[rewards]]\nplugin = \"correctness\"\nname = \"strict\"\n"
                                        "config = { tolerance = 0.0 }\n",
                                    "grove.toml");
    ASSERT_EQ(m.rewards().size(), 2u);
    EXPECT_EQ(m.rewards()[1].name, "strict");
}

TEST(Manifest, MissingRequiredKey) {
    auto message = manifest_error("[data]\nsource = \"d.jsonl\"\n[[rewards]]\nplugin = \"x\"\n");
    EXPECT_CONTAINS(message, "missing required key model.path");
}

TEST(Manifest, InvalidTomlReportsPosition) {
    auto message = manifest_error("[model]\npath = \"unterminated\n");
    EXPECT_CONTAINS(message, "/runs/exp/grove.toml:2:");
    EXPECT_CONTAINS(message, "invalid TOML");
}

// Debian's toml++ reaches undefined behaviour on a non-ASCII character outside strings; Grove refuses
// it before parsing (config/toml_input.hpp), while strings and comments keep any UTF-8.
TEST(Manifest, NonAsciiOutsideStringsIsRefusedWithItsPosition) {
    for (const std::string& text :
         {std::string("[model]\npath = \"m\"\n\xc3\xa9t\xc3\xa9 = 1\n"), std::string("[\xc3\xa9]\n")}) {
        auto message = manifest_error(text);
        EXPECT_CONTAINS(message, "invalid TOML: a non-ASCII character outside a string");
        EXPECT_CONTAINS(message, text[0] == '[' && text[1] != 'm' ? "grove.toml:1:2" : "grove.toml:3:1");
    }
    std::string text = "# caf\xc3\xa9 \xe6\x9d\xb1\n" + kMinimal;
    text.replace(text.find("prompts.jsonl"), 13,
                 "donn\xc3\xa9"
                 "es.jsonl");
    auto m = grove::Manifest::parse(text, "/runs/exp/grove.toml");
    EXPECT_NE(m.string("data.source")
                  .find("donn\xc3\xa9"
                        "es.jsonl"),
              std::string::npos);
}

// toml++ 3.3 also reaches its undefined behaviour behind a quote that opens no string (it reads
// `1'2é` as one value token) and at two characters of multi-line strings; the fuzzer found both
// (tests/fuzz/regressions/manifest/). Strings in every place TOML allows one keep their UTF-8.
TEST(Manifest, NonAsciiTheTomlLibraryCannotReadIsRefusedEverywhere) {
    const std::string e = "\xc3\xa9";
    for (const std::string& text : {"x = 9223372_'368" + e + "\n", "x = 1.\"" + e + "\"\n", "x = b=\"" + e + "\"\n"})
        EXPECT_CONTAINS(manifest_error(text), "a non-ASCII character outside a string");
    const std::string after_line_ending_backslash = manifest_error("x = \"\"\"a\\\n" + e + "\"\"\"\n");
    EXPECT_CONTAINS(after_line_ending_backslash, "grove.toml:2:1");
    EXPECT_CONTAINS(after_line_ending_backslash, "right after a line-ending backslash");
    EXPECT_CONTAINS(manifest_error("x = \"\"\"a\\" + e + "\"\"\"\n"), "not a TOML escape");

    const std::string strings = "\n[rewards.config]\n\"k" + e + "\".\"j" + e + "\" = ['" + e + "', { \"" + e +
                                "\" = \"\"\"a\\\n  b" + e + "\"\"\" }, \"\"\"" + e + "\"\"\"\"]\n";
    auto m = grove::Manifest::parse(kMinimal + strings, "/runs/exp/grove.toml");
    const toml::array* values = (*m.rewards()[0].config)["k" + e]["j" + e].as_array();
    ASSERT_NE(values, nullptr);
    ASSERT_EQ(values->size(), 3u);
    EXPECT_EQ(values->get(0)->value<std::string>().value_or(""), e);
    EXPECT_EQ((*values->get(1)->as_table())[e].value<std::string>().value_or(""), "ab" + e);
    EXPECT_EQ(values->get(2)->value<std::string>().value_or(""), e + "\"");
}

TEST(Manifest, ResolvedTomlRoundTrips) {
    auto m = grove::Manifest::parse(kMinimal + "\n[loss]\ndelta = 3.0\n[train]\ngradient_accumulation_steps = 2\n",
                                    "/runs/exp/grove.toml");
    std::string resolved = m.resolved_toml();
    EXPECT_CONTAINS(resolved, "# save_total_limit = (unset)");
    EXPECT_CONTAINS(resolved, "steps_per_generation = 2");
    auto again = grove::Manifest::parse(resolved, "/elsewhere/resolved.toml");
    EXPECT_EQ(again.string("model.path"), "/runs/exp/models/tiny");  // absolute after resolution
    EXPECT_DOUBLE_EQ(again.number("loss.delta"), 3.0);
    EXPECT_EQ(again.integer("train.generation_batch_size"), 16);
    EXPECT_EQ(again.resolved_toml().substr(again.resolved_toml().find('\n')), resolved.substr(resolved.find('\n')));
}

// Every reward setting is in the resolved text, so a resume can name it: isolation, timeout,
// on_failure and role beside plugin, name, weight and config; a reward model by its folder; a config
// key that is not bare TOML quoted, so the text still parses.
TEST(Manifest, ResolvedTomlKeepsEveryRewardSetting) {
    const std::string text = kMinimal +
                             "isolation = \"process\"\ntimeout = 2.5\non_failure = \"nan\"\nrole = \"none\"\n"
                             "config = { \"top.p\" = 1, plain = { \"a b\" = \"x\" } }\n"
                             "[[rewards]]\nmodel = \"judge\"\nweight = 0.5\n";
    const auto m = grove::Manifest::parse(text, "/runs/exp/grove.toml");
    const std::string resolved = m.resolved_toml();
    EXPECT_CONTAINS(resolved, "isolation = 'process'");
    EXPECT_CONTAINS(resolved, "timeout = 2.5");
    EXPECT_CONTAINS(resolved, "on_failure = 'nan'");
    EXPECT_CONTAINS(resolved, "role = 'none'");
    EXPECT_CONTAINS(resolved, "model = '/runs/exp/judge'");
    EXPECT_EQ(resolved.find("plugin = ''"), std::string::npos) << resolved;
    const auto again = grove::Manifest::parse(resolved, "/elsewhere/resolved.toml");
    ASSERT_EQ(again.rewards().size(), 2u);
    const auto& first = again.rewards()[0];
    EXPECT_TRUE(first.isolation.process);
    EXPECT_DOUBLE_EQ(first.isolation.timeout_seconds, 2.5);
    EXPECT_TRUE(first.isolation.failures_are_nan);
    EXPECT_EQ(first.role, "none");
    EXPECT_EQ((*first.config)["top.p"].value<int64_t>().value_or(0), 1);
    EXPECT_EQ((*first.config)["plain"]["a b"].value<std::string>().value_or(""), "x");
    EXPECT_EQ(again.rewards()[1].model, "/runs/exp/judge");
    EXPECT_EQ(again.rewards()[1].name, "judge");
    EXPECT_TRUE(grove::Manifest::resolved_changes(resolved, again.resolved_toml()).empty())
        << testing::PrintToString(grove::Manifest::resolved_changes(resolved, again.resolved_toml()));
}

// A resumed run keeping its model folder: resolved_string reads it back from a checkpoint's settings,
// use_model_folder changes this manifest only (a copy made before keeps its own values).
TEST(Manifest, UseModelFolderChangesThisManifestOnly) {
    const auto original = grove::Manifest::parse(kMinimal, "/runs/exp/grove.toml");
    auto kept = original;
    kept.use_model_folder("/cache/snapshots/abc");
    EXPECT_EQ(kept.string("model.path"), "/cache/snapshots/abc");
    EXPECT_EQ(original.string("model.path"), "/runs/exp/models/tiny");
    EXPECT_EQ(grove::Manifest::resolved_string(kept.resolved_toml(true), "model.path"), "/cache/snapshots/abc");
    EXPECT_EQ(grove::Manifest::resolved_string(original.resolved_toml(true), "model.path"), "/runs/exp/models/tiny");
    EXPECT_EQ(grove::Manifest::resolved_string(original.resolved_toml(true), "model.no_such_key"), std::nullopt);
    EXPECT_EQ(grove::Manifest::resolved_string("not [toml", "model.path"), std::nullopt);
    const auto changes = grove::Manifest::resolved_changes(original.resolved_toml(true), kept.resolved_toml(true));
    ASSERT_EQ(changes.size(), 1u) << testing::PrintToString(changes);
    EXPECT_EQ(changes[0], "model.path = '/cache/snapshots/abc' (was '/runs/exp/models/tiny')");
}

// What a resume reports: each key whose resolved value differs, with both values, a reward's keys by
// index as --set names them; nothing for the same manifest.
TEST(Manifest, ResolvedChangesNameEachKeyThatDiffers) {
    const auto before = grove::Manifest::parse(kMinimal, "/runs/exp/grove.toml");
    const auto after = grove::Manifest::parse(kMinimal + "weight = 2.0\n[train]\nmax_steps = 7\n", "/runs/exp/grove.toml");
    EXPECT_TRUE(grove::Manifest::resolved_changes(before.resolved_toml(), before.resolved_toml()).empty());
    const auto changes = grove::Manifest::resolved_changes(before.resolved_toml(), after.resolved_toml());
    ASSERT_EQ(changes.size(), 2u) << testing::PrintToString(changes);
    EXPECT_EQ(changes[0], "rewards.0.weight = 2.0 (was 1.0)");
    EXPECT_EQ(changes[1], "train.max_steps = 7 (was " + std::to_string(before.integer("train.max_steps")) + ")");
    // a reward's isolation, and a second reward added
    const auto isolated = grove::Manifest::parse(
        kMinimal + "isolation = \"process\"\ntimeout = 3.0\n[[rewards]]\nplugin = \"format\"\n", "/runs/exp/grove.toml");
    std::string isolation_changes;
    for (const auto& change : grove::Manifest::resolved_changes(before.resolved_toml(), isolated.resolved_toml()))
        isolation_changes += change + "\n";
    EXPECT_CONTAINS(isolation_changes, "rewards.0.isolation = 'process' (was 'none')\n");
    EXPECT_CONTAINS(isolation_changes, "rewards.0.timeout = 3.0 (was 0.0)\n");
    EXPECT_CONTAINS(isolation_changes, "rewards.1.plugin = 'format' (was unset)\n");
    // the same manifest named by a relative path and by an absolute one: its paths differ as printed,
    // not as a checkpoint keeps them (absolute)
    const auto relative = grove::Manifest::parse(kMinimal, "grove.toml");
    const auto absolute = grove::Manifest::parse(kMinimal, (std::filesystem::current_path() / "grove.toml").string());
    EXPECT_FALSE(grove::Manifest::resolved_changes(relative.resolved_toml(), absolute.resolved_toml()).empty());
    EXPECT_TRUE(grove::Manifest::resolved_changes(relative.resolved_toml(true), absolute.resolved_toml(true)).empty())
        << testing::PrintToString(
               grove::Manifest::resolved_changes(relative.resolved_toml(true), absolute.resolved_toml(true)));
    // a checkpoint from a Grove that lacked some keys: those at their default are no change, one set
    // otherwise is
    std::string older;
    std::istringstream lines(isolated.resolved_toml());
    for (std::string line; std::getline(lines, line);)
        if (line.rfind("sync_ref_model", 0) != 0 && line.rfind("timeout", 0) != 0) older += line + "\n";
    // (sync_ref_model = false and the second reward's timeout = 0 are defaults; the first's 3.0 is not)
    EXPECT_EQ(grove::Manifest::resolved_changes(older, isolated.resolved_toml()),
              std::vector<std::string>{"rewards.0.timeout = 3.0 (was unset)"});
    // a checkpoint from a Grove whose save_steps was an integer key ("500"): the same number now ("500.0")
    std::string integer_steps = before.resolved_toml();
    const size_t at = integer_steps.find("save_steps = 500.0");
    ASSERT_NE(at, std::string::npos);
    integer_steps.replace(at, 18, "save_steps = 500");
    EXPECT_TRUE(grove::Manifest::resolved_changes(integer_steps, before.resolved_toml()).empty());
    // a text that is not TOML has no keys: every key reads as set since
    const auto from_nothing = grove::Manifest::resolved_changes("not toml [", before.resolved_toml());
    EXPECT_GT(from_nothing.size(), 20u);
    EXPECT_CONTAINS(from_nothing.front(), "(was unset)");
}

TEST(Manifest, DocsReferenceIsGeneratedFromTheSchema) {
    std::ifstream file(std::string(GROVE_TEST_SOURCE_DIR) + "/docs/manifest.md");
    ASSERT_TRUE(file) << "docs/manifest.md is missing: build/bin/grove manifest-reference > docs/manifest.md";
    std::stringstream text;
    text << file.rdbuf();
    EXPECT_EQ(text.str(), grove::manifest_reference_markdown())
        << "docs/manifest.md is stale: regenerate it with build/bin/grove manifest-reference > docs/manifest.md";
}

// The typed run configuration reads every schema key (outside the plugin tables, which become
// PluginUse), so no manifest key is accepted and then silently ignored.
TEST(RunConfig, ReadsEverySchemaKey) {
    auto m = grove::Manifest::parse(kMinimal, "/runs/exp/grove.toml");
    EXPECT_FALSE(m.keys_never_read().empty()) << "validation's own reads must not count";
    auto c = grove::RunConfig::from(m);
    EXPECT_EQ(m.keys_never_read(), std::vector<std::string>{});
    EXPECT_EQ(c.train.gradient_accumulation_steps, 1);
    EXPECT_EQ(c.train.steps_per_generation, 1);  // resolved by the manifest
    EXPECT_EQ(c.loss.importance_sampling_level, grove::ImportanceSamplingLevel::token);
    EXPECT_EQ(c.train.mixed_precision, grove::MixedPrecision::automatic);
}

TEST(RunConfig, EnumsComeFromTheSchemasChoices) {
    auto m = grove::Manifest::parse(
        kMinimal, "/runs/exp/grove.toml",
        {"loss.importance_sampling_level=\"sequence\"", "loss.scale_rewards=\"batch\"",
         "loss.aggregation=\"normalize_then_sum\"", "train.lr_scheduler_type=\"cosine\"", "train.mixed_precision=\"no\""});
    auto c = grove::RunConfig::from(m);
    EXPECT_EQ(c.loss.importance_sampling_level, grove::ImportanceSamplingLevel::sequence);
    EXPECT_EQ(c.loss.scale_rewards, grove::ScaleRewards::batch);
    EXPECT_EQ(c.loss.aggregation, grove::RewardAggregation::normalize_then_sum);
    EXPECT_EQ(c.train.lr_scheduler_type, grove::LrSchedule::cosine);
    EXPECT_EQ(c.train.mixed_precision, grove::MixedPrecision::off);
    EXPECT_THROW(grove::scale_rewards_from_name("groups"), std::invalid_argument);
}

// TrainingArguments' save_strategy / eval_strategy / logging_strategy and their *_steps: a whole
// number of steps or a fraction of the run's (rounded up), each epoch's end, or never.
TEST(RunConfig, IntervalsAreReadAsTransformersReadsThem) {
    const auto defaults = grove::RunConfig::from(grove::Manifest::parse(kMinimal, "/runs/exp/grove.toml"));
    EXPECT_EQ(defaults.output.save.strategy, grove::IntervalStrategy::steps);
    EXPECT_DOUBLE_EQ(defaults.output.save.steps, 500);
    EXPECT_EQ(defaults.logging.progress_lines.strategy, grove::IntervalStrategy::steps);
    EXPECT_DOUBLE_EQ(defaults.logging.progress_lines.steps, 10);
    EXPECT_EQ(defaults.train.eval.strategy, grove::IntervalStrategy::no);

    auto due_steps = [](const grove::Interval& interval, int64_t total, double steps_per_epoch) {
        std::vector<int64_t> due;
        for (int64_t step = 1; step <= total; ++step)
            if (interval.due(step, total, steps_per_epoch)) due.push_back(step);
        return due;
    };
    using S = grove::IntervalStrategy;
    EXPECT_EQ(due_steps({S::steps, 4}, 10, 3), (std::vector<int64_t>{4, 8}));
    EXPECT_EQ(due_steps({S::steps, 0.25}, 10, 3), (std::vector<int64_t>{3, 6, 9})) << "ceil(0.25 x 10) = 3";
    EXPECT_EQ(due_steps({S::epoch, 0}, 10, 3), (std::vector<int64_t>{3, 6, 9, 10})) << "and the last, a part epoch";
    EXPECT_EQ(due_steps({S::epoch, 0}, 6, 2.5), (std::vector<int64_t>{3, 5, 6}));
    EXPECT_TRUE(due_steps({S::no, 4}, 10, 3).empty());

    const std::string held_out = R"(
[model]
path = "models/tiny"
[data]
source = "prompts.jsonl"
eval_source = "held_out.jsonl"
[[rewards]]
plugin = "correctness"
)";
    auto read = [&](const std::vector<std::string>& overrides) {
        return grove::RunConfig::from(grove::Manifest::parse(held_out, "/runs/exp/grove.toml", overrides));
    };
    // eval_steps alone: "steps"; eval_strategy = "steps" alone: every logging_steps (eval_steps = None)
    EXPECT_EQ(read({"train.eval_steps=2"}).train.eval.strategy, S::steps);
    const auto every_logging_step = read({"train.eval_strategy=\"steps\"", "logging.logging_steps=5"});
    EXPECT_EQ(every_logging_step.train.eval.strategy, S::steps);
    EXPECT_DOUBLE_EQ(every_logging_step.train.eval.steps, 5);
    EXPECT_EQ(read({"train.eval_strategy=\"epoch\"", "output.save_strategy=\"no\""}).output.save.strategy, S::no);
    EXPECT_DOUBLE_EQ(read({"output.save_steps=0.1"}).output.save.steps, 0.1);

    auto refused = [&](const std::vector<std::string>& overrides) {
        return grove::test::error_message([&] { read(overrides); });
    };
    EXPECT_NE(refused({"output.save_steps=2.5"})
                  .find("output.save_steps = 2.5 is neither a whole number of optimizer steps nor a fraction below 1"),
              std::string::npos);
    EXPECT_NE(refused({"train.eval_strategy=\"epoch\"", "train.eval_steps=4"})
                  .find("train.eval_steps is the interval of train.eval_strategy = \"steps\", and this manifest has "
                        "eval_strategy = \"epoch\": remove eval_steps"),
              std::string::npos);
    EXPECT_NE(
        grove::test::error_message([] {
            grove::RunConfig::from(grove::Manifest::parse(kMinimal, "/runs/exp/grove.toml", {"train.eval_strategy=\"epoch\""}));
        }).find("train.eval_strategy = \"epoch\" evaluates on held-out prompts: set data.eval_source"),
        std::string::npos);
}

TEST(RunConfig, ARewardsRoleIsOneOfTheDeclaredRoles) {
    auto m = grove::Manifest::parse(kMinimal + "role = \"accuracy\"\n", "/runs/exp/grove.toml");
    EXPECT_EQ(grove::RunConfig::from(m).rewards.at(0).role, "accuracy");
    auto message = manifest_error(kMinimal + "role = \"accurate\"\n");
    EXPECT_CONTAINS(message, "role");
}

// Counts far beyond any real run are refused at once, with the key, instead of overflowing the batch
// arithmetic or hanging in it; a huge batch that cannot hold whole groups is still answered quickly.
TEST(Manifest, HugeCountsAreRefusedAtOnce) {
    auto huge = manifest_error(kMinimal + "\n[train]\nper_device_train_batch_size = 1000000000000000000\n");
    EXPECT_CONTAINS(huge, "per_device_train_batch_size");
    auto overflow = manifest_error(
        kMinimal + "\n[train]\nper_device_train_batch_size = 4611686018427387904\ngradient_accumulation_steps = 4\n");
    EXPECT_CONTAINS(overflow, "per_device_train_batch_size");
    const auto start = std::chrono::steady_clock::now();
    auto groups =
        manifest_error(kMinimal + "\n[generation]\nnum_generations = 3\n[train]\nper_device_train_batch_size = 16777216\n");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
    EXPECT_CONTAINS(groups, "cannot hold whole groups of num_generations = 3");
    EXPECT_CONTAINS(groups, "use num_generations in {2, 4, 8, 16");
}

// TRL's rules for loss types and options, as errors that name the keys and the valid combination.
TEST(Manifest, IncompatibleLossOptionsNameTheValidCombination) {
    auto message =
        manifest_error(kMinimal + "\n[objective]\nplugin = \"vespo\"\n[loss]\nimportance_sampling_level = \"sequence\"\n");
    EXPECT_CONTAINS(message, "grove.toml:14:");  // the key's line
    EXPECT_CONTAINS(message, "objective vespo");
    EXPECT_CONTAINS(message, "loss.importance_sampling_level = \"token\"");
    message = manifest_error(kMinimal +
                             "\n[objective]\nplugin = \"vespo\"\n[loss]\nimportance_sampling_correction = \"sequence_mask\"\n");
    EXPECT_CONTAINS(message, "\"token_truncate\" or \"token_mask\", not \"sequence_mask\"");
    message = manifest_error(kMinimal + "\n[reduction]\nplugin = \"luspo\"\n");
    EXPECT_CONTAINS(message, "reduction luspo");
    EXPECT_CONTAINS(message, "loss.importance_sampling_level = \"sequence\"");
    message = manifest_error(kMinimal + "\n[loss]\nimportance_sampling_clip_min = 3.0\n");
    EXPECT_CONTAINS(message, "loss.importance_sampling_clip_min must be below loss.importance_sampling_clip_max (3)");
    message = manifest_error(kMinimal + "\n[loss]\nentropy_coef_min = 0.5\nentropy_coef_max = 0.1\n");
    EXPECT_CONTAINS(message, "loss.entropy_coef_min must be <= loss.entropy_coef_max");
    // the valid forms parse
    auto ok = grove::RunConfig::from(grove::Manifest::parse(
        kMinimal + "\n[objective]\nplugin = \"vespo\"\n[loss]\nimportance_sampling_correction = \"token_mask\"\n",
        "grove.toml"));
    EXPECT_EQ(ok.loss.sampling_correction, grove::SamplingCorrection::token_mask);
    EXPECT_EQ(ok.loss.sampling_clip_max, 3.0);  // TRL's default
    EXPECT_FALSE(ok.loss.sampling_clip_min);
    ok = grove::RunConfig::from(grove::Manifest::parse(
        kMinimal + "\n[reduction]\nplugin = \"luspo\"\n[loss]\nimportance_sampling_level = \"sequence\"\n", "grove.toml"));
    EXPECT_EQ(ok.reduction.plugin, "luspo");
}

TEST(Manifest, DynamicSamplingIsOneProcessForNow) {
    try {
        grove::Manifest::parse(kMinimal + "\n[generation]\ndynamic_sampling = true\n", "/runs/exp/grove.toml", {}, 2);
        FAIL() << "accepted dynamic sampling on two processes";
    } catch (const grove::Error& e) {
        EXPECT_CONTAINS(std::string(e.what()), "generation.dynamic_sampling runs on one process for now (this run has 2)");
    }
    EXPECT_TRUE(
        grove::RunConfig::from(grove::Manifest::parse(kMinimal + "\n[generation]\ndynamic_sampling = true\n", "grove.toml"))
            .generation.dynamic_sampling);
}

TEST(Manifest, ARewardIsAPluginOrAModelNotBoth) {
    auto message = manifest_error(kMinimal + "\n[[rewards]]\nplugin = \"format\"\nmodel = \"rm\"\n");
    EXPECT_CONTAINS(message, "[[rewards]] #2 needs exactly one of plugin = \"NAME\" (a reward plugin) and model = \"DIR\"");
    message = manifest_error(kMinimal + "\n[[rewards]]\nweight = 2.0\n");
    EXPECT_CONTAINS(message, "[[rewards]] #2 needs exactly one of");
    auto ok =
        grove::Manifest::parse(kMinimal + "\n[[rewards]]\nmodel = \"models/my-rm/\"\nweight = 0.5\n", "/runs/exp/grove.toml");
    ASSERT_EQ(ok.rewards().size(), 2u);
    EXPECT_EQ(ok.rewards()[1].model, "/runs/exp/models/my-rm/");
    EXPECT_EQ(ok.rewards()[1].name, "my-rm");  // as TRL names a reward model: its folder's last part
    EXPECT_TRUE(ok.rewards()[1].plugin.empty());
}

// Hub ids as huggingface_hub accepts them, and a snapshot folder of the cache named back by its id
// and commit (hub_cache.py compares the cache folder and the lookup with huggingface_hub's)
TEST(HubCache, IdsAndSnapshotsAsHuggingfaceHubNamesThem) {
    for (const char* id : {"Qwen/Qwen2.5-0.5B-Instruct", "gpt2", "HuggingFaceTB/SmolLM2-135M", "a_b/c.d"})
        EXPECT_TRUE(grove::looks_like_hub_model_id(id)) << id;
    EXPECT_TRUE(grove::looks_like_hub_model_id(std::string(40, 'o') + "/" + std::string(90, 'n'))) << "96 is the name's limit";
    for (const char* not_id : {"", "./model", "../model", "/abs/model", "a/b/c", "a--b/c", "a/..b", "-a/b", "a/", "a b/c"})
        EXPECT_FALSE(grove::looks_like_hub_model_id(not_id)) << not_id;

    const fs::path cache = fs::temp_directory_path() / ("grove-hub-" + std::to_string(::getpid()));
    const std::string commit(40, 'c');
    const fs::path snapshot = cache / "models--Qwen--Qwen2.5-0.5B" / "snapshots" / commit;
    fs::create_directories(snapshot);
    fs::create_directories(cache / "models--Qwen--Qwen2.5-0.5B" / "refs");
    std::ofstream(cache / "models--Qwen--Qwen2.5-0.5B" / "refs" / "main") << commit;
    const char* saved = std::getenv("HF_HUB_CACHE");
    const std::string before = saved ? saved : "";
    ::setenv("HF_HUB_CACHE", cache.c_str(), 1);
    EXPECT_EQ(grove::cached_hub_snapshot("Qwen/Qwen2.5-0.5B"), snapshot.string());
    const auto named = grove::cached_hub_model_of(snapshot.string() + "/");
    ASSERT_TRUE(named.has_value());
    EXPECT_EQ(named->id, "Qwen/Qwen2.5-0.5B");
    EXPECT_EQ(named->commit, commit);
    // the same layout outside the cache in use is a folder like any other
    const fs::path elsewhere = cache / "copy" / "models--Qwen--Qwen2.5-0.5B" / "snapshots" / commit;
    fs::create_directories(elsewhere);
    EXPECT_FALSE(grove::cached_hub_model_of(elsewhere.string()).has_value());
    EXPECT_FALSE(grove::cached_hub_model_of("/work/models/llama").has_value());
    if (saved)
        ::setenv("HF_HUB_CACHE", before.c_str(), 1);
    else
        ::unsetenv("HF_HUB_CACHE");
    fs::remove_all(cache);
}
