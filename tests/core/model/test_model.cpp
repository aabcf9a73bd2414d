// Grove's Llama-family model against transformers on tiny random checkpoints made by transformers
// (tests/core/model/make_tiny_models.py): logits, greedy generation, log-probabilities, save/load.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <filesystem>
#include <optional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "grove/error.hpp"
#include "grove/generation.hpp"
#include "grove/model.hpp"
#include "grove/safetensors.hpp"
#include "model/tensor_io.hpp"
#include "model/autocast.hpp"
#include "model/decode_kernels.hpp"
#include "model/sampling.hpp"
#include "model/static_decode.hpp"
#include "plugin_test_support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kModels = std::string(GROVE_TEST_BINARY_DIR) + "/models/tiny";
const char* const kNames[] = {"llama_gqa",         "llama3_rope",     "qwen2_tied",     "qwen3_qknorm",    "mistral_mha",
                              "phi3_longrope",     "phi3_partial",    "mistral_window", "qwen2_window",    "smollm3_nope",
                              "gemma2_softcap",    "gemma3_window",   "gemma3_vision",  "olmo2_post_norm", "olmo3_window",
                              "qwen3_moe_experts", "mixtral_experts", "olmoe_experts",  "qwen2_moe_shared"};

std::map<std::string, at::Tensor> reference(const std::string& name) {
    grove::SafetensorsFile file(kModels + "/" + name + "/reference.safetensors");
    std::map<std::string, at::Tensor> out;
    for (const auto& t : file.tensors()) out[t.name] = grove::tensor_from_entry(t, file.path());
    return out;
}

double masked_max_diff(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask) {
    at::Tensor diff = (a - b).abs().amax(-1);  // [B, T]
    return (diff * mask.to(at::kFloat)).max().item<double>();
}

std::vector<std::vector<int64_t>> unpadded_prompts(const at::Tensor& ids, const at::Tensor& mask) {
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t b = 0; b < ids.size(0); ++b) {
        std::vector<int64_t> row;
        for (int64_t t = 0; t < ids.size(1); ++t)
            if (mask[b][t].item<int64_t>()) row.push_back(ids[b][t].item<int64_t>());
        prompts.push_back(row);
    }
    return prompts;
}

}  // namespace

TEST(Model, LogitsMatchTransformers) {
    for (const char* name : kNames) {
        auto model = grove::Model::load(kModels + "/" + name);
        auto ref = reference(name);
        at::NoGradGuard no_grad;
        at::Tensor logits = model->forward(ref["input_ids"], ref["attention_mask"], ref["position_ids"]);
        double diff = masked_max_diff(logits, ref["logits"], ref["attention_mask"]);
        EXPECT_LT(diff, 1e-4) << name;
        EXPECT_GT(ref["logits"].abs().max().item<double>(), 0.1) << name << ": reference logits are degenerate";
    }
}

TEST(Model, GreedyGenerationMatchesTransformers) {
    for (const char* name : kNames) {
        auto model = grove::Model::load(kModels + "/" + name);
        auto ref = reference(name);
        grove::SamplingOptions options;
        options.greedy = true;
        options.max_new_tokens = 8;
        auto result = grove::generate(*model, unpadded_prompts(ref["input_ids"], ref["attention_mask"]), options);
        EXPECT_TRUE(at::equal(result.completion_ids, ref["greedy"])) << name << "\n"
                                                                     << result.completion_ids << "\n"
                                                                     << ref["greedy"];
        EXPECT_TRUE(result.truncated.all().item<bool>()) << name;  // no EOS configured
    }
}

TEST(Model, CompletionLogprobsMatchTransformers) {
    for (const char* name : kNames) {
        auto model = grove::Model::load(kModels + "/" + name);
        auto ref = reference(name);
        at::NoGradGuard no_grad;
        at::Tensor completion = ref["greedy"];
        at::Tensor logprobs = grove::completion_logprobs(*model, ref["input_ids"], ref["attention_mask"], completion,
                                                         at::ones_like(completion), 0.7);
        EXPECT_LT((logprobs - ref["logprobs"]).abs().max().item<double>(), 1e-4) << name;
    }
}

// In bf16 each product rounds where transformers' bf16 model rounds it (Llama's norms scale after
// the cast, OLMo 2's and Gemma 3's before it, OLMo 2 rotates in float32): the log-probs equal
// transformers' own bf16 ones, where rounding at another place moves them by about 1e-2. Gemma 2's
// final logits are soft-capped in float32, as TRL's fused head caps them (transformers' forward caps
// the bf16 logits: 5e-3 apart).
TEST(Model, Bfloat16LogprobsAreTransformersBfloat16Logprobs) {
    for (const char* name : kNames) {
        auto model = grove::Model::load(kModels + "/" + name, "cpu", "bfloat16");
        auto ref = reference(name);
        at::NoGradGuard no_grad;
        at::Tensor completion = ref["greedy"];
        at::Tensor logprobs = grove::completion_logprobs(*model, ref["input_ids"], ref["attention_mask"], completion,
                                                         at::ones_like(completion), 0.7);
        EXPECT_LT((logprobs - ref["logprobs_bf16"]).abs().max().item<double>(), 1e-4) << name;
    }
}

TEST(Model, ChunkedLogprobsEqualUnchunked) {
    auto model = grove::Model::load(kModels + "/llama_gqa");
    auto ref = reference("llama_gqa");
    at::NoGradGuard no_grad;
    at::Tensor hidden = model->hidden_states(ref["input_ids"], ref["attention_mask"], ref["position_ids"]);
    at::Tensor targets = ref["input_ids"];
    at::Tensor whole = grove::token_logprobs(*model, hidden, targets, 0.9, 1 << 20);
    at::Tensor chunked = grove::token_logprobs(*model, hidden, targets, 0.9, 3);
    EXPECT_TRUE(at::allclose(whole, chunked, 1e-6, 1e-6));
    at::Tensor direct = (model->logits(hidden) / 0.9).log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1);
    EXPECT_TRUE(at::allclose(whole, direct, 1e-5, 1e-5));
}

TEST(Model, SamplingIsSeededAndStopsAtAnyEos) {
    auto model = grove::Model::load(kModels + "/llama3_rope");
    auto ref = reference("llama3_rope");
    auto prompts = unpadded_prompts(ref["input_ids"], ref["attention_mask"]);
    grove::SamplingOptions options;
    options.max_new_tokens = 12;
    options.temperature = 1.3;
    options.top_k = 50;
    options.top_p = 0.95;
    options.seed = 7;
    auto a = grove::generate(*model, prompts, options);
    auto b = grove::generate(*model, prompts, options);
    EXPECT_TRUE(at::equal(a.completion_ids, b.completion_ids));
    options.seed = 8;
    auto c = grove::generate(*model, prompts, options);
    EXPECT_FALSE(at::equal(a.completion_ids, c.completion_ids));

    // make the first greedy token an EOS id: that row stops at once, its mask covers the EOS only
    grove::SamplingOptions greedy;
    greedy.greedy = true;
    greedy.max_new_tokens = 8;
    int64_t first = ref["greedy"][1][0].item<int64_t>();
    greedy.eos_token_ids = {1000, first};
    greedy.pad_token_id = 0;
    auto stopped = grove::generate(*model, prompts, greedy);
    EXPECT_FALSE(stopped.truncated[1].item<bool>());
    EXPECT_EQ(stopped.lengths[1], 1);
    EXPECT_EQ(stopped.completion_mask[1].sum().item<int64_t>(), 1);
    EXPECT_EQ(stopped.completion_ids[1][0].item<int64_t>(), first);
    for (int64_t t = 1; t < stopped.completion_ids.size(1); ++t) EXPECT_EQ(stopped.completion_ids[1][t].item<int64_t>(), 0);
    // the sampled log-probs are the model's log softmax of the chosen tokens
    EXPECT_LT(stopped.sampled_logprobs[1][0].item<double>(), 0.0);
    EXPECT_EQ(stopped.sampled_logprobs[1][1].item<double>(), 0.0);
}

