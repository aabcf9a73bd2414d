#include "io/file_checksum.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "grove/error.hpp"

#define XXH_INLINE_ALL  // header-only: no shared library for the programs to carry
#include <xxhash.h>

namespace grove {

FileChecksum file_checksum(const std::string& path) {
    std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
    if (!file) throw Error(ErrorKind::input, path + ": cannot read: " + std::strerror(errno));
    std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(), XXH3_freeState);
    XXH3_64bits_reset(state.get());
    std::vector<char> buffer(size_t(1) << 20);
    FileChecksum sum;
    size_t n = 0;
    while ((n = std::fread(buffer.data(), 1, buffer.size(), file.get())) > 0) {
        XXH3_64bits_update(state.get(), buffer.data(), n);
        sum.bytes += n;
    }
    if (std::ferror(file.get())) throw Error(ErrorKind::input, path + ": read failed: " + std::strerror(errno));
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits_digest(state.get())));
    sum.xxh3 = hex;
    return sum;
}

}  // namespace grove
