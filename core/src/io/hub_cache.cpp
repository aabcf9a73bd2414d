#include "grove/hub_cache.hpp"
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace fs = std::filesystem;

namespace grove {
namespace {

std::string environment(const char* name) {
    const char* value = std::getenv(name);
    return value ? value : "";
}

bool is_commit_hash(const std::string& revision) {
    return revision.size() == 40 && revision.find_first_not_of("0123456789abcdef") == std::string::npos;
}

bool is_id_part(const std::string& part) {
    if (part.empty() || part.front() == '-' || part.front() == '.') return false;
    for (char c : part)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
    return true;
}

}  // namespace

std::string hub_cache_directory() {
    for (const char* name : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"})
        if (std::string set = environment(name); !set.empty()) return set;
    std::string home = environment("HF_HOME");
    if (home.empty()) {
        std::string cache = environment("XDG_CACHE_HOME");
        if (cache.empty()) cache = (fs::path(environment("HOME")) / ".cache").string();
        home = (fs::path(cache) / "huggingface").string();
    }
    return (fs::path(home) / "hub").string();
}

bool looks_like_hub_model_id(const std::string& text) {
    if (text.size() > 96 || text.find("--") != std::string::npos || text.find("..") != std::string::npos) return false;
    const size_t slash = text.find('/');
    if (slash == std::string::npos) return is_id_part(text);
    return is_id_part(text.substr(0, slash)) && is_id_part(text.substr(slash + 1));
}

std::optional<std::string> cached_hub_snapshot(const std::string& id, const std::string& revision) {
    if (!looks_like_hub_model_id(id)) return std::nullopt;
    std::string folder_name = "models";
    for (size_t start = 0;;) {  // "models--owner--name"
        const size_t slash = id.find('/', start);
        folder_name += "--" + id.substr(start, slash - start);
        if (slash == std::string::npos) break;
        start = slash + 1;
    }
    const fs::path storage = fs::path(hub_cache_directory()) / folder_name;
    if (revision.empty() || revision.find("..") != std::string::npos || revision.front() == '/') return std::nullopt;
    std::string commit = revision;
    if (!is_commit_hash(revision)) {
        std::ifstream ref(storage / "refs" / revision);
        if (!ref) return std::nullopt;
        commit.assign(std::istreambuf_iterator<char>(ref), std::istreambuf_iterator<char>());
        commit.erase(commit.find_last_not_of(" \n\r\t") + 1);
    }
    const fs::path snapshot = storage / "snapshots" / commit;
    std::error_code error;
    if (commit.empty() || !fs::is_directory(snapshot, error)) return std::nullopt;
    return snapshot.string();
}

std::optional<std::string> hub_model_id_of_snapshot(const std::string& folder) {
    std::error_code error;
    fs::path snapshot = fs::weakly_canonical(folder, error);
    if (snapshot.filename().empty()) snapshot = snapshot.parent_path();  // "…/COMMIT/"
    const fs::path snapshots = snapshot.parent_path(), storage = snapshots.parent_path();
    const std::string name = storage.filename().string(), prefix = "models--";
    if (error || snapshots.filename() != "snapshots" || name.rfind(prefix, 0) != 0) return std::nullopt;
    std::string id = name.substr(prefix.size());
    if (const size_t separator = id.find("--"); separator != std::string::npos) id.replace(separator, 2, "/");
    if (!looks_like_hub_model_id(id)) return std::nullopt;
    return id;
}

std::string model_folder(const std::string& given, const std::string& folder, const std::string& revision) {
    std::error_code error;
    if (fs::exists(folder, error)) return folder;
    return cached_hub_snapshot(given, revision).value_or(folder);
}

}  // namespace grove
