// The plugin host's error paths: each gives one clear message naming the plugin and its file.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "grove/error.hpp"
#include "grove/manifest.hpp"
#include "grove/plugin_host.hpp"

#include <toml++/toml.h>
#include "plugin_test_support.hpp"

namespace {

const std::string kFixtures = GROVE_TEST_PLUGIN_FIXTURES;

// Runs fn, expects a grove::Error of `kind`, returns its message.
template <class Fn>
std::string error_of(Fn&& fn, grove::ErrorKind kind = grove::ErrorKind::plugin) {
    try {
        fn();
    } catch (const grove::Error& e) {
        EXPECT_EQ(int(e.kind()), int(kind)) << e.what();
        return e.what();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "not a grove::Error: " << e.what();
        return "";
    }
    ADD_FAILURE() << "no error";
    return "";
}

grove::PluginInstance create(const grove::PluginInfo& info, const std::string& config) {
    return grove::PluginInstance(info, grove::PluginConfig::from_toml_text(info, config, "grove.toml [[rewards]] #1"));
}

grove_reward_batch one_row_batch() {
    static const grove_text text{"x", 1};
    static const int64_t offsets[] = {0, 0};
    static const uint8_t truncated[] = {0};
    static const grove_text json{"{}", 2};
    grove_reward_batch batch{};
    batch.struct_size = sizeof(batch);
    batch.count = 1;
    batch.num_generations = 1;
    batch.prompts = &text;
    batch.completions = &text;
    batch.completion_token_offsets = offsets;
    batch.truncated = truncated;
    batch.row_json = &json;
    batch.world_size = 1;
    return batch;
}

}  // namespace

TEST(PluginHost, MissingFileIsNamed) {
    grove::PluginHost host({});
    auto message = error_of([&] { host.find("/nonexistent/libgrove_nothing.so"); });
    EXPECT_CONTAINS(message, "/nonexistent/libgrove_nothing.so");
    EXPECT_CONTAINS(message, "does not exist");
}

TEST(PluginHost, NotASharedLibrary) {
    std::string path = std::string(GROVE_TEST_BINARY_DIR) + "/garbage.so";
    std::ofstream(path) << "this is not an ELF file\n";
    grove::PluginHost host({});
    auto message = error_of([&] { host.find(path); });
    EXPECT_CONTAINS(message, "garbage.so is not a loadable shared library");
}

TEST(PluginHost, SharedLibraryWithoutEntryPoint) {
    grove::PluginHost host({});
    auto message = error_of([&] { host.find(kFixtures + "/not_a_plugin/libnot_a_plugin.so"); });
    EXPECT_CONTAINS(message, "libnot_a_plugin.so is not a Grove plugin");
    EXPECT_CONTAINS(message, "grove_plugin_entry");
}

TEST(PluginHost, WrongAbiMajorIsRefusedWithTheFix) {
    grove::PluginHost host({});
    auto message = error_of([&] { host.find(kFixtures + "/bad_abi/libbad_abi.so"); });
    EXPECT_CONTAINS(message, "libbad_abi.so was built for Grove plugin ABI 99.0");
    EXPECT_CONTAINS(message, "rebuild the plugin against the Grove SDK 1.x");
}

TEST(PluginHost, WrongAbiInTheSearchPathIsReportedAsSkipped) {
    grove::PluginHost host({kFixtures + "/bad_abi"});
    std::vector<std::string> skipped;
    EXPECT_TRUE(host.list(&skipped).empty());
    ASSERT_EQ(skipped.size(), 1u);
    EXPECT_CONTAINS(skipped[0], "ABI 99.0");
    auto message = error_of([&] { host.find("from_the_future"); });
    EXPECT_CONTAINS(message, "no plugin named 'from_the_future'");
    EXPECT_CONTAINS(message, "skipped: ");
}

TEST(PluginHost, FailingCreateShowsThePluginsMessage) {
    grove::PluginHost host({});
    auto info = host.find(kFixtures + "/failing/libfailing_create.so");
    auto message = error_of([&] { create(info, ""); });
    EXPECT_CONTAINS(message, "plugin 'failing'");
    EXPECT_CONTAINS(message, "libfailing_create.so");
    EXPECT_CONTAINS(message, "the answer key file could not be opened");
}

