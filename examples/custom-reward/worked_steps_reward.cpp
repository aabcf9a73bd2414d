// worked_steps — a reward plugin in C++17, built out of tree against the installed Grove SDK.
//
//   cmake -S examples/custom-reward -B build-keyword -DCMAKE_PREFIX_PATH=<grove prefix>
//   cmake --build build-keyword        (builds libkeyword_reward.so and libworked_steps_reward.so)
//
// A process reward for builtin:arithmetic: the share of the equations written inside
// <think>…</think> that are arithmetically true. "7+8=15 3+4+1=8" scores 1.0, "7+8=15 3+4+1=9" 0.5.
// Correctness rewards only the final answer; this one also gives credit for sound intermediate steps,
// so a completion that is right except for one slip is ranked above one that is wrong throughout.
//
// Config:  min_steps (int, default 1)  fewer equations than this score 0.0
//          only_if_column (string, default "")  score NaN ("not applicable") unless the dataset row
//                                               has this column, e.g. "answer"
// Metric:  steps   the number of equations found in the row's <think> block
//
// grove/plugin.hpp turns this class into a plugin: its constructor is create(), score() is the
// entry point, and any exception becomes an error status with its message (never crossing the C ABI).
#include <grove/plugin.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

// Evaluates one equation "TERM (+|- TERM)* = NUMBER", TERM = "NUMBER (* NUMBER)*", with the usual
// precedence. Returns nullopt when the text is not such an equation.
std::optional<bool> equation_holds(std::string_view text) {
    size_t i = 0;
    auto number = [&]() -> std::optional<int64_t> {
        if (i >= text.size() || text[i] < '0' || text[i] > '9') return std::nullopt;
        int64_t value = 0;
        for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
            if (value > (INT64_MAX - 9) / 10) return std::nullopt;  // too long to be a worked step
            value = value * 10 + (text[i] - '0');
        }
        return value;
    };
    auto term = [&]() -> std::optional<int64_t> {
        auto value = number();
        while (value && i < text.size() && text[i] == '*') {
            ++i;
            auto factor = number();
            if (!factor) return std::nullopt;
            *value *= *factor;
        }
        return value;
    };
    auto left = term();
    if (!left) return std::nullopt;
    while (i < text.size() && (text[i] == '+' || text[i] == '-')) {
        char op = text[i++];
        auto right = term();
        if (!right) return std::nullopt;
        *left += op == '+' ? *right : -*right;
    }
    if (i >= text.size() || text[i] != '=') return std::nullopt;
    ++i;
    auto result = number();
    if (!result || i != text.size()) return std::nullopt;
    return *left == *result;
}

class WorkedSteps {
public:
    explicit WorkedSteps(const grove::sdk::Config& config)
            : min_steps_(config.get_int("min_steps", 1)), only_if_column_(config.get_string("only_if_column", "")) {
        // values are the plugin's to validate; naming the key lets the host point at the manifest line
        if (min_steps_ < 1) throw grove::sdk::config_error("min_steps", "must be at least 1");
    }

    void score(const grove_reward_batch& batch, grove_reward_output& out) const {
        for (uint32_t row = 0; row < batch.count; ++row) {
            if (!only_if_column_.empty() && !has_column(grove::sdk::view(batch.row_json[row]))) continue;  // NaN
            int steps = 0, sound = 0;
            for (std::string_view equation : equations(grove::sdk::view(batch.completions[row]))) {
                if (auto holds = equation_holds(equation)) {
                    ++steps;
                    sound += *holds ? 1 : 0;
                }
            }
            out.metrics[0 * batch.count + row] = static_cast<float>(steps);  // metric 0 = "steps"
            out.scores[row] = steps < min_steps_ ? 0.0f : static_cast<float>(sound) / static_cast<float>(steps);
        }
    }

private:
    // the whitespace-separated words inside the first <think>…</think>
    static std::vector<std::string_view> equations(std::string_view completion) {
        std::vector<std::string_view> words;
        size_t open = completion.find("<think>"), close = completion.find("</think>");
        if (open == std::string_view::npos || close == std::string_view::npos || close < open) return words;
        std::string_view body = completion.substr(open + 7, close - open - 7);
        size_t start = 0;
        while (start < body.size()) {
            size_t end = body.find_first_of(" \n\t", start);
            if (end == std::string_view::npos) end = body.size();
            if (end > start) words.push_back(body.substr(start, end - start));
            start = end + 1;
        }
        return words;
    }

    // a deliberately small check of the row JSON ("name" then optional spaces then ':'); a plugin
    // that reads values would use a JSON parser
    bool has_column(std::string_view row_json) const {
        const std::string quoted = "\"" + only_if_column_ + "\"";
        for (size_t at = row_json.find(quoted); at != std::string_view::npos; at = row_json.find(quoted, at + 1)) {
            size_t next = row_json.find_first_not_of(" \t\n", at + quoted.size());
            if (next != std::string_view::npos && row_json[next] == ':') return true;
        }
        return false;
    }

    int64_t min_steps_;
    std::string only_if_column_;
};

const grove_config_key kKeys[] = {
    grove::sdk::key("min_steps", GROVE_VALUE_INT, "1", "fewer equations than this in <think> score 0.0"),
    grove::sdk::key("only_if_column", GROVE_VALUE_STRING, "\"\"",
                    "score NaN (not applicable) unless the dataset row has this column; empty = every row"),
};
const char* const kMetrics[] = {"steps"};

constexpr auto kWorkedSteps = grove::sdk::reward_descriptor<WorkedSteps>(
    "worked_steps", "1.0.0", "share of the equations in <think> that are true (example plugin in C++)",
    GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC, kKeys, kMetrics);

}  // namespace

GROVE_PLUGIN_LIBRARY(&kWorkedSteps)
