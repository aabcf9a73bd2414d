// Tokenizers against the `tokenizers` library and sentencepiece's own encoder, and chat templates
// against transformers' apply_chat_template (references made by make_tokenizers.py).
#include <gtest/gtest.h>

#include <ctime>
#include <iomanip>
#include <sstream>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "grove/dataset.hpp"
#include "grove/error.hpp"
#include "grove/tokenizer.hpp"
#include "plugin_test_support.hpp"

namespace {
const std::string kDir = std::string(GROVE_TEST_BINARY_DIR) + "/tokenizers/generated";

nlohmann::json read(const std::string& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
}
}  // namespace

namespace {
// Every case make_tokenizers.py recorded for a folder's tokenizer.json with the `tokenizers` library
void expect_matches_tokenizers_library(const std::string& family) {
    auto tokenizer = grove::Tokenizer::load(kDir + "/" + family);
    auto cases = read(kDir + "/" + family + "/expected.json");
    ASSERT_GT(cases.size(), 10u);
    for (const auto& c : cases) {
        std::string text = c["text"];
        EXPECT_EQ(tokenizer->encode(text, true), c["ids"].get<std::vector<int64_t>>()) << family << ": " << text;
        EXPECT_EQ(tokenizer->encode(text, false), c["ids_plain"].get<std::vector<int64_t>>()) << family << ": " << text;
        auto ids = c["ids"].get<std::vector<int64_t>>();
        EXPECT_EQ(tokenizer->decode(ids, true), c["decoded_skip"].get<std::string>()) << family << ": " << text;
        EXPECT_EQ(tokenizer->decode(ids, false), c["decoded_keep"].get<std::string>()) << family << ": " << text;
    }
}
}  // namespace

TEST(Tokenizer, ByteLevelBpeMatchesTokenizersLibrary) {
    for (const char* family : {"gpt2_style", "llama3_style", "qwen2_style", "smollm2_style", "split_string_style"})
        expect_matches_tokenizers_library(family);
}

// tokenizer.json as Llama 2, Mistral, TinyLlama and Gemma checkpoints ship it (transformers'
// conversion of their sentencepiece model): legacy normalizers, Metaspace prepending to the first
// text or never, Gemma's Replace normalizer with a Split pre-tokenizer and no prefix, each with added
// chat markers, byte fallback and its decoders.
TEST(Tokenizer, SentencepieceStyleTokenizerJsonMatchesTokenizersLibrary) {
    for (const char* family : {"sp_json_legacy", "sp_json_metaspace_first", "sp_json_metaspace_never", "sp_json_gemma"})
        expect_matches_tokenizers_library(family);
}

// Without a decoder, tokenizers joins the tokens with spaces (checked with tokenizers 0.22: "▁hi ▁ h")
TEST(Tokenizer, SentencepieceStyleWithoutADecoderJoinsWithSpaces) {
    const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/tokenizers/no_decoder";
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/tokenizer.json") << R"({"model": {"type": "BPE", "vocab": {"\u2581hi": 0, "\u2581": 1, "h": 2},
        "merges": []}, "pre_tokenizer": {"type": "Metaspace"}})";
    EXPECT_EQ(grove::Tokenizer::load(dir)->decode({0, 1, 2}, false), "\u2581hi \u2581 h");
}

TEST(Tokenizer, SpecialTokensResolveFromTokenizerConfigAndPadMayEqualEos) {
    auto tokenizer = grove::Tokenizer::load(kDir + "/llama3_style");
    const auto& c = tokenizer->config();
    ASSERT_TRUE(c.bos_id && c.eos_id && c.pad_id);
    EXPECT_EQ(*c.pad_id, *c.eos_id);
    EXPECT_EQ(tokenizer->encode("hi", true).front(), *c.bos_id);  // TemplateProcessing adds BOS
    EXPECT_TRUE(tokenizer->is_special(*c.eos_id));
    EXPECT_EQ(tokenizer->token_to_id("<|im_start|>").has_value(), true);
}

