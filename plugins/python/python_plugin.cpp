// The python plugins as Grove lists them: `python` (reward functions written for TRL) and
// `python_environment` (environments in Python). Grove reads every library in its plugin folders to
// find a plugin by name, so this one links no Python: its descriptors are plain data, and the first
// instance loads libgrove_python_embed.so (../python/ from this file, in the build tree and when
// installed), which embeds the interpreter (python_embed.cpp). Every call is forwarded there, so a
// run that uses no Python plugin never loads libpython.
#include <dlfcn.h>

#include <filesystem>
#include <grove/plugin.hpp>
#include <mutex>
#include <string>

#include "python_plugins.hpp"

namespace {

using namespace grove::python;

const grove_host_api* g_host = nullptr;  // given to the embedded library's entry point

// The embedded library's plugin list, loaded once; null with the reason in `failure`.
const grove_plugin_list* embedded_plugins(std::string& failure) {
    static std::once_flag once;
    static const grove_plugin_list* plugins = nullptr;
    static std::string why;
    std::call_once(once, [] {
        Dl_info self{};
        dladdr(reinterpret_cast<void*>(&embedded_plugins), &self);
        const std::filesystem::path path = std::filesystem::path(self.dli_fname ? self.dli_fname : ".").parent_path() / ".." /
                                           "python" / "libgrove_python_embed.so";
        void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!library) {
            const char* error = dlerror();
            why = "the python plugins' interpreter library did not load (" + std::string(error ? error : path.string()) +
                  "); it links the libpython of the Python Grove was built with: rebuild Grove, or install that Python";
            return;
        }
        auto entry = reinterpret_cast<grove_plugin_entry_fn>(dlsym(library, GROVE_PLUGIN_ENTRY_SYMBOL));
        plugins = entry ? entry(g_host) : nullptr;
        if (!plugins) why = path.string() + " is not the python plugins' interpreter library";
    });
    failure = why;
    return plugins;
}

// An instance: the embedded plugin's descriptor and its own instance.
struct Forwarded {
    const grove_plugin_descriptor* plugin;
    void* instance;
};

template <const char* const& Name>
grove_status create(const grove_config* config, void** instance, grove_error_sink* err) {
    grove_status status = GROVE_OK;
    const grove_status guarded = grove::sdk::guard(err, [&] {
        std::string failure;
        const grove_plugin_list* plugins = embedded_plugins(failure);
        if (!plugins) throw grove::sdk::Error(GROVE_ERROR_CONFIG, failure);
        for (uint32_t i = 0; i < plugins->count; ++i) {
            const grove_plugin_descriptor* plugin = plugins->plugins[i];
            if (std::string(plugin->name) != Name) continue;
            void* inner = nullptr;
            status = plugin->create(config, &inner, err);  // on failure it has reported why
            if (status == GROVE_OK) *instance = new Forwarded{plugin, inner};
            return;
        }
        throw grove::sdk::Error(GROVE_ERROR_INTERNAL, "the interpreter library has no plugin '" + std::string(Name) + "'");
    });
    return guarded != GROVE_OK ? guarded : status;
}

void destroy(void* instance) {
    auto* f = static_cast<Forwarded*>(instance);
    if (!f) return;
    if (f->plugin->destroy) f->plugin->destroy(f->instance);
    delete f;
}

Forwarded& forwarded(void* instance) { return *static_cast<Forwarded*>(instance); }

grove_status score(void* instance, const grove_reward_batch* batch, grove_reward_output* out, grove_error_sink* err) {
    Forwarded& f = forwarded(instance);
    return f.plugin->reward->score(f.instance, batch, out, err);
}

grove_status stop_strings(void* instance, const char* const** strings, grove_error_sink* err) {
    Forwarded& f = forwarded(instance);
    return f.plugin->environment->stop_strings(f.instance, strings, err);
}
grove_status step(void* instance, const grove_environment_batch* batch, grove_environment_output* out, grove_error_sink* err) {
    Forwarded& f = forwarded(instance);
    return f.plugin->environment->step(f.instance, batch, out, err);
}
grove_status score_episodes(void* instance, const grove_environment_batch* episodes, float* rewards, grove_error_sink* err) {
    Forwarded& f = forwarded(instance);
    return f.plugin->environment->score_episodes(f.instance, episodes, rewards, err);
}
grove_status begin_episodes(void* instance, const grove_environment_batch* episodes, grove_environment_output* out,
                            grove_error_sink* err) {
    Forwarded& f = forwarded(instance);
    return f.plugin->environment->begin_episodes(f.instance, episodes, out, err);
}
grove_status tools_json(void* instance, grove_text_sink* out, grove_error_sink* err) {
    Forwarded& f = forwarded(instance);
    return f.plugin->environment->tools_json(f.instance, out, err);
}
grove_status episode_reward(void* instance, uint32_t* judgement, grove_text_sink* name, grove_error_sink* err) {
    Forwarded& f = forwarded(instance);
    return f.plugin->environment->episode_reward(f.instance, judgement, name, err);
}

constexpr grove_reward_api kRewardApi{sizeof(grove_reward_api), &score};
constexpr grove_environment_api kEnvironmentApi{
    sizeof(grove_environment_api), &stop_strings, &step, &score_episodes, &begin_episodes, &tools_json, &episode_reward};

template <std::size_t N>
constexpr grove_plugin_descriptor descriptor(uint32_t kind, const char* name, const char* description,
                                             const grove_config_key (&keys)[N],
                                             grove_status (*make)(const grove_config*, void**, grove_error_sink*)) {
    return grove_plugin_descriptor{sizeof(grove_plugin_descriptor),
                                   kind,
                                   name,
                                   kVersion,
                                   description,
                                   0,
                                   keys,
                                   uint32_t(N),
                                   nullptr,
                                   0,
                                   make,
                                   &destroy,
                                   kind == GROVE_PLUGIN_KIND_REWARD ? &kRewardApi : nullptr,
                                   nullptr,
                                   nullptr,
                                   kind == GROVE_PLUGIN_KIND_ENVIRONMENT ? &kEnvironmentApi : nullptr,
                                   nullptr};
}

constexpr grove_plugin_descriptor kReward =
    descriptor(GROVE_PLUGIN_KIND_REWARD, kRewardName, kRewardDescription, kRewardKeys, &create<kRewardName>);
constexpr grove_plugin_descriptor kEnvironment = descriptor(
    GROVE_PLUGIN_KIND_ENVIRONMENT, kEnvironmentName, kEnvironmentDescription, kEnvironmentKeys, &create<kEnvironmentName>);
const grove_plugin_descriptor* const kAll[] = {&kReward, &kEnvironment};
const grove_plugin_list kList{sizeof(grove_plugin_list), GROVE_ABI_MAJOR, GROVE_ABI_MINOR, 2, kAll};

}  // namespace

extern "C" GROVE_EXPORT const grove_plugin_list* grove_plugin_entry(const grove_host_api* host) {
    g_host = host;
    return &kList;
}
