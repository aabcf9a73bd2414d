#include "fuzz_support.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>

#include "grove/error.hpp"

namespace grove_fuzz {

const std::string& work_dir() {
    // never freed: the exit handler that removes the folder runs after static destructors
    static const std::string* dir = [] {
        const char* shm = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
        auto* d = new std::string(std::string(shm) + "/grove-fuzz-" + std::to_string(::getpid()));
        std::filesystem::create_directories(*d);
        std::atexit([] { std::filesystem::remove_all(work_dir()); });
        return d;
    }();
    return *dir;
}

std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
    const std::string path = work_dir() + "/" + name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
    return path;
}

void expect_clean_outcome(const char* target, const std::function<void()>& parse) {
    try {
        parse();
    } catch (const grove::Error&) {
        // the expected answer to a bad file
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: not a grove::Error (the user would see \"internal error\"): %s\n", target, e.what());
        std::abort();
    }
}

}  // namespace grove_fuzz
