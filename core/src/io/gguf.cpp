#include "grove/gguf.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "grove/error.hpp"
#include "io/json_values.hpp"
#include "io/mapped_file.hpp"
#include "text/text_util.hpp"
#include "grove/safetensors.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace grove {

namespace {

Error corrupt(const std::string& path, const std::string& what) {
    return Error(ErrorKind::input, path + ": invalid GGUF file: " + what);
}

// Bounds-checked little-endian reader over the mapping.
class Reader {
public:
    Reader(const uint8_t* data, size_t size, const std::string& path) : data_(data), size_(size), path_(path) {}
    template <class T>
    T read(const char* what) {
        need(sizeof(T), what);
        T value;
        std::memcpy(&value, data_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return value;
    }
    std::string string(const char* what) {
        uint64_t n = read<uint64_t>(what);
        need(n, what);
        std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
        pos_ += n;
        return s;
    }
    void need(uint64_t n, const char* what) const {
        if (n > size_ - pos_)
            throw corrupt(path_, std::string(what) + " runs past the end of the file (offset " + std::to_string(pos_) + ")");
    }
    size_t pos() const { return pos_; }

private:
    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
    const std::string& path_;
};

json read_value(Reader& r, uint32_t type, const std::string& key, int depth = 0) {
    switch (type) {
        case 0:
            return r.read<uint8_t>(key.c_str());
        case 1:
            return r.read<int8_t>(key.c_str());
        case 2:
            return r.read<uint16_t>(key.c_str());
        case 3:
            return r.read<int16_t>(key.c_str());
        case 4:
            return r.read<uint32_t>(key.c_str());
        case 5:
            return r.read<int32_t>(key.c_str());
        case 6:
            return r.read<float>(key.c_str());
        case 7:
            return r.read<uint8_t>(key.c_str()) != 0;
        case 8:
            return r.string(key.c_str());
        case 9: {
            if (depth > 2) throw Error(ErrorKind::input, "GGUF: arrays nested too deeply at key " + key);
            uint32_t element = r.read<uint32_t>(key.c_str());
            uint64_t count = r.read<uint64_t>(key.c_str());
            r.need(count, key.c_str());  // every element takes at least one byte
            json array = json::array();
            for (uint64_t i = 0; i < count; ++i) array.push_back(read_value(r, element, key, depth + 1));
            return array;
        }
        case 10:
            return r.read<uint64_t>(key.c_str());
        case 11:
            return r.read<int64_t>(key.c_str());
        case 12:
            return r.read<double>(key.c_str());
        default:
            throw Error(ErrorKind::input, "GGUF: key " + key + " has unknown value type " + std::to_string(type));
    }
}

// block size (elements) and bytes per block of each supported type
bool type_layout(uint32_t type, uint64_t& block, uint64_t& block_bytes) {
    switch (GgmlType(type)) {
        case GgmlType::f32:
            block = 1;
            block_bytes = 4;
            return true;
        case GgmlType::f16:
            block = 1;
            block_bytes = 2;
            return true;
        case GgmlType::bf16:
            block = 1;
            block_bytes = 2;
            return true;
        case GgmlType::q8_0:
            block = 32;
            block_bytes = 34;
            return true;
        case GgmlType::q4_0:
            block = 32;
            block_bytes = 18;
            return true;
        case GgmlType::q4_1:
            block = 32;
            block_bytes = 20;
            return true;
    }
    return false;
}

float half_to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    uint32_t bits;
    if (exponent == 0) {
        if (mantissa == 0)
            bits = sign;
        else {  // subnormal: normalise
            exponent = 127 - 15 + 1;
            while (!(mantissa & 0x400)) {
                mantissa <<= 1;
                --exponent;
            }
            bits = sign | (exponent << 23) | ((mantissa & 0x3ff) << 13);
        }
    } else if (exponent == 31) {
        bits = sign | 0x7f800000 | (mantissa << 13);
    } else {
        bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t load_u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }

}  // namespace

uint64_t GgufTensor::elements() const {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    return n;
}

GgufFile::GgufFile(const std::string& path)
        : path_(path), file_(std::make_unique<MappedFile>(path)), metadata_(std::make_unique<json>(json::object())) {
    size_t size_ = file_->size();
    if (size_ < 24) throw corrupt(path, "the file is too small for a GGUF header");
    {
        const uint8_t* bytes = file_->data();
        Reader r(bytes, size_, path_);
        if (r.read<uint32_t>("magic") != 0x46554747) throw corrupt(path, "it does not start with the magic 'GGUF'");
        uint32_t version = r.read<uint32_t>("version");
        if (version < 2 || version > 3)
            throw corrupt(path, "version " + std::to_string(version) + " is not supported (2 or 3)");
        uint64_t tensor_count = r.read<uint64_t>("tensor count"), kv_count = r.read<uint64_t>("metadata count");
        if (tensor_count > size_ / 8 || kv_count > size_ / 8)
            throw corrupt(path, "tensor or metadata counts exceed the file size");
        for (uint64_t i = 0; i < kv_count; ++i) {
            std::string key = r.string("metadata key");
            uint32_t type = r.read<uint32_t>(key.c_str());
            (*metadata_)[key] = read_value(r, type, key);
        }
        for (uint64_t i = 0; i < tensor_count; ++i) {
            GgufTensor t;
            t.name = r.string("tensor name");
            uint32_t n_dims = r.read<uint32_t>(t.name.c_str());
            if (n_dims == 0 || n_dims > 4)
                throw corrupt(path, "tensor '" + t.name + "' has " + std::to_string(n_dims) + " dimensions");
            for (uint32_t d = 0; d < n_dims; ++d) t.dims.push_back(r.read<uint64_t>(t.name.c_str()));
            t.type = r.read<uint32_t>(t.name.c_str());
            t.offset = r.read<uint64_t>(t.name.c_str());
            tensors_.push_back(std::move(t));
        }
        const uint64_t alignment =
            metadata_->contains("general.alignment")
                ? uint64_t(json_integer((*metadata_)["general.alignment"], path + ": general.alignment", 1, int64_t(1) << 30))
                : 32;
        if (alignment & (alignment - 1)) throw corrupt(path, "general.alignment must be a power of two");
        uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;
        if (data_start > size_) throw corrupt(path, "the data section starts past the end of the file");
        for (auto& t : tensors_) {
            uint64_t block = 0, block_bytes = 0;
            if (!type_layout(t.type, block, block_bytes))
                throw corrupt(path, "tensor '" + t.name + "' has ggml type " + std::to_string(t.type) +
                                        ", which Grove cannot read (F32, F16, BF16, Q8_0, Q4_0, Q4_1)");
            uint64_t n = 1;
            for (uint64_t d : t.dims)
                if (__builtin_mul_overflow(n, d, &n))
                    throw corrupt(path, "tensor '" + t.name + "': the product of its dimensions overflows 64 bits");
            if (t.dims[0] % block)
                throw corrupt(path, "tensor '" + t.name + "': row length is not a multiple of the block size");
            if (__builtin_mul_overflow(n / block, block_bytes, &t.bytes))
                throw corrupt(path, "tensor '" + t.name + "': its size in bytes overflows 64 bits");
            if (t.offset > size_ - data_start || t.bytes > size_ - data_start - t.offset)
                throw corrupt(path, "tensor '" + t.name + "' lies outside the file");
            t.data = bytes + data_start + t.offset;
        }
    }
}

GgufFile::~GgufFile() = default;

const GgufTensor* GgufFile::find(const std::string& name) const {
    for (const auto& t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

std::vector<float> dequantize(const GgufTensor& t, const std::string&) {
    uint64_t n = t.elements();
    std::vector<float> out(n);
    const uint8_t* p = t.data;
    switch (GgmlType(t.type)) {
        case GgmlType::f32:
            if (n) std::memcpy(out.data(), p, n * 4);  // an empty vector's data() may be null
            break;
        case GgmlType::f16:
            for (uint64_t i = 0; i < n; ++i) out[i] = half_to_float(load_u16(p + 2 * i));
            break;
        case GgmlType::bf16:
            for (uint64_t i = 0; i < n; ++i) {
                uint32_t bits = uint32_t(load_u16(p + 2 * i)) << 16;
                std::memcpy(&out[i], &bits, 4);
            }
            break;
        case GgmlType::q8_0:
            for (uint64_t b = 0; b < n / 32; ++b, p += 34) {
                float d = half_to_float(load_u16(p));
                for (int j = 0; j < 32; ++j) out[b * 32 + j] = float(int8_t(p[2 + j])) * d;
            }
            break;
        case GgmlType::q4_0:
            for (uint64_t b = 0; b < n / 32; ++b, p += 18) {
                float d = half_to_float(load_u16(p));
                for (int j = 0; j < 16; ++j) {
                    out[b * 32 + j] = float(int(p[2 + j] & 0x0f) - 8) * d;
                    out[b * 32 + j + 16] = float(int(p[2 + j] >> 4) - 8) * d;
                }
            }
            break;
        case GgmlType::q4_1:
            for (uint64_t b = 0; b < n / 32; ++b, p += 20) {
                float d = half_to_float(load_u16(p)), m = half_to_float(load_u16(p + 2));
                for (int j = 0; j < 16; ++j) {
                    out[b * 32 + j] = float(p[4 + j] & 0x0f) * d + m;
                    out[b * 32 + j + 16] = float(p[4 + j] >> 4) * d + m;
                }
            }
            break;
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
namespace {

const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json byte_level(bool use_regex) {
    return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

// llama.cpp's tokenizer.ggml.pre names -> the tokenizer.json pre-tokenizer they stand for
json pre_tokenizer_for(const std::string& pre, const std::string& path) {
    auto split = [](const char* pattern) {
        return json{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
    };
    if (pre == "smollm")
        return {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}}};
    if (pre == "llama-bpe" || pre == "llama3")
        return {{"type", "Sequence"}, {"pretokenizers", {split(kLlama3Pattern), byte_level(false)}}};
    if (pre == "qwen2") return {{"type", "Sequence"}, {"pretokenizers", {split(kQwen2Pattern), byte_level(false)}}};
    if (pre == "gpt-2" || pre == "gpt2" || pre == "default" || pre.empty()) return byte_level(true);
    throw Error(ErrorKind::input, path + ": tokenizer.ggml.pre \"" + pre +
                                      "\" is not supported (supported: smollm, llama-bpe, qwen2, gpt-2, default)");
}

std::string meta_string(const json& m, const std::string& key, const std::string& path) {
    if (!m.contains(key)) throw Error(ErrorKind::input, path + ": missing GGUF key \"" + key + "\"");
    if (!m[key].is_string()) throw Error(ErrorKind::input, path + ": GGUF key \"" + key + "\" is not a string");
    return m[key].get<std::string>();
}

// An integer key in [min, max]; `fallback` when the key is absent (required when there is none).
int64_t meta_integer(const json& m, const std::string& key, const std::string& path, int64_t min, int64_t max,
                     std::optional<int64_t> fallback = std::nullopt) {
    if (!m.contains(key)) {
        if (fallback) return *fallback;
        throw Error(ErrorKind::input, path + ": missing GGUF key \"" + key + "\"");
    }
    return json_integer(m[key], path + ": GGUF key \"" + key + "\"", min, max);
}

double meta_number(const json& m, const std::string& key, const std::string& path, double fallback) {
    if (!m.contains(key)) return fallback;
    const double v = json_number(m[key], path + ": GGUF key \"" + key + "\"");
    if (!std::isfinite(v) || v <= 0) throw Error(ErrorKind::input, path + ": GGUF key \"" + key + "\" must be positive");
    return v;
}

// llama.cpp stores Q and K with rows permuted for its rotary kernel: per head, the two halves of
// the head dimension are interleaved. Row r = h*D + 2*i + k of the file is row h*D + k*D/2 + i of
// the Hugging Face weight.
std::vector<float> unpermute_rows(const std::vector<float>& w, uint64_t rows, uint64_t columns, uint64_t heads) {
    std::vector<float> out(w.size());
    uint64_t D = rows / heads;
    for (uint64_t h = 0; h < heads; ++h)
        for (uint64_t i = 0; i < D / 2; ++i)
            for (uint64_t k = 0; k < 2; ++k) {
                uint64_t from = h * D + 2 * i + k, to = h * D + k * (D / 2) + i;
                std::memcpy(&out[to * columns], &w[from * columns], columns * sizeof(float));
            }
    return out;
}

}  // namespace

namespace {
struct SpecialTokens {
    std::optional<int64_t> bos, eos, pad, unk;
};

// tokenizer.json and tokenizer_config.json from the GGUF vocabulary (byte-level BPE only).
void write_tokenizer_files(const json& m, const std::string& gguf_path, const std::string& out_dir,
                           const SpecialTokens& special, int64_t max_positions, int64_t vocab) {
    if (m.contains("tokenizer.ggml.tokens")) {
        const json& token_list = m["tokenizer.ggml.tokens"];
        if (!token_list.is_array() || int64_t(token_list.size()) != vocab)
            throw Error(ErrorKind::input, gguf_path + ": tokenizer.ggml.tokens must list " + std::to_string(vocab) +
                                              " tokens, one per row of token_embd.weight");
        for (const json& token : token_list)
            if (!token.is_string())
                throw Error(ErrorKind::input, gguf_path + ": tokenizer.ggml.tokens holds " + token.dump() + ", not a string");
        std::string model = m.value("tokenizer.ggml.model", std::string());
        if (model != "gpt2")
            throw Error(ErrorKind::input, gguf_path + ": tokenizer.ggml.model \"" + model +
                                              "\" is not supported (supported: gpt2, i.e. byte-level BPE)");
        const json& tokens = m["tokenizer.ggml.tokens"];
        json types = m.value("tokenizer.ggml.token_type", json::array());
        json vocab_map = json::object(), added = json::array();
        for (size_t i = 0; i < tokens.size(); ++i) {
            vocab_map[tokens[i].get<std::string>()] = i;
            const int64_t type = i < types.size() ? json_integer(types[i], gguf_path + ": tokenizer.ggml.token_type") : 1;
            if (type == 3 || type == 4)  // CONTROL or USER_DEFINED
                added.push_back({{"id", i},
                                 {"content", tokens[i]},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", type == 3}});
        }
        json tokenizer = {{"version", "1.0"},
                          {"truncation", nullptr},
                          {"padding", nullptr},
                          {"added_tokens", added},
                          {"normalizer", nullptr},
                          {"pre_tokenizer", pre_tokenizer_for(m.value("tokenizer.ggml.pre", std::string()), gguf_path)},
                          {"post_processor", nullptr},
                          {"decoder", byte_level(true)},
                          {"model",
                           {{"type", "BPE"},
                            {"dropout", nullptr},
                            {"unk_token", nullptr},
                            {"continuing_subword_prefix", nullptr},
                            {"end_of_word_suffix", nullptr},
                            {"fuse_unk", false},
                            {"byte_fallback", false},
                            {"ignore_merges", false},
                            {"vocab", vocab_map},
                            {"merges", m.value("tokenizer.ggml.merges", json::array())}}}};
        if (m.value("tokenizer.ggml.add_bos_token", false) && special.bos)
            tokenizer["post_processor"] = {
                {"type", "TemplateProcessing"},
                {"single",
                 {{{"SpecialToken", {{"id", tokens[*special.bos]}, {"type_id", 0}}}},
                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                {"pair", {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
                {"special_tokens",
                 {{tokens[*special.bos].get<std::string>(),
                   {{"id", tokens[*special.bos]}, {"ids", {*special.bos}}, {"tokens", {tokens[*special.bos]}}}}}}};
        write_file_atomically((fs::path(out_dir) / "tokenizer.json").string(),
                              tokenizer.dump(-1, ' ', false, json::error_handler_t::replace) + "\n");
        json tokenizer_config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                 {"add_bos_token", m.value("tokenizer.ggml.add_bos_token", false)},
                                 {"model_max_length", max_positions}};
        auto name_of = [&](const std::optional<int64_t>& id) { return tokens.at(size_t(*id)); };
        if (special.bos) tokenizer_config["bos_token"] = name_of(special.bos);
        if (special.eos) tokenizer_config["eos_token"] = name_of(special.eos);
        if (special.pad) tokenizer_config["pad_token"] = name_of(special.pad);
        if (special.unk) tokenizer_config["unk_token"] = name_of(special.unk);
        if (m.contains("tokenizer.chat_template")) tokenizer_config["chat_template"] = m["tokenizer.chat_template"];
        write_file_atomically((fs::path(out_dir) / "tokenizer_config.json").string(),
                              tokenizer_config.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
    }
}
}  // namespace

namespace {
// A Llama's dimensions from the metadata, each within a range and consistent with the others, so
// that every tensor's expected shape below is well defined.
struct LlamaShape {
    int64_t hidden, layers, heads, kv_heads, ffn, head_dim, vocab, context;
};

LlamaShape llama_shape(const GgufFile& file) {
    const json& m = file.metadata();
    const std::string& path = file.path();
    LlamaShape s{};
    s.hidden = meta_integer(m, "llama.embedding_length", path, 1, int64_t(1) << 17);
    s.layers = meta_integer(m, "llama.block_count", path, 1, 1024);
    s.heads = meta_integer(m, "llama.attention.head_count", path, 1, s.hidden);
    s.kv_heads = meta_integer(m, "llama.attention.head_count_kv", path, 1, s.heads, s.heads);
    if (s.heads % s.kv_heads)
        throw Error(ErrorKind::input, path + ": llama.attention.head_count (" + std::to_string(s.heads) +
                                          ") is not a multiple of head_count_kv (" + std::to_string(s.kv_heads) + ")");
    s.ffn = meta_integer(m, "llama.feed_forward_length", path, 1, int64_t(1) << 20);
    if (!m.contains("llama.rope.dimension_count") && s.hidden % s.heads)
        throw Error(ErrorKind::input, path + ": llama.embedding_length (" + std::to_string(s.hidden) +
                                          ") is not a multiple of llama.attention.head_count (" + std::to_string(s.heads) +
                                          ")");
    s.head_dim = meta_integer(m, "llama.rope.dimension_count", path, 2, 4096, s.hidden / s.heads);
    if (s.head_dim % 2) throw Error(ErrorKind::input, path + ": the head dimension " + std::to_string(s.head_dim) + " is odd");
    s.context = meta_integer(m, "llama.context_length", path, 1, int64_t(1) << 24, 2048);
    const GgufTensor* embedding = file.find("token_embd.weight");
    if (!embedding) throw Error(ErrorKind::input, path + ": missing tensor \"token_embd.weight\"");
    if (embedding->dims.size() != 2 || embedding->dims[0] != uint64_t(s.hidden) || embedding->dims[1] == 0 ||
        embedding->dims[1] > (uint64_t(1) << 22))
        throw Error(ErrorKind::input, path + ": tensor \"token_embd.weight\" must be [vocabulary, " + std::to_string(s.hidden) +
                                          "] with a vocabulary of at most 4194304");
    s.vocab = int64_t(embedding->dims[1]);
    return s;
}

// A special token id from the metadata, which must name one of the vocabulary's tokens.
std::optional<int64_t> special_token(const json& m, const std::string& key, const std::string& path, int64_t vocab) {
    if (!m.contains(key)) return std::nullopt;
    return json_integer(m[key], path + ": GGUF key \"" + key + "\" (a token id)", 0, vocab - 1);
}
}  // namespace

void convert_gguf_to_hf(const std::string& gguf_path, const std::string& out_dir) {
    GgufFile file(gguf_path);
    const json& m = file.metadata();
    std::string arch = meta_string(m, "general.architecture", gguf_path);
    if (arch != "llama")
        throw Error(ErrorKind::input,
                    gguf_path + ": general.architecture \"" + arch + "\" is not supported (supported: llama)");
    const LlamaShape shape = llama_shape(file);
    const int64_t hidden = shape.hidden, q_rows = shape.heads * shape.head_dim, kv_rows = shape.kv_heads * shape.head_dim;
    bool tied = file.find("output.weight") == nullptr;

    // weights, renamed to Hugging Face's names, shapes reversed to PyTorch order and checked
    struct Target {
        std::string name;
        std::vector<int64_t> shape;
    };
    std::map<std::string, Target> targets = {{"token_embd.weight", {"model.embed_tokens.weight", {shape.vocab, hidden}}},
                                             {"output_norm.weight", {"model.norm.weight", {hidden}}},
                                             {"output.weight", {"lm_head.weight", {shape.vocab, hidden}}}};
    const std::map<std::string, Target> block_targets = {{"attn_norm.weight", {"input_layernorm.weight", {hidden}}},
                                                         {"ffn_norm.weight", {"post_attention_layernorm.weight", {hidden}}},
                                                         {"attn_q.weight", {"self_attn.q_proj.weight", {q_rows, hidden}}},
                                                         {"attn_k.weight", {"self_attn.k_proj.weight", {kv_rows, hidden}}},
                                                         {"attn_v.weight", {"self_attn.v_proj.weight", {kv_rows, hidden}}},
                                                         {"attn_output.weight", {"self_attn.o_proj.weight", {hidden, q_rows}}},
                                                         {"ffn_gate.weight", {"mlp.gate_proj.weight", {shape.ffn, hidden}}},
                                                         {"ffn_up.weight", {"mlp.up_proj.weight", {shape.ffn, hidden}}},
                                                         {"ffn_down.weight", {"mlp.down_proj.weight", {hidden, shape.ffn}}}};
    for (int64_t l = 0; l < shape.layers; ++l)
        for (const auto& [g, h] : block_targets)
            targets["blk." + std::to_string(l) + "." + g] = {"model.layers." + std::to_string(l) + "." + h.name, h.shape};
    for (const auto& [name, target] : targets)
        if (name != "output.weight" && !file.find(name))
            throw Error(ErrorKind::input, gguf_path + ": missing tensor \"" + name + "\" of a " + std::to_string(shape.layers) +
                                              "-layer llama model");
    std::vector<std::vector<float>> buffers;
    std::vector<TensorBytes> tensors;
    buffers.reserve(file.tensors().size());
    for (const auto& t : file.tensors()) {
        auto it = targets.find(t.name);
        if (it == targets.end()) {
            if (t.name == "rope_freqs.weight") continue;  // llama3 rope factors: recomputed from config
            throw Error(ErrorKind::input, gguf_path + ": unexpected tensor \"" + t.name + "\" for a llama model");
        }
        std::vector<int64_t> torch_shape(t.dims.rbegin(), t.dims.rend());
        if (torch_shape != it->second.shape)
            throw Error(ErrorKind::input, gguf_path + ": tensor \"" + t.name + "\" has shape " + shape_text(torch_shape) +
                                              "; the metadata's dimensions need " + shape_text(it->second.shape));
        std::vector<float> values = dequantize(t, gguf_path);
        bool q = t.name.find("attn_q.weight") != std::string::npos, k = t.name.find("attn_k.weight") != std::string::npos;
        if (q || k)
            values = unpermute_rows(values, uint64_t(torch_shape[0]), uint64_t(torch_shape[1]),
                                    uint64_t(q ? shape.heads : shape.kv_heads));
        buffers.push_back(std::move(values));
        tensors.push_back(
            {it->second.name, DType::f32, torch_shape, buffers.back().data(), buffers.back().size() * sizeof(float)});
    }

    fs::create_directories(out_dir);
    std::optional<int64_t> bos, eos, pad, unk;
    bos = special_token(m, "tokenizer.ggml.bos_token_id", gguf_path, shape.vocab);
    eos = special_token(m, "tokenizer.ggml.eos_token_id", gguf_path, shape.vocab);
    pad = special_token(m, "tokenizer.ggml.padding_token_id", gguf_path, shape.vocab);
    unk = special_token(m, "tokenizer.ggml.unknown_token_id", gguf_path, shape.vocab);
    json config = {{"architectures", {"LlamaForCausalLM"}},
                   {"model_type", "llama"},
                   {"vocab_size", shape.vocab},
                   {"hidden_size", hidden},
                   {"intermediate_size", shape.ffn},
                   {"num_hidden_layers", shape.layers},
                   {"num_attention_heads", shape.heads},
                   {"num_key_value_heads", shape.kv_heads},
                   {"head_dim", shape.head_dim},
                   {"max_position_embeddings", shape.context},
                   {"rms_norm_eps", meta_number(m, "llama.attention.layer_norm_rms_epsilon", gguf_path, 1e-5)},
                   {"rope_theta", meta_number(m, "llama.rope.freq_base", gguf_path, 10000.0)},
                   {"tie_word_embeddings", tied},
                   {"hidden_act", "silu"},
                   {"attention_bias", false},
                   {"mlp_bias", false},
                   {"torch_dtype", "float32"}};
    json generation = json::object();
    if (bos) config["bos_token_id"] = generation["bos_token_id"] = *bos;
    if (eos) config["eos_token_id"] = generation["eos_token_id"] = *eos;
    if (pad) generation["pad_token_id"] = *pad;
    write_file_atomically((fs::path(out_dir) / "config.json").string(), config.dump(2) + "\n");
    write_file_atomically((fs::path(out_dir) / "generation_config.json").string(), generation.dump(2) + "\n");
    write_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});

    try {
        write_tokenizer_files(m, gguf_path, out_dir, {bos, eos, pad, unk}, shape.context, shape.vocab);
    } catch (const json::exception& e) {  // a metadata value of another type than the format's
        throw Error(ErrorKind::input, gguf_path + ": unexpected tokenizer metadata: " + e.what());
    }
}

}  // namespace grove
