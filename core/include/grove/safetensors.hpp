// The safetensors format (Hugging Face's weight files): a memory-mapped reader that validates every
// header field before trusting it, and an atomic writer. No libtorch here: tensor_io.hpp bridges to it.
//
// Layout: u64 little-endian N | N bytes of JSON header | data. The header maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data section), plus an
// optional "__metadata__" string map.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace grove {

class MappedFile;

enum class DType { f64, f32, f16, bf16, i64, i32, i16, i8, u8, boolean };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // safetensors spelling: "F32", "BF16", ...
std::optional<DType> parse_dtype(const std::string& name);

struct TensorEntry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // byte offsets within the data section
    uint64_t end = 0;
    const uint8_t* data = nullptr;  // into the mapping; valid while the file object lives
    int64_t numel() const;
};

class SafetensorsFile {
public:
    // Maps and validates the file: header size bounded and inside the file, valid JSON, known dtypes,
    // non-negative shapes, shape x dtype size == byte span, offsets inside the data section and not
    // overlapping. Throws grove::Error(input) naming the file and the tensor or key.
    explicit SafetensorsFile(const std::string& path);
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;

    const std::string& path() const { return path_; }
    const std::vector<TensorEntry>& tensors() const { return tensors_; }
    const TensorEntry* find(const std::string& name) const;
    const std::map<std::string, std::string>& metadata() const { return metadata_; }

    static constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the format's own limit

private:
    std::string path_;
    std::unique_ptr<MappedFile> file_;
    std::vector<TensorEntry> tensors_;
    std::map<std::string, size_t> index_;
    std::map<std::string, std::string> metadata_;
};

// A tensor to write: raw bytes in the given dtype, row-major.
struct TensorBytes {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
    size_t size;  // bytes; must equal numel x dtype_size
};

// Writes atomically: a temporary file in the same folder, flushed and fsync'ed, then renamed over
// `path`, so a crash never leaves a half-written file. Tensors are stored in name order, each
// written straight from its bytes (no copy of the whole file in memory). With `data_of`, the
// tensors' `data` may be null: data_of(i) supplies tensor i's bytes just before they are written
// (valid until the next call), so a caller can hold one tensor at a time.
void write_safetensors(const std::string& path, const std::vector<TensorBytes>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const std::function<const void*(size_t)>& data_of = {});

// The order write_safetensors stores `tensors` in (by name), as indices into them: a caller whose
// data_of talks to other processes has them follow the same order.
std::vector<size_t> storage_order(const std::vector<TensorBytes>& tensors);

// Writes `contents` to `path` atomically (temporary file + fsync + rename).
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace grove
