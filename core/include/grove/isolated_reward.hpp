// A reward plugin in a worker process of its own ([[rewards]] isolation = "process";
// docs/reliability.md#isolated-plugins): the same plugin file and ABI, loaded by
// lib/grove/grove-plugin-worker, with batches crossing a socket (plugins/worker_protocol.hpp). A
// crash, an exit or a call that outlasts the timeout becomes an error naming the plugin, the
// signal and the batch, or, with on_failure = "nan", NaN scores for that batch and a new worker.
#pragma once

#include <string>
#include <sys/types.h>
#include <utility>
#include <vector>

#include "grove/manifest.hpp"
#include "grove/plugin_host.hpp"

namespace grove {

class IsolatedReward {
public:
    // Validates the configuration here (errors name the manifest's line), then starts the worker,
    // which creates the instance; a creation error comes back as the plugin's own message.
    IsolatedReward(const PluginInfo& plugin, const PluginUse& use);
    ~IsolatedReward();
    IsolatedReward(const IsolatedReward&) = delete;
    IsolatedReward& operator=(const IsolatedReward&) = delete;

    // PluginInstance::score's contract. Returns false when the batch failed and on_failure = "nan"
    // (scores and metrics left NaN; the next call starts a new worker); throws otherwise.
    bool score(const grove_reward_batch& batch, std::vector<float>& scores, std::vector<float>& metrics,
               std::vector<std::pair<std::string, double>>* logged);
    const PluginInfo& info() const { return plugin_; }

private:
    void start();
    void stop();
    // The worker died or hung during `what`: an error naming the plugin, how it ended and the batch.
    [[noreturn]] void fail(const std::string& what, bool timed_out);

    PluginInfo plugin_;
    std::string config_toml_, origin_, base_dir_;
    PluginUse::Isolation options_;
    pid_t pid_ = -1;
    int socket_ = -1;
};

// The worker program: $GROVE_PLUGIN_WORKER, else grove/grove-plugin-worker next to libgrove_core.
std::string plugin_worker_path();

}  // namespace grove
