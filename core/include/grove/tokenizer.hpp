// Tokenizers of Hugging Face checkpoints: byte-level BPE from tokenizer.json (GPT-2 / Llama 3 /
// Qwen2 / SmolLM2 style; pre-tokenizer regexes run by PCRE2, NFC by ICU) and sentencepiece models
// (tokenizer.model, through libsentencepiece). Special tokens come from tokenizer_config.json; the
// pad token may equal the EOS token, so masks are never derived from token ids.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace grove {

struct TokenizerConfig {
    std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
    std::optional<int64_t> bos_id, eos_id, pad_id;
    bool add_bos_token = false;  // sentencepiece: prepend BOS when add_special_tokens
    bool add_eos_token = false;
    std::string chat_template;  // the checkpoint's Jinja text, if any (used to recognise the family)
};

class Tokenizer {
public:
    // tokenizer.json when present (byte-level BPE), else tokenizer.model (sentencepiece), plus
    // tokenizer_config.json. Unsupported components are refused naming the file and the component.
    static std::unique_ptr<Tokenizer> load(const std::string& folder);
    virtual ~Tokenizer() = default;

    virtual std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const = 0;
    virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = true) const = 0;
    virtual int64_t vocab_size() const = 0;
    virtual std::optional<int64_t> token_to_id(const std::string& token) const = 0;
    virtual bool is_special(int64_t id) const = 0;

    const TokenizerConfig& config() const { return config_; }

protected:
    TokenizerConfig config_;
};

// Checks that the folder's tokenizer.json and tokenizer_config.json, where present, are JSON objects:
// opening a model folder names a damaged tokenizer at once. Throws grove::Error(input) naming the file.
void check_tokenizer_files(const std::string& folder);

// Copies whichever tokenizer and processor files exist (tokenizer.json / .model, tokenizer_config.json,
// special_tokens_map.json, chat templates, a multimodal checkpoint's preprocessor_config.json, ...)
// from one model folder to another.
void copy_tokenizer_files(const std::string& from_dir, const std::string& to_dir);

// Trains a sentencepiece tokenizer on a text corpus (one example per line) and writes tokenizer.model
// and tokenizer_config.json (<unk> 0, <s> 1, </s> 2, <pad> 3; BOS added; `symbols` kept whole).
struct TokenizerTrainOptions {
    int vocab_size = 512;
    std::string model_type = "bpe";    // bpe or unigram
    std::vector<std::string> symbols;  // user-defined pieces, e.g. <think>, </think>
    std::string chat_template;         // stored in tokenizer_config.json
    bool split_digits = true;          // one piece per digit, as Llama's tokenizer: arithmetic needs it
};
void train_sentencepiece(const std::vector<std::string>& corpus, const std::string& out_dir,
                         const TokenizerTrainOptions& options);

// Chat templates of the common families, rendered natively (no Jinja): each produces exactly what
// transformers' apply_chat_template produces with that family's reference template. qwen3 is
// Qwen3's template (reasoning in <think> blocks); qwen3_thinking_off is the same template rendered
// with enable_thinking=False (TRL's chat_template_kwargs), whose generation prompt closes an empty
// <think> block so the model answers directly.
// qwen3_instruct is Qwen3-Instruct-2507's: Qwen3's turns without any <think> handling. llama3_1 and
// llama3_2 are Llama 3.1 / 3.2 Instruct's, whose system turn carries a date (3.2: today's).
// qwen3_thinking is Qwen3-Thinking-2507's: Qwen3's turns, a generation prompt that opens <think>.
// opens_thinking is what auto finds in another template whose generation prompt opens a <think>
// block (QwQ's): recognised, so text prompts still work, but never rendered;
// phi_not_rendered likewise for Phi templates of other shapes: <|im_sep|> markers with <think>
// handling (Phi-4-reasoning), or <|end|> markers without the newline (Phi-3-medium's assistant prompt
// after every user turn).
// phi3 is Phi-3 / 3.5 Instruct's ("<|user|>\n"), phi4 Phi-4's (ChatML with <|im_sep|> between role
// and content), phi4_mini Phi-4-mini-instruct's ("<|user|>" without a newline).
// gemma is Gemma 2 / 3 Instruct's (<start_of_turn> turns, "model" for the assistant); templates with
// those markers but another shape are gemma_not_rendered, recognised and never rendered.
// tulu is OLMo 2 Instruct's and Tulu 3's ("<|user|>\n" turns, the EOS token after assistant turns).
// mistral is Mistral-7B-Instruct v0.1 / v0.2's ([INST] turns after one BOS token, no system role).
// deepseek_r1 is the DeepSeek-R1-Distill checkpoints' (Qwen and Llama: <｜User｜> / <｜Assistant｜> turns, the
// reasoning dropped from earlier assistant turns, a generation prompt that opens <think>).
// not_rendered is what auto finds in any other non-empty template: text prompts work, conversations
// are refused (rendered plainly they would differ from apply_chat_template's text).
enum class ChatTemplate {
    chatml,
    llama3,
    llama2,
    plain,
    qwen3,
    qwen3_thinking_off,
    qwen3_instruct,
    llama3_1,
    llama3_2,
    opens_thinking,
    phi3,
    phi_not_rendered,
    phi4,
    phi4_mini,
    smollm3,
    smollm3_thinking_off,
    gemma,
    gemma_not_rendered,
    tulu,
    not_rendered,
    mistral,
    deepseek_r1,
    qwen3_thinking
};

