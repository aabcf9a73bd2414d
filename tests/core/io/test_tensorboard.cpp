// TensorBoard event files (core/src/io/tensorboard_events.cpp): the checksum, the tags, and the
// file a resumed run rewrites. That TensorBoard itself reads what Grove writes is checked end to
// end by Trainer.TensorBoardHoldsTheMetricsOnceAcrossAResume with TensorBoard's own loader.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "grove/tensorboard.hpp"

namespace fs = std::filesystem;

namespace {

std::string fresh_folder(const std::string& name) {
    const std::string folder = std::string(GROVE_TEST_BINARY_DIR) + "/tensorboard/" + name;
    fs::remove_all(folder);
    return folder;
}

std::vector<int64_t> steps_in(const std::string& file) {
    std::vector<int64_t> steps;
    for (const auto& event : grove::read_event_file(file))
        if (event.has_step) steps.push_back(event.step);
    return steps;
}

}  // namespace

// The published check value of CRC-32C ("123456789" -> 0xE3069283, RFC 3720's CRC) and of the
// empty string.
TEST(TensorBoard, Crc32cHasItsCheckValue) {
    EXPECT_EQ(grove::crc32c("123456789"), 0xE3069283u);
    EXPECT_EQ(grove::crc32c(""), 0u);
}

// transformers' rewrite_logs: eval_ and test_ become folders, everything else is under train/.
TEST(TensorBoard, TagsAreTransformers) {
    EXPECT_EQ(grove::tensorboard_tag("reward"), "train/reward");
    EXPECT_EQ(grove::tensorboard_tag("rewards/format/mean"), "train/rewards/format/mean");
    EXPECT_EQ(grove::tensorboard_tag("eval_reward"), "eval/reward");
    EXPECT_EQ(grove::tensorboard_tag("eval_rewards/format/mean"), "eval/rewards/format/mean");
    EXPECT_EQ(grove::tensorboard_tag("test_loss"), "test/loss");
    EXPECT_EQ(grove::tensorboard_tag("evaluation"), "train/evaluation");
}

// A resumed run keeps the events up to its checkpoint's step and appends; a record cut short by a
// kill is dropped with everything after it; a fresh run starts the file anew.
TEST(TensorBoard, AResumeKeepsTheStepsUpToItsCheckpoint) {
    const std::string folder = fresh_folder("resume");
    std::string file;
    {
        grove::TensorBoardWriter writer(folder, std::nullopt);
        file = writer.path();
        for (int64_t step = 1; step <= 4; ++step)
            writer.write_scalars(step, {{"loss", 0.5 * double(step)}, {"nan", std::numeric_limits<double>::quiet_NaN()}});
    }
    EXPECT_EQ(steps_in(file), (std::vector<int64_t>{1, 2, 3, 4}));
    {
        grove::TensorBoardWriter writer(folder, 2);
        writer.write_scalars(3, {{"loss", 7.0}});
    }
    EXPECT_EQ(steps_in(file), (std::vector<int64_t>{1, 2, 3}));
    const auto records = grove::read_event_file(file);
    ASSERT_EQ(records.size(), 4u);
    EXPECT_FALSE(records[0].has_step) << "the file version comes first";
    // the new step 3 (loss 7), not the old one (1.5); the first 9 bytes hold the wall time
    EXPECT_EQ(records[3].payload.substr(9), grove::scalar_event(0, 3, {{"loss", 7.0}}).substr(9));
    {
        std::ofstream(file, std::ios::binary | std::ios::app) << std::string("\x20\0\0\0\0\0\0\0\x01\x02", 10);
        grove::TensorBoardWriter writer(folder, 3);  // the torn record is gone; step 4 comes after it
        writer.write_scalars(4, {{"loss", 8.0}});
    }
    EXPECT_EQ(steps_in(file), (std::vector<int64_t>{1, 2, 3, 4}));
    {
        grove::TensorBoardWriter writer(folder, std::nullopt);
    }
    EXPECT_EQ(grove::read_event_file(file).size(), 1u) << "a run that does not resume starts the file anew";
}

// A record whose payload was altered fails its checksum and ends the reading there.
TEST(TensorBoard, ADamagedRecordEndsTheFile) {
    const std::string folder = fresh_folder("damaged");
    std::string file;
    {
        grove::TensorBoardWriter writer(folder, std::nullopt);
        file = writer.path();
        writer.write_scalars(1, {{"loss", 1.0}});
        writer.write_scalars(2, {{"loss", 2.0}});
    }
    std::string bytes;
    {
        std::ifstream in(file, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    bytes[bytes.size() - 6] ^= 0x40;  // inside the last event's payload
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    EXPECT_EQ(steps_in(file), (std::vector<int64_t>{1}));
}
