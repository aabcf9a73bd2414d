// grove sft's examples from TRL's dataset formats, prepared as TRL 1.16's SFTTrainer prepares them
// (SFTTrainer._prepare_dataset: EOS text, tokenization, the completion mask, truncation, dropping
// rows left without a trained token). tests/core/train/trl_sft_data_reference.py records TRL's.
#include <algorithm>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>

#include "grove/dataset.hpp"
#include "grove/error.hpp"
#include "grove/sft.hpp"
#include "grove/tokenizer.hpp"

using json = nlohmann::ordered_json;  // keys in the file's order, as templates write them

namespace grove {

namespace {

// TRL's is_conversational: a list of messages with roles (an assistant's that only calls tools has no
// content); Grove's episode turns ({"role": "model"|"environment", "text"}) are not.
bool is_conversation(const json& value) {
    return value.is_array() && !value.empty() && value[0].is_object() && value[0].contains("role") &&
           !value[0].contains("text");
}

// `tools`: the row's tool schemas (a JSON array; empty: none). `training`: as the training version of
// the template that TRL swaps in for assistant_only_loss
std::string rendered(ChatTemplate chat, const std::vector<ChatMessage>& messages, bool generation_prompt,
                     const TokenizerConfig& config, const std::string& tools, const std::string& where, bool training = false) {
    try {
        return training ? render_chat_for_training(chat, messages, config, tools)
                        : render_chat(chat, messages, generation_prompt, config, tools);
    } catch (const Error& e) {  // which row the template refuses
        throw Error(e.kind(), where + ": " + e.what());
    }
}

// TRL appends the EOS token's text to a text completion (or language-modeling text) that does not
// end with it, then tokenizes. The EOS is appended as its id, which is what a tokenizer that splits
// special tokens out of text gives (transformers' do; sentencepiece's own encoder does not).
struct EndOfText {
    std::string text;           // the tokenizer's EOS token, if it names one
    std::optional<int64_t> id;  // its id, or the model's EOS id
    std::vector<int64_t> encode_ending(const Tokenizer& tokenizer, std::string s, bool special_tokens) const {
        if (!text.empty() && s.size() >= text.size() && s.compare(s.size() - text.size(), text.size(), text) == 0)
            s.resize(s.size() - text.size());
        std::vector<int64_t> ids = tokenizer.encode(s, special_tokens);
        if (id) ids.push_back(*id);
        return ids;
    }
};

SftExample all_trained(std::vector<int64_t> ids) {
    SftExample e;
    e.trained.assign(ids.size(), 1);
    e.ids = std::move(ids);
    return e;
}

// Where TRL's training chat template of a family starts an assistant turn's trained characters:
// after this header (the rest of the turn, through its end marker, is trained).
std::optional<std::string> assistant_turn_header(ChatTemplate chat) {
    switch (chat) {
        case ChatTemplate::chatml:  // qwen2_5_training: from the newline after the role
            return "<|im_start|>assistant";
        case ChatTemplate::qwen3:  // qwen3_training: the reasoning block (every turn's), the content, <|im_end|>\n
        case ChatTemplate::qwen3_thinking_off:
        case ChatTemplate::qwen3_instruct:  // qwen3_instruct_2507_training: the content and <|im_end|>\n
            return "<|im_start|>assistant\n";
        case ChatTemplate::llama3:  // llama3_training: the trimmed content and <|eot_id|>
            return "<|start_header_id|>assistant<|end_header_id|>\n\n";
        case ChatTemplate::gemma:  // gemma_training, gemma3_training: the trimmed content and <end_of_turn>\n
            return "<start_of_turn>model\n";
        default:
            return std::nullopt;
    }
}

// TRL's assistant_only_loss on a conversation: its rendering, trained on the characters of each
// assistant turn that TRL's training chat template for the family marks (assistant_turn_header). The
// turns are found by rendering the conversation's beginnings up to and through each assistant message
// (these families render such a beginning as the start of the whole). The text is tokenized piece by piece at the turns' edges, which must give
// the whole text's tokens: an edge inside a token is refused, not guessed.
SftExample assistant_turns_example(const std::vector<ChatMessage>& messages, const std::string& tools, ChatTemplate chat,
                                   const Tokenizer& tokenizer, const std::string& where) {
    const std::optional<std::string> header = assistant_turn_header(chat);
    const std::string instead =
        "; give rows tokenized with transformers' assistant_masks instead (\"input_ids\", "
        "\"assistant_masks\") and leave sft.assistant_only_loss false";
    if (!header)
        throw Error(ErrorKind::input,
                    where +
                        ": sft.assistant_only_loss marks assistant turns as TRL's training chat "
                        "templates do for the chatml, qwen3, qwen3_instruct, llama3 and gemma families, not for the " +
                        chat_template_name(chat) + " chat template" + instead);
    const TokenizerConfig& config = tokenizer.config();
    auto beginning = [&](size_t count) {  // the first `count` messages, as the training template renders them
        return rendered(chat, std::vector<ChatMessage>(messages.begin(), messages.begin() + long(count)), false, config, tools,
                        where, true);
    };
    const std::string whole = beginning(messages.size());
    std::vector<size_t> edges;  // where trained spans start and end, alternately
    for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i].role != "assistant") continue;
        // Only the beginnings that end just before or just after an assistant turn must start the
        // whole: one that ends inside a run of tool messages renders their shared turn closed early.
        const std::string before = beginning(i), through = beginning(i + 1);
        if (whole.compare(0, before.size(), before) != 0 || whole.compare(0, through.size(), through) != 0 ||
            through.size() < before.size())
            throw Error(ErrorKind::input, where + ": the " + chat_template_name(chat) +
                                              " chat template renders the start of this conversation differently from "
                                              "the conversation's first messages alone, so its assistant turns cannot be "
                                              "found" +
                                              instead);
        if (through.compare(before.size(), header->size(), *header) != 0)
            throw Error(ErrorKind::input, where + ": message " + std::to_string(i) +
                                              " renders without the assistant "
                                              "header the " +
                                              chat_template_name(chat) + " chat template writes" + instead);
        edges.push_back(before.size() + header->size());
        edges.push_back(through.size());
    }
    SftExample e;
    size_t at = 0;
    auto add_piece = [&](size_t end, bool trained) {
        const std::vector<int64_t> ids = tokenizer.encode(std::string_view(whole).substr(at, end - at), false);
        e.ids.insert(e.ids.end(), ids.begin(), ids.end());
        e.trained.insert(e.trained.end(), ids.size(), trained ? 1 : 0);
        at = end;
    };
    for (size_t k = 0; k < edges.size(); ++k) add_piece(edges[k], k % 2 == 1);
    add_piece(whole.size(), false);
    if (e.ids != tokenizer.encode(whole, false))
        throw Error(ErrorKind::input, where +
                                          ": an assistant turn starts or ends inside a token of this tokenizer, so its "
                                          "tokens cannot be marked as TRL marks them" +
                                          instead);
    return e;
}

