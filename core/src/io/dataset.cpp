#include "grove/dataset.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "grove/error.hpp"
#include "text/text_util.hpp"

using nlohmann::json;

namespace grove {

namespace {

// ---- builtin:arithmetic ------------------------------------------------------------------------
// "What is 37 + 48?" with a worked reference completion, column by column from the units:
//   37 + 48 -> <think>7+8=15 3+4+1=8</think><answer>85</answer>     (sum, carry)
//   43 - 28 -> <think>13-8=5 4-2-1=1</think><answer>15</answer>     (a leading 1 marks a borrow)
//   37 * 6  -> <think>7*6=42 3*6+4=22</think><answer>222</answer>   (product plus carry)
// Every step is a one-digit fact, so a problem never seen in training is made of steps that were:
// a small model can generalise instead of memorising, and an imperfect one makes step errors that
// reinforcement learning can fix.
struct ArithmeticOptions {
    int digits = 2;           // operands have at most this many digits (1..3)
    std::string ops = "+-*";  // which operations; the second factor of * is always one digit (2..9)
    bool worked = true;       // style=worked: the system prompt asks for <think>/<answer>;
                              // style=short: "reply with the result only", for chat models that
                              // have never seen those tags (examples/smollm2)
};

struct Problem {
    int a, b;
    char op;
};

std::string worked_completion(const Problem& p, long& answer) {
    std::string steps;
    auto digit = [](int n, int k) { return (n / int(std::pow(10, k))) % 10; };
    auto step = [&](const std::string& s) { steps += (steps.empty() ? "" : " ") + s; };
    if (p.op == '*') {
        answer = long(p.a) * p.b;
        int columns = std::max<int>(1, int(std::to_string(p.a).size())), carry = 0;
        for (int k = 0; k < columns; ++k) {
            int r = digit(p.a, k) * p.b + carry;
            step(std::to_string(digit(p.a, k)) + "*" + std::to_string(p.b) + (k ? "+" + std::to_string(carry) : "") + "=" +
                 std::to_string(r));
            carry = r / 10;
        }
    } else {
        answer = p.op == '+' ? long(p.a) + p.b : long(p.a) - p.b;
        int columns = int(std::max(std::to_string(p.a).size(), std::to_string(p.b).size())), carry = 0;
        for (int k = 0; k < columns; ++k) {
            int x = digit(p.a, k), y = digit(p.b, k);
            std::string tail = k ? std::string(p.op == '+' ? "+" : "-") + std::to_string(carry) : "";
            if (p.op == '+') {
                int r = x + y + carry;
                step(std::to_string(x) + "+" + std::to_string(y) + tail + "=" + std::to_string(r));
                carry = r / 10;
            } else {
                int r = x - y - carry;
                bool borrow = r < 0;
                step((borrow ? "1" : "") + std::to_string(x) + "-" + std::to_string(y) + tail + "=" +
                     std::to_string(borrow ? r + 10 : r));
                carry = borrow ? 1 : 0;
            }
        }
    }
    return "<think>" + steps + "</think><answer>" + std::to_string(answer) + "</answer>";
}

ArithmeticOptions arithmetic_options(const std::string& source, const std::string& query) {
    ArithmeticOptions o;
    std::stringstream items(query);
    for (std::string item; std::getline(items, item, '&');) {
        auto eq = item.find('=');
        std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
        if (key == "digits") {
            if (value != "1" && value != "2" && value != "3")
                throw Error(ErrorKind::input, source + ": digits must be 1, 2 or 3, not '" + value + "'");
            o.digits = std::stoi(value);
        } else if (key == "ops") {
            if (value.empty() || value.find_first_not_of("+-*") != std::string::npos)
                throw Error(ErrorKind::input, source + ": ops is a non-empty set of + - *, e.g. ops=+-, not '" + value + "'");
            o.ops = value;
        } else if (key == "style") {
            if (value != "worked" && value != "short")
                throw Error(ErrorKind::input, source + ": style is worked or short, not '" + value + "'");
            o.worked = value == "worked";
        } else {
            throw Error(ErrorKind::input, source + ": unknown option '" + key +
                                              "' (builtin:arithmetic takes digits=1..3, ops=+-* and style=worked|short)" +
                                              did_you_mean(key, {"digits", "ops", "style"}));
        }
    }
    return o;
}

// Every problem of the chosen difficulty, shuffled with a fixed seed; the first ones (200, or a
// fifth of a small space) are held out, the rest (up to 20000) are the training split.
std::vector<PromptRow> arithmetic(const std::string& source, bool test_split, const ArithmeticOptions& o) {
    int limit = int(std::pow(10, o.digits));
    std::vector<Problem> all;
    for (char op : std::string("+-*")) {
        if (o.ops.find(op) == std::string::npos) continue;
        for (int a = 0; a < limit; ++a) {
            if (op == '*') {
                for (int b = 2; b <= 9; ++b) all.push_back({a, b, op});
            } else {
                for (int b = 0; b < (op == '-' ? a + 1 : limit); ++b) all.push_back({a, b, op});
            }
        }
    }
    std::mt19937 rng(20261122);
    std::shuffle(all.begin(), all.end(), rng);
    size_t held_out = std::min<size_t>(200, all.size() / 5);
    size_t begin = test_split ? 0 : held_out, end = test_split ? held_out : std::min(all.size(), held_out + 20000);
    std::vector<PromptRow> rows;
    for (size_t i = begin; i < end; ++i) {
        const Problem& p = all[i];
        std::string question = "What is " + std::to_string(p.a) + " " + p.op + " " + std::to_string(p.b) + "?";
        long answer = 0;
        std::string completion = worked_completion(p, answer);  // the reference `grove sft` imitates
        PromptRow row;
        row.messages = {{"system", o.worked ? "Work it out digit by digit inside <think></think>, then give only the "
                                              "number inside <answer></answer>."
                                            : "You are a calculator. Reply with the result only."},
                        {"user", question}};
        row.text = question;
        row.columns_json =
            json({{"answer", std::to_string(answer)}, {"question", question}, {"completion", completion}}).dump();
        row.origin = source + " #" + std::to_string(rows.size());
        rows.push_back(std::move(row));
    }
    return rows;
}

// ---- builtin:multiplication ---------------------------------------------------------------------
// "What is 347 * 812?": products of two numbers of `digits` digits (2 or 3, default 3), a task where
// the tool matters: a model of a few million parameters cannot multiply 3-digit numbers in its
// head, but it can learn to ask the `calculator` environment and copy its result. The reference
// episode `grove sft` imitates (column "episode", data.completion_column = "episode") is
//   model:        <calc>347 * 812</calc>
//   environment:  <result>281764</result>      (what the calculator answers; context, not trained)
//   model:        <answer>281764</answer>
// and column "completion" is the same as one text. With tool=P (percent, default 100), only P% of
// the rows' episodes use the tool; the others answer at once ("<answer>281764</answer>"), so a
// warm start on them answers without the tool most of the time: a habit GRPO can change.
struct MultiplicationOptions {
    int digits = 3;
    int tool_percent = 100;
};

MultiplicationOptions multiplication_options(const std::string& source, const std::string& query) {
    MultiplicationOptions o;
    std::stringstream items(query);
    for (std::string item; std::getline(items, item, '&');) {
        const auto eq = item.find('=');
        const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
        if (key == "digits" && (value == "2" || value == "3")) {
            o.digits = std::stoi(value);
        } else if (key == "tool" && !value.empty() && value.size() <= 3 &&
                   value.find_first_not_of("0123456789") == std::string::npos && std::stoi(value) <= 100) {
            o.tool_percent = std::stoi(value);
        } else {
            throw Error(ErrorKind::input,
                        source + ": builtin:multiplication takes digits=2|3 and tool=0..100, not '" + item + "'");
        }
    }
    return o;
}

std::vector<PromptRow> multiplication(const std::string& source, bool test_split, const MultiplicationOptions& o) {
    const int digits = o.digits;
    // factors from ceil(sqrt(10^(2 digits - 1))): every product has 2 x digits digits, so the result
    // and the answer always have the same layout, which a small model learns to copy sooner
    const int low = digits == 2 ? 32 : 317, high = digits == 2 ? 99 : 999;
    // the held-out problems come first from a fixed seed; the training split never repeats them
    std::mt19937 rng(20261124);
    std::uniform_int_distribution<int> factor(low, high);
    std::set<std::pair<int, int>> seen;
    std::vector<std::pair<int, int>> pairs;
    const size_t n = size_t(high - low + 1), space = n * (n + 1) / 2, held_out = 200;  // unordered pairs
    const size_t total = std::min(held_out + 20000, space);
    while (pairs.size() < total) {
        const int a = factor(rng), b = factor(rng);
        if (seen.insert({std::min(a, b), std::max(a, b)}).second) pairs.emplace_back(a, b);  // a * b is b * a
    }
    std::vector<PromptRow> rows;
    for (size_t i = test_split ? 0 : held_out; i < (test_split ? held_out : total); ++i) {
        const auto [a, b] = pairs[i];
        const std::string question = "What is " + std::to_string(a) + " * " + std::to_string(b) + "?";
        const std::string answer = std::to_string(long(a) * b);
        PromptRow row;
        row.messages = {{"system",
                         "Use the calculator: write <calc>expression</calc>, read its <result>, then give only the "
                         "number inside <answer></answer>."},
                        {"user", question}};
        row.text = question;
        const std::string call = "<calc>" + std::to_string(a) + " * " + std::to_string(b) + "</calc>",
                          result = "<result>" + answer + "</result>", reply = "<answer>" + answer + "</answer>";
        // the tool rows are spread evenly: row k uses it when floor(k P / 100) advances
        const size_t k = i - (test_split ? 0 : held_out);
        const bool tool = (k + 1) * size_t(o.tool_percent) / 100 > k * size_t(o.tool_percent) / 100;
        const json episode = tool ? json::array({{{"role", "model"}, {"text", call}},
                                                 {{"role", "environment"}, {"text", result}},
                                                 {{"role", "model"}, {"text", reply}}})
                                  : json::array({{{"role", "model"}, {"text", reply}}});
        row.columns_json = json({{"answer", answer},
                                 {"question", question},
                                 {"completion", tool ? call + result + reply : reply},
                                 {"episode", episode}})
                               .dump();
        row.origin = source + " #" + std::to_string(rows.size());
        rows.push_back(std::move(row));
    }
    return rows;
}

}  // namespace

std::string prompt_text(const PromptRow& row, ChatTemplate family, const TokenizerConfig& config,
                        const std::string& tools_json) {
    if (row.messages.empty()) return row.text;
    try {
        return render_chat(family, row.messages, true, config, tools_json);
    } catch (const Error& e) {  // which row the template refuses
        throw Error(e.kind(), row.origin + ": " + e.what());
    }
}

std::vector<PromptRow> environment_owned_prompts(size_t count) {
    PromptRow row;
    row.messages.push_back({"user", "", {}, std::nullopt});
    row.columns_json = "{}";
    row.origin = "the environment's prompts (no data.source)";
    return std::vector<PromptRow>(count, row);
}

std::string prompt_json(const std::string& text, const std::vector<ChatMessage>& messages) {
    // a prompt need not be valid UTF-8 (rollouts replayed from token ids): such bytes become U+FFFD
    auto dump = [](const nlohmann::ordered_json& j) {
        return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    };
    if (messages.empty()) return dump(text);
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const ChatMessage& m : messages) {
        nlohmann::ordered_json message = {{"role", m.role}, {"content", m.content}};
        if (m.reasoning_content) message["reasoning_content"] = *m.reasoning_content;
        for (const ToolCall& call : m.tool_calls)
            message["tool_calls"].push_back(
                {{"type", "function"},
                 {"function", {{"name", call.name}, {"arguments", nlohmann::ordered_json::parse(call.arguments_json)}}}});
        list.push_back(std::move(message));
    }
    return dump(list);
}

