// tokenizer.json (and tokenizer_config.json): loading, then encoding, decoding and looking up
// tokens as training and generation do. The input is tokenizer.json, optionally followed by a NUL
// byte and tokenizer_config.json.
#include <cstring>
#include <filesystem>

#include "fuzz_support.hpp"
#include "grove/tokenizer.hpp"

namespace {
const char* const kTexts[] = {"Hello world! 12345", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n", "café 東京 🙂\r\n\t ",
                              "<think>x</think><answer>85</answer>"};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string folder = grove_fuzz::work_dir() + "/tokenizer";
    std::filesystem::create_directories(folder);
    std::filesystem::remove(folder + "/tokenizer_config.json");
    const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
    const size_t json_size = nul ? size_t(nul - data) : size;
    grove_fuzz::write_input("tokenizer/tokenizer.json", data, json_size);
    if (nul) grove_fuzz::write_input("tokenizer/tokenizer_config.json", nul + 1, size - json_size - 1);
    grove_fuzz::expect_clean_outcome("tokenizer", [&] {
        auto tokenizer = grove::Tokenizer::load(folder);
        const int64_t vocab = tokenizer->vocab_size();
        for (const char* text : kTexts) {
            for (bool special : {true, false}) {
                std::vector<int64_t> ids = tokenizer->encode(text, special);
                for (int64_t id : ids)
                    if (id < 0 || id >= vocab) __builtin_trap();  // an id the model's embedding cannot hold
                tokenizer->decode(ids, special);
            }
        }
        std::vector<int64_t> every;
        for (int64_t id = 0; id < std::min<int64_t>(vocab, 4096); ++id) {
            every.push_back(id);
            tokenizer->is_special(id);
        }
        tokenizer->decode(every, false);
        tokenizer->decode(every, true);
        tokenizer->token_to_id("<|im_end|>");
    });
    return 0;
}