TEST(Tokenizer, SentencePieceMatchesSpmEncodeAndRoundTrips) {
    auto tokenizer = grove::Tokenizer::load(kDir + "/sentencepiece");
    auto cases = read(kDir + "/sentencepiece/expected.json");
    for (const auto& c : cases) {
        std::string text = c["text"];
        auto ids = tokenizer->encode(text, true);
        EXPECT_EQ(ids, c["ids"].get<std::vector<int64_t>>()) << text;
        EXPECT_EQ(tokenizer->decode(ids, true), c["decoded"].get<std::string>()) << text;
        EXPECT_EQ(tokenizer->encode(tokenizer->decode(ids, true), true), ids) << "normalised text round-trips";
    }
}

namespace {
std::string today(const std::string& format) {  // as transformers' strftime_now(format), in local time
    const std::time_t now = std::time(nullptr);
    std::ostringstream text;
    text << std::put_time(std::localtime(&now), format.c_str());
    return text.str();
}
}  // namespace

TEST(ChatTemplate, FamiliesMatchApplyChatTemplate) {
    auto tokenizer = grove::Tokenizer::load(kDir + "/llama3_style");
    auto data = read(kDir + "/chat_templates.json");
    int checked = 0;
    for (const auto& c : data["cases"]) {
        const std::vector<grove::ChatMessage> messages = grove::chat_messages(c["messages"], "case");
        grove::TokenizerConfig config = tokenizer->config();  // a checkpoint's own template, where the case names one
        if (c.contains("checkpoint_template"))
            config.chat_template = data["templates"][c["checkpoint_template"].get<std::string>()];
        auto family = grove::chat_template_from_name(c["family"], config, c.value("enable_thinking", true));
        const std::string tools = c.value("tools_json", std::string());
        const auto refusal = [&] {
            return grove::test::error_message(
                [&] { grove::render_chat(family, messages, c["add_generation_prompt"], config, tools); });
        };
        if (c.contains("error")) {  // the template raises: Grove refuses the conversation, naming the family
            EXPECT_CONTAINS(refusal(), c["family"].get<std::string>() + " chat template: ")
                << c["messages"].dump() << " tools " << tools << ": " << c["error"];
            ++checked;
            continue;
        }
        if (c.contains("grove_refuses")) {  // the template drops part of it without a word: Grove refuses
            EXPECT_CONTAINS(refusal(), c["grove_refuses"].get<std::string>()) << c["messages"].dump();
            ++checked;
            continue;
        }
        std::string expected = c["text"];
        if (const std::string date = c.value("date", std::string()); !date.empty()) {  // Llama 3.2, SmolLM3: today's
            const size_t at = expected.find("Today Date: " + date);
            if (at != std::string::npos)  // (not written under /system_override)
                expected.replace(at, 12 + date.size(), "Today Date: " + today(c.value("date_format", "%d %b %Y")));
        }
        EXPECT_EQ(grove::render_chat(family, messages, c["add_generation_prompt"], config, tools), expected)
            << c["family"] << " " << c["messages"].dump() << " enable_thinking " << c.value("enable_thinking", true)
            << " tools " << tools;
        ++checked;
    }
    EXPECT_GE(checked, 11 + 8 * 4 + 8 * 2 + 2 * 29 + 2 * 4 + 4 * 5 + 1 + 2 * 8 * 2 + 2 * 9 + 2 * 11 + 18 + 16);
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
    for (size_t at = text.find(from); !from.empty() && at != std::string::npos; at = text.find(from, at + to.size()))
        text.replace(at, from.size(), to);
    return text;
}

