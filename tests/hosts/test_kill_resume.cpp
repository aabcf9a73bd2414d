// `grove train` killed, stopped or starved anywhere resumes to the same run (docs/reliability.md):
// SIGKILL at start-up, mid-step and while a checkpoint is written (by one process or one of two
// ranks), then --resume, ends with weights and optimizer state bit-identical to an uninterrupted
// run; damaged checkpoints are refused with the file and the checkpoint to use instead; an
// unwritable output folder or a full disk is an error that leaves the last checkpoint whole.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "plugin_test_support.hpp"

namespace fs = std::filesystem;

namespace {

using grove::test::run_command;

const std::string kModel = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/llama_gqa";

// A run folder: 12 prompts, a manifest of 4 steps with a checkpoint after each, and two micro-batches
// per generation batch, so odd steps checkpoint inside a generation batch.
std::string make_run(const std::string& name) {
    const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/kill_resume/" + name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream prompts(dir + "/prompts.jsonl");
    for (int i = 0; i < 12; ++i)
        prompts << nlohmann::json({{"prompt", "What is " + std::to_string(i) + " + 2?"}}).dump() << "\n";
    std::ofstream(dir + "/grove.toml")
        << "[model]\npath = \"" << kModel
        << "\"\nchat_template = \"none\"\n"
           "[data]\nsource = \"prompts.jsonl\"\n"
           "[generation]\nnum_generations = 2\nmax_completion_length = 6\n"
           "[[rewards]]\nplugin = \"format\"\nconfig = { pattern = \"[aeiou]\", full_match = false }\n"
           "[train]\nmax_steps = 4\nlearning_rate = 0.05\nseed = 3\n"
           "per_device_train_batch_size = 2\nsteps_per_generation = 2\n"
           "[output]\ndir = \"out\"\nsave_steps = 1\n";
    return dir;
}

// `grove train` in `dir` with `flags`; `environment` is prefixed (e.g. GROVE_TEST_KILL_AT=save:3).
grove::test::CommandResult train(const std::string& dir, const std::string& flags, const std::string& environment = "") {
    return run_command("cd " + dir + " && " + environment + " " + GROVE_EXECUTABLE + " train grove.toml " + flags);
}

std::string bytes_of(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

std::vector<nlohmann::json> metric_lines(const std::string& path) {
    std::vector<nlohmann::json> rows;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
    return rows;
}

TEST(KillResume, SigkillAnywhereThenResumeEndsBitIdentical) {
    const std::string straight = make_run("straight");
    ASSERT_EQ(train(straight, "").exit_code, 0);

    const std::string killed = make_run("killed");
    const std::string out = killed + "/out";
    // killed before any checkpoint: --resume starts from step 0
    ASSERT_EQ(train(killed, "", "GROVE_TEST_KILL_AT=startup:0").exit_code, 137);
    // mid-step 2: gradients accumulated, no update applied; checkpoint-1 is inside a generation batch
    auto r = train(killed, "--resume", "GROVE_TEST_KILL_AT=step:2");
    ASSERT_EQ(r.exit_code, 137) << r.out;
    EXPECT_CONTAINS(r.out, "no checkpoint yet; starting from step 0");
    ASSERT_TRUE(fs::exists(out + "/checkpoint-1/buffer.safetensors"));
    ASSERT_FALSE(fs::exists(out + "/checkpoint-2"));
    // while checkpoint-3 is written: its temporary folder is left, never taken for a checkpoint
    ASSERT_EQ(train(killed, "--resume", "GROVE_TEST_KILL_AT=save:3").exit_code, 137);
    EXPECT_TRUE(fs::exists(out + "/.tmp-checkpoint-3/trainable.safetensors"));
    ASSERT_FALSE(fs::exists(out + "/checkpoint-3"));
    // right after resuming from checkpoint-2, once the logs were cut back to it
    ASSERT_EQ(train(killed, "--resume", "GROVE_TEST_KILL_AT=startup:2").exit_code, 137);
    r = train(killed, "--resume");
    ASSERT_EQ(r.exit_code, 0) << r.out;

    for (const char* file : {"trainable.safetensors", "optimizer.safetensors"}) {
        const std::string a = bytes_of(straight + "/out/checkpoint-4/" + file), b = bytes_of(out + "/checkpoint-4/" + file);
        ASSERT_GT(a.size(), 1000u) << file;
        EXPECT_TRUE(a == b) << file << " differs from the uninterrupted run's";
    }
    auto a = metric_lines(straight + "/out/metrics.jsonl"), b = metric_lines(out + "/metrics.jsonl");
    ASSERT_EQ(b.size(), 4u) << "every step once, after four kills";
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(b[i]["step"], int(i + 1));
        EXPECT_EQ(a[i]["loss"], b[i]["loss"]) << "step " << i + 1;
        EXPECT_EQ(a[i]["grad_norm"], b[i]["grad_norm"]) << "step " << i + 1;
    }
}

// Two ranks (`--nproc 2`, the optimizer state sharded between them), one killed while checkpoint-3
// is written: rank 1 once it has written its part, then rank 0 before the rename. Each time the
// launcher names the killed rank and stops the other, checkpoint-2 stays the latest, and the run resumed from it ends
// byte-identical to an uninterrupted two-rank run.
TEST(KillResume, ARankKilledWhileACheckpointIsWrittenLeavesTheLastOneToResume) {
    const std::string ranks = "--nproc 2 --set train.shard_optimizer_state=true";
    const std::string straight = make_run("ranks_straight");
    ASSERT_EQ(train(straight, ranks).exit_code, 0);

    const std::string killed = make_run("ranks_killed"), out = killed + "/out";
    // The other rank's collective may fail before the launcher stops it (it then removes the
    // temporary folder) and exit first; the launcher still names the killed rank as the cause.
    for (const auto& [kill, killed_rank] : {std::pair{"shards:3@1", "1"}, std::pair{"save:3@0", "0"}}) {
        auto r = train(killed, ranks + " --resume", std::string("GROVE_TEST_KILL_AT=") + kill);
        ASSERT_NE(r.exit_code, 0) << kill << "\n" << r.out;
        EXPECT_CONTAINS(r.out, std::string("grove: rank ") + killed_rank + " of 2 failed (killed by signal 9, ");
        EXPECT_CONTAINS(r.out, "the other ranks were stopped");
        EXPECT_FALSE(fs::exists(out + "/checkpoint-3")) << kill;
        EXPECT_EQ(fs::read_symlink(out + "/latest").string(), "checkpoint-2") << kill;
    }
    auto r = train(killed, ranks + " --resume");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    for (const char* file :
         {"trainable.safetensors", "optimizer.safetensors", "buffer.safetensors", "buffer.rank1.safetensors"}) {
        const std::string a = bytes_of(straight + "/out/checkpoint-3/" + file), b = bytes_of(out + "/checkpoint-3/" + file);
        ASSERT_GT(a.size(), 100u) << file;
        EXPECT_TRUE(a == b) << file << " differs from the uninterrupted run's";
    }
    for (const char* file : {"trainable.safetensors", "optimizer.safetensors"})
        EXPECT_TRUE(bytes_of(straight + "/out/checkpoint-4/" + file) == bytes_of(out + "/checkpoint-4/" + file)) << file;
}

// A checkpoint whose files changed after they were written is refused, naming the file and the
// previous checkpoint to resume from.
TEST(KillResume, DamagedCheckpointsAreNamedWithThePreviousOne) {
    const std::string dir = make_run("damaged");
    const std::string out = dir + "/out";
    ASSERT_EQ(train(dir, "--set train.max_steps=2").exit_code, 0);
    const std::string pristine = out + "/../pristine";
    fs::copy(out + "/checkpoint-2", pristine, fs::copy_options::recursive);
    auto restore = [&] {
        fs::remove_all(out + "/checkpoint-2");
        fs::copy(pristine, out + "/checkpoint-2", fs::copy_options::recursive);
    };
    auto resume = [&] { return train(dir, "--resume --set train.max_steps=3"); };

    {  // one flipped byte in the optimizer's moments (inverted: a constant may equal what is there)
        std::fstream f(out + "/checkpoint-2/optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(-7, std::ios::end);
        const char byte = char(f.get());
        f.seekp(-7, std::ios::end);
        f.put(char(~byte));
    }
    auto r = resume();
    EXPECT_EQ(r.exit_code, 5);
    EXPECT_CONTAINS(r.out, "checkpoint-2/optimizer.safetensors does not match the checksum");
    EXPECT_CONTAINS(r.out, "--resume out/checkpoint-1");
    restore();
    fs::resize_file(out + "/checkpoint-2/trainable.safetensors", 100);
    r = resume();
    EXPECT_EQ(r.exit_code, 5);
    EXPECT_CONTAINS(r.out, "trainable.safetensors has 100 bytes where");
    restore();
    fs::remove(out + "/checkpoint-1/buffer.safetensors");  // checkpoint-1 is inside a generation batch
    r = train(dir, "--resume out/checkpoint-1");
    EXPECT_EQ(r.exit_code, 5);
    EXPECT_CONTAINS(r.out, "checkpoint-1/buffer.safetensors is missing");
    EXPECT_CONTAINS(r.out, "no earlier checkpoint is left; start again with --overwrite");
    std::ofstream(out + "/checkpoint-2/trainer_state.json") << "{\"global_step\": 2, \"micro_st";
    r = resume();
    EXPECT_EQ(r.exit_code, 5);
    EXPECT_CONTAINS(r.out, "checkpoint-2/trainer_state.json is not valid JSON (cut short or damaged)");
    EXPECT_CONTAINS(r.out, "--resume out/checkpoint-1");
    std::ofstream(out + "/checkpoint-2/trainer_state.json") << "{\"global_step\": 1e300}";
    r = resume();
    EXPECT_EQ(r.exit_code, 5);
    EXPECT_CONTAINS(r.out, "global_step: 1e+300 is not an integer");
    fs::create_directories(out + "/checkpoint-old");  // a stray folder is no checkpoint
    restore();
    r = resume();
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_TRUE(fs::exists(out + "/checkpoint-3/trainer_state.json"));
}

// An output folder Grove cannot write to is refused before the model loads.
TEST(KillResume, AnUnwritableOutputFolderIsRefusedAtStartUp) {
    const std::string dir = make_run("unwritable");
    // /proc takes no new folders, even from root (tests may run as root, which ignores permissions)
    auto r = train(dir, "--set 'output.dir=\"/proc/grove-test-output\"'");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_CONTAINS(r.out, "output.dir /proc/grove-test-output is not writable");
    EXPECT_CONTAINS(r.out, "set output.dir to another folder");
    EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
}

// A disk that fills up while a checkpoint is written (a file-size limit, with SIGXFSZ ignored so the
// write fails as it would on a full disk): an error naming the last whole checkpoint, which then
// resumes to the same weights as a run that never failed.
TEST(KillResume, AFullDiskLeavesTheLastCheckpointWhole) {
    const std::string straight = make_run("disk_straight");
    ASSERT_EQ(train(straight, "--set train.max_steps=2").exit_code, 0);
    const std::string dir = make_run("disk_full");
    const std::string out = dir + "/out";
    ASSERT_EQ(train(dir, "--set train.max_steps=1").exit_code, 0);
    // 200 KiB per file (bash counts in KiB): the logs fit, the model's 437 kB safetensors does not
    auto limited = [](const std::string& run_dir, const std::string& flags) {
        return run_command("cd " + run_dir + " && bash -c \"trap '' XFSZ; ulimit -f 200; " + GROVE_EXECUTABLE +
                           " train grove.toml " + flags + "\"");
    };
    auto r = limited(dir, "--resume --set train.max_steps=2");
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_CONTAINS(r.out, "could not write out/checkpoint-2");
    EXPECT_CONTAINS(r.out, "File too large");
    EXPECT_CONTAINS(r.out, "The last checkpoint, out/checkpoint-1, is whole");
    EXPECT_FALSE(fs::exists(out + "/.tmp-checkpoint-2")) << "the partial checkpoint is removed";
    r = train(dir, "--resume --set train.max_steps=2");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_TRUE(bytes_of(straight + "/out/checkpoint-2/trainable.safetensors") ==
                bytes_of(out + "/checkpoint-2/trainable.safetensors"));
    // no checkpoint at all yet: the message says to start again
    const std::string first = make_run("disk_full_first");
    r = limited(first, "");
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_CONTAINS(r.out, "No checkpoint was written yet");
}

// A reward plugin that crashes in its worker process ([[rewards]] isolation = "process") stops the run
// with an error naming it, the signal and the batch; the last checkpoint resumes once the plugin is
// fixed. With on_failure = "nan" the run goes on.
TEST(KillResume, AnIsolatedRewardThatCrashesLeavesAResumableRun) {
    const std::string dir = make_run("isolated_crash");
    const std::string reward = std::string("[[rewards]]\nplugin = \"") + GROVE_TEST_MISBEHAVING_PLUGIN +
                               "\"\nisolation = \"process\"\nconfig = { behaviour = \"BEHAVIOUR\", from_step = 2 }\n";
    auto use = [&](const std::string& behaviour, const std::string& extra) {
        std::ifstream in(dir + "/grove.toml");
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        text = text.substr(0, text.find("[[rewards]]\nplugin = \"/")) + extra;
        std::string table = reward;
        table.replace(table.find("BEHAVIOUR"), 9, behaviour);
        std::ofstream(dir + "/grove.toml") << text << table;
    };
    use("segfault", "");
    auto r = train(dir, "");
    EXPECT_EQ(r.exit_code, 4) << r.out;
    EXPECT_CONTAINS(r.out, "crashed with signal 11 (Segmentation fault) while scoring the batch of step 2");
    EXPECT_CONTAINS(r.out, "grove.toml:21:1 [[rewards]] #2");
    ASSERT_TRUE(fs::exists(dir + "/out/checkpoint-2/trainer_state.json")) << "the steps before the crash were saved";
    use("fine", "");
    r = train(dir, "--resume");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_TRUE(fs::exists(dir + "/out/checkpoint-4/trainer_state.json"));

    const std::string tolerant = make_run("isolated_nan");
    std::ofstream(tolerant + "/grove.toml", std::ios::app)
        << std::string(reward).replace(reward.find("BEHAVIOUR"), 9, "abort") << "on_failure = \"nan\"\n";
    r = train(tolerant, "");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_CONTAINS(r.out, "crashed with signal 6 (Aborted)");
    EXPECT_CONTAINS(r.out, "this batch scores NaN (on_failure = \"nan\")");
}

}  // namespace
