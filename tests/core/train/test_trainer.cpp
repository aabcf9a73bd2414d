// The training loop on a tiny checkpoint (tests/core/model/make_tiny_models.py): gradient-accumulation
// equivalence, the on-policy zero loss, no reference model at beta = 0, LoRA (frozen base, PEFT
// loading), exact resume, and a reward that actually improves.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <sys/wait.h>
#include <cstdlib>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>
#include <nlohmann/json.hpp>

#include "grove/error.hpp"
#include "grove/evaluation.hpp"
#include "grove/manifest.hpp"
#include "grove/model.hpp"
#include "grove/optimizer.hpp"
#include "grove/policy_loss.hpp"
#include "grove/safetensors.hpp"
#include "model/autocast.hpp"
#include "model/tensor_io.hpp"
#include "grove/trainer.hpp"
#include "grove/adapter_checkpoint.hpp"
#include "grove/plugin_host.hpp"
#include "grove/tokenizer.hpp"
#include "grove/reward_model.hpp"
#include "grove/tensorboard.hpp"
#include "grove/tokenizer.hpp"
#include "plugin_test_support.hpp"

namespace fs = std::filesystem;
using grove::test::checkpoint_steps_in;

namespace {

const std::string kModel = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/llama_gqa";
// ties lm_head to embed_tokens, with a tokenizer
const std::string kTiedModel = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/qwen3_qknorm";
const std::string kLowIds = GROVE_TEST_LOW_IDS_PLUGIN;
const std::string kRankOne = GROVE_TEST_RANK_ONE_PLUGIN;

// A run folder with 12 prompts and a manifest; `extra` is appended (later keys win via --set).
grove::Manifest manifest(const std::string& name, const std::vector<std::string>& overrides, const std::string& rewards = "",
                         const std::string& extra_sections = "") {
    std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/runs/" + name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    {
        std::ofstream prompts(dir + "/prompts.jsonl");
        for (int i = 0; i < 12; ++i)
            prompts << nlohmann::json({{"prompt", "What is " + std::to_string(i) + " + 2?"}}).dump() << "\n";
    }
    std::string text =
        "[model]\npath = \"" + kModel +
        "\"\nchat_template = \"none\"\n"
        "[data]\nsource = \"prompts.jsonl\"\nshuffle = true\n"
        "[generation]\nnum_generations = 2\nmax_completion_length = 6\n" +
        (rewards.empty() ? "[[rewards]]\nplugin = \"format\"\nconfig = { pattern = \"[aeiou]\", full_match = false }\n"
                         : rewards) +
        "[train]\nlearning_rate = 0.05\nseed = 3\n"
        "[output]\ndir = \"out\"\nsave_steps = 1000\n"
        "[logging]\nlogging_steps = 1\n" +
        extra_sections;
    std::ofstream(dir + "/grove.toml") << text;
    return grove::Manifest::load(dir + "/grove.toml", overrides);
}

grove::TrainerOptions fresh() {
    grove::TrainerOptions o;
    o.overwrite = true;
    return o;
}

// A run of `manifest` that trains `steps` steps and saves a checkpoint, then the trainer that resumes
// it from that checkpoint (the resume tests' first half).
std::unique_ptr<grove::Trainer> resumed_after(const grove::Manifest& m, int steps) {
    {
        grove::Trainer first(m, fresh());
        for (int i = 0; i < steps; ++i) first.step();
        first.save_checkpoint();
    }
    grove::TrainerOptions resume;
    resume.resume = "latest";
    return std::make_unique<grove::Trainer>(m, resume);
}

std::map<std::string, at::Tensor> snapshot(grove::Model& model) {
    std::map<std::string, at::Tensor> out;
    for (const auto& [name, t] : model.named_parameters()) out[name] = t.detach().clone();
    for (const auto& [name, t] : model.adapter_parameters()) out[name] = t.detach().clone();
    return out;
}

double max_difference(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
    double worst = 0;
    for (const auto& [name, t] : a) worst = std::max(worst, (t - b.at(name)).abs().max().item<double>());
    return worst;
}

// `name`_straight trains 4 steps; `name`_resumed is resumed after 2 (resumed_after). The resumed
// steps log the straight run's `keys` and end on its weights. Both trainers and the straight run's
// metrics, for further checks.
struct StraightAndResumed {
    std::unique_ptr<grove::Trainer> straight, resumed;
    std::vector<std::map<std::string, double>> straight_metrics;
};
StraightAndResumed expect_resume_continues_exactly(const std::string& name, const std::vector<std::string>& settings,
                                                   const std::vector<const char*>& keys) {
    auto straight = std::make_unique<grove::Trainer>(manifest(name + "_straight", settings), fresh());
    std::vector<std::map<std::string, double>> expected;
    for (int i = 0; i < 4; ++i) expected.push_back(straight->step());
    auto resumed = resumed_after(manifest(name + "_resumed", settings), 2);
    for (int i = 2; i < 4; ++i) {
        auto got = resumed->step();
        for (const char* key : keys) EXPECT_DOUBLE_EQ(got[key], expected[size_t(i)][key]) << key << " at step " << i;
    }
    EXPECT_EQ(max_difference(snapshot(resumed->model()), snapshot(straight->model())), 0.0);
    return {std::move(straight), std::move(resumed), std::move(expected)};
}

// [adapter] modules_to_save (and ensure_weight_tying) as the manifest gives them
grove::BesideAdapter modules_to_save(std::vector<std::string> modules, bool ensure_weight_tying = false) {
    grove::BesideAdapter beside;
    beside.modules_to_save = std::move(modules);
    beside.ensure_weight_tying = ensure_weight_tying;
    return beside;
}

// Each trained tensor's optimizer step count, as a checkpoint folder's trainer_state.json keeps it
std::vector<int64_t> saved_tensor_steps(const std::string& checkpoint) {
    return nlohmann::json::parse(std::ifstream(checkpoint + "/trainer_state.json"))["optimizer_tensor_steps"]
        .get<std::vector<int64_t>>();
}

}  // namespace

// (batch 4, accumulation 1) and (batch 2, accumulation 2) see the same generation batch and must
// give the same update. adam_epsilon = 1 makes AdamW nearly SGD here: the test is about the
// accumulated gradient, and Adam's normalisation would magnify float noise on near-zero gradients.
TEST(Trainer, GradientAccumulationGivesTheSameUpdate) {
    for (const char* reduction : {"grpo", "dr_grpo", "dapo"}) {
        std::vector<std::string> common{std::string("reduction.plugin=\"") + reduction + "\"", "train.adam_epsilon=1.0",
                                        "train.max_steps=1"};
        auto one = common, two = common;
        one.insert(one.end(), {"train.per_device_train_batch_size=4", "train.gradient_accumulation_steps=1"});
        two.insert(two.end(), {"train.per_device_train_batch_size=2", "train.gradient_accumulation_steps=2"});
        grove::Trainer a(manifest(std::string("ga1_") + reduction, one), fresh());
        grove::Trainer b(manifest(std::string("ga2_") + reduction, two), fresh());
        auto before = snapshot(a.model());
        auto ma = a.step(), mb = b.step();
        EXPECT_DOUBLE_EQ(ma["reward"], mb["reward"]) << reduction;  // same completions
        EXPECT_GT(ma["grad_norm"], 0.0) << reduction;
        EXPECT_NEAR(ma["grad_norm"], mb["grad_norm"], 1e-6 * ma["grad_norm"]) << reduction;
        EXPECT_LT(max_difference(snapshot(a.model()), snapshot(b.model())), 1e-6) << reduction;
        EXPECT_GT(max_difference(snapshot(a.model()), before), 1e-5) << reduction << ": the update is not empty";
    }
}

TEST(Trainer, OnPolicyGrpoLossIsZeroWhileGradientsFlow) {
    grove::Trainer t(
        manifest("zero_loss", {"reduction.plugin=\"grpo\"", "train.per_device_train_batch_size=8", "train.max_steps=4"}),
        fresh());
    bool some_gradient = false;
    for (int i = 0; i < 4; ++i) {
        auto m = t.step();
        EXPECT_LT(std::abs(m["loss"]), 1e-6) << "step " << i;
        if (m["frac_reward_zero_std"] < 1.0) {
            EXPECT_GT(m["grad_norm"], 0.0) << "step " << i;
            some_gradient = true;
        }
    }
    EXPECT_TRUE(some_gradient) << "no group with reward variance in 4 steps: the test proves nothing";
}

TEST(Trainer, BetaZeroLoadsNoReferenceModelAndLogsNoKl) {
    grove::Trainer zero(manifest("beta0", {"train.max_steps=1"}), fresh());
    EXPECT_FALSE(zero.has_reference_model());
    EXPECT_EQ(zero.step().count("kl"), 0u);
    grove::Trainer with_kl(manifest("beta1", {"train.max_steps=2", "loss.beta=0.1"}), fresh());
    EXPECT_TRUE(with_kl.has_reference_model());
    auto first = with_kl.step();
    ASSERT_EQ(first.count("kl"), 1u);
    EXPECT_NEAR(first["kl"], 0.0, 1e-6);  // policy == reference before the first update
    EXPECT_GT(with_kl.step()["kl"], 0.0);
}

// TRL's `entropy`: the masked mean of each position's entropy of softmax(logits / temperature).
// At a very high temperature every distribution is nearly uniform, so it must approach log(vocab).
TEST(Trainer, EntropyIsThatOfTheTemperedDistribution) {
    double vocab = double(grove::Model::load(kModel, "cpu", "float32")->config().vocab_size);
    grove::Trainer hot(manifest("entropy-hot", {"train.max_steps=1", "generation.temperature=1000"}), fresh());
    double uniform = hot.step()["entropy"];
    EXPECT_NEAR(uniform, std::log(vocab), 1e-3 * std::log(vocab));
    grove::Trainer cold(manifest("entropy-cold", {"train.max_steps=1", "generation.temperature=0.05"}), fresh());
    double sharper = cold.step()["entropy"];
    EXPECT_GT(sharper, 0.0);
    EXPECT_LT(sharper, uniform - 0.1) << "a lower temperature must give a lower entropy";
}

TEST(Trainer, LoraFreezesTheBaseTrainsEveryAdapterWeightAndLoadsInPeft) {
    grove::Trainer t(manifest("lora", {"adapter.plugin=\"lora\"",
                                       "adapter.config={ r = 4, alpha = 8.0, target_modules = [\"q_proj\", \"v_proj\"] }",
                                       "train.max_steps=2", "train.per_device_train_batch_size=8"}),
                     fresh());
    EXPECT_FALSE(t.has_reference_model());
    std::map<std::string, at::Tensor> base_before, adapter_before;
    for (const auto& [n, p] : t.model().named_parameters()) base_before[n] = p.detach().clone();
    for (const auto& [n, p] : t.model().adapter_parameters()) adapter_before[n] = p.detach().clone();
    ASSERT_EQ(adapter_before.size(), 2u * 2u * 2u);  // 2 layers x (q, v) x (A, B)
    t.step();
    t.step();  // A moves from the second step on (its gradient is zero while B is zero)
    for (const auto& [n, p] : t.model().named_parameters()) EXPECT_TRUE(at::equal(p, base_before[n])) << n << " changed";
    for (const auto& [n, p] : t.model().adapter_parameters())
        EXPECT_FALSE(at::equal(p, adapter_before[n])) << n << " did not move";
    std::string checkpoint = t.save_checkpoint();
    EXPECT_TRUE(fs::exists(checkpoint + "/adapter_model.safetensors"));
    // Grove's logits with the adapter, then PEFT's from the saved folder
    at::Tensor ids = at::arange(5, 17, at::kLong).unsqueeze(0);
    at::Tensor logits;
    {
        at::NoGradGuard no_grad;
        logits = t.model().forward(ids, at::ones_like(ids), at::arange(0, 12, at::kLong).unsqueeze(0));
    }
    std::string file = checkpoint + "/grove_logits.safetensors";
    grove::save_tensors(file, {{"input_ids", ids}, {"logits", logits.contiguous()}});
    std::string command = std::string(GROVE_PYTHON) + " " + GROVE_TEST_SOURCE_DIR + "/tests/core/train/check_peft.py " +
                          checkpoint + " " + kModel + " " + file;
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    // and the merged export equals the adapted model
    std::string merged = checkpoint + "-merged";
    grove::export_merged(checkpoint, kModel, merged);
    auto merged_model = grove::Model::load(merged);
    at::NoGradGuard no_grad;
    at::Tensor merged_logits = merged_model->forward(ids, at::ones_like(ids), at::arange(0, 12, at::kLong).unsqueeze(0));
    EXPECT_LT((merged_logits - logits).abs().max().item<double>(), 1e-4);
    // a record that disagrees with the weights (another rank) is an input error naming the tensor,
    // raised after the adapter attached: nothing may crash while unwinding
    std::ofstream(checkpoint + "/grove_adapter.json")
        << R"({"plugin": "lora", "config": "alpha = 8.0\nr = 5\ntarget_modules = ['q_proj', 'v_proj']"})";
    try {
        grove::export_merged(checkpoint, kModel, checkpoint + "-merged-wrong");
        ADD_FAILURE() << "a rank-5 record merged rank-4 weights";
    } catch (const grove::Error& e) {
        EXPECT_EQ(e.kind(), grove::ErrorKind::input);
        EXPECT_NE(std::string(e.what()).find("lora_A.weight\" has shape [4, "), std::string::npos) << e.what();
    }
}

namespace {
// A run of the tiny checkpoint `name` that trains LoRA (r 4) on `targets` (a TOML list).
grove::Manifest lora_run(const std::string& name, const std::string& targets) {
    return manifest(name + "_lora",
                    {"model.path=\"" + std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/" + name + "\"",
                     "adapter.plugin=\"lora\"", "adapter.config={ r = 4, alpha = 8.0, target_modules = " + targets + " }",
                     "train.max_steps=2", "train.per_device_train_batch_size=8"});
}

// Two steps move the adapter, and PEFT loads the saved checkpoint onto transformers' model of the
// tiny checkpoint `name` with Grove's logits over 12 tokens (check_peft.py). Returns the checkpoint.
std::string expect_trains_and_loads_in_peft(grove::Trainer& t, const std::string& name) {
    const auto before = snapshot(t.model());
    t.step();
    t.step();
    EXPECT_GT(max_difference(snapshot(t.model()), before), 0.0) << "the adapter trained";
    const std::string checkpoint = t.save_checkpoint();
    at::Tensor ids = at::arange(5, 17, at::kLong).unsqueeze(0);
    at::Tensor logits;
    {
        at::NoGradGuard no_grad;
        logits = t.model().forward(ids, at::ones_like(ids), at::arange(0, 12, at::kLong).unsqueeze(0));
    }
    const std::string file = checkpoint + "/grove_logits.safetensors";
    grove::save_tensors(file, {{"input_ids", ids}, {"logits", logits.contiguous()}});
    const std::string command = std::string(GROVE_PYTHON) + " " + GROVE_TEST_SOURCE_DIR + "/tests/core/train/check_peft.py " +
                                checkpoint + " " + GROVE_TEST_BINARY_DIR + "/models/tiny/" + name + " " + file;
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    return checkpoint;
}

// LoRA on all seven linear layers of the 2-layer tiny checkpoint `name` trains, and PEFT loads it.
void expect_lora_on_every_linear_loads_in_peft(const std::string& name) {
    grove::Trainer t(
        lora_run(name, "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]"), fresh());
    EXPECT_EQ(t.model().adapter_parameters().size(), 2u * 7u * 2u);  // 2 layers x 7 linears x (A, B)
    expect_trains_and_loads_in_peft(t, name);
}
}  // namespace

// Phi-3 keeps q, k, v in one qkv_proj and gate, up in one gate_up_proj: LoRA attaches to those under
// PEFT's names, so PEFT loads the adapter on transformers' Phi3ForCausalLM with Grove's logits, and
// naming Llama's modules is refused with the model's own names.
TEST(Trainer, Phi3LoraOnTheFusedProjectionsLoadsInPeft) {
    grove::Trainer t(lora_run("phi3_longrope", "[\"qkv_proj\", \"gate_up_proj\"]"), fresh());
    std::set<std::string> adapted;
    for (const auto& [name, p] : t.model().adapter_parameters()) adapted.insert(name);
    EXPECT_EQ(adapted.size(), 2u * 2u * 2u);  // 2 layers x (qkv, gate_up) x (A, B)
    EXPECT_TRUE(adapted.count("base_model.model.model.layers.1.self_attn.qkv_proj.lora_A.weight"));
    EXPECT_TRUE(adapted.count("base_model.model.model.layers.0.mlp.gate_up_proj.lora_B.weight"));
    expect_trains_and_loads_in_peft(t, "phi3_longrope");
    // Llama's names match nothing here: the error lists the model's modules
    const auto message = grove::test::error_message(
        [&] { grove::Trainer wrong(lora_run("phi3_longrope", "[\"q_proj\", \"v_proj\"]"), fresh()); });
    EXPECT_CONTAINS(message, "left no trainable parameter");
    EXPECT_CONTAINS(message, "(qkv_proj, o_proj, gate_up_proj, down_proj)");
}

// SmolLM3 (a NoPE layer, a sliding window shorter than every sequence here) trains LoRA and PEFT
// loads the adapter onto transformers' SmolLM3ForCausalLM with Grove's logits.
TEST(Trainer, SmolLM3LoraWithAWindowAndANopeLayerLoadsInPeft) {
    grove::Trainer t(lora_run("smollm3_nope", "[\"q_proj\", \"v_proj\"]"), fresh());
    EXPECT_EQ(t.model().adapter_parameters().size(), 2u * 2u * 2u);  // 2 layers x (q, v) x (A, B)
    expect_trains_and_loads_in_peft(t, "smollm3_nope");
}

// Gemma 3 (four norms per layer, GeGLU, a sliding and a global layer) trains LoRA on every linear
// layer and PEFT loads the adapter onto transformers' Gemma3ForCausalLM with Grove's logits.
TEST(Trainer, Gemma3LoraOnEveryLinearLoadsInPeft) { expect_lora_on_every_linear_loads_in_peft("gemma3_window"); }

// OLMo 2 (norms after the attention and the MLP, q and k normed over the whole projection) trains
// LoRA on every linear layer and PEFT loads the adapter onto transformers' Olmo2ForCausalLM with
// Grove's logits.
TEST(Trainer, Olmo2LoraOnEveryLinearLoadsInPeft) { expect_lora_on_every_linear_loads_in_peft("olmo2_post_norm"); }

// Qwen3-MoE trains LoRA on its router ("gate", PEFT's suffix match), its experts' and its dense
// layer's projections ("gate_proj" names both), with TRL's load-balancing loss in each step (logged
// as aux_loss), and PEFT loads the adapter onto transformers' Qwen3MoeForCausalLM with Grove's logits.
TEST(Trainer, Qwen3MoeLoraOnTheRouterAndExpertsLoadsInPeft) {
    grove::Trainer t(lora_run("qwen3_moe_experts", "[\"q_proj\", \"gate\", \"gate_proj\", \"up_proj\", \"down_proj\"]"),
                     fresh());
    std::set<std::string> adapted;
    for (const auto& [name, p] : t.model().adapter_parameters()) adapted.insert(name);
    EXPECT_EQ(adapted.size(), 2u * (2u + 8u * 3u + 4u));  // layer 0: q, router, 8 experts x 3; layer 1: q, gate, up, down
    EXPECT_TRUE(adapted.count("base_model.model.model.layers.0.mlp.gate.lora_A.weight"));
    EXPECT_TRUE(adapted.count("base_model.model.model.layers.0.mlp.experts.7.down_proj.lora_B.weight"));
    EXPECT_TRUE(adapted.count("base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight"));
    const auto metrics = t.step();
    ASSERT_TRUE(metrics.count("aux_loss"));
    // K = 2 experts per token: 2 when the routers spread the load evenly, more when they concentrate it
    EXPECT_GT(metrics.at("aux_loss"), 1.9);
    EXPECT_LT(metrics.at("aux_loss"), 8.0);
    expect_trains_and_loads_in_peft(t, "qwen3_moe_experts");
}