// Rows that stop leave the decode batch; the others sample exactly what they would have sampled
// with no row stopping (each prompt keeps its own uniforms), and the stopped rows end at their EOS.
TEST(Model, RowsThatStopDoNotChangeTheOthers) {
    auto model = grove::Model::load(kModels + "/llama_gqa");
    auto ref = reference("llama_gqa");
    auto prompts = unpadded_prompts(ref["input_ids"], ref["attention_mask"]);
    auto once = prompts;
    prompts.insert(prompts.end(), once.begin(), once.end());  // more rows, more ways to stop
    grove::SamplingOptions options;
    options.max_new_tokens = 16;
    options.temperature = 1.5;
    options.seed = 11;
    options.pad_token_id = 0;
    auto free_run = grove::generate(*model, prompts, options);
    const int64_t N = int64_t(prompts.size()), C = options.max_new_tokens;
    // EOS ids: a token each of the first rows sampled mid-way; the other rows must not all sample one
    std::vector<int64_t> eos;
    for (int64_t row = 0; row < N / 2; ++row) eos.push_back(free_run.completion_ids[row][2 + row].item<int64_t>());
    auto first_at = [&](int64_t row) {
        for (int64_t t = 0; t < C; ++t)
            if (std::count(eos.begin(), eos.end(), free_run.completion_ids[row][t].item<int64_t>())) return t;
        return C;
    };
    int64_t rows_running_to_the_end = 0;
    for (int64_t row = 0; row < N; ++row) rows_running_to_the_end += first_at(row) == C;
    ASSERT_GT(rows_running_to_the_end, 0) << "every row samples an EOS id; change the seed";
    options.eos_token_ids = eos;
    auto stopping = grove::generate(*model, prompts, options);
    int64_t stopped_rows = 0;
    for (int64_t row = 0; row < N; ++row) {
        int64_t stop = first_at(row);
        int64_t length = std::min(stop + 1, C);
        stopped_rows += stop < C;
        EXPECT_EQ(stopping.lengths[size_t(row)], length) << "row " << row;
        EXPECT_EQ(stopping.truncated[row].item<bool>(), stop == C) << "row " << row;
        EXPECT_TRUE(
            at::equal(stopping.completion_ids[row].narrow(0, 0, length), free_run.completion_ids[row].narrow(0, 0, length)))
            << "row " << row;
        EXPECT_LT((stopping.sampled_logprobs[row].narrow(0, 0, length) - free_run.sampled_logprobs[row].narrow(0, 0, length))
                      .abs()
                      .max()
                      .item<double>(),
                  1e-5)
            << "row " << row;
        if (length < stopping.completion_ids.size(1))
            EXPECT_EQ(stopping.completion_ids[row]
                          .narrow(0, length, stopping.completion_ids.size(1) - length)
                          .abs()
                          .sum()
                          .item<int64_t>(),
                      0)
                << "row " << row << ": pad after the EOS";
    }
    EXPECT_GE(stopped_rows, 2);
}

// Multi-turn sampling: rows that end their turns at different steps (so their caches have different
// lengths) continue from the KV cache with an observation, one keeping only part of its turn; each
// row's next turn is the turn that greedy generation samples from the whole history, re-prefilled.
// With a repetition penalty too: the observation's tokens count as seen, as they would in the history.
TEST(Model, ContinuingFromTheCacheEqualsGeneratingFromTheWholeHistory) {
    // (mistral_window: the sliding window counts the tokens kept, not the cache columns rolled back)
    for (const auto& [name, penalty] :
         {std::pair{"llama_gqa", 1.0}, {"qwen2_tied", 1.0}, {"llama_gqa", 1.3}, {"mistral_window", 1.0}}) {
        SCOPED_TRACE(std::string(name) + ", repetition_penalty " + std::to_string(penalty));
        auto model = grove::Model::load(kModels + "/" + name);
        auto ref = reference(name);
        auto prompts = unpadded_prompts(ref["input_ids"], ref["attention_mask"]);
        grove::SamplingOptions greedy;
        greedy.greedy = true;
        greedy.pad_token_id = 0;
        greedy.repetition_penalty = penalty;
        const size_t N = prompts.size();
        ASSERT_GE(N, 2u);
        grove::DecodeSession session(*model, prompts, greedy, 4, /*resumable=*/true);
        std::vector<int64_t> limits;
        for (size_t i = 0; i < N; ++i) limits.push_back(3 + int64_t(i) * 2);  // turns end at different steps
        // row 0 also stops early at its second token, as a stop string would
        auto first = session.sample_turn(
            limits, [](size_t row, const std::vector<int64_t>& turn) { return row == 0 && turn.size() == 2; });
        ASSERT_EQ(first[0].ids.size(), 2u);
        ASSERT_EQ(first[1].ids.size(), 5u);
        std::vector<grove::DecodeSession::Continuation> going_on;
        std::vector<std::vector<int64_t>> histories(N);
        for (size_t i = 0; i < N; ++i) {
            // row 1 keeps 3 of its 5 tokens (a stop string found late): the cache rolls back
            const int64_t keep = i == 1 ? 3 : int64_t(first[i].ids.size());
            std::vector<int64_t> observation = {5 + int64_t(i), 17, 9 + int64_t(i) * 3};
            observation.resize(1 + i % 3);  // observations of different lengths
            going_on.push_back({i, keep, observation});
            histories[i] = prompts[i];
            histories[i].insert(histories[i].end(), first[i].ids.begin(), first[i].ids.begin() + keep);
            histories[i].insert(histories[i].end(), observation.begin(), observation.end());
        }
        session.continue_rows(going_on);
        auto second = session.sample_turn(std::vector<int64_t>(N, 6));
        greedy.max_new_tokens = 6;
        auto whole = grove::generate(*model, histories, greedy);
        for (size_t i = 0; i < N; ++i) {
            SCOPED_TRACE("row " + std::to_string(i));
            ASSERT_EQ(second[i].ids.size(), 6u);
            at::Tensor expected = whole.completion_ids[int64_t(i)];
            EXPECT_TRUE(at::equal(at::tensor(second[i].ids, at::kLong), expected));
            EXPECT_LT(
                (at::tensor(second[i].logprobs, at::kFloat) - whole.sampled_logprobs[int64_t(i)]).abs().max().item<double>(),
                1e-4);
        }
        // rows not continued finish: they sample nothing more
        session.continue_rows({{0, int64_t(second[0].ids.size()), {7}}});
        auto third = session.sample_turn(std::vector<int64_t>(N, 2));
        EXPECT_EQ(third[0].ids.size(), 2u);
        for (size_t i = 1; i < N; ++i) EXPECT_TRUE(third[i].ids.empty());
        EXPECT_CONTAINS(grove::test::error_message([&] { session.continue_rows({{1, 1, {7}}}); }), "not waiting to continue");
    }
}

// The static-shape engine (CUDA graphs on a GPU; here the same steps run eagerly) generates what the
// eager loop generates: 20 rows, most of which stop early at EOS ids they sample, so the live rows
// move to smaller batch-size buckets (20 -> 16 -> 8) mid-generation; greedy, sampled with filters,
// and with a repetition penalty. Sampling uses float32 cumulative sums where the eager loop's CPU
// kernel works in its own precision, so sampled tokens may differ only where a uniform falls within
// rounding of a boundary: none does with these seeds.
TEST(Model, StaticEngineGeneratesWhatTheEagerLoopGenerates) {
    for (const std::string name :
         {"llama_gqa", "qwen2_tied", "qwen3_qknorm", "phi3_longrope", "phi3_partial", "mistral_window", "qwen2_window",
          "smollm3_nope", "gemma3_window", "gemma3_vision", "olmo2_post_norm", "olmo3_window"}) {
        auto model = grove::Model::load(kModels + "/" + name);
        const auto generation_copy = model->generation_copy(at::kFloat);
        // the same layout made in place, as `grove generate` does on CUDA for a model it uses as it is
        auto concatenated = grove::Model::load(kModels + "/" + name);
        concatenated->concatenate_projections();
        auto ref = reference(name);
        auto prompts = unpadded_prompts(ref["input_ids"], ref["attention_mask"]);
        const auto base = prompts;
        for (size_t row = prompts.size(); row < 20; ++row) {  // lengths in no pattern that moving rows could keep
            auto prompt = base[row % base.size()];
            prompt.resize(1 + (row * 7) % prompt.size());
            prompts.push_back(prompt);
        }
        for (int variant = 0; variant < 3; ++variant) {
            grove::SamplingOptions options;
            options.max_new_tokens = 24;
            options.seed = 7;
            options.greedy = variant == 0;
            options.temperature = variant == 0 ? 1.0 : 1.3;
            if (variant == 1) options.top_k = 50, options.top_p = 0.95;
            if (variant == 2) options.repetition_penalty = 1.3;
            // EOS ids that rows sample early, so most rows stop and the buckets shrink
            const auto free_run = grove::generate(*model, prompts, options);
            for (int64_t row = 0; row < 14; ++row)
                options.eos_token_ids.push_back(free_run.completion_ids[row][1 + row % 6].item<int64_t>());
            const auto eager = grove::generate(*model, prompts, options);
            const auto engine = grove::static_generate(*model, prompts, options);
            const std::string where = name + " variant " + std::to_string(variant);
            int64_t early = 0;
            for (size_t row = 0; row < prompts.size(); ++row) early += eager.lengths[row] <= 8;
            EXPECT_GE(early, 12) << where << ": too few rows stop early to shrink the bucket";
            EXPECT_EQ(engine.lengths, eager.lengths) << where;
            EXPECT_TRUE(at::equal(engine.truncated, eager.truncated)) << where;
            ASSERT_TRUE(at::equal(engine.completion_ids, eager.completion_ids)) << where;
            EXPECT_TRUE(at::equal(engine.completion_mask, eager.completion_mask)) << where;
            EXPECT_LT((engine.sampled_logprobs - eager.sampled_logprobs).abs().max().item<double>(), 1e-4) << where;
            // a generation copy's step: q/k/v and gate/up as one GEMM each (concatenated weights, or
            // Phi-3's fused ones split into views)
            const auto copied = grove::static_generate(*generation_copy, prompts, options);
            ASSERT_TRUE(at::equal(copied.completion_ids, eager.completion_ids)) << where << " (generation copy)";
            EXPECT_EQ(copied.lengths, eager.lengths) << where << " (generation copy)";
            EXPECT_LT((copied.sampled_logprobs - eager.sampled_logprobs).abs().max().item<double>(), 1e-4) << where;
            const auto in_place = grove::static_generate(*concatenated, prompts, options);
            ASSERT_TRUE(at::equal(in_place.completion_ids, eager.completion_ids)) << where << " (concatenated in place)";
            EXPECT_LT((in_place.sampled_logprobs - eager.sampled_logprobs).abs().max().item<double>(), 1e-4) << where;
        }
        // in place, q/k/v are rows of one matrix (Phi-3's are one checkpoint tensor already)
        const auto weights = concatenated->named_parameters();
        auto weight = [&](const std::string& module) {
            for (const auto& [n, w] : weights)
                if (n.find(".layers.0." + module + ".weight") != std::string::npos) return w;
            return at::Tensor();
        };
        if (const at::Tensor q = weight("self_attn.q_proj"); q.defined()) {
            const at::Tensor k = weight("self_attn.k_proj");
            EXPECT_EQ(static_cast<const char*>(k.data_ptr()),
                      static_cast<const char*>(q.data_ptr()) + q.numel() * q.element_size())
                << name << ": k_proj does not follow q_proj in one matrix";
        }
    }
}

