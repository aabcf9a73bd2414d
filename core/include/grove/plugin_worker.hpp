// A plugin in a worker process of its own (isolation = "process"; docs/reliability.md#isolated-plugins):
// lib/grove/grove-plugin-worker loads the same plugin file and creates the instance; requests and
// replies cross a socket as frames (core/src/plugins/worker_protocol.hpp). Rewards
// (isolated_reward.hpp) and environments (environment_host.hpp) are built on it.
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>

#include "grove/error.hpp"
#include "grove/manifest.hpp"
#include "grove/plugin_host.hpp"

namespace grove {

class PluginWorker {
public:
    // Validates the configuration here (errors name the manifest's line), starts the worker and
    // waits until it has created the instance of `kind`; a creation error is the plugin's message.
    PluginWorker(const PluginInfo& plugin, const PluginUse& use, uint32_t kind);
    ~PluginWorker();
    PluginWorker(const PluginWorker&) = delete;
    PluginWorker& operator=(const PluginWorker&) = delete;

    // Sends one request and returns the reply (type and payload checked by the caller). When the
    // worker crashes, exits or outlasts the use's timeout (then it is killed), throws
    // grove::Error(plugin) naming the plugin, its manifest line, how it ended and `what` (e.g.
    // "scoring the batch of step 3 (rows 0 to 7)"); when the plugin returns an error, its message.
    // After a failure the next call starts a new worker.
    std::string call(uint32_t request_type, uint32_t reply_type, const std::string& payload, const std::string& what);
    // call(), then `decode(reply)`. A reply that does not decode or does not fit the request (decode
    // throws grove::Error) stops the worker, as a malformed frame does: it is not trusted again.
    template <class Decode>
    auto call(uint32_t request_type, uint32_t reply_type, const std::string& payload, const std::string& what, Decode decode) {
        const std::string reply = call(request_type, reply_type, payload, what);
        try {
            return decode(reply);
        } catch (const Error& e) {
            distrust(what, std::string("a reply that does not fit: ") + e.what());
        }
    }

    // What the worker told when it was ready (environments: stop strings, tools, entry points).
    const std::string& ready_payload() const { return ready_; }
    const PluginInfo& info() const { return plugin_; }
    const PluginUse::Isolation& options() const { return options_; }

private:
    void start();
    void stop();
    [[noreturn]] void fail(const std::string& what, bool timed_out);
    // Stops a worker whose reply broke the protocol and throws grove::Error(plugin) naming it.
    [[noreturn]] void distrust(const std::string& what, const std::string& why);

    PluginInfo plugin_;
    uint32_t kind_;
    std::string config_toml_, origin_, base_dir_, ready_;
    PluginUse::Isolation options_;
    pid_t pid_ = -1;
    int socket_ = -1;
};

// The worker program: $GROVE_PLUGIN_WORKER, else grove/grove-plugin-worker next to libgrove_core.
std::string plugin_worker_path();

}  // namespace grove
