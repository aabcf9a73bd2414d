#include "test_paths.hpp"

#include <map>
#include <mutex>
#include <string>

namespace grove::test_paths {

const char* source_dir() { return GROVE_PATH_SOURCE_DIR; }
const char* tests_binary_dir() { return GROVE_PATH_TESTS_BINARY_DIR; }
const char* plugin_dir() { return GROVE_PATH_PLUGIN_DIR; }
const char* grove_executable() { return GROVE_PATH_GROVE_EXECUTABLE; }
const char* python() { return GROVE_PATH_PYTHON; }
const char* test_plugin_dir() { return GROVE_PATH_TEST_PLUGIN_DIR; }
const char* fake_plugin_worker() { return GROVE_PATH_FAKE_PLUGIN_WORKER; }

const char* test_plugin(const char* relative) {
    // one string per name for the process's life: callers keep the pointer
    static std::mutex guard;
    static std::map<std::string, std::string> paths;
    std::lock_guard<std::mutex> lock(guard);
    auto [it, added] = paths.try_emplace(relative, std::string(GROVE_PATH_TEST_PLUGIN_DIR) + "/" + relative);
    return it->second.c_str();
}

}  // namespace grove::test_paths