// The prompt's tokens and the whole row's: the completion starts where they part (TRL's
// common_prefix_length), which is after the prompt unless the template renders the prompt alone
// differently or tokens merge across the boundary.
SftExample split_at_common_prefix(const std::vector<int64_t>& prompt, std::vector<int64_t> whole, bool train_prompt) {
    size_t start = 0;
    while (start < prompt.size() && start < whole.size() && prompt[start] == whole[start]) ++start;
    SftExample e;
    e.trained.assign(whole.size(), 1);
    if (!train_prompt) std::fill(e.trained.begin(), e.trained.begin() + long(start), 0);
    e.ids = std::move(whole);
    return e;
}

// Grove's reference episode: the prompt, then each turn tokenized on its own as an episode's turns
// are, the model's trained, and the EOS.
SftExample episode_example(const std::string& prompt, bool special_tokens, const json& turns, const std::string& where,
                           const SftDataOptions& o, const Tokenizer& tokenizer, std::optional<int64_t> eos) {
    SftExample e;
    e.ids = tokenizer.encode(prompt, special_tokens);
    e.trained.assign(e.ids.size(), o.completion_only_loss ? 0 : 1);
    for (const json& turn : turns) {
        const std::string role = turn.is_object() ? turn.value("role", "") : "";
        if ((role != "model" && role != "environment") || !turn.contains("text") || !turn["text"].is_string())
            throw Error(ErrorKind::input, where + ": column \"" + o.completion_column +
                                              "\": each turn needs \"role\" (model or environment) and string "
                                              "\"text\", e.g. {\"role\": \"model\", \"text\": \"<calc>2 * 3</calc>\"}, or "
                                              "each message \"role\" and \"content\" (a conversational completion)");
        for (int64_t id : tokenizer.encode(turn["text"].get<std::string>(), false)) e.ids.push_back(id);
        e.trained.resize(e.ids.size(), role == "model" ? 1 : 0);
    }
    if (eos) {
        e.ids.push_back(*eos);
        e.trained.push_back(1);
    }
    return e;
}

