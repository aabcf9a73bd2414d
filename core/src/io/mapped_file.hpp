// A read-only memory mapping of a whole file, shared by the safetensors and GGUF readers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace grove {

class MappedFile {
public:
    // Throws grove::Error(input) naming the file when it cannot be opened or mapped.
    explicit MappedFile(const std::string& path);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return static_cast<const uint8_t*>(mapping_); }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

private:
    std::string path_;
    void* mapping_ = nullptr;
    size_t size_ = 0;
};

}  // namespace grove