// The output layer's log-probabilities with the logits recomputed in the backward pass (the CUDA
// training path) have autograd's values and gradients, for the hidden states and the head weight,
// in float32 and under bf16 autocast.
TEST(Model, RecomputedLogprobsHaveAutogradsGradients) {
    auto model = grove::Model::load(kModels + "/qwen2_tied");
    at::manual_seed(3);
    const int64_t M = 11, H = model->config().hidden_size, V = model->config().vocab_size;
    const at::Tensor hidden0 = at::randn({M, H}), weight0 = model->lm_head_weight().detach().clone();
    const at::Tensor targets = at::randint(V, {M, 1}), upstream = at::randn({M});
    for (const bool autocast : {false, true}) {
        if (autocast) {
            at::autocast::set_autocast_enabled(at::kCPU, true);
            at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
        }
        auto run = [&](bool recomputed) {
            at::Tensor hidden = hidden0.clone().requires_grad_(true), weight = weight0.clone().requires_grad_(true);
            at::Tensor logp;
            if (recomputed) {
                logp = grove::detail::recomputed_token_logprobs(hidden, weight, targets, 0.7, 4);
            } else {  // autograd's path, as token_logprobs computes it
                at::Tensor logits = at::linear(hidden, weight).to(at::kFloat) / 0.7;
                logp = logits.gather(-1, targets).squeeze(-1) - at::logsumexp(logits, -1);
            }
            (logp * upstream).sum().backward();
            return std::tuple{logp.detach(), hidden.grad(), weight.grad()};
        };
        const auto [logp_a, hidden_a, weight_a] = run(false);
        const auto [logp_r, hidden_r, weight_r] = run(true);
        at::autocast::set_autocast_enabled(at::kCPU, false);
        const double tolerance = autocast ? 2e-2 : 1e-5;  // bf16: the head's gradient summed in float32, not bf16
        const std::string where = autocast ? "bf16 autocast" : "float32";
        EXPECT_LT((logp_r - logp_a).abs().max().item<double>(), 1e-5) << where;
        EXPECT_LT((hidden_r - hidden_a).abs().max().item<double>(), tolerance * hidden_a.abs().max().item<double>()) << where;
        EXPECT_LT((weight_r - weight_a).abs().max().item<double>(), tolerance * weight_a.abs().max().item<double>()) << where;
        EXPECT_EQ(weight_r.scalar_type(), at::kFloat) << where;
    }
}

// Gradient checkpointing recomputes each layer under the forward's autocast state: with bf16
// autocast on, the gradients equal those without checkpointing (a float32 recomputation would
// differ at bf16's precision).
TEST(Model, CheckpointedLayersRecomputeUnderTheForwardsAutocast) {
    auto model = grove::Model::load(kModels + "/llama_gqa");
    model->set_base_trainable(true);
    const at::Tensor ids = at::randint(3, model->config().vocab_size, {2, 9}, at::kLong), mask = at::ones({2, 9}, at::kLong);
    const at::Tensor positions = at::arange(9, at::kLong).unsqueeze(0).expand({2, 9});
    auto gradients = [&](bool checkpointing) {
        model->set_gradient_checkpointing(checkpointing);
        for (auto& [name, p] : model->named_parameters()) p.mutable_grad() = at::Tensor();
        at::autocast::set_autocast_enabled(at::kCPU, true);
        at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
        at::Tensor loss = model->hidden_states(ids, mask, positions).to(at::kFloat).pow(2).mean();
        at::autocast::set_autocast_enabled(at::kCPU, false);  // the backward runs without it, as in the trainer
        loss.backward();
        std::vector<at::Tensor> out;
        for (auto& [name, p] : model->named_parameters())
            if (p.grad().defined()) out.push_back(p.grad().clone());
        return out;
    };
    const auto plain = gradients(false), checkpointed = gradients(true);
    model->set_gradient_checkpointing(false);
    ASSERT_EQ(plain.size(), checkpointed.size());
    for (size_t i = 0; i < plain.size(); ++i)
        EXPECT_LT((plain[i] - checkpointed[i]).abs().max().item<double>(), 1e-6 + 1e-4 * plain[i].abs().max().item<double>())
            << "parameter " << i;
}

// A mixture of experts' load-balancing loss through checkpointed layers: the routing each sparse
// layer records (its probabilities' graph rebuilt by the backward) gives the gradients of the plain
// forward, and the loss does reach the routers (their gradients move when it is added).
TEST(Model, CheckpointedExpertsGiveTheLoadBalancingGradients) {
    for (const std::string name : {"qwen3_moe_experts", "mixtral_experts", "olmoe_experts", "qwen2_moe_shared"}) {
        auto model = grove::Model::load(kModels + "/" + name);
        model->set_base_trainable(true);
        const grove::ModelConfig& c = model->config();
        const at::Tensor ids = at::randint(3, c.vocab_size, {11}, at::kLong);
        const at::Tensor positions = at::cat({at::arange(6, at::kLong), at::arange(5, at::kLong)});
        int64_t sparse_layers = 0;
        for (int64_t l = 0; l < c.num_hidden_layers; ++l) sparse_layers += c.layer_sparse(size_t(l));
        auto gradients = [&](bool checkpointing, bool balancing) {
            model->set_gradient_checkpointing(checkpointing);
            for (auto& [key, p] : model->named_parameters()) p.mutable_grad() = at::Tensor();
            grove::RouterLoad routing;
            at::Tensor loss = model->packed_hidden_states(ids, positions, {6, 5}, &routing).pow(2).mean();
            EXPECT_EQ(routing.routed, 11 * sparse_layers) << name;
            if (balancing) loss = loss + routing.balancing_loss();
            loss.backward();
            std::map<std::string, at::Tensor> out;
            for (auto& [key, p] : model->named_parameters()) out[key] = p.grad().defined() ? p.grad().clone() : at::zeros({1});
            return out;
        };
        const auto plain = gradients(false, true), checkpointed = gradients(true, true), unbalanced = gradients(false, false);
        model->set_gradient_checkpointing(false);
        for (const auto& [key, g] : plain)
            EXPECT_LT((g - checkpointed.at(key)).abs().max().item<double>(), 1e-6 + 1e-5 * g.abs().max().item<double>())
                << name << " " << key;
        const std::string first_sparse = std::to_string(c.layer_sparse(0) ? 0 : 1);
        const std::string router =
            "model.layers." + first_sparse + (c.model_type == "mixtral" ? ".block_sparse_moe.gate.weight" : ".mlp.gate.weight");
        EXPECT_GT((plain.at(router) - unbalanced.at(router)).abs().max().item<double>(), 1e-4) << name;
    }
}

