// Multi-turn rows against TRL end to end: TRL 1.16's GRPOTrainer took one optimizer step on fixed
// episodes given through rollout_func with env_mask (tests/core/train/trl_multiturn_reference.py);
// Grove replays the same rows (rewards given) and must land on the same weights. The same rows
// without their env_mask must not: the environment's tokens would then be trained on.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "grove/manifest.hpp"
#include "grove/model.hpp"
#include "grove/safetensors.hpp"
#include "grove/trainer.hpp"
#include "model/tensor_io.hpp"

namespace fs = std::filesystem;

namespace {
const std::string kDir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/trl_multiturn";

// The largest difference between the policy's weights after one replayed step and TRL's.
double difference_after_one_step(const std::string& name, const std::string& reduction, const std::string& rollouts) {
    const std::string run = kDir + "/grove-" + name;
    fs::create_directories(run);
    std::ofstream(run + "/grove.toml")
        << "[model]\npath = \"" << kDir << "/model\"\nchat_template = \"none\"\n"
        << "[generation]\nnum_generations = 2\nmax_completion_length = 8\n"
        << "[[rewards]]\nplugin = \"format\"\nname = \"given\"\n"
        << "[reduction]\nplugin = \"" << reduction << "\"\n[loss]\nbeta = 0.04\n"
        << "[train]\nper_device_train_batch_size = 4\nlearning_rate = 1e-3\n"
        << "lr_scheduler_type = \"constant\"\nmax_steps = 1\nseed = 3\nmixed_precision = \"no\"\n"
        << "[rollouts]\npath = \"" << rollouts << "\"\n[output]\ndir = \"out\"\n";
    grove::TrainerOptions options;
    options.overwrite = true;
    grove::Trainer trainer(grove::Manifest::load(run + "/grove.toml"), options);
    trainer.step();
    grove::SafetensorsFile trl(kDir + "/" + name + ".safetensors");
    double worst = 0;
    size_t compared = 0;
    for (const auto& [key, value] : trainer.model().named_parameters()) {
        const grove::TensorEntry* entry = trl.find(key);
        if (!entry) ADD_FAILURE() << key << " is not in TRL's weights";
        if (!entry) continue;
        worst = std::max(worst, (value.detach() - grove::tensor_from_entry(*entry, trl.path())).abs().max().item<double>());
        ++compared;
    }
    EXPECT_GT(compared, 10u);
    return worst;
}
}  // namespace

TEST(TrlMultiTurn, ReplayedEpisodesGiveTrlsUpdate) {
    auto cases = nlohmann::json::parse(std::ifstream(kDir + "/cases.json"));
    ASSERT_FALSE(cases.empty());
    // the same rows without env_mask: single-turn rows cut at their first EOS, tool tokens trained
    const std::string without_mask = kDir + "/rollouts-without-env-mask.jsonl";
    {
        std::ifstream in(kDir + "/rollouts.jsonl");
        std::ofstream out(without_mask);
        for (std::string line; std::getline(in, line);) {
            auto row = nlohmann::json::parse(line);
            row.erase("env_mask");
            out << row.dump() << "\n";
        }
    }
    for (const auto& c : cases) {
        const std::string name = c["name"], reduction = c["loss_type"];
        // the update is 1e-3 per weight (Adam's first step); float rounding stays far below 1e-6
        EXPECT_LT(difference_after_one_step(name, reduction, kDir + "/rollouts.jsonl"), 1e-6) << name;
        EXPECT_GT(difference_after_one_step(name, reduction, without_mask), 1e-5) << name << ": the mask made no difference";
    }
}
