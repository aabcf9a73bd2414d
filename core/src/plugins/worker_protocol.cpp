#include "plugins/worker_protocol.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "grove/error.hpp"

namespace grove::worker {

namespace {
constexpr uint32_t kMagic = 0x57565247;  // "GRVW"

MalformedFrame malformed(const std::string& what) { return MalformedFrame(what); }

// Reads exactly `size` bytes; false on end of stream before the first byte of a frame.
bool read_exactly(int fd, void* out, size_t size, double timeout_seconds, bool* timed_out, bool frame_started) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_seconds);
    char* p = static_cast<char*>(out);
    size_t got = 0;
    while (got < size) {
        if (timeout_seconds > 0) {
            const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
            pollfd pfd{fd, POLLIN, 0};
            const int ready = left > 0 ? ::poll(&pfd, 1, int(left * 1000) + 1) : 0;
            if (ready < 0 && errno == EINTR) continue;
            if (ready == 0) {
                if (timed_out) *timed_out = true;
                throw Error(ErrorKind::plugin, "timed out");
            }
        }
        const ssize_t n = ::read(fd, p + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (got == 0 && !frame_started) return false;
            throw malformed("the stream ended inside a frame");
        }
        got += size_t(n);
        frame_started = true;
    }
    return true;
}
}  // namespace

void Writer::bytes(const std::string& s) {
    u64(s.size());
    raw(s.data(), s.size());
}

void Reader::need(uint64_t count, size_t size) const {
    if (count > (in_.size() - at_) / size) throw malformed("a field runs past the end of its frame");
}
void Reader::raw(void* out, size_t size) {
    need(size, 1);
    std::memcpy(out, in_.data() + at_, size);
    at_ += size;
}
std::string Reader::bytes() {
    const uint64_t size = u64();
    need(size, 1);
    std::string s(in_.data() + at_, size);
    at_ += size;
    return s;
}

