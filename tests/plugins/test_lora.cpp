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

// DoRA: y = b + (m / n) (W + s B A) x, n = ||W + s B A|| per output row, m starting at ||W||.
TEST(Lora, DoraRescalesEachOutputRowToItsMagnitudeAndMergesTheSame) {
    at::manual_seed(4);
    auto dora = make("lora", "r = 2\nalpha = 6.0\nuse_dora = true");
    grove::AdapterHost host(dora);
    auto layer = q_proj(6, 5, true);
    auto adapted = host.attach(layer);
    ASSERT_EQ(adapted->parameters().size(), 3u);
    EXPECT_EQ(adapted->parameters()[2].first, "base_model.model.model.layers.3.self_attn.q_proj.lora_magnitude_vector");
    at::Tensor A = adapted->parameters()[0].second, B = adapted->parameters()[1].second, m = adapted->parameters()[2].second;
    EXPECT_TRUE(at::allclose(m, layer.weight.norm(2, {1}), 1e-6, 1e-7)) << "m starts as the rows' norms of W";
    at::Tensor x = at::randn({3, 5});
    EXPECT_TRUE(at::allclose(adapted->forward(x), at::linear(x, layer.weight, *layer.bias), 1e-5, 1e-6))
        << "a new DoRA adapter leaves the layer as it was";
    {
        at::NoGradGuard no_grad;
        B.normal_();
        m.mul_(at::rand({6}) + 0.5);
    }
    at::Tensor V = layer.weight + 3.0 * at::matmul(B, A).detach();
    at::Tensor expected = at::linear(x, (m.detach() / V.norm(2, {1})).unsqueeze(1) * V, *layer.bias);
    at::Tensor y = adapted->forward(x);
    EXPECT_TRUE(at::allclose(y, expected, 1e-5, 1e-5));
    EXPECT_TRUE(at::allclose(at::linear(x, layer.weight + adapted->merged_delta(), *layer.bias), y, 1e-5, 1e-5));
    // the norm is a constant in backward: dL/dm = sum over rows of x of (V x / n) * dL/dy
    y.sum().backward();
    EXPECT_TRUE(at::allclose(m.grad(), (at::linear(x, V) / V.norm(2, {1})).sum(0), 1e-5, 1e-5));
    EXPECT_FALSE(layer.weight.grad().defined());
}

// With dropout, DoRA's base term is W dropout(x), as in PEFT: outside training it is W x again.
TEST(Lora, DoraDropoutDropsTheBaseTermToo) {
    at::manual_seed(5);
    auto dora = make("lora", "r = 2\nuse_dora = true\ndropout = 0.5");
    grove::AdapterHost host(dora);
    auto layer = q_proj(4, 1, false);  // one input: dropout keeps it doubled or zeroes it
    auto adapted = host.attach(layer);
    {
        at::NoGradGuard no_grad;
        adapted->parameters()[2].second.mul_(2.0);  // m = 2 ||W|| with B = 0: the delta is W dropout(x)
    }
    at::Tensor x = at::randn({200, 1});
    host.set_training(false);
    EXPECT_TRUE(at::allclose(adapted->delta(x), at::linear(x, layer.weight), 1e-5, 1e-5));
    host.set_training(true);
    at::Tensor delta = adapted->delta(x), doubled = 2.0 * at::linear(x, layer.weight);
    at::Tensor kept = (delta - doubled).abs().amax(1) < 1e-5, dropped = delta.abs().amax(1) < 1e-7;
    EXPECT_TRUE((kept | dropped).all().item<bool>()) << "each row is W (2x) or 0";
    EXPECT_GT(kept.sum().item<int64_t>(), 50);
    EXPECT_GT(dropped.sum().item<int64_t>(), 50);
}

