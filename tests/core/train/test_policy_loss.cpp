// Grove's loss and gradient norm against TRL's GRPOTrainer._compute_loss on the same tiny checkpoint
// and fixed rollouts (tests/core/train/trl_loss_reference.py), for every reduction and for
// epsilon_high, delta, beta > 0, sequence-level importance sampling, a second (off-policy) pass,
// multi-turn rows whose environment tokens are context only (TRL's env_mask), every objective plugin,
// the sampler-mismatch correction in its four modes, the top-entropy and off-policy masks and the
// entropy bonus, static and adaptive; three reductions on a tiny Gemma 3, whose gradients pass
// through its (1 + w) norms, scaled embeddings, GeGLU and sliding layer; and tiny Qwen3-MoE,
// Mixtral, OLMoE and Qwen2-MoE policies, whose loss takes TRL's load-balancing term (logged as aux_loss).
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
#include "model/autocast.hpp"
#include "model/tensor_io.hpp"
#include "train/policy_step.hpp"
#include "train/sft_loss.hpp"
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

namespace {
std::optional<double> optional_number(const nlohmann::json& c, const char* key) {
    return c.contains(key) && !c[key].is_null() ? std::optional<double>(c[key].get<double>()) : std::nullopt;
}

grove::PolicyLossOptions loss_options(const nlohmann::json& c) {
    grove::PolicyLossOptions o;
    o.beta = c.value("beta", 0.0);
    o.epsilon = 0.2;
    o.epsilon_high = optional_number(c, "epsilon_high").value_or(0.2);
    o.delta = optional_number(c, "delta");
    o.importance_sampling_level =
        grove::importance_sampling_level_from_name(c.value("importance_sampling_level", std::string("token")));
    o.use_bias_correction_kl = c.value("use_bias_correction_kl", false);
    o.top_entropy_quantile = c.value("top_entropy_quantile", 1.0);
    o.off_policy_mask_threshold = optional_number(c, "off_policy_mask_threshold");
    o.entropy_bonus = c.value("entropy_coef", 0.0) != 0.0 || c.value("use_adaptive_entropy", false);
    return o;
}

grove::LossSection entropy_section(const nlohmann::json& c) {
    grove::LossSection l;
    l.entropy_coef = c.value("entropy_coef", 0.0);
    l.use_adaptive_entropy = c.value("use_adaptive_entropy", false);
    l.entropy_target = c.value("entropy_target", 0.2);
    return l;
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
        auto model = grove::Model::load(kDir + "/" + c.value("model", std::string("model")));  // model: the Llama
        model->set_base_trainable(true);
        at::Tensor mask = full_mask.clone();
        if (c.contains("masked_row")) mask[c["masked_row"].get<int64_t>()].zero_();
        // an environment's tokens stay in the forward pass (r["completion_mask"] above) but leave the loss
        if (c.value("env_mask", false)) mask *= r["env_mask"].to(at::kFloat);

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

        grove::PolicyLossOptions o = loss_options(c);
        grove::PolicyLossInputs inputs;
        if (c.value("off_policy", false)) inputs.old_logp = r["old_logps"];
        if (c.value("with_ref", false)) inputs.ref_logp = r["ref_logps"];
        if (c.value("with_sampling", false) || c.contains("sampling")) inputs.sampling_logp = r["sampling_logps"];
        if (c.contains("sampling")) {  // the correction's ratio, against the one TRL computed
            inputs.sampling_ratio = grove::importance_sampling_ratio(
                *inputs.old_logp, *inputs.sampling_logp, mask, grove::sampling_correction_from_name(c["sampling"]),
                optional_number(c, "clip_min"), optional_number(c, "clip_max"));
            std::vector<float> flat;
            for (const auto& row : c["sampling_ratio"])
                for (float v : row.get<std::vector<float>>()) flat.push_back(v);
            const at::Tensor expected = at::tensor(flat).view(inputs.sampling_ratio->sizes());
            EXPECT_LT((*inputs.sampling_ratio - expected).abs().max().item<double>(), 1e-6) << name;
        }
        inputs.advantages = r["advantages"];
        inputs.mask = mask;
        inputs.weights = at::from_blob(weights.data(), {B, T}, at::kFloat).clone();
        const grove::LossSection entropy_options = entropy_section(c);
        grove::EntropyControl control{entropy_options.entropy_coef};
        grove::PolicyLossResult result;
        at::Tensor entropy;
        // a mixture of experts: TRL's coefficient of the routers' load-balancing loss (0: TRL adds none)
        const double aux_coef = c.value("router_aux_loss_coef", 0.0);
        std::optional<double> aux_loss;
        for (int call = 0; call < c.value("calls", 1); ++call) {  // adaptive entropy: the coefficient moves between calls
            for (auto& p : model->trainable_parameters())
                if (p.grad().defined()) p.mutable_grad().zero_();
            grove::RouterLoad routing;
            inputs.logp = grove::completion_logprobs(*model, r["prompt_ids"], r["prompt_mask"], r["completion_ids"],
                                                     r["completion_mask"], spec["temperature"].get<double>(), &entropy,
                                                     o.entropy_bonus, aux_coef != 0 ? &routing : nullptr);
            inputs.entropy = entropy;
            o.entropy_coef = control.applied(entropy_options);
            result = grove::policy_loss(plugin(c.value("objective", std::string("clipped")), GROVE_PLUGIN_KIND_OBJECTIVE),
                                        inputs, o);
            if (aux_coef != 0) aux_loss = grove::add_router_aux_loss(result, routing, aux_coef, 1);
            result.loss.backward();
            control.finish_step(result.trained_entropy_sum / std::max(result.trained_token_count, 1.0), entropy_options);
        }
        if (name == "grpo") {  // TRL zeroes masked positions' log-probs; compare the completion tokens
            EXPECT_LT(((inputs.logp.detach() - r["trl_logps"]).abs() * mask).max().item<double>(), 1e-5);
        }
        if (c.contains("entropy_coef_after")) {
            EXPECT_NEAR(control.coef, c["entropy_coef_after"].get<double>(), 1e-12) << name;
        }
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
        const double entropy_sum = (entropy.detach() * mask).sum().item<double>();
        grove::StepMetrics one_micro_batch;
        one_micro_batch.add({result.metrics, entropy_sum, mask.sum().item<double>(), aux_loss});
        auto ours = one_micro_batch.finish(nullptr);
        const auto& logged = c["logged"];
        for (const auto& [key, value] : logged.items()) {  // TRL's keys for this loss type, and no others
            ASSERT_TRUE(ours.count(key)) << name << " " << key;
            EXPECT_NEAR(ours[key], value.get<double>(), 1e-5 * std::abs(value.get<double>()) + 1e-7) << name << " " << key;
        }
        for (const auto& [key, value] : ours) EXPECT_TRUE(logged.contains(key)) << name << " logs " << key << ", TRL does not";
        EXPECT_EQ(logged.contains("kl"), o.beta != 0.0) << name;
        EXPECT_EQ(ours.count("kl"), logged.contains("kl") ? 1u : 0u) << name;
    }
}