TEST(PluginHost, ConfigErrorFromCreatePointsAtTheKeysLine) {
    grove::PluginHost host({});
    auto info = host.find(kFixtures + "/failing/libfailing_create.so");
    auto message = error_of([&] { create(info, "# comment\nthreshold = 2.0\n"); }, grove::ErrorKind::manifest);
    EXPECT_CONTAINS(message, "grove.toml [[rewards]] #1:2:1");  // the origin's source name, line 2
    EXPECT_CONTAINS(message, "'threshold': threshold must be at most 1.0");
}

TEST(PluginHost, ExceptionInCppPluginConstructorBecomesAMessage) {
    grove::PluginHost host({});
    auto info = host.find(kFixtures + "/throwing/libthrowing.so");
    auto message = error_of([&] { create(info, "throw_in_create = true"); });
    EXPECT_CONTAINS(message, "plugin 'throwing'");
    EXPECT_CONTAINS(message, "constructor exploded");
}

TEST(PluginHost, ExceptionInCppPluginCallBecomesAMessage) {
    grove::PluginHost host({});
    auto info = host.find(kFixtures + "/throwing/libthrowing.so");
    auto instance = create(info, "");
    std::vector<float> scores, metrics;
    auto message = error_of([&] { instance.score(one_row_batch(), scores, metrics); });
    EXPECT_CONTAINS(message, "plugin 'throwing'");
    EXPECT_CONTAINS(message, "failed in score()");
    EXPECT_CONTAINS(message, "vector index 7 out of range");
}

TEST(PluginHost, DuplicateNamesNameBothFiles) {
    grove::PluginHost host({kFixtures + "/twins"});
    auto message = error_of([&] { host.find("twin"); });
    EXPECT_CONTAINS(message, "two libraries provide a plugin named 'twin'");
    EXPECT_CONTAINS(message, "libtwin_a.so");
    EXPECT_CONTAINS(message, "libtwin_b.so");
}

TEST(PluginHost, UnknownNameSuggestsTheClosest) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    auto message = error_of([&] { host.find("dapoo"); });
    EXPECT_CONTAINS(message, "no plugin named 'dapoo'; did you mean 'dapo'?");
    EXPECT_CONTAINS(message, grove::test::build_plugin_dir());
}

TEST(PluginHost, WrongKindIsRefused) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    auto message = error_of([&] { host.find("dapo", GROVE_PLUGIN_KIND_REWARD); });
    EXPECT_CONTAINS(message, "is of kind 'reduction', but a reward plugin is needed here");
}

TEST(PluginHost, UnknownConfigKeyHasLineAndSuggestion) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    auto info = host.find("dapo");
    auto message = error_of([&] { grove::PluginConfig::from_toml_text(info, "\nnormaliser = \"x\"", "run.toml"); },
                            grove::ErrorKind::manifest);
    EXPECT_CONTAINS(message, "run.toml:2:1");
    EXPECT_CONTAINS(message, "unknown key 'normaliser'");
    EXPECT_CONTAINS(message, "did you mean 'normalizer'?");
}

TEST(PluginHost, ConfigTypesAreCheckedAndIntegersWidenToFloats) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    auto info = host.find("lora");
    auto message =
        error_of([&] { grove::PluginConfig::from_toml_text(info, "r = \"eight\"", "run.toml"); }, grove::ErrorKind::manifest);
    EXPECT_CONTAINS(message, "'r' must be an integer");
    auto config = grove::PluginConfig::from_toml_text(info, "alpha = 16\ntarget_modules = [\"q_proj\"]", "run.toml");
    EXPECT_DOUBLE_EQ(grove_config_float(config.get(), "alpha", -1), 16.0);
    const grove_config_value* targets = grove_config_find(config.get(), "target_modules");
    ASSERT_NE(targets, nullptr);
    ASSERT_EQ(targets->array_length, 1u);
    EXPECT_STREQ(targets->string_array[0], "q_proj");
    EXPECT_NE(std::string(config.get()->raw_toml).find("alpha = 16"), std::string::npos);
}

TEST(PluginHost, ListsEveryReferencePluginOnce) {
    grove::PluginHost host({grove::test::build_plugin_dir(), grove::test::build_plugin_dir()});
    auto plugins = host.list();
    for (const char* name : {"grpo", "bnpo", "dr_grpo", "dapo", "full", "lora"}) {
        int count = 0;
        for (const auto& p : plugins) count += p.name == name;
        EXPECT_EQ(count, 1) << name;
    }
}