// A function call in an assistant message (a "tool_calls" entry, OpenAI's and transformers' form)
struct ToolCall {
    std::string name;
    std::string arguments_json;  // the "arguments" value as JSON, keys in the file's order: an object, or a string
};

struct ChatMessage {
    ChatMessage() = default;
    ChatMessage(std::string role, std::string content, std::vector<ToolCall> tool_calls = {},
                std::optional<std::string> reasoning_content = std::nullopt)
            : role(std::move(role)),
              content(std::move(content)),
              tool_calls(std::move(tool_calls)),
              reasoning_content(std::move(reasoning_content)) {}
    std::string role;  // system, user, assistant (qwen3 also: tool)
    std::string content;
    std::vector<ToolCall> tool_calls;  // an assistant's calls, rendered after its content by the Qwen families only
    // an assistant's reasoning given apart from its content, as Qwen3's templates take it (in place of a
    // <think> block in the content); other families refuse it
    std::optional<std::string> reasoning_content;
};

// "auto" recognises the family from the checkpoint's template text (ChatML markers, with Qwen3's
// enable_thinking switch or without, SmolLM3's metadata system turn, Llama 3 header ids, [INST],
// Phi's <|user|> turns and <|im_sep|>, Gemma's <start_of_turn>); "none"/"plain" joins contents.
// Unknown names are refused with the list. `enable_thinking` false picks qwen3_thinking_off or
// smollm3_thinking_off, and is refused for a family that has no such switch.
ChatTemplate chat_template_from_name(const std::string& name, const TokenizerConfig& config, bool enable_thinking = true);
// `tools_json` (an environment's tool schemas, a JSON array; empty: none) is rendered as the model's
// template renders apply_chat_template(tools=...): for chatml, Qwen2.5's "# Tools" system turn; for
// qwen3, the same turn without Qwen2.5's default system prompt. Assistant tool calls are written as
// Qwen2.5's and Qwen3's templates write them (<tool_call> blocks); other families refuse them.
std::string render_chat(ChatTemplate family, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                        const TokenizerConfig& config, const std::string& tools_json = "");
// A whole conversation (no generation prompt) as the training version of the family's template that
// TRL swaps in for assistant_only_loss renders it: Qwen3's keeps every assistant turn's reasoning
// block (an empty one where there is none), where Qwen3's own drops the blocks of turns before the
// last user query; every other family's renders as render_chat does.
std::string render_chat_for_training(ChatTemplate family, const std::vector<ChatMessage>& messages,
                                     const TokenizerConfig& config, const std::string& tools_json = "");
// The family a conversation renders in: a SmolLM3 system message that says "/no_think" or "/think"
// switches thinking off or on whatever enable_thinking says; any other family is itself.
ChatTemplate conversation_family(ChatTemplate family, const std::vector<ChatMessage>& messages);
// The family's name as model.chat_template spells it, or a description for the ones auto finds but
// never renders ("a template of no family Grove renders", ...).
std::string chat_template_name(ChatTemplate family);
// An environment's observation that ends by opening an assistant turn (ChatML's
// "<|im_start|>assistant\n", as tool responses do), continued as the template's generation prompt
// continues it: with qwen3_thinking_off and smollm3_thinking_off (the conversation's family, from
// conversation_family), an empty <think> block follows (TRL renders that suffix with
// chat_template_kwargs); with qwen3_thinking, and with deepseek_r1 after "<｜Assistant｜>", the
// "<think>\n" their generation prompts write. Any other observation is returned as it is.
std::string continue_assistant_turn(ChatTemplate family, const std::string& observation);

}  // namespace grove
