#include "grove/advantages.hpp"

#include <cmath>
#include <limits>

#include "grove/error.hpp"

namespace grove {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kEpsilon = 1e-4;  // TRL's, everywhere since v0.14
}  // namespace

double nanmean(const std::vector<double>& x) {
    double sum = 0;
    int n = 0;
    for (double v : x)
        if (!std::isnan(v)) {
            sum += v;
            ++n;
        }
    return n ? sum / n : kNaN;
}

double nanstd(const std::vector<double>& x) {
    double mean = nanmean(x);
    double sum = 0;
    int n = 0;
    for (double v : x)
        if (!std::isnan(v)) {
            sum += (v - mean) * (v - mean);
            ++n;
        }
    return n > 1 ? std::sqrt(sum / (n - 1)) : kNaN;
}

AdvantageResult compute_advantages(const std::vector<float>& R, int K, const std::vector<double>& weights,
                                   const AdvantageOptions& o) {
    if (K <= 0 || int(weights.size()) != K) throw Error(ErrorKind::runtime, "compute_advantages: one weight per reward");
    size_t N = R.size() / size_t(K);
    int G = o.num_generations;
    if (G < 1 || N % size_t(G) != 0)
        throw Error(ErrorKind::runtime,
                    "compute_advantages: " + std::to_string(N) + " rows do not form groups of " + std::to_string(G));
    AdvantageResult out;
    std::vector<double> r(N, kNaN), A(N, kNaN), std_used(N, kNaN);
    std::vector<bool> unscorable(N, true);
    for (size_t i = 0; i < N; ++i)
        for (int k = 0; k < K; ++k)
            if (!std::isnan(R[i * K + k])) unscorable[i] = false;

    auto group_rows = [&](size_t g, const std::vector<double>& values) {
        return std::vector<double>(values.begin() + g * G, values.begin() + (g + 1) * G);
    };
    // nansum_k(w_k x[i,k]) for every row; NaN for rows where every reward is NaN
    auto weighted_sums = [&](const auto& x) {
        std::vector<double> sums(N, kNaN);
        for (size_t i = 0; i < N; ++i) {
            if (unscorable[i]) continue;
            double sum = 0;
            for (int k = 0; k < K; ++k)
                if (!std::isnan(x[i * K + k])) sum += weights[k] * x[i * K + k];
            sums[i] = sum;
        }
        return sums;
    };
    // the logged reward is the weighted sum of the raw rewards in both aggregations (TRL's
    // test_reward_metric_reflects_reward_weights)
    const std::vector<double> raw = weighted_sums(R);
    // one completion per prompt (evaluation's num_generations_eval = 1) or a batch of one row has no
    // spread: TRL takes its std as 0 (so it counts towards frac_reward_zero_std) rather than NaN
    const auto group_std = [&](const std::vector<double>& rows) { return G > 1 ? nanstd(rows) : 0.0; };
    const auto batch_std = [&](const std::vector<double>& all) { return all.size() > 1 ? nanstd(all) : 0.0; };
    if (o.aggregation == RewardAggregation::sum_then_normalize) {
        r = raw;
        const double whole_batch_std = batch_std(r);
        for (size_t g = 0; g < N / G; ++g) {
            auto rows = group_rows(g, r);
            double mean = nanmean(rows), std = o.scale_rewards == ScaleRewards::batch ? whole_batch_std : group_std(rows);
            for (int j = 0; j < G; ++j) {
                size_t i = g * G + j;
                std_used[i] = std;
                A[i] = r[i] - mean;
                if (o.scale_rewards != ScaleRewards::none) A[i] /= std + kEpsilon;
            }
        }
    } else {  // normalize_then_sum
        std::vector<double> z(N * K, kNaN);
        for (int k = 0; k < K; ++k) {
            std::vector<double> column(N);
            for (size_t i = 0; i < N; ++i) column[i] = R[i * K + k];
            for (size_t g = 0; g < N / G; ++g) {
                auto rows = group_rows(g, column);
                double mean = nanmean(rows), std = group_std(rows);
                for (int j = 0; j < G; ++j) z[(g * G + j) * K + k] = (column[g * G + j] - mean) / (std + kEpsilon);
            }
        }
        r = weighted_sums(z);
        double mean = nanmean(r), std = batch_std(r);
        for (size_t i = 0; i < N; ++i) {
            A[i] = (r[i] - mean) / (std + kEpsilon);
            std_used[i] = std;
        }
    }

    out.advantages.resize(N);
    out.rewards.resize(N);
    int zero_std = 0;
    for (size_t i = 0; i < N; ++i) {
        out.advantages[i] = std::isnan(A[i]) ? 0.0f : float(A[i]);
        out.rewards[i] = float(raw[i]);
        // TRL: isclose(std, 0) on the per-row std actually used (NaN is not close to 0)
        if (!std::isnan(std_used[i]) && std::abs(std_used[i]) <= 1e-8) ++zero_std;
        out.unscorable_rows += unscorable[i];
    }
    out.frac_reward_zero_std = N ? double(zero_std) / double(N) : 0.0;
    out.reward = nanmean(raw);
    out.reward_std = nanstd(raw);
    for (int k = 0; k < K; ++k) {
        std::vector<double> column(N);
        for (size_t i = 0; i < N; ++i) column[i] = R[i * K + k];
        out.reward_mean.push_back(nanmean(column));
        out.reward_std_per_function.push_back(nanstd(column));
    }
    return out;
}

}  // namespace grove
