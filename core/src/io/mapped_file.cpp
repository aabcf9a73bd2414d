#include "io/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "grove/error.hpp"

namespace grove {

MappedFile::MappedFile(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(ErrorKind::input, path + ": cannot open: " + std::strerror(errno));
    struct stat st{};
    if (::fstat(fd, &st) != 0) {
        int saved = errno;
        ::close(fd);
        throw Error(ErrorKind::input, path + ": cannot stat: " + std::strerror(saved));
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
        mapping_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (mapping_ == MAP_FAILED) {
            int saved = errno;
            mapping_ = nullptr;
            ::close(fd);
            throw Error(ErrorKind::input, path + ": cannot map: " + std::strerror(saved));
        }
    }
    ::close(fd);
}

MappedFile::~MappedFile() {
    if (mapping_) ::munmap(mapping_, size_);
}

}  // namespace grove