// cast_lm_head_to_fp32 against TRL: on the final hidden states TRL's bfloat16 model computed
// (make_tiny_models.py hooks them), Grove's output layer gives TRL's completion log-probabilities
// with the head in float32, and TRL's bf16 ones without; the two differ by far more than the
// tolerance. An untied head and one tied to the embedding: the tied one keeps the embedding matrix
// in float32 while its lookups stay bf16, so the hidden states are the plain bf16 model's. Under
// bf16 autocast a float32 model's head still runs in float32, outside it.
TEST(Model, Float32HeadGivesTrlsCastLmHeadLogprobs) {
    auto max_abs = [](const at::Tensor& t) { return t.abs().max().item<double>(); };
    for (const std::string name : {"llama_gqa", "qwen2_tied", "gemma2_softcap", "gemma3_window"}) {
        grove::SafetensorsFile file(kModels + "/" + name + "/float32_head.safetensors");
        auto t = [&](const char* n) { return grove::tensor_from_entry(*file.find(n), file.path()); };
        const double temperature = 0.7;
        const at::Tensor targets = t("targets");
        auto plain = grove::Model::load(kModels + "/" + name, "cpu", "bfloat16");
        auto cast = grove::Model::load(kModels + "/" + name, "cpu", "bfloat16");
        cast->keep_lm_head_in_float32();
        EXPECT_EQ(cast->lm_head_weight().scalar_type(), at::kFloat) << name;
        EXPECT_EQ(cast->dtype(), at::kBFloat16) << name;
        at::NoGradGuard no_grad;
        const at::Tensor ours_cast = grove::token_logprobs(*cast, t("hidden_cast"), targets, temperature);
        const at::Tensor ours_plain = grove::token_logprobs(*plain, t("hidden_plain"), targets, temperature);
        EXPECT_LT(max_abs(ours_cast - t("logps_cast")), 1e-5) << name;
        EXPECT_LT(max_abs(ours_plain - t("logps_plain")), 1e-5) << name;
        EXPECT_GT(max_abs(ours_cast - t("logps_plain")), 1e-4) << name << ": the tolerance must tell the heads apart";

        const at::Tensor ids = t("input_ids"), mask = at::ones_like(ids);
        const at::Tensor positions = at::arange(ids.size(1), at::kLong).unsqueeze(0).expand_as(ids);
        const at::Tensor hidden = cast->hidden_states(ids, mask, positions);
        EXPECT_TRUE(at::equal(hidden, plain->hidden_states(ids, mask, positions))) << name;
        EXPECT_EQ(cast->logits(hidden).scalar_type(), at::kFloat) << name;

        auto float32 = grove::Model::load(kModels + "/" + name), float32_cast = grove::Model::load(kModels + "/" + name);
        float32_cast->keep_lm_head_in_float32();
        const at::Tensor h = t("hidden_cast").to(at::kFloat);
        const at::Tensor exact = grove::token_logprobs(*float32, h, targets, temperature);
        grove::AutocastScope autocast(at::kCPU);
        EXPECT_LT(max_abs(grove::token_logprobs(*float32_cast, h, targets, temperature) - exact), 1e-6) << name;
        EXPECT_GT(max_abs(grove::token_logprobs(*float32, h, targets, temperature) - exact), 1e-4)
            << name << ": autocast rounds the plain head's product to bf16";
    }
}