// Every template TRL ships for recognising checkpoints, over every conversation of the cases above:
// auto renders a conversation exactly as apply_chat_template does, or refuses it; it never differs
// without a word. The count of rendered cases keeps the families' coverage from shrinking unseen.
TEST(ChatTemplate, AutoRendersEveryTemplateTrlShipsAsApplyChatTemplateOrRefuses) {
    auto tokenizer = grove::Tokenizer::load(kDir + "/llama3_style");
    auto sweep = read(kDir + "/chat_templates.json")["trl_sweep"];
    int rendered = 0, refused = 0;
    std::map<std::string, int> rendered_per_template;
    for (const auto& c : sweep["cases"]) {
        const std::vector<grove::ChatMessage> messages = grove::chat_messages(c["messages"], "case");
        grove::TokenizerConfig config = tokenizer->config();
        config.chat_template = sweep["templates"][c["template"].get<std::string>()];
        std::string text;
        try {
            text = grove::render_chat(grove::chat_template_from_name("auto", config), messages, c["add_generation_prompt"],
                                      config);
        } catch (const grove::Error&) {
            ++refused;
            continue;
        }
        if (c.contains("error")) {
            ADD_FAILURE() << c["template"] << " " << c["messages"].dump() << ": apply_chat_template raises " << c["error"]
                          << ", Grove rendered " << text;
            continue;
        }
        std::string expected = c["text"];
        const std::vector<std::string> formats{"%d %b %Y", "%d %B %Y"};  // a dated template wrote the fixture's day
        for (size_t k = 0; k < formats.size(); ++k)
            expected = replaced(expected, c["dates"][k].get<std::string>(), today(formats[k]));
        EXPECT_EQ(text, expected) << c["template"] << " " << c["messages"].dump();
        ++rendered;
        ++rendered_per_template[c["template"]];
    }
    for (const auto& [name, n] : rendered_per_template) std::cout << name << ": " << n << " rendered\n";
    std::cout << rendered << " rendered, " << refused << " refused\n";
    EXPECT_GE(rendered, 200);  // 11 of TRL's 41 templates, DeepSeek-R1-Distill's and Qwen2.5's tool turns among them
}

// A tool response that opens the next assistant turn continues it as the generation prompt does:
// with Qwen3's enable_thinking=False, the empty <think> block the template writes there (as TRL
// renders that suffix with chat_template_kwargs); nothing is added otherwise.
TEST(ChatTemplate, ObservationsOpeningAnAssistantTurnContinueAsTheGenerationPrompt) {
    // Qwen3-Thinking-2507's and DeepSeek-R1-Distill's generation prompts open the reasoning block
    EXPECT_EQ(grove::continue_assistant_turn(grove::ChatTemplate::qwen3_thinking, "<|im_start|>assistant\n"),
              "<|im_start|>assistant\n<think>\n");
    EXPECT_EQ(grove::continue_assistant_turn(grove::ChatTemplate::deepseek_r1, "<\uff5cUser\uff5c>4<\uff5cAssistant\uff5c>"),
              "<\uff5cUser\uff5c>4<\uff5cAssistant\uff5c><think>\n");
    EXPECT_EQ(grove::continue_assistant_turn(grove::ChatTemplate::deepseek_r1, "<\uff5cUser\uff5c>4"), "<\uff5cUser\uff5c>4");
    const std::string observation =
        "\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    EXPECT_EQ(grove::continue_assistant_turn(grove::ChatTemplate::qwen3_thinking_off, observation),
              observation + "<think>\n\n</think>\n\n");
    // SmolLM3's no-think generation prompt ends its empty block with one newline
    EXPECT_EQ(grove::continue_assistant_turn(grove::ChatTemplate::smollm3_thinking_off, observation),
              observation + "<think>\n\n</think>\n");
    // ... and a SmolLM3 system message's /no_think or /think decides the conversation's mode
    EXPECT_EQ(grove::conversation_family(grove::ChatTemplate::smollm3, {{"system", "Be brief /no_think"}, {"user", "hi"}}),
              grove::ChatTemplate::smollm3_thinking_off);
    EXPECT_EQ(grove::conversation_family(grove::ChatTemplate::smollm3_thinking_off, {{"system", "/think"}}),
              grove::ChatTemplate::smollm3);
    EXPECT_EQ(grove::conversation_family(grove::ChatTemplate::smollm3_thinking_off, {{"user", "/think"}}),
              grove::ChatTemplate::smollm3_thinking_off);
    EXPECT_EQ(grove::conversation_family(grove::ChatTemplate::qwen3, {{"system", "/no_think"}}), grove::ChatTemplate::qwen3);
    for (auto family : {grove::ChatTemplate::qwen3, grove::ChatTemplate::chatml, grove::ChatTemplate::smollm3})
        EXPECT_EQ(grove::continue_assistant_turn(family, observation), observation);
    EXPECT_EQ(grove::continue_assistant_turn(grove::ChatTemplate::qwen3_thinking_off, "[the door opens]"), "[the door opens]");
}

