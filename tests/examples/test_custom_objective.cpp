// The out-of-tree example objective (examples/custom-objective, plain C): through the host, its loss
// and its gradient by the policy's log-probabilities equal the same objective written here with
// autograd, on a batch where every branch is taken (ratios inside and outside the clip range, capped
// negative-advantage tokens), with the KL term, the reduction's weights, the host's policy mask and
// sampling ratio, and a masked position.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "grove/plugin_host.hpp"
#include "grove/policy_loss.hpp"
#include "plugin_test_support.hpp"

namespace {
const std::string kPlugin = std::string(GROVE_TEST_BINARY_DIR) + "/examples/custom-objective/build/libdual_clip_objective.so";

grove::PluginInstance example(const std::string& config) {
    grove::PluginHost host({});
    auto info = host.find(kPlugin, GROVE_PLUGIN_KIND_OBJECTIVE);
    return grove::PluginInstance(info, grove::PluginConfig::from_toml_text(info, config, "test"));
}

// Dual-clip PPO as a user would write it with torch.
at::Tensor autograd_dual_clip(const at::Tensor& logp, const at::Tensor& old, const at::Tensor& ref, const at::Tensor& A,
                              const at::Tensor& weights, const at::Tensor& scale, double epsilon, double epsilon_high, double c,
                              double beta) {
    const at::Tensor ratio = at::exp(at::clamp(logp - old, -20.0, 20.0));
    const at::Tensor advantages = A.unsqueeze(1);
    const at::Tensor clipped = at::maximum(-advantages * ratio, -advantages * at::clamp(ratio, 1 - epsilon, 1 + epsilon_high));
    const at::Tensor policy = at::where(advantages < 0, at::minimum(clipped, -advantages * c), clipped);
    const at::Tensor kl = at::exp(ref - logp) - (ref - logp) - 1;
    return (weights * (scale * policy + beta * kl)).sum();
}
}  // namespace

