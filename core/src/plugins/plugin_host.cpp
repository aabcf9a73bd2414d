#include "grove/plugin_host.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#define BOOST_DLL_USE_STD_FS
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <toml++/toml.h>

#include "config/toml_input.hpp"
#include "grove/error.hpp"
#include "grove/manifest.hpp"
#include "text/text_util.hpp"
#include "grove/version.hpp"

namespace fs = std::filesystem;

namespace grove {

// ---------------------------------------------------------------------------------------------
// The API table every plugin receives.
namespace {
void host_log(int32_t level, const char* plugin_name, const char* message) {
    static const char* const levels[] = {"debug", "info", "warning"};
    if (level < 1) return;  // debug messages are dropped unless a later option asks for them
    std::cerr << "grove: " << levels[std::min(level, 2)] << ": plugin '" << (plugin_name ? plugin_name : "?")
              << "': " << (message ? message : "") << "\n";
}
const grove_host_api kHostApi = {sizeof(grove_host_api), GROVE_ABI_MAJOR, GROVE_ABI_MINOR, kGroveVersion, &host_log};

Error plugin_error(const std::string& message) { return Error(ErrorKind::plugin, message); }

bool looks_like_path(const std::string& reference) {
    return reference.find('/') != std::string::npos ||
           (reference.size() > 3 && reference.compare(reference.size() - 3, 3, ".so") == 0);
}

bool valid_plugin_name(const char* name) {
    if (!name || !*name) return false;
    for (const char* c = name; *c; ++c)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_' || *c == '-')) return false;
    return true;
}
}  // namespace

const char* plugin_kind_name(uint32_t kind) {
    switch (kind) {
        case GROVE_PLUGIN_KIND_REWARD:
            return "reward";
        case GROVE_PLUGIN_KIND_REDUCTION:
            return "reduction";
        case GROVE_PLUGIN_KIND_ADAPTER:
            return "adapter";
        case GROVE_PLUGIN_KIND_ENVIRONMENT:
            return "environment";
        case GROVE_PLUGIN_KIND_OBJECTIVE:
            return "objective";
        default:
            return "unknown";
    }
}

std::string PluginInfo::display() const { return "'" + name + "' (" + file + ")"; }

// ---------------------------------------------------------------------------------------------
class PluginLibrary {
public:
    PluginLibrary(boost::dll::shared_library library, std::string path, const grove_plugin_list* list)
            : library_(std::move(library)), path_(std::move(path)), list_(list) {}
    const std::string& path() const { return path_; }
    const grove_plugin_list* list() const { return list_; }

private:
    boost::dll::shared_library library_;
    std::string path_;
    const grove_plugin_list* list_;
};

namespace {
// One PluginLibrary per file while anything uses it, so a library is loaded (and its entry called) once.
std::shared_ptr<PluginLibrary> open_library(const std::string& path) {
    static std::mutex mutex;
    static std::map<std::string, std::weak_ptr<PluginLibrary>> open;
    std::error_code ec;
    fs::path canonical = fs::canonical(path, ec);
    if (ec) throw plugin_error("plugin library " + path + " does not exist (" + ec.message() + ")");
    std::lock_guard<std::mutex> lock(mutex);
    if (auto existing = open[canonical.string()].lock()) return existing;

    boost::dll::shared_library library;
    try {
        library.load(canonical, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
    } catch (const std::exception& e) {
        throw plugin_error(canonical.string() + " is not a loadable shared library: " + e.what());
    }
    if (!library.has(GROVE_PLUGIN_ENTRY_SYMBOL))
        throw plugin_error(canonical.string() + " is not a Grove plugin: it does not export '" + GROVE_PLUGIN_ENTRY_SYMBOL +
                           "' (declare it with GROVE_EXPORT, or GROVE_PLUGIN_LIBRARY in C++, and build with "
                           "-fvisibility=hidden)");
    auto entry = library.get<const grove_plugin_list*(const grove_host_api*)>(GROVE_PLUGIN_ENTRY_SYMBOL);
    const grove_plugin_list* list = entry(&kHostApi);
    if (!list) throw plugin_error(canonical.string() + ": " + GROVE_PLUGIN_ENTRY_SYMBOL + " returned no plugin list");
    if (list->struct_size < 3 * sizeof(uint32_t))
        throw plugin_error(canonical.string() + ": the plugin list is malformed (struct_size " +
                           std::to_string(list->struct_size) + ")");
    if (list->abi_major != GROVE_ABI_MAJOR)
        throw plugin_error(canonical.string() + " was built for Grove plugin ABI " + std::to_string(list->abi_major) + "." +
                           std::to_string(list->abi_minor) + ", but this grove speaks ABI " + std::to_string(GROVE_ABI_MAJOR) +
                           "." + std::to_string(GROVE_ABI_MINOR) + ": rebuild the plugin against the Grove SDK " +
                           std::to_string(GROVE_ABI_MAJOR) + ".x");
    auto result = std::make_shared<PluginLibrary>(std::move(library), canonical.string(), list);
    open[canonical.string()] = result;
    return result;
}

PluginInfo describe(const std::shared_ptr<PluginLibrary>& library, const grove_plugin_descriptor* d, uint32_t index) {
    const std::string& file = library->path();
    std::string where = file + ": plugin #" + std::to_string(index);
    if (!d || d->struct_size < offsetof(grove_plugin_descriptor, adapter) + sizeof(void*))
        throw plugin_error(where + " has a malformed descriptor (missing or too small)");
    if (!valid_plugin_name(d->name))
        throw plugin_error(where + " has an invalid name '" + std::string(d->name ? d->name : "") +
                           "' (use lower-case letters, digits, '_' and '-')");
    PluginInfo info;
    info.name = d->name;
    info.kind = d->kind;
    info.version = d->version ? d->version : "";
    info.description = d->description ? d->description : "";
    info.file = file;
    info.abi_major = library->list()->abi_major;
    info.abi_minor = library->list()->abi_minor;
    info.flags = d->flags;
    info.descriptor = d;
    info.library = library;
    for (uint32_t i = 0; i < d->config_key_count; ++i) info.keys.push_back(d->config_keys[i]);
    for (uint32_t i = 0; i < d->metric_count; ++i) info.metric_names.push_back(d->metric_names[i] ? d->metric_names[i] : "");
    // a function table must reach its required entries; entries past its struct_size read as absent
    auto too_small = [&](const char* table, uint32_t size, size_t needed, const char* entry) {
        if (size >= needed) return;
        throw plugin_error("plugin " + info.display() + ": its " + table + " function table has struct_size " +
                           std::to_string(size) + ", which stops before " + entry + "() (" + std::to_string(needed) +
                           " bytes needed); rebuild it against the Grove SDK header");
    };
    if (d->kind == GROVE_PLUGIN_KIND_REWARD && d->reward)
        too_small("reward", d->reward->struct_size, offsetof(grove_reward_api, score) + sizeof(void*), "score");
    if (d->kind == GROVE_PLUGIN_KIND_REDUCTION && d->reduction)
        too_small("reduction", d->reduction->struct_size, offsetof(grove_reduction_api, weights) + sizeof(void*), "weights");
    if (d->kind == GROVE_PLUGIN_KIND_ADAPTER && d->adapter)
        too_small("adapter", d->adapter->struct_size, offsetof(grove_adapter_api, forward) + sizeof(void*), "forward");
    // ABI 1.2 appended the environment table: a shorter descriptor has none
    const grove_environment_api* environment =
        GROVE_HAS_FIELD(d, grove_plugin_descriptor, environment) ? d->environment : nullptr;
    if (d->kind == GROVE_PLUGIN_KIND_ENVIRONMENT && environment)
        too_small("environment", environment->struct_size, offsetof(grove_environment_api, step) + sizeof(void*), "step");
    // ABI 1.5 appended the objective table
    const grove_objective_api* objective = GROVE_HAS_FIELD(d, grove_plugin_descriptor, objective) ? d->objective : nullptr;
    if (d->kind == GROVE_PLUGIN_KIND_OBJECTIVE && objective)
        too_small("objective", objective->struct_size, offsetof(grove_objective_api, loss) + sizeof(void*), "loss");
    bool table_ok = (d->kind == GROVE_PLUGIN_KIND_REWARD && d->reward && d->reward->score) ||
                    (d->kind == GROVE_PLUGIN_KIND_OBJECTIVE && objective && objective->loss) ||
                    (d->kind == GROVE_PLUGIN_KIND_REDUCTION && d->reduction && d->reduction->weights) ||
                    (d->kind == GROVE_PLUGIN_KIND_ADAPTER && d->adapter && d->adapter->attach && d->adapter->forward) ||
                    (d->kind == GROVE_PLUGIN_KIND_ENVIRONMENT && environment && environment->step);
    if (!table_ok || !d->create)
        throw plugin_error("plugin " + info.display() + " declares kind '" + plugin_kind_name(d->kind) +
                           "' but does not provide create() and that kind's function table");
    return info;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
std::vector<std::string> plugin_search_path(const std::vector<std::string>& explicit_dirs) {
    std::vector<std::string> dirs = explicit_dirs;
    if (const char* env = std::getenv("GROVE_PLUGIN_PATH")) {
        std::stringstream stream(env);
        std::string dir;
        while (std::getline(stream, dir, ':'))
            if (!dir.empty()) dirs.push_back(dir);
    }
    std::error_code ec;
    fs::path exe = boost::dll::program_location(ec);
    if (!ec) dirs.push_back((exe.parent_path().parent_path() / "lib" / "grove" / "plugins").string());
    return dirs;
}

PluginHost::PluginHost(std::vector<std::string> search_dirs) {
    std::set<std::string> seen;
    for (auto& dir : search_dirs) {
        std::error_code ec;
        fs::path canonical = fs::weakly_canonical(dir, ec);
        std::string key = ec ? dir : canonical.string();
        if (seen.insert(key).second) search_dirs_.push_back(key);
    }
}

std::vector<PluginInfo> PluginHost::load_file(const std::string& path) {
    auto library = open_library(path);
    std::vector<PluginInfo> plugins;
    const grove_plugin_list* list = library->list();
    for (uint32_t i = 0; i < list->count; ++i) {
        PluginInfo info = describe(library, list->plugins ? list->plugins[i] : nullptr, i);
        for (const auto& other : plugins)
            if (other.name == info.name)
                throw plugin_error(library->path() + " provides two plugins named '" + info.name + "'");
        plugins.push_back(std::move(info));
    }
    return plugins;
}

std::vector<PluginInfo> PluginHost::list(std::vector<std::string>* skipped) {
    std::vector<PluginInfo> all;
    for (const auto& dir : search_dirs_) {
        std::error_code ec;
        if (!fs::is_directory(dir, ec)) continue;
        std::vector<fs::path> files;
        for (const auto& entry : fs::directory_iterator(dir, ec))
            if (entry.path().extension() == ".so") files.push_back(entry.path());
        std::sort(files.begin(), files.end());
        for (const auto& file : files) {
            std::vector<PluginInfo> found;
            try {  // a library that cannot be used is skipped and described
                found = load_file(file.string());
            } catch (const Error& e) {
                if (skipped) skipped->push_back(e.what());
                continue;
            }
            for (auto& info : found) {  // a name two files provide is ambiguous: an error, never skipped
                for (const auto& other : all)
                    if (other.name == info.name && other.file != info.file)
                        throw plugin_error("two libraries provide a plugin named '" + info.name + "': " + other.file + " and " +
                                           info.file +
                                           "; remove one from the plugin search path, or name the plugin by "
                                           "its path in the manifest");
                if (std::none_of(all.begin(), all.end(),
                                 [&](const PluginInfo& p) { return p.file == info.file && p.name == info.name; }))
                    all.push_back(std::move(info));
            }
        }
    }
    return all;
}

PluginInfo PluginHost::find_anywhere(const std::string& reference, uint32_t expected_kind) {
    auto check_kind = [&](const PluginInfo& info) {
        if (expected_kind && info.kind != expected_kind)
            throw plugin_error(
                "plugin " + info.display() + " is of kind '" + plugin_kind_name(info.kind) + "', but " +
                (expected_kind == GROVE_PLUGIN_KIND_ADAPTER || expected_kind == GROVE_PLUGIN_KIND_ENVIRONMENT ? "an " : "a ") +
                plugin_kind_name(expected_kind) + " plugin is needed here");
        return info;
    };
    if (looks_like_path(reference)) {
        std::string path = reference, name;
        if (auto hash = reference.rfind('#'); hash != std::string::npos) {
            path = reference.substr(0, hash);
            name = reference.substr(hash + 1);
        }
        auto plugins = load_file(path);
        std::vector<PluginInfo> candidates;
        for (auto& p : plugins)
            if ((name.empty() || p.name == name) && (!expected_kind || p.kind == expected_kind)) candidates.push_back(p);
        if (candidates.size() == 1) return candidates.front();
        std::vector<std::string> names;
        for (auto& p : plugins) names.push_back(p.name + " (" + plugin_kind_name(p.kind) + ")");
        if (candidates.empty() && !name.empty())
            throw plugin_error(path + " has no plugin named '" + name + "'; it provides: " + join(names, ", "));
        if (candidates.empty()) return check_kind(plugins.at(0));
        throw plugin_error(path + " provides several plugins (" + join(names, ", ") + "); choose one with '" + path + "#NAME'");
    }
    std::vector<std::string> skipped;
    auto all = list(&skipped);
    std::vector<std::string> names;
    for (auto& info : all) {
        if (info.name == reference) return check_kind(info);
        if (!expected_kind || info.kind == expected_kind) names.push_back(info.name);
    }
    std::string message = "no plugin named '" + reference + "'" + did_you_mean(reference, names) +
                          "\n  searched: " + (search_dirs_.empty() ? "(nothing)" : join(search_dirs_, ", ")) +
                          "\n  available: " + (names.empty() ? "(none)" : join(names, ", "));
    for (const auto& s : skipped) message += "\n  skipped: " + s;
    message += "\n  fix: correct the name, add its folder to plugin_dirs or GROVE_PLUGIN_PATH, or give its path";
    throw plugin_error(message);
}

// ---------------------------------------------------------------------------------------------
// Configuration: TOML table -> checked grove_config.
namespace {
const char* value_type_name(uint32_t type) {
    switch (type) {
        case GROVE_VALUE_STRING:
            return "a string";
        case GROVE_VALUE_INT:
            return "an integer";
        case GROVE_VALUE_FLOAT:
            return "a number";
        case GROVE_VALUE_BOOL:
            return "a boolean (true or false)";
        case GROVE_VALUE_STRING_ARRAY:
            return "an array of strings";
        case GROVE_VALUE_INT_ARRAY:
            return "an array of integers";
        case GROVE_VALUE_TABLE:
            return "a table, e.g. { key = 1 }";
        case GROVE_VALUE_FLOAT_ARRAY:
            return "an array of numbers";
        default:
            return "an unknown type";
    }
}

std::string node_location(const toml::node& node, const std::string& fallback) {
    const auto& source = node.source();
    if (!source.path || source.begin.line == 0) return fallback;
    return *source.path + ":" + std::to_string(source.begin.line) + ":" + std::to_string(source.begin.column);
}
}  // namespace

struct PluginConfig::Storage {
    std::deque<std::string> strings;
    std::deque<std::vector<const char*>> string_arrays;
    std::deque<std::vector<int64_t>> int_arrays;
    std::deque<std::vector<double>> float_arrays;
    std::vector<grove_config_value> values;
    std::map<std::string, std::string> locations;
    std::string raw_toml;
    std::string source_name;
    std::string base_dir;
    std::shared_ptr<toml::table> owned_table;  // for from_toml_text
};

PluginConfig::PluginConfig(const PluginInfo& plugin, const toml::table* table, const std::string& origin,
                           const std::string& base_dir)
        : storage_(std::make_unique<Storage>()), origin_(origin) {
    Storage& s = *storage_;
    std::vector<std::string> accepted;
    for (const auto& key : plugin.keys) accepted.push_back(key.name);
    auto fail = [&](const std::string& where, const std::string& what) -> Error {
        return Error(ErrorKind::manifest, where + ": error: " + what + " (plugin " + plugin.display() + ")");
    };
    if (table) {
        for (const auto& [key_node, node] : *table) {
            std::string key(key_node.str());
            std::string where = node_location(node, origin + "." + key);
            s.locations[key] = where;
            auto declared =
                std::find_if(plugin.keys.begin(), plugin.keys.end(), [&](const grove_config_key& k) { return key == k.name; });
            if (declared == plugin.keys.end())
                throw fail(where, "unknown key '" + key + "' for plugin '" + plugin.name + "'" + did_you_mean(key, accepted) +
                                      "; accepted keys: " + (accepted.empty() ? "(none)" : join(accepted, ", ")));
            grove_config_value v{};
            v.struct_size = sizeof(grove_config_value);
            s.strings.push_back(key);
            v.key = s.strings.back().c_str();
            v.type = declared->type;
            auto wrong = [&]() {
                return fail(where, "'" + key + "' must be " + value_type_name(declared->type) + " (" +
                                       (declared->help ? declared->help : "") + ")");
            };
            switch (declared->type) {
                case GROVE_VALUE_STRING:
                    if (!node.is_string()) throw wrong();
                    s.strings.push_back(*node.value<std::string>());
                    v.string_value = s.strings.back().c_str();
                    break;
                case GROVE_VALUE_INT:
                    if (!node.is_integer()) throw wrong();
                    v.int_value = *node.value<int64_t>();
                    break;
                case GROVE_VALUE_FLOAT:
                    if (!node.is_number()) throw wrong();
                    v.float_value = *node.value<double>();
                    break;
                case GROVE_VALUE_BOOL:
                    if (!node.is_boolean()) throw wrong();
                    v.bool_value = *node.value<bool>() ? 1 : 0;
                    break;
                case GROVE_VALUE_TABLE: {
                    if (!node.is_table()) throw wrong();
                    std::ostringstream json;
                    json << toml::json_formatter(*node.as_table());
                    s.strings.push_back(json.str());
                    v.string_value = s.strings.back().c_str();
                    break;
                }
                case GROVE_VALUE_STRING_ARRAY:
                case GROVE_VALUE_INT_ARRAY:
                case GROVE_VALUE_FLOAT_ARRAY: {
                    const toml::array* array = node.as_array();
                    if (!array) throw wrong();
                    if (declared->type == GROVE_VALUE_STRING_ARRAY) {
                        std::vector<const char*> items;
                        for (const auto& element : *array) {
                            if (!element.is_string()) throw wrong();
                            s.strings.push_back(*element.value<std::string>());
                            items.push_back(s.strings.back().c_str());
                        }
                        s.string_arrays.push_back(std::move(items));
                        v.string_array = s.string_arrays.back().data();
                    } else if (declared->type == GROVE_VALUE_INT_ARRAY) {
                        std::vector<int64_t> items;
                        for (const auto& element : *array) {
                            if (!element.is_integer()) throw wrong();
                            items.push_back(*element.value<int64_t>());
                        }
                        s.int_arrays.push_back(std::move(items));
                        v.int_array = s.int_arrays.back().data();
                    } else {
                        std::vector<double> items;
                        for (const auto& element : *array) {
                            if (!element.is_number()) throw wrong();
                            items.push_back(*element.value<double>());
                        }
                        s.float_arrays.push_back(std::move(items));
                        v.float_array = s.float_arrays.back().data();
                    }
                    v.array_length = static_cast<uint32_t>(array->size());
                    break;
                }
                default:
                    throw fail(where, "plugin declares key '" + key + "' with an unknown type");
            }
            s.values.push_back(v);
        }
    }
    for (const auto& key : plugin.keys)
        if (key.required && !s.locations.count(key.name))
            throw fail(origin, "missing required key '" + std::string(key.name) + "' for plugin '" + plugin.name + "' (" +
                                   (key.help ? key.help : "") + ")");
    if (table) {
        std::ostringstream raw;
        raw << toml::toml_formatter(*table);
        s.raw_toml = raw.str();
    }
    s.source_name = origin;
    s.base_dir = fs::absolute(base_dir.empty() ? fs::path(".") : fs::path(base_dir)).lexically_normal().string();
    config_.struct_size = sizeof(grove_config);
    config_.count = static_cast<uint32_t>(s.values.size());
    config_.values = s.values.data();
    config_.raw_toml = s.raw_toml.c_str();
    config_.source_name = s.source_name.c_str();
    config_.base_dir = s.base_dir.c_str();
}

PluginConfig PluginConfig::from_toml_text(const PluginInfo& plugin, const std::string& toml_text, const std::string& origin,
                                          const std::string& base_dir) {
    auto table = std::make_shared<toml::table>();
    try {
        *table = parse_toml(std::string_view(toml_text), std::string_view(origin));
    } catch (const toml::parse_error& e) {
        throw Error(ErrorKind::manifest, origin + ": error: " + std::string(e.description()));
    }
    PluginConfig config(plugin, table.get(), origin, base_dir);
    config.storage_->owned_table = table;
    return config;
}

PluginConfig::PluginConfig(PluginConfig&& other) noexcept
        : storage_(std::move(other.storage_)), config_(other.config_), origin_(std::move(other.origin_)) {}
PluginConfig::~PluginConfig() = default;

std::string PluginConfig::location_of(const std::string& key) const {
    auto it = storage_->locations.find(key);
    return it == storage_->locations.end() ? origin_ : it->second;
}

// ---------------------------------------------------------------------------------------------
ErrorCapture::ErrorCapture() {
    sink.struct_size = sizeof(grove_error_sink);
    sink.host_data = this;
    sink.report = [](grove_error_sink* s, const char* key, const char* message) {
        auto* self = static_cast<ErrorCapture*>(s->host_data);
        if (self->reported) return;  // keep the first report: it is the cause
        self->reported = true;
        self->key = key ? key : "";
        self->message = message ? message : "";
    };
}

PluginInstance::PluginInstance(PluginInfo plugin, PluginConfig config)
        : plugin_(std::move(plugin)), config_(std::move(config)) {
    ErrorCapture capture;
    grove_status status = plugin_.descriptor->create(config_.get(), &instance_, &capture.sink);
    if (status != GROVE_OK) {
        std::string where = capture.key.empty() ? config_.origin() : config_.location_of(capture.key);
        std::string key = capture.key.empty() ? "" : "'" + capture.key + "': ";
        throw Error(status == GROVE_ERROR_CONFIG ? ErrorKind::manifest : ErrorKind::plugin,
                    where + ": error: plugin " + plugin_.display() + " refused its configuration: " + key +
                        (capture.message.empty() ? "create() failed without a message" : capture.message));
    }
}

PluginInstance::PluginInstance(PluginInstance&& other) noexcept
        : plugin_(std::move(other.plugin_)), config_(std::move(other.config_)), instance_(other.instance_) {
    other.instance_ = nullptr;
    other.plugin_.descriptor = nullptr;
}

PluginInstance::~PluginInstance() {
    if (plugin_.descriptor && plugin_.descriptor->destroy && instance_) plugin_.descriptor->destroy(instance_);
}

void PluginInstance::check(grove_status status, const char* call, const ErrorCapture& capture) const {
    if (status == GROVE_OK) return;
    throw plugin_error(
        "plugin " + plugin_.display() + " failed in " + call +
        "(): " + (capture.message.empty() ? "no message given (status " + std::to_string(status) + ")" : capture.message));
}

std::vector<grove_text> text_views(const std::vector<std::string>& strings) {
    std::vector<grove_text> views;
    views.reserve(strings.size());
    for (const auto& s : strings) views.push_back({s.data(), s.size()});
    return views;
}

void RewardRows::add(std::string prompt, std::string completion, const std::vector<int32_t>& completion_tokens,
                     bool is_truncated, std::string columns_json, const std::vector<uint8_t>& model_tokens) {
    if (!model_tokens.empty() && model_tokens.size() != completion_tokens.size())
        throw Error(ErrorKind::input, "a completion's model-token mask has " + std::to_string(model_tokens.size()) +
                                          " entries for " + std::to_string(completion_tokens.size()) + " tokens");
    if (model_tokens.empty())
        model_token_mask.insert(model_token_mask.end(), completion_tokens.size(), uint8_t(1));
    else
        model_token_mask.insert(model_token_mask.end(), model_tokens.begin(), model_tokens.end());
    prompts.push_back(std::move(prompt));
    completions.push_back(std::move(completion));
    episode_turn_offsets.push_back(episode_turn_offsets.back());
    row_json.push_back(std::move(columns_json));
    tokens.insert(tokens.end(), completion_tokens.begin(), completion_tokens.end());
    token_offsets.push_back(int64_t(tokens.size()));
    truncated.push_back(is_truncated ? 1 : 0);
}

void RewardRows::add_episode_turns(std::vector<std::string> turns) {
    if (prompts.empty() || episode_turn_offsets.size() != prompts.size() + 1)
        throw Error(ErrorKind::input, "an episode's turns were added before its row");
    episode_turn_offsets.back() += turns.size();
    for (std::string& turn : turns) episode_turns.push_back(std::move(turn));
}

const grove_reward_batch& RewardRows::view() {
    prompt_views_ = text_views(prompts);
    completion_views_ = text_views(completions);
    json_views_ = text_views(row_json);
    prompt_json_views_ = text_views(prompt_json);
    batch_ = grove_reward_batch{};
    batch_.struct_size = sizeof(grove_reward_batch);
    batch_.count = uint32_t(prompts.size());
    batch_.num_generations = num_generations;
    batch_.prompts = prompt_views_.data();
    batch_.completions = completion_views_.data();
    batch_.completion_token_offsets = token_offsets.data();
    batch_.completion_tokens = tokens.data();
    batch_.model_token_mask = model_token_mask.data();
    batch_.truncated = truncated.data();
    batch_.row_json = json_views_.data();
    batch_.global_row_offset = global_row_offset;
    batch_.step = step;
    batch_.seed = seed;
    batch_.rank = rank;
    batch_.world_size = world_size;
    batch_.prompt_json = prompt_json.size() == prompts.size() && !prompts.empty() ? prompt_json_views_.data() : nullptr;
    batch_.max_steps = max_steps;
    turn_views_ = text_views(episode_turns);
    const bool has_turns = !episode_turns.empty() && episode_turn_offsets.size() == prompts.size() + 1;
    batch_.episode_turn_offsets = has_turns ? episode_turn_offsets.data() : nullptr;
    batch_.episode_turns = has_turns ? turn_views_.data() : nullptr;
    return batch_;
}

namespace {
// grove_reward_output.log_metric and log_extra: called by plugins, so nothing may escape them
void log_reward_metric(grove_reward_output* out, const char* name, double value) noexcept {
    if (!out || !name) return;
    try {
        static_cast<RewardLogs*>(out->host_data)->metrics.emplace_back(name, value);
    } catch (...) {  // out of memory: the value is lost, the run goes on
    }
}
void log_reward_extra(grove_reward_output* out, const char* column, const grove_text* values, uint32_t count) noexcept {
    if (!out || !column || (!values && count > 0)) return;
    try {
        std::vector<std::string> texts;
        for (uint32_t i = 0; i < count; ++i)
            texts.push_back(values[i].data ? std::string(values[i].data, values[i].size) : std::string());
        static_cast<RewardLogs*>(out->host_data)->extras.emplace_back(column, std::move(texts));
    } catch (...) {  // out of memory: the values are lost, the run goes on
    }
}
}  // namespace

void PluginInstance::score(const grove_reward_batch& batch, std::vector<float>& scores, std::vector<float>& metrics,
                           RewardLogs* logs) const {
    if (plugin_.kind != GROVE_PLUGIN_KIND_REWARD) throw plugin_error("plugin " + plugin_.display() + " is not a reward");
    const float nan = std::nanf("");
    scores.assign(batch.count, nan);
    metrics.assign(size_t(batch.count) * plugin_.metric_names.size(), nan);
    RewardLogs ignored;
    grove_reward_output out{sizeof(grove_reward_output),
                            scores.data(),
                            static_cast<uint32_t>(plugin_.metric_names.size()),
                            metrics.data(),
                            logs ? logs : &ignored,
                            &log_reward_metric,
                            &log_reward_extra};
    ErrorCapture capture;
    check(plugin_.descriptor->reward->score(instance_, &batch, &out, &capture.sink), "score", capture);
    for (uint32_t i = 0; i < batch.count; ++i)
        if (std::isinf(scores[i]))
            throw plugin_error("plugin " + plugin_.display() + " returned an infinite score for row " + std::to_string(i) +
                               "; rewards must be finite, or NaN for 'not applicable'");
}

void PluginInstance::weights(const grove_reduction_context& context, std::vector<float>& weight) const {
    if (plugin_.kind != GROVE_PLUGIN_KIND_REDUCTION) throw plugin_error("plugin " + plugin_.display() + " is not a reduction");
    size_t n = size_t(context.rows) * context.columns;
    weight.assign(n, 0.0f);
    ErrorCapture capture;
    check(plugin_.descriptor->reduction->weights(instance_, &context, weight.data(), &capture.sink), "weights", capture);
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(weight[i]))
            throw plugin_error("plugin " + plugin_.display() + " returned a non-finite weight at row " +
                               std::to_string(i / context.columns) + ", column " + std::to_string(i % context.columns));
        if (context.mask[i] == 0.0f && weight[i] != 0.0f)
            throw plugin_error("plugin " + plugin_.display() + " gave weight " + std::to_string(weight[i]) +
                               " to a masked position (row " + std::to_string(i / context.columns) + ", column " +
                               std::to_string(i % context.columns) + "); masked positions must weigh 0");
    }
}

ObjectiveResult PluginInstance::objective_loss(const grove_objective_batch& batch) const {
    if (plugin_.kind != GROVE_PLUGIN_KIND_OBJECTIVE) throw plugin_error("plugin " + plugin_.display() + " is not an objective");
    if ((batch.policy_mask || batch.sampling_ratio) && plugin_.abi_minor < 6)  // it would ignore them silently
        throw plugin_error("objective " + plugin_.display() + " was built against SDK ABI 1." +
                           std::to_string(plugin_.abi_minor) +
                           ", which predates the policy masks and sampling ratio (ABI 1.6) that loss.top_entropy_quantile, "
                           "loss.off_policy_mask_threshold and loss.importance_sampling_correction need: rebuild it "
                           "against this SDK, or unset those options");
    const size_t n = size_t(batch.rows) * batch.columns, metrics = plugin_.metric_names.size();
    const double nan = std::nan("");
    ObjectiveResult r;
    r.grad.assign(n, 0.0f);
    r.metric_sums.assign(metrics, nan);
    r.metric_counts.assign(metrics, nan);
    grove_objective_output out{sizeof(grove_objective_output), nan, r.grad.data(), uint32_t(metrics), r.metric_sums.data(),
                               r.metric_counts.data()};
    ErrorCapture capture;
    check(plugin_.descriptor->objective->loss(instance_, &batch, &out, &capture.sink), "loss", capture);
    r.loss = out.loss;
    for (size_t i = 0; i < n; ++i)
        if (!std::isfinite(r.grad[i]))
            throw plugin_error("plugin " + plugin_.display() + " returned a non-finite gradient at row " +
                               std::to_string(i / batch.columns) + ", column " + std::to_string(i % batch.columns));
    const uint8_t* aggregation = plugin_.descriptor->objective->metric_aggregation;
    for (size_t m = 0; m < metrics; ++m)
        r.metric_aggregation.push_back(aggregation ? aggregation[m] : uint8_t(GROVE_METRIC_MEAN));
    return r;
}

}  // namespace grove

namespace grove {

PluginInfo PluginHost::find(const std::string& reference, uint32_t expected_kind, const std::string& origin) {
    if (origin.empty()) return find_anywhere(reference, expected_kind);
    try {
        return find_anywhere(reference, expected_kind);
    } catch (const Error& e) {  // the manifest's line that names the plugin, then why it is unusable
        throw Error(e.kind(), origin + ": " + e.what());
    }
}

grove_reduction_context reduction_context(const float* mask, uint32_t rows, uint32_t columns, const ReductionCounts& counts) {
    grove_reduction_context ctx{};
    ctx.struct_size = sizeof(ctx);
    ctx.rows = rows;
    ctx.columns = columns;
    ctx.mask = mask;
    ctx.gradient_accumulation_steps = counts.gradient_accumulation_steps;
    ctx.steps_per_generation = counts.steps_per_generation;
    ctx.world_size = counts.world_size;
    ctx.max_completion_length = counts.max_completion_length;
    ctx.generation_batch_tokens = counts.generation_batch_tokens;
    ctx.generation_batch_sequences = counts.generation_batch_sequences;
    ctx.optimizer_window_tokens = counts.optimizer_window_tokens;
    return ctx;
}

PluginInstance create_plugin(PluginHost& host, const PluginUse& use, uint32_t kind) {
    PluginInfo info = host.find(use.plugin, kind, use.origin);
    PluginConfig config(info, use.config.get(), use.origin + " config", use.base_dir);
    return PluginInstance(std::move(info), std::move(config));
}

}  // namespace grove
