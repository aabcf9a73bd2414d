// Checksums of the files a checkpoint is made of, so a resume can refuse a damaged or incomplete
// checkpoint instead of continuing silently into a different run. XXH3 (the xxHash library) reads
// at memory speed, so verifying a checkpoint costs little next to loading it.
#pragma once

#include <cstdint>
#include <string>

namespace grove {

struct FileChecksum {
    uint64_t bytes = 0;
    std::string xxh3;  // 16 hex digits
};

// Throws grove::Error(input) naming the file when it cannot be read.
FileChecksum file_checksum(const std::string& path);

}  // namespace grove