// target_modules as PEFT reads a list: a name, or its ending after a dot; then layers_to_transform
// (which narrows endings, not whole names) and exclude_modules; rank_pattern and alpha_pattern pick
// a layer's rank and scale.
TEST(Lora, ChoosesLayersRanksAndScalesAsPeft) {
    auto lora = make("lora",
                     "r = 4\nalpha = 8.0\n"
                     "target_modules = [\"self_attn.q_proj\", \"up_proj\", \"model.layers.0.self_attn.v_proj\"]\n"
                     "layers_to_transform = [1, 3]\nexclude_modules = [\"model.layers.1.mlp.up_proj\"]\n"
                     "rank_pattern = { \"layers.3.self_attn.q_proj\" = 2 }\nalpha_pattern = { \"q_proj\" = 1.0 }");
    grove::AdapterHost host(lora);
    auto layer_at = [](const std::string& name, uint32_t index) {
        grove::LinearLayer layer = q_proj(4, 4, false);
        layer.name = name;
        layer.layer_index = index;
        return layer;
    };
    EXPECT_FALSE(host.attach(layer_at("model.layers.3.self_attn.k_proj", 3)));
    EXPECT_FALSE(host.attach(layer_at("model.layers.3.cross_attn.q_proj", 3))) << "self_attn.q_proj names one module";
    EXPECT_FALSE(host.attach(layer_at("model.layers.0.self_attn.q_proj", 0))) << "layer 0 is not transformed";
    EXPECT_FALSE(host.attach(layer_at("model.layers.1.mlp.up_proj", 1))) << "excluded";
    EXPECT_FALSE(host.attach(layer_at("model.layers.1.mlp.my_up_proj", 1))) << "not an ending after a dot";
    EXPECT_TRUE(host.attach(layer_at("model.layers.0.self_attn.v_proj", 0))) << "a whole name, in any layer";
    auto up = host.attach(layer_at("model.layers.3.mlp.up_proj", 3));
    ASSERT_TRUE(up);
    EXPECT_EQ(up->parameters()[0].second.size(0), 4);
    auto q = host.attach(layer_at("model.layers.3.self_attn.q_proj", 3));
    ASSERT_TRUE(q);
    EXPECT_EQ(q->parameters()[0].second.size(0), 2) << "rank_pattern";
    at::Tensor A = q->parameters()[0].second, B = q->parameters()[1].second;
    {
        at::NoGradGuard no_grad;
        B.normal_();
    }
    EXPECT_TRUE(at::allclose(q->merged_delta(), 0.5 * at::matmul(B, A), 1e-5, 1e-6)) << "alpha_pattern's 1.0 over rank 2";
    auto q1 = host.attach(layer_at("model.layers.1.self_attn.q_proj", 1));
    ASSERT_TRUE(q1);
    EXPECT_EQ(q1->parameters()[0].second.size(0), 4) << "the pattern names layer 3 only";
    auto config = nlohmann::json::parse(host.saved_config_json());
    EXPECT_EQ(config["layers_to_transform"], nlohmann::json::array({1, 3}));
    EXPECT_EQ(config["rank_pattern"]["layers.3.self_attn.q_proj"], 2);
    EXPECT_EQ(config["alpha_pattern"]["q_proj"], 1.0);
    EXPECT_EQ(config["exclude_modules"], nlohmann::json::array({"model.layers.1.mlp.up_proj"}));
}

// PEFT takes the first pattern in its file's order; a TOML table keeps none, so two patterns that
// give one module different ranks are refused, naming both and the module.
TEST(Lora, PatternsThatDisagreeOnAModuleAreRefused) {
    auto agreeing = make("lora", "rank_pattern = { \"q_proj\" = 2, \"self_attn.q_proj\" = 2 }");
    grove::AdapterHost fine(agreeing);
    auto q = fine.attach(q_proj(4, 4, false));
    ASSERT_TRUE(q);
    EXPECT_EQ(q->parameters()[0].second.size(0), 2);
    auto lora = make("lora", "rank_pattern = { \"q_proj\" = 2, \"self_attn.q_proj\" = 4 }");
    grove::AdapterHost host(lora);
    EXPECT_CONTAINS(grove::test::error_message([&] { host.attach(q_proj(4, 4, false)); }),
                    "'q_proj' and 'self_attn.q_proj' both match model.layers.3.self_attn.q_proj");
}