TEST(Model, EosIdsComeFromConfigAndGenerationConfig) {
    auto config = grove::load_model_config(kModels + "/llama3_rope");
    EXPECT_EQ(config.eos_token_ids, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(config.rope_scaling.type, "llama3");
}

TEST(Model, SavedFolderLoadsBackAndInTransformers) {
    // one Python process checks every saved folder: importing transformers is most of its time
    std::string command = std::string(GROVE_PYTHON) + " " + GROVE_TEST_SOURCE_DIR + "/tests/core/model/check_saved.py";
    for (const char* name : kNames) {
        auto model = grove::Model::load(kModels + "/" + name);
        std::string out = std::string(GROVE_TEST_BINARY_DIR) + "/models/saved/" + name;
        fs::remove_all(out);
        model->save(out);
        auto again = grove::Model::load(out);
        auto ref = reference(name);
        at::NoGradGuard no_grad;
        at::Tensor a = model->forward(ref["input_ids"], ref["attention_mask"], ref["position_ids"]);
        at::Tensor b = again->forward(ref["input_ids"], ref["attention_mask"], ref["position_ids"]);
        EXPECT_TRUE(at::equal(a, b)) << name;
        command += " " + out + " " + kModels + "/" + name + "/reference.safetensors " + kModels + "/" + name;
    }
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

TEST(Model, Bfloat16LogitsStayClose) {
    auto model = grove::Model::load(kModels + "/qwen2_tied", "cpu", "bfloat16");
    auto ref = reference("qwen2_tied");
    at::NoGradGuard no_grad;
    at::Tensor logits = model->forward(ref["input_ids"], ref["attention_mask"], ref["position_ids"]).to(at::kFloat);
    EXPECT_EQ(model->dtype(), at::kBFloat16);
    EXPECT_LT(masked_max_diff(logits, ref["logits"], ref["attention_mask"]), 0.15);
}

TEST(Model, BadCheckpointsGiveClearErrors) {
    std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/models/bad";
    fs::remove_all(dir);
    fs::create_directories(dir);
    auto copy = [&](const std::string& name) {
        std::string d = dir + "/" + name;
        fs::create_directories(d);
        fs::copy(kModels + "/llama_gqa/config.json", d + "/config.json");
        fs::copy(kModels + "/llama_gqa/model.safetensors", d + "/model.safetensors");
        return d;
    };
    // truncated weights file
    std::string truncated = copy("truncated");
    fs::resize_file(truncated + "/model.safetensors", 1000);
    auto message = grove::test::error_message([&] { grove::Model::load(truncated); });
    EXPECT_CONTAINS(message, "truncated/model.safetensors: invalid safetensors file");
    // header that claims more bytes than exist
    std::string huge = copy("huge_header");
    {
        std::fstream f(huge + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
        uint64_t size = 1ull << 40;
        f.write(reinterpret_cast<const char*>(&size), 8);
    }
    EXPECT_CONTAINS(grove::test::error_message([&] { grove::Model::load(huge); }), "exceeds the format's limit");
    // unsupported architecture
    std::string arch = copy("gpt2");
    {
        std::ofstream(arch + "/config.json") << R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})";
    }
    message = grove::test::error_message([&] { grove::Model::load(arch); });
    EXPECT_CONTAINS(message, "unsupported model");
    EXPECT_CONTAINS(message, "LlamaForCausalLM (llama)");
    EXPECT_CONTAINS(message, "Gemma3ForCausalLM (gemma3_text)");
    // a multimodal Gemma 3: its vision tower cannot be made from scratch, and a save needs the folder it
    // was loaded from, which holds the tensors it writes back
    const std::string vision = dir + "/gemma3_vision";
    fs::copy(kModels + "/gemma3_vision", vision, fs::copy_options::recursive);
    EXPECT_CONTAINS(grove::test::error_message([&] { grove::Model::initialize(vision, 1); }),
                    "Gemma3ForConditionalGeneration cannot be initialised from scratch");
    auto multimodal = grove::Model::load(vision);
    fs::remove_all(vision);
    EXPECT_CONTAINS(grove::test::error_message([&] { multimodal->save(dir + "/gemma3_vision_saved"); }),
                    "gemma3_vision, which no longer exists");
    // a config that disagrees with the weights names the tensor
    std::string shape = copy("shape");
    {
        std::ifstream in(kModels + "/llama_gqa/config.json");
        std::string text((std::istreambuf_iterator<char>(in)), {});
        text.replace(text.find("\"intermediate_size\": 112"), 24, "\"intermediate_size\": 100");
        std::ofstream(shape + "/config.json") << text;
    }
    message = grove::test::error_message([&] { grove::Model::load(shape); });
    EXPECT_CONTAINS(message, "tensor \"model.layers.0.mlp.gate_proj.weight\" has shape [112, 64]");
    // missing key
    std::string key = copy("key");
    {
        std::ofstream(key + "/config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})";
    }
    EXPECT_CONTAINS(grove::test::error_message([&] { grove::Model::load(key); }), "config.json: missing key \"vocab_size\"");
    // no weights at all
    std::string none = dir + "/none";
    fs::create_directories(none);
    fs::copy(kModels + "/llama_gqa/config.json", none + "/config.json");
    EXPECT_CONTAINS(grove::test::error_message([&] { grove::Model::load(none); }), "no model.safetensors");
}

// Phi-3's checkpoints: what Grove does not compute as transformers does is refused, naming the key
// and the limit, rather than computed differently. The tiny Phi-3 has original_max_position_embeddings
// 64 (longrope switches to its long factors past it) and sliding_window 96.
TEST(Model, Phi3LimitsAreInputErrorsNamingTheKey) {
    auto model = grove::Model::load(kModels + "/phi3_longrope");
    auto forward = [&](int64_t length) {
        at::NoGradGuard no_grad;
        at::Tensor ids = at::full({1, length}, 5, at::kLong);
        model->forward(ids, at::ones_like(ids), at::arange(length, at::kLong).unsqueeze(0));
    };
    EXPECT_NO_THROW(forward(64));
    auto message = grove::test::error_message([&] { forward(65); });
    EXPECT_CONTAINS(message,
                    "a sequence of 65 tokens (padding included) is longer than this Phi3ForCausalLM (phi3) checkpoint's "
                    "original_max_position_embeddings (64)");
    // packed rows and the static engine check too, before computing anything
    EXPECT_CONTAINS(grove::test::error_message([&] {
                        at::NoGradGuard no_grad;
                        model->packed_hidden_states(at::full({70}, 5, at::kLong), at::arange(70, at::kLong), {70});
                    }),
                    "a sequence of 70 tokens");
    // log-probabilities of a padded batch: TRL's forward numbers positions over the padding too, so
    // 40 + 30 columns switch transformers to the long factors though no row holds more than 45 tokens
    {
        at::Tensor prompts = at::full({2, 40}, 7, at::kLong), prompt_mask = at::ones({2, 40}, at::kLong);
        prompt_mask[1].narrow(0, 0, 35).fill_(0);
        at::Tensor completions = at::full({2, 30}, 9, at::kLong), completion_mask = at::ones({2, 30}, at::kLong);
        completion_mask[0].narrow(0, 5, 25).fill_(0);
        EXPECT_CONTAINS(grove::test::error_message([&] {
                            grove::completion_logprobs(*model, prompts, prompt_mask, completions, completion_mask, 1.0);
                        }),
                        "a sequence of 70 tokens (padding included)");
        EXPECT_NO_THROW(grove::completion_logprobs(*model, prompts.narrow(1, 0, 34), prompt_mask.narrow(1, 6, 34), completions,
                                                   completion_mask, 1.0));
    }
    // generation checks its longest sequence first: 5 + 60 - 1 = 64 positions are fed (the last
    // token is sampled, never fed), 5 + 61 - 1 = 65 are too many
    grove::SamplingOptions options;
    options.greedy = true;
    const std::vector<std::vector<int64_t>> prompt{std::vector<int64_t>(5, 7)};
    options.max_new_tokens = 60;
    EXPECT_NO_THROW(grove::generate(*model, prompt, options));
    EXPECT_NO_THROW(grove::static_generate(*model, prompt, options));
    options.max_new_tokens = 61;
    EXPECT_CONTAINS(grove::test::error_message([&] { grove::generate(*model, prompt, options); }), "a sequence of 65 tokens");
    EXPECT_CONTAINS(grove::test::error_message([&] { grove::static_generate(*model, prompt, options); }),
                    "a sequence of 65 tokens");

    const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/models/bad_phi3";
    auto with = [&](const std::string& key, const std::string& value) {
        const std::string folder = dir + "/" + key;
        fs::remove_all(folder);
        fs::create_directories(folder);
        for (const char* file : {"model.safetensors", "tokenizer.json", "tokenizer_config.json"})
            fs::copy(kModels + "/phi3_longrope/" + file, folder + "/" + file);
        std::ifstream in(kModels + "/phi3_longrope/config.json");
        auto config = nlohmann::json::parse(in);
        config[key] = nlohmann::json::parse(value);
        std::ofstream(folder + "/config.json") << config.dump(2);
        return grove::test::error_message([&] { grove::Model::load(folder); });
    };
    EXPECT_CONTAINS(with("partial_rotary_factor", "0.1"), "partial_rotary_factor 0.100000 must be in (0, 1] and leave an even");
    EXPECT_CONTAINS(with("partial_rotary_factor", "0.5"), "short_factor has 8 values; 4 expected");
    EXPECT_CONTAINS(with("resid_pdrop", "0.1"), "resid_pdrop is not 0");
    EXPECT_CONTAINS(with("hidden_act", "\"gelu\""), "hidden_act \"gelu\" is not supported");
    EXPECT_CONTAINS(with("rope_scaling", R"({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]})"),
                    "short_factor has 1 values; 8 expected");
    EXPECT_CONTAINS(with("rope_scaling", R"({"type": "dynamic", "factor": 2.0})"),
                    "rope_scaling type \"dynamic\" is not supported (supported: none, llama3, longrope, linear, yarn)");
}

// Which layers a config's sliding window applies to, which are NoPE, and the rotary scaling's
// parameters, as transformers' config classes and rope functions decide them.
TEST(Model, WindowsNopeLayersAndRotaryScalingFollowTheConfig) {
    const std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/models/window_configs";
    auto config_with = [&](const std::string& base, const nlohmann::json& changes) {
        std::ifstream in(kModels + "/" + base + "/config.json");
        auto config = nlohmann::json::parse(in);
        for (const auto& [key, value] : changes.items()) {
            if (value.is_string() && value == "<absent>")
                config.erase(key);
            else
                config[key] = value;
        }
        fs::remove_all(dir);
        fs::create_directories(dir);
        std::ofstream(dir + "/config.json") << config.dump(2);
        return grove::load_model_config(dir);
    };
    using Layers = std::vector<bool>;
    // a config without max_position_embeddings gets its class's (transformers 4.57's LlamaConfig()
    // ... Gemma3TextConfig(); a tool result that would reach it is dropped, docs/training.md)
    const std::vector<std::pair<std::string, int64_t>> contexts = {
        {"llama_gqa", 2048},      {"qwen2_tied", 32768},       {"qwen3_qknorm", 32768},     {"mistral_mha", 131072},
        {"smollm3_nope", 32768},  {"phi3_partial", 4096},      {"olmo2_post_norm", 2048},   {"olmo3_window", 2048},
        {"olmoe_experts", 4096},  {"mixtral_experts", 131072}, {"qwen2_moe_shared", 32768}, {"qwen3_moe_experts", 32768},
        {"gemma3_window", 131072}};
    for (const auto& [model, context] : contexts)
        EXPECT_EQ(config_with(model, {{"max_position_embeddings", "<absent>"}}).max_position_embeddings, context) << model;
    auto qwen = config_with("qwen2_window", nlohmann::json::object());
    EXPECT_EQ(qwen.sliding_window, 3);
    EXPECT_EQ(qwen.windowed_layers, (Layers{false, true}));  // from max_window_layers = 1 on
    qwen = config_with("qwen2_window", {{"layer_types", {"sliding_attention", "full_attention"}}});
    EXPECT_EQ(qwen.windowed_layers, (Layers{true, false}));  // layer_types first
    EXPECT_EQ(config_with("qwen2_window", {{"use_sliding_window", false}}).sliding_window, 0);
    EXPECT_EQ(config_with("qwen2_window", {{"sliding_window", "<absent>"}}).sliding_window, 4096);
    EXPECT_EQ(config_with("qwen2_window", {{"sliding_window", nullptr}}).sliding_window, 0);
    auto mistral = config_with("mistral_window", {{"sliding_window", "<absent>"}});  // MistralConfig's default
    EXPECT_EQ(mistral.sliding_window, 4096);
    EXPECT_EQ(mistral.windowed_layers, (Layers{true, true}));
    EXPECT_EQ(config_with("mistral_window", {{"sliding_window", nullptr}}).sliding_window, 0);
    EXPECT_EQ(config_with("phi3_partial", {{"sliding_window", "<absent>"}}).sliding_window, 0);
    EXPECT_EQ(config_with("llama_gqa", {{"sliding_window", 4}}).sliding_window, 0);  // LlamaConfig has none
    // SmolLM3: the window on the NoPE layers; NoPE every no_rope_layer_interval-th layer without a list
    auto smollm3 = config_with("smollm3_nope", {{"layer_types", nullptr}});
    EXPECT_EQ(smollm3.nope_layers, (Layers{false, true}));
    EXPECT_EQ(smollm3.windowed_layers, (Layers{false, true}));
    EXPECT_TRUE(smollm3.tie_word_embeddings);  // absent: PretrainedConfig's default
    smollm3 =
        config_with("smollm3_nope", {{"layer_types", nullptr}, {"no_rope_layers", nullptr}, {"no_rope_layer_interval", 1}});
    EXPECT_EQ(smollm3.nope_layers, (Layers{true, true}));
    EXPECT_EQ(smollm3.windowed_layers, (Layers{true, true}));
    // without use_sliding_window SmolLM3 keeps the window on the layers an explicit layer_types names
    smollm3 = config_with("smollm3_nope", {{"use_sliding_window", false}});
    EXPECT_EQ(smollm3.sliding_window, 4);
    EXPECT_EQ(smollm3.windowed_layers, (Layers{false, true}));
    EXPECT_EQ(config_with("smollm3_nope", {{"use_sliding_window", false}, {"layer_types", nullptr}}).sliding_window, 0);
    EXPECT_EQ(config_with("smollm3_nope", {{"sliding_window", "<absent>"}}).sliding_window, 0);  // SmolLM3Config: None
    EXPECT_CONTAINS(grove::test::error_message([&] { config_with("smollm3_nope", {{"no_rope_layers", {1, 0, 1}}}); }),
                    "no_rope_layers has 3 entries; num_hidden_layers is 2");
    // Gemma 3: without layer_types, every sliding_window_pattern-th layer is global (6 by default);
    // the sliding layers rotate with the local base even without a window; Gemma3TextConfig's defaults
    auto gemma = config_with("gemma3_window", {{"layer_types", nullptr}});
    EXPECT_EQ(gemma.windowed_layers, (Layers{true, false}));  // sliding_window_pattern 2
    gemma = config_with("gemma3_window", {{"layer_types", nullptr}, {"sliding_window_pattern", "<absent>"}});
    EXPECT_EQ(gemma.windowed_layers, (Layers{true, true}));
    gemma = config_with("gemma3_window", {{"sliding_window", nullptr}});
    EXPECT_EQ(gemma.sliding_window, 0);
    EXPECT_FALSE(gemma.layer_windowed(0));
    EXPECT_TRUE(gemma.layer_rotated_locally(0));
    EXPECT_FALSE(gemma.layer_rotated_locally(1));
    gemma = config_with("gemma3_window", {{"sliding_window", "<absent>"},
                                          {"query_pre_attn_scalar", "<absent>"},
                                          {"rope_local_base_freq", "<absent>"},
                                          {"rope_theta", "<absent>"},
                                          {"head_dim", "<absent>"},
                                          {"hidden_activation", "<absent>"},
                                          {"tie_word_embeddings", "<absent>"},
                                          {"eos_token_id", "<absent>"},
                                          {"bos_token_id", "<absent>"}});
    EXPECT_EQ(gemma.sliding_window, 4096);
    EXPECT_DOUBLE_EQ(gemma.attention_scale, 1.0 / 16);  // query_pre_attn_scalar 256
    EXPECT_EQ(gemma.local_rope_theta, 10000.0);
    EXPECT_EQ(gemma.rope_theta, 1000000.0);
    EXPECT_EQ(gemma.head_dim, 256);
    EXPECT_TRUE(gemma.activation == grove::ModelConfig::Activation::gelu_tanh);
    EXPECT_TRUE(gemma.tie_word_embeddings);
    EXPECT_DOUBLE_EQ(gemma.embedding_scale, std::sqrt(48.0));  // sqrt(hidden_size)
    EXPECT_TRUE(gemma.gemma_norms && gemma.qk_norm);
    EXPECT_EQ(gemma.eos_token_ids, (std::vector<int64_t>{1}));  // absent: Gemma3TextConfig's (no generation_config)
    EXPECT_EQ(gemma.bos_token_id, std::optional<int64_t>(2));
    // transformers 5's layout: the global layers' base and scaling, and the local base, per layer type
    const nlohmann::json rope_parameters = {
        {"full_attention", {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 500000.0}}},
        {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 20000.0}}}};
    gemma = config_with("gemma3_window", {{"rope_scaling", "<absent>"},
                                          {"rope_theta", "<absent>"},
                                          {"rope_local_base_freq", "<absent>"},
                                          {"rope_parameters", rope_parameters}});
    EXPECT_EQ(gemma.rope_scaling.type, "linear");
    EXPECT_EQ(gemma.rope_scaling.factor, 4.0);
    EXPECT_EQ(gemma.rope_theta, 500000.0);
    EXPECT_EQ(gemma.local_rope_theta, 20000.0);
    EXPECT_CONTAINS(grove::test::error_message([&] { config_with("gemma3_window", {{"final_logit_softcapping", 30.0}}); }),
                    "final_logit_softcapping is set: Grove soft-caps Gemma 2's logits, not Gemma 3's");
    EXPECT_EQ(config_with("gemma3_window", {{"attn_logit_softcapping", nullptr}}).attention_logit_softcap, 0.0);
    // Gemma 2: without layer_types every other layer slides, from the first; Gemma2Config's defaults
    // (caps 50 and 30; null: none); no q/k norms or local rotary base
    auto gemma2 = config_with("gemma2_softcap", {{"layer_types", nullptr}});
    EXPECT_EQ(gemma2.windowed_layers, (Layers{true, false}));
    EXPECT_EQ(gemma2.attention_logit_softcap, 1.0);
    EXPECT_EQ(gemma2.final_logit_softcap, 2.0);
    gemma2 = config_with("gemma2_softcap", {{"attn_logit_softcapping", "<absent>"},
                                            {"final_logit_softcapping", nullptr},
                                            {"rope_theta", "<absent>"},
                                            {"max_position_embeddings", "<absent>"},
                                            {"query_pre_attn_scalar", "<absent>"},
                                            {"sliding_window", "<absent>"}});
    EXPECT_EQ(gemma2.attention_logit_softcap, 50.0);
    EXPECT_EQ(gemma2.final_logit_softcap, 0.0);
    EXPECT_EQ(gemma2.rope_theta, 10000.0);
    EXPECT_EQ(gemma2.max_position_embeddings, 8192);
    EXPECT_DOUBLE_EQ(gemma2.attention_scale, 1.0 / 16);
    EXPECT_EQ(gemma2.sliding_window, 4096);
    EXPECT_TRUE(gemma2.gemma_norms && !gemma2.qk_norm && gemma2.local_rope_theta == 0);
    EXPECT_CONTAINS(grove::test::error_message([&] { config_with("gemma2_softcap", {{"attn_logit_softcapping", -1.0}}); }),
                    "attn_logit_softcapping must be positive or null");
    EXPECT_CONTAINS(grove::test::error_message([&] { config_with("gemma2_softcap", {{"sliding_window", nullptr}}); }),
                    "sliding_window is null or 0, which transformers' Gemma2 cannot run");
    EXPECT_CONTAINS(grove::test::error_message([&] { config_with("gemma3_window", {{"hidden_activation", "gelu"}}); }),
                    "hidden_activation \"gelu\" is not supported (supported: silu, swish, gelu_pytorch_tanh)");
    EXPECT_CONTAINS(grove::test::error_message([&] { config_with("gemma3_window", {{"use_bidirectional_attention", true}}); }),
                    "use_bidirectional_attention is true");
    // yarn: cos and sin scaled by 0.1 ln(factor) + 1, or DeepSeek's mscale ratio, or as given; the
    // original length falls back to max_position_embeddings; beta_fast / beta_slow of 0 are the defaults
    auto yarn = config_with("qwen2_window", nlohmann::json::object()).rope_scaling;
    EXPECT_EQ(yarn.type, "yarn");
    EXPECT_DOUBLE_EQ(yarn.attention_factor, 0.1 * std::log(4.0) + 1.0);
    EXPECT_EQ(yarn.original_max_position_embeddings, 64);
    yarn = config_with("qwen2_window", {{"rope_scaling",
                                         {{"type", "yarn"},
                                          {"factor", 4.0},
                                          {"mscale", 2.0},
                                          {"mscale_all_dim", 1.0},
                                          {"beta_fast", 0},
                                          {"truncate", false}}}})
               .rope_scaling;
    EXPECT_DOUBLE_EQ(yarn.attention_factor, (0.2 * std::log(4.0) + 1.0) / (0.1 * std::log(4.0) + 1.0));
    EXPECT_EQ(yarn.original_max_position_embeddings, 256);  // max_position_embeddings
    EXPECT_EQ(yarn.beta_fast, 32);
    EXPECT_FALSE(yarn.truncate);
    yarn = config_with("qwen2_window", {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 1.5}}}})
               .rope_scaling;
    EXPECT_DOUBLE_EQ(yarn.attention_factor, 1.5);
    EXPECT_EQ(config_with("mistral_window", nlohmann::json::object()).rope_scaling.factor, 2.0);  // linear
    EXPECT_CONTAINS(grove::test::error_message([&] {
                        config_with("mistral_window", {{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}}});
                    }),
                    "rope_scaling type \"dynamic\" is not supported (supported: none, llama3, longrope, linear, yarn)");
    EXPECT_CONTAINS(grove::test::error_message([&] { config_with("qwen2_window", {{"layer_types", {"full_attention"}}}); }),
                    "layer_types has 1 entries; num_hidden_layers is 2");
    EXPECT_CONTAINS(
        grove::test::error_message([&] { config_with("qwen2_window", {{"layer_types", {"full_attention", "chunked"}}}); }),
        "layer_types entry \"chunked\" is not supported (supported: full_attention, sliding_attention)");
    EXPECT_CONTAINS(grove::test::error_message([&] { config_with("mistral_window", {{"sliding_window", -1}}); }),
                    "sliding_window must be positive or null");
}

