// Reward plugins in worker processes ([[rewards]] isolation = "process", plugins/isolated_reward.cpp):
// the same scores as in-process, and a plugin that segfaults, aborts, exits, hangs, fails or prints
// noise becomes an error naming it, how it ended and the batch, or NaN scores with on_failure = "nan".
#include <gtest/gtest.h>

#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "grove/environment_host.hpp"
#include "grove/error.hpp"
#include "grove/manifest.hpp"
#include "grove/plugin_host.hpp"
#include "grove/plugin_worker.hpp"
#include "grove/reward_set.hpp"
#include "grove/run_config.hpp"
#include "plugin_test_support.hpp"
#include "plugins/worker_protocol.hpp"

extern char** environ;

namespace {

const std::string kMisbehaving = std::string(GROVE_TEST_PLUGIN_FIXTURES) + "/misbehaving/libmisbehaving.so";

// The [[rewards]] tables of a manifest, as grove train reads them.
std::vector<grove::PluginUse> rewards(const std::string& tables) {
    const std::string text = "[model]\npath = \"m\"\n[data]\nsource = \"d.jsonl\"\n" + tables;
    return grove::Manifest::parse(text, "/runs/grove.toml").rewards();
}

std::string misbehaving(const std::string& behaviour, const std::string& isolation_keys) {
    return "[[rewards]]\nplugin = \"" + kMisbehaving + "\"\nconfig = { behaviour = \"" + behaviour + "\", from_step = 3 }\n" +
           isolation_keys;
}

// Four rows at `step`, two with a format the format plugin accepts.
grove::RewardRows rows_at(int64_t step) {
    grove::RewardRows rows;
    rows.num_generations = 2;
    rows.step = step;
    rows.max_steps = 10;
    for (const char* completion : {"<answer>4</answer>", "four", "<answer>5</answer>", "\xff\xfe not UTF-8"})
        rows.add("What is 2+2?", completion, {1, 2, 3}, false, "{\"answer\": \"4\"}");
    return rows;
}

std::string error_of(grove::RewardSet& set, int64_t step) {
    grove::RewardRows rows = rows_at(step);
    try {
        set.score(rows.view());
    } catch (const grove::Error& e) {
        EXPECT_EQ(int(e.kind()), int(grove::ErrorKind::plugin)) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
}

TEST(Isolation, AWorkerScoresExactlyAsInProcess) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    const std::string tables =
        "[[rewards]]\nplugin = \"format\"\nconfig = { pattern = \"<answer>.*</answer>\" }\n" + misbehaving("fine", "");
    grove::RewardSet in_process(host, rewards(tables));
    grove::RewardSet isolated(host, rewards("[[rewards]]\nplugin = \"format\"\nconfig = { pattern = \"<answer>.*</answer>\" }\n"
                                            "isolation = \"process\"\n" +
                                            misbehaving("fine", "isolation = \"process\"\n")));
    for (int64_t step : {1, 2}) {
        grove::RewardRows rows = rows_at(step);
        grove::RewardScores a = in_process.score(rows.view()), b = isolated.score(rows.view());
        ASSERT_EQ(a.values.size(), 2u);
        EXPECT_EQ(a.values, b.values);
        EXPECT_EQ(a.metric_names, b.metric_names);
        ASSERT_EQ(a.metrics.size(), b.metrics.size());
        for (size_t m = 0; m < a.metrics.size(); ++m)
            for (size_t i = 0; i < a.metrics[m].size(); ++i)
                EXPECT_TRUE(a.metrics[m][i] == b.metrics[m][i] || (std::isnan(a.metrics[m][i]) && std::isnan(b.metrics[m][i])));
        EXPECT_EQ(a.values[0], (std::vector<float>{1, 0, 1, 0})) << "the format plugin saw the rows";
        // what the plugin logged per row (TRL's log_extra), in two calls, across the worker too
        const grove::ExtraColumns expected{{"misbehaving/row", {"0", "1", "2", "3"}},
                                           {"misbehaving/vowels", {"4", "2", "4", "1"}}};
        EXPECT_EQ(a.extra, expected);
        EXPECT_EQ(b.extra, expected);
    }
}

TEST(Isolation, ACrashingPluginIsAnErrorNamingItTheSignalAndTheBatch) {
    grove::PluginHost host({});
    const struct {
        const char* behaviour;
        const char* says;
    } cases[] = {{"segfault", "crashed with signal 11 (Segmentation fault)"},
                 {"abort", "crashed with signal 6 (Aborted)"},
                 {"exit", "exited with status 7"},
                 {"fail", "the judge is unreachable"}};
    for (const auto& c : cases) {
        grove::RewardSet set(host, rewards(misbehaving(c.behaviour, "isolation = \"process\"\n")));
        EXPECT_EQ(set.score(rows_at(2).view()).values[0], std::vector<float>(4, 1.0f)) << "step 2 behaves";
        const std::string message = error_of(set, 3);
        EXPECT_CONTAINS(message, c.says);
        EXPECT_CONTAINS(message, "misbehaving");
        if (std::string(c.behaviour) != "fail") {
            EXPECT_CONTAINS(message, "/runs/grove.toml:5:1 [[rewards]] #1");
            EXPECT_CONTAINS(message, "scoring the batch of step 3 (rows 0 to 3)");
        }
    }
}

TEST(Isolation, AHangingPluginIsKilledAtItsTimeout) {
    grove::PluginHost host({});
    grove::RewardSet set(host, rewards(misbehaving("hang", "isolation = \"process\"\ntimeout = 1\n")));
    const auto start = std::chrono::steady_clock::now();
    const std::string message = error_of(set, 3);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_CONTAINS(message, "did not answer within its timeout of 1");
    EXPECT_CONTAINS(message, "step 3");
    EXPECT_LT(seconds, 10.0);
}

TEST(Isolation, NoiseOnStdoutDoesNotReachTheProtocol) {
    grove::PluginHost host({});
    grove::RewardSet set(host, rewards(misbehaving("garbage", "isolation = \"process\"\n")));
    grove::RewardRows rows = rows_at(3);
    grove::RewardScores scores = set.score(rows.view());
    EXPECT_EQ(scores.values[0], std::vector<float>(4, 1.0f));
    ASSERT_EQ(scores.metric_names, std::vector<std::string>{"misbehaving/calls"});
}

TEST(Isolation, OnFailureNanScoresTheBatchNanAndStartsANewWorker) {
    grove::PluginHost host({});
    grove::RewardSet set(host, rewards(misbehaving("segfault", "isolation = \"process\"\non_failure = \"nan\"\n")));
    grove::RewardRows crashing = rows_at(4), fine = rows_at(2);
    const grove::RewardScores failed = set.score(crashing.view());
    for (float v : failed.values[0]) EXPECT_TRUE(std::isnan(v));
    EXPECT_EQ(set.score(fine.view()).values[0], std::vector<float>(4, 1.0f)) << "a new worker scores the next batch";
}

// An environment in a worker: the same stop strings, answers and episode scores as in-process; a
// crash in step() names the environment, the signal, the call and its episodes.
grove::PluginUse environment_use(const std::string& behaviour, bool isolated) {
    const std::string text = "[model]\npath = \"m\"\n[data]\nsource = \"d.jsonl\"\n[environment]\nplugin = \"" + kMisbehaving +
                             "\"\nconfig = { behaviour = \"" + behaviour + "\", from_step = 3 }\n" +
                             (isolated ? "isolation = \"process\"\ntimeout = 5\n" : "") + "[[rewards]]\nplugin = \"format\"\n";
    return *grove::RunConfig::from(grove::Manifest::parse(text, "/runs/grove.toml")).environment.use;
}

grove::EnvironmentTurns waiting_turns(int64_t step) {
    grove::EnvironmentTurns turns;
    turns.step = step;
    turns.add(4, 1, "first <call>x</call>", {1, 2, 3}, false, "p", "{}");
    turns.add(5, 2, "second \xff", {4}, true, "p", "{\"a\": 1}");
    return turns;
}

TEST(Isolation, AnEnvironmentInAWorkerAnswersAsInProcess) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    const grove::EnvironmentRewardSettings as_reward{1.0, std::nullopt};
    auto in_process = grove::make_environment(host, environment_use("fine", false), as_reward, {}, false);
    auto isolated = grove::make_environment(host, environment_use("fine", true), as_reward, {}, false);
    EXPECT_EQ(isolated->stop_strings(), (std::vector<std::string>{"</call>"}));
    EXPECT_EQ(isolated->stop_strings(), in_process->stop_strings());
    EXPECT_TRUE(isolated->scores_episodes());
    EXPECT_FALSE(isolated->begins_episodes());
    grove::EnvironmentTurns a = waiting_turns(1), b = waiting_turns(1);
    const grove::EnvironmentAnswers x = in_process->step(a), y = isolated->step(b);
    EXPECT_EQ(x.observations, (std::vector<std::string>{"<seen 3>", "<seen 1>"}));
    EXPECT_EQ(x.observations, y.observations);
    EXPECT_EQ(x.done, y.done);
    EXPECT_EQ(x.tool_calls, y.tool_calls);
    EXPECT_EQ(in_process->score_episodes(a), isolated->score_episodes(b));
}