namespace {
// tests/core/train/trl_loss_reference.py's SFT cases, and the token rows they train on
nlohmann::json sft_reference() {
    std::ifstream in(kDir + "/sft_cases.json");
    return nlohmann::json::parse(in);
}
// A case's SFTConfig.loss_type and router_aux_loss_coef
grove::SftObjective objective_of(const nlohmann::json& c) {
    return {c.value("loss_type", std::string("nll")) == "dft", c["router_aux_loss_coef"].get<double>()};
}
std::vector<grove::SftExample> sft_reference_rows(const nlohmann::json& spec) {
    std::vector<grove::SftExample> examples;
    for (const auto& row : spec["rows"])
        examples.push_back({row["ids"].get<std::vector<int64_t>>(), row["trained"].get<std::vector<uint8_t>>()});
    return examples;
}
}  // namespace

// grove sft's optimizer step against TRL 1.16's SFTTrainer (trl_loss_reference.py): the
// cross-entropy of the trained tokens on the dense Llama (and its loss_type = "dft", whole and
// accumulated; NEFTune's noise padded, accumulated and packed, and on Gemma 3 and Gemma 2, whose
// embeddings scale after the noise), and on mixtures of experts with the
// load-balancing term TRL adds (the config's coefficient, and 0.5), each an optimizer step through
// Trainer.training_step, of one micro-batch or two (gradient accumulation): loss, gradient norm, and
// the logged aux_loss, entropy and mean_token_accuracy.
TEST(SftLoss, MatchesTrlSftComputeLoss) {
    const auto spec = sft_reference();
    const std::vector<grove::SftExample> examples = sft_reference_rows(spec);
    for (const auto& c : spec["cases"]) {
        const std::string name = c["name"];
        auto model = grove::Model::load(kDir + "/" + c["model"].get<std::string>(), "cpu", c["dtype"].get<std::string>());
        model->set_base_trainable(true);
        // packed rows, as grove sft packs them: sequences end to end, each one's first token out of
        // the trained count (TRL's padding-free collator masks it)
        std::vector<grove::SftExample> packed;
        for (const auto& row : c.value("packed", nlohmann::json::array())) {
            grove::SftExample& e = packed.emplace_back();
            for (size_t i : row.get<std::vector<size_t>>()) {
                e.ids.insert(e.ids.end(), examples[i].ids.begin(), examples[i].ids.end());
                e.trained.insert(e.trained.end(), examples[i].trained.begin(), examples[i].trained.end());
                e.trained[e.trained.size() - examples[i].ids.size()] = 0;
                e.sequence_lengths.push_back(int64_t(examples[i].ids.size()));
            }
        }
        // one optimizer step, as run_sft takes it: its micro-batches' losses and gradients add up;
        // under bf16 autocast when TRL ran with bf16=True (train.mixed_precision = "bf16")
        // NEFTune draws its noise from torch's generator, seeded as the reference seeded it
        const grove::SftNoise noise{c["neftune_noise_alpha"].get<double>(), !packed.empty()};
        at::manual_seed(c["seed"].get<uint64_t>());
        const grove::SftStepMetrics step = [&] {
            grove::AutocastScope autocast(c["autocast"].get<bool>() ? std::optional(at::kCPU) : std::nullopt);
            return grove::sft_backward(*model, packed.empty() ? examples : packed,
                                       c["micro_batches"].get<std::vector<std::vector<int64_t>>>(), objective_of(c), noise, 1);
        }();
        double squared = 0;
        for (const auto& p : model->trainable_parameters())
            if (p.grad().defined()) squared += p.grad().pow(2).sum().item<double>();
        const double trl_loss = c["loss"], trl_norm = c["grad_norm"];
        // bf16: the same products rounded in the same places; TRL's norm is itself rounded to bf16.
        // Autocast: products of other shapes (Grove packs the rows, TRL pads them) round to bf16 a
        // little differently, 1.4e-4 apart in the norm; the loss tells autocast apart (float32's is
        // 1.1e-5 from TRL's autocast loss)
        const bool bf16 = c["dtype"] == "bfloat16", autocast = c["autocast"];
        EXPECT_NEAR(step.loss, trl_loss, (bf16 ? 2e-5 : autocast ? 2e-6 : 1e-5) * std::abs(trl_loss)) << name;
        EXPECT_NEAR(std::sqrt(squared), trl_norm, (bf16 ? 1e-2 : autocast ? 5e-4 : 1e-5) * trl_norm) << name;
        ASSERT_EQ(step.aux_loss.has_value(), !c["aux_loss"].is_null()) << name;
        if (step.aux_loss) EXPECT_NEAR(*step.aux_loss, c["aux_loss"].get<double>(), 1e-6) << name;
        // the metrics TRL logs besides the loss
        EXPECT_NEAR(step.entropy, c["entropy"].get<double>(), 1e-5) << name;
        EXPECT_NEAR(step.mean_token_accuracy, c["mean_token_accuracy"].get<double>(), 1e-6) << name;
    }
}

