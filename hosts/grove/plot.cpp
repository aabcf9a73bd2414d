// grove plot RUN_DIR: a PNG of a run's metrics.jsonl through gnuplot (Debian's gnuplot-nox). Grove
// writes the data (plot.tsv) and the script (plot.gp) next to the image, so a reader can restyle it.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "cli.hpp"
#include "grove/dataset.hpp"
#include "grove/error.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace grove::cli {

namespace {

struct Panel {
    std::string title;
    std::vector<std::string> metrics;  // keys of metrics.jsonl, one line each
    bool sparse = false;               // logged on some steps only (evaluation): points joined, not averaged
};

std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

std::string gnuplot_string(const std::string& s) {  // a double-quoted gnuplot string
    std::string out = "\"";
    for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    return out + "\"";
}

}  // namespace

int plot(const std::vector<std::string>& args) {
    po::options_description options("options");
    options.add_options()("run", po::value<std::string>()->required(), "a run's output folder (holds metrics.jsonl)")(
        "out", po::value<std::string>(), "the PNG to write (default RUN_DIR/metrics.png)")(
        "smooth", po::value<int>()->default_value(0), "moving-average window in steps (default: a 20th of the run)")(
        "title", po::value<std::string>(), "a title above the panels (default: the folder name)");
    po::positional_options_description positional;
    positional.add("run", 1);
    auto vm = parse("plot", args, options, positional, "RUN_DIR [--out FILE.png] [--smooth N] [--title TEXT]");
    fs::path run = vm["run"].as<std::string>();
    fs::path out = vm.count("out") ? fs::path(vm["out"].as<std::string>()) : run / "metrics.png";

    // rows of metrics.jsonl; a resumed run may repeat steps: the last row of a step wins
    std::map<double, json> by_step;
    std::set<std::string> keys;
    fs::path metrics = run / "metrics.jsonl";
    for_each_jsonl(metrics.string(), "the run's metrics (grove train or grove sft writes metrics.jsonl)",
                   [&](json& row, const std::string& where) {
                       if (!row.is_object() || !row.contains("step") || !row["step"].is_number())
                           throw Error(ErrorKind::input, where + ": a metrics row needs a numeric \"step\"");
                       for (const auto& [key, value] : row.items())
                           if (value.is_number()) keys.insert(key);
                       double step = row["step"].get<double>();
                       by_step[step] = std::move(row);
                   });
    if (by_step.empty()) throw Error(ErrorKind::input, metrics.string() + ": no rows to plot yet");

    std::vector<std::string> rewards;
    for (const auto& key : keys)
        if (key.rfind("rewards/", 0) == 0 && key.size() > 13 && key.compare(key.size() - 5, 5, "/mean") == 0)
            rewards.push_back(key);
    std::vector<std::string> reward_lines = rewards;
    if (keys.count("reward")) reward_lines.insert(reward_lines.begin(), "reward");
    std::vector<Panel> panels = {
        {"reward (weighted sum) and mean reward per function", reward_lines},
        {"accuracy on training samples (correctness reward)", {"rewards/correctness/mean"}},
        {"mean completion length (tokens)", {"completions/mean_length"}},
        {"entropy", {"entropy"}},
        {"kl to the reference", {"kl"}},
        {"grad norm (before clipping)", {"grad_norm"}},
        {"clip ratio", {"clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean"}},
        {"loss", {"loss"}},
        {"held-out prompts (train.eval_steps)", {"eval_reward", "eval_accuracy"}, true},
    };
    std::vector<Panel> shown;
    for (auto& p : panels) {
        std::vector<std::string> present;
        for (const auto& k : p.metrics)
            if (keys.count(k)) present.push_back(k);
        if (!present.empty()) shown.push_back({p.title, present, p.sparse});
    }

    // plot.tsv: step, then every plotted metric raw and smoothed (a centred moving average)
    std::vector<std::string> columns;
    std::set<std::string> sparse;  // their "smoothed" column is the value itself
    for (const auto& p : shown)
        for (const auto& k : p.metrics) {
            if (std::find(columns.begin(), columns.end(), k) == columns.end()) columns.push_back(k);
            if (p.sparse) sparse.insert(k);
        }
    size_t n = by_step.size();
    int window = vm["smooth"].as<int>();
    if (window <= 0) window = std::max<int>(1, int(n / 20));
    std::vector<double> steps;
    std::vector<std::vector<double>> raw(columns.size());
    for (const auto& [step, row] : by_step) {
        steps.push_back(step);
        for (size_t c = 0; c < columns.size(); ++c)
            raw[c].push_back(row.contains(columns[c]) && row[columns[c]].is_number() ? row[columns[c]].get<double>() : NAN);
    }
    fs::path dir = out.parent_path().empty() ? fs::path(".") : out.parent_path();
    fs::create_directories(dir);
    fs::path data = dir / "plot.tsv", script = dir / "plot.gp";
    {
        std::ofstream tsv(data);
        tsv << "step";
        for (const auto& c : columns) tsv << "\t" << c << "\t" << c << " (smoothed)";
        tsv << "\n";
        for (size_t i = 0; i < n; ++i) {
            tsv << steps[i];
            for (size_t c = 0; c < columns.size(); ++c) {
                double sum = 0;
                int count = 0;
                const size_t half = sparse.count(columns[c]) ? 0 : size_t(window / 2);
                for (size_t j = i >= half ? i - half : 0; j <= std::min(n - 1, i + half); ++j)
                    if (std::isfinite(raw[c][j])) sum += raw[c][j], ++count;
                auto cell = [](double v) { return std::isfinite(v) ? std::to_string(v) : std::string("NaN"); };
                tsv << "\t" << cell(raw[c][i]) << "\t" << cell(count ? sum / count : NAN);
            }
            tsv << "\n";
        }
    }
    int cols = std::min<int>(4, int(shown.size())), rows = (int(shown.size()) + cols - 1) / cols;
    std::string title =
        vm.count("title") ? vm["title"].as<std::string>() : fs::absolute(run).lexically_normal().filename().string();
    if (title.empty()) title = fs::absolute(run).lexically_normal().parent_path().filename().string();
    {
        std::ofstream gp(script);
        gp << "# written by `grove plot`; rerun with: gnuplot " << script.string() << "\n"
           << "set terminal pngcairo size " << 420 * cols << "," << 340 * rows + 40 << " font 'sans,9'\n"
           << "set output " << gnuplot_string(out.string()) << "\n"
           << "set datafile separator '\\t'\nset datafile missing 'NaN'\nset grid\nset termoption noenhanced\n"
           << "set key outside below horizontal font ',8'\n"
           << "set xlabel 'step'\n"
           << "set multiplot layout " << rows << "," << cols << " title "
           << gnuplot_string(title + " (" + std::to_string(n) + " steps; lines: moving average over " + std::to_string(window) +
                             " steps, dots: every step)")
           << "\n";
        for (const auto& p : shown) {
            // a flat series (e.g. clip ratio 0 on-policy) gets a visible range instead of gnuplot's warning
            double lo = INFINITY, hi = -INFINITY;
            for (const auto& k : p.metrics) {
                size_t c = size_t(std::find(columns.begin(), columns.end(), k) - columns.begin());
                for (double v : raw[c])
                    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
            }
            if (std::isfinite(lo) && hi - lo < 1e-12)
                gp << "set yrange [" << lo - 0.5 << ":" << hi + 0.5 << "]\n";
            else
                gp << "set yrange [*:*]\n";
            gp << "set title " << gnuplot_string(p.title) << "\nplot ";
            for (size_t i = 0; i < p.metrics.size(); ++i) {
                size_t c = size_t(std::find(columns.begin(), columns.end(), p.metrics[i]) - columns.begin());
                std::string label = p.metrics[i];
                if (label.rfind("rewards/", 0) == 0) label = label.substr(8, label.size() - 13);
                int color = int(i) + 1;
                const std::string title = gnuplot_string(p.metrics.size() > 1 ? label : "");
                gp << (i ? ", \\\n     " : "") << gnuplot_string(data.string());
                if (p.sparse)  // only the steps that evaluated: each point, joined
                    gp << " using 1:" << 2 * c + 2 << " with linespoints pt 7 ps 0.6 lw 2 lc " << color << " title " << title;
                else
                    gp << " using 1:" << 2 * c + 2 << " with points pt 7 ps 0.3 lc " << color
                       << " notitle, '' using 1:" << 2 * c + 3 << " with lines lw 2 lc " << color << " title " << title;
            }
            gp << "\n";
        }
        gp << "unset multiplot\n";
    }
    if (std::system("command -v gnuplot >/dev/null 2>&1") != 0)
        throw Error(ErrorKind::runtime,
                    "grove plot needs gnuplot: apt-get install gnuplot-nox (make deps installs it). "
                    "The data and script are ready: " +
                        data.string() + ", " + script.string());
    if (int rc = std::system(("gnuplot " + shell_quote(script.string())).c_str()); rc != 0)
        throw Error(ErrorKind::runtime, "gnuplot failed on " + script.string() + " (exit " + std::to_string(rc) + ")");
    std::cout << "wrote " << out.string() << " (" << n << " steps, " << shown.size() << " panels; data " << data.string()
              << ", script " << script.string() << ")\n";
    return 0;
}

}  // namespace grove::cli
