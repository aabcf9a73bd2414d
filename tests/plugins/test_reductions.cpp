// The four reductions on hand-computed masks, and the split-invariance each one claims (or not).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "grove/error.hpp"
#include "grove/plugin_host.hpp"
#include "plugin_test_support.hpp"

namespace {

grove::PluginInstance make(const std::string& name, const std::string& config = "") {
    grove::PluginHost host({grove::test::build_plugin_dir()});
    auto info = host.find(name, GROVE_PLUGIN_KIND_REDUCTION);
    return grove::PluginInstance(info, grove::PluginConfig::from_toml_text(info, config, "test"));
}

struct Batch {
    uint32_t rows, columns;
    std::vector<float> mask, loss;  // row-major [rows*columns]
    double tokens() const { return std::accumulate(mask.begin(), mask.end(), 0.0); }
    Batch slice(uint32_t first, uint32_t count) const {
        Batch b{count, columns, {}, {}};
        b.mask.assign(mask.begin() + size_t(first) * columns, mask.begin() + size_t(first + count) * columns);
        b.loss.assign(loss.begin() + size_t(first) * columns, loss.begin() + size_t(first + count) * columns);
        return b;
    }
};

grove_reduction_context context(const Batch& b, uint32_t accumulation, uint32_t steps_per_generation, double generation_tokens,
                                double window_tokens, uint32_t world_size = 1, uint32_t max_completion_length = 0) {
    grove_reduction_context c{};
    c.struct_size = sizeof(c);
    c.rows = b.rows;
    c.columns = b.columns;
    c.mask = b.mask.data();
    c.gradient_accumulation_steps = accumulation;
    c.steps_per_generation = steps_per_generation;
    c.world_size = world_size;
    c.max_completion_length = max_completion_length ? max_completion_length : b.columns;
    c.generation_batch_tokens = generation_tokens;
    c.generation_batch_sequences = b.rows;
    c.optimizer_window_tokens = window_tokens;
    return c;
}

double weighted_loss(const grove::PluginInstance& r, const Batch& b, const grove_reduction_context& c) {
    std::vector<float> w;
    r.weights(c, w);
    double sum = 0;
    for (size_t i = 0; i < w.size(); ++i) sum += double(w[i]) * b.loss[i];
    return sum;
}

// A generation batch with varied lengths: some full rows, some empty, random per-token losses.
Batch random_batch(uint32_t rows, uint32_t columns, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<uint32_t> length(0, columns);
    std::normal_distribution<float> value(0.0f, 1.0f);
    Batch b{rows, columns, std::vector<float>(size_t(rows) * columns, 0.0f), std::vector<float>(size_t(rows) * columns)};
    for (uint32_t r = 0; r < rows; ++r) {
        uint32_t n = r == 0 ? columns : r == 1 ? 0 : length(rng);
        for (uint32_t t = 0; t < n; ++t) b.mask[size_t(r) * columns + t] = 1.0f;
    }
    for (auto& x : b.loss) x = value(rng);
    return b;
}

const Batch kHand{2, 3, {1, 1, 0, 1, 0, 0}, {1, 1, 1, 1, 1, 1}};

std::vector<float> weights_of(const std::string& name, const grove_reduction_context& c, const std::string& config = "") {
    auto r = make(name, config);
    std::vector<float> w;
    r.weights(c, w);
    return w;
}

}  // namespace

TEST(Reductions, GrpoAveragesEachSequenceThenSequences) {
    // row 0 has 2 tokens, row 1 has 1; GA = 2: weight = m / len / B / GA
    auto w = weights_of("grpo", context(kHand, 2, 2, 3, 3));
    std::vector<float> expected{0.125f, 0.125f, 0, 0.25f, 0, 0};
    for (size_t i = 0; i < w.size(); ++i) EXPECT_FLOAT_EQ(w[i], expected[i]) << i;
}

TEST(Reductions, BnpoDividesByLocalTokens) {
    auto w = weights_of("bnpo", context(kHand, 1, 1, 99, 99));  // global counts must not matter
    std::vector<float> expected{1 / 3.f, 1 / 3.f, 0, 1 / 3.f, 0, 0};
    for (size_t i = 0; i < w.size(); ++i) EXPECT_FLOAT_EQ(w[i], expected[i]) << i;
}

TEST(Reductions, DrGrpoDividesByRowsTimesMaxCompletionLength) {
    auto w = weights_of("dr_grpo", context(kHand, 1, 1, 3, 3, 1, 4));
    std::vector<float> expected{0.125f, 0.125f, 0, 0.125f, 0, 0};
    for (size_t i = 0; i < w.size(); ++i) EXPECT_FLOAT_EQ(w[i], expected[i]) << i;
}

TEST(Reductions, DapoDividesByWindowTokensPerProcess) {
    // 2 processes, 6 tokens in the optimizer window over both: weight = m * 2 / 6
    auto w = weights_of("dapo", context(kHand, 1, 1, 12, 6, 2));
    std::vector<float> expected{1 / 3.f, 1 / 3.f, 0, 1 / 3.f, 0, 0};
    for (size_t i = 0; i < w.size(); ++i) EXPECT_FLOAT_EQ(w[i], expected[i]) << i;
    // TRL's normaliser (generation batch) when asked for
    auto trl = weights_of("dapo", context(kHand, 1, 1, 12, 6, 2), "normalizer = \"generation_batch\"");
    EXPECT_FLOAT_EQ(trl[0], 2.f / 12.f);
}