// init_lora_weights: "gaussian" draws A with std 1/r, "false" draws B too (the adapter acts at once)
TEST(Lora, InitLoraWeightsAsPeft) {
    at::manual_seed(6);
    auto gaussian = make("lora", "r = 4\ninit_lora_weights = \"gaussian\"");
    grove::AdapterHost g(gaussian);
    grove::LinearLayer wide = q_proj(64, 512, false);
    auto a = g.attach(wide);
    EXPECT_NEAR(a->parameters()[0].second.std().item<double>(), 0.25, 0.01);
    EXPECT_TRUE(at::equal(a->parameters()[1].second, at::zeros_like(a->parameters()[1].second)));
    auto random = make("lora", "r = 4\ninit_lora_weights = \"false\"");
    grove::AdapterHost f(random);
    auto b = f.attach(wide);
    at::Tensor B = b->parameters()[1].second;
    EXPECT_GT(B.abs().max().item<double>(), 0.0);
    EXPECT_LE(B.abs().max().item<double>(), 1.0 / std::sqrt(4.0) + 1e-6);  // Kaiming-uniform(a = sqrt(5)), fan_in r
    EXPECT_EQ(nlohmann::json::parse(f.saved_config_json())["init_lora_weights"], false);
    EXPECT_EQ(nlohmann::json::parse(g.saved_config_json())["init_lora_weights"], "gaussian");
}

// target_modules_regex / exclude_modules_regex: PEFT's string target_modules and exclude_modules,
// regular expressions the whole module name must match (re.fullmatch), saved back as strings.
TEST(Lora, TargetsARegularExpressionAsPeftTakesAString) {
    auto lora = make("lora", R"(target_modules_regex = 'model\.layers\.[13]\.self_attn\.(q|v)_proj')"
                             "\n"
                             R"(exclude_modules_regex = '.*\.3\.self_attn\.v_proj')");
    grove::AdapterHost host(lora);
    auto attaches = [&](const std::string& name) {
        grove::LinearLayer layer = q_proj(4, 4, false);
        layer.name = name;
        return host.attach(layer) != nullptr;
    };
    EXPECT_TRUE(attaches("model.layers.1.self_attn.q_proj"));
    EXPECT_TRUE(attaches("model.layers.3.self_attn.q_proj"));
    EXPECT_TRUE(attaches("model.layers.1.self_attn.v_proj"));
    EXPECT_FALSE(attaches("model.layers.3.self_attn.v_proj")) << "excluded";
    EXPECT_FALSE(attaches("model.layers.2.self_attn.q_proj")) << "another layer";
    EXPECT_FALSE(attaches("model.layers.13.self_attn.q_proj")) << "the whole name must match, not its ending";
    EXPECT_FALSE(attaches("model.layers.1.self_attn.q_proj.extra")) << "nor its beginning";
    auto config = nlohmann::json::parse(host.saved_config_json());
    EXPECT_EQ(config["target_modules"], R"(model\.layers\.[13]\.self_attn\.(q|v)_proj)");
    EXPECT_EQ(config["exclude_modules"], R"(.*\.3\.self_attn\.v_proj)");
}

TEST(Lora, BadConfigurationNamesTheKey) {
    for (const char* config :
         {"r = 0", "alpha = -1.0", "dropout = 1.0", "target_modules = []", "init_lora_weights = \"pissa\"",
          "rank_pattern = { q_proj = 0 }", "rank_pattern = { \"(q\" = 2 }", "rank_pattern = { q_proj = 2.5 }",
          "alpha_pattern = { q_proj = -1.0 }", "layers_to_transform = [-1]",
          "layers_to_transform = [0]\ntarget_modules = [\"all-linear\"]", "target_modules_regex = \"(q\"",
          "exclude_modules_regex = \"[\"", "target_modules_regex = \"q_proj\"\ntarget_modules = [\"q_proj\"]",
          "exclude_modules_regex = \"q_proj\"\nexclude_modules = [\"q_proj\"]",
          "layers_to_transform = [1]\ntarget_modules_regex = \".*q_proj\""}) {
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