TEST(Safetensors, HeaderFieldsAreValidated) {
    std::string dir = std::string(GROVE_TEST_BINARY_DIR) + "/models/st";
    fs::create_directories(dir);
    auto write = [&](const std::string& name, const std::string& header, size_t data_bytes) {
        std::string path = dir + "/" + name;
        std::ofstream f(path, std::ios::binary);
        uint64_t n = header.size();
        f.write(reinterpret_cast<const char*>(&n), 8);
        f << header << std::string(data_bytes, '\0');
        return path;
    };
    auto open_error = [&](const std::string& path) {
        return grove::test::error_message([&] { grove::SafetensorsFile file(path); });
    };
    EXPECT_CONTAINS(open_error(write("a", R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4)),
                    "tensor 'w': shape x dtype size = 8 bytes, but data_offsets span 4");
    EXPECT_CONTAINS(open_error(write("b", R"({"w": {"dtype": "F8", "shape": [1], "data_offsets": [0, 1]}})", 1)),
                    "tensor 'w': unsupported dtype \"F8\"");
    EXPECT_CONTAINS(open_error(write("c",
                                     R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, )"
                                     R"("x": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})",
                                     6)),
                    "overlap");
    EXPECT_CONTAINS(open_error(write("d", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 2)),
                    "lie outside the data section");
    EXPECT_CONTAINS(open_error(write("e", R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4)), "negative");
    EXPECT_CONTAINS(open_error(write("f", "{not json", 0)), "not valid JSON");
    // the writer round-trips, atomically (no temporary left behind)
    std::vector<float> values{1.5f, -2.0f, 3.25f};
    grove::write_safetensors(dir + "/ok.safetensors", {{"v", grove::DType::f32, {3}, values.data(), 12}}, {{"k", "v"}});
    grove::SafetensorsFile ok(dir + "/ok.safetensors");
    ASSERT_NE(ok.find("v"), nullptr);
    EXPECT_EQ(ok.metadata().at("k"), "v");
    EXPECT_EQ(reinterpret_cast<const float*>(ok.find("v")->data)[2], 3.25f);
    for (const auto& entry : fs::directory_iterator(dir))
        EXPECT_EQ(entry.path().filename().string().rfind(".tmp-", 0), std::string::npos);
}