// episode_reward (SDK 1.9) answering none of GROVE_EPISODES_* is the plugin's error, named, not a guess
TEST(Isolation, AnEnvironmentsUnknownJudgementIsRefused) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    for (bool isolated : {false, true})
        EXPECT_CONTAINS(grove::test::error_message(
                            [&] { grove::make_environment(host, environment_use("bad_judgement", isolated), {}, {}, false); }),
                        "episode_reward() answered judgement 7, which is none of GROVE_EPISODES_UNJUDGED");
}

TEST(Isolation, AnEnvironmentThatCrashesIsNamedWithItsCall) {
    grove::PluginHost host({});
    auto environment = grove::make_environment(host, environment_use("segfault", true), {}, {}, false);
    grove::EnvironmentTurns turns = waiting_turns(3);
    try {
        environment->step(turns);
        ADD_FAILURE() << "no error";
    } catch (const grove::Error& e) {
        const std::string message = e.what();
        EXPECT_CONTAINS(message, "[environment]: environment plugin 'misbehaving_env'");
        EXPECT_CONTAINS(message,
                        "crashed with signal 11 (Segmentation fault) while step for the episodes of "
                        "generation-batch rows 4 to 5 (step 3)");
    }
}

TEST(Isolation, TimeoutAndOnFailureNeedAProcess) {
    try {
        rewards("[[rewards]]\nplugin = \"format\"\ntimeout = 5\n");
        ADD_FAILURE() << "no error";
    } catch (const grove::Error& e) {
        EXPECT_CONTAINS(std::string(e.what()), "add isolation = \"process\"");
    }
}

