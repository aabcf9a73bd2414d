// TensorBoard's event files (TRL's report_to = "tensorboard"): the run's metrics as scalars that
// `tensorboard --logdir OUTPUT` plots, under the tags transformers' TensorBoardCallback gives them.
//
// An event file is a sequence of TFRecords: a little-endian uint64 length, the masked CRC-32C of
// those 8 bytes, the payload, the masked CRC-32C of the payload. Each payload is a serialized
// `Event` protocol buffer; Grove writes the three fields it needs by hand (wall_time, step, and a
// summary of scalar values, or the file_version of the first record), which needs no protobuf
// library. docs/training.md#tensorboard says what is written.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace grove {

// CRC-32C (Castagnoli), the checksum TFRecords use.
uint32_t crc32c(std::string_view bytes);
// TFRecord's mask over it, so that a CRC of data holding CRCs is not degenerate.
uint32_t masked_crc32c(std::string_view bytes);

// The tag transformers' TensorBoardCallback writes a logged value under (its rewrite_logs):
// "eval_reward" -> "eval/reward", "test_x" -> "test/x", everything else "train/<name>".
std::string tensorboard_tag(const std::string& metric);

// One serialized Event holding a scalar for every finite value of `metrics`, at `step`.
std::string scalar_event(double wall_time, int64_t step, const std::map<std::string, double>& metrics);

// One event of a file as Grove reads it back: its step (0 when the event has none) and payload.
struct EventRecord {
    int64_t step = 0;
    bool has_step = false;
    std::string payload;
};

class TensorBoardWriter {
public:
    // Writes `folder`/events.out.tfevents.grove (the folder is made). With `resume_step`, the file
    // is kept up to its events of that step and appended to (a resumed run logs the later steps
    // again); without, it starts anew.
    TensorBoardWriter(const std::string& folder, std::optional<int64_t> resume_step);

    // The metrics of one optimizer step, as tensorboard_tag names them; non-finite values are left
    // out, as metrics.jsonl writes them null. A write that fails throws, naming the file.
    void write_scalars(int64_t step, const std::map<std::string, double>& metrics);

    const std::string& path() const { return path_; }

private:
    void write_record(const std::string& payload);
    std::string path_;
    std::ofstream file_;
};

// Every whole record of an event file, in order; reading stops at the first record that is cut
// short or fails its checksum (the tail of a run that was killed while writing).
std::vector<EventRecord> read_event_file(const std::string& path);

}  // namespace grove