// The decode kernel against a double-precision sum, on shapes that exercise every path: row blocks
// of 8, 4, 2, 1, a K that is not a multiple of 8 (masked tail), columns split over 1 to 3 threads
// (shares that start inside a block of weight rows), strided input and output rows, with and
// without bias. The padding columns of y must stay untouched.
TEST(DecodeKernels, SmallBatchLinearMatchesADoubleReferenceOnEveryShapeAndSplit) {
    if (!grove::kernels::decode_kernels_available()) GTEST_SKIP() << "this CPU has no AVX2/FMA: the kernels are never used";
    at::manual_seed(0);
    int checked = 0;
    for (int64_t rows : {1, 2, 3, 5, 8, 15, 16, 32})
        for (int64_t K : {1, 7, 8, 64, 203, 4099})  // 4099: large enough that several threads share the columns
            for (int64_t N : {1, 3, 11, 67})
                for (int threads : {1, 2, 3}) {
                    const bool with_bias = (rows + K + N + threads) % 2 == 0;
                    const int64_t ldx = K + 3, ldy = N + 2;
                    at::Tensor x = at::randn({rows, ldx}), w = at::randn({N, K}), bias = at::randn({N});
                    at::Tensor y = at::full({rows, ldy}, 7.0f);
                    grove::kernels::small_batch_linear(x.data_ptr<float>(), ldx, w.data_ptr<float>(),
                                                       with_bias ? bias.data_ptr<float>() : nullptr, y.data_ptr<float>(), ldy,
                                                       rows, K, N, threads);
                    at::Tensor expected = at::matmul(x.narrow(1, 0, K).to(at::kDouble), w.to(at::kDouble).t());
                    if (with_bias) expected = expected + bias.to(at::kDouble);
                    std::string where = "rows " + std::to_string(rows) + " K " + std::to_string(K) + " N " + std::to_string(N) +
                                        " threads " + std::to_string(threads) + (with_bias ? " bias" : "");
                    double error = (y.narrow(1, 0, N).to(at::kDouble) - expected).abs().max().item<double>();
                    EXPECT_LT(error, 1e-5 * std::sqrt(double(K)) * 10) << where;
                    EXPECT_TRUE(at::all(y.narrow(1, N, 2) == 7.0f).item<bool>()) << where << ": wrote past the row";
                    ++checked;
                }
    EXPECT_EQ(checked, 8 * 6 * 4 * 3);
}

// generate() runs its decode steps on the decode kernels (DecodeKernelScope). For every tiny
// architecture (grouped and plain heads, Qwen2 biases, llama3 rope), prefilling the left-padded
// reference batch into a KV cache and decoding three tokens must give ATen's logits at every step:
// products, RMSNorm, rotary, SwiGLU and the cached attention (with its cache writes) all checked.
// An in-place weight update (an optimizer step) must be seen at once: the kernels keep no copy.
TEST(Model, DecodeKernelsGiveAtensDecodeSteps) {
    if (!grove::kernels::decode_kernels_available()) GTEST_SKIP() << "this CPU has no AVX2/FMA: the scope is off";
    at::NoGradGuard no_grad;
    for (const char* name : kNames) {
        auto model = grove::Model::load(kModels + "/" + name);
        auto ref = reference(name);
        at::Tensor ids = ref["input_ids"], prompt_mask = ref["attention_mask"], positions = ref["position_ids"];
        ASSERT_LE(ids.numel(), 32) << "the prefill must be small enough for the kernel products";
        const int64_t B = ids.size(0), P = ids.size(1), steps = 3;
        at::Tensor next = at::randint(4, model->config().vocab_size, {B, steps});
        auto decode = [&](bool kernels) {
            std::optional<grove::DecodeKernelScope> scope;
            if (kernels) scope.emplace();
            grove::KVCache cache = model->make_cache(B, P + steps);
            std::vector<at::Tensor> logits{model->logits(model->hidden_states(ids, prompt_mask, positions, &cache))};
            at::Tensor mask = prompt_mask, position = prompt_mask.sum(-1, true);
            for (int64_t t = 0; t < steps; ++t) {
                mask = at::cat({mask, at::ones({B, 1}, mask.options())}, 1);
                logits.push_back(model->logits(model->hidden_states(next.narrow(1, t, 1), mask, position + t, &cache)));
            }
            return logits;
        };
        auto compare = [&](const std::string& when) {
            std::vector<at::Tensor> aten = decode(false), kernels = decode(true);
            EXPECT_LT(masked_max_diff(aten[0], kernels[0], prompt_mask), 1e-5) << name << when << ": prefill";
            if (when.empty())
                EXPECT_LT(masked_max_diff(ref["logits"], kernels[0], prompt_mask), 1e-4) << name << ": against transformers";
            for (int64_t t = 1; t <= steps; ++t) {
                // Relative to the logits' size: float32 sums in another order differ by a few ulps
                // of the largest terms. OLMoE's experts differed by up to 1.4e-5 on logits near 3
                // (6e-6 relative) over 200 random draws; the bound there is 6e-5.
                const double scale = std::max(1.0, aten[size_t(t)].abs().max().item<double>());
                EXPECT_LT((aten[size_t(t)] - kernels[size_t(t)]).abs().max().item<double>(), 2e-5 * scale)
                    << name << when << ": step " << t;
                EXPECT_FALSE(at::equal(aten[size_t(t)], kernels[size_t(t)]))
                    << name << when << ": identical bits suggest ATen ran";
            }
            return aten;
        };
        std::vector<at::Tensor> before = compare("");
        for (grove::Linear* layer : model->linear_layers()) layer->weight.mul_(1.5);  // as an optimizer step would
        model->named_parameters().front().second.mul_(0.5);                           // embeddings (tied head)
        std::vector<at::Tensor> after = compare(" after an update");
        EXPECT_GT((after.back() - before.back()).abs().max().item<double>(), 1e-3) << name;
    }
}

// The element-wise kernels against double precision on odd sizes (vector tails): RMSNorm, rotary,
// silu(gate) * up (its exponential is a polynomial of ours), over the range of values they see.
TEST(DecodeKernels, ElementwiseKernelsMatchDoublePrecision) {
    if (!grove::kernels::decode_kernels_available()) GTEST_SKIP() << "this CPU has no AVX2/FMA: the kernels are never used";
    at::manual_seed(0);
    const int64_t rows = 3, H = 37, heads = 2, D = 10;
    at::Tensor x = at::randn({rows, H}) * 3, weight = at::randn({H}), y = at::empty({rows, H});
    grove::kernels::rms_norm(x.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(), rows, H, 1e-5f);
    at::Tensor xd = x.to(at::kDouble);
    at::Tensor expected = weight.to(at::kDouble) * xd * at::rsqrt(xd.pow(2).mean(-1, true) + 1e-5);
    EXPECT_LT((y.to(at::kDouble) - expected).abs().max().item<double>(), 1e-5);

    at::Tensor q = at::randn({rows, heads, D}), cos = at::randn({rows, 1, D}), sin = at::randn({rows, 1, D});
    at::Tensor rotated = q.clone();
    grove::kernels::rotary(rotated.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(), rows, heads, D);
    at::Tensor qd = q.to(at::kDouble);
    at::Tensor half_turn = at::cat({-qd.narrow(-1, D / 2, D / 2), qd.narrow(-1, 0, D / 2)}, -1);
    expected = qd * cos.to(at::kDouble) + half_turn * sin.to(at::kDouble);
    EXPECT_LT((rotated.to(at::kDouble) - expected).abs().max().item<double>(), 1e-5);

    const int64_t n = 1003;
    at::Tensor gate = at::linspace(-90, 90, n), up = at::randn({n}), out = at::empty({n});
    grove::kernels::silu_mul(gate.data_ptr<float>(), up.data_ptr<float>(), out.data_ptr<float>(), n);
    at::Tensor gd = gate.to(at::kDouble);
    expected = gd * at::sigmoid(gd) * up.to(at::kDouble);
    at::Tensor relative = (out.to(at::kDouble) - expected).abs() / expected.abs().clamp_min(1e-30);
    EXPECT_LT(relative.masked_select(gd > -80).max().item<double>(), 1e-6);  // e^80 and beyond: silu is ~0 either way
    EXPECT_LT(out.masked_select(gd <= -80).abs().max().item<double>(), 1e-30);
}

