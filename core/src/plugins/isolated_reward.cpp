#include "grove/isolated_reward.hpp"

#include <cmath>
#include <iostream>

#include "grove/error.hpp"
#include "plugins/worker_protocol.hpp"

namespace grove {

bool IsolatedReward::score(const grove_reward_batch& batch, std::vector<float>& scores, std::vector<float>& metrics,
                           RewardLogs* logs) {
    const float nan = std::nanf("");
    const size_t metric_values = size_t(batch.count) * info().metric_names.size();
    scores.assign(batch.count, nan);
    metrics.assign(metric_values, nan);
    const std::string what = "scoring the batch of step " + std::to_string(batch.step) + " (rows " +
                             std::to_string(batch.global_row_offset) + " to " +
                             std::to_string(batch.global_row_offset + batch.count - 1) + ")";
    try {
        worker::ScoredBatch scored =
            worker_.call(uint32_t(worker::FrameType::score), uint32_t(worker::FrameType::scored), worker::encode_batch(batch),
                         what, [&](const std::string& reply) {
                             worker::ScoredBatch decoded = worker::decode_scored(reply);
                             if (decoded.scores.size() != scores.size() || decoded.metrics.size() != metrics.size())
                                 throw Error(ErrorKind::plugin, std::to_string(decoded.scores.size()) + " scores and " +
                                                                    std::to_string(decoded.metrics.size()) + " metric values");
                             return decoded;
                         });
        scores = std::move(scored.scores);
        metrics = std::move(scored.metrics);
        if (logs) {
            logs->metrics.insert(logs->metrics.end(), scored.logs.metrics.begin(), scored.logs.metrics.end());
            logs->extras.insert(logs->extras.end(), scored.logs.extras.begin(), scored.logs.extras.end());
        }
        return true;
    } catch (const Error& e) {
        if (!worker_.options().failures_are_nan) throw;
        std::cerr << "grove: warning: " << e.what() << "; this batch scores NaN (on_failure = \"nan\")" << std::endl;
        scores.assign(batch.count, nan);
        metrics.assign(metric_values, nan);
        return false;
    }
}

}  // namespace grove