// The worker protocol tells a frame that breaks it (the host then trusts the worker with no other
// call) from a timeout (the host kills the worker and names it), and both from a closed socket.
TEST(Isolation, AMalformedFrameIsToldApartFromATimeout) {
    struct Outcome {
        bool closed = false, malformed = false, other_error = false, timed_out = false;
    };
    auto read_after = [](const std::string& bytes, bool close_writer) {
        int fds[2];
        Outcome outcome;
        if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return outcome;
        if (!bytes.empty() && ::write(fds[1], bytes.data(), bytes.size()) != ssize_t(bytes.size())) return outcome;
        if (close_writer) ::close(fds[1]);
        try {
            outcome.closed = !grove::worker::read_frame(fds[0], 0.2, &outcome.timed_out);
        } catch (const grove::worker::MalformedFrame&) {
            outcome.malformed = true;
        } catch (const grove::Error&) {
            outcome.other_error = true;
        }
        ::close(fds[0]);
        if (!close_writer) ::close(fds[1]);
        return outcome;
    };
    const Outcome bad_magic = read_after(std::string(16, 'x'), true);
    EXPECT_TRUE(bad_magic.malformed && !bad_magic.timed_out);
    const Outcome cut = read_after("GRVW12", true);
    EXPECT_TRUE(cut.malformed && !cut.timed_out);
    const Outcome silent = read_after("", false);
    EXPECT_TRUE(silent.other_error && silent.timed_out && !silent.malformed);
    const Outcome closed = read_after("", true);
    EXPECT_TRUE(closed.closed && !closed.malformed && !closed.other_error);
}