// ABI 1.1 appended fields and flags only: a plugin built for 1.0 loads and scores in this host.
TEST(PluginHost, APluginBuiltForAnOlderMinorLoads) {
    grove::PluginHost host({});
    auto info = host.find(kFixtures + "/old_minor/libold_minor.so", GROVE_PLUGIN_KIND_REWARD);
    EXPECT_EQ(info.abi_minor, 0u);
    auto instance = create(info, "");
    std::vector<float> scores, metrics;
    instance.score(one_row_batch(), scores, metrics);
    ASSERT_EQ(scores.size(), 1u);
    EXPECT_EQ(scores[0], 1.0f);
}

TEST(PluginHost, AFunctionTableSmallerThanItsRequiredEntriesIsRefused) {
    grove::PluginHost host({});
    auto message = error_of([&] { host.find(kFixtures + "/short_table/libshort_table.so"); });
    EXPECT_CONTAINS(message, "short_table");
    EXPECT_CONTAINS(message, "reward function table");
    EXPECT_CONTAINS(message, "score");
}

// An objective's non-finite gradient never reaches the model: the error names the plugin and where.
TEST(PluginHost, AnObjectivesNonFiniteGradientIsRefusedByName) {
    grove::PluginHost host({});
    auto info = host.find(kFixtures + "/nan_objective/libnan_objective.so", GROVE_PLUGIN_KIND_OBJECTIVE);
    grove::PluginInstance objective(info, grove::PluginConfig::from_toml_text(info, "", "test"));
    const std::vector<float> zeros(12, 0.0f), advantages(3, 1.0f);
    grove_objective_batch batch{};
    batch.struct_size = sizeof(batch);
    batch.rows = 3;
    batch.columns = 4;
    batch.logp = batch.mask = batch.weights = zeros.data();
    batch.advantages = advantages.data();
    auto message = error_of([&] { objective.objective_loss(batch); });
    EXPECT_CONTAINS(message, "nan_objective");
    EXPECT_CONTAINS(message, "non-finite gradient at row 1, column 2");
    batch.rows = 1;  // no NaN written: the call succeeds and the host's zero-filled gradient comes back
    EXPECT_EQ(objective.objective_loss(batch).grad, std::vector<float>(4, 0.0f));
}

// A 1.5 objective would ignore the 1.6 policy mask and sampling ratio: the host refuses it with them,
// naming the plugin, its ABI and the options, and runs it without them.
TEST(PluginHost, AnObjectiveOlderThanThePolicyMasksIsRefusedWhenTheyAreOn) {
    grove::PluginHost host({});
    auto info = host.find(kFixtures + "/objective_1_5/libobjective_1_5.so", GROVE_PLUGIN_KIND_OBJECTIVE);
    grove::PluginInstance objective(info, grove::PluginConfig::from_toml_text(info, "", "test"));
    const std::vector<float> zeros(4, 0.0f), ones(4, 1.0f), advantages(1, 1.0f);
    grove_objective_batch batch{};
    batch.struct_size = sizeof(batch);
    batch.rows = 1;
    batch.columns = 4;
    batch.logp = batch.weights = zeros.data();
    batch.mask = ones.data();
    batch.advantages = advantages.data();
    EXPECT_EQ(objective.objective_loss(batch).loss, 0.0);
    for (const float** field : {&batch.policy_mask, &batch.sampling_ratio}) {
        *field = ones.data();
        auto message = error_of([&] { objective.objective_loss(batch); });
        EXPECT_CONTAINS(message, "objective_1_5");
        EXPECT_CONTAINS(message, "ABI 1.5");
        EXPECT_CONTAINS(message, "loss.importance_sampling_correction");
        EXPECT_CONTAINS(message, "rebuild it");
        *field = nullptr;
    }
}

TEST(PluginHost, AnUnknownPluginNamesTheManifestLineThatAsksForIt) {
    grove::PluginHost host({GROVE_TEST_PLUGIN_DIR});
    grove::PluginUse use;
    use.plugin = "loraa";
    use.origin = "grove.toml:7:1 [adapter]";
    use.config = std::make_shared<toml::table>();
    auto message = error_of([&] { grove::create_plugin(host, use, GROVE_PLUGIN_KIND_ADAPTER); });
    EXPECT_EQ(message.rfind("grove.toml:7:1 [adapter]: no plugin named 'loraa'", 0), 0u) << message;
    EXPECT_CONTAINS(message, "did you mean 'lora'");
}