// A ChatML template's default system prompt is literal text only: one in the template's plain text
// (outside {{ }}) counts; a system turn whose text is an expression does not, in plain text or
// in a string literal.
TEST(ChatTemplate, ADefaultSystemPromptIsLiteralText) {
    grove::TokenizerConfig config;
    const std::vector<grove::ChatMessage> user_only{{"user", "hi"}};
    config.chat_template = "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nBe brief.<|im_end|>\n{% endif %}";
    EXPECT_EQ(grove::render_chat(grove::ChatTemplate::chatml, user_only, true, config),
              "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    for (const char* expression : {"<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>",
                                   "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>' }}"}) {
        config.chat_template = expression;
        EXPECT_EQ(grove::render_chat(grove::ChatTemplate::chatml, user_only, true, config),
                  "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
            << expression;
    }
}

TEST(ChatTemplate, AutoRecognisesTheCheckpointsTemplate) {
    auto data = read(kDir + "/chat_templates.json");
    grove::TokenizerConfig config;
    config.chat_template = data["templates"]["chatml"];
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::chatml);
    EXPECT_THROW(grove::chat_template_from_name("auto", config, /*enable_thinking=*/false), grove::Error)
        << "ChatML has no thinking switch";
    config.chat_template = data["templates"]["qwen3"];
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::qwen3);
    EXPECT_EQ(grove::chat_template_from_name("auto", config, false), grove::ChatTemplate::qwen3_thinking_off);
    config.chat_template = data["templates"]["qwen3_instruct"];
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::qwen3_instruct);
    // SmolLM3's has enable_thinking too, and a metadata system turn Qwen3's lacks
    config.chat_template = data["templates"]["smollm3"];
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::smollm3);
    EXPECT_EQ(grove::chat_template_from_name("auto", config, false), grove::ChatTemplate::smollm3_thinking_off);
    for (const auto& [messages, says] :
         {std::pair{std::vector<grove::ChatMessage>{{"user", "hi"}, {"system", "late"}}, "a system message after the first"},
          {std::vector<grove::ChatMessage>{{"user", "hi"}, {"ipython", "4"}}, "role \"ipython\""}})
        EXPECT_CONTAINS(
            grove::test::error_message([&] { grove::render_chat(grove::ChatTemplate::smollm3, messages, true, config); }),
            std::string("smollm3 chat template: ") + says + " is not supported (the template drops it silently");
    config.chat_template = "{{ 'Knowledge Cutoff Date' }} Reasoning Mode <|im_start|>";  // no default instructions
    EXPECT_CONTAINS(
        grove::test::error_message([&] { grove::render_chat(grove::ChatTemplate::smollm3, {{"user", "hi"}}, true, config); }),
        "has no SmolLM3 default instructions");
    EXPECT_NO_THROW(grove::render_chat(grove::ChatTemplate::smollm3, {{"system", "S"}, {"user", "hi"}}, true, config));
    // a generation prompt that opens <think> in a template that is not Qwen3-Thinking-2507's (QwQ's) is
    // recognised, so text prompts work, but a conversation is not rendered by guesswork
    config.chat_template = "{{- '<|im_start|>assistant\\n<think>\\n' }}";
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::opens_thinking);
    config.chat_template = "{{- '<|im_start|>assistant\n<think>\n' }}";  // the newlines written out
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::opens_thinking);
    EXPECT_CONTAINS(grove::test::error_message(
                        [&] { grove::render_chat(grove::ChatTemplate::opens_thinking, {{"user", "hi"}}, true, config); }),
                    "opens a <think> block in its generation prompt");
    config.chat_template = data["templates"]["qwen3_thinking"];
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::qwen3_thinking);
    EXPECT_CONTAINS(grove::test::error_message([&] { grove::chat_template_from_name("auto", config, false); }),
                    "(recognised as qwen3_thinking) has no thinking switch");
    config.chat_template = data["templates"]["llama3"];
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::llama3);
    // a default system prompt that mentions <think> (an R1-Zero-style Qwen2.5 template) is still plain
    // ChatML, and so are turns written with double quotes
    config.chat_template =
        replaced(data["templates"]["qwen2_5"], "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
                 "Reason in <think> </think> first.");
    ASSERT_NE(config.chat_template.find("Reason in <think>"), std::string::npos);
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::chatml);
    EXPECT_CONTAINS(grove::render_chat(grove::ChatTemplate::chatml, {{"user", "hi"}}, true, config),
                    "<|im_start|>system\nReason in <think> </think> first.<|im_end|>\n");
    config.chat_template =
        "{% for message in messages %}{{\"<|im_start|>\" + message[\"role\"] + \"\\n\" + message[\"content\"] + "
        "\"<|im_end|>\\n\"}}{% endfor %}";
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::chatml);
    for (const char* chatml : {"qwen2_5", "qwen2_5_math", "smollm2"})
        if (data["templates"].contains(chatml)) {
            config.chat_template = data["templates"][chatml];
            EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::chatml) << chatml;
        }
    for (const auto& [name, family] : {std::pair{"phi3", grove::ChatTemplate::phi3},
                                       {"phi3_5", grove::ChatTemplate::phi3},
                                       {"phi4", grove::ChatTemplate::phi4},
                                       {"phi4_mini", grove::ChatTemplate::phi4_mini}}) {
        config.chat_template = data["templates"][name];
        EXPECT_EQ(grove::chat_template_from_name("auto", config), family) << name;
    }
    // their templates drop the turn without a word
    for (auto family : {grove::ChatTemplate::phi3, grove::ChatTemplate::phi4, grove::ChatTemplate::llama2})
        EXPECT_CONTAINS(
            grove::test::error_message([&] { grove::render_chat(family, {{"user", "2+2?"}, {"tool", "4"}}, true, config); }),
            "chat template: role \"tool\" is not supported");
    // Phi templates of other shapes are recognised, never rendered: <|im_sep|> with <think> handling
    // (Phi-4-reasoning's), and Phi-3-medium's, which writes the newline as a separate string and the
    // assistant prompt after every user turn
    for (const char* other : {"{{'<|im_start|>system<|im_sep|>You are Phi. <think> ...<|im_end|>'}}",
                              "{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + "
                              "message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif (message['role'] == "
                              "'assistant') %}{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}"}) {
        config.chat_template = other;
        EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::phi_not_rendered) << other;
    }
    EXPECT_CONTAINS(grove::test::error_message(
                        [&] { grove::render_chat(grove::ChatTemplate::phi_not_rendered, {{"user", "hi"}}, true, config); }),
                    "a Phi template of a shape Grove does not render natively");
    config.chat_template = data["templates"]["llama3_1"];
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::llama3_1);
    config.chat_template = data["templates"]["llama3_2"];
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::llama3_2);
    config.chat_template = data["templates"]["llama2"];
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::llama2);
    for (const char* gemma : {"gemma3", "gemma2"}) {
        config.chat_template = data["templates"][gemma];
        EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::gemma) << gemma;
    }
    // <start_of_turn> turns of another shape (here: no trim, a developer role) are recognised, not rendered
    config.chat_template =
        "{% for m in messages %}{{ '<start_of_turn>' + m['role'] + '\\n' + m['content'] + "
        "'<end_of_turn>\\n' }}{% endfor %}";
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::gemma_not_rendered);
    EXPECT_CONTAINS(grove::test::error_message(
                        [&] { grove::render_chat(grove::ChatTemplate::gemma_not_rendered, {{"user", "hi"}}, true, config); }),
                    "has Gemma's <start_of_turn> markers but is neither Gemma 2's nor Gemma 3's");
    for (const char* mistral : {"mistral", "mistral_eos_space"}) {
        config.chat_template = data["templates"][mistral];
        EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::mistral) << mistral;
    }
    config.chat_template = data["templates"]["deepseek_r1"];
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::deepseek_r1);
    for (const char* tulu : {"olmo2", "tulu3"}) {
        config.chat_template = data["templates"][tulu];
        EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::tulu) << tulu;
    }
    EXPECT_CONTAINS(grove::test::error_message([&] {
                        grove::render_chat(grove::ChatTemplate::tulu, {{"user", "Add 2 and 2."}, {"tool", "4"}}, true, config);
                    }),
                    "tulu chat template: role \"tool\" is not supported (the template drops it silently");
    // a template of no family (Zephyr's: the EOS after every turn; <｜User｜> turns of another shape than
    // DeepSeek-R1's) is not rendered as plain text: conversations are refused, text prompts still work
    for (const std::string other :
         {"{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + "
          "eos_token }}{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}{% endfor %}",
          "{% for message in messages %}{{ '<\uff5cUser\uff5c>' + message['content'] }}{% endfor %}",
          // ChatML turns that handle <think> blocks in no way Grove knows: not plain ChatML
          "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'].split('</think>')[-1] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
          // OLMo 3 Instruct's shape: ChatML markers, a default system prompt built from pieces, each role
          // spelt out, the EOS token after the last assistant turn
          "{%- if not has_system -%}{{- '<|im_start|>system\nYou are Olmo. ' -}}{{- 'No functions.<|im_end|>\n' -}}"
          "{%- endif -%}{%- for message in messages -%}{%- if message['role'] == 'user' -%}{{- '<|im_start|>user\n' + "
          "message['content'] + '<|im_end|>\n' -}}{%- elif message['role'] == 'assistant' -%}{{- '<|im_start|>assistant\n' "
          "+ message['content'] -}}{%- if not loop.last -%}{{- '<|im_end|>\n' -}}{%- else -%}{{- eos_token -}}{%- endif -%}"
          "{%- endif -%}{%- endfor -%}",
          // a Tulu 3 derivative that thinks: BOS under add_bos_token, <think> in the generation prompt
          "{%- if add_bos_token %}{{- bos_token }}{%- endif %}{% for message in messages %}{% if message['role'] == "
          "'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'assistant' %}{% if not "
          "loop.last %}{{ '<|assistant|>\n' + message['content'] + eos_token + '\n' }}{% else %}{{ '<|assistant|>\n' + "
          "message['content'] + eos_token }}{% endif %}{% endif %}{% if loop.last and add_generation_prompt %}{{ "
          "'<|assistant|>\n<think>\n' }}{% endif %}{% endfor %}"}) {
        config.chat_template = other;
        EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::not_rendered) << other;
    }
    EXPECT_CONTAINS(grove::test::error_message(
                        [&] { grove::render_chat(grove::ChatTemplate::not_rendered, {{"user", "hi"}}, true, config); }),
                    "is of none of the families Grove renders natively");
    config.chat_template = "";
    EXPECT_EQ(grove::chat_template_from_name("auto", config), grove::ChatTemplate::plain);
    try {
        grove::chat_template_from_name("chatmel", config);
        FAIL();
    } catch (const grove::Error& e) {
        EXPECT_NE(std::string(e.what()).find("did you mean 'chatml'?"), std::string::npos) << e.what();
    }
}