// GROVE_PLUGIN_WORKER and the fake worker's settings (fake_worker.cpp) for one scope.
class FakeWorker {
public:
    explicit FakeWorker(const std::string& mode) {
        ::setenv("GROVE_PLUGIN_WORKER", GROVE_TEST_FAKE_WORKER, 1);
        ::setenv("GROVE_FAKE_WORKER_MODE", mode.c_str(), 1);
        ::setenv("GROVE_FAKE_WORKER_LOG", log_.c_str(), 1);
        std::filesystem::remove(log_);
    }
    ~FakeWorker() {
        for (const char* name : {"GROVE_PLUGIN_WORKER", "GROVE_FAKE_WORKER_MODE", "GROVE_FAKE_WORKER_LOG"}) ::unsetenv(name);
        std::filesystem::remove(log_);
    }
    size_t starts() const {
        std::ifstream in(log_);
        size_t lines = 0;
        for (std::string line; std::getline(in, line);) ++lines;
        return lines;
    }

private:
    std::string log_ = (std::filesystem::temp_directory_path() / ("grove_fake_worker_" + std::to_string(::getpid()))).string();
};

// A reply that frames well but does not decode (scores, or an error) is not trusted: the error
// names the plugin and the call, and the worker is stopped, so the next call starts a new one.
TEST(Isolation, AReplyThatDoesNotDecodeStopsTheWorker) {
    for (const std::string mode : {"undecodable", "bad_failure"}) {
        FakeWorker fake(mode);
        grove::PluginHost host({});
        grove::RewardSet set(host, rewards(misbehaving("fine", "isolation = \"process\"\n")));
        EXPECT_EQ(fake.starts(), 1u);
        const std::string message = error_of(set, 1);
        EXPECT_CONTAINS(message, "reward plugin 'misbehaving'");
        EXPECT_CONTAINS(message, mode == "undecodable"
                                     ? "scoring the batch of step 1 (rows 0 to 3) with a reply that does not fit"
                                     : "scoring the batch of step 1 (rows 0 to 3) with a failure that does not decode");
        EXPECT_CONTAINS(message, "it was stopped");
        error_of(set, 2);
        EXPECT_EQ(fake.starts(), 2u) << mode << ": the second call started a new worker";
    }
}

// The worker trusts no frame: a batch whose offsets run backwards (which would slice past its
// tokens) is refused as malformed, a reward batch and an environment batch alike.
TEST(Isolation, AWorkerRefusesABatchWhoseOffsetsRunBackwards) {
    const auto refusal = [](auto decode) { return grove::test::error_message(decode); };
    grove::RewardRows rows = rows_at(1);  // four rows of three tokens
    EXPECT_EQ(grove::worker::decode_batch(grove::worker::encode_batch(rows.view())).tokens.size(), 12u);
    rows.token_offsets = {0, 3, 9, 6, 12};
    EXPECT_CONTAINS(refusal([&] { grove::worker::decode_batch(grove::worker::encode_batch(rows.view())); }),
                    "the host sent a malformed batch");

    grove::EnvironmentTurns turns;
    turns.add(0, 1, "a", {1, 2}, true, "p", "{}");
    turns.add(1, 1, "b", {3}, true, "p", "{}");
    EXPECT_EQ(grove::worker::decode_turns(grove::worker::encode_turns(turns.view())).tokens.size(), 3u);
    turns.token_offsets = {0, 4, 3};
    EXPECT_CONTAINS(refusal([&] { grove::worker::decode_turns(grove::worker::encode_turns(turns.view())); }),
                    "the host sent a malformed environment batch");
}

