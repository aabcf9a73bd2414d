#include "grove/tensorboard.hpp"

#include <boost/crc.hpp>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "grove/error.hpp"

namespace fs = std::filesystem;

namespace grove {

uint32_t crc32c(std::string_view bytes) {
    // CRC-32C: Castagnoli's polynomial, reflected, initial and final XOR all ones
    boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
    crc.process_bytes(bytes.data(), bytes.size());
    return crc.checksum();
}

uint32_t masked_crc32c(std::string_view bytes) {
    const uint32_t crc = crc32c(bytes);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tensorboard_tag(const std::string& metric) {
    for (const char* prefix : {"eval", "test"}) {
        const std::string with_underscore = std::string(prefix) + "_";
        if (metric.rfind(with_underscore, 0) == 0) return std::string(prefix) + "/" + metric.substr(with_underscore.size());
    }
    return "train/" + metric;
}

namespace {

// Protocol-buffer wire format: a key is (field number << 3) | wire type.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
    while (value >= 0x80) {
        out.push_back(char(uint8_t(value) | 0x80));
        value >>= 7;
    }
    out.push_back(char(value));
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t(field) << 3) | type); }

template <typename T>
void put_little_endian(std::string& out, T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));  // x86-64 and aarch64 are little-endian, as the format
    out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
    put_key(out, field, kLengthDelimited);
    put_varint(out, bytes.size());
    out.append(bytes);
}

// Event's fields (tensorboard/compat/proto/event.proto): wall_time 1, step 2, file_version 3,
// summary 5. Summary: value 1 (repeated); Summary.Value: tag 1, simple_value 2.
std::string event_header(double wall_time) {
    std::string event;
    put_key(event, 1, kFixed64);
    put_little_endian(event, wall_time);
    return event;
}

std::string file_version_event(double wall_time) {
    std::string event = event_header(wall_time);
    put_bytes(event, 3, "brain.Event:2");
    return event;
}

double seconds_since_epoch() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool read_varint(std::string_view bytes, size_t& at, uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64 && at < bytes.size(); shift += 7) {
        const uint8_t byte = uint8_t(bytes[at++]);
        value |= uint64_t(byte & 0x7f) << shift;
        if (!(byte & 0x80)) return true;
    }
    return false;
}

// The step of an Event payload, if it has one; false when the payload does not parse.
bool event_step(std::string_view payload, EventRecord& record) {
    size_t at = 0;
    while (at < payload.size()) {
        uint64_t key = 0, value = 0;
        if (!read_varint(payload, at, key)) return false;
        switch (WireType(key & 7)) {
            case kVarint:
                if (!read_varint(payload, at, value)) return false;
                if ((key >> 3) == 2) record.step = int64_t(value), record.has_step = true;
                break;
            case kFixed64:
                at += 8;
                break;
            case kFixed32:
                at += 4;
                break;
            case kLengthDelimited:
                if (!read_varint(payload, at, value) || value > payload.size() - at) return false;
                at += size_t(value);
                break;
            default:
                return false;
        }
    }
    return at == payload.size();
}

std::string frame(const std::string& payload) {
    std::string length;
    put_little_endian(length, uint64_t(payload.size()));
    std::string record = length;
    put_little_endian(record, masked_crc32c(length));
    record += payload;
    put_little_endian(record, masked_crc32c(payload));
    return record;
}

}  // namespace

std::string scalar_event(double wall_time, int64_t step, const std::map<std::string, double>& metrics) {
    std::string summary;
    for (const auto& [name, value] : metrics) {
        if (!std::isfinite(value)) continue;
        std::string entry;
        put_bytes(entry, 1, tensorboard_tag(name));
        put_key(entry, 2, kFixed32);
        put_little_endian(entry, float(value));  // simple_value is a float, as every TensorBoard writer has it
        put_bytes(summary, 1, entry);
    }
    std::string event = event_header(wall_time);
    put_key(event, 2, kVarint);
    put_varint(event, uint64_t(step));
    put_bytes(event, 5, summary);
    return event;
}

std::vector<EventRecord> read_event_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<EventRecord> records;
    size_t at = 0;
    while (bytes.size() - at >= 12) {
        const std::string_view length_bytes(bytes.data() + at, 8);
        uint64_t length = 0;
        uint32_t length_crc = 0, payload_crc = 0;
        std::memcpy(&length, length_bytes.data(), 8);
        std::memcpy(&length_crc, bytes.data() + at + 8, 4);
        if (length_crc != masked_crc32c(length_bytes) || length > bytes.size() - at - 12 || bytes.size() - at - 12 - length < 4)
            break;
        const std::string_view payload(bytes.data() + at + 12, size_t(length));
        std::memcpy(&payload_crc, bytes.data() + at + 12 + length, 4);
        EventRecord record;
        if (payload_crc != masked_crc32c(payload) || !event_step(payload, record)) break;
        record.payload = std::string(payload);
        records.push_back(std::move(record));
        at += 12 + size_t(length) + 4;
    }
    return records;
}

TensorBoardWriter::TensorBoardWriter(const std::string& folder, std::optional<int64_t> resume_step) {
    std::error_code error;
    fs::create_directories(folder, error);
    path_ = (fs::path(folder) / "events.out.tfevents.grove").string();
    std::string kept;
    if (resume_step)  // the steps after the checkpoint are logged again as they rerun
        for (const EventRecord& record : read_event_file(path_))
            if (!record.has_step || record.step <= *resume_step) kept += frame(record.payload);
    if (kept.empty()) kept = frame(file_version_event(seconds_since_epoch()));
    const std::string temporary = path_ + ".tmp";
    {
        std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
        if (!(out << kept) || !out.flush())
            throw Error(ErrorKind::runtime, temporary + ": cannot write: " + std::strerror(errno));
    }
    fs::rename(temporary, path_, error);
    if (error) throw Error(ErrorKind::runtime, path_ + ": cannot replace: " + error.message());
    file_.open(path_, std::ios::binary | std::ios::app);
    if (!file_) throw Error(ErrorKind::runtime, path_ + ": cannot open for writing: " + std::strerror(errno));
}

void TensorBoardWriter::write_record(const std::string& payload) {
    file_ << frame(payload);
    if (!file_.flush())
        throw Error(ErrorKind::runtime, path_ + ": write failed (" + std::strerror(errno) +
                                            "); free space in output.dir, then resume with --resume");
}

void TensorBoardWriter::write_scalars(int64_t step, const std::map<std::string, double>& metrics) {
    write_record(scalar_event(seconds_since_epoch(), step, metrics));
}

}  // namespace grove
