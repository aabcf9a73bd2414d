// JSONL datasets and rollouts files: the prompt loader (with every row's prompt rendered) and the
// rollouts reader, against a small byte-level tokenizer made at start-up.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fuzz_support.hpp"
#include "grove/dataset.hpp"
#include "grove/rollouts_file.hpp"
#include "grove/tokenizer.hpp"

namespace {
// GPT-2's byte-to-character map: the 256 single-byte tokens of a byte-level BPE with no merges.
std::unique_ptr<grove::Tokenizer> byte_level_tokenizer() {
    nlohmann::json vocab = nlohmann::json::object();
    int next_unprintable = 256;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        const int code_point = printable ? b : next_unprintable++;
        std::string utf8;
        if (code_point < 0x80) {
            utf8 = char(code_point);
        } else {
            utf8 += char(0xC0 | (code_point >> 6));
            utf8 += char(0x80 | (code_point & 0x3F));
        }
        vocab[utf8] = b;
    }
    nlohmann::json tokenizer = {
        {"version", "1.0"},
        {"added_tokens", nlohmann::json::array({{{"id", 256}, {"content", "<|endoftext|>"}, {"special", true}}})},
        {"normalizer", nullptr},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
        {"post_processor", nullptr},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
    const std::string folder = grove_fuzz::work_dir() + "/byte_tokenizer";
    std::filesystem::create_directories(folder);
    std::ofstream(folder + "/tokenizer.json") << tokenizer.dump();
    return grove::Tokenizer::load(folder);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::unique_ptr<grove::Tokenizer> tokenizer = byte_level_tokenizer();
    const std::string path = grove_fuzz::write_input("rows.jsonl", data, size);
    grove_fuzz::expect_clean_outcome("jsonl prompts", [&] {
        for (const grove::PromptRow& row : grove::load_prompts(path))
            for (auto family : {grove::ChatTemplate::chatml, grove::ChatTemplate::llama3})
                grove::prompt_text(row, family, tokenizer->config());
    });
    grove_fuzz::expect_clean_outcome("jsonl rollouts",
                                     [&] { grove::read_rollouts(path, 2, *tokenizer, tokenizer->vocab_size(), {"accuracy"}); });
    return 0;
}