// A worker that ends on the start frame, as one from an older build of Grove does, is named with
// the question whether it comes from this build.
TEST(Isolation, AWorkerThatEndsAtTheStartFrameIsAskedAbout) {
    FakeWorker fake("exit");
    grove::PluginHost host({});
    try {
        grove::RewardSet set(host, rewards(misbehaving("fine", "isolation = \"process\"\n")));
        ADD_FAILURE() << "no error";
    } catch (const grove::Error& e) {
        const std::string message = e.what();
        EXPECT_CONTAINS(message, "exited with status 1 while starting");
        EXPECT_CONTAINS(message, std::string("(is ") + GROVE_TEST_FAKE_WORKER + " from this build of Grove?)");
    }
}

// The real worker answers a start frame of another protocol version with a failure naming both
// versions, rather than misreading the frame's fields.
TEST(Isolation, TheWorkerRefusesAStartFrameOfAnotherProtocolVersion) {
    int ends[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, ends), 0);
    const std::string worker = grove::plugin_worker_path();
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, ends[1], 3);
    std::string fd_argument = "3";
    char* argv[] = {const_cast<char*>(worker.c_str()), fd_argument.data(), nullptr};
    pid_t pid = -1;
    ASSERT_EQ(::posix_spawn(&pid, worker.c_str(), &actions, nullptr, argv, environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(ends[1]);
    grove::worker::Writer start;
    start.u32(grove::worker::kProtocolVersion + 1);
    start.u32(GROVE_PLUGIN_KIND_REWARD);
    ASSERT_TRUE(grove::worker::write_frame(ends[0], grove::worker::FrameType::start, start.payload()));
    const auto reply = grove::worker::read_frame(ends[0], 10);
    ::close(ends[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(reply);
    ASSERT_EQ(reply->type, grove::worker::FrameType::failure);
    grove::worker::Reader r(reply->payload);
    r.u32();
    const std::string message = r.bytes();
    EXPECT_CONTAINS(message, "speaks worker protocol " + std::to_string(grove::worker::kProtocolVersion) +
                                 " but Grove sent version " + std::to_string(grove::worker::kProtocolVersion + 1));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
}

// Two rewards that log the same column: the second's is kept apart under its reward's name.
TEST(Isolation, TwoRewardsLoggingOneColumnKeepBoth) {
    grove::PluginHost host({});
    const std::string tables = misbehaving("fine", "name = \"first\"\n") + misbehaving("fine", "name = \"second\"\n");
    grove::RewardSet set(host, rewards(tables));
    const grove::ExtraColumns extra = set.score(rows_at(1).view()).extra;
    const std::vector<std::string> rows{"0", "1", "2", "3"};
    const std::vector<std::string> vowels{"4", "2", "4", "1"};
    EXPECT_EQ(extra, (grove::ExtraColumns{{"misbehaving/row", rows},
                                          {"misbehaving/vowels", vowels},
                                          {"second/misbehaving/row", rows},
                                          {"second/misbehaving/vowels", vowels}}));
}

// Values logged per row by column: a second call fills the rows after the first's; more values than
// rows, or a value that is not JSON, is an error naming the column.
TEST(Isolation, ExtraColumnsFillRowsInOrderAndRefuseWhatDoesNotFit) {
    grove::RewardLogs logs;
    logs.extras = {{"answer", {"4", "\"five\""}}, {"parsed", {"true"}}, {"answer", {"null"}}};
    const grove::ExtraColumns columns = grove::extra_columns(logs, 4);
    EXPECT_EQ(columns, (grove::ExtraColumns{{"answer", {"4", "\"five\"", "null", ""}}, {"parsed", {"true", "", "", ""}}}));
    logs.extras.push_back({"parsed", {"1", "2", "3", "4"}});
    EXPECT_CONTAINS(grove::test::error_message([&] { grove::extra_columns(logs, 4); }),
                    "logged 5 values for the column 'parsed' of a batch of 4 rows");
    logs.extras = {{"answer", {"four"}}};
    EXPECT_CONTAINS(grove::test::error_message([&] { grove::extra_columns(logs, 4); }),
                    "a value for the column 'answer' that is not JSON: four");
}

}  // namespace