// Qwen2-MoE's shared expert and its gate take LoRA under PEFT's names (a dense layer 0, a sparse
// layer 1), and PEFT loads the adapter onto transformers' Qwen2MoeForCausalLM with Grove's logits.
TEST(Trainer, Qwen2MoeLoraOnTheSharedExpertLoadsInPeft) {
    grove::Trainer t(lora_run("qwen2_moe_shared", "[\"gate\", \"shared_expert_gate\", \"gate_proj\", \"down_proj\"]"), fresh());
    std::set<std::string> adapted;
    for (const auto& [name, p] : t.model().adapter_parameters()) adapted.insert(name);
    EXPECT_EQ(adapted.size(), 2u * (2u + 1u + 1u + 4u * 2u + 2u));  // layer 0: 2; layer 1: router, gate, experts, shared
    EXPECT_TRUE(adapted.count("base_model.model.model.layers.1.mlp.shared_expert_gate.lora_A.weight"));
    EXPECT_TRUE(adapted.count("base_model.model.model.layers.1.mlp.shared_expert.down_proj.lora_B.weight"));
    EXPECT_TRUE(adapted.count("base_model.model.model.layers.1.mlp.gate.lora_B.weight"));
    expect_trains_and_loads_in_peft(t, "qwen2_moe_shared");
}

namespace {
// Two steps of the tiny llama with LoRA configured by `adapter_config` (a TOML table), then
// check_peft_training.py loads the checkpoint in PEFT, which must create the same tensors, give
// Grove's logits and gradients, decay the tensors Grove decays and merge to Grove's merged export.
// Returns the checkpoint folder.
std::string expect_peft_trains_alike(const std::string& tag, const std::string& adapter_config,
                                     const std::string& modules_to_save = "[]", const std::string& base = kModel,
                                     const std::vector<std::string>& settings = {}) {
    std::vector<std::string> overrides{"model.path=\"" + base + "\"",
                                       "adapter.plugin=\"lora\"",
                                       "adapter.config=" + adapter_config,
                                       "adapter.modules_to_save=" + modules_to_save,
                                       "train.max_steps=2",
                                       "train.per_device_train_batch_size=8"};
    overrides.insert(overrides.end(), settings.begin(), settings.end());
    grove::Trainer t(manifest("peft_" + tag, overrides), fresh());
    t.step();
    t.step();  // B moves from the first step, A and the magnitudes from the second
    const std::string checkpoint = t.save_checkpoint();
    std::vector<std::pair<std::string, at::Tensor>> file;
    at::Tensor ids = at::arange(5, 17, at::kLong).unsqueeze(0);
    file.emplace_back("input_ids", ids);
    const auto trainable = t.model().trainable_named_parameters();
    for (const auto& [name, p] : trainable) p.mutable_grad() = at::Tensor();
    at::Tensor logits = t.model().forward(ids, at::ones_like(ids), at::arange(0, 12, at::kLong).unsqueeze(0));
    at::cross_entropy_loss(logits[0].slice(0, 0, 11), ids[0].slice(0, 1, 12)).backward();
    file.emplace_back("logits", logits.detach().contiguous());
    for (const auto& [name, p] : trainable) {
        if (!p.grad().defined()) {
            ADD_FAILURE() << name << " has no gradient";
            return checkpoint;
        }
        file.emplace_back("grad." + name, p.grad().contiguous());
        file.emplace_back("decays." + name, at::scalar_tensor(grove::weight_decay_applies(name) ? 1.0f : 0.0f));
    }
    grove::save_tensors(checkpoint + "/grove_training.safetensors", file);
    const std::string merged = checkpoint + "-merged";
    grove::export_merged(checkpoint, base, merged);
    const std::string command = std::string(GROVE_PYTHON) + " " + GROVE_TEST_SOURCE_DIR +
                                "/tests/core/train/check_peft_training.py " + checkpoint + " " + base + " " + checkpoint +
                                "/grove_training.safetensors " + merged;
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    return checkpoint;
}
}  // namespace

// DoRA (use_dora): a magnitude per output row, saved as PEFT's lora_magnitude_vector, trained as
// PEFT trains it (its row norm held constant in backward) and merged as PEFT merges it; here with
// another rank and alpha for some layers (rank_pattern, alpha_pattern) and the gaussian init.
TEST(Trainer, DoraWithRankAndAlphaPatternsTrainsAndMergesAsPeft) {
    expect_peft_trains_alike("dora",
                             R"({ r = 4, alpha = 8.0, use_dora = true, init_lora_weights = "gaussian", )"
                             R"(target_modules = ["q_proj", "v_proj", "mlp.down_proj"], rank_pattern = { "v_proj" = 2 }, )"
                             R"(alpha_pattern = { "model.layers.1.mlp.down_proj" = 3.0 } })");
}

// PEFT's choice of layers: a module named by its ending after a dot, layers_to_transform,
// exclude_modules; rsLoRA and an adapter that starts non-zero (init_lora_weights = "false").
TEST(Trainer, LoraLayerSelectionAndInitsAreThoseOfPeft) {
    expect_peft_trains_alike("layers", R"({ r = 3, alpha = 6.0, use_rslora = true, init_lora_weights = "false", )"
                                       R"(target_modules = ["self_attn.q_proj", "k_proj", "gate_proj", "up_proj"], )"
                                       R"(layers_to_transform = [1], exclude_modules = ["model.layers.1.mlp.up_proj"] })");
}

// PEFT's target_modules and exclude_modules as one string, a regular expression over the whole
// module name (target_modules_regex, exclude_modules_regex), saved back as strings PEFT reads.
TEST(Trainer, LoraRegexTargetsAreThoseOfPeft) {
    expect_peft_trains_alike("regex", R"({ r = 2, alpha = 4.0, init_lora_weights = "false", )"
                                      R"(target_modules_regex = 'model\.layers\.\d+\.(self_attn\.[qk]_proj|mlp\.up_proj)', )"
                                      R"(exclude_modules_regex = 'model\.layers\.0\.self_attn\.k_proj' })");
}

// PEFT's modules_to_save: lm_head and the final norm train whole beside LoRA, saved under PEFT's
// names; PEFT loads them with Grove's logits and gradients and merges them as Grove does.
TEST(Trainer, ModulesToSaveTrainWholeAsPeftTrainsThem) {
    expect_peft_trains_alike("modules_to_save", R"({ r = 2, target_modules = ["q_proj"] })", R"(["lm_head", "model.norm"])");
}

// A model that ties lm_head to embed_tokens (Qwen2.5-0.5B, SmolLM2) trains the tied matrix whole with
// ensure_weight_tying and "embed_tokens", as PEFT does: one tensor, saved under both names; PEFT's
// tensors, logits, gradients and merge. Without ensure_weight_tying, or with lm_head named, PEFT
// would untie them (or fail): refused, naming the fix.
TEST(Trainer, ModulesToSaveTrainATiedEmbeddingAsPeftWithEnsureWeightTying) {
    const std::string checkpoint =
        expect_peft_trains_alike("tied_embedding", R"({ r = 2, target_modules = ["q_proj"] })", R"(["embed_tokens"])",
                                 kTiedModel, {"adapter.ensure_weight_tying=true"});
    const std::string file = checkpoint + "/adapter_model.safetensors";
    grove::SafetensorsFile saved(file);
    const grove::TensorEntry* head = saved.find("base_model.model.lm_head.weight");
    const grove::TensorEntry* embedding = saved.find("base_model.model.model.embed_tokens.weight");
    ASSERT_TRUE(head && embedding) << "both names, as PEFT saves them";
    EXPECT_TRUE(at::equal(grove::tensor_from_entry(*head, file), grove::tensor_from_entry(*embedding, file)));
    const auto config = nlohmann::json::parse(std::ifstream(checkpoint + "/adapter_config.json"));
    EXPECT_EQ(config.value("ensure_weight_tying", false), true);
    const auto model = grove::Model::load(kTiedModel);
    EXPECT_CONTAINS(grove::test::error_message([&] { model->train_beside_adapter(modules_to_save({"embed_tokens"})); }),
                    "set [adapter] ensure_weight_tying = true and name \"embed_tokens\" without \"lm_head\"");
    EXPECT_CONTAINS(
        grove::test::error_message([&] { model->train_beside_adapter(modules_to_save({"embed_tokens", "lm_head"}, true)); }),
        "\"lm_head\" names lm_head, which this model ties to embed_tokens");
    // PEFT ties only the exact name, and 0.18.1 ties a model that does not tie them too
    EXPECT_CONTAINS(
        grove::test::error_message([&] { model->train_beside_adapter(modules_to_save({"model.embed_tokens"}, true)); }),
        "holds \"embed_tokens\" exactly (it trains an untied copy otherwise)");
    EXPECT_CONTAINS(grove::test::error_message(
                        [&] { grove::Model::load(kModel)->train_beside_adapter(modules_to_save({"embed_tokens"}, true)); }),
                    "which this model does not tie (tie_word_embeddings = false), with ensure_weight_tying");
    EXPECT_NO_THROW(grove::Model::load(kModel)->train_beside_adapter(modules_to_save({"model.norm"}, true)))
        << "PEFT ignores it there";
    EXPECT_CONTAINS(grove::test::error_message([&] {
                        grove::Trainer(manifest("ensure_weight_tying_full", {"adapter.ensure_weight_tying=true"}), fresh());
                    }),
                    "modules_to_save, ensure_weight_tying and trainable_token_indices train weights beside an adapter");
    model->train_beside_adapter(modules_to_save({"embed_tokens"}, true));
    ASSERT_EQ(model->adapter_parameters().size(), 1u) << "one matrix, trained once";
    EXPECT_EQ(model->saved_adapter_tensors().size(), 2u);
    // the reference pass computes the embedding and the head with the original matrix
    const at::Tensor ids = at::arange(5, 17, at::kLong).unsqueeze(0), positions = at::arange(0, 12, at::kLong).unsqueeze(0);
    auto logits = [&] {
        at::NoGradGuard no_grad;
        return model->forward(ids, at::ones_like(ids), positions);
    };
    const at::Tensor original = logits();
    {
        at::NoGradGuard no_grad;
        model->adapter_parameters().front().second.add_(0.5);
    }
    EXPECT_FALSE(at::allclose(logits(), original));
    model->set_adapters_enabled(false);
    EXPECT_TRUE(at::equal(logits(), original));
    model->set_adapters_enabled(true);
}

// PEFT's trainable_token_indices: rows of the embedding (and of a tied lm_head) train beside LoRA,
// saved as PEFT's trainable_tokens_delta; PEFT loads them with Grove's logits and gradients and
// merges them as Grove does, on an untied and a tied model (ids 5..16 go through the model).
TEST(Trainer, TrainableTokensTrainAsPeftTrainsThem) {
    for (const std::string& base : {kModel, kTiedModel}) {
        SCOPED_TRACE(base);
        // rows the training moves (a prompt's tokens) and rows the check's input reads (5 to 16)
        std::vector<int64_t> rows{5, 9};
        for (int64_t id : grove::Tokenizer::load(base)->encode("What is 1 + 2?", false))
            if (std::find(rows.begin(), rows.end(), id) == rows.end()) rows.push_back(id);
        std::string list;
        for (int64_t id : rows) list += (list.empty() ? "" : ", ") + std::to_string(id);
        const std::string checkpoint =
            expect_peft_trains_alike(base == kModel ? "tokens" : "tokens_tied", R"({ r = 2, target_modules = ["q_proj"] })",
                                     "[]", base, {"adapter.trainable_token_indices=[" + list + "]"});
        const auto config = nlohmann::json::parse(std::ifstream(checkpoint + "/adapter_config.json"));
        EXPECT_EQ(config.value("trainable_token_indices", std::vector<int64_t>{}), rows);
        const std::string file = checkpoint + "/adapter_model.safetensors";
        grove::SafetensorsFile saved(file);
        const grove::TensorEntry* delta =
            saved.find("base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta");
        ASSERT_TRUE(delta);
        const at::Tensor original =
            grove::Model::load(base)->named_parameters().front().second.index_select(0, at::tensor(rows, at::kLong));
        EXPECT_FALSE(at::equal(grove::tensor_from_entry(*delta, file), original)) << "the training moved the rows";
    }
}

// Trained token rows: the reference pass and the merge-free paths (a generation copy) see what the
// forward pass sees; refused, naming the setting: an index outside the vocabulary or given twice,
// the embedding also trained whole, an adapter that trains every weight already.
TEST(Trainer, TrainableTokensReplaceTheirRowsEverywhereButInTheReference) {
    for (const std::string& base : {kModel, kTiedModel}) {
        SCOPED_TRACE(base);
        const auto model = grove::Model::load(base);
        grove::BesideAdapter beside;
        beside.trainable_token_indices = {5, 9, 13};
        model->train_beside_adapter(beside);
        const at::Tensor ids = at::arange(5, 17, at::kLong).unsqueeze(0);
        const at::Tensor positions = at::arange(0, 12, at::kLong).unsqueeze(0);
        auto logits = [&](const grove::Model& m) {
            at::NoGradGuard no_grad;
            return m.forward(ids, at::ones_like(ids), positions);
        };
        const at::Tensor original = logits(*grove::Model::load(base));
        ASSERT_EQ(model->trainable_named_parameters().size(), 1u);
        {
            at::NoGradGuard no_grad;
            model->trainable_named_parameters().front().second.add_(0.5);
        }
        const at::Tensor trained = logits(*model);
        EXPECT_FALSE(at::allclose(trained, original));
        EXPECT_TRUE(at::allclose(model->forward(ids, at::ones_like(ids), positions).detach(), trained, 1e-5, 1e-6))
            << "with gradients (the matrix with the rows in it) as without (the rows' columns apart)";
        EXPECT_TRUE(at::allclose(logits(*model->generation_copy(at::kFloat)), trained, 1e-5, 1e-6))
            << "generation computes with the trained rows";
        model->set_adapters_enabled(false);
        EXPECT_TRUE(at::equal(logits(*model), original)) << "the reference pass: the original rows";
        model->set_adapters_enabled(true);
    }
    auto refusal = [](std::vector<int64_t> indices, std::vector<std::string> modules = {}) {
        grove::BesideAdapter beside;
        beside.trainable_token_indices = std::move(indices);
        beside.modules_to_save = std::move(modules);
        return grove::test::error_message([&] { grove::Model::load(kModel)->train_beside_adapter(beside); });
    };
    EXPECT_CONTAINS(refusal({3, 100000}), "trainable_token_indices: 100000 is no token of this model (its vocabulary has");
    EXPECT_CONTAINS(refusal({3, 7, 3}), "trainable_token_indices: 3 is given twice");
    EXPECT_CONTAINS(refusal({3}, {"embed_tokens"}), "the embedding trains whole already (modules_to_save)");
    EXPECT_CONTAINS(grove::test::error_message(
                        [&] { grove::Trainer(manifest("tokens_full", {"adapter.trainable_token_indices=[3]"}), fresh()); }),
                    "modules_to_save, ensure_weight_tying and trainable_token_indices train weights beside an adapter");
}