SftExample prompt_completion_example(const json& row, const std::string& tools, const std::string& where,
                                     const SftDataOptions& o, const Tokenizer& tokenizer, ChatTemplate chat,
                                     const EndOfText& end) {
    const json& prompt = row[o.prompt_column];
    if (!prompt.is_string() && !(prompt.is_array() && !prompt.empty()))
        throw Error(ErrorKind::input, where + ": \"" + o.prompt_column + "\" must be text or a list of messages");
    if (!row.contains(o.completion_column))
        throw Error(ErrorKind::input, where + ": no column \"" + o.completion_column +
                                          "\" (data.completion_column) to imitate: text, chat messages, or a list of turns "
                                          "{\"role\": \"model\"|\"environment\", \"text\": ...}");
    const json& completion = row[o.completion_column];
    const TokenizerConfig& config = tokenizer.config();
    std::vector<ChatMessage> prompt_messages;
    if (prompt.is_array()) prompt_messages = chat_messages(prompt, where);
    // text prompts get the tokenizer's special tokens; a conversation's template writes its own
    const bool special_tokens = prompt.is_string();
    const std::string prompt_text =
        prompt.is_string() ? prompt.get<std::string>() : rendered(chat, prompt_messages, true, config, tools, where);
    const std::vector<int64_t> prompt_ids = tokenizer.encode(prompt_text, special_tokens);
    if (is_conversation(completion)) {
        if (prompt.is_string())
            throw Error(ErrorKind::input, where +
                                              ": the completion is chat messages but the prompt is text; give the "
                                              "prompt as messages too, or the completion as text");
        std::vector<ChatMessage> whole = prompt_messages;
        for (const ChatMessage& m : chat_messages(completion, where)) whole.push_back(m);
        return split_at_common_prefix(prompt_ids, tokenizer.encode(rendered(chat, whole, false, config, tools, where), false),
                                      !o.completion_only_loss);
    }
    if (completion.is_array()) return episode_example(prompt_text, special_tokens, completion, where, o, tokenizer, end.id);
    if (!completion.is_string())
        throw Error(ErrorKind::input, where + ": \"" + o.completion_column +
                                          "\" must be text, chat messages, or a list of turns {\"role\": "
                                          "\"model\"|\"environment\", \"text\": ...}");
    return split_at_common_prefix(prompt_ids,
                                  end.encode_ending(tokenizer, prompt_text + completion.get<std::string>(), special_tokens),
                                  !o.completion_only_loss);
}

// A sequence to pack: `length` tokens of an example from `start`.
struct Piece {
    const SftExample* example;
    int64_t start, length;
};

SftExample row_of(const std::vector<Piece>& pieces, bool several_sequences) {
    SftExample row;
    for (const Piece& p : pieces) {
        const auto first = p.example->ids.begin() + p.start;
        row.ids.insert(row.ids.end(), first, first + p.length);
        const auto trained = p.example->trained.begin() + p.start;
        row.trained.insert(row.trained.end(), trained, trained + p.length);
        if (several_sequences) row.sequence_lengths.push_back(p.length);
    }
    return row;
}

