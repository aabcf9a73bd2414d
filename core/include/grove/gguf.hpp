// GGUF (llama.cpp's model file) reading and conversion of Llama-family GGUF files into Hugging Face
// folders. No libtorch: tensors are dequantized into float buffers.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <memory>
#include <string>
#include <vector>

namespace grove {

class MappedFile;

// ggml tensor types Grove can read
enum class GgmlType : uint32_t { f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q8_0 = 8, bf16 = 30 };

struct GgufTensor {
    std::string name;
    uint32_t type;               // GgmlType value
    std::vector<uint64_t> dims;  // ggml order: dims[0] varies fastest (reverse of the PyTorch shape)
    uint64_t offset = 0;         // within the data section
    const uint8_t* data = nullptr;
    uint64_t bytes = 0;
    uint64_t elements() const;
};

class GgufFile {
public:
    // Maps and validates: magic, version, every count and length inside the file, known tensor types,
    // tensor bytes inside the data section. Errors name the file and the key or tensor.
    explicit GgufFile(const std::string& path);
    ~GgufFile();
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;

    const std::string& path() const { return path_; }
    const nlohmann::json& metadata() const { return *metadata_; }
    const std::vector<GgufTensor>& tensors() const { return tensors_; }
    const GgufTensor* find(const std::string& name) const;

private:
    std::string path_;
    std::unique_ptr<MappedFile> file_;
    std::unique_ptr<nlohmann::json> metadata_;
    std::vector<GgufTensor> tensors_;
};

// Dequantizes F32, F16, BF16, Q8_0, Q4_0 and Q4_1 to float32, in ggml element order.
std::vector<float> dequantize(const GgufTensor& tensor, const std::string& file);

// Writes config.json, generation_config.json, model.safetensors (float32), tokenizer.json and
// tokenizer_config.json into out_dir. Undoes llama.cpp's rotary row permutation of Q and K.
void convert_gguf_to_hf(const std::string& gguf_path, const std::string& out_dir);

}  // namespace grove