TEST(Tokenizer, BrokenFilesNameTheFileAndComponent) {
    std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/tokenizers/broken";
    std::filesystem::create_directories(dir);
    auto error_of = [&](const std::string& json_text) {
        std::ofstream(dir + "/tokenizer.json") << json_text;
        try {
            grove::Tokenizer::load(dir);
        } catch (const grove::Error& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    EXPECT_NE(error_of("{not json").find("tokenizer.json: invalid JSON"), std::string::npos);
    EXPECT_NE(error_of(R"({"model": {"type": "WordPiece", "vocab": {}}})").find("model type \"WordPiece\" is not supported"),
              std::string::npos);
    std::string message = error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})");
    EXPECT_NE(message.find("pre-tokenizer regex does not compile"), std::string::npos) << message;
    message =
        error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Whitespace"}})");
    EXPECT_NE(message.find("pre-tokenizer \"Whitespace\" is not supported"), std::string::npos) << message;
    // neither byte-level nor sentencepiece-style: what the file's spaces become is unknown
    message = error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
    EXPECT_NE(message.find("only byte-level BPE files (a ByteLevel pre-tokenizer) and sentencepiece-style ones"),
              std::string::npos)
        << message;
    message = error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Metaspace"},
        "decoder": {"type": "WordPiece"}})");
    EXPECT_NE(message.find("decoder \"WordPiece\" is not supported"), std::string::npos) << message;
    // an added token matched on normalized text (older Llama 2 files): tokenizers' matching is not Grove's
    message = error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "added_tokens": [{"id": 1, "content": "</s>", "special": true, "normalized": true}]})");
    EXPECT_NE(message.find("added token \"</s>\" is matched on normalized text"), std::string::npos) << message;
    std::ofstream(dir + "/tokenizer.json") << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
        "pre_tokenizer": {"type": "ByteLevel"}})";
    std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": "</s>"})";
    try {
        grove::Tokenizer::load(dir);
        FAIL();
    } catch (const grove::Error& e) {
        EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: eos_token \"</s>\" is not in the vocabulary"),
                  std::string::npos)
            << e.what();
    }
}