// With modules_to_save the reference pass (adapters disabled) is the base model: the saved modules
// compute with their original weights there, and with their trained ones otherwise; a tied model's
// lm_head is refused, naming the setting.
TEST(Trainer, ModulesToSaveKeepTheirOriginalsForTheReference) {
    grove::Trainer t(manifest("modules_to_save_reference",
                              {"adapter.plugin=\"lora\"", "adapter.config={ r = 2, target_modules = [\"q_proj\"] }",
                               "adapter.modules_to_save=[\"lm_head\", \"embed_tokens\"]", "loss.beta=0.1", "train.max_steps=2",
                               "train.per_device_train_batch_size=4"}),
                     fresh());
    t.step();
    t.step();
    const at::Tensor ids = at::arange(5, 17, at::kLong).unsqueeze(0), positions = at::arange(0, 12, at::kLong).unsqueeze(0);
    auto logits = [&](grove::Model& m) {
        at::NoGradGuard no_grad;
        return m.forward(ids, at::ones_like(ids), positions);
    };
    const auto base = grove::Model::load(kModel);
    const at::Tensor trained = logits(t.model());
    t.model().set_adapters_enabled(false);
    EXPECT_TRUE(at::equal(logits(t.model()), logits(*base))) << "the reference is the base model";
    t.model().set_adapters_enabled(true);
    EXPECT_TRUE(at::equal(logits(t.model()), trained)) << "the trained weights are back";
    {  // autocast caches a weight's bf16 cast by tensor: the reference must not reuse the trained one's
        grove::AutocastScope bf16(at::kCPU);
        logits(t.model());
        t.model().set_adapters_enabled(false);
        const at::Tensor reference = logits(t.model());
        t.model().set_adapters_enabled(true);
        EXPECT_TRUE(at::equal(reference, logits(*base))) << "under autocast too";
    }
    EXPECT_FALSE(at::allclose(trained, logits(*base))) << "the training moved the policy";
    std::set<std::string> names;
    for (const auto& [name, p] : t.model().trainable_named_parameters()) names.insert(name);
    EXPECT_TRUE(names.count("base_model.model.lm_head.weight"));
    EXPECT_TRUE(names.count("base_model.model.model.embed_tokens.weight"));
    const auto tied = grove::Model::load(std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/qwen2_tied");
    EXPECT_CONTAINS(grove::test::error_message([&] { tied->train_beside_adapter(modules_to_save({"lm_head"})); }),
                    "modules_to_save: \"lm_head\" names lm_head or embed_tokens, which this model ties");
    EXPECT_CONTAINS(grove::test::error_message([&] { base->train_beside_adapter(modules_to_save({"lm_head", "lm_heads"})); }),
                    "\"lm_heads\" ends the name of no module of this model");
    auto order_of = [](const std::vector<std::string>& targets) {  // checkpoints list trained tensors by position
        auto model = grove::Model::load(kModel);
        model->train_beside_adapter(modules_to_save(targets));
        std::vector<std::string> names;
        for (const auto& [name, p] : model->adapter_parameters()) names.push_back(name);
        return names;
    };
    EXPECT_EQ(order_of({"model.norm", "lm_head"}), order_of({"lm_head", "model.norm"}));
    EXPECT_CONTAINS(grove::test::error_message([&] {
                        grove::Trainer(manifest("modules_to_save_no_lora",
                                                {"adapter.plugin=\"lora\"", "adapter.config={ target_modules = [\"qq_proj\"] }",
                                                 "adapter.modules_to_save=[\"lm_head\"]"}),
                                       fresh());
                    }),
                    "the adapter attaches to no layer");
}

// An adapter PEFT saved (no grove_adapter.json) merges with PEFT's LoraConfig as PEFT merges it:
// DoRA magnitudes, rank and alpha patterns, layers_to_transform, exclude_modules and rsLoRA are
// read from its adapter_config.json (make_peft_adapters.py), and modules_to_save take the saved
// modules' weights (a tied embedding with ensure_weight_tying too); settings the lora plugin does
// not take (layers_pattern) are refused rather than merged without.
TEST(Trainer, AdaptersPeftSavedMergeAsPeftMergesThem) {
    const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/peft_made";
    fs::remove_all(dir);
    const std::string command = std::string(GROVE_PYTHON) + " " + GROVE_TEST_SOURCE_DIR +
                                "/tests/core/train/make_peft_adapters.py " + kModel + " " + dir + " " + kTiedModel;
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    for (const std::string name : {"dora_patterns", "layers", "regex", "modules_to_save", "trainable_tokens", "tied_embedding",
                                   "tied_trainable_tokens"}) {
        SCOPED_TRACE(name);
        const std::string base_dir = name.rfind("tied_", 0) == 0 ? kTiedModel : kModel;
        const auto base = grove::Model::load(base_dir)->named_parameters();
        const std::string merged = dir + "/" + name + "-grove";
        grove::export_merged(dir + "/" + name, base_dir, merged);
        const auto grove_merged = grove::Model::load(merged)->named_parameters();
        const std::string peft_file = dir + "/" + name + ".merged.safetensors";
        grove::SafetensorsFile peft(peft_file);
        double worst = 0.0;
        size_t compared = 0;
        int changed = 0;
        for (size_t i = 0; i < grove_merged.size(); ++i) {
            const auto& [tensor, weights] = grove_merged[i];
            const grove::TensorEntry* entry = peft.find(tensor);
            if (!entry) continue;  // lm_head, left out of PEFT's file
            worst = std::max(worst, (weights - grove::tensor_from_entry(*entry, peft_file)).abs().max().item<double>());
            changed += !at::equal(weights, base[i].second);
            ++compared;
        }
        EXPECT_EQ(compared, peft.tensors().size()) << "every tensor of PEFT's merged model has Grove's name";
        EXPECT_LT(worst, 1e-5) << "PEFT's merged weights";
        const std::map<std::string, int> adapted{{"dora_patterns", 6},        {"layers", 2},           {"regex", 3},
                                                 {"modules_to_save", 4},      {"trainable_tokens", 3}, {"tied_embedding", 3},
                                                 {"tied_trainable_tokens", 3}};
        EXPECT_EQ(changed, adapted.at(name)) << "the adapted layers and saved modules, and no others";
    }
    EXPECT_CONTAINS(grove::test::error_message(
                        [&] { grove::export_merged(dir + "/layers_pattern", kModel, dir + "/layers_pattern-grove"); }),
                    "layers_pattern is set, which Grove's lora adapter does not take");
}

// train.weight_decay leaves out exactly the tensors transformers' Trainer leaves out
// (get_decay_parameter_names), by name, on every family's tiny checkpoint.
TEST(Trainer, WeightDecayAppliesWhereTransformersAppliesIt) {
    nlohmann::json flags;
    for (const char* name :
         {"llama_gqa", "mistral_mha", "mixtral_experts", "olmo2_post_norm", "olmoe_experts", "phi3_longrope", "qwen2_tied",
          "qwen2_moe_shared", "qwen3_qknorm", "qwen3_moe_experts", "smollm3_nope", "gemma2_softcap", "gemma3_window"}) {
        const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/" + name;
        for (const auto& [tensor, p] : grove::Model::load(dir)->named_parameters())
            flags[dir][tensor] = grove::weight_decay_applies(tensor);
    }
    const std::string file = (fs::temp_directory_path() / "grove_weight_decay.json").string();
    std::ofstream(file) << flags.dump();
    const std::string command =
        std::string(GROVE_PYTHON) + " " + GROVE_TEST_SOURCE_DIR + "/tests/core/train/check_weight_decay.py " + file;
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

// A tensor without a gradient in a step (an expert that no token reached) is left alone and its
// bias correction counts only its own steps, as torch.optim.AdamW and transformers' Adafactor count
// them; until 2026-11-29 Grove corrected every tensor with the number of optimizer steps.
TEST(Trainer, ATensorWithoutAGradientKeepsItsOwnStepCountAsInTorch) {
    constexpr int kSteps = 5;
    const std::vector<std::set<size_t>> missing{{}, {2}, {1}, {2}, {}};  // per step, the tensors without a gradient
    at::manual_seed(7);
    const std::vector<std::pair<std::string, at::Tensor>> initial{
        {"a.weight", at::randn({6, 4})}, {"a.norm.weight", at::randn({4})}, {"experts.1.weight", at::randn({3, 3})}};
    std::vector<std::pair<std::string, at::Tensor>> file;
    std::vector<std::vector<at::Tensor>> grads(kSteps);
    for (size_t i = 0; i < initial.size(); ++i) {
        file.emplace_back("initial." + std::to_string(i), initial[i].second);
        file.emplace_back("decays." + std::to_string(i), at::full({1}, double(grove::weight_decay_applies(initial[i].first))));
    }
    for (int s = 0; s < kSteps; ++s)
        for (size_t i = 0; i < initial.size(); ++i) {
            grads[size_t(s)].push_back(missing[size_t(s)].count(i) ? at::Tensor() : at::randn(initial[i].second.sizes()));
            if (grads[size_t(s)][i].defined())
                file.emplace_back("grad." + std::to_string(s) + "." + std::to_string(i), grads[size_t(s)][i]);
        }
    grove::TrainSection settings;
    settings.adam_beta2 = 0.99;
    settings.weight_decay = 0.1;
    for (grove::OptimizerKind kind : {grove::OptimizerKind::adamw, grove::OptimizerKind::adafactor}) {
        settings.optim = kind;
        std::vector<std::pair<std::string, at::Tensor>> params;
        for (const auto& [name, t] : initial) params.emplace_back(name, t.clone());
        auto optimizer = grove::make_optimizer(settings, params);
        for (int s = 0; s < kSteps; ++s) {
            for (size_t i = 0; i < params.size(); ++i)
                if (grads[size_t(s)][i].defined()) params[i].second.mutable_grad() = grads[size_t(s)][i].clone();
            optimizer->step(1e-2);
            optimizer->zero_grad();
        }
        EXPECT_EQ(optimizer->steps(), kSteps);
        EXPECT_EQ(optimizer->tensor_steps(), (std::vector<int64_t>{5, 4, 3}));
        for (size_t i = 0; i < params.size(); ++i)
            file.emplace_back(std::string(grove::optimizer_name(kind)) + "." + std::to_string(i), params[i].second);
    }
    const std::string tensors = (fs::temp_directory_path() / "grove_optimizer_steps.safetensors").string();
    grove::save_tensors(tensors, file);
    const std::string command = std::string(GROVE_PYTHON) + " " + GROVE_TEST_SOURCE_DIR +
                                "/tests/core/train/check_optimizer_steps.py " + tensors + " 5 0.01 0.99 0.1";
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

// Text prompts are tokenized as TRL 1.16 tokenizes them (processing_class(text=prompts)): with the
// tokenizer's special tokens, here Gemma's <bos>, without which Gemma generates garbage (TRL #3520,
// when TRL left them out); until 2026-11-27 Grove left them out too.
TEST(Trainer, TextPromptsGetTheTokenizersSpecialTokensAsInTrl) {
    const std::string gemma = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/gemma3_window";
    grove::Trainer t(manifest("text_prompt_bos", {"model.path=" + gemma, "logging.save_rollouts=true"}), fresh());
    t.step();
    auto tokenizer = grove::Tokenizer::load(gemma);
    std::ifstream rollouts(std::string(GROVE_TEST_BINARY_DIR) + "/trainer/runs/text_prompt_bos/out/rollouts.jsonl");
    int rows = 0;
    for (std::string line; std::getline(rollouts, line); ++rows) {
        const auto ids = nlohmann::json::parse(line)["prompt_ids"].get<std::vector<int64_t>>();
        ASSERT_FALSE(ids.empty());
        EXPECT_EQ(ids[0], 2) << "Gemma's <bos>";
        const std::string text = tokenizer->decode(ids, true);
        EXPECT_EQ(text.rfind("What is ", 0), 0u) << text;
        EXPECT_EQ(ids, tokenizer->encode(text, true)) << text;
    }
    EXPECT_GT(rows, 0);
}

// OLMo 3 (OLMo 2's layers, a sliding one rotating without the full layer's yarn) likewise, onto
// transformers' Olmo3ForCausalLM.
TEST(Trainer, Olmo3LoraOnEveryLinearLoadsInPeft) { expect_lora_on_every_linear_loads_in_peft("olmo3_window"); }

// Gemma 2 (soft-capped attention scores and final logits) likewise, onto transformers' eager
// Gemma2ForCausalLM, the attention that applies the cap.
TEST(Trainer, Gemma2LoraOnEveryLinearLoadsInPeft) { expect_lora_on_every_linear_loads_in_peft("gemma2_softcap"); }

// A multimodal Gemma 3 checkpoint trains LoRA on its text model under transformers' module names
// (model.language_model.*), and PEFT loads the adapter onto Gemma3ForConditionalGeneration with
// Grove's logits.
TEST(Trainer, Gemma3MultimodalCheckpointTrainsLoraOnItsTextModel) {
    grove::Trainer t(lora_run("gemma3_vision", "[\"q_proj\", \"v_proj\"]"), fresh());
    std::set<std::string> adapted;
    for (const auto& [name, p] : t.model().adapter_parameters()) adapted.insert(name);
    EXPECT_EQ(adapted.size(), 2u * 2u * 2u);  // 2 layers x (q, v) x (A, B): the text model's only
    EXPECT_TRUE(adapted.count("base_model.model.model.language_model.layers.1.self_attn.v_proj.lora_B.weight"));
    const std::string checkpoint = expect_trains_and_loads_in_peft(t, "gemma3_vision");
    EXPECT_TRUE(fs::exists(checkpoint + "/preprocessor_config.json")) << "the checkpoint loads with AutoProcessor";
    // PEFT's own adapter for this class also wraps the vision tower's q_proj: merged, a zero lora_B
    // there changes nothing; a trained one (images) is refused rather than dropped
    const std::string base = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/gemma3_vision";
    const std::string file = checkpoint + "/adapter_model.safetensors";
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    {
        grove::SafetensorsFile saved(file);
        for (const auto& entry : saved.tensors())
            tensors.emplace_back(entry.name, grove::tensor_from_entry(entry, file).clone());
    }
    const std::string vision = "base_model.model.model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.";
    tensors.emplace_back(vision + "lora_A.weight", at::randn({4, 16}));
    tensors.emplace_back(vision + "lora_B.weight", at::zeros({16, 4}));
    grove::save_tensors(file, tensors);
    EXPECT_NO_THROW(grove::export_merged(checkpoint, base, checkpoint + "-merged"));
    EXPECT_TRUE(fs::exists(checkpoint + "-merged/preprocessor_config.json"));
    tensors.back().second.fill_(0.5);
    grove::save_tensors(file, tensors);
    EXPECT_CONTAINS(grove::test::error_message([&] { grove::export_merged(checkpoint, base, checkpoint + "-merged-2"); }),
                    "lora_B.weight\" is not a tensor of the adapter Grove rebuilt");
}

// 6 steps straight == 3 steps, checkpoint, a new process-like trainer resuming, 3 more steps. With
// steps_per_generation = 2 > accumulation the checkpoint falls inside a generation batch.
TEST(Trainer, ResumeContinuesExactly) {
    std::vector<std::string> settings{"train.max_steps=6", "train.per_device_train_batch_size=4",
                                      "train.steps_per_generation=2", "reduction.plugin=\"dapo\""};
    grove::Trainer straight(manifest("straight", settings), fresh());
    std::vector<std::map<std::string, double>> expected;
    for (int i = 0; i < 6; ++i) expected.push_back(straight.step());

    auto m = manifest("resumed", settings);
    {
        grove::Trainer first(m, fresh());
        for (int i = 0; i < 3; ++i) {
            auto got = first.step();
            EXPECT_DOUBLE_EQ(got["loss"], expected[size_t(i)]["loss"]) << "step " << i;
        }
        std::string saved = first.save_checkpoint();
        fs::path latest = fs::path(saved).parent_path() / "latest";
        ASSERT_TRUE(fs::is_symlink(latest)) << "the run folder has a latest link";
        EXPECT_EQ(fs::read_symlink(latest), fs::path("checkpoint-3")) << "relative, to the checkpoint just written";
        EXPECT_TRUE(fs::exists(latest / "trainer_state.json"));
    }
    grove::TrainerOptions resume;
    resume.resume = "latest";
    grove::Trainer second(m, resume);
    EXPECT_EQ(second.global_step(), 3);
    for (int i = 3; i < 6; ++i) {
        auto got = second.step();
        for (const char* key : {"loss", "reward", "grad_norm", "learning_rate", "completions/mean_length"})
            EXPECT_DOUBLE_EQ(got[key], expected[size_t(i)][key]) << key << " at step " << i;
    }
    EXPECT_EQ(max_difference(snapshot(second.model()), snapshot(straight.model())), 0.0);
    std::string saved = second.save_checkpoint();
    EXPECT_EQ(fs::read_symlink(fs::path(saved).parent_path() / "latest"), fs::path("checkpoint-6")) << "moved on";
}

// A mixture of experts whose experts some steps do not reach resumes exactly: each tensor's own
// step count (ATensorWithoutAGradientKeepsItsOwnStepCountAsInTorch) is in the checkpoint.
TEST(Trainer, ResumeOfAMixtureOfExpertsKeepsEachTensorsStepCount) {
    const std::string moe = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/qwen3_moe_experts";
    const auto [straight, resumed, metrics] = expect_resume_continues_exactly(
        "moe", {"model.path=\"" + moe + "\"", "train.max_steps=4", "train.per_device_train_batch_size=2"},
        {"loss", "grad_norm"});
    const std::vector<int64_t> counts = saved_tensor_steps(straight->save_checkpoint());
    EXPECT_EQ(saved_tensor_steps(resumed->save_checkpoint()), counts);
    EXPECT_LT(*std::min_element(counts.begin(), counts.end()), 4) << "some expert missed a step: the test tests something";
    EXPECT_EQ(*std::max_element(counts.begin(), counts.end()), 4);
}

// LoRA dropout draws its masks from torch's generator, which a checkpoint does not save: each step
// reseeds it from (train.seed, step), so a resumed run draws the masks the straight run drew.
TEST(Trainer, ResumeWithLoraDropoutContinuesExactly) {
    expect_resume_continues_exactly("lora_dropout",
                                    {"train.max_steps=4", "train.per_device_train_batch_size=4", "adapter.plugin=\"lora\"",
                                     "adapter.config={ r = 4, alpha = 8.0, dropout = 0.3, target_modules = [\"q_proj\", "
                                     "\"v_proj\", \"down_proj\"] }"},
                                    {"loss", "grad_norm"});
}

// modules_to_save resume exactly: their trained weights are in the checkpoint, and the reference
// (beta > 0) keeps the originals, which the resumed run reads from the base model again.
TEST(Trainer, ResumeWithModulesToSaveContinuesExactly) {
    std::vector<std::string> settings{"train.max_steps=4",
                                      "train.per_device_train_batch_size=4",
                                      "loss.beta=0.1",
                                      "adapter.plugin=\"lora\"",
                                      "adapter.config={ r = 2, target_modules = [\"v_proj\"] }",
                                      "adapter.modules_to_save=[\"lm_head\", \"embed_tokens\"]"};
    const auto run = expect_resume_continues_exactly("modules_to_save", settings, {"loss", "grad_norm", "kl"});
    EXPECT_GT(run.straight_metrics[3].at("kl"), 0.0) << "the reference differs from the policy";
    // a tied embedding trained whole (ensure_weight_tying), its frozen original the reference's
    settings.back() = "adapter.modules_to_save=[\"embed_tokens\"]";
    settings.push_back("adapter.ensure_weight_tying=true");
    settings.push_back("model.path=\"" + kTiedModel + "\"");
    const auto tied = expect_resume_continues_exactly("tied_modules_to_save", settings, {"loss", "grad_norm", "kl"});
    EXPECT_GT(tied.straight_metrics[3].at("kl"), 0.0);
    // trained token rows: those of the prompts' tokens, so that they move
    settings.pop_back();
    settings.pop_back();
    std::string rows;
    for (int64_t id : grove::Tokenizer::load(kModel)->encode("What is 1 + 2?", false))
        rows += (rows.empty() ? "" : ", ") + std::to_string(id);
    settings.back() = "adapter.trainable_token_indices=[" + rows + "]";
    const auto tokens = expect_resume_continues_exactly("trainable_tokens", settings, {"loss", "grad_norm", "kl"});
    EXPECT_GT(tokens.straight_metrics[3].at("kl"), 0.0);
}

// A resume names each setting that changed since its checkpoint was written (here max_steps, which
// reshapes the learning-rate schedule, and the temperature) and says nothing when none did.
TEST(Trainer, AResumeNamesTheSettingsChangedSinceItsCheckpoint) {
    const std::vector<std::string> settings{"train.max_steps=2", "train.per_device_train_batch_size=4"};
    const auto m = manifest("changed_settings", settings);
    {
        grove::Trainer first(m, fresh());
        first.step();
        first.save_checkpoint();
    }
    auto resume_log = [&](const grove::Manifest& with) {
        std::ostringstream log;
        grove::TrainerOptions o;
        o.resume = "latest";
        o.log = &log;
        grove::Trainer again(with, o);
        EXPECT_EQ(again.global_step(), 1);
        return log.str();
    };
    const std::string unchanged = resume_log(m);
    EXPECT_EQ(unchanged.find("settings changed"), std::string::npos) << unchanged;
    auto overrides = settings;
    overrides[0] = "train.max_steps=4";
    overrides.push_back("generation.temperature=0.9");
    const std::string changed = resume_log(grove::Manifest::load(m.path(), overrides));
    EXPECT_CONTAINS(changed, "checkpoint-1 with settings changed since it was written");
    EXPECT_CONTAINS(changed, "train.max_steps = 4 (was 2)");
    EXPECT_CONTAINS(changed, "generation.temperature = 0.9 (was 1.0)");
    EXPECT_EQ(changed.find("per_device_train_batch_size"), std::string::npos) << "only what changed:\n" << changed;
}

// The host's loss options on a real run: the sampler-mismatch correction measures Grove's own
// sampler against the trainer (equal on the CPU up to float rounding), adaptive entropy raises its
// coefficient each step below the target, and a resume inside a generation batch (its sampling
// ratios and the coefficient in the checkpoint) continues exactly.
TEST(Trainer, TheHostsLossOptionsRunAndResumeExactly) {
    std::vector<std::string> settings{"train.max_steps=4",
                                      "train.per_device_train_batch_size=4",
                                      "train.steps_per_generation=2",
                                      "loss.importance_sampling_correction=\"token_truncate\"",
                                      "loss.importance_sampling_clip_min=0.5",
                                      "loss.top_entropy_quantile=0.5",
                                      "loss.off_policy_mask_threshold=0.5",
                                      "loss.entropy_coef=0.01",
                                      "loss.use_adaptive_entropy=true",
                                      "loss.entropy_target=100.0"};
    grove::Trainer straight(manifest("host_options_straight", settings), fresh());
    std::vector<std::map<std::string, double>> expected;
    for (int i = 0; i < 4; ++i) expected.push_back(straight.step());
    for (int i = 0; i < 4; ++i) {
        EXPECT_NEAR(expected[size_t(i)]["entropy_coef"], 0.01 + 0.005 * (i + 1), 1e-12) << "step " << i;
        EXPECT_GT(expected[size_t(i)]["grad_norm"], 0.0) << "step " << i;
    }
    for (int i : {0, 2}) {  // the steps that generated
        const auto& m = expected[size_t(i)];
        ASSERT_TRUE(m.count("sampling/importance_sampling_ratio/mean")) << "step " << i;
        EXPECT_NEAR(m.at("sampling/importance_sampling_ratio/mean"), 1.0, 1e-3) << "step " << i;
        EXPECT_LE(m.at("sampling/importance_sampling_ratio/min"), m.at("sampling/importance_sampling_ratio/mean"));
        EXPECT_GE(m.at("sampling/importance_sampling_ratio/max"), m.at("sampling/importance_sampling_ratio/mean"));
    }

    auto m = manifest("host_options_resumed", settings);
    {
        grove::Trainer first(m, fresh());
        first.step();
        first.save_checkpoint();  // inside the generation batch: its second micro-batch is saved
    }
    grove::TrainerOptions resume;
    resume.resume = "latest";
    grove::Trainer second(m, resume);
    for (int i = 1; i < 4; ++i) {
        auto got = second.step();
        for (const char* key : {"loss", "grad_norm", "entropy_coef"})
            EXPECT_DOUBLE_EQ(got[key], expected[size_t(i)][key]) << key << " at step " << i;
    }
    EXPECT_EQ(max_difference(snapshot(second.model()), snapshot(straight.model())), 0.0);
}

// TR-DPO's reference sync (loss.sync_ref_model; TRL's own update is compared in test_trl_multiturn):
// the KL after a sync is taken to the moved reference, which the checkpoint keeps, so a resume
// continues exactly. beta = 0 (no reference) and LoRA (the base is the reference) are refused.
TEST(Trainer, ASyncedReferenceIsCheckpointedAndResumesExactly) {
    std::vector<std::string> settings{
        "train.max_steps=4",        "train.per_device_train_batch_size=4", "loss.beta=0.5",
        "loss.sync_ref_model=true", "loss.ref_model_sync_steps=1",         "loss.ref_model_mixup_alpha=0.6"};
    grove::Trainer straight(manifest("sync_ref_straight", settings), fresh());
    std::vector<std::map<std::string, double>> expected;
    for (int i = 0; i < 4; ++i) expected.push_back(straight.step());
    std::vector<std::string> unsynced = settings;
    unsynced.push_back("loss.sync_ref_model=false");
    grove::Trainer without(manifest("sync_ref_without", unsynced), fresh());
    for (int i = 0; i < 3; ++i) without.step();
    EXPECT_NE(without.step()["kl"], expected[3]["kl"]) << "the sync changes the reference the KL is taken to";

    auto m = manifest("sync_ref_resumed", settings);
    {
        grove::Trainer first(m, fresh());
        for (int i = 0; i < 2; ++i) first.step();
        const std::string saved = first.save_checkpoint();
        EXPECT_TRUE(fs::exists(fs::path(saved) / "reference.safetensors"));
    }
    grove::TrainerOptions resume;
    resume.resume = "latest";
    grove::Trainer second(m, resume);
    for (int i = 2; i < 4; ++i) {
        auto got = second.step();
        for (const char* key : {"loss", "kl", "grad_norm"})
            EXPECT_DOUBLE_EQ(got[key], expected[size_t(i)][key]) << key << " at step " << i;
    }
    EXPECT_EQ(max_difference(snapshot(second.model()), snapshot(straight.model())), 0.0);

    // resumed with the sync off: the moved reference is kept, fixed, and the log says so
    std::ostringstream log;
    resume.log = &log;
    grove::Trainer unsynced_resume(grove::Manifest::load(m.path(), unsynced), resume);
    EXPECT_DOUBLE_EQ(unsynced_resume.step()["kl"], expected[2]["kl"]) << "the reference the sync had moved";
    EXPECT_NE(unsynced_resume.step()["kl"], expected[3]["kl"]) << "no sync after the resume";
    EXPECT_CONTAINS(log.str(), "holds the reference that loss.sync_ref_model moved; the run keeps it, fixed");
    const std::string later = unsynced_resume.save_checkpoint();
    EXPECT_TRUE(fs::exists(fs::path(later) / "reference.safetensors")) << "a later resume must find it too";

    auto error_of = [](const std::vector<std::string>& overrides) {
        try {
            grove::Trainer refused(manifest("sync_ref_refused", overrides), fresh());
        } catch (const grove::Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_CONTAINS(error_of({"loss.sync_ref_model=true"}),
                    "loss.sync_ref_model = true moves the reference model, but loss.beta = 0");
    EXPECT_CONTAINS(error_of({"loss.sync_ref_model=true", "loss.beta=0.1", "adapter.plugin=\"lora\""}),
                    "[adapter]: loss.sync_ref_model moves a reference model, but with the 'lora' adapter");
}

// Every train.lr_scheduler_type against the multipliers transformers' own get_scheduler computes
// (in a subprocess): 3 warmup steps of 10 (steps past the end too), min_lr_rate 0.1 for
// cosine_with_min_lr, 3 restarts, polynomial decay to 0.1 of a peak of 1 with power 2, inverse_sqrt
// (to which get_scheduler passes no kwargs: its timescale is the warmup, whatever lr_scheduler_kwargs
// says), and constant without its warmup, as transformers ignores it
// there (with a warning); warmup_stable_decay with each warmup and decay curve, with and without
// its stable steps and floor, and cosine_warmup_with_min_lr with and without warmup_lr_rate; a
// run's warmup steps from warmup_ratio as TrainingArguments counts them.
// A schedule's option with another schedule is refused, and so is a polynomial that cannot decay.
TEST(Schedules, EqualTransformersGetScheduler) {
    const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/schedules";
    fs::create_directories(dir);
    std::ofstream(dir + "/schedules.py") << R"(import json, sys, torch
from transformers import get_scheduler
out = {}
for label, name, kwargs in [("linear", "linear", {}), ("cosine", "cosine", {}),
                            ("cosine_with_min_lr", "cosine_with_min_lr", {"min_lr_rate": 0.1}),
                            ("cosine_with_restarts", "cosine_with_restarts", {"num_cycles": 3}),
                            ("polynomial", "polynomial", {"lr_end": 0.1, "power": 2.0}),
                            ("inverse_sqrt", "inverse_sqrt", {"timescale": 5}),
                            ("constant", "constant", {}), ("constant_with_warmup", "constant_with_warmup", {}),
                            ("wsd", "warmup_stable_decay", {"num_decay_steps": 4}),
                            ("wsd_cosine_1_sqrt", "warmup_stable_decay",
                             {"num_decay_steps": 3, "num_stable_steps": 2, "warmup_type": "cosine",
                              "decay_type": "1-sqrt", "min_lr_ratio": 0.2}),
                            ("wsd_1_sqrt_linear", "warmup_stable_decay",
                             {"num_decay_steps": 5, "warmup_type": "1-sqrt", "decay_type": "linear", "min_lr_ratio": 0.1}),
                            ("cosine_warmup_with_min_lr", "cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
                            ("cosine_warmup_with_min_lr_rate", "cosine_warmup_with_min_lr",
                             {"min_lr_rate": 0.1, "warmup_lr_rate": 0.2}),
                            ("cosine_warmup_to_zero", "cosine_warmup_with_min_lr", {"min_lr_rate": 0.0})]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = get_scheduler(name, optimizer, num_warmup_steps=3, num_training_steps=10, scheduler_specific_kwargs=kwargs)
    out[label] = [schedule.lr_lambdas[0](step) for step in range(12)]
from transformers import TrainingArguments
out["warmup_of_ratio"] = TrainingArguments(output_dir=sys.argv[2], warmup_ratio=0.25).get_warmup_steps(10)
json.dump(out, open(sys.argv[1], "w"))
)";
    const auto r = grove::test::run_command(std::string(GROVE_PYTHON) + " " + dir + "/schedules.py " + dir + "/out.json " +
                                            dir + "/arguments");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::ifstream in(dir + "/out.json");
    const auto expected = nlohmann::json::parse(in);
    grove::LrSchedulerOptions options;
    options.min_lr_rate = 0.1;
    options.num_cycles = 3;
    options.lr_end = 0.1;
    options.power = 2.0;
    grove::LrSchedulerOptions wsd, wsd_cosine_1_sqrt, wsd_1_sqrt_linear, warmup_from = options;
    wsd.num_decay_steps = 4;  // the rest of the run after the warmup stays at the peak
    wsd_cosine_1_sqrt.num_decay_steps = 3, wsd_cosine_1_sqrt.num_stable_steps = 2;  // ends at min_lr_ratio early
    wsd_cosine_1_sqrt.warmup_type = grove::WsdCurve::cosine, wsd_cosine_1_sqrt.decay_type = grove::WsdCurve::one_minus_sqrt;
    wsd_cosine_1_sqrt.min_lr_ratio = 0.2;
    wsd_1_sqrt_linear.num_decay_steps = 5;
    wsd_1_sqrt_linear.warmup_type = grove::WsdCurve::one_minus_sqrt, wsd_1_sqrt_linear.decay_type = grove::WsdCurve::linear;
    wsd_1_sqrt_linear.min_lr_ratio = 0.1;
    warmup_from.warmup_lr_rate = 0.2;
    grove::LrSchedulerOptions to_zero;
    to_zero.min_lr_rate = 0.0;  // set to 0, which transformers takes
    const std::tuple<const char*, grove::LrSchedule, grove::LrSchedulerOptions> schedules[] = {
        {"linear", grove::LrSchedule::linear, options},
        {"cosine", grove::LrSchedule::cosine, options},
        {"cosine_with_min_lr", grove::LrSchedule::cosine_with_min_lr, options},
        {"cosine_with_restarts", grove::LrSchedule::cosine_with_restarts, options},
        {"polynomial", grove::LrSchedule::polynomial, options},
        {"inverse_sqrt", grove::LrSchedule::inverse_sqrt, options},
        {"constant", grove::LrSchedule::constant, options},
        {"constant_with_warmup", grove::LrSchedule::constant_with_warmup, options},
        {"wsd", grove::LrSchedule::warmup_stable_decay, wsd},
        {"wsd_cosine_1_sqrt", grove::LrSchedule::warmup_stable_decay, wsd_cosine_1_sqrt},
        {"wsd_1_sqrt_linear", grove::LrSchedule::warmup_stable_decay, wsd_1_sqrt_linear},
        {"cosine_warmup_with_min_lr", grove::LrSchedule::cosine_warmup_with_min_lr, options},
        {"cosine_warmup_with_min_lr_rate", grove::LrSchedule::cosine_warmup_with_min_lr, warmup_from},
        {"cosine_warmup_to_zero", grove::LrSchedule::cosine_warmup_with_min_lr, to_zero}};
    for (const auto& [name, schedule, kwargs] : schedules)
        for (int64_t step = 0; step < 12; ++step)
            EXPECT_NEAR(grove::learning_rate_multiplier(schedule, step, 3, 10, kwargs),
                        expected[name][size_t(step)].get<double>(), 1e-12)
                << name << " step " << step;
    // a run's warmup: warmup_ratio of its steps rounded up, as TrainingArguments.get_warmup_steps; warmup_steps wins
    grove::TrainSection train;
    train.learning_rate = 0.5;
    train.warmup_ratio = 0.25;
    const auto by_ratio = grove::LearningRateSchedule::of(train, 10);
    EXPECT_EQ(by_ratio.warmup, expected["warmup_of_ratio"].get<int64_t>());
    EXPECT_DOUBLE_EQ(by_ratio.rate(4),
                     0.5 * grove::learning_rate_multiplier(grove::LrSchedule::linear, 4, by_ratio.warmup, 10));
    EXPECT_EQ(by_ratio.ignored_warmup_warning(), "");
    train.warmup_steps = 4;
    train.lr_scheduler_type = grove::LrSchedule::constant;
    const auto constant = grove::LearningRateSchedule::of(train, 10);
    EXPECT_EQ(constant.warmup, 4);
    EXPECT_DOUBLE_EQ(constant.rate(0), 0.5);
    EXPECT_CONTAINS(constant.ignored_warmup_warning(), "the 4 warmup steps are not taken; use \"constant_with_warmup\"");
    train.lr_scheduler_type = grove::LrSchedule::constant_with_warmup;
    EXPECT_EQ(grove::LearningRateSchedule::of(train, 10).ignored_warmup_warning(), "");
    EXPECT_CONTAINS(
        grove::test::error_message([] { grove::RunConfig::from(manifest("min_lr_refused", {"train.min_lr_rate=0.1"})); }),
        "train.min_lr_rate is an option of train.lr_scheduler_type = \"cosine_with_min_lr\" and "
        "\"cosine_warmup_with_min_lr\" and of no other schedule");
    EXPECT_CONTAINS(
        grove::test::error_message([] { grove::RunConfig::from(manifest("decay_refused", {"train.num_decay_steps=4"})); }),
        "train.num_decay_steps is an option of train.lr_scheduler_type = \"warmup_stable_decay\" and of no other schedule");
    EXPECT_CONTAINS(
        grove::test::error_message([] {
            grove::RunConfig::from(manifest("warmup_min_lr_unset", {"train.lr_scheduler_type=\"cosine_warmup_with_min_lr\""}));
        }),
        "decays to train.min_lr_rate, which is unset: set it (e.g. 0.1, or 0 to decay to 0)");
    EXPECT_EQ(grove::RunConfig::from(manifest("warmup_min_lr_zero", {"train.lr_scheduler_type=\"cosine_warmup_with_min_lr\"",
                                                                     "train.min_lr_rate=0.0"}))
                  .train.lr_scheduler_kwargs.min_lr_rate,
              std::optional<double>(0.0));
    // warmup_stable_decay's options as a manifest gives them
    const auto wsd_run = grove::RunConfig::from(
        manifest("wsd", {"train.lr_scheduler_type=\"warmup_stable_decay\"", "train.num_decay_steps=4",
                         "train.decay_type=\"1-sqrt\"", "train.warmup_type=\"cosine\"", "train.min_lr_ratio=0.2"}));
    const grove::LrSchedulerOptions& read = wsd_run.train.lr_scheduler_kwargs;
    EXPECT_EQ(read.num_decay_steps, std::optional<int64_t>(4));
    EXPECT_FALSE(read.num_stable_steps.has_value());
    EXPECT_EQ(read.decay_type, grove::WsdCurve::one_minus_sqrt);
    EXPECT_EQ(read.warmup_type, grove::WsdCurve::cosine);
    EXPECT_DOUBLE_EQ(read.min_lr_ratio, 0.2);
    EXPECT_CONTAINS(
        grove::test::error_message([] { grove::RunConfig::from(manifest("cycles_refused", {"train.num_cycles=2"})); }),
        "train.num_cycles is an option of train.lr_scheduler_type = \"cosine_with_restarts\" and of no other schedule");
    EXPECT_CONTAINS(grove::test::error_message([] {
                        grove::RunConfig::from(
                            manifest("lr_end_refused", {"train.lr_scheduler_type=\"polynomial\"", "train.learning_rate=1e-7"}));
                    }),
                    "train.lr_end (1e-07) must be smaller than train.learning_rate (1e-07)");
    // a run's polynomial rate: the multiplier of its own peak (transformers' LambdaLR multiplies by it)
    const auto polynomial = grove::RunConfig::from(
        manifest("polynomial", {"train.lr_scheduler_type=\"polynomial\"", "train.lr_end=1e-7", "train.learning_rate=1e-6"}));
    const auto run = grove::LearningRateSchedule::of(polynomial.train, 10);
    EXPECT_NEAR(run.rate(10), 1e-7, 1e-18);
    EXPECT_NEAR(run.rate(5), (1e-6 - 1e-7) * 0.5 + 1e-7, 1e-18);
}

// model.cast_lm_head_to_fp32 in a run: a bfloat16 policy and its reference with float32 output
// layers. The head stays float32 and trains; a resume continues exactly (the float32 head is
// checkpointed as it is). Model.Float32HeadGivesTrlsCastLmHeadLogprobs compares the head with TRL's.
TEST(Trainer, Float32HeadTrainsAndResumesExactly) {
    const std::vector<std::string> settings{"train.max_steps=2", "train.per_device_train_batch_size=4",
                                            "model.dtype=\"bfloat16\"", "model.cast_lm_head_to_fp32=true", "loss.beta=0.1"};
    grove::Trainer straight(manifest("float32_head_straight", settings), fresh());
    EXPECT_EQ(straight.model().lm_head_weight().scalar_type(), at::kFloat);
    EXPECT_EQ(straight.model().dtype(), at::kBFloat16);
    const at::Tensor before = straight.model().lm_head_weight().detach().clone();
    std::vector<std::map<std::string, double>> expected{straight.step(), straight.step()};
    EXPECT_EQ(straight.model().lm_head_weight().scalar_type(), at::kFloat);
    EXPECT_GT((straight.model().lm_head_weight() - before).abs().max().item<double>(), 0.0) << "the head trains";
    EXPECT_GT(expected[1]["kl"], 0.0);

    const auto second = resumed_after(manifest("float32_head_resumed", settings), 1);
    const auto got = second->step();
    for (const char* key : {"loss", "kl", "grad_norm"}) EXPECT_DOUBLE_EQ(got.at(key), expected[1].at(key)) << key;
    EXPECT_EQ(max_difference(snapshot(second->model()), snapshot(straight.model())), 0.0);
}

// DAPO's dynamic sampling: with two generations per prompt and a reward half the completions get,
// many groups agree. Filtering them leaves a batch in which every group disagrees; its first round
// is the batch a run without filtering trains on; with one round allowed, agreeing groups fill the
// batch; and a resume continues exactly (the extra prompts drawn are in the sampler's position).
TEST(Trainer, DynamicSamplingTrainsOnlyOnGroupsThatDisagree) {
    std::vector<std::string> base{"train.max_steps=3", "train.per_device_train_batch_size=8"};
    auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.begin(), base.begin(), base.end());
        return extra;
    };
    grove::Trainer plain(manifest("dynamic_off", base), fresh());
    const auto plain_first = plain.step();
    ASSERT_GT(plain_first.at("frac_reward_zero_std"), 0.0) << "no agreeing group: the test proves nothing";

    const auto settings = with({"generation.dynamic_sampling=true"});
    grove::Trainer filtered(manifest("dynamic_on", settings), fresh());
    std::vector<std::map<std::string, double>> expected;
    for (int i = 0; i < 3; ++i) expected.push_back(filtered.step());
    EXPECT_EQ(expected[0].at("dynamic_sampling/first_round_frac_reward_zero_std"), plain_first.at("frac_reward_zero_std"));
    double filtered_groups = 0;
    for (const auto& m : expected) {
        EXPECT_EQ(m.at("frac_reward_zero_std"), 0.0) << "every group of the batch disagrees";
        EXPECT_EQ(m.at("dynamic_sampling/groups_filled_agreeing"), 0.0);
        EXPECT_GE(m.at("dynamic_sampling/rounds"), 1.0);
        filtered_groups += m.at("dynamic_sampling/filtered_groups");
        EXPECT_GT(m.at("grad_norm"), 0.0);
    }
    EXPECT_GT(filtered_groups, 0.0);

    grove::Trainer one_round(
        manifest("dynamic_one_round", with({"generation.dynamic_sampling=true", "generation.dynamic_sampling_max_rounds=1"})),
        fresh());
    const auto short_batch = one_round.step();
    EXPECT_GT(short_batch.at("dynamic_sampling/groups_filled_agreeing"), 0.0);
    EXPECT_EQ(short_batch.at("dynamic_sampling/filtered_groups"), 0.0) << "every agreeing group was put back";
    EXPECT_EQ(short_batch.at("frac_reward_zero_std"), plain_first.at("frac_reward_zero_std")) << "the same batch, reordered";

    const auto second = resumed_after(manifest("dynamic_resumed", settings), 1);
    for (int i = 1; i < 3; ++i) {
        auto got = second->step();
        for (const char* key : {"loss", "reward", "grad_norm", "dynamic_sampling/rounds"})
            EXPECT_DOUBLE_EQ(got[key], expected[size_t(i)][key]) << key << " at step " << i;
    }
    EXPECT_EQ(max_difference(snapshot(second->model()), snapshot(filtered.model())), 0.0);
}

// A reward model's scores equal transformers' sequence-classification logits as TRL computes them
// (prompt + completion without special tokens, right-padded, the last real token's first logit), on
// the tiny Llama, Qwen2, Qwen3, Phi-3, SmolLM3, Gemma 2, Gemma 3, Qwen3-MoE, Qwen2-MoE and Mixtral classifiers
// make_tiny_models.py writes, texts of unequal lengths
// included.
TEST(RewardModel, ScoresEqualTransformersSequenceClassification) {
    for (const char* name : {"llama_reward", "qwen2_reward", "qwen3_reward", "phi3_reward", "smollm3_reward", "gemma2_reward",
                             "gemma3_reward", "qwen3_moe_reward", "qwen2_moe_reward", "mixtral_reward"}) {
        const std::string folder = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/" + name;
        std::ifstream in(folder + "/reference.json");
        const auto reference = nlohmann::json::parse(in);
        std::vector<std::string> texts;
        for (size_t i = 0; i < reference["prompts"].size(); ++i)
            texts.push_back(reference["prompts"][i].get<std::string>() + reference["completions"][i].get<std::string>());
        const grove::RewardModel model(folder, "cpu", "test");
        const std::vector<float> scores = model.score(texts);
        ASSERT_EQ(scores.size(), texts.size()) << name;
        for (size_t i = 0; i < texts.size(); ++i)
            EXPECT_NEAR(scores[i], reference["scores"][i].get<double>(), 1e-4) << name << " row " << i;
        // conversational rows: rendered with the reward model's chat template as TRL renders them
        std::vector<std::string> conversations;
        for (const auto& row : reference["conversations"]) {
            std::vector<grove::ChatMessage> prompt;
            for (const auto& m : row["prompt"])
                prompt.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
            conversations.push_back(model.conversation_text(prompt, row["completion"].get<std::string>()));
            EXPECT_EQ(conversations.back(), row["text"].get<std::string>()) << name;
        }
        const std::vector<float> conversation_scores = model.score(conversations);
        for (size_t i = 0; i < conversations.size(); ++i)
            EXPECT_NEAR(conversation_scores[i], reference["conversation_scores"][i].get<double>(), 1e-4) << name << " " << i;
    }
}

// Reward models in a run: one trains a step (its column is logged like a plugin's); a causal LM is
// refused as a reward model with the supported architectures, and a reward model as the policy.
TEST(RewardModel, ScoresARunAndWrongFoldersAreRefusedByName) {
    const std::string reward = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/llama_reward";
    grove::Trainer t(manifest("reward_model", {"train.max_steps=1", "train.per_device_train_batch_size=4"},
                              "[[rewards]]\nmodel = \"" + reward + "\"\n"),
                     fresh());
    const auto m = t.step();
    ASSERT_TRUE(m.count("rewards/llama_reward/mean"));
    EXPECT_TRUE(std::isfinite(m.at("rewards/llama_reward/mean")));
    EXPECT_GT(m.at("rewards/llama_reward/std"), 0.0) << "the reward model scores completions differently";
    EXPECT_GT(m.at("grad_norm"), 0.0);

    // chat prompts: each row's reward is the model's score of the conversation rendered with its template
    auto chat = manifest("reward_model_chat",
                         {"train.max_steps=1", "train.per_device_train_batch_size=4", "logging.save_rollouts=true"},
                         "[[rewards]]\nmodel = \"" + reward + "\"\n");
    {
        std::ofstream prompts(fs::path(chat.path()).parent_path() / "prompts.jsonl");
        for (int i = 0; i < 12; ++i)
            prompts << nlohmann::json({{"prompt", {{{"role", "user"}, {"content", "What is " + std::to_string(i) + " + 2?"}}}}})
                           .dump()
                    << "\n";
    }
    grove::Trainer chat_run(chat, fresh());
    chat_run.step();
    const grove::RewardModel scorer(reward, "cpu", "test");
    auto tokenizer = grove::Tokenizer::load(kModel);
    std::ifstream rollouts(fs::path(chat.path()).parent_path() / "out" / "rollouts.jsonl");
    int rows = 0;
    for (std::string line; std::getline(rollouts, line); ++rows) {
        const auto row = nlohmann::json::parse(line);
        const std::string prompt = tokenizer->decode(row["prompt_ids"].get<std::vector<int64_t>>(), true);
        const std::string number =
            prompt.substr(prompt.find("What is ") + 8, prompt.find(" + 2?") - prompt.find("What is ") - 8);
        const std::string completion = tokenizer->decode(row["completion_ids"].get<std::vector<int64_t>>(), true);
        const std::string text = scorer.conversation_text({{"user", "What is " + number + " + 2?"}}, completion);
        EXPECT_NEAR(row["rewards"]["llama_reward"].get<double>(), scorer.score({text})[0], 1e-6) << line;
    }
    EXPECT_EQ(rows, 4);

    auto error_of = [](const std::function<void()>& f) {
        try {
            f();
        } catch (const std::exception& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    std::string message = error_of([&] {
        grove::Trainer wrong(
            manifest("reward_model_causal", {"train.max_steps=1"}, "[[rewards]]\nmodel = \"" + kModel + "\"\n"), fresh());
    });
    EXPECT_NE(message.find("[[rewards]] #1"), std::string::npos) << message;
    EXPECT_NE(message.find("is a LlamaForCausalLM, not a reward model"), std::string::npos) << message;
    EXPECT_NE(message.find("Qwen2ForSequenceClassification"), std::string::npos) << message;
    message =
        error_of([&] { grove::Trainer wrong(manifest("reward_model_policy", {"model.path=\"" + reward + "\""}), fresh()); });
    EXPECT_NE(message.find("(a reward model), not a policy to train"), std::string::npos) << message;
}

// Only adaptive control carries its coefficient across a resume; a static one is the manifest's,
// so a resumed run may change it (TRL keeps no static coefficient in its checkpoints).
TEST(Trainer, AStaticEntropyCoefficientComesFromTheManifestOnResume) {
    auto m = manifest("entropy_static", {"train.max_steps=2", "loss.entropy_coef=0.01"});
    {
        grove::Trainer first(m, fresh());
        EXPECT_DOUBLE_EQ(first.step().at("entropy_coef"), 0.01);
        first.save_checkpoint();
    }
    grove::TrainerOptions resume;
    resume.resume = "latest";
    grove::Trainer second(grove::Manifest::load(m.path(), {"train.max_steps=2", "loss.entropy_coef=0.03"}), resume);
    EXPECT_DOUBLE_EQ(second.step().at("entropy_coef"), 0.03);
}

TEST(Trainer, ARewardTheModelCanLearnRisesWithin30Steps) {
    std::string reward = "[[rewards]]\nplugin = \"" + kLowIds + "\"\nconfig = { below = 64 }\n";
    grove::Trainer t(manifest("learn",
                              {"train.max_steps=30", "train.per_device_train_batch_size=16", "generation.num_generations=8",
                               "train.lr_scheduler_type=\"constant\"", "train.learning_rate=0.02"},
                              reward),
                     fresh());
    std::vector<double> rewards;
    for (int i = 0; i < 30; ++i) rewards.push_back(t.step()["reward"]);
    double first = (rewards[0] + rewards[1] + rewards[2] + rewards[3] + rewards[4]) / 5;
    double last = (rewards[25] + rewards[26] + rewards[27] + rewards[28] + rewards[29]) / 5;
    // stated margin: the share of low token ids rises by at least 0.3 (it starts near 64/320 = 0.2)
    EXPECT_GT(last, first + 0.3) << "first 5 steps " << first << ", last 5 steps " << last;
}

// Rollouts saved by one run and replayed through [rollouts] path give the same update as the run.
TEST(Trainer, ReplayedRolloutsGiveTheSameUpdate) {
    std::vector<std::string> settings{"train.max_steps=2", "train.per_device_train_batch_size=4", "reduction.plugin=\"dapo\""};
    auto original_settings = settings;
    original_settings.push_back("logging.save_rollouts=true");
    auto original_manifest = manifest("replay_source", original_settings);
    grove::Trainer original(original_manifest, fresh());
    auto before = snapshot(original.model());
    std::vector<std::map<std::string, double>> expected{original.step(), original.step()};
    std::string rollouts = original_manifest.string("output.dir") + "/rollouts.jsonl";
    ASSERT_TRUE(fs::exists(rollouts));

    auto replay_settings = settings;
    replay_settings.push_back("rollouts.path=\"" + rollouts + "\"");
    grove::Trainer replayed(manifest("replay", replay_settings), fresh());
    for (int i = 0; i < 2; ++i) {
        auto got = replayed.step();
        for (const char* key : {"loss", "reward", "grad_norm", "completions/mean_length"})
            EXPECT_DOUBLE_EQ(got[key], expected[size_t(i)][key]) << key << " at step " << i;
        // the saved sampling log-probs are the generator's: they match the trainer's on the first step
        if (i == 0) {
            ASSERT_EQ(got.count("sampling/sampling_logp_difference/mean"), 1u);
            EXPECT_LT(got["sampling/sampling_logp_difference/mean"], 1e-4);
        }
    }
    EXPECT_EQ(max_difference(snapshot(replayed.model()), snapshot(original.model())), 0.0);
    EXPECT_GT(max_difference(snapshot(replayed.model()), before), 0.0);
}

TEST(Trainer, ReplayRejectsBrokenGroups) {
    std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/runs/bad_rollouts.jsonl";
    fs::create_directories(fs::path(dir).parent_path());
    std::ofstream(dir) << R"({"prompt_ids": [5, 6], "completion_ids": [7]})"
                          "\n"
                          R"({"prompt_ids": [5, 9], "completion_ids": [8]})"
                          "\n";
    try {
        grove::Trainer t(manifest("bad_replay", {"train.max_steps=1", "train.per_device_train_batch_size=2",
                                                 "rollouts.path=\"" + dir + "\""}),
                         fresh());
        FAIL() << "accepted a group whose rows have different prompts";
    } catch (const grove::Error& e) {
        EXPECT_NE(std::string(e.what()).find("bad_rollouts.jsonl:2: this row's prompt differs from its group's first row"),
                  std::string::npos)
            << e.what();
    }
}

// Multi-turn rollouts (TRL's env_mask: 1 = the model's token): rows stay whole past their EOS ids,
// lengths count the model's tokens, save_rollouts writes the mask back, and a mask of the wrong
// length is refused with its file and line.
TEST(Trainer, ReplayedMultiTurnRowsKeepTheirEnvironmentMask) {
    std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/runs/multi_turn_rollouts.jsonl";
    fs::create_directories(fs::path(dir).parent_path());
    // eos is <|im_end|> (id 2) in the tiny model's tokenizer
    std::ofstream(dir)
        << R"({"prompt_ids": [5, 6], "completion_ids": [7, 2, 40, 41, 8, 2], "env_mask": [1, 1, 0, 0, 1, 1], "rewards": {"format": 1.0}})"
           "\n"
           R"({"prompt_ids": [5, 6], "completion_ids": [9, 10, 2], "rewards": {"format": 0.0}})"
           "\n";
    auto m = manifest("multi_turn", {"train.max_steps=1", "train.per_device_train_batch_size=2", "logging.save_rollouts=true",
                                     "rollouts.path=\"" + dir + "\""});
    grove::Trainer t(m, fresh());
    auto metrics = t.step();
    EXPECT_DOUBLE_EQ(metrics["completions/mean_length"], 3.5) << "4 model tokens and 3";
    EXPECT_DOUBLE_EQ(metrics["completions/max_length"], 4.0);
    std::ifstream saved(m.string("output.dir") + "/rollouts.jsonl");
    std::string first;
    std::getline(saved, first);
    auto row = nlohmann::json::parse(first);
    EXPECT_EQ(row["completion_ids"], nlohmann::json::parse("[7, 2, 40, 41, 8, 2]")) << "kept whole past the first EOS";
    EXPECT_EQ(row["env_mask"], nlohmann::json::parse("[1, 1, 0, 0, 1, 1]"));

    std::ofstream(dir) << R"({"prompt_ids": [5, 6], "completion_ids": [7, 2], "env_mask": [1]})"
                          "\n"
                          R"({"prompt_ids": [5, 6], "completion_ids": [9, 2]})"
                          "\n";
    try {
        grove::Trainer bad(manifest("multi_turn_bad", {"train.max_steps=1", "train.per_device_train_batch_size=2",
                                                       "rollouts.path=\"" + dir + "\""}),
                           fresh());
        FAIL() << "accepted an env_mask shorter than its completion";
    } catch (const grove::Error& e) {
        EXPECT_NE(std::string(e.what()).find("multi_turn_rollouts.jsonl:1: env_mask has 1 values for 2 completion tokens"),
                  std::string::npos)
            << e.what();
    }
}

// Multi-turn episodes with an environment plugin: tool metrics are logged, the saved rollouts carry
// env_mask, and replaying them (no environment) gives the same update, bit for bit.
// The environment also adds to every prompt before generation (begin_episodes): the saved rollouts
// hold the extended prompts, and replaying them gives the same update, so training used them too.
// The same environment in a worker process (isolation = "process") trains to the same update.
TEST(Trainer, EnvironmentEpisodesTrainAndReplayToTheSameUpdate) {
    const std::string environment = std::string("[environment]\nplugin = \"") + GROVE_TEST_SCRIPTED_ENV_PLUGIN +
                                    "\"\nconfig = { stop = \"e\", turns = 3, prompt_note = \" (note)\" }\nmax_turns = 3\n";
    std::vector<std::string> settings{"train.max_steps=2", "train.per_device_train_batch_size=4",
                                      "generation.max_completion_length=24"};
    auto generated_settings = settings;
    generated_settings.push_back("logging.save_rollouts=true");
    auto generated_manifest = manifest("episodes", generated_settings, "", environment);
    grove::Trainer generated(generated_manifest, fresh());
    std::vector<std::map<std::string, double>> expected{generated.step(), generated.step()};
    EXPECT_GT(expected[0]["tools/call_frequency"], 0.0);
    EXPECT_GT(expected[0]["episodes/turns_mean"], 1.0);
    EXPECT_EQ(expected[0]["tools/failure_frequency"], 0.0);
    EXPECT_GT(expected[0]["episodes/observation_tokens_mean"], 0.0);

    std::string rollouts = generated_manifest.string("output.dir") + "/rollouts.jsonl";
    std::ifstream saved(rollouts);
    std::string line;
    int64_t environment_tokens = 0, noted_prompts = 0, rows = 0;
    const auto tokenizer = grove::Tokenizer::load(kModel);
    while (std::getline(saved, line)) {
        const nlohmann::json row = nlohmann::json::parse(line);
        for (int64_t v : row.at("env_mask").get<std::vector<int64_t>>()) environment_tokens += v == 0;
        const std::string prompt = tokenizer->decode(row.at("prompt_ids").get<std::vector<int64_t>>(), false);
        noted_prompts += prompt.size() > 7 && prompt.compare(prompt.size() - 7, 7, " (note)") == 0;
        ++rows;
    }
    EXPECT_GT(environment_tokens, 0);
    EXPECT_EQ(noted_prompts, rows) << "every saved prompt carries the environment's note";

    auto replay_settings = settings;
    replay_settings.push_back("rollouts.path=\"" + rollouts + "\"");
    grove::Trainer replayed(manifest("episodes_replay", replay_settings), fresh());
    for (int i = 0; i < 2; ++i) {
        auto got = replayed.step();
        for (const char* key : {"loss", "reward", "grad_norm", "completions/mean_length"})
            EXPECT_DOUBLE_EQ(got[key], expected[size_t(i)][key]) << key << " at step " << i;
    }
    EXPECT_EQ(max_difference(snapshot(replayed.model()), snapshot(generated.model())), 0.0);

    // the environment in a worker process (isolation = "process"): the same episodes, the same update
    grove::Trainer isolated(manifest("episodes_isolated", settings, "", environment + "isolation = \"process\"\n"), fresh());
    for (int i = 0; i < 2; ++i) {
        auto got = isolated.step();
        for (const char* key : {"loss", "reward", "grad_norm", "tools/call_frequency", "episodes/turns_mean"})
            EXPECT_DOUBLE_EQ(got[key], expected[size_t(i)][key]) << key << " at step " << i << " (isolated)";
    }
    EXPECT_EQ(max_difference(snapshot(isolated.model()), snapshot(generated.model())), 0.0);
}

// An environment no episode ever calls (scripted: done before any call) gets one warning after ten
// generation batches in a row, naming the plugin and its stop strings; a run whose episodes call it
// gets none.
TEST(Trainer, AToolThatIsNeverCalledIsReportedOnce) {
    auto run = [&](const std::string& name, int64_t turns) {
        const std::string environment = std::string("[environment]\nplugin = \"") + GROVE_TEST_SCRIPTED_ENV_PLUGIN +
                                        "\"\nconfig = { stop = \"e\", turns = " + std::to_string(turns) + " }\nmax_turns = 2\n";
        std::ostringstream log;
        grove::TrainerOptions o = fresh();
        o.log = &log;
        grove::Trainer t(manifest(name,
                                  {"train.max_steps=12", "train.per_device_train_batch_size=4",
                                   "generation.max_completion_length=8", "output.save_steps=100"},
                                  "", environment),
                         o);
        double calls = 0;
        for (int i = 0; i < 12; ++i) calls += t.step()["tools/call_frequency"];
        return std::pair{log.str(), calls};
    };
    const auto [silent_log, no_calls] = run("tool_never_called", 0);
    EXPECT_EQ(no_calls, 0.0);
    const std::string warning = "no episode called the environment '" + std::string(GROVE_TEST_SCRIPTED_ENV_PLUGIN) +
                                "' in 10 generation batches in a row (its stop strings: \"e\")";
    const size_t at = silent_log.find(warning);
    EXPECT_NE(at, std::string::npos) << silent_log;
    EXPECT_EQ(silent_log.find(warning, at + 1), std::string::npos) << "warned twice: " << silent_log;
    const auto [busy_log, calls] = run("tool_called", 2);
    EXPECT_GT(calls, 0.0);
    EXPECT_EQ(busy_log.find("no episode called the environment"), std::string::npos) << busy_log;
}

// [environment] reward_weight: the environment's score of each whole episode (scripted_env: how
// often its observation occurs) is a reward column with its name and weight, next to the plugins'.
TEST(Trainer, AnEnvironmentsScoreOfWholeEpisodesIsARewardColumn) {
    const std::string environment = std::string("[environment]\nplugin = \"") + GROVE_TEST_SCRIPTED_ENV_PLUGIN +
                                    "\"\nconfig = { stop = \"e\", turns = 3 }\nmax_turns = 3\n"
                                    "reward_weight = 0.5\nreward_name = \"answered\"\n";
    grove::Trainer t(
        manifest("environment_reward",
                 {"train.max_steps=2", "train.per_device_train_batch_size=8", "generation.max_completion_length=24"}, "",
                 environment),
        fresh());
    auto m = t.step();
    ASSERT_TRUE(m.count("rewards/answered/mean")) << "no reward column for the environment";
    EXPECT_GT(m["tools/call_frequency"], 0.0);
    // every answered call put one observation into the episode's text
    EXPECT_DOUBLE_EQ(m["rewards/answered/mean"], m["tools/call_frequency"]);
    // the weighted sum: format (weight 1) + 0.5 x answered, averaged over rows with no NaN
    EXPECT_NEAR(m["reward"], m["rewards/format/mean"] + 0.5 * m["rewards/answered/mean"], 1e-6);

    auto error_of = [&](const std::string& name, const std::string& section, const std::string& rewards = "") {
        try {
            grove::Trainer bad(manifest(name, {"train.max_steps=1"}, rewards, section), fresh());
        } catch (const grove::Error& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    // a plugin that does not judge episodes, and a name taken by a [[rewards]] entry
    const std::string no_scores =
        error_of("environment_reward_unscored", "[environment]\nplugin = \"calculator\"\nreward_weight = 1.0\n");
    EXPECT_NE(no_scores.find("does not score whole episodes (SDK score_episodes; in Python, a TRL class's get_reward()); "
                             "remove reward_weight"),
              std::string::npos)
        << no_scores;
    const std::string taken = error_of("environment_reward_name_taken", environment,
                                       "[[rewards]]\nplugin = \"format\"\nname = \"answered\"\nconfig = { pattern = \"a\" }\n");
    EXPECT_NE(taken.find("the environment's reward column \"answered\" has the name of the reward at"), std::string::npos)
        << taken;

    // with no [[rewards]], the environment's judgement alone is the reward (TRL: an environment with
    // get_reward() needs no reward_funcs)
    grove::Trainer alone(
        manifest("environment_reward_alone",
                 {"train.max_steps=1", "train.per_device_train_batch_size=8", "generation.max_completion_length=24"}, "\n",
                 environment),
        fresh());
    auto only = alone.step();
    ASSERT_TRUE(only.count("rewards/answered/mean"));
    EXPECT_FALSE(only.count("rewards/format/mean"));
    EXPECT_NEAR(only["reward"], 0.5 * only["rewards/answered/mean"], 1e-6);
    const std::string no_reward = error_of("no_reward_at_all", "", "\n");
    EXPECT_NE(no_reward.find("no reward: add at least one [[rewards]] table"), std::string::npos) << no_reward;
}

// A plugin may make its judgement of whole episodes a reward without reward_weight (SDK
// episode_reward: TRL adds an environment's get_reward() with weight 1, named after its class); the
// manifest's reward_weight and reward_name override it. One that says it judges nothing, or only on
// request, is no reward on its own.
TEST(Trainer, AnEnvironmentMayMakeItsJudgementARewardItself) {
    const std::string options = "max_turns = 3\n";
    auto section = [&](const std::string& judgement, const std::string& more = "") {
        return std::string("[environment]\nplugin = \"") + GROVE_TEST_SCRIPTED_ENV_PLUGIN +
               "\"\nconfig = { stop = \"e\", turns = 3, judgement = \"" + judgement + "\", reward_name = \"scripted\" }\n" +
               options + more;
    };
    const std::vector<std::string> small = {"train.max_steps=1", "train.per_device_train_batch_size=8",
                                            "generation.max_completion_length=24"};
    grove::Trainer by_default(manifest("environment_reward_by_default", small, "", section("as_reward")), fresh());
    auto m = by_default.step();
    ASSERT_TRUE(m.count("rewards/scripted/mean")) << "the plugin's judgement is no reward column";
    EXPECT_GT(m["rewards/scripted/mean"], 0.0);
    EXPECT_NEAR(m["reward"], m["rewards/format/mean"] + m["rewards/scripted/mean"], 1e-6) << "weighted 1";

    grove::Trainer overridden(manifest("environment_reward_overridden", small, "",
                                       section("as_reward", "reward_weight = 0.25\nreward_name = \"mine\"\n")),
                              fresh());
    m = overridden.step();
    EXPECT_FALSE(m.count("rewards/scripted/mean"));
    ASSERT_TRUE(m.count("rewards/mine/mean"));
    EXPECT_NEAR(m["reward"], m["rewards/format/mean"] + 0.25 * m["rewards/mine/mean"], 1e-6);

    grove::Trainer on_request(manifest("environment_reward_on_request", small, "", section("on_request")), fresh());
    m = on_request.step();
    EXPECT_FALSE(m.count("rewards/scripted/mean")) << "a score_episodes without reward_weight became a reward";

    auto error_of = [&](const std::string& name, const std::string& environment) {
        try {
            grove::Trainer bad(manifest(name, {"train.max_steps=1"}, "\n", environment), fresh());
        } catch (const grove::Error& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    const std::string asked = error_of("environment_reward_only_on_request", section("on_request"));
    EXPECT_NE(asked.find("(scripted) is no reward unless reward_weight is set: error: no reward: add at least one [[rewards]]"),
              std::string::npos)
        << asked;
    const std::string none = error_of("environment_judges_nothing", section("none"));
    EXPECT_NE(none.find("(scripted) is no reward: error: no reward"), std::string::npos) << none;
    const std::string weighted = error_of("environment_judges_nothing_weighted", section("none", "reward_weight = 1.0\n"));
    EXPECT_NE(weighted.find("(scripted) does not score whole episodes"), std::string::npos) << weighted;
}

TEST(Trainer, AnEnvironmentMustBeAnEnvironmentPlugin) {
    try {
        grove::Trainer t(manifest("not_environment", {"train.max_steps=1"}, "", "[environment]\nplugin = \"format\"\n"),
                         fresh());
        FAIL() << "accepted a reward plugin as the environment";
    } catch (const grove::Error& e) {
        EXPECT_NE(std::string(e.what()).find("[environment]"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("is of kind 'reward', but an environment plugin is needed"), std::string::npos)
            << e.what();
    }
    try {
        manifest("environment_without_plugin", {}, "", "[environment]\nmax_turns = 2\n");
        FAIL() << "accepted [environment] without a plugin";
    } catch (const grove::Error& e) {
        EXPECT_NE(std::string(e.what()).find("[environment] needs plugin"), std::string::npos) << e.what();
    }
}

TEST(Trainer, RefusesToOverwriteAnotherRun) {
    auto m = manifest("guard", {"train.max_steps=1"});
    {
        grove::Trainer t(m, fresh());
        t.run();
    }
    try {
        grove::Trainer again(m, grove::TrainerOptions{});
        FAIL() << "a second run reused the output folder";
    } catch (const grove::Error& e) {
        EXPECT_NE(std::string(e.what()).find("already holds a run: pass --resume"), std::string::npos) << e.what();
    }
}

// An objective plugin's NaN gradient stops training at the step and micro-batch where it appeared,
// naming the plugin, before anything is updated or written.
TEST(Trainer, AnObjectivesNanGradientStopsTheRunNamingPluginAndMicroBatch) {
    const std::string plugin = GROVE_TEST_NAN_OBJECTIVE_PLUGIN;
    grove::Trainer t(manifest("nan_objective", {"train.max_steps=2", "train.per_device_train_batch_size=4",
                                                "train.gradient_accumulation_steps=2", "objective.plugin=\"" + plugin + "\""}),
                     fresh());
    try {
        t.step();
        ADD_FAILURE() << "a NaN gradient was back-propagated";
    } catch (const grove::Error& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("optimizer step 1, micro-batch 1 of 2"), std::string::npos) << message;
        EXPECT_NE(message.find("nan_objective"), std::string::npos) << message;
        EXPECT_NE(message.find("non-finite gradient at row 1, column 2"), std::string::npos) << message;
    }
    EXPECT_EQ(t.global_step(), 0) << "the failed step must not count";
}

TEST(Trainer, FullyMaskedBatchGivesZeroLossAndZeroGradient) {
    // every completion masked (e.g. all truncated with mask_truncated_completions): reduction weights
    // are 0, the loss is 0, the gradient is exactly zero and nothing is NaN
    at::Tensor logp = at::randn({3, 4}).requires_grad_(true);
    at::Tensor mask = at::zeros({3, 4});
    grove::PolicyLossOptions o;
    o.beta = 0.1;
    grove::PluginHost host({grove::test::build_plugin_dir()});
    auto info = host.find("clipped", GROVE_PLUGIN_KIND_OBJECTIVE);
    grove::PluginInstance objective(info, grove::PluginConfig::from_toml_text(info, "", "test"));
    grove::PolicyLossInputs in;
    in.logp = logp;
    in.entropy = at::ones({3, 4});
    in.ref_logp = logp.detach() + 0.5;
    in.advantages = at::tensor({1.0f, -1.0f, 0.5f});
    in.mask = mask;
    in.weights = at::zeros({3, 4});
    auto r = grove::policy_loss(objective, in, o);
    r.loss.backward();
    EXPECT_EQ(r.value, 0.0);
    EXPECT_EQ(r.loss.item<double>(), 0.0);
    EXPECT_TRUE(at::equal(logp.grad(), at::zeros_like(logp)));
    for (size_t k = 0; k < r.metrics.names.size(); ++k)  // counts are 0 (or not reported), never NaN sums over tokens
        if (r.metrics.names[k] == "kl") {
            EXPECT_EQ(r.metrics.counts[k], 0.0);
        }
}

// Checkpointed layers recompute their activations in backward, with the random state of the first
// pass (LoRA dropout draws the same masks): two steps give the same losses, gradients and weights.
TEST(Trainer, GradientCheckpointingGivesTheSameSteps) {
    const std::vector<std::vector<std::string>> setups{
        {"train.per_device_train_batch_size=4"},
        {"train.per_device_train_batch_size=4", "adapter.plugin=\"lora\"",
         "adapter.config={ r = 4, alpha = 8.0, dropout = 0.2, target_modules = [\"q_proj\", \"v_proj\", \"down_proj\"] }"}};
    for (size_t i = 0; i < setups.size(); ++i) {
        auto plain = setups[i], checkpointed = setups[i];
        plain.insert(plain.end(), {"train.max_steps=2", "model.gradient_checkpointing=false"});
        checkpointed.insert(checkpointed.end(), {"train.max_steps=2", "model.gradient_checkpointing=true"});
        // one trainer after the other: dropout draws from torch's global generator, which the
        // constructor seeds, so interleaved steps would hand each run the other's random numbers
        grove::Trainer a(manifest("gc_off_" + std::to_string(i), plain), fresh());
        auto before = snapshot(a.model());
        std::vector<std::map<std::string, double>> ma{a.step(), a.step()};
        grove::Trainer b(manifest("gc_on_" + std::to_string(i), checkpointed), fresh());
        EXPECT_TRUE(b.model().gradient_checkpointing());
        std::vector<std::map<std::string, double>> mb{b.step(), b.step()};
        for (size_t step = 0; step < 2; ++step) {
            EXPECT_DOUBLE_EQ(ma[step]["reward"], mb[step]["reward"]) << "setup " << i << " step " << step;
            EXPECT_NEAR(ma[step]["loss"], mb[step]["loss"], 1e-6 * std::max(1.0, std::abs(ma[step]["loss"]))) << "setup " << i;
            EXPECT_NEAR(ma[step]["grad_norm"], mb[step]["grad_norm"], 1e-5 * ma[step]["grad_norm"])
                << "setup " << i << " step " << step;
        }
        EXPECT_LT(max_difference(snapshot(a.model()), snapshot(b.model())), 1e-6) << "setup " << i;
        EXPECT_GT(max_difference(snapshot(a.model()), before), 1e-5) << "setup " << i << ": the update is not empty";
    }
}

// model.disable_dropout (TRL sets every dropout's p to 0, LoRA's included): a LoRA run with dropout
// 0.5 trains exactly as one with dropout 0, and differently without the option.
TEST(Trainer, DisableDropoutTrainsAsNoDropout) {
    auto run = [](const std::string& name, const std::string& dropout, bool disable) {
        grove::Trainer t(manifest(name, {"train.max_steps=2", "train.per_device_train_batch_size=4", "adapter.plugin=\"lora\"",
                                         "adapter.config={ r = 4, alpha = 8.0, dropout = " + dropout +
                                             ", target_modules = [\"q_proj\", \"v_proj\", \"down_proj\"] }",
                                         std::string("model.disable_dropout=") + (disable ? "true" : "false")}),
                         fresh());
        std::vector<double> losses{t.step().at("loss"), t.step().at("loss")};
        return std::pair{losses, snapshot(t.model())};
    };
    const auto none = run("dropout_none", "0.0", false), disabled = run("dropout_disabled", "0.5", true),
               kept = run("dropout_kept", "0.5", false);
    EXPECT_EQ(disabled.first, none.first);
    EXPECT_EQ(max_difference(disabled.second, none.second), 0.0);
    EXPECT_GT(max_difference(kept.second, none.second), 1e-6) << "dropout 0.5 changes the update when it is on";
}

// train.mixed_precision = "bf16" (TRL's bf16 = True) on fixed rollouts: the forward runs in bfloat16,
// so the gradient differs slightly from float32's, while weights and optimizer stay float32.
TEST(Trainer, Bf16AutocastKeepsFloat32WeightsAndStaysClose) {
    // adam_epsilon = 1 makes the first AdamW step nearly SGD, so weight differences follow gradient differences
    std::vector<std::string> settings{"train.max_steps=1", "train.per_device_train_batch_size=4", "reduction.plugin=\"dapo\"",
                                      "train.adam_epsilon=1.0"};
    auto source_settings = settings;
    source_settings.push_back("logging.save_rollouts=true");
    auto source = manifest("bf16_source", source_settings);
    grove::Trainer(source, fresh()).step();
    std::string rollouts = source.string("output.dir") + "/rollouts.jsonl";
    auto replay = settings;
    replay.push_back("rollouts.path=\"" + rollouts + "\"");
    auto fp32 = replay, bf16 = replay;
    fp32.push_back("train.mixed_precision=\"no\"");
    bf16.push_back("train.mixed_precision=\"bf16\"");
    grove::Trainer a(manifest("bf16_off", fp32), fresh());
    grove::Trainer b(manifest("bf16_on", bf16), fresh());
    auto before = snapshot(a.model());
    auto ma = a.step(), mb = b.step();
    EXPECT_DOUBLE_EQ(ma["reward"], mb["reward"]);  // the same rollouts
    ASSERT_GT(ma["grad_norm"], 0.0);
    double relative = std::abs(ma["grad_norm"] - mb["grad_norm"]) / ma["grad_norm"];
    EXPECT_GT(relative, 1e-7) << "identical gradients: autocast did not run";
    EXPECT_LT(relative, 0.05) << "bf16 gradient norm " << mb["grad_norm"] << " vs float32 " << ma["grad_norm"];
    for (const auto& [name, p] : b.model().named_parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat) << name;
    double update = max_difference(snapshot(a.model()), before);
    ASSERT_GT(update, 0.0);
    EXPECT_LT(max_difference(snapshot(a.model()), snapshot(b.model())), 0.05 * update);
}

namespace {
std::map<std::string, at::Tensor> checkpoint_tensors(const std::string& file) {
    grove::SafetensorsFile f(file);
    std::map<std::string, at::Tensor> out;
    for (const auto& t : f.tensors()) out[t.name] = grove::tensor_from_entry(t, f.path()).clone();
    return out;
}
std::string file_text(const std::string& file) {
    std::ifstream in(file);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
std::vector<nlohmann::json> metric_lines(const std::string& file) {
    std::vector<nlohmann::json> out;
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
}

// The tensors of the model a folder holds, as Grove loads it.
std::map<std::string, at::Tensor> model_of(const std::string& folder) {
    auto model = grove::Model::load(folder, "cpu", "float32");
    return snapshot(*model);
}
}  // namespace

// torch.distributed (Gloo): `grove train --nproc 2` with 4 completions per rank equals one process
// with 8 on the same rollouts: each rank scores its slice, rewards are gathered for the advantages,
// token counts are summed for dapo, gradients are averaged, rank 0 writes metrics and checkpoints.
TEST(Trainer, TwoProcessesGiveTheSingleProcessUpdate) {
    auto source =
        manifest("ddp_source", {"train.max_steps=2", "train.per_device_train_batch_size=8", "logging.save_rollouts=true"});
    grove::Trainer(source, fresh()).run();
    std::string rollouts = source.string("output.dir") + "/rollouts.jsonl";
    ASSERT_TRUE(fs::exists(rollouts));
    for (const char* reduction : {"dapo", "grpo"}) {
        std::map<int, std::string> outputs;
        for (int nproc : {1, 2}) {
            std::string name = std::string("ddp_") + reduction + "_" + std::to_string(nproc);
            auto m = manifest(name, {});
            std::string command =
                std::string(GROVE_EXECUTABLE) + " train " + m.path() + " --overwrite --nproc " + std::to_string(nproc) +
                " --set 'rollouts.path=\"" + rollouts + "\"' --set train.max_steps=2 --set output.save_steps=2" +
                " --set train.per_device_train_batch_size=" + std::to_string(8 / nproc) + " --set 'reduction.plugin=\"" +
                reduction + "\"' --set train.adam_epsilon=1.0 2>" + fs::path(m.path()).parent_path().string() + "/stderr.txt";
            ASSERT_EQ(std::system(command.c_str()), 0) << command;
            outputs[nproc] = m.string("output.dir");
            if (nproc == 2) {
                const std::string said = file_text((fs::path(m.path()).parent_path() / "stderr.txt").string());
                EXPECT_NE(said.find("2 processes over gloo"), std::string::npos) << "CPU ranks talk over Gloo:\n" << said;
            }
        }
        auto one = metric_lines(outputs[1] + "/metrics.jsonl"), two = metric_lines(outputs[2] + "/metrics.jsonl");
        ASSERT_EQ(one.size(), 2u) << reduction;
        ASSERT_EQ(two.size(), 2u) << reduction << ": rank 0 alone writes one line per step";
        for (size_t step = 0; step < 2; ++step) {
            for (const char* key : {"reward", "reward_std", "completions/mean_length", "num_tokens", "frac_reward_zero_std"})
                EXPECT_DOUBLE_EQ(one[step][key].get<double>(), two[step][key].get<double>())
                    << reduction << " " << key << " step " << step;
            for (const char* key : {"loss", "grad_norm", "entropy"}) {
                double a = one[step][key].get<double>(), b = two[step][key].get<double>();
                EXPECT_NEAR(a, b, 1e-5 * std::max(1e-3, std::abs(a))) << reduction << " " << key << " step " << step;
            }
        }
        EXPECT_GT(one[0]["grad_norm"].get<double>(), 0.0) << reduction;
        auto weights_one = checkpoint_tensors(outputs[1] + "/checkpoint-2/trainable.safetensors");
        auto weights_two = checkpoint_tensors(outputs[2] + "/checkpoint-2/trainable.safetensors");
        ASSERT_EQ(weights_one.size(), weights_two.size());
        EXPECT_LT(max_difference(weights_one, weights_two), 1e-6) << reduction;
        EXPECT_FALSE(fs::exists(outputs[2] + "/checkpoint-2/buffer.rank1.safetensors"))
            << "a checkpoint at a generation boundary";
    }
}

// A mixture of experts over two processes: an expert that neither rank's tokens reached keeps no
// gradient, as under torch's DDP with find_unused_parameters, so AdamW leaves it alone, weight decay
// included, as one process does; each tensor's step count agrees too. Until 2026-11-29 the ranks
// gave it a zero gradient and decayed it. One step, from a model trained 3 steps (the tiny model's
// routing reaches every expert at first; the routing after a step depends on rounding).
TEST(Trainer, TwoProcessesLeaveAnExpertNoRankReachedAlone) {
    const std::string tiny = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/qwen3_moe_experts";
    auto source = manifest("ddp_moe_source", {"model.path=\"" + tiny + "\"", "train.max_steps=3",
                                              "train.per_device_train_batch_size=2", "logging.save_rollouts=true"});
    grove::Trainer(source, fresh()).run();
    const std::string rollouts = source.string("output.dir") + "/rollouts.jsonl";
    const std::string trained = source.string("output.dir") + "/checkpoint-3";
    const std::string moe = "model.path=\"" + trained + "\"";
    const std::map<std::string, at::Tensor> initial = model_of(trained);
    std::map<int, std::set<std::string>> unchanged;
    std::map<int, std::vector<int64_t>> tensor_steps;
    for (int nproc : {1, 2}) {
        auto m = manifest("ddp_moe_" + std::to_string(nproc), {});
        const std::string command =
            std::string(GROVE_EXECUTABLE) + " train " + m.path() + " --overwrite --nproc " + std::to_string(nproc) +
            " --set '" + moe + "' --set 'rollouts.path=\"" + rollouts + "\"' --set train.max_steps=1" +
            " --set output.save_steps=1 --set train.per_device_train_batch_size=" + std::to_string(2 / nproc) +
            " --set train.weight_decay=0.1 2>" + fs::path(m.path()).parent_path().string() + "/stderr.txt";
        ASSERT_EQ(std::system(command.c_str()), 0) << command;
        const std::string checkpoint = m.string("output.dir") + "/checkpoint-1";
        for (const auto& [name, weights] : model_of(checkpoint))
            if (at::equal(weights, initial.at(name))) unchanged[nproc].insert(name);
        tensor_steps[nproc] = saved_tensor_steps(checkpoint);
    }
    EXPECT_EQ(unchanged[2], unchanged[1]) << "the tensors the step left alone";
    EXPECT_EQ(tensor_steps[2], tensor_steps[1]);
    const auto without_gradient = size_t(std::count(tensor_steps[1].begin(), tensor_steps[1].end(), 0));
    EXPECT_GT(without_gradient, 0u) << "some expert was not reached: the test tests something";
    EXPECT_GE(unchanged[1].size(), without_gradient) << "left alone: those, and tensors whose gradient was 0";
}

// TRL's evaluation during training (train.eval_steps): every second step's line has eval_* metrics,
// equal to what `grove eval` makes of the checkpoint of that step (the same batches and seeds), and
// training goes on exactly as it does without the evaluation.
TEST(Trainer, EvaluationEveryNStepsEqualsEvaluatingThatStepsCheckpoint) {
    const std::vector<std::string> settings{"train.max_steps=4", "train.per_device_train_batch_size=4",
                                            "data.eval_source=\"prompts.jsonl\""};
    std::vector<std::string> evaluating = settings;
    evaluating.insert(evaluating.end(), {"train.eval_steps=2", "train.num_generations_eval=3"});
    auto m = manifest("eval_steps", evaluating);
    grove::Trainer trainer(m, fresh());
    grove::Trainer plain(manifest("eval_steps_off", settings), fresh());
    for (int64_t step = 1; step <= 4; ++step) {
        const auto metrics = trainer.step();
        EXPECT_EQ(metrics.at("loss"), plain.step().at("loss")) << "step " << step;
        EXPECT_EQ(metrics.count("eval_reward"), step % 2 == 0 ? 1u : 0u) << "step " << step;
        if (step != 2) continue;
        const std::string checkpoint = trainer.save_checkpoint();
        grove::EvaluationRequest request = grove::evaluation_request(m);
        request.model_dir = checkpoint;
        request.samples = 3;
        const grove::EvaluationResult expected = grove::evaluate(request);
        ASSERT_EQ(expected.rows.size(), 36u) << "12 prompts x 3";
        EXPECT_NEAR(metrics.at("eval_reward"), expected.reward, 1e-12);
        EXPECT_NEAR(metrics.at("eval_rewards/format/mean"), expected.reward_mean.at("format"), 1e-12);
        EXPECT_NEAR(metrics.at("eval_completions/mean_length"), expected.mean_length, 1e-12);
        EXPECT_NEAR(metrics.at("eval_completions/clipped_ratio"), expected.truncated_ratio, 1e-12);
        EXPECT_GT(metrics.at("eval_completions/max_length"), metrics.at("eval_completions/min_length"));
        EXPECT_GE(metrics.at("eval_frac_reward_zero_std"), 0.0);
        EXPECT_GT(metrics.at("eval_runtime"), 0.0);
    }
    EXPECT_EQ(max_difference(snapshot(trainer.model()), snapshot(plain.model())), 0.0);
    EXPECT_CONTAINS(grove::test::error_message(
                        [] { grove::Trainer refused(manifest("eval_steps_no_source", {"train.eval_steps=2"}), fresh()); }),
                    "train.eval_steps = 2 evaluates on held-out prompts: set data.eval_source");
}

// TrainingArguments' strategies: 12 prompts, 4 a generation batch, so an epoch is 3 optimizer steps
// (as TRL counts them). save_strategy / eval_strategy = "epoch" save and evaluate at steps 3, 6 and
// the run's last, 7; save_steps = 0.5 saves every ceil(3.5) = 4 steps and at the end;
// logging_steps = 0.3 prints every ceil(2.1) = 3; save_strategy = "no" writes only the last.
TEST(Trainer, StrategiesSaveEvaluateAndPrintWhereTransformersWould) {
    auto run = [](const std::string& name, const std::vector<std::string>& settings) {
        std::vector<std::string> all{"train.max_steps=7", "output.save_steps=500"};
        all.insert(all.end(), settings.begin(), settings.end());
        const auto m = manifest(name, all);
        grove::TrainerOptions options = fresh();
        std::ostringstream log;
        options.log = &log;
        grove::Trainer(m, options).run();
        const std::set<int64_t> checkpoints = checkpoint_steps_in(m.string("output.dir"));
        std::set<int64_t> evaluated, printed;
        for (const auto& line : metric_lines(m.string("output.dir") + "/metrics.jsonl"))
            if (line.contains("eval_reward")) evaluated.insert(line["step"].get<int64_t>());
        std::istringstream lines(log.str());
        for (std::string line; std::getline(lines, line);)
            if (line.rfind("step ", 0) == 0) printed.insert(std::stoll(line.substr(5)));
        return std::tuple{checkpoints, evaluated, printed};
    };
    using Steps = std::set<int64_t>;
    const auto [epoch_saves, epoch_evaluations, epoch_lines] = run(
        "strategy_epoch", {"output.save_strategy=\"epoch\"", "train.eval_strategy=\"epoch\"",
                           "data.eval_source=\"prompts.jsonl\"", "train.num_generations_eval=2", "logging.logging_steps=0.3"});
    EXPECT_EQ(epoch_saves, (Steps{3, 6, 7}));
    EXPECT_EQ(epoch_evaluations, (Steps{3, 6, 7}));
    EXPECT_EQ(epoch_lines, (Steps{3, 6, 7}));
    const auto [fraction_saves, no_evaluations, epoch_printed] =
        run("strategy_fraction", {"output.save_steps=0.5", "logging.logging_strategy=\"epoch\""});
    EXPECT_EQ(fraction_saves, (Steps{4, 7}));
    EXPECT_TRUE(no_evaluations.empty());
    EXPECT_EQ(epoch_printed, (Steps{3, 6, 7}));
    const auto [last_only, none, not_printed] =
        run("strategy_no", {"output.save_strategy=\"no\"", "logging.logging_strategy=\"no\""});
    EXPECT_EQ(last_only, (Steps{7})) << "the trained model, as a checkpoint";
    EXPECT_TRUE(not_printed.empty());
}

// train.metric_for_best_model on grove train's evaluation (here eval_reward with greater_is_better =
// false, so that an earlier evaluation than the last is the best: the reward rises a little over
// this run), load_best_model_at_end and save_total_limit = 1: the best evaluation's
// checkpoint is kept beside the last one, and its model is written into output.dir at the end.
// save_strategy = "best" saves after each new best. The default metric, "loss", is refused: TRL's
// GRPO evaluation loss is not computed by Grove.
TEST(Trainer, TheBestEvaluationsCheckpointIsKeptAndItsModelWrittenAtTheEnd) {
    const std::vector<std::string> settings{"train.max_steps=6",
                                            "data.eval_source=\"prompts.jsonl\"",
                                            "train.num_generations_eval=2",
                                            "train.eval_steps=2",
                                            "train.metric_for_best_model=\"reward\"",
                                            "train.greater_is_better=false",
                                            "train.load_best_model_at_end=true"};
    auto run = [&](const std::string& name, const std::vector<std::string>& more, std::string* log_text = nullptr) {
        std::vector<std::string> all = settings;
        all.insert(all.end(), more.begin(), more.end());
        const auto m = manifest(name, all);
        grove::TrainerOptions options = fresh();
        std::ostringstream log;
        options.log = &log;
        grove::Trainer(m, options).run();
        if (log_text) *log_text = log.str();
        return m.string("output.dir");
    };
    std::string log;
    const std::string out = run("best_kept", {"output.save_steps=2", "output.save_total_limit=1"}, &log);
    // the best as transformers' _determine_best_metric finds it: strictly better than every earlier one
    // and the first evaluation that is not, where early_stopping_patience = 1 ends the run
    int64_t best_step = 0, first_without_improvement = 0;
    double best_reward = 0;
    std::set<int64_t> new_bests;
    for (const auto& line : metric_lines(out + "/metrics.jsonl"))
        if (line.contains("eval_reward")) {
            if (const double reward = line["eval_reward"]; best_step == 0 || reward < best_reward) {
                best_step = line["step"], best_reward = reward;
                new_bests.insert(best_step);
            } else if (first_without_improvement == 0) {
                first_without_improvement = line["step"];
            }
        }
    ASSERT_NE(best_step, 0);
    ASSERT_NE(best_step, 6) << "an earlier evaluation is the best here (the case this test is for)";
    EXPECT_EQ(checkpoint_steps_in(out), (std::set<int64_t>{best_step, 6}))
        << "save_total_limit = 1 keeps the best and the last";
    std::ifstream state_file(out + "/checkpoint-6/trainer_state.json");
    const auto state = nlohmann::json::parse(state_file);
    EXPECT_EQ(state["best_global_step"], best_step);
    EXPECT_EQ(state["best_metric"].get<double>(), best_reward);
    EXPECT_EQ(state["best_model_checkpoint"], out + "/checkpoint-" + std::to_string(best_step));
    EXPECT_EQ(max_difference(model_of(out), model_of(out + "/checkpoint-" + std::to_string(best_step))), 0.0);
    EXPECT_GT(max_difference(model_of(out), model_of(out + "/checkpoint-6")), 0.0);
    EXPECT_CONTAINS(log, " is checkpoint-" + std::to_string(best_step) + "'s, whose eval_reward");

    std::set<int64_t> saved_at_bests = new_bests;
    saved_at_bests.insert(6);
    EXPECT_EQ(checkpoint_steps_in(run("best_saved", {"output.save_strategy=\"best\""})), saved_at_bests);

    // early stopping: the run ends at that evaluation, with a checkpoint, and the best model as before
    ASSERT_NE(first_without_improvement, 0);
    ASSERT_LT(first_without_improvement, 6);
    const std::string stopped = run("stopped_early", {"output.save_steps=2", "train.early_stopping_patience=1"}, &log);
    EXPECT_EQ(metric_lines(stopped + "/metrics.jsonl").back()["step"], first_without_improvement);
    EXPECT_TRUE(checkpoint_steps_in(stopped).count(first_without_improvement));
    EXPECT_CONTAINS(log,
                    "grove: early stopping: 1 evaluations in a row did not improve eval_reward by more than 0 on "
                    "the best");
    EXPECT_CONTAINS(log, "the run ends after step " + std::to_string(first_without_improvement) + " of 6");
    EXPECT_EQ(max_difference(model_of(stopped), model_of(out)), 0.0) << "the same best checkpoint's model";

    EXPECT_CONTAINS(grove::test::error_message([] {
                        grove::Trainer(manifest("best_loss", {"data.eval_source=\"prompts.jsonl\"", "train.eval_steps=2",
                                                              "output.save_steps=2", "train.load_best_model_at_end=true"}),
                                       fresh());
                    }),
                    "train.metric_for_best_model = \"loss\": the run's evaluation logs no eval_loss; it logs "
                    "completions/clipped_ratio, completions/max_length");
}

// output.save_only_model in grove train: a checkpoint inside a generation batch leaves out the rest
// of the batch with the optimizer's state; the run's last one, inside a batch too, keeps both, and a
// run resumed from it ends as a straight one.
TEST(Trainer, SaveOnlyModelKeepsTheLastCheckpointWholeInsideAGenerationBatch) {
    const std::vector<std::string> settings{"train.per_device_train_batch_size=4", "train.steps_per_generation=2",
                                            "train.lr_scheduler_type=\"constant\"", "output.save_steps=1",
                                            "output.save_only_model=true"};
    auto with = [&](std::vector<std::string> more) {
        more.insert(more.end(), settings.begin(), settings.end());
        return more;
    };
    grove::Trainer straight(manifest("model_only_straight", with({"train.max_steps=4"})), fresh());
    straight.run();
    auto m = manifest("model_only_resumed", with({"train.max_steps=3"}));
    grove::Trainer(m, fresh()).run();
    const std::string out = m.string("output.dir");
    for (const char* file : {"buffer.safetensors", "optimizer.safetensors", "trainable.safetensors"}) {
        EXPECT_FALSE(fs::exists(out + "/checkpoint-1/" + file)) << file << ": step 1 is inside a generation batch";
        EXPECT_TRUE(fs::exists(out + "/checkpoint-3/" + file)) << file << ": the last checkpoint is whole";
    }
    EXPECT_TRUE(fs::exists(out + "/checkpoint-1/model.safetensors"));
    grove::TrainerOptions resume;
    resume.resume = "latest";
    grove::Trainer second(grove::Manifest::load(m.path(), with({"train.max_steps=4"})), resume);
    second.run();
    EXPECT_EQ(max_difference(snapshot(second.model()), snapshot(straight.model())), 0.0);
}

// train.eval_on_start (TRL's eval_on_start): the starting point, as a step-0 line of metrics.jsonl
// holding only the evaluation, equal to `grove eval` of the model before training.
TEST(Trainer, EvaluationOnStartIsAStepZeroLine) {
    auto m = manifest("eval_on_start",
                      {"train.max_steps=1", "train.per_device_train_batch_size=4", "data.eval_source=\"prompts.jsonl\"",
                       "train.eval_on_start=true", "train.num_generations_eval=2"});
    grove::Trainer(m, fresh()).run();
    const auto lines = metric_lines(m.string("output.dir") + "/metrics.jsonl");
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[0]["step"], 0);
    EXPECT_FALSE(lines[0].contains("loss")) << lines[0].dump();
    EXPECT_FALSE(lines[1].contains("eval_reward")) << "eval_steps = 0: no evaluation after the start";
    grove::EvaluationRequest request = grove::evaluation_request(m);
    request.samples = 2;
    const grove::EvaluationResult before = grove::evaluate(request);  // model.path: the untrained model
    EXPECT_NEAR(lines[0]["eval_reward"].get<double>(), before.reward, 1e-12);
    EXPECT_NEAR(lines[0]["eval_completions/mean_length"].get<double>(), before.mean_length, 1e-12);
}

// Two processes evaluate the same batches with the same seeds as one: with 12 prompts x 8 samples
// in batches of 64 completions, rank 0 takes the first batch and rank 1 the second (learning rate
// 0 keeps both runs' weights identical, so the completions are too).
TEST(Trainer, TwoProcessesEvaluateAsOne) {
    std::map<int, std::vector<nlohmann::json>> lines;
    for (int nproc : {1, 2}) {
        auto m = manifest("eval_nproc_" + std::to_string(nproc), {});
        const std::string command =
            std::string(GROVE_EXECUTABLE) + " train " + m.path() + " --overwrite --nproc " + std::to_string(nproc) +
            " --set train.max_steps=1 --set train.learning_rate=0.0 --set train.per_device_train_batch_size=" +
            std::to_string(8 / nproc) +
            " --set train.eval_steps=1 --set train.num_generations_eval=8 --set 'data.eval_source=\"prompts.jsonl\"' 2>" +
            fs::path(m.path()).parent_path().string() + "/stderr.txt";
        ASSERT_EQ(std::system(command.c_str()), 0) << command;
        lines[nproc] = metric_lines(m.string("output.dir") + "/metrics.jsonl");
        ASSERT_EQ(lines[nproc].size(), 1u);
    }
    for (const char* key : {"eval_reward", "eval_reward_std", "eval_rewards/format/mean", "eval_frac_reward_zero_std",
                            "eval_completions/mean_length", "eval_completions/max_length", "eval_completions/clipped_ratio"}) {
        ASSERT_TRUE(lines[1][0].contains(key)) << key;
        EXPECT_NEAR(lines[1][0][key].get<double>(), lines[2][0][key].get<double>(), 1e-12) << key;
    }
}

// Two ranks judge every evaluation alike (their metrics are gathered), so they save the same new
// bests, stop early together and end with the best checkpoint's model, as one process would.
TEST(Trainer, TwoProcessesKeepTheBestCheckpointAsOne) {
    auto m = manifest("best_nproc", {});
    const std::string command =
        std::string(GROVE_EXECUTABLE) + " train " + m.path() +
        " --overwrite --nproc 2 --set train.max_steps=6 --set train.per_device_train_batch_size=4"
        " --set train.eval_steps=1 --set train.num_generations_eval=2 --set 'data.eval_source=\"prompts.jsonl\"'"
        " --set 'train.metric_for_best_model=\"completions/mean_length\"' --set train.load_best_model_at_end=true"
        " --set 'output.save_strategy=\"best\"' --set train.early_stopping_patience=2 2>" +
        fs::path(m.path()).parent_path().string() + "/stderr.txt";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    const std::string out = m.string("output.dir");
    // the new bests (longer is better here) and where two evaluations in a row without one end the run
    std::set<int64_t> expected;
    double best = 0;
    int64_t without = 0, last = 0, best_step = 0;
    for (const auto& line : metric_lines(out + "/metrics.jsonl")) {
        const double length = line["eval_completions/mean_length"];
        last = line["step"];
        if (expected.empty() || length > best) {
            best = length, without = 0, best_step = last;
            expected.insert(last);
        } else if (++without == 2) {
            break;
        }
    }
    EXPECT_EQ(metric_lines(out + "/metrics.jsonl").back()["step"], last) << "the run ends where the count reaches 2";
    expected.insert(last);  // and a checkpoint where it ends
    EXPECT_EQ(checkpoint_steps_in(out), expected);
    EXPECT_EQ(max_difference(model_of(out), model_of(out + "/checkpoint-" + std::to_string(best_step))), 0.0);
}

// ZeRO stage 1 (train.shard_optimizer_state): two ranks that each keep and update half of the
// tensors give the unsharded update bit for bit, their checkpoint holds the same optimizer state
// (gathered to rank 0), and a sharded run resumes exactly from it; with AdamW and with Adafactor,
// whose state has other shapes than the tensors it is kept for.
TEST(Trainer, ShardedOptimizerStateGivesTheSameUpdateAndCheckpoint) {
    auto source = manifest("zero_source", {"train.max_steps=3", "logging.save_rollouts=true"});
    grove::Trainer(source, fresh()).run();
    const std::string rollouts = source.string("output.dir") + "/rollouts.jsonl";
    for (const std::string optim : {"adamw_torch", "adafactor"}) {
        SCOPED_TRACE(optim);
        auto run = [&](const std::string& name, bool sharded, int steps, bool resume) {
            const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/runs/" + name + "_" + optim;
            if (!resume) manifest(name + "_" + optim, {});
            const std::string command =
                std::string(GROVE_EXECUTABLE) + " train " + dir + "/grove.toml --nproc 2 " +
                (resume ? "--resume" : "--overwrite") + " --set 'rollouts.path=\"" + rollouts +
                "\"' --set train.max_steps=" + std::to_string(steps) +
                " --set output.save_steps=1 --set train.per_device_train_batch_size=4 --set train.weight_decay=0.1" +
                " --set 'train.lr_scheduler_type=\"constant\"' --set 'train.optim=\"" + optim +
                "\"' --set train.shard_optimizer_state=" + (sharded ? "true" : "false") + " 2>>" + dir + "/stderr.txt";
            EXPECT_EQ(std::system(command.c_str()), 0) << command;
            return dir + "/out";
        };
        const std::string whole = run("zero_off", false, 3, false), sharded = run("zero_on", true, 3, false);
        for (const char* file : {"trainable.safetensors", "optimizer.safetensors"}) {
            auto a = checkpoint_tensors(whole + "/checkpoint-3/" + file),
                 b = checkpoint_tensors(sharded + "/checkpoint-3/" + file);
            ASSERT_EQ(a.size(), b.size()) << file;
            EXPECT_EQ(max_difference(a, b), 0.0) << file;
        }
        EXPECT_GT(checkpoint_tensors(whole + "/checkpoint-3/optimizer.safetensors").size(), 2u);

        run("zero_resumed", true, 1, false);
        const std::string resumed = run("zero_resumed", true, 3, true);
        auto a = checkpoint_tensors(sharded + "/checkpoint-3/trainable.safetensors");
        EXPECT_EQ(max_difference(a, checkpoint_tensors(resumed + "/checkpoint-3/trainable.safetensors")), 0.0);
    }
}

// optim = "adafactor": AdamW's settings are named as unused; a resumed run continues as the
// straight run did; its checkpoint keeps the factored state (a fraction of the weights' size, where
// AdamW's is twice it), and resuming it with another optimizer is refused, naming both.
TEST(Trainer, AdafactorResumesExactlyAndKeepsItsOptimizer) {
    const std::vector<std::string> settings{"train.max_steps=4", "train.per_device_train_batch_size=4",
                                            "train.optim=\"adafactor\"", "train.weight_decay=0.1", "train.adam_beta1=0.8"};
    grove::TrainerOptions options = fresh();
    std::ostringstream log;
    options.log = &log;
    grove::Trainer straight(manifest("adafactor_straight", settings), options);
    EXPECT_NE(log.str().find("train.optim = \"adafactor\" does not use train.adam_beta1 (AdamW's settings"), std::string::npos)
        << log.str();
    std::vector<std::map<std::string, double>> expected;
    for (int i = 0; i < 4; ++i) expected.push_back(straight.step());
    const auto m = manifest("adafactor_resumed", settings);
    auto second = resumed_after(m, 2);
    for (int i = 2; i < 4; ++i) {
        auto got = second->step();
        for (const char* key : {"loss", "grad_norm"})
            EXPECT_DOUBLE_EQ(got[key], expected[size_t(i)][key]) << key << " at step " << i;
    }
    EXPECT_EQ(max_difference(snapshot(second->model()), snapshot(straight.model())), 0.0);

    const fs::path checkpoint = fs::path(m.string("output.dir")) / "checkpoint-2";
    EXPECT_LT(fs::file_size(checkpoint / "optimizer.safetensors") * 4, fs::file_size(checkpoint / "trainable.safetensors"));
    EXPECT_TRUE(checkpoint_tensors((checkpoint / "optimizer.safetensors").string()).count("exp_avg_sq_row.0"));

    std::vector<std::string> with_adamw = settings;
    with_adamw.push_back("train.optim=\"adamw_torch\"");
    grove::TrainerOptions resume;
    resume.resume = checkpoint.string();
    try {
        grove::Trainer refused(grove::Manifest::load(m.path(), with_adamw), resume);
        ADD_FAILURE() << "a checkpoint of Adafactor resumed with AdamW";
    } catch (const grove::Error& e) {
        const std::string said = e.what();
        EXPECT_NE(said.find("holds the state of the adafactor optimizer (train.optim = \"adafactor\"), and this run has "
                            "train.optim = \"adamw_torch\" or \"adamw_torch_fused\": resume with the optimizer"),
                  std::string::npos)
            << said;
    }
}

// NCCL asked for where it cannot work (here: the model on the CPU) stops the launcher before any rank
// starts, with the manifest, the key and the fix; nothing is written.
TEST(Trainer, NcclWithoutGpusIsRefusedBeforeAnyRankStarts) {
    auto m = manifest("ddp_nccl_on_cpu", {});
    const fs::path dir = fs::path(m.path()).parent_path();
    fs::remove_all(m.string("output.dir"));
    std::string command = std::string(GROVE_EXECUTABLE) + " train " + m.path() +
                          " --nproc 2 --set 'train.ddp_backend=\"nccl\"' --set 'model.device=\"cpu\"' 2>" +
                          (dir / "stderr.txt").string();
    int status = std::system(command.c_str());
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 3) << "a manifest error";
    const std::string said = file_text((dir / "stderr.txt").string());
    EXPECT_NE(said.find(m.path() + ": train.ddp_backend = \"nccl\" runs between GPUs"), std::string::npos) << said;
    EXPECT_NE(said.find("set ddp_backend = \"gloo\""), std::string::npos) << said;
    EXPECT_EQ(said.find("rank 0"), std::string::npos) << "no rank started:\n" << said;
    EXPECT_FALSE(fs::exists(m.string("output.dir")));
}

// Two ranks stopped inside a generation batch (steps_per_generation 2, a checkpoint after step 1 holds
// each rank's unused micro-batch) and resumed with --resume continue exactly as a straight run.
TEST(Trainer, TwoProcessesResumeExactlyInsideAGenerationBatch) {
    auto run = [](const std::string& name, int steps, bool resume) {
        std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/runs/" + name;
        if (!resume) manifest(name, {});
        std::string command = std::string(GROVE_EXECUTABLE) + " train " + dir + "/grove.toml --nproc 2 " +
                              (resume ? "--resume" : "--overwrite") + " --set train.max_steps=" + std::to_string(steps) +
                              " --set train.per_device_train_batch_size=2 --set train.steps_per_generation=2" +
                              " --set 'train.lr_scheduler_type=\"constant\"' --set output.save_steps=1 2>>" + dir +
                              "/stderr.txt";
        EXPECT_EQ(std::system(command.c_str()), 0) << command;
        return dir + "/out";
    };
    std::string straight = run("ddp_straight", 3, false);
    run("ddp_resumed", 1, false);
    std::string resumed = run("ddp_resumed", 3, true);
    EXPECT_TRUE(fs::exists(resumed + "/checkpoint-1/buffer.rank1.safetensors")) << "rank 1's unused micro-batch";
    auto a = metric_lines(straight + "/metrics.jsonl"), b = metric_lines(resumed + "/metrics.jsonl");
    ASSERT_EQ(a.size(), 3u);
    ASSERT_EQ(b.size(), 3u) << "1 step, then 2 more appended";
    for (size_t step = 0; step < 3; ++step)
        for (const char* key : {"loss", "reward", "grad_norm", "completions/mean_length"}) {
            // generation-side metrics appear only on steps that generated, as TRL logs them
            ASSERT_EQ(a[step].contains(key), b[step].contains(key)) << key << " step " << step;
            if (a[step].contains(key))
                EXPECT_DOUBLE_EQ(a[step][key].get<double>(), b[step][key].get<double>()) << key << " step " << step;
        }
    EXPECT_EQ(max_difference(checkpoint_tensors(straight + "/checkpoint-3/trainable.safetensors"),
                             checkpoint_tensors(resumed + "/checkpoint-3/trainable.safetensors")),
              0.0);
}

// A Qwen3 checkpoint trains with its chat template and model.enable_thinking = false (TRL's
// chat_template_kwargs): every logged prompt ends in the empty <think> block, and the saved folder
// keeps Qwen3's q/k norms (Model.SavedFolderLoadsBackAndInTransformers loads one in transformers).
TEST(Trainer, Qwen3TrainsOnPromptsWithoutThinking) {
    const grove::Manifest base = manifest("qwen3_no_thinking", {});
    const std::string dir = fs::path(base.path()).parent_path().string();
    {
        std::ofstream chat(dir + "/chat.jsonl");
        for (int i = 0; i < 4; ++i)
            chat << nlohmann::json({{"prompt", {{{"role", "user"}, {"content", "What is " + std::to_string(i) + " + 2?"}}}}})
                        .dump()
                 << "\n";
    }
    grove::Trainer trainer(
        grove::Manifest::load(base.path(),
                              {"model.path=\"" + std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny/qwen3_qknorm\"",
                               "model.chat_template=\"qwen3\"", "model.enable_thinking=false", "data.source=\"chat.jsonl\"",
                               "train.max_steps=1", "train.per_device_train_batch_size=4", "logging.log_completions=true"}),
        fresh());
    trainer.step();
    const auto rows = metric_lines(dir + "/out/completions.jsonl");
    ASSERT_EQ(rows.size(), 4u);
    for (const auto& row : rows) {
        const std::string prompt = row["prompt"].get<std::string>();
        EXPECT_NE(prompt.find("<|im_start|>user\nWhat is "), std::string::npos) << prompt;
        EXPECT_EQ(prompt.substr(prompt.size() - 41), "<|im_start|>assistant\n<think>\n\n</think>\n\n") << prompt;
    }
    const std::string saved = dir + "/saved";
    trainer.model().save(saved);
    EXPECT_EQ(grove::load_model_config(saved).model_type, "qwen3");
    EXPECT_TRUE(grove::SafetensorsFile(saved + "/model.safetensors").find("model.layers.1.self_attn.k_norm.weight"));
}

// What a reward logs per row (TRL's log_extra; the fixture plugin logs each row's index in its
// batch, in two calls) reaches completions.jsonl under "extra", beside the row's rewards.
TEST(Trainer, ValuesARewardLogsPerRowReachTheCompletionsLog) {
    const std::string rewards = "[[rewards]]\nplugin = \"" + std::string(GROVE_TEST_MISBEHAVING_PLUGIN) +
                                "\"\nconfig = { behaviour = \"fine\", from_step = 1000 }\n";
    grove::Trainer trainer(
        manifest("extra_columns", {"train.max_steps=1", "train.per_device_train_batch_size=4", "logging.log_completions=true"},
                 rewards),
        fresh());
    trainer.step();
    const std::string out = std::string(GROVE_TEST_BINARY_DIR) + "/trainer/runs/extra_columns/out";
    const auto rows = metric_lines(out + "/completions.jsonl");
    ASSERT_EQ(rows.size(), 4u);
    for (size_t i = 0; i < rows.size(); ++i) {
        ASSERT_TRUE(rows[i].contains("extra")) << rows[i].dump();
        EXPECT_EQ(rows[i]["extra"]["misbehaving/row"], int64_t(i)) << rows[i].dump();
    }
}

// Dynamic sampling assembles a batch from rows of several scoring rounds: each row keeps the values
// a reward logged for it (log_extra). The misbehaving reward logs each row's count of vowels, which
// the test recomputes from the row's completion; a value moved to another row would not match.
TEST(Trainer, DynamicSamplingKeepsEachRowsLoggedValues) {
    const std::string rewards =
        "[[rewards]]\nplugin = \"format\"\nconfig = { pattern = \"[aeiou]\", full_match = false }\n"
        "[[rewards]]\nplugin = \"" +
        std::string(GROVE_TEST_MISBEHAVING_PLUGIN) + "\"\nconfig = { behaviour = \"fine\", from_step = 1000 }\n";
    grove::Trainer trainer(manifest("dynamic_extra",
                                    {"train.max_steps=3", "train.per_device_train_batch_size=8",
                                     "generation.dynamic_sampling=true", "logging.log_completions=true"},
                                    rewards),
                           fresh());
    double filtered_groups = 0;
    for (int i = 0; i < 3; ++i) filtered_groups += trainer.step().at("dynamic_sampling/filtered_groups");
    ASSERT_GT(filtered_groups, 0.0) << "no group was dropped: the batches were not assembled across rounds";
    const auto rows = metric_lines(std::string(GROVE_TEST_BINARY_DIR) + "/trainer/runs/dynamic_extra/out/completions.jsonl");
    ASSERT_EQ(rows.size(), 24u);
    for (const auto& row : rows) {
        const std::string completion = row["completion"];
        const auto vowels = std::count_if(completion.begin(), completion.end(),
                                          [](char c) { return c != 0 && std::strchr("aeiou", c) != nullptr; });
        ASSERT_TRUE(row.contains("extra") && row["extra"].contains("misbehaving/vowels")) << row.dump();
        EXPECT_EQ(row["extra"]["misbehaving/vowels"].get<int64_t>(), vowels) << row.dump();
    }
}

// Resuming from an earlier checkpoint reruns the steps after it: the logs drop what those steps
// wrote before, so every step appears once in metrics.jsonl and completions.jsonl.
TEST(Trainer, ResumeFromAnEarlierCheckpointLogsEveryStepOnce) {
    auto m = manifest(
        "relog", {"train.max_steps=4", "output.save_steps=2", "logging.log_completions=true", "logging.save_rollouts=true"});
    grove::Trainer(m, fresh()).run();
    const std::string out = m.string("output.dir");
    const std::string straight_rollouts = file_text(out + "/rollouts.jsonl");
    grove::TrainerOptions resume;
    resume.resume = out + "/checkpoint-2";
    grove::Trainer(m, resume).run();
    std::vector<int64_t> steps;
    for (const auto& row : metric_lines(out + "/metrics.jsonl")) steps.push_back(row["step"].get<int64_t>());
    EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
    std::map<int64_t, int64_t> completions_per_step;
    for (const auto& row : metric_lines(out + "/completions.jsonl")) ++completions_per_step[row["step"].get<int64_t>()];
    ASSERT_EQ(completions_per_step.size(), 4u);
    for (const auto& [step, count] : completions_per_step) EXPECT_EQ(count, completions_per_step.begin()->second) << step;
    // rollouts.jsonl rows carry no step: the file is cut back to its length at checkpoint-2, and the
    // rerun steps write the same rows again
    EXPECT_FALSE(straight_rollouts.empty());
    EXPECT_EQ(file_text(out + "/rollouts.jsonl"), straight_rollouts);
}

// logging.report_to = "tensorboard": TensorBoard's own loader finds every value of metrics.jsonl,
// evaluation's included, under transformers' tags and at its step, and a resume from an earlier
// checkpoint leaves each step in the event file once (tests/core/train/check_tensorboard.py).
TEST(Trainer, TensorBoardHoldsTheMetricsOnceAcrossAResume) {
    auto m = manifest("tensorboard", {"train.max_steps=4", "output.save_steps=2", "logging.report_to=\"tensorboard\"",
                                      "data.eval_source=\"prompts.jsonl\"", "train.eval_steps=2"});
    grove::Trainer(m, fresh()).run();
    const std::string out = m.string("output.dir");
    const auto events = grove::read_event_file(out + "/runs/events.out.tfevents.grove");
    ASSERT_EQ(events.size(), 5u) << "the file version, then steps 1 to 4";
    grove::TrainerOptions resume;
    resume.resume = out + "/checkpoint-2";
    grove::Trainer(m, resume).run();
    std::vector<int64_t> steps;
    for (const auto& event : grove::read_event_file(out + "/runs/events.out.tfevents.grove"))
        if (event.has_step) steps.push_back(event.step);
    EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
    const std::string command =
        std::string(GROVE_PYTHON) + " " + GROVE_TEST_SOURCE_DIR + "/tests/core/train/check_tensorboard.py " + out;
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

// A checkpoint inside a generation batch, written by a resumed run before it generated anything,
// still records rollouts.jsonl's whole length: resuming from it keeps every row generated before.
TEST(Trainer, ResumedRunsKeepRolloutsExactlyOnce) {
    const std::vector<std::string> common{"output.save_steps=1", "train.steps_per_generation=2",
                                          "train.lr_scheduler_type=\"constant\"", "logging.save_rollouts=true"};
    auto with = [&](std::vector<std::string> more) {
        more.insert(more.end(), common.begin(), common.end());
        return more;
    };
    auto straight = manifest("rollouts_straight", with({"train.max_steps=4"}));
    grove::Trainer(straight, fresh()).run();
    const std::string expected = file_text(straight.string("output.dir") + "/rollouts.jsonl");

    auto m = manifest("rollouts_resumed", with({"train.max_steps=1"}));
    grove::Trainer(m, fresh()).run();
    const std::string out = m.string("output.dir");
    for (int64_t steps : {2, 4}) {  // step 2 replays the buffer (nothing written), then checkpoint-2
        grove::TrainerOptions resume;
        resume.resume = "latest";
        grove::Trainer(grove::Manifest::load(m.path(), with({"train.max_steps=" + std::to_string(steps)})), resume).run();
    }
    EXPECT_FALSE(expected.empty());
    EXPECT_EQ(file_text(out + "/rollouts.jsonl"), expected);
}

// SIGTERM stops `grove train` after the step in flight, writes a checkpoint and exits with 143
// (128 + SIGTERM), so a script can tell an interrupted run from a finished one; with --nproc 2 the
// launcher passes it on and lets every rank finish, reporting no failure.
TEST(Trainer, SigtermWritesACheckpointAndExitsWith143) {
    for (const std::string nproc : {"1", "2"}) {
        SCOPED_TRACE("--nproc " + nproc);
        auto m = manifest("sigterm" + nproc, {});
        const std::string dir = fs::path(m.path()).parent_path().string(), out = m.string("output.dir");
        // `cd` first, on its own: `cd && grove &` would background a subshell, and the kill would miss grove
        const std::string script = "cd " + dir + "; " + GROVE_EXECUTABLE + " train grove.toml --nproc " + nproc +
                                   " --overwrite --set train.max_steps=100000 2>stderr.txt & pid=$!; "
                                   "for i in $(seq 400); do [ -s " +
                                   out +
                                   "/metrics.jsonl ] && break; sleep 0.05; done; "
                                   // the guard's own output goes nowhere: ctest would wait for its sleep to close the pipe
                                   "kill -TERM $pid; (sleep 60; kill -KILL $pid) >/dev/null 2>&1 </dev/null & guard=$!; "
                                   "wait $pid; echo $? > exit_code.txt; kill $guard 2>/dev/null; true";
        ASSERT_EQ(std::system(("bash -c '" + script + "'").c_str()), 0) << script;
        std::ifstream code(dir + "/exit_code.txt");
        int exit_code = -1;
        code >> exit_code;
        const std::string said = file_text(dir + "/stderr.txt");
        EXPECT_EQ(exit_code, 143) << said;
        ASSERT_TRUE(fs::is_symlink(out + "/latest")) << "no checkpoint was written";
        EXPECT_TRUE(fs::exists(out + "/latest/trainer_state.json"));
        EXPECT_CONTAINS(said, "grove: stopped by signal; checkpoint written to");
        EXPECT_EQ(said.find("failed"), std::string::npos) << said;
    }
}

// `grove export --merge` merges any adapter plugin through the ABI's merged_delta: a rank-1 adapter
// written in plain C for this test (plugins/rank_one.c) trains, saves, and its merged export gives
// the adapted model's logits.
TEST(Trainer, ExportMergeWorksForAnyAdapterPlugin) {
    grove::Trainer t(manifest("rank_one", {"train.max_steps=2", std::string("adapter.plugin=\"") + kRankOne + "\"",
                                           "adapter.config={ scale = 3.0 }"}),
                     fresh());
    const auto before = snapshot(t.model());
    ASSERT_EQ(t.model().adapter_parameters().size(), 2u * 2u * 2u);  // 2 layers x (q_proj, down_proj) x (u, v)
    t.step();
    t.step();
    for (const auto& [n, p] : t.model().adapter_parameters())
        if (n.find("rank_one_u") != std::string::npos) EXPECT_FALSE(at::equal(p, before.at(n))) << n << " did not move";
    std::string checkpoint = t.save_checkpoint();
    ASSERT_TRUE(fs::exists(checkpoint + "/grove_adapter.json"));
    at::Tensor ids = at::arange(5, 17, at::kLong).unsqueeze(0), positions = at::arange(0, 12, at::kLong).unsqueeze(0);
    at::NoGradGuard no_grad;
    at::Tensor adapted = t.model().forward(ids, at::ones_like(ids), positions);
    grove::export_merged(checkpoint, kModel, checkpoint + "-merged");
    at::Tensor merged = grove::Model::load(checkpoint + "-merged")->forward(ids, at::ones_like(ids), positions);
    at::Tensor base = grove::Model::load(kModel)->forward(ids, at::ones_like(ids), positions);
    EXPECT_LT((merged - adapted).abs().max().item<double>(), 1e-4);
    EXPECT_GT((base - adapted).abs().max().item<double>(), 1e-3) << "the adapter changed nothing: the test proves nothing";
    // the same checkpoint as grove eval / generate take it: base + merged adapter
    at::Tensor loaded =
        grove::load_model_or_adapter_checkpoint(checkpoint, "cpu", "float32")->forward(ids, at::ones_like(ids), positions);
    EXPECT_LT((loaded - adapted).abs().max().item<double>(), 1e-4);
}

// With steps_per_generation = 2 > accumulation, every other step trains on a generation made
// earlier. TRL logs reward and completion metrics only where a generation happened; loss-side
// metrics (including clip_ratio/low_min and high_max) on every step.
TEST(Trainer, StepsThatReuseAGenerationLogNoGenerationMetrics) {
    grove::Trainer t(
        manifest("reuse", {"train.max_steps=2", "train.per_device_train_batch_size=4", "train.steps_per_generation=2"}),
        fresh());
    auto first = t.step(), second = t.step();
    for (const char* key : {"reward", "reward_std", "completions/mean_length", "rewards/format/mean"}) {
        EXPECT_EQ(first.count(key), 1u) << key;
        EXPECT_EQ(second.count(key), 0u) << key;
    }
    for (const char* key : {"loss", "grad_norm", "entropy", "clip_ratio/low_mean", "clip_ratio/low_min", "clip_ratio/high_max",
                            "clip_ratio/region_mean", "num_tokens", "epoch"}) {
        EXPECT_EQ(first.count(key), 1u) << key;
        EXPECT_EQ(second.count(key), 1u) << key;
    }
}

// The first three steps of a fixed tiny run, pinned (llm.c / torchtune style): drift shows here even
// when Grove and the pinned TRL move together. After an intended numerical change, print the new
// values with GROVE_PRINT_TRAJECTORY=1 build/bin/test_trainer --gtest_filter='*Pinned*' and paste them.
TEST(Trainer, ThreeStepTrajectoryIsPinned) {
    grove::Trainer t(manifest("pinned",
                              {"train.max_steps=3", "train.per_device_train_batch_size=8", "generation.num_generations=4",
                               "loss.beta=0.04", "reduction.plugin=\"grpo\"", "train.lr_scheduler_type=\"constant\""},
                              "[[rewards]]\nplugin = \"" + kLowIds + "\"\nconfig = { below = 64 }\n"),
                     fresh());
    const std::vector<std::array<double, 3>> pinned = {
        // loss, reward, grad_norm
        {0, 0.229166672, 0.143344586},  // on-policy grpo with KL 0 before the first update: loss exactly 0
        {9.24319029e-05, 0.291666672, 0.183205759},
        {0.000228628516, 0.20833334, 0.223152392},
    };
    for (size_t step = 0; step < pinned.size(); ++step) {
        auto m = t.step();
        if (std::getenv("GROVE_PRINT_TRAJECTORY"))
            std::printf("        {%.9g, %.9g, %.9g},\n", m["loss"], m["reward"], m["grad_norm"]);
        EXPECT_NEAR(m["loss"], pinned[step][0], 1e-5 * std::abs(pinned[step][0]) + 1e-7) << "step " << step + 1;
        EXPECT_NEAR(m["reward"], pinned[step][1], 1e-6) << "step " << step + 1;
        EXPECT_NEAR(m["grad_norm"], pinned[step][2], 1e-5 * pinned[step][2]) << "step " << step + 1;
    }
}
