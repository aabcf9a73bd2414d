#include "grove/dataset.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "grove/error.hpp"
#include "grove/text_util.hpp"

using nlohmann::json;

namespace grove {

namespace {

// Arithmetic word problems with a <think>/<answer> instruction. Problems are drawn from one seeded
// stream; each distinct problem goes to train or test, so the splits never share a problem.
std::vector<PromptRow> arithmetic(bool test_split) {
    std::mt19937 rng(20261122);
    std::uniform_int_distribution<int> operand(2, 99), op(0, 2);
    std::set<std::string> seen;
    std::vector<PromptRow> train, test;
    while (train.size() < 2000 || test.size() < 200) {
        int a = operand(rng), b = operand(rng), kind = op(rng);
        if (kind == 2) b = 2 + b % 9;  // products stay two-digit by one-digit
        if (kind == 1 && b > a) std::swap(a, b);
        const char* sym = kind == 0 ? "+" : kind == 1 ? "-" : "*";
        long answer = kind == 0 ? a + b : kind == 1 ? a - b : long(a) * b;
        std::string question = "What is " + std::to_string(a) + " " + sym + " " + std::to_string(b) + "?";
        if (!seen.insert(question).second) continue;
        PromptRow row;
        row.messages = {{"system", "Think step by step inside <think></think>, then give only the number inside <answer></answer>."},
                        {"user", question}};
        row.text = question;
        // the reference completion `grove sft` imitates
        std::string completion = "<think>" + std::to_string(a) + " " + sym + " " + std::to_string(b) + " = " +
                                 std::to_string(answer) + "</think><answer>" + std::to_string(answer) + "</answer>";
        row.columns_json = json({{"answer", std::to_string(answer)}, {"question", question}, {"completion", completion}}).dump();
        bool to_test = test.size() < 200 && (seen.size() % 11 == 0 || train.size() >= 2000);
        (to_test ? test : train).push_back(std::move(row));
    }
    for (size_t i = 0; i < train.size(); ++i) train[i].origin = "builtin:arithmetic #" + std::to_string(i);
    for (size_t i = 0; i < test.size(); ++i) test[i].origin = "builtin:arithmetic-test #" + std::to_string(i);
    return test_split ? test : train;
}

}  // namespace

std::string prompt_text(const PromptRow& row, ChatTemplate family, const TokenizerConfig& config) {
    return row.messages.empty() ? row.text : render_chat(family, row.messages, true, config);
}

std::vector<std::string> builtin_sources() { return {"arithmetic", "arithmetic-test"}; }

void for_each_jsonl(const std::string& path, const std::string& what,
                    const std::function<void(json& row, const std::string& where)>& row) {
    std::ifstream in(path);
    if (!in) throw Error(ErrorKind::input, path + ": cannot read " + what);
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        std::string where = path + ":" + std::to_string(number);
        json j;
        try {
            j = json::parse(line);
        } catch (const json::exception& e) {
            throw Error(ErrorKind::input, where + ": invalid JSON: " + e.what());
        }
        try {
            row(j, where);
        } catch (const json::exception& e) {  // a field of the wrong type, e.g. "prompt_ids": "12"
            throw Error(ErrorKind::input, where + ": " + e.what());
        }
    }
}

std::vector<PromptRow> load_prompts(const std::string& source, const std::string& prompt_column) {
    if (source.rfind("builtin:", 0) == 0) {
        std::string name = source.substr(8);
        if (name == "arithmetic") return arithmetic(false);
        if (name == "arithmetic-test") return arithmetic(true);
        throw Error(ErrorKind::input, "unknown data source '" + source + "'" + did_you_mean(name, builtin_sources()) +
                                          "; built-in sources: builtin:" + join(builtin_sources(), ", builtin:"));
    }
    std::vector<PromptRow> rows;
    for_each_jsonl(source, "the dataset (a JSONL file with a \"" + prompt_column + "\" column)", [&](json& j, const std::string& where) {
        if (!j.is_object() || !j.contains(prompt_column))
            throw Error(ErrorKind::input, where + ": the row has no \"" + prompt_column + "\" column");
        PromptRow row;
        row.origin = where;
        const json& prompt = j[prompt_column];
        if (prompt.is_string()) {
            row.text = prompt;
        } else if (prompt.is_array() && !prompt.empty()) {
            for (const auto& m : prompt) {
                if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["content"].is_string())
                    throw Error(ErrorKind::input, where + ": chat messages need string \"role\" and \"content\"");
                row.messages.push_back({m["role"], m["content"]});
            }
        } else {
            throw Error(ErrorKind::input, where + ": \"" + prompt_column + "\" must be text or a list of messages");
        }
        j.erase(prompt_column);
        row.columns_json = j.dump();
        rows.push_back(std::move(row));
    });
    if (rows.empty()) throw Error(ErrorKind::input, source + ": the dataset has no rows");
    return rows;
}

}  // namespace grove
