// Prompt datasets: JSONL files and built-in task sources. A row has a prompt (text, or chat
// messages) and any other columns, which reach reward plugins as the row's JSON. No libtorch.
#pragma once

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "grove/tokenizer.hpp"

namespace grove {

struct PromptRow {
    std::string text;                   // a text prompt, or
    std::vector<ChatMessage> messages;  // a conversation (rendered with the chat template)
    std::string columns_json;           // every other column, as a JSON object
    std::string origin;                 // "file.jsonl:12", for messages
};

// The text the model sees: a conversation rendered with the chat template (generation prompt
// added), or the text prompt as is.
std::string prompt_text(const PromptRow& row, ChatTemplate family, const TokenizerConfig& config);

// `source`: a JSONL path, or builtin:NAME (see builtin_sources()). prompt_column names the prompt.
// Errors name the file and line (a row without the prompt column, invalid JSON, ...).
std::vector<PromptRow> load_prompts(const std::string& source, const std::string& prompt_column = "prompt");

// builtin:arithmetic (train split: 2000 problems) and builtin:arithmetic-test (held out: 200):
// "What is A + B?" / "A - B" / "A * B" with a reference "answer" column and a reference
// "completion" (<think>A + B = C</think><answer>C</answer>), seeded and disjoint.
std::vector<std::string> builtin_sources();

// Calls `row(json, where)` for every non-blank line of a JSONL file; `where` is "file:line" for
// messages. Unreadable files and invalid JSON are grove::Error(input) naming the file and line.
void for_each_jsonl(const std::string& path, const std::string& what,
                    const std::function<void(nlohmann::json& row, const std::string& where)>& row);

}  // namespace grove
