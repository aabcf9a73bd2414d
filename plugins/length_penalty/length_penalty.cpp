// Reward "length_penalty".
//   mode "overlong" (default): DAPO's soft overlong punishment, exactly TRL's
//       get_soft_overlong_punishment(max_completion_len = max_length, soft_punish_cache = cache),
//       with len = completion tokens:
//         len <= max_length - cache              ->  0
//         max_length - cache < len <= max_length ->  ((max_length - cache) - len) / cache
//         len > max_length                       -> -1
//       len is the number of completion token ids the host passes (Grove's generator counts the
//       closing EOS token, like TRL's completion_ids). Truncated rows get no special case: their
//       length decides, as in TRL. Requires 0 < cache <= max_length.
//   mode "target": -|len - target| / scale, len in tokens (unit = "tokens", default) or Unicode
//       code points (unit = "characters"; each byte that is not a UTF-8 continuation byte counts
//       once, so "東京🙂" is 3, and a stray invalid byte counts as one character). Requires
//       target >= 0 and a finite scale > 0.
//   Keys of the other mode are a config error (max_length/cache in "target"; target/scale/unit in
//   "overlong"), so a manifest never carries settings that silently do nothing.
#include <grove/plugin.hpp>

#include <cmath>
#include <string>

namespace {
using grove::sdk::config_error;

struct LengthPenalty {
    explicit LengthPenalty(const grove::sdk::Config& config) : mode_(config.get_string("mode", "overlong")) {
        auto forbid = [&](const char* key) {
            if (config.has(key)) throw config_error(key, std::string("'") + key + "' does not apply to mode \"" + mode_ + "\"");
        };
        if (mode_ == "overlong") {
            forbid("target");
            forbid("scale");
            forbid("unit");
            if (!config.has("max_length")) throw config_error("max_length", "mode \"overlong\" needs max_length (tokens)");
            if (!config.has("cache")) throw config_error("cache", "mode \"overlong\" needs cache (the soft zone, in tokens)");
            max_length_ = config.get_int("max_length", 0);
            cache_ = config.get_int("cache", 0);
            if (max_length_ <= 0) throw config_error("max_length", "must be > 0 (tokens)");
            if (cache_ <= 0 || cache_ > max_length_)
                throw config_error("cache", "must be in [1, max_length] (max_length = " + std::to_string(max_length_) + ")");
        } else if (mode_ == "target") {
            forbid("max_length");
            forbid("cache");
            if (!config.has("target")) throw config_error("target", "mode \"target\" needs target (the preferred length)");
            target_ = config.get_int("target", 0);
            if (target_ < 0) throw config_error("target", "must be >= 0");
            scale_ = config.get_float("scale", 1.0);
            if (!(scale_ > 0) || !std::isfinite(scale_)) throw config_error("scale", "must be > 0 and finite");
            std::string unit = config.get_string("unit", "tokens");
            if (unit == "characters")
                characters_ = true;
            else if (unit != "tokens")
                throw config_error("unit", "'" + unit + "' is not valid; use tokens or characters");
        } else {
            throw config_error("mode", "'" + mode_ + "' is not valid; use overlong or target");
        }
    }

    static int64_t code_points(const grove_text& text) {
        int64_t n = 0;
        for (size_t i = 0; i < text.size; ++i) n += (static_cast<unsigned char>(text.data[i]) & 0xc0) != 0x80;
        return n;
    }

    void score(const grove_reward_batch& batch, grove_reward_output& out) const {
        for (uint32_t i = 0; i < batch.count; ++i) {
            int64_t tokens = batch.completion_token_offsets[i + 1] - batch.completion_token_offsets[i];
            if (mode_ == "overlong") {
                int64_t soft = max_length_ - cache_;
                double r = tokens <= soft ? 0.0 : tokens <= max_length_ ? double(soft - tokens) / double(cache_) : -1.0;
                out.scores[i] = float(r);
            } else {
                int64_t length = characters_ ? code_points(batch.completions[i]) : tokens;
                out.scores[i] = float(-std::abs(double(length - target_)) / scale_);
            }
        }
    }

    std::string mode_;
    int64_t max_length_ = 0, cache_ = 0, target_ = 0;
    double scale_ = 1.0;
    bool characters_ = false;
};

const grove_config_key kKeys[] = {
    grove::sdk::key("mode", GROVE_VALUE_STRING, "\"overlong\"", "overlong (DAPO soft punishment) or target"),
    grove::sdk::key("max_length", GROVE_VALUE_INT, "(required: overlong)", "overlong: longest unpunished length L"),
    grove::sdk::key("cache", GROVE_VALUE_INT, "(required: overlong)", "overlong: soft zone C before L"),
    grove::sdk::key("target", GROVE_VALUE_INT, "(required: target)", "target: preferred length"),
    grove::sdk::key("scale", GROVE_VALUE_FLOAT, "1.0", "target: penalty per unit of distance is 1/scale"),
    grove::sdk::key("unit", GROVE_VALUE_STRING, "\"tokens\"", "target: tokens or characters (code points)"),
};
constexpr auto kLengthPenalty = grove::sdk::reward_descriptor<LengthPenalty>(
    "length_penalty", "1.0.0", "DAPO soft overlong punishment, or distance from a target length",
    GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC, kKeys);
}  // namespace

GROVE_PLUGIN_LIBRARY(&kLengthPenalty)
