#include "grove/hub_cache.hpp"
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <pwd.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace grove {
namespace {

// an environment variable, or none when it is not set (set but empty counts, as in Python)
std::optional<std::string> environment(const char* name) {
    const char* value = std::getenv(name);
    return value ? std::optional<std::string>(value) : std::nullopt;
}

// The home folder as Python's expanduser finds it: $HOME, else the user's entry in the password
// database (a service or container started without HOME); none when neither has one.
std::optional<std::string> home_folder() {
    if (auto home = environment("HOME")) return home;
    const passwd* user = ::getpwuid(::getuid());
    return user && user->pw_dir ? std::optional<std::string>(user->pw_dir) : std::nullopt;
}

// Python's os.path.expandvars(os.path.expanduser(path)), as huggingface_hub applies it: a leading
// "~" becomes the home folder; $NAME and ${NAME} become set variables' values, others stay as written
std::string expanded(const std::string& path) {
    std::string text = path;
    if (!text.empty() && text[0] == '~' && (text.size() == 1 || text[1] == '/'))
        if (auto home = home_folder()) {
            std::string prefix = *home;
            while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
            text = prefix + text.substr(1);
            if (text.empty()) text = "/";
        }
    std::string out;
    for (size_t i = 0; i < text.size();) {
        if (text[i] != '$') {
            out += text[i++];
            continue;
        }
        size_t end = i + 1;
        std::string name;
        if (end < text.size() && text[end] == '{') {
            const size_t close = text.find('}', end);
            if (close == std::string::npos) {
                out += text[i++];
                continue;
            }
            name = text.substr(end + 1, close - end - 1);
            end = close + 1;
        } else {
            while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_')) ++end;
            name = text.substr(i + 1, end - i - 1);
        }
        const auto value = name.empty() ? std::nullopt : environment(name.c_str());
        out += value ? *value : text.substr(i, end - i);
        i = end;
    }
    return out;
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
    // huggingface_hub's constants.py: HF_HUB_CACHE / HUGGINGFACE_HUB_CACHE, else "hub" in HF_HOME
    // (expanded, then expanded again as part of the cache's path, as there)
    if (auto set = environment("HF_HUB_CACHE")) return expanded(*set);
    if (auto set = environment("HUGGINGFACE_HUB_CACHE")) return expanded(*set);
    const auto home = environment("HF_HOME"), cache = environment("XDG_CACHE_HOME");
    const std::string hf_home = home ? *home : (fs::path(cache ? *cache : expanded("~") + "/.cache") / "huggingface").string();
    return expanded((fs::path(expanded(hf_home)) / "hub").string());
}

bool looks_like_hub_model_id(const std::string& text) {
    if (text.find("--") != std::string::npos || text.find("..") != std::string::npos) return false;
    const size_t slash = text.find('/');
    const std::string name = slash == std::string::npos ? text : text.substr(slash + 1);
    return name.size() <= 96 && is_id_part(name) && (slash == std::string::npos || is_id_part(text.substr(0, slash)));
}

std::optional<std::string> cached_hub_snapshot(const std::string& id, const std::string& revision) {
    if (!looks_like_hub_model_id(id)) return std::nullopt;
    std::string folder_name = "models--" + id;  // "models--owner--name"
    if (const size_t slash = folder_name.find('/'); slash != std::string::npos) folder_name.replace(slash, 1, "--");
    const fs::path storage = fs::path(hub_cache_directory()) / folder_name;
    if (revision.empty() || revision.find("..") != std::string::npos || revision.front() == '/') return std::nullopt;
    std::string commit = revision;
    if (!is_commit_hash(revision)) {
        std::ifstream ref(storage / "refs" / revision);
        if (!ref) return std::nullopt;
        commit.assign(std::istreambuf_iterator<char>(ref), std::istreambuf_iterator<char>());
    }
    const fs::path snapshot = storage / "snapshots" / commit;
    std::error_code error;
    if (commit.empty() || !fs::is_directory(snapshot, error)) return std::nullopt;
    return snapshot.string();
}

std::optional<CachedHubModel> hub_model_named_by_path(const std::string& folder) {
    fs::path snapshot = fs::path(folder).lexically_normal();
    if (snapshot.filename().empty()) snapshot = snapshot.parent_path();  // "…/COMMIT/"
    const fs::path snapshots = snapshot.parent_path(), storage = snapshots.parent_path();
    const std::string name = storage.filename().string(), prefix = "models--";
    if (snapshots.filename() != "snapshots" || name.rfind(prefix, 0) != 0) return std::nullopt;
    CachedHubModel model{name.substr(prefix.size()), snapshot.filename().string()};
    if (const size_t separator = model.id.find("--"); separator != std::string::npos) model.id.replace(separator, 2, "/");
    return model;
}

std::optional<CachedHubModel> cached_hub_model_of(const std::string& folder) {
    std::error_code error;
    const fs::path snapshot = fs::weakly_canonical(folder, error);
    if (error) return std::nullopt;
    const auto model = hub_model_named_by_path(snapshot.string());
    if (!model) return std::nullopt;
    const auto cached = cached_hub_snapshot(model->id, model->commit);
    if (!cached || !fs::equivalent(*cached, snapshot, error) || error) return std::nullopt;
    return model;
}

std::string local_or_cached_model_folder(const std::string& given, const std::string& folder, const std::string& revision) {
    std::error_code error;
    if (fs::exists(folder, error)) return folder;
    return cached_hub_snapshot(given, revision).value_or(folder);
}

std::string revision_refusal(const std::string& given, const std::string& folder, const std::string& revision) {
    if (revision == "main" || local_or_cached_model_folder(given, folder, revision) != folder) return "";
    std::error_code error;
    if (fs::exists(folder, error)) return "the model " + folder + " is a folder, not a Hub id; leave the revision out";
    return "the local Hugging Face cache (" + hub_cache_directory() + ") holds no revision " + revision + " of " + given +
           "; `hf download " + given + " --revision " + revision + "` puts it there";
}

}  // namespace grove
