#include "train/best_checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "grove/error.hpp"

namespace grove {

namespace {
// The metrics as a user names them in the manifest: without eval_, comma-separated.
std::string metric_list(const std::vector<std::string>& names) {
    std::string text;
    for (const std::string& name : names)
        text += (text.empty() ? "" : ", ") + (name.rfind("eval_", 0) == 0 ? name.substr(5) : name);
    return text;
}

std::string unknown_metric(const std::string& metric, const std::vector<std::string>& evaluated) {
    return "train.metric_for_best_model = \"" + metric.substr(5) + "\": the run's evaluation logs no " + metric + "; it logs " +
           metric_list(evaluated) + ": name one of those";
}
}  // namespace

EvaluationOutcome record_evaluation(const BestModelSettings& settings, const std::map<std::string, double>& metrics,
                                    int64_t step, BestSoFar& best) {
    if (!settings.metric) return {};
    const auto found = metrics.find(*settings.metric);
    if (found == metrics.end()) {
        std::vector<std::string> evaluated;
        for (const auto& [name, value] : metrics)
            if (name.rfind("eval_", 0) == 0) evaluated.push_back(name);
        throw Error(ErrorKind::manifest, unknown_metric(*settings.metric, evaluated));
    }
    const double value = found->second;
    auto better = [&](double than) { return settings.greater_is_better ? value > than : value < than; };
    EvaluationOutcome outcome;  // NaN is never better, nor an improvement
    if (settings.early_stopping_patience) {
        const bool improved =
            !best.metric || (better(*best.metric) && std::abs(value - *best.metric) > settings.early_stopping_threshold);
        best.evaluations_without_improvement = improved ? 0 : best.evaluations_without_improvement + 1;
        outcome.stop_early = best.evaluations_without_improvement >= *settings.early_stopping_patience;
    }
    if (!std::isnan(value) && (!best.metric || better(*best.metric))) {
        best.metric = value;
        best.step = step;
        outcome.new_best = true;
    }
    return outcome;
}

std::string early_stopping_note(const BestModelSettings& settings, const BestSoFar& best, int64_t step, int64_t total) {
    std::ostringstream note;
    note << "grove: early stopping: " << best.evaluations_without_improvement << " evaluations in a row did not improve "
         << settings.metric.value_or("?") << " by more than " << settings.early_stopping_threshold << " on the best, "
         << best.metric.value_or(NAN) << " after step " << best.step.value_or(0)
         << " (train.early_stopping_patience); the run ends after step " << step << " of " << total << "\n";
    return note.str();
}

void check_metric_is_evaluated(const BestModelSettings& settings, std::vector<std::string> evaluated,
                               const std::string& manifest_path) {
    // wall-clock seconds, which differ between ranks (and so would their choices of checkpoint)
    evaluated.erase(std::remove(evaluated.begin(), evaluated.end(), "eval_runtime"), evaluated.end());
    if (!settings.metric || std::find(evaluated.begin(), evaluated.end(), *settings.metric) != evaluated.end()) return;
    throw Error(ErrorKind::manifest, manifest_path + ": " + unknown_metric(*settings.metric, evaluated));
}

std::vector<int64_t> checkpoints_beyond_limit(std::vector<int64_t> steps, int64_t limit,
                                              std::optional<int64_t> best_checkpoint) {
    std::sort(steps.begin(), steps.end());
    if (int64_t(steps.size()) <= limit) return {};
    const auto best = best_checkpoint ? std::find(steps.begin(), steps.end(), *best_checkpoint) : steps.end();
    // the best moves to the second newest place, out of the oldest that go
    if (best != steps.end() && best + 2 < steps.end()) std::rotate(best, best + 1, steps.end() - 1);
    // a limit of 1 would delete the newest checkpoint, the one a resume needs, when it is not the best
    if (best_checkpoint && limit == 1 && steps.back() != *best_checkpoint) limit = 2;
    return {steps.begin(), steps.begin() + std::max<int64_t>(0, int64_t(steps.size()) - limit)};
}

}  // namespace grove
