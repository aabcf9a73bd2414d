#include "grove/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "grove/error.hpp"
#include "io/mapped_file.hpp"

namespace grove {

namespace {
Error corrupt(const std::string& path, const std::string& what) {
    return Error(ErrorKind::input, path + ": invalid safetensors file: " + what);
}

struct DTypeInfo {
    DType dtype;
    const char* name;
    size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::f64, "F64", 8}, {DType::f32, "F32", 4},      {DType::f16, "F16", 2}, {DType::bf16, "BF16", 2},
    {DType::i64, "I64", 8}, {DType::i32, "I32", 4},      {DType::i16, "I16", 2}, {DType::i8, "I8", 1},
    {DType::u8, "U8", 1},   {DType::boolean, "BOOL", 1},
};
}  // namespace

size_t dtype_size(DType dtype) {
    for (const auto& d : kDTypes)
        if (d.dtype == dtype) return d.size;
    return 0;
}
const char* dtype_name(DType dtype) {
    for (const auto& d : kDTypes)
        if (d.dtype == dtype) return d.name;
    return "?";
}
std::optional<DType> parse_dtype(const std::string& name) {
    for (const auto& d : kDTypes)
        if (name == d.name) return d.dtype;
    return std::nullopt;
}

int64_t TensorEntry::numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), file_(std::make_unique<MappedFile>(path)) {
    size_t mapping_size_ = file_->size();
    if (mapping_size_ < 8)
        throw corrupt(path, "the file has " + std::to_string(mapping_size_) + " bytes; a header needs at least 8");
    {
        const uint8_t* bytes = file_->data();
        uint64_t header_size = 0;
        for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | bytes[i];  // little-endian
        if (header_size > kMaxHeaderBytes)
            throw corrupt(path, "header size " + std::to_string(header_size) + " exceeds the format's limit of 100 MiB");
        if (header_size > mapping_size_ - 8)
            throw corrupt(path, "header size " + std::to_string(header_size) + " runs past the end of the file (" +
                                    std::to_string(mapping_size_) + " bytes)");
        const char* header_text = reinterpret_cast<const char*>(bytes + 8);
        nlohmann::json header;
        try {
            header = nlohmann::json::parse(header_text, header_text + header_size);
        } catch (const nlohmann::json::exception& e) {
            throw corrupt(path, std::string("the header is not valid JSON: ") + e.what());
        }
        if (!header.is_object()) throw corrupt(path, "the header is not a JSON object");
        const uint8_t* data = bytes + 8 + header_size;
        uint64_t data_size = mapping_size_ - 8 - header_size;
        for (const auto& [name, entry] : header.items()) {
            if (name == "__metadata__") {
                if (!entry.is_object()) throw corrupt(path, "__metadata__ must be an object of strings");
                for (const auto& [key, value] : entry.items()) {
                    if (!value.is_string()) throw corrupt(path, "__metadata__." + key + " is not a string");
                    metadata_[key] = value.get<std::string>();
                }
                continue;
            }
            const std::string tensor = name;  // a lambda may not capture a structured binding in C++17
            auto where = [&](const std::string& what) { return corrupt(path, "tensor '" + tensor + "': " + what); };
            if (!entry.is_object()) throw where("entry is not an object");
            for (const char* key : {"dtype", "shape", "data_offsets"})
                if (!entry.contains(key)) throw where(std::string("missing \"") + key + "\"");
            TensorEntry t;
            t.name = name;
            if (!entry["dtype"].is_string()) throw where("dtype is not a string");
            auto dtype = parse_dtype(entry["dtype"].get<std::string>());
            if (!dtype) throw where("unsupported dtype \"" + entry["dtype"].get<std::string>() + "\"");
            t.dtype = *dtype;
            if (!entry["shape"].is_array()) throw where("shape is not an array");
            uint64_t numel = 1;
            for (const auto& s : entry["shape"]) {
                if (!s.is_number_integer() || s.get<int64_t>() < 0) throw where("shape has a negative or non-integer size");
                uint64_t size = s.get<uint64_t>();
                if (size != 0 && numel > (uint64_t(1) << 62) / size) throw where("shape overflows");
                numel *= size;
                t.shape.push_back(int64_t(size));
            }
            const auto& offsets = entry["data_offsets"];
            if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
                !offsets[1].is_number_unsigned())
                throw where("data_offsets must be two non-negative integers");
            t.begin = offsets[0].get<uint64_t>();
            t.end = offsets[1].get<uint64_t>();
            if (t.begin > t.end || t.end > data_size)
                throw where("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                            "] lie outside the data section of " + std::to_string(data_size) + " bytes");
            uint64_t bytes = 0;
            if (__builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &bytes)) throw where("shape overflows");
            if (t.end - t.begin != bytes)
                throw where("shape x dtype size = " + std::to_string(bytes) + " bytes, but data_offsets span " +
                            std::to_string(t.end - t.begin));
            t.data = data + t.begin;
            tensors_.push_back(std::move(t));
        }
        std::sort(tensors_.begin(), tensors_.end(), [](const TensorEntry& a, const TensorEntry& b) {
            return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
        });
        for (size_t i = 1; i < tensors_.size(); ++i)
            if (tensors_[i].begin < tensors_[i - 1].end && tensors_[i].begin != tensors_[i].end)
                throw corrupt(path, "tensors '" + tensors_[i - 1].name + "' and '" + tensors_[i].name + "' overlap");
        for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
    }
}