bool write_frame(int fd, FrameType type, const std::string& payload) {
    Writer header;
    header.u32(kMagic);
    header.u32(uint32_t(type));
    header.u64(payload.size());
    for (const std::string* part : {&header.payload(), &payload}) {
        size_t sent = 0;
        while (sent < part->size()) {
            const ssize_t n = ::send(fd, part->data() + sent, part->size() - sent, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return false;
            sent += size_t(n);
        }
    }
    return true;
}

std::optional<Frame> read_frame(int fd, double timeout_seconds, bool* timed_out) {
    uint32_t magic = 0, type = 0;
    uint64_t length = 0;
    if (!read_exactly(fd, &magic, sizeof magic, timeout_seconds, timed_out, false)) return std::nullopt;
    read_exactly(fd, &type, sizeof type, timeout_seconds, timed_out, true);
    read_exactly(fd, &length, sizeof length, timeout_seconds, timed_out, true);
    if (magic != kMagic) throw malformed("a frame without the protocol's magic number");
    if (type < uint32_t(FrameType::start) || type > uint32_t(FrameType::episode_scores))
        throw malformed("an unknown frame type");
    if (length > kMaxFrameBytes) throw malformed("a frame of " + std::to_string(length) + " bytes");
    Frame frame{FrameType(type), std::string(length, '\0')};
    if (length) read_exactly(fd, frame.payload.data(), length, timeout_seconds, timed_out, true);
    return frame;
}

namespace {
void strings(Writer& w, const std::vector<std::string>& values) {
    w.u64(values.size());
    for (const auto& v : values) w.bytes(v);
}
std::vector<std::string> strings(Reader& r) {
    const uint64_t count = r.u64();
    std::vector<std::string> out;
    for (uint64_t i = 0; i < count; ++i) out.push_back(r.bytes());  // each read is bounds-checked
    return out;
}
std::vector<std::string> texts(const grove_text* t, size_t n) {
    std::vector<std::string> out;
    if (t)
        for (size_t i = 0; i < n; ++i) out.emplace_back(t[i].data, t[i].size);
    return out;
}

// CSR offsets over `n` rows into `end` items: n + 1 of them, from 0, never decreasing, to `end`; a
// frame that says otherwise would slice past its items
template <typename Offset>
bool valid_offsets(const std::vector<Offset>& offsets, size_t n, size_t end) {
    return offsets.size() == n + 1 && offsets.front() == 0 && std::is_sorted(offsets.begin(), offsets.end()) &&
           size_t(offsets.back()) == end;
}
}  // namespace

std::string encode_batch(const grove_reward_batch& b) {
    Writer w;
    const uint32_t n = b.count;
    w.u32(n);
    w.u32(b.num_generations);
    w.i64(b.step);
    w.u64(b.seed);
    w.u32(b.rank);
    w.u32(b.world_size);
    w.u64(b.global_row_offset);
    w.i64(b.max_steps);
    for (const grove_text* column : {b.prompts, b.completions, b.row_json, b.prompt_json}) strings(w, texts(column, n));
    w.array(b.completion_token_offsets, n + 1);
    const size_t tokens = size_t(b.completion_token_offsets[n]);
    w.array(b.completion_tokens, tokens);
    w.array(b.truncated, n);
    w.u32(b.model_token_mask ? 1 : 0);
    if (b.model_token_mask) w.array(b.model_token_mask, tokens);
    const bool has_turns = GROVE_HAS_FIELD(&b, grove_reward_batch, episode_turns) && b.episode_turns;
    w.u32(has_turns ? 1 : 0);
    if (has_turns) {
        w.array(b.episode_turn_offsets, n + 1);
        strings(w, texts(b.episode_turns, size_t(b.episode_turn_offsets[n])));
    }
    return w.payload();
}

RewardRows decode_batch(const std::string& payload) {
    Reader r(payload);
    RewardRows rows;
    const uint32_t n = r.u32();
    rows.num_generations = r.u32();
    rows.step = r.i64();
    rows.seed = r.u64();
    rows.rank = r.u32();
    rows.world_size = r.u32();
    rows.global_row_offset = r.u64();
    rows.max_steps = r.i64();
    for (auto* column : {&rows.prompts, &rows.completions, &rows.row_json, &rows.prompt_json}) *column = strings(r);
    rows.token_offsets = r.array<int64_t>();
    rows.tokens = r.array<int32_t>();
    rows.truncated = r.array<uint8_t>();
    if (r.u32()) rows.model_token_mask = r.array<uint8_t>();
    if (r.u32()) {
        rows.episode_turn_offsets = r.array<uint64_t>();
        rows.episode_turns = strings(r);
        if (!valid_offsets(rows.episode_turn_offsets, n, rows.episode_turns.size()))
            throw Error(ErrorKind::plugin, "the host sent a malformed batch");
    } else {
        rows.episode_turn_offsets.assign(size_t(n) + 1, 0);
    }
    if (rows.prompts.size() != n || rows.completions.size() != n || !valid_offsets(rows.token_offsets, n, rows.tokens.size()) ||
        rows.truncated.size() != n || (!rows.model_token_mask.empty() && rows.model_token_mask.size() != rows.tokens.size()) ||
        (!rows.prompt_json.empty() && rows.prompt_json.size() != n) || (!rows.row_json.empty() && rows.row_json.size() != n))
        throw Error(ErrorKind::plugin, "the host sent a malformed batch");
    if (rows.row_json.empty()) rows.row_json.assign(n, "{}");
    if (rows.model_token_mask.empty()) rows.model_token_mask.assign(rows.tokens.size(), 1);
    return rows;
}

std::string encode_scored(const ScoredBatch& s) {
    Writer w;
    w.array(s.scores.data(), s.scores.size());
    w.array(s.metrics.data(), s.metrics.size());
    w.u64(s.logs.metrics.size());
    for (const auto& [name, value] : s.logs.metrics) {
        w.bytes(name);
        w.f64(value);
    }
    w.u64(s.logs.extras.size());
    for (const auto& [column, values] : s.logs.extras) {
        w.bytes(column);
        strings(w, values);
    }
    return w.payload();
}

ScoredBatch decode_scored(const std::string& payload) {
    Reader r(payload);
    ScoredBatch s;
    s.scores = r.array<float>();
    s.metrics = r.array<float>();
    const uint64_t metrics = r.u64();
    for (uint64_t i = 0; i < metrics; ++i) {
        std::string name = r.bytes();
        s.logs.metrics.emplace_back(std::move(name), r.f64());
    }
    const uint64_t extras = r.u64();
    for (uint64_t i = 0; i < extras; ++i) {
        std::string column = r.bytes();
        s.logs.extras.emplace_back(std::move(column), strings(r));
    }
    return s;
}

std::string encode_turns(const grove_environment_batch& b) {
    Writer w;
    const size_t n = b.count;
    w.i64(b.step);
    w.u64(b.seed);
    w.array(b.episodes, n);
    w.array(b.turns, n);
    strings(w, texts(b.turn_texts, n));
    strings(w, texts(b.prompts, n));
    strings(w, texts(b.row_json, n));
    strings(w, texts(b.prompt_json, n));
    w.array(b.turn_token_offsets, n + 1);
    w.array(b.turn_tokens, size_t(b.turn_token_offsets[n]));
    w.array(b.turn_ended_with_eos, n);
    return w.payload();
}

EnvironmentTurns decode_turns(const std::string& payload) {
    Reader r(payload);
    EnvironmentTurns t;
    t.step = r.i64();
    t.seed = r.u64();
    t.episodes = r.array<uint64_t>();
    t.turns = r.array<uint32_t>();
    t.turn_texts = strings(r);
    t.prompts = strings(r);
    t.row_json = strings(r);
    t.prompt_json = strings(r);
    t.token_offsets = r.array<int64_t>();
    t.tokens = r.array<int32_t>();
    t.ended_with_eos = r.array<uint8_t>();
    const size_t n = t.episodes.size();
    if (t.turns.size() != n || t.turn_texts.size() != n || t.prompts.size() != n || t.row_json.size() != n ||
        !valid_offsets(t.token_offsets, n, t.tokens.size()) || t.ended_with_eos.size() != n ||
        (!t.prompt_json.empty() && t.prompt_json.size() != n))
        throw Error(ErrorKind::plugin, "the host sent a malformed environment batch");
    return t;
}

std::string encode_answers(const EnvironmentAnswers& a) {
    Writer w;
    strings(w, a.observations);
    w.array(a.done.data(), a.done.size());
    w.array(a.tool_calls.data(), a.tool_calls.size());
    w.array(a.tool_failures.data(), a.tool_failures.size());
    return w.payload();
}

EnvironmentAnswers decode_answers(const std::string& payload, size_t episodes) {
    Reader r(payload);
    EnvironmentAnswers a;
    a.observations = strings(r);
    a.done = r.array<uint8_t>();
    a.tool_calls = r.array<uint32_t>();
    a.tool_failures = r.array<uint32_t>();
    if (a.observations.size() != episodes || a.done.size() != episodes || a.tool_calls.size() != episodes ||
        a.tool_failures.size() != episodes)
        throw malformed("answers for another number of episodes");
    return a;
}

std::string encode_floats(const std::vector<float>& values) {
    Writer w;
    w.array(values.data(), values.size());
    return w.payload();
}

std::vector<float> decode_floats(const std::string& payload) {
    Reader r(payload);
    return r.array<float>();
}

std::string encode_traits(const EnvironmentTraits& t) {
    Writer w;
    strings(w, t.stop_strings);
    w.bytes(t.tools_json);
    w.u32((t.scores_episodes ? 1u : 0u) | (t.begins_episodes ? 2u : 0u) | (t.reward_by_default ? 4u : 0u));
    w.bytes(t.reward_name);
    return w.payload();
}

EnvironmentTraits decode_traits(const std::string& payload) {
    Reader r(payload);
    EnvironmentTraits t;
    t.stop_strings = strings(r);
    t.tools_json = r.bytes();
    const uint32_t flags = r.u32();
    t.scores_episodes = flags & 1u;
    t.begins_episodes = flags & 2u;
    t.reward_by_default = flags & 4u;
    t.reward_name = r.bytes();
    return t;
}

}  // namespace grove::worker