// TRL's best fit decreasing: longest first (a stable sort), each into the row with the least room
// that still holds it (the first such row opened, on ties), else into a new row.
std::vector<SftExample> best_fit_decreasing(std::vector<Piece> pieces, int64_t max_length) {
    std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.length > b.length; });
    std::vector<std::vector<Piece>> rows;
    std::map<int64_t, std::deque<size_t>> rows_with_room;  // room left (0 < room < max_length) -> rows, oldest first
    for (const Piece& piece : pieces) {
        size_t row = rows.size();
        int64_t room = max_length;
        if (auto fit = rows_with_room.lower_bound(piece.length); fit != rows_with_room.end()) {
            room = fit->first;
            row = fit->second.front();
            fit->second.pop_front();
            if (fit->second.empty()) rows_with_room.erase(fit);
        } else {
            rows.emplace_back();
        }
        rows[row].push_back(piece);
        if (room - piece.length > 0) rows_with_room[room - piece.length].push_back(row);
    }
    std::vector<SftExample> packed;
    for (const auto& pieces_of_row : rows) packed.push_back(row_of(pieces_of_row, true));
    return packed;
}

// TRL's wrapped packing: the examples' tokens end to end, cut every max_length.
std::vector<SftExample> wrapped(const std::vector<Piece>& examples, int64_t max_length) {
    const SftExample all = row_of(examples, false);
    std::vector<SftExample> rows;
    for (size_t start = 0; start < all.ids.size(); start += size_t(max_length)) {
        const size_t end = std::min(all.ids.size(), start + size_t(max_length));
        SftExample& row = rows.emplace_back();
        row.ids.assign(all.ids.begin() + long(start), all.ids.begin() + long(end));
        row.trained.assign(all.trained.begin() + long(start), all.trained.begin() + long(end));
    }
    return rows;
}

// A column of `row` that must hold an integer (or, for a mask, a boolean) per token, `length` of
// them when given (labels and masks: one per token of input_ids), read.
std::vector<int64_t> token_column(const json& row, const char* column, std::optional<size_t> length, const std::string& where) {
    const json& values = row[column];
    bool valid = values.is_array() && (!length || values.size() == *length);
    std::vector<int64_t> out;
    for (size_t i = 0; valid && i < values.size(); ++i) {
        valid = values[i].is_number_integer() || (length && values[i].is_boolean());
        if (valid) out.push_back(values[i].is_boolean() ? int64_t(values[i].get<bool>()) : values[i].get<int64_t>());
    }
    if (!valid)
        throw Error(ErrorKind::input, where + ": \"" + column + "\" must be a list of integers" +
                                          (length ? ", one per token of input_ids (" + std::to_string(*length) + ")" : ""));
    return out;
}

// TRL's processed row: input_ids as they are, trained where labels are not -100, or where every mask
// that applies is 1 (TRL's build_labels)
SftExample processed_example(const json& row, const std::string& where, const SftDataOptions& o, int64_t vocab_size) {
    SftExample e;
    e.ids = token_column(row, "input_ids", std::nullopt, where);
    for (size_t i = 0; i < e.ids.size(); ++i)
        if (e.ids[i] < 0 || e.ids[i] >= vocab_size)
            throw Error(ErrorKind::input, where + ": input_ids[" + std::to_string(i) + "] = " + std::to_string(e.ids[i]) +
                                              " is not a token of this tokenizer (ids 0 to " + std::to_string(vocab_size - 1) +
                                              ")");
    e.trained.assign(e.ids.size(), 1);
    if (row.contains("labels") && !row["labels"].is_null()) {
        const std::vector<int64_t> labels = token_column(row, "labels", e.ids.size(), where);
        for (size_t i = 0; i < labels.size(); ++i) {
            if (labels[i] != -100 && labels[i] != e.ids[i])
                throw Error(ErrorKind::input, where + ": labels[" + std::to_string(i) + "] is " + std::to_string(labels[i]) +
                                                  ", neither -100 nor input_ids[" + std::to_string(i) +
                                                  "]: grove sft trains a row's own next tokens; mark the others -100");
            e.trained[i] = labels[i] != -100;
        }
        return e;
    }
    std::vector<const char*> masks{"assistant_masks"};
    if (o.completion_only_loss) masks.push_back("completion_mask");
    for (const char* mask : masks) {
        if (!row.contains(mask) || row[mask].is_null()) continue;
        const std::vector<int64_t> bits = token_column(row, mask, e.ids.size(), where);
        for (size_t i = 0; i < bits.size(); ++i) e.trained[i] = e.trained[i] && bits[i] != 0;
    }
    return e;
}