SafetensorsFile::~SafetensorsFile() = default;

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
// A file written under a temporary name in the same folder, then fsync'ed and renamed over its
// path by commit(); dropped uncommitted (an error), the temporary file is removed.
class AtomicFile {
public:
    explicit AtomicFile(const std::string& path) : target_(path) {
        temporary_ =
            (target_.parent_path() / (".tmp-" + target_.filename().string() + "-" + std::to_string(::getpid()))).string();
        fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_ < 0) throw Error(ErrorKind::runtime, temporary_ + ": cannot create: " + std::strerror(errno));
    }
    ~AtomicFile() {
        if (fd_ >= 0) ::close(fd_);
        if (!committed_) ::unlink(temporary_.c_str());
    }
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(const void* data, size_t size) {
        size_t written = 0;
        while (written < size) {
            ssize_t n = ::write(fd_, static_cast<const char*>(data) + written, size - written);
            if (n < 0) {
                if (errno == EINTR) continue;
                throw Error(ErrorKind::runtime, temporary_ + ": write failed: " + std::strerror(errno));
            }
            written += size_t(n);
        }
    }
    void commit() {
        const int fd = fd_;
        fd_ = -1;
        const bool synced = ::fsync(fd) == 0;
        const int sync_error = errno;
        if (::close(fd) != 0 || !synced)
            throw Error(ErrorKind::runtime, temporary_ + ": flush failed: " + std::strerror(synced ? errno : sync_error));
        if (::rename(temporary_.c_str(), target_.c_str()) != 0)
            throw Error(ErrorKind::runtime, target_.string() + ": cannot replace: " + std::strerror(errno));
        committed_ = true;
    }

private:
    std::filesystem::path target_;
    std::string temporary_;
    int fd_ = -1;
    bool committed_ = false;
};
}  // namespace

void write_file_atomically(const std::string& path, const std::string& contents) {
    AtomicFile file(path);
    file.write(contents.data(), contents.size());
    file.commit();
}

std::vector<size_t> storage_order(const std::vector<TensorBytes>& tensors) {
    std::vector<size_t> ordered(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) ordered[i] = i;
    std::sort(ordered.begin(), ordered.end(), [&](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
    return ordered;
}

void write_safetensors(const std::string& path, const std::vector<TensorBytes>& tensors,
                       const std::map<std::string, std::string>& metadata, const std::function<const void*(size_t)>& data_of) {
    const std::vector<size_t> ordered = storage_order(tensors);
    nlohmann::json header = nlohmann::json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    uint64_t offset = 0;
    for (size_t i : ordered) {
        const TensorBytes& t = tensors[i];
        uint64_t numel = 1;
        for (int64_t s : t.shape) numel *= uint64_t(s);
        if (numel * dtype_size(t.dtype) != t.size)
            throw Error(ErrorKind::runtime, path + ": tensor '" + t.name + "' has " + std::to_string(t.size) +
                                                " bytes for a shape that needs " + std::to_string(numel * dtype_size(t.dtype)));
        header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.size}}};
        offset += t.size;
    }
    std::string header_text = header.dump();
    header_text.append((8 - header_text.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
    char length[8];
    for (int i = 0; i < 8; ++i) length[i] = char((uint64_t(header_text.size()) >> (8 * i)) & 0xff);
    AtomicFile file(path);
    file.write(length, 8);
    file.write(header_text.data(), header_text.size());
    for (size_t i : ordered) file.write(data_of ? data_of(i) : tensors[i].data, tensors[i].size);
    file.commit();
}

}  // namespace grove
