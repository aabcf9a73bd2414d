// A reward plugin in a worker process ([[rewards]] isolation = "process"; grove/plugin_worker.hpp):
// PluginInstance::score's contract, plus on_failure = "nan": a batch the worker failed scores NaN.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "grove/plugin_worker.hpp"

namespace grove {

class IsolatedReward {
public:
    IsolatedReward(const PluginInfo& plugin, const PluginUse& use) : worker_(plugin, use, GROVE_PLUGIN_KIND_REWARD) {}

    // Returns false when the batch failed and on_failure = "nan" (scores and metrics left NaN, a
    // warning printed); throws otherwise.
    bool score(const grove_reward_batch& batch, std::vector<float>& scores, std::vector<float>& metrics, RewardLogs* logs);
    const PluginInfo& info() const { return worker_.info(); }

private:
    PluginWorker worker_;
};

}  // namespace grove
