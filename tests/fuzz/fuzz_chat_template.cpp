// Chat templates: a conversation (a JSON list of messages, as a dataset's prompt column holds it),
// optionally followed by a NUL byte and an environment's tool schemas (tools_json), rendered by
// every family with and without the generation prompt.
#include <cstring>
#include <nlohmann/json.hpp>

#include "fuzz_support.hpp"
#include "grove/dataset.hpp"
#include "grove/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
    const std::string messages_text(reinterpret_cast<const char*>(data), nul ? size_t(nul - data) : size);
    const std::string tools = nul ? std::string(reinterpret_cast<const char*>(nul + 1), size - size_t(nul - data) - 1) : "";
    nlohmann::json messages = nlohmann::json::parse(messages_text, nullptr, false);
    if (messages.is_discarded()) return 0;  // JSON syntax is the JSONL target's business
    const std::string row = nlohmann::json{{"prompt", messages}}.dump() + "\n";
    const std::string path = grove_fuzz::write_input("chat.jsonl", reinterpret_cast<const uint8_t*>(row.data()), row.size());
    grove::TokenizerConfig config;
    config.bos_token = "<s>";
    config.eos_token = "</s>";
    // each family on its own: one that refuses the conversation (smollm3 without the checkpoint's
    // template and a system message, gemma where roles do not alternate) leaves the others to run
    for (auto family :
         {grove::ChatTemplate::chatml, grove::ChatTemplate::qwen3, grove::ChatTemplate::qwen3_thinking_off,
          grove::ChatTemplate::qwen3_instruct, grove::ChatTemplate::llama3, grove::ChatTemplate::llama3_1,
          grove::ChatTemplate::llama3_2, grove::ChatTemplate::llama2, grove::ChatTemplate::plain, grove::ChatTemplate::smollm3,
          grove::ChatTemplate::smollm3_thinking_off, grove::ChatTemplate::gemma, grove::ChatTemplate::tulu,
          grove::ChatTemplate::mistral, grove::ChatTemplate::deepseek_r1, grove::ChatTemplate::qwen3_thinking})
        grove_fuzz::expect_clean_outcome("chat template", [&] {
            for (const grove::PromptRow& prompt : grove::load_prompts(path))
                for (bool generation_prompt : {true, false})
                    grove::render_chat(family, prompt.messages, generation_prompt, config, tools);
        });
    return 0;
}