// TRL's padding-free batches: each sequence's first token is masked (nothing predicts it).
void mask_first_tokens(SftExample& e) {
    int64_t start = 0;
    for (int64_t length : e.sequences()) {
        if (length > 0) e.trained[size_t(start)] = 0;
        start += length;
    }
}

void truncate(SftExample& e, const SftDataOptions& o) {
    const auto length = int64_t(e.ids.size());
    if (o.max_length <= 0 || length <= o.max_length) return;
    const int64_t first = o.keep_end ? length - o.max_length : 0;
    e.ids = std::vector<int64_t>(e.ids.begin() + first, e.ids.begin() + first + o.max_length);
    e.trained = std::vector<uint8_t>(e.trained.begin() + first, e.trained.begin() + first + o.max_length);
}

}  // namespace

bool padding_free_batches(const SftDataOptions& options) {
    return options.padding_free || options.packing == SftDataOptions::Packing::bfd ||
           options.packing == SftDataOptions::Packing::bfd_split;
}

SftDataOptions::Packing packing_from_name(const std::string& strategy) {
    return strategy == "wrapped"     ? SftDataOptions::Packing::wrapped
           : strategy == "bfd_split" ? SftDataOptions::Packing::bfd_split
                                     : SftDataOptions::Packing::bfd;
}

std::vector<SftExample> packed_examples(const std::vector<SftExample>& examples, int64_t max_length,
                                        SftDataOptions::Packing packing) {
    constexpr size_t kChunk = 1000;  // datasets' Dataset.map batch, within which TRL packs
    std::vector<SftExample> packed;
    for (size_t first = 0; first < examples.size(); first += kChunk) {
        std::vector<Piece> pieces;
        for (size_t i = first; i < std::min(examples.size(), first + kChunk); ++i) {
            const auto length = int64_t(examples[i].ids.size());
            if (length == 0) continue;
            if (packing == SftDataOptions::Packing::bfd_split)  // full pieces, the last one shorter
                for (int64_t start = 0; start < length; start += max_length)
                    pieces.push_back({&examples[i], start, std::min(max_length, length - start)});
            else
                pieces.push_back(
                    {&examples[i], 0, packing == SftDataOptions::Packing::bfd ? std::min(max_length, length) : length});
        }
        auto rows = packing == SftDataOptions::Packing::wrapped ? wrapped(pieces, max_length)
                                                                : best_fit_decreasing(std::move(pieces), max_length);
        for (auto& row : rows) packed.push_back(std::move(row));
    }
    return packed;
}

namespace {
// The row's "tools" (function schemas, as TRL passes them to apply_chat_template: a list, or the list
// as JSON text; JSON null is none) as a JSON array's text; empty without any. A checkpoint's ChatML
// template without a tools section drops them in transformers, so Grove refuses them there rather
// than write Qwen2.5's tools turn (which it writes where the folder has no template at all).
std::string row_tools(const json& row, ChatTemplate chat, const TokenizerConfig& config, const std::string& where) {
    if (!row.contains("tools") || row["tools"].is_null()) return "";
    json tools = row["tools"];
    if (tools.is_string()) tools = json::parse(tools.get<std::string>(), nullptr, false);
    if (tools.is_null()) return "";
    if (!tools.is_array() || !std::all_of(tools.begin(), tools.end(), [](const json& t) { return t.is_object(); }))
        throw Error(ErrorKind::input,
                    where + ": \"tools\" must be a list of function schemas (objects), or that list as JSON text");
    if (!tools.empty() && chat == ChatTemplate::chatml && !config.chat_template.empty() &&
        config.chat_template.find("tools") == std::string::npos)
        throw Error(ErrorKind::input, where +
                                          ": the row has \"tools\", but the checkpoint's ChatML template has no tools "
                                          "section (transformers, and so TRL, would leave them out without a word); "
                                          "leave the column out, or use a checkpoint whose template writes tools (Qwen's)");
    return tools.dump();
}
}  // namespace

