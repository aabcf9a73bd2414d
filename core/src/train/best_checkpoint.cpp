#include "train/best_checkpoint.hpp"

#include <algorithm>
#include <limits>

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
    return "train.metric_for_best_model = \"" + metric.substr(5) + "\": the run's evaluation logs no " + metric +
           "; it logs " + metric_list(evaluated) + ": name one of those";
}
}  // namespace

bool record_evaluation(const BestModelSettings& settings, const std::map<std::string, double>& metrics, int64_t step,
                       BestSoFar& best) {
    if (!settings.metric) return false;
    const auto found = metrics.find(*settings.metric);
    if (found == metrics.end()) {
        std::vector<std::string> evaluated;
        for (const auto& [name, value] : metrics)
            if (name.rfind("eval_", 0) == 0) evaluated.push_back(name);
        throw Error(ErrorKind::manifest, unknown_metric(*settings.metric, evaluated));
    }
    const double worst = settings.greater_is_better ? -std::numeric_limits<double>::infinity()
                                                    : std::numeric_limits<double>::infinity();
    const double so_far = best.metric.value_or(worst), value = found->second;
    if (!(settings.greater_is_better ? value > so_far : value < so_far)) return false;  // NaN is never better
    best.metric = value;
    best.step = step;
    return true;
}

void check_metric_is_evaluated(const BestModelSettings& settings, const std::vector<std::string>& evaluated,
                               const std::string& manifest_path) {
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