TEST(Reductions, DapoRejectsAnUnknownNormalizerNamingTheKey) {
    try {
        make("dapo", "normalizer = \"window\"");
        FAIL() << "expected an error";
    } catch (const grove::Error& e) {
        EXPECT_NE(std::string(e.what()).find("'normalizer'"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("optimizer_window"), std::string::npos) << e.what();
    }
}

TEST(Reductions, FullyMaskedBatchGivesZeroWeightsNotNaN) {
    Batch empty{3, 4, std::vector<float>(12, 0.0f), std::vector<float>(12, 1.0f)};
    for (const char* name : {"grpo", "bnpo", "dr_grpo", "dapo", "luspo"}) {
        auto w = weights_of(name, context(empty, 1, 1, 0, 0));
        for (float x : w) EXPECT_EQ(x, 0.0f) << name;
    }
}

// For grpo, dr_grpo, dapo and luspo, accumulating over k equal micro-batches (GA = spg = k) gives the
// whole-batch loss; for dapo, any split of the window does.
TEST(Reductions, SplitInvariantReductionsSumToTheWholeBatchLoss) {
    for (unsigned seed : {1u, 2u, 3u}) {
        Batch whole = random_batch(12, 7, seed);
        double tokens = whole.tokens();
        for (const char* name : {"grpo", "dr_grpo", "dapo", "luspo"}) {
            auto r = make(name);
            double expected = weighted_loss(r, whole, context(whole, 1, 1, tokens, tokens));
            for (uint32_t k : {2u, 3u, 4u, 6u, 12u}) {
                double sum = 0;
                for (uint32_t i = 0; i < k; ++i) {
                    Batch part = whole.slice(i * (12 / k), 12 / k);
                    sum += weighted_loss(r, part, context(part, k, k, tokens, tokens));
                }
                EXPECT_NEAR(sum, expected, 1e-6 * std::max(1.0, std::abs(expected))) << name << " k=" << k;
            }
        }
        // dapo: unequal micro-batches (5 + 4 + 3 rows) too
        auto dapo = make("dapo");
        double expected = weighted_loss(dapo, whole, context(whole, 1, 1, tokens, tokens));
        double sum = 0;
        uint32_t first = 0;
        for (uint32_t rows : {5u, 4u, 3u}) {
            Batch part = whole.slice(first, rows);
            first += rows;
            sum += weighted_loss(dapo, part, context(part, 3, 3, tokens, tokens));
        }
        EXPECT_NEAR(sum, expected, 1e-6 * std::max(1.0, std::abs(expected)));
    }
}

TEST(Reductions, BnpoIsNotSplitInvariant) {
    Batch whole{2, 4, {1, 1, 1, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 5, 0, 0, 0}};
    auto r = make("bnpo");
    double one = weighted_loss(r, whole, context(whole, 1, 1, 5, 5));  // (4 + 5) / 5 = 1.8
    double two = weighted_loss(r, whole.slice(0, 1), context(whole.slice(0, 1), 2, 2, 5, 5)) +
                 weighted_loss(r, whole.slice(1, 1), context(whole.slice(1, 1), 2, 2, 5, 5));  // (4/4 + 5/1)/2 = 3
    EXPECT_NEAR(one, 1.8, 1e-6);
    EXPECT_NEAR(two, 3.0, 1e-6);
}

// steps_per_generation = 4, gradient_accumulation_steps = 2: two optimizer steps per generation.
// With the window normaliser each step is exactly the token mean of its own micro-batches (TRL
// issue #5619 is the generation-batch normaliser being off by GA/spg).
TEST(Reductions, DapoWindowNormaliserIsExactWhenStepsPerGenerationExceedsAccumulation) {
    Batch whole = random_batch(8, 5, 11);
    auto exact = make("dapo");
    auto trl = make("dapo", "normalizer = \"generation_batch\"");
    double total = whole.tokens();
    for (uint32_t step = 0; step < 2; ++step) {
        Batch a = whole.slice(step * 4, 2), b = whole.slice(step * 4 + 2, 2);
        double window = a.tokens() + b.tokens();
        double token_sum = 0;
        for (const Batch* part : {&a, &b})
            for (size_t i = 0; i < part->loss.size(); ++i) token_sum += part->mask[i] * part->loss[i];
        double exact_loss =
            weighted_loss(exact, a, context(a, 2, 4, total, window)) + weighted_loss(exact, b, context(b, 2, 4, total, window));
        double trl_loss =
            weighted_loss(trl, a, context(a, 2, 4, total, window)) + weighted_loss(trl, b, context(b, 2, 4, total, window));
        EXPECT_NEAR(exact_loss, token_sum / window, 1e-6);
        EXPECT_NEAR(trl_loss, token_sum / total, 1e-6);
        EXPECT_GT(std::abs(exact_loss - trl_loss), 1e-4);  // the difference is real
    }
}
