// Test reward: the fraction of completion tokens whose id is below `below`. A tiny random model can
// learn it within a few dozen GRPO steps, so it measures that training improves the reward.
#include <grove/plugin.hpp>

namespace {
struct LowIds {
    explicit LowIds(const grove::sdk::Config& c) : below(c.get_int("below", 32)) {}
    void score(const grove_reward_batch& b, grove_reward_output& out) const {
        for (uint32_t i = 0; i < b.count; ++i) {
            int64_t begin = b.completion_token_offsets[i], end = b.completion_token_offsets[i + 1];
            int64_t low = 0;
            for (int64_t t = begin; t < end; ++t) low += b.completion_tokens[t] < below;
            out.scores[i] = end > begin ? float(low) / float(end - begin) : 0.0f;
        }
    }
    int64_t below;
};
const grove_config_key kKeys[] = {grove::sdk::key("below", GROVE_VALUE_INT, "32", "token ids below this count")};
constexpr auto kLowIds = grove::sdk::reward_descriptor<LowIds>("low_ids", "1.0.0", "fraction of low token ids", 0, kKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kLowIds)
