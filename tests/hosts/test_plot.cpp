// `grove plot RUN_DIR`: the data it plots (raw and moving average, last row of a repeated step),
// a real PNG from gnuplot, and the messages for a missing run or a missing gnuplot.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "plugin_test_support.hpp"

namespace fs = std::filesystem;
using grove::test::run_grove;

namespace {

std::string make_run(const std::string& name) {
    std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/core/" + name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream metrics(dir + "/metrics.jsonl");
    for (int step = 1; step <= 10; ++step) {
        nlohmann::json row = {{"step", step},
                              {"reward", 0.5 + 0.1 * step},
                              {"rewards/correctness/mean", 0.1 * step},
                              {"rewards/format/mean", 1.0},
                              {"kl", 0.01 * step},
                              {"grad_norm", 2.0},
                              {"entropy", 1.5},
                              {"completions/mean_length", 20}};
        if (step % 3 == 0) row["eval_reward"] = 0.05 * step;  // train.eval_steps = 3
        metrics << row.dump() << "\n";
        if (step == 5) {  // a resumed run repeats step 5: the later row is the one plotted
            row["rewards/correctness/mean"] = 0.9;
            metrics << row.dump() << "\n";
        }
    }
    return dir;
}

// plot.tsv as rows of cells, keyed by the header
std::vector<std::map<std::string, std::string>> read_tsv(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> header;
    std::vector<std::map<std::string, std::string>> rows;
    for (std::string line; std::getline(in, line);) {
        std::vector<std::string> cells;
        std::stringstream ss(line);
        for (std::string cell; std::getline(ss, cell, '\t');) cells.push_back(cell);
        if (header.empty()) {
            header = cells;
            continue;
        }
        std::map<std::string, std::string> row;
        for (size_t i = 0; i < cells.size() && i < header.size(); ++i) row[header[i]] = cells[i];
        rows.push_back(row);
    }
    return rows;
}

}  // namespace

TEST(Plot, WritesThePngTheDataAndTheScript) {
    std::string run = make_run("plot-run");
    auto r = run_grove("plot " + run + " --smooth 3");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_CONTAINS(r.out, "wrote " + run + "/metrics.png (10 steps");
    std::ifstream png(run + "/metrics.png", std::ios::binary);
    char magic[8] = {};
    png.read(magic, 8);
    EXPECT_EQ(std::string(magic, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << "gnuplot wrote a PNG";
    EXPECT_GT(fs::file_size(run + "/metrics.png"), 10000u);

    auto rows = read_tsv(run + "/plot.tsv");
    ASSERT_EQ(rows.size(), 10u) << "one row per step, the repeated step once";
    EXPECT_DOUBLE_EQ(std::stod(rows[4]["rewards/correctness/mean"]), 0.9) << "the later row of step 5 wins";
    // centred moving average over 3 steps: steps 4, 5, 6 -> (0.4 + 0.9 + 0.6) / 3
    EXPECT_NEAR(std::stod(rows[4]["rewards/correctness/mean (smoothed)"]), (0.4 + 0.9 + 0.6) / 3, 1e-6);
    EXPECT_NEAR(std::stod(rows[0]["kl (smoothed)"]), (0.01 + 0.02) / 2, 1e-6) << "the window shrinks at the edges";
    for (const char* column : {"reward", "rewards/format/mean", "entropy", "grad_norm", "completions/mean_length"})
        EXPECT_TRUE(rows[0].count(column)) << column;
    EXPECT_FALSE(rows[0].count("clip_ratio/region_mean")) << "metrics the run did not log get no panel";
    // evaluation, logged every third step: its own values, not averaged with the steps between
    EXPECT_EQ(rows[0]["eval_reward (smoothed)"], "NaN");
    EXPECT_NEAR(std::stod(rows[5]["eval_reward (smoothed)"]), 0.30, 1e-6);
    EXPECT_NEAR(std::stod(rows[8]["eval_reward"]), 0.45, 1e-6);

    std::ifstream script(run + "/plot.gp");
    std::string text((std::istreambuf_iterator<char>(script)), std::istreambuf_iterator<char>());
    EXPECT_CONTAINS(text, "accuracy on training samples");
    EXPECT_CONTAINS(text, "kl to the reference");
    EXPECT_CONTAINS(text, "held-out prompts (train.eval_steps)");
}

TEST(Plot, MissingRunOrGnuplotIsExplained) {
    auto missing = run_grove("plot /nonexistent/run");
    EXPECT_EQ(missing.exit_code, 5) << missing.out;
    EXPECT_CONTAINS(missing.out, "/nonexistent/run/metrics.jsonl: cannot read");

    std::string run = make_run("plot-no-gnuplot");
    auto no_gnuplot = grove::test::run_command("PATH=/nonexistent " + std::string(GROVE_EXECUTABLE) + " plot " + run);
    EXPECT_EQ(no_gnuplot.exit_code, 1) << no_gnuplot.out;
    EXPECT_CONTAINS(no_gnuplot.out, "apt-get install gnuplot-nox");
    EXPECT_TRUE(fs::exists(run + "/plot.tsv")) << "the data is written even without gnuplot";
}