std::vector<std::string> builtin_sources() {
    return {"arithmetic", "arithmetic-test", "multiplication", "multiplication-test"};
}

namespace {
template <typename Json>
void each_jsonl_row(const std::string& path, const std::string& what,
                    const std::function<void(Json& row, const std::string& where)>& row) {
    std::ifstream in(path);
    if (!in) throw Error(ErrorKind::input, path + ": cannot read " + what);
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        std::string where = path + ":" + std::to_string(number);
        Json j;
        try {
            j = Json::parse(line);
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
}  // namespace

void for_each_jsonl(const std::string& path, const std::string& what,
                    const std::function<void(json& row, const std::string& where)>& row) {
    each_jsonl_row<json>(path, what, row);
}

void for_each_jsonl_in_order(const std::string& path, const std::string& what,
                             const std::function<void(nlohmann::ordered_json& row, const std::string& where)>& row) {
    each_jsonl_row<nlohmann::ordered_json>(path, what, row);
}

namespace {
// An assistant message's "tool_calls": entries {"type": "function", "function": {"name", "arguments"}}
// or {"name", "arguments"}, as the templates accept both.
std::vector<ToolCall> tool_calls(const nlohmann::ordered_json& m, const std::string& where) {
    std::vector<ToolCall> calls;
    const auto& list = m["tool_calls"];
    // an empty list is false in Jinja, so nothing (datasets exported from tool-calling chats carry one)
    if (list.is_null() || (list.is_array() && list.empty())) return calls;
    if (!list.is_array())  // the templates loop over it: an object's keys would be the calls
        throw Error(ErrorKind::input, where + ": a message's \"tool_calls\" must be a list of calls");
    if (m["role"] != "assistant")
        throw Error(ErrorKind::input, where + ": a " + m["role"].dump() +
                                          " message has \"tool_calls\", which chat templates write only for "
                                          "assistant messages; move them to the assistant message that makes them");
    for (const auto& entry : list) {
        const auto& call = entry.is_object() && entry.contains("function") ? entry["function"] : entry;
        if (!call.is_object() || !call.contains("name") || !call["name"].is_string() || !call.contains("arguments"))
            throw Error(ErrorKind::input, where +
                                              ": each of a message's \"tool_calls\" needs a string \"name\" and "
                                              "\"arguments\" (any JSON: usually an object, or JSON text), directly or "
                                              "under \"function\"");
        calls.push_back({call["name"].get<std::string>(), call["arguments"].dump()});
    }
    return calls;
}
}  // namespace

std::vector<ChatMessage> chat_messages(const nlohmann::ordered_json& list, const std::string& where) {
    std::vector<ChatMessage> messages;
    for (const auto& m : list) {
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
            throw Error(ErrorKind::input, where + ": chat messages need string \"role\" and \"content\"");
        std::vector<ToolCall> calls = m.contains("tool_calls") ? tool_calls(m, where) : std::vector<ToolCall>{};
        // an assistant message that only calls tools may have no content (OpenAI's form: null)
        const bool no_content = !m.contains("content") || m["content"].is_null();
        if (!(no_content && !calls.empty()) && (no_content || !m["content"].is_string()))
            throw Error(ErrorKind::input, where + ": chat messages need string \"role\" and \"content\"");
        std::optional<std::string> reasoning;
        if (m.contains("reasoning_content") && !m["reasoning_content"].is_null()) {
            if (!m["reasoning_content"].is_string() || m["role"] != "assistant")
                throw Error(ErrorKind::input, where + ": \"reasoning_content\" is an assistant message's reasoning, as text");
            reasoning = m["reasoning_content"].get<std::string>();
        }
        messages.push_back(
            {m["role"], no_content ? std::string() : m["content"].get<std::string>(), std::move(calls), std::move(reasoning)});
    }
    return messages;
}

std::vector<PromptRow> load_prompts(const std::string& source, const std::string& prompt_column, MissingPrompt missing) {
    if (source.rfind("builtin:", 0) == 0) {
        std::string name = source.substr(8), query;
        if (auto q = name.find('?'); q != std::string::npos) {
            query = name.substr(q + 1);
            name = name.substr(0, q);
        }
        if (name == "arithmetic" || name == "arithmetic-test")
            return arithmetic(source, name == "arithmetic-test", arithmetic_options(source, query));
        if (name == "multiplication" || name == "multiplication-test")
            return multiplication(source, name == "multiplication-test", multiplication_options(source, query));
        throw Error(ErrorKind::input, "unknown data source '" + source + "'" + did_you_mean(name, builtin_sources()) +
                                          "; built-in sources: builtin:" + join(builtin_sources(), ", builtin:"));
    }
    std::vector<PromptRow> rows;
    for_each_jsonl_in_order(  // in order: a tool call's arguments are written in the file's key order
        source, "the dataset (a JSONL file with a \"" + prompt_column + "\" column)",
        [&](nlohmann::ordered_json& j, const std::string& where) {
            if (!j.is_object()) throw Error(ErrorKind::input, where + ": the row is not a JSON object");
            PromptRow row;
            row.origin = where;
            row.prompt_given = j.contains(prompt_column);
            if (!row.prompt_given && missing == MissingPrompt::refused)
                throw Error(ErrorKind::input, where + ": the row has no \"" + prompt_column +
                                                  "\" column (only an environment that writes prompts, such as a TRL "
                                                  "class whose reset() returns the text, takes rows without one)");
            static const nlohmann::ordered_json none;
            const auto& prompt = row.prompt_given ? j[prompt_column] : none;
            if (!row.prompt_given) {
                row.messages.push_back({"user", "", {}, std::nullopt});  // as TRL: completed by the environment
            } else if (prompt.is_string()) {
                row.text = prompt;
            } else if (prompt.is_array() && !prompt.empty()) {
                row.messages = chat_messages(prompt, where);
            } else {
                throw Error(ErrorKind::input, where + ": \"" + prompt_column + "\" must be text or a list of messages");
            }
            j.erase(prompt_column);
            row.columns_json = json(j).dump();  // keys sorted, as reward plugins have always seen them
            rows.push_back(std::move(row));
        });
    if (rows.empty()) throw Error(ErrorKind::input, source + ": the dataset has no rows");
    return rows;
}

}  // namespace grove
