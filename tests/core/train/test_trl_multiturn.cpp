// Replayed rows against TRL end to end: TRL 1.16's GRPOTrainer trained on fixed episodes given
// through rollout_func with env_mask (tests/core/train/trl_multiturn_reference.py); Grove replays the
// same rows (rewards given) and must land on the same weights. The same rows without their env_mask
// must not: the environment's tokens would then be trained on. With sync_ref_model, three steps
// whose KL is taken to a reference moved toward the policy after each must land on TRL's weights,
// and the same steps without the sync must not; likewise three steps of Adafactor with weight decay.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "grove/manifest.hpp"
#include "grove/model.hpp"
#include "grove/safetensors.hpp"
#include "grove/trainer.hpp"
#include "model/tensor_io.hpp"

namespace fs = std::filesystem;

namespace {
const std::string kDir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/trl_multiturn";

// The largest difference between the policy's weights after the case's replayed steps and TRL's;
// `without` names a setting of the case left out (sync_ref_model, optim, weight_decay), which must
// then matter.
double difference_from_trl(const nlohmann::json& c, const std::string& rollouts, const std::string& without = "") {
    const std::string name = c["name"];
    const std::string run = kDir + "/grove-" + name;
    fs::create_directories(run);
    std::ofstream manifest(run + "/grove.toml");
    manifest << "[model]\npath = \"" << kDir << "/model\"\nchat_template = \"none\"\n"
             << "[generation]\nnum_generations = 2\nmax_completion_length = 8\n"
             << "[[rewards]]\nplugin = \"format\"\nname = \"given\"\n"
             << "[reduction]\nplugin = \"" << c["loss_type"].get<std::string>() << "\"\n"
             << "[loss]\nbeta = " << c["beta"].get<double>() << "\n";
    if (without != "sync_ref_model" && c.value("sync_ref_model", false))
        manifest << "sync_ref_model = true\nref_model_sync_steps = " << c["ref_model_sync_steps"].get<int64_t>()
                 << "\nref_model_mixup_alpha = " << c["ref_model_mixup_alpha"].get<double>() << "\n";
    manifest << "[train]\nper_device_train_batch_size = 4\nlearning_rate = 1e-3\n";
    if (without != "weight_decay" && c.contains("weight_decay"))
        manifest << "weight_decay = " << c["weight_decay"].dump() << "\n";
    if (without != "optim" && c.contains("optim")) manifest << "optim = " << c["optim"].dump() << "\n";
    manifest << "lr_scheduler_type = \"constant\"\nmax_steps = " << c.value("max_steps", 1)
             << "\nseed = 3\nmixed_precision = \"no\"\n"
             << "[rollouts]\npath = \"" << rollouts << "\"\n[output]\ndir = \"out\"\n";
    manifest.close();
    grove::TrainerOptions options;
    options.overwrite = true;
    grove::Trainer trainer(grove::Manifest::load(run + "/grove.toml"), options);
    while (trainer.global_step() < trainer.total_steps()) trainer.step();
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
    // the figures docs/grpo.md quotes
    std::cout << name << " on " << fs::path(rollouts).filename().string() << (without.empty() ? "" : ", without " + without)
              << ": largest weight difference from TRL " << worst << "\n";
    return worst;
}

nlohmann::json cases() { return nlohmann::json::parse(std::ifstream(kDir + "/cases.json")); }
}  // namespace

TEST(TrlMultiTurn, ReplayedEpisodesGiveTrlsUpdate) {
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
    size_t checked = 0;
    for (const auto& c : cases()) {
        if (c.value("sync_ref_model", false) || c.contains("optim")) continue;
        // the update is 1e-3 per weight (Adam's first step); float rounding stays far below 1e-6
        EXPECT_LT(difference_from_trl(c, kDir + "/rollouts.jsonl"), 1e-6) << c["name"];
        EXPECT_GT(difference_from_trl(c, without_mask), 1e-5) << c["name"] << ": the mask made no difference";
        ++checked;
    }
    EXPECT_EQ(checked, 2u);
}

// TR-DPO (sync_ref_model): TRL moves its reference toward the policy after each optimizer step.
TEST(TrlMultiTurn, ASyncedReferenceGivesTrlsUpdates) {
    size_t checked = 0;
    for (const auto& c : cases()) {
        if (!c.value("sync_ref_model", false)) continue;
        EXPECT_LT(difference_from_trl(c, kDir + "/rollouts.jsonl"), 1e-6) << c["name"];
        EXPECT_GT(difference_from_trl(c, kDir + "/rollouts.jsonl", "sync_ref_model"), 1e-5)
            << c["name"] << ": the sync made no difference";
        ++checked;
    }
    EXPECT_EQ(checked, 1u);
}

// optim = "adafactor" (transformers' Adafactor as Trainer sets it up) with weight decay: three steps
// land on TRL's weights; AdamW's steps, or Adafactor's without the decay, do not.
TEST(TrlMultiTurn, AdafactorGivesTrlsUpdates) {
    size_t checked = 0;
    for (const auto& c : cases()) {
        if (!c.contains("optim")) continue;
        EXPECT_LT(difference_from_trl(c, kDir + "/rollouts.jsonl"), 1e-6) << c["name"];
        EXPECT_GT(difference_from_trl(c, kDir + "/rollouts.jsonl", "optim"), 1e-4)
            << c["name"] << ": AdamW gave Adafactor's update";
        EXPECT_GT(difference_from_trl(c, kDir + "/rollouts.jsonl", "weight_decay"), 1e-6)
            << c["name"] << ": the weight decay made no difference";
        ++checked;
    }
    EXPECT_EQ(checked, 1u);
}