SftExample sft_example(const json& row, const std::string& where, const SftDataOptions& o, const Tokenizer& tokenizer,
                       ChatTemplate chat, std::optional<int64_t> eos) {
    if (!row.is_object()) throw Error(ErrorKind::input, where + ": a row must be a JSON object");
    if (row.contains("chat_template_kwargs") && !row["chat_template_kwargs"].is_null())  // TRL renders the row with them
        throw Error(ErrorKind::input, where +
                                          ": the row's \"chat_template_kwargs\" column is not rendered by grove sft, so "
                                          "its tokens would differ from TRL's; leave it out");
    const std::string tools = row_tools(row, chat, tokenizer.config(), where);
    if (o.assistant_only_loss && (row.contains("input_ids") || row.contains(o.prompt_column) || !row.contains("messages")))
        throw Error(ErrorKind::input, where +
                                          ": sft.assistant_only_loss trains the assistant turns of conversation rows "
                                          "(\"messages\"), as TRL's does; this row is not one (a tokenized row's "
                                          "assistant_masks apply without the key: leave it false)");
    if (row.contains("input_ids")) return processed_example(row, where, o, tokenizer.vocab_size());
    const EndOfText end{tokenizer.config().eos_token.value_or(""), eos};
    if (row.contains(o.prompt_column)) return prompt_completion_example(row, tools, where, o, tokenizer, chat, end);
    if (row.contains("messages")) {
        if (!is_conversation(row["messages"]))
            throw Error(ErrorKind::input, where + ": \"messages\" must be a list of {\"role\", \"content\"} messages");
        const std::vector<ChatMessage> messages = chat_messages(row["messages"], where);
        if (o.assistant_only_loss) return assistant_turns_example(messages, tools, chat, tokenizer, where);
        return all_trained(tokenizer.encode(rendered(chat, messages, false, tokenizer.config(), tools, where), false));
    }
    if (row.contains(o.text_column) && row[o.text_column].is_string()) {
        return all_trained(end.encode_ending(tokenizer, row[o.text_column].get<std::string>(), true));
    }
    throw Error(ErrorKind::input, where + ": the row has none of TRL's SFT formats: \"input_ids\", \"" + o.prompt_column +
                                      "\" and \"" + o.completion_column +
                                      "\" (data.prompt_column, data.completion_column), \"messages\", "
                                      "or text in \"" +
                                      o.text_column + "\" (data.text_column)");
}

std::vector<SftExample> load_sft_examples(const std::string& source, const SftDataOptions& o, const Tokenizer& tokenizer,
                                          ChatTemplate chat, std::optional<int64_t> eos, std::ostream* log) {
    std::vector<SftExample> examples;
    int64_t rows = 0;
    const bool packing = o.packing != SftDataOptions::Packing::none;
    auto add = [&](const json& row, const std::string& where) {
        ++rows;
        SftExample e = sft_example(row, where, o, tokenizer, chat, eos);
        if (packing) {  // TRL packs without truncating or dropping first
            examples.push_back(std::move(e));
            return;
        }
        truncate(e, o);
        // TRL drops the rows truncation leaves without a trained token (only when it truncates)
        if (o.max_length == 0 || std::find(e.trained.begin(), e.trained.end(), 1) != e.trained.end())
            examples.push_back(std::move(e));
    };
    if (source.rfind("builtin:", 0) == 0) {
        for (const PromptRow& p : load_prompts(source, o.prompt_column)) {
            json row = json::parse(p.columns_json);
            row[o.prompt_column] = json::parse(prompt_json(p.text, p.messages));
            add(row, p.origin);
        }
    } else {
        for_each_jsonl_in_order(source, "the SFT dataset (JSONL)", add);
    }
    if (packing) examples = packed_examples(examples, o.max_length, o.packing);
    if (padding_free_batches(o))
        for (SftExample& e : examples) mask_first_tokens(e);
    const int64_t dropped = packing ? 0 : rows - int64_t(examples.size());
    if (examples.empty())
        throw Error(ErrorKind::input, source + ": no example has a trained token" +
                                          (rows ? " within sft.max_length = " + std::to_string(o.max_length) +
                                                      " tokens; raise it, or set sft.truncation_mode = \"keep_end\""
                                                : std::string(" (the file has no rows)")));
    if (dropped > 0 && log)
        *log << "grove sft: " << dropped << " of " << rows << " rows of " << source
             << " have no trained token within sft.max_length = " << o.max_length << " tokens; left out (as TRL drops them)\n";
    return examples;
}

}  // namespace grove
