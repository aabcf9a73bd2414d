// The wire between the host and a plugin worker process (docs/reliability.md#isolated-plugins): a
// socket carrying frames of [magic u32 | type u32 | length u64 | payload]. Payloads are plain
// little-endian fields and length-prefixed byte strings (completions need not be valid UTF-8, so
// no JSON). Both sides validate every length before trusting it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "grove/grove_plugin.h"
#include "grove/environment_host.hpp"
#include "grove/error.hpp"
#include "grove/plugin_host.hpp"

namespace grove::worker {

enum class FrameType : uint32_t {
    start = 1,    // host -> worker: plugin kind, file, configuration TOML, origin, base_dir
    ready = 2,    // worker -> host: the instance exists
    failure = 3,  // worker -> host: error kind (u32) and message
    score = 4,    // host -> worker: a reward batch
    scored = 5,   // worker -> host: scores, metrics, what the reward logged
    // environments: the episodes of one call (grove_environment_batch) ...
    environment_step = 6,
    environment_begin = 7,
    environment_score = 8,
    answers = 9,          // ... the answers of step / begin_episodes (observations, done, tool counts)
    episode_scores = 10,  // ... or score_episodes' floats
};

constexpr uint64_t kMaxFrameBytes = uint64_t(1) << 32;  // 4 GiB: far above any batch

// The first field of the start frame. A worker from another build of Grove answers a start frame of
// another version with a failure naming both, rather than misreading its fields; raise it with any
// change to a payload's layout.
constexpr uint32_t kProtocolVersion = 4;

// Appends fields to a payload.
class Writer {
public:
    void u32(uint32_t v) { raw(&v, sizeof v); }
    void u64(uint64_t v) { raw(&v, sizeof v); }
    void i64(int64_t v) { raw(&v, sizeof v); }
    void f64(double v) { raw(&v, sizeof v); }
    void bytes(const std::string& s);
    template <class T>
    void array(const T* data, size_t count) {
        u64(count);
        raw(data, count * sizeof(T));
    }
    const std::string& payload() const { return out_; }

private:
    void raw(const void* data, size_t size) { out_.append(static_cast<const char*>(data), size); }
    std::string out_;
};

// What a frame that breaks the protocol's framing throws: PluginWorker::call then stops the worker
// rather than trust it with another call.
class MalformedFrame : public Error {
public:
    explicit MalformedFrame(const std::string& what)
            : Error(ErrorKind::plugin, "the plugin worker's reply is malformed (" + what + ")") {}
};

// Reads fields back; any read past the end throws MalformedFrame.
class Reader {
public:
    explicit Reader(const std::string& payload) : in_(payload) {}
    uint32_t u32() { return scalar<uint32_t>(); }
    uint64_t u64() { return scalar<uint64_t>(); }
    int64_t i64() { return scalar<int64_t>(); }
    double f64() { return scalar<double>(); }
    std::string bytes();
    template <class T>
    std::vector<T> array() {
        const uint64_t count = u64();
        need(count, sizeof(T));
        std::vector<T> out(count);
        if (count) raw(out.data(), count * sizeof(T));
        return out;
    }

private:
    template <class T>
    T scalar() {
        T v;
        raw(&v, sizeof v);
        return v;
    }
    void need(uint64_t count, size_t size) const;
    void raw(void* out, size_t size);
    const std::string& in_;
    size_t at_ = 0;
};

// Writes a whole frame; false when the other side has gone (EPIPE, no SIGPIPE).
bool write_frame(int fd, FrameType type, const std::string& payload);
// Reads one frame. nullopt: the other side closed the socket. Throws MalformedFrame on a malformed
// frame, and grove::Error(plugin) on a timeout (timeout_seconds > 0) with `timed_out` set.
struct Frame {
    FrameType type;
    std::string payload;
};
std::optional<Frame> read_frame(int fd, double timeout_seconds, bool* timed_out = nullptr);

// A reward batch across the wire, and back into rows the worker's plugin can take.
std::string encode_batch(const grove_reward_batch& batch);
RewardRows decode_batch(const std::string& payload);

struct ScoredBatch {
    std::vector<float> scores, metrics;
    RewardLogs logs;
};
std::string encode_scored(const ScoredBatch& scored);
ScoredBatch decode_scored(const std::string& payload);

// An environment call's episodes and answers, and what an environment worker tells when ready.
std::string encode_turns(const grove_environment_batch& batch);
EnvironmentTurns decode_turns(const std::string& payload);
std::string encode_answers(const EnvironmentAnswers& answers);
EnvironmentAnswers decode_answers(const std::string& payload, size_t episodes);
std::string encode_floats(const std::vector<float>& values);
std::vector<float> decode_floats(const std::string& payload);
struct EnvironmentTraits {
    std::vector<std::string> stop_strings;
    std::string tools_json;
    bool scores_episodes = false, begins_episodes = false;
    bool reward_by_default = false;  // SDK episode_reward
    std::string reward_name;
};
std::string encode_traits(const EnvironmentTraits& traits);
EnvironmentTraits decode_traits(const std::string& payload);

}  // namespace grove::worker