TEST(TokenizerTraining, GroveTrainedSentencepieceMatchesSpmAndKeepsSymbolsWhole) {
    std::string out = std::string(GROVE_TEST_BINARY_DIR) + "/tokenizers/trained";
    auto r = grove::test::run_grove(
        "tokenizer train --input builtin:arithmetic --out " + out +
        " --vocab-size 512 --symbol '<think>' --symbol '</think>' --symbol '<answer>' --symbol '</answer>'");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    auto tokenizer = grove::Tokenizer::load(out);
    std::string text = "What is 12 + 30? <think>12 + 30 = 42</think><answer>42</answer>";
    auto ids = tokenizer->encode(text, false);
    auto spm =
        grove::test::run_command("echo '" + text + "' | spm_encode --model=" + out + "/tokenizer.model --output_format=id");
    ASSERT_EQ(spm.exit_code, 0) << spm.out;
    std::vector<int64_t> expected;
    std::istringstream words(spm.out);
    for (int64_t id; words >> id;) expected.push_back(id);
    EXPECT_EQ(ids, expected);
    for (const char* symbol : {"<think>", "</think>", "<answer>", "</answer>"}) {
        auto id = tokenizer->token_to_id(symbol);
        ASSERT_TRUE(id.has_value()) << symbol;
        EXPECT_NE(std::find(ids.begin(), ids.end(), *id), ids.end()) << symbol << " was split";
    }
    EXPECT_EQ(tokenizer->decode(ids, true), text);
    EXPECT_EQ(tokenizer->encode(text, true), ids) << "no BOS: prompts are tokenized without specials in training too";
    EXPECT_EQ(*tokenizer->config().pad_id, 3);
    auto bad = grove::test::run_grove("tokenizer train --input /nonexistent.txt --out " + out);
    EXPECT_EQ(bad.exit_code, 5);
}
