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
    // false: the row has no prompt column and `messages` is one empty user message, which the run's
    // environment completes (its reset() then gets no `prompt`, as TRL's)
    bool prompt_given = true;
};

// The text the model sees: a conversation rendered with the chat template (generation prompt
// added), or the text prompt as is.
std::string prompt_text(const PromptRow& row, ChatTemplate family, const TokenizerConfig& config,
                        const std::string& tools_json = "");

// The prompt as the dataset gave it, as JSON: a string, or a list of {"role", "content"} messages.
// Reward plugins see it (grove_reward_batch.prompt_json): TRL's reward functions take this form.
std::string prompt_json(const std::string& text, const std::vector<ChatMessage>& messages);

// A JSON list of chat messages ({"role", "content"} objects; an assistant's may have "tool_calls",
// its content then optional, and "reasoning_content") from the row at `where`; refuses other shapes,
// naming `where`.
std::vector<ChatMessage> chat_messages(const nlohmann::ordered_json& list, const std::string& where);

// The prompts of a run without data.source, where the environment owns the data: `count` rows of
// one empty user message, which the environment completes before generation (TRL's reset() text,
// SDK begin_episodes). TRL trains on these placeholder rows when given no train_dataset.
std::vector<PromptRow> environment_owned_prompts(size_t count);

// `source`: a JSONL path, or builtin:NAME (see builtin_sources()). prompt_column names the prompt.
// Errors name the file and line (a row without the prompt column, invalid JSON, ...).
// What load_prompts does with a row without the prompt column: refuse it, or, in a run with an
// environment that writes prompts (SDK begin_episodes), give it one empty user message,
// as TRL's GRPOTrainer does for rows without "prompt" when it has an environment_factory.
enum class MissingPrompt { refused, environment_writes };
std::vector<PromptRow> load_prompts(const std::string& source, const std::string& prompt_column = "prompt",
                                    MissingPrompt missing = MissingPrompt::refused);

// builtin:arithmetic (the training split) and builtin:arithmetic-test (200 held-out problems,
// never in training): "What is A + B?" / "A - B" / "A * B" with an "answer" column and a worked
// reference "completion" (<think>7+8=15 3+4+1=8</think><answer>85</answer>). Difficulty is set
// after a '?': builtin:arithmetic?digits=1&ops=+- (digits 1..3, default 2; ops from +-*, default
// all three; style=short asks for the bare result instead of the <think>/<answer> format).
// The same options give the same, disjoint splits on every machine.
std::vector<std::string> builtin_sources();

// Calls `row(json, where)` for every non-blank line of a JSONL file; `where` is "file:line" for
// messages. Unreadable files and invalid JSON are grove::Error(input) naming the file and line.
void for_each_jsonl(const std::string& path, const std::string& what,
                    const std::function<void(nlohmann::json& row, const std::string& where)>& row);
// The same, each object's keys in the file's order (templates write tool calls' arguments so).
void for_each_jsonl_in_order(const std::string& path, const std::string& what,
                             const std::function<void(nlohmann::ordered_json& row, const std::string& where)>& row);

}  // namespace grove