TEST(CustomObjectiveExample, GradientEqualsAutogradThroughTheHost) {
    const int64_t B = 6, T = 5;
    at::manual_seed(7);
    const at::Tensor old = at::randn({B, T}, at::kDouble).to(at::kFloat) - 2.0;
    // ratios from exp(-1.5) to exp(1.5): inside [0.8, 1.28], below and far above it
    const at::Tensor logp_values = (old + at::linspace(-1.5, 1.5, B * T).view({B, T})).contiguous();
    const at::Tensor ref = old + 0.3 * at::randn({B, T});
    const at::Tensor A = at::tensor({1.0f, -0.5f, -2.0f, 0.7f, -1.2f, 0.0f});
    at::Tensor mask = at::ones({B, T});
    mask[4][4] = 0;
    const at::Tensor weights = mask / mask.sum();
    at::Tensor policy_mask = at::ones({B, T});
    policy_mask[3].zero_();  // a row the host's options drop
    const at::Tensor sampling_ratio = 0.8 + 0.4 * at::rand({B, T});
    const double c = 2.0, beta = 0.05, epsilon = 0.2, epsilon_high = 0.28;

    // 1. the plugin called as the host calls it, every input present
    at::Tensor reference_logp = logp_values.clone().requires_grad_(true);
    const at::Tensor reference =
        autograd_dual_clip(reference_logp, old, ref, A, weights, policy_mask * sampling_ratio, epsilon, epsilon_high, c, beta);
    reference.backward();
    const grove::PluginInstance objective = example("clip_ratio_c = 2.0");
    const at::Tensor logp_c = logp_values.contiguous(), old_c = old.contiguous(), ref_c = ref.contiguous(),
                     policy_mask_c = policy_mask.contiguous(), sampling_ratio_c = sampling_ratio.contiguous();
    grove_objective_batch batch{};
    batch.struct_size = sizeof(batch);
    batch.rows = B;
    batch.columns = T;
    batch.logp = logp_c.data_ptr<float>();
    batch.old_logp = old_c.data_ptr<float>();
    batch.ref_logp = ref_c.data_ptr<float>();
    batch.mask = mask.data_ptr<float>();
    batch.weights = weights.data_ptr<float>();
    batch.advantages = A.data_ptr<float>();
    batch.beta = beta;
    batch.epsilon = epsilon;
    batch.epsilon_high = epsilon_high;
    batch.delta = NAN;
    batch.policy_mask = policy_mask_c.data_ptr<float>();
    batch.sampling_ratio = sampling_ratio_c.data_ptr<float>();
    const grove::ObjectiveResult r = objective.objective_loss(batch);
    const at::Tensor grad = at::from_blob(const_cast<float*>(r.grad.data()), {B, T}, at::kFloat);
    EXPECT_NEAR(r.loss, reference.item<double>(), 1e-6 * std::abs(reference.item<double>()));
    EXPECT_LT((grad - reference_logp.grad()).abs().max().item<double>(), 1e-6);
    // the batch takes every branch: the dual clip caps some tokens (and logs their share)
    const at::Tensor ratio = at::exp(logp_values - old), negative = A.unsqueeze(1) < 0;
    const at::Tensor capped = negative & (-A.unsqueeze(1) * ratio > -A.unsqueeze(1) * c);
    EXPECT_GT((capped.to(at::kFloat) * mask).sum().item<double>(), 0.0) << "no token is capped by the dual clip";
    EXPECT_GT(((ratio < 1 - epsilon) & mask.to(at::kBool)).sum().item<int64_t>(), 0);
    EXPECT_GT(((ratio > 1 - epsilon) & (ratio < 1 + epsilon_high)).sum().item<int64_t>(), 0);
    ASSERT_EQ(r.metric_sums.size(), 2u);
    EXPECT_DOUBLE_EQ(r.metric_sums[1], (capped.to(at::kFloat) * mask).sum().item<double>());

    // 2. the host's path: policy_loss back-propagates sum(grad * logp) through the model's log-probs
    grove::PolicyLossOptions o;
    o.beta = beta;
    o.epsilon = epsilon;
    o.epsilon_high = epsilon_high;
    grove::PolicyLossInputs in;
    in.logp = logp_values.clone().requires_grad_(true);
    in.entropy = at::zeros({B, T});
    in.old_logp = old;
    in.ref_logp = ref;
    in.sampling_ratio = sampling_ratio;
    in.advantages = A;
    in.mask = mask;
    in.weights = weights;
    grove::PolicyLossResult host = grove::policy_loss(objective, in, o);
    host.loss.backward();
    at::Tensor autograd_logp = logp_values.clone().requires_grad_(true);
    const at::Tensor expected =
        autograd_dual_clip(autograd_logp, old, ref, A, weights, sampling_ratio, epsilon, epsilon_high, c, beta);
    expected.backward();
    EXPECT_NEAR(host.value, expected.item<double>(), 1e-6 * std::abs(expected.item<double>()));
    EXPECT_LT((in.logp.grad() - autograd_logp.grad()).abs().max().item<double>(), 1e-6);
}

TEST(CustomObjectiveExample, RefusesOptionsItDoesNotImplement) {
    const grove::PluginInstance objective = example("");
    const std::vector<float> zeros(4, 0.0f), ones(4, 1.0f), advantages(1, 1.0f);
    grove_objective_batch batch{};
    batch.struct_size = sizeof(batch);
    batch.rows = 1;
    batch.columns = 4;
    batch.logp = batch.weights = zeros.data();
    batch.mask = ones.data();
    batch.advantages = advantages.data();
    batch.delta = NAN;
    EXPECT_EQ(objective.objective_loss(batch).loss, 0.0);
    batch.use_bias_correction_kl = 1;
    try {
        objective.objective_loss(batch);
        FAIL() << "accepted use_bias_correction_kl";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("neither loss.delta nor loss.use_bias_correction_kl"), std::string::npos)
            << e.what();
    }
}

TEST(CustomObjectiveExample, RefusesAClipRatioThatCapsNothing) {
    try {
        example("clip_ratio_c = 1.0");
        FAIL() << "accepted clip_ratio_c = 1";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("'clip_ratio_c': must be > 1"), std::string::npos) << e.what();
    }
}