// grove sft's evaluation (train.eval_steps) against TRL's Trainer.evaluate on the same rows in
// batches of 3 and 1 (the dense Llama with either loss_type, a mixture of experts): eval_loss weighs each batch's mean loss by its size; entropy, accuracy and a
// mixture of experts' aux_loss are the batches' means.
TEST(SftLoss, EvaluationMatchesTrlEvaluate) {
    const auto spec = sft_reference();
    const std::vector<grove::SftExample> examples = sft_reference_rows(spec);
    ASSERT_EQ(spec["evaluations"].size(), 3u);
    for (const auto& c : spec["evaluations"]) {
        const std::string name = c["name"];
        auto model = grove::Model::load(kDir + "/" + c["model"].get<std::string>(), "cpu", "float32");
        const auto figures = grove::sft_evaluate(*model, examples, c["batch_size"], objective_of(c));
        for (const char* key : {"eval_loss", "eval_entropy", "eval_mean_token_accuracy"})
            EXPECT_NEAR(figures.at(key), c[key].get<double>(), 1e-5) << name << " " << key;
        ASSERT_EQ(figures.count("eval_aux_loss"), c.contains("eval_aux_loss") ? 1u : 0u) << name;
        if (c.contains("eval_aux_loss"))
            EXPECT_NEAR(figures.at("eval_aux_loss"), c["eval_aux_loss"].get<double>(), 1e-6) << name;
    }
}