// The cached attention against ATen's SDPA: grouped heads (4 query heads on 2 kv heads), masked
// positions, more tasks than one thread takes, and head sizes for both of the kernel's paths: 64 and
// 80 (vectors of 8, the second with a partial 64-wide chunk) and an odd 13 (one value at a time).
TEST(DecodeKernels, DecodeAttentionMatchesSdpaAndWritesTheCache) {
    if (!grove::kernels::decode_kernels_available()) GTEST_SKIP() << "this CPU has no AVX2/FMA: the kernels are never used";
    at::manual_seed(1);
    const int64_t B = 5, heads = 4, kv_heads = 2, capacity = 11, S = 10;
    for (int64_t D : {13, 64, 80}) {
        at::Tensor keys = at::randn({B, kv_heads, capacity, D}), values = at::randn({B, kv_heads, capacity, D});
        at::Tensor q = at::randn({B, heads, D}), new_keys = at::randn({B, kv_heads, D}),
                   new_values = at::randn({B, kv_heads, D});
        at::Tensor visible = at::ones({B, S}, at::kBool);
        visible.index_put_({1, 0}, false);
        visible.index_put_({3, 2}, false);
        visible.index_put_({3, 5}, false);
        at::Tensor expected_keys = keys.clone(), expected_values = values.clone();
        expected_keys.select(2, S - 1).copy_(new_keys);
        expected_values.select(2, S - 1).copy_(new_values);
        at::Tensor expected = at::scaled_dot_product_attention(
            q.unsqueeze(2), expected_keys.narrow(2, 0, S).repeat_interleave(heads / kv_heads, 1),
            expected_values.narrow(2, 0, S).repeat_interleave(heads / kv_heads, 1), visible.view({B, 1, 1, S}));
        for (int threads : {1, 2}) {
            at::Tensor k = keys.clone(), v = values.clone(), out = at::empty({B, heads, D});
            grove::kernels::decode_attention(q.data_ptr<float>(), new_keys.data_ptr<float>(), new_values.data_ptr<float>(),
                                             k.data_ptr<float>(), v.data_ptr<float>(), capacity, visible.data_ptr<bool>(),
                                             out.data_ptr<float>(), B, heads, kv_heads, S, D, float(1.0 / std::sqrt(double(D))),
                                             0.0f, threads);
            std::string where = "head size " + std::to_string(D) + ", " + std::to_string(threads) + " threads";
            EXPECT_TRUE(at::equal(k, expected_keys)) << where << ": the key cache";
            EXPECT_TRUE(at::equal(v, expected_values)) << where << ": the value cache";
            EXPECT_LT((out - expected.squeeze(2)).abs().max().item<double>(), 1e-5) << where;
        }
    }
}

// The sampler against a float64 inverse CDF: with p = softmax(logits / temperature), the token is
// the first whose cumulative probability reaches the uniform. Uniforms within 1e-6 of a bucket's edge
// are left out (float rounding may fall either way there). Tokens of logit -inf are never drawn, not
// even at u = 0 or u just below 1; a row with a NaN, or with every logit -inf, gives token -1.
TEST(DecodeKernels, SampleSoftmaxIsTheInverseCdfOfTheSoftmax) {
    if (!grove::kernels::decode_kernels_available()) GTEST_SKIP() << "this CPU has no AVX2/FMA: the kernels are never used";
    at::manual_seed(2);
    const int64_t rows = 6, V = 1003, sampled_rows = 4;  // V: whole 64-token blocks, then vector and scalar tails
    const double inf = std::numeric_limits<double>::infinity();
    at::Tensor logits = at::randn({rows, V}) * 3;
    logits[1].masked_fill_(at::rand({V}) < 0.9, -inf);  // as top-k / top-p leave them
    logits[1][0] = -inf;
    logits[1][V - 1] = -inf;
    logits.index_put_({4, 17}, std::nan(""));
    logits[5].fill_(-inf);
    for (double temperature : {1.0, 0.7}) {
        at::Tensor scaled = logits.narrow(0, 0, sampled_rows).to(at::kDouble) / temperature;
        at::Tensor cdf = scaled.softmax(-1).cumsum(-1), logp = scaled.log_softmax(-1);
        at::Tensor finite = at::isfinite(scaled).nonzero();
        int64_t checked = 0;
        const int trials = 300;
        for (int trial = 0; trial < trials; ++trial) {
            at::Tensor u = at::rand({rows}, at::kDouble);
            if (trial == 0) u.fill_(0.0);
            if (trial == 1) u.fill_(std::nextafter(1.0, 0.0));
            at::Tensor tokens = at::empty({rows}, at::kLong), logprobs = at::empty({rows});
            for (int threads : {1, 3}) {
                at::Tensor t = at::empty({rows}, at::kLong);
                grove::kernels::sample_softmax(logits.data_ptr<float>(), V, rows, V, float(temperature), u.data_ptr<double>(),
                                               t.data_ptr<int64_t>(), logprobs.data_ptr<float>(), threads);
                if (threads == 1)
                    tokens = t;
                else
                    EXPECT_TRUE(at::equal(t, tokens)) << "threads share rows, not draws";
            }
            EXPECT_EQ(tokens[4].item<int64_t>(), -1) << "a NaN logit";
            EXPECT_EQ(tokens[5].item<int64_t>(), -1) << "nothing drawable";
            for (int64_t r = 0; r < sampled_rows; ++r) {
                const int64_t token = tokens[r].item<int64_t>();
                ASSERT_TRUE(token >= 0 && token < V) << "row " << r;
                EXPECT_TRUE(std::isfinite(logits[r][token].item<float>())) << "row " << r << " drew a token of logit -inf";
                EXPECT_NEAR(logprobs[r].item<double>(), logp[r][token].item<double>(), 1e-5) << "row " << r;
                at::Tensor row_finite = at::isfinite(scaled[r]).nonzero().squeeze(-1);
                int64_t expected;
                if (trial <= 1) {
                    expected = row_finite[trial == 0 ? 0 : row_finite.size(0) - 1].item<int64_t>();
                } else {
                    const double target = u[r].item<double>();
                    at::Tensor reached = (cdf[r] >= target).logical_and(at::isfinite(scaled[r])).nonzero();
                    expected = reached.size(0) ? reached[0][0].item<int64_t>() : row_finite[-1].item<int64_t>();
                    double edge = std::abs(cdf[r][expected].item<double>() - target);
                    if (expected > 0) edge = std::min(edge, std::abs(cdf[r][expected - 1].item<double>() - target));
                    if (edge < 1e-6) continue;
                }
                EXPECT_EQ(token, expected) << "row " << r << " trial " << trial << " temperature " << temperature;
                ++checked;
            }
        }
        EXPECT_GT(checked, sampled_rows * trials * 99 / 100) << "too many draws left out near an edge";
    }
}

// The training forward packs rows end to end without padding. Against the padded batch (whose logits
// match transformers above) it gives the same log-probs, entropies and parameter gradients, with and
// without gradient checkpointing, for ragged completions; masked positions hold 0.
TEST(Model, PackedRowsGiveThePaddedLogprobsAndGradients) {
    for (const char* name : kNames) {
        auto model = grove::Model::load(kModels + "/" + name);
        model->set_base_trainable(true);
        auto ref = reference(name);
        at::Tensor prompt_ids = ref["input_ids"], prompt_mask = ref["attention_mask"], completion = ref["greedy"];
        const int64_t B = completion.size(0), P = prompt_ids.size(1), C = completion.size(1);
        ASSERT_GE(B, 2) << name;
        ASSERT_LT(prompt_mask.sum().item<int64_t>(), B * P) << name << ": the prompts must be padded for this test";
        // row b keeps C - 2b completion tokens (at least 1)
        at::Tensor kept = (C - 2 * at::arange(B, at::kLong)).clamp_min(1);
        at::Tensor completion_mask = (at::arange(C, at::kLong).unsqueeze(0) < kept.unsqueeze(1)).to(at::kLong);
        at::Tensor mask = completion_mask.to(at::kFloat);
        auto parameters = model->trainable_parameters();
        auto take_gradients = [&] {
            std::vector<at::Tensor> grads;
            for (at::Tensor& p : parameters) {
                grads.push_back(p.grad().clone());
                p.mutable_grad().reset();
            }
            return grads;
        };
        for (bool checkpointing : {false, true}) {
            model->set_gradient_checkpointing(checkpointing);
            std::string what = std::string(name) + (checkpointing ? " (checkpointing)" : "");

            at::Tensor packed_entropy;
            at::Tensor packed =
                grove::completion_logprobs(*model, prompt_ids, prompt_mask, completion, completion_mask, 0.7, &packed_entropy);
            (packed * mask * at::arange(1, C + 1, at::kFloat))
                .sum()
                .backward();  // position weights: a gradient that sees order
            auto packed_grads = take_gradients();

            at::Tensor input_mask = at::cat({prompt_mask, completion_mask}, 1);
            at::Tensor hidden = model->hidden_states(at::cat({prompt_ids, completion}, 1), input_mask,
                                                     (input_mask.cumsum(-1) - 1).clamp_min(0));
            at::Tensor padded_entropy;
            at::Tensor padded =
                grove::token_logprobs(*model, hidden.narrow(1, P - 1, C), completion, 0.7, 1024, &padded_entropy);
            (padded * mask * at::arange(1, C + 1, at::kFloat)).sum().backward();
            auto padded_grads = take_gradients();

            EXPECT_LT(((packed - padded).abs() * mask).max().item<double>(), 1e-5) << what;
            EXPECT_LT(((packed_entropy - padded_entropy).abs() * mask).max().item<double>(), 1e-5) << what;
            EXPECT_EQ((packed * (1 - mask)).abs().max().item<double>(), 0.0) << what;
            EXPECT_EQ((packed_entropy * (1 - mask)).abs().max().item<double>(), 0.0) << what;
            EXPECT_LT(packed.min().item<double>(), -0.1) << what << ": real log-probs are negative";
            for (size_t i = 0; i < parameters.size(); ++i) {
                double scale = std::max(1.0, padded_grads[i].abs().max().item<double>());
                EXPECT_LT((packed_grads[i] - padded_grads[i]).abs().max().item<double>() / scale, 1e-5)
                    << what << " parameter " << i;
            }
            EXPECT_GT(packed_grads.front().abs().sum().item<double>(), 0.0) << what;
        }
    }
}
