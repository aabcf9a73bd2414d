// The LoRA plugin through the host tensor-op table, on a standalone linear layer, against the same
// formula computed directly in libtorch.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "grove/adapter_host.hpp"
#include "grove/error.hpp"
#include "plugin_test_support.hpp"

namespace {

grove::PluginInstance make(const std::string& name, const std::string& config) {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    auto info = host.find(name, GROVE_PLUGIN_KIND_ADAPTER);
    return grove::PluginInstance(info, grove::PluginConfig::from_toml_text(info, config, "test"));
}

grove::LinearLayer q_proj(int64_t out, int64_t in, bool bias) {
    grove::LinearLayer layer;
    layer.name = "model.layers.3.self_attn.q_proj";
    layer.layer_index = 3;
    layer.weight = at::randn({out, in}, at::kFloat).requires_grad_(false);
    if (bias) layer.bias = at::randn({out}, at::kFloat);
    return layer;
}

}  // namespace

TEST(Lora, ForwardEqualsBasePlusScaledLowRankUpdate) {
    at::manual_seed(0);
    for (bool rslora : {false, true}) {
        auto lora = make("lora", std::string("r = 4\nalpha = 8.0\nuse_rslora = ") + (rslora ? "true" : "false"));
        grove::AdapterHost host(lora);
        EXPECT_FALSE(host.trains_base_weights());
        auto layer = q_proj(6, 5, true);
        auto adapted = host.attach(layer);
        ASSERT_TRUE(adapted);
        ASSERT_EQ(adapted->parameters().size(), 2u);
        at::Tensor A = adapted->parameters()[0].second, B = adapted->parameters()[1].second;
        EXPECT_EQ(A.sizes(), (at::IntArrayRef{4, 5}));
        EXPECT_EQ(B.sizes(), (at::IntArrayRef{6, 4}));
        EXPECT_TRUE(at::equal(B, at::zeros_like(B)));  // B starts at zero: the adapter starts as identity
        // Kaiming-uniform(a = sqrt(5)) => |A| <= 1/sqrt(in)
        EXPECT_LE(A.abs().max().item<double>(), 1.0 / std::sqrt(5.0) + 1e-6);
        EXPECT_GT(A.abs().max().item<double>(), 0.0);
        {
            at::NoGradGuard no_grad;
            B.normal_();  // a non-zero B, so the check below is not trivially W x + b
        }
        at::Tensor x = at::randn({3, 2, 5});
        double scaling = rslora ? 8.0 / 2.0 : 8.0 / 4.0;
        at::Tensor expected =
            at::linear(x, layer.weight, *layer.bias) + scaling * at::matmul(at::matmul(x, A.detach().t()), B.detach().t());
        EXPECT_TRUE(at::allclose(adapted->forward(x), expected, 1e-5, 1e-6)) << (rslora ? "rslora" : "lora");
    }
}

TEST(Lora, OnlyAdapterParametersReceiveGradients) {
    at::manual_seed(1);
    auto lora = make("lora", "r = 2\nalpha = 4.0");
    grove::AdapterHost host(lora);
    auto layer = q_proj(4, 3, true);
    auto adapted = host.attach(layer);
    ASSERT_TRUE(adapted);
    at::Tensor A = adapted->parameters()[0].second, B = adapted->parameters()[1].second;
    adapted->forward(at::randn({5, 3})).pow(2).sum().backward();
    ASSERT_TRUE(B.grad().defined());
    EXPECT_GT(B.grad().abs().sum().item<double>(), 0.0);  // B = 0, so dL/dB = s * grad_y (A x)^T != 0
    ASSERT_TRUE(A.grad().defined());                      // dL/dA = 0 while B = 0, but it is tracked
    EXPECT_FALSE(layer.weight.grad().defined());
    EXPECT_FALSE(layer.bias->grad().defined());
    EXPECT_FALSE(layer.weight.requires_grad());
}

TEST(Lora, MergedDeltaEqualsScaledBA_AndMergedLayerMatchesAdapted) {
    at::manual_seed(2);
    auto lora = make("lora", "r = 3\nalpha = 6.0");
    grove::AdapterHost host(lora);
    host.set_training(false);
    auto layer = q_proj(5, 4, false);
    auto adapted = host.attach(layer);
    at::Tensor A = adapted->parameters()[0].second, B = adapted->parameters()[1].second;
    {
        at::NoGradGuard no_grad;
        B.normal_();
    }
    at::Tensor delta = adapted->merged_delta();
    EXPECT_TRUE(at::allclose(delta, 2.0 * at::matmul(B, A), 1e-5, 1e-6));
    at::Tensor x = at::randn({7, 4});
    EXPECT_TRUE(at::allclose(at::linear(x, layer.weight + delta), adapted->forward(x), 1e-4, 1e-5));
}

TEST(Lora, TargetsOnlyTheNamedModulesAndNamesParametersLikePeft) {
    auto lora = make("lora", "target_modules = [\"v_proj\"]");
    grove::AdapterHost host(lora);
    EXPECT_FALSE(host.attach(q_proj(4, 4, false)));  // q_proj is not targeted
    grove::LinearLayer v = q_proj(4, 4, false);
    v.name = "model.layers.0.self_attn.v_proj";
    auto adapted = host.attach(v);
    ASSERT_TRUE(adapted);
    EXPECT_EQ(adapted->parameters()[0].first, "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight");
    EXPECT_EQ(adapted->parameters()[1].first, "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight");
    auto config = nlohmann::json::parse(host.saved_config_json());
    EXPECT_EQ(config["peft_type"], "LORA");
    EXPECT_EQ(config["r"], 8);
    EXPECT_EQ(config["lora_alpha"], 8.0);
    EXPECT_EQ(config["target_modules"], nlohmann::json::array({"v_proj"}));
}

TEST(Lora, DropoutAppliesOnlyWhileTraining) {
    at::manual_seed(3);
    auto lora = make("lora", "r = 2\ndropout = 0.5");
    grove::AdapterHost host(lora);
    auto layer = q_proj(3, 64, false);
    auto adapted = host.attach(layer);
    {
        at::NoGradGuard no_grad;
        adapted->parameters()[1].second.fill_(1.0);
    }
    at::Tensor x = at::ones({1, 64});
    host.set_training(false);
    at::Tensor eval1 = adapted->delta(x), eval2 = adapted->delta(x);
    EXPECT_TRUE(at::equal(eval1, eval2));
    host.set_training(true);
    EXPECT_FALSE(at::allclose(adapted->delta(x), eval1));  // half the inputs dropped, the rest doubled
}

TEST(Lora, BadConfigurationNamesTheKey) {
    for (const char* config : {"r = 0", "alpha = -1.0", "dropout = 1.0", "target_modules = []"}) {
        try {
            make("lora", config);
            ADD_FAILURE() << "accepted " << config;
        } catch (const grove::Error& e) {
            std::string key = std::string(config).substr(0, std::string(config).find(' '));
            EXPECT_NE(std::string(e.what()).find("'" + key + "'"), std::string::npos) << e.what();
        }
    }
}

TEST(FullAdapter, TrainsBaseWeightsAndAttachesNothing) {
    auto full = make("full", "");
    grove::AdapterHost host(full);
    EXPECT_TRUE(host.trains_base_weights());
    EXPECT_FALSE(host.attach(q_proj(4, 4, true)));
    EXPECT_EQ(host.saved_config_json(), "");
}
