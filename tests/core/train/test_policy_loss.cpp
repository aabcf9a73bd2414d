// Grove's loss and gradient norm against TRL's GRPOTrainer._compute_loss on the same tiny checkpoint
// and fixed rollouts (tests/core/train/trl_loss_reference.py), for every reduction and for
// epsilon_high, delta, beta > 0, sequence-level importance sampling, a second (off-policy) pass and
// multi-turn rows whose environment tokens are context only (TRL's env_mask).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "grove/generation.hpp"
#include "grove/model.hpp"
#include "grove/plugin_host.hpp"
#include "grove/policy_loss.hpp"
#include "grove/safetensors.hpp"
#include "model/tensor_io.hpp"
#include "train/policy_step.hpp"
#include "plugin_test_support.hpp"

namespace {
const std::string kDir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/trl";

std::map<std::string, at::Tensor> rollouts() {
    grove::SafetensorsFile file(kDir + "/rollouts.safetensors");
    std::map<std::string, at::Tensor> out;
    for (const auto& t : file.tensors()) out[t.name] = grove::tensor_from_entry(t, file.path());
    return out;
}

grove::PluginInstance plugin(const std::string& name, uint32_t kind) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    auto info = host.find(name, kind);
    return grove::PluginInstance(info, grove::PluginConfig::from_toml_text(info, "", "test"));
}
}  // namespace

TEST(PolicyLoss, MatchesTrlComputeLoss) {
    std::ifstream in(kDir + "/cases.json");
    auto spec = nlohmann::json::parse(in);
    auto r = rollouts();
    const at::Tensor full_mask = r["completion_mask"].to(at::kFloat);
    int64_t B = full_mask.size(0), T = full_mask.size(1);
    for (const auto& c : spec["cases"]) {
        std::string name = c["name"];
        auto model = grove::Model::load(kDir + "/model");
        model->set_base_trainable(true);
        at::Tensor entropy;
        at::Tensor logp = grove::completion_logprobs(*model, r["prompt_ids"], r["prompt_mask"], r["completion_ids"],
                                                     r["completion_mask"], spec["temperature"].get<double>(), &entropy);
        at::Tensor mask = full_mask.clone();
        if (c.contains("masked_row")) mask[c["masked_row"].get<int64_t>()].zero_();
        // an environment's tokens stay in the forward pass (r["completion_mask"] above) but leave the loss
        if (c.value("env_mask", false)) mask *= r["env_mask"].to(at::kFloat);
        if (name == "grpo") {  // TRL zeroes masked positions' log-probs; compare the completion tokens
            EXPECT_LT(((logp.detach() - r["trl_logps"]).abs() * mask).max().item<double>(), 1e-5);
        }

        grove_reduction_context ctx{};
        ctx.struct_size = sizeof(ctx);
        ctx.rows = uint32_t(B);
        ctx.columns = uint32_t(T);
        at::Tensor contiguous_mask = mask.contiguous();
        ctx.mask = contiguous_mask.data_ptr<float>();
        ctx.gradient_accumulation_steps = 1;
        ctx.steps_per_generation = 1;
        ctx.world_size = 1;
        ctx.max_completion_length = spec["max_completion_length"].get<uint32_t>();
        ctx.generation_batch_tokens = ctx.optimizer_window_tokens = mask.sum().item<double>();
        ctx.generation_batch_sequences = double(B);
        std::vector<float> weights;
        plugin(c.value("reduction", c["loss_type"].get<std::string>()), GROVE_PLUGIN_KIND_REDUCTION).weights(ctx, weights);

        grove::PolicyLossOptions o;
        o.beta = c.value("beta", 0.0);
        o.epsilon = 0.2;
        o.epsilon_high = c.contains("epsilon_high") && !c["epsilon_high"].is_null() ? c["epsilon_high"].get<double>() : 0.2;
        if (c.contains("delta") && !c["delta"].is_null()) o.delta = c["delta"].get<double>();
        o.importance_sampling_level =
            grove::importance_sampling_level_from_name(c.value("importance_sampling_level", std::string("token")));
        o.use_bias_correction_kl = c.value("use_bias_correction_kl", false);
        std::optional<at::Tensor> old, ref;
        if (c.value("off_policy", false)) old = r["old_logps"];
        if (c.value("with_ref", false)) ref = r["ref_logps"];
        auto result =
            grove::policy_loss(plugin(c.value("objective", std::string("clipped")), GROVE_PLUGIN_KIND_OBJECTIVE), logp, old,
                               ref, r["advantages"], mask, at::from_blob(weights.data(), {B, T}, at::kFloat).clone(), o);
        result.loss.backward();
        double squared = 0;
        for (const auto& p : model->trainable_parameters())
            if (p.grad().defined()) squared += p.grad().pow(2).sum().item<double>();
        double grad_norm = std::sqrt(squared);
        double trl_loss = c["loss"], trl_norm = c["grad_norm"];
        EXPECT_NEAR(result.value, trl_loss, 1e-5 * std::abs(trl_loss) + 1e-7) << name;
        EXPECT_NEAR(result.loss.item<double>(), trl_loss, 1e-5 * std::abs(trl_loss) + 1e-7) << name;
        EXPECT_NEAR(grad_norm, trl_norm, 1e-5 * trl_norm + 1e-7) << name;
        EXPECT_GT(grad_norm, 0.0) << name;
        // the values TRL's _compute_loss logs for this micro-batch (one process: min = max = mean)
        const double entropy_sum = (entropy * mask).sum().item<double>();
        grove::StepMetrics one_micro_batch;
        one_micro_batch.add({result.metrics, entropy_sum, mask.sum().item<double>()});
        auto ours = one_micro_batch.finish(nullptr);
        const auto& logged = c["logged"];
        for (const auto& [key, value] : logged.items()) {  // TRL's keys for this loss type, and no others
            ASSERT_TRUE(ours.count(key)) << name << " " << key;
            EXPECT_NEAR(ours[key], value.get<double>(), 1e-5 * std::abs(value.get<double>()) + 1e-7) << name << " " << key;
        }
        for (const auto& [key, value] : ours) EXPECT_TRUE(logged.contains(key)) << name << " logs " << key << ", TRL does not";
        EXPECT_EQ(logged.contains("kl"), o.beta != 0.0) << name;
        EXPECT_EQ(ours.count("kl"), logged.contains("kl") ? 1u : 0u) << name;
        if (o.beta != 0.0) {
            EXPECT_NEAR(ours["kl"], logged["kl"].get<double>(), 1e-5 * std::abs(logged["kl"].get<double>()) + 1e-7) << name;
        }
    }
}
