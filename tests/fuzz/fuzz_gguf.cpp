// GGUF: the reader, every tensor dequantized, and the conversion to a Hugging Face folder.
#include <filesystem>

#include "fuzz_support.hpp"
#include "grove/gguf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = grove_fuzz::write_input("model.gguf", data, size);
    grove_fuzz::expect_clean_outcome("gguf", [&] {
        grove::GgufFile file(path);
        for (const grove::GgufTensor& t : file.tensors()) grove::dequantize(t, path);
    });
    const std::string out = grove_fuzz::work_dir() + "/converted";
    grove_fuzz::expect_clean_outcome("gguf", [&] { grove::convert_gguf_to_hf(path, out); });
    std::filesystem::remove_all(out);
    return 0;
}
