// The warm-start pipeline from nothing: a tokenizer trained on the built-in task, a freshly
// initialised Llama, `grove sft` on the reference completions, and `grove eval` of the result.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "plugin_test_support.hpp"

namespace fs = std::filesystem;

TEST(Sft, FromScratchTheModelLearnsTheAnswerFormat) {
    std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/sft";
    fs::remove_all(dir);
    fs::create_directories(dir);
    auto step = [&](const std::string& args) {
        auto r = grove::test::run_grove(args);
        EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.out;
        return r;
    };
    step("tokenizer train --input builtin:arithmetic --out " + dir +
         "/tok --vocab-size 512 --symbol '<think>' "
         "--symbol '</think>' --symbol '<answer>' --symbol '</answer>'");
    step("init-model " + dir + "/base --tokenizer " + dir +
         "/tok --hidden 64 --layers 2 --heads 4 --kv-heads 2 "
         "--intermediate 192 --seed 1");
    auto before = nlohmann::json::parse(step("eval --model " + dir +
                                             "/base --data builtin:arithmetic-test --limit 20 "
                                             "--reward format --greedy --max-new-tokens 24 --json 2>/dev/null")
                                            .out);
    std::ofstream(dir + "/sft.toml") << "[model]\npath = \"base\"\nchat_template = \"plain\"\n"
                                        "[data]\nsource = \"builtin:arithmetic\"\n"
                                        "[[rewards]]\nplugin = \"correctness\"\n"
                                        "[train]\nper_device_train_batch_size = 16\nlearning_rate = 3e-3\nwarmup_steps = 5\n"
                                        "lr_scheduler_type = \"cosine\"\nmax_steps = 100\n"
                                        "[output]\ndir = \"sft\"\n[logging]\nlogging_steps = 10\n";
    step("sft " + dir + "/sft.toml");
    std::vector<double> losses;
    std::ifstream metrics(dir + "/sft/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    ASSERT_EQ(losses.size(), 100u);
    EXPECT_LT(losses.back(), 0.5 * losses.front()) << "loss " << losses.front() << " -> " << losses.back();
    auto after = nlohmann::json::parse(step("eval --model " + dir +
                                            "/sft --data builtin:arithmetic-test --limit 20 "
                                            "--reward format --greedy --max-new-tokens 24 --json 2>/dev/null")
                                           .out);
    EXPECT_EQ(before["format_rate"].get<double>(), 0.0);  // a random model never writes the format
    EXPECT_GE(after["format_rate"].get<double>(), 0.8) << after["rows"][0]["completion"];
}
