#include "train/run_log.hpp"

#include <ATen/ATen.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "grove/error.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace grove {

void drop_steps_after(const std::string& jsonl_file, int64_t step) {
    std::ifstream in(jsonl_file);
    if (!in) return;
    const std::string temporary = jsonl_file + ".tmp";
    {
        std::ofstream out(temporary, std::ios::trunc);
        for (std::string line; std::getline(in, line);) {
            const json row = json::parse(line, nullptr, false);
            if (row.is_discarded()) continue;  // a line cut short by a kill
            if (row.is_object() && row.contains("step") && row["step"].is_number_integer() && row["step"].get<int64_t>() > step)
                continue;
            out << line << "\n";  // lines without a step are kept
        }
    }
    fs::rename(temporary, jsonl_file);
}

RunLog::RunLog(const std::string& output_dir, bool open, std::optional<Resume> resume, Files files) {
    if (!open) return;
    const bool append = resume.has_value();
    if (append) {  // what the run logged after its checkpoint is logged again as it reruns those steps
        const int64_t step = resume->step;
        // a metrics line names the step it ended; a completions line, the steps done when it was generated
        drop_steps_after((fs::path(output_dir) / "metrics.jsonl").string(), step);
        drop_steps_after((fs::path(output_dir) / "completions.jsonl").string(), step - 1);
        const fs::path rollouts = fs::path(output_dir) / "rollouts.jsonl";
        std::error_code missing;
        const auto bytes = fs::file_size(rollouts, missing);
        if (!missing && resume->rollouts_bytes && uintmax_t(*resume->rollouts_bytes) < bytes)
            fs::resize_file(rollouts, uintmax_t(*resume->rollouts_bytes));
    }
    const std::ios::openmode mode = std::ios::out | (append ? std::ios::app : std::ios::trunc);
    auto open_log = [&](std::ofstream& stream, const char* name) {
        const fs::path path = fs::path(output_dir) / name;
        stream.open(path, mode);
        if (!stream) throw Error(ErrorKind::runtime, path.string() + ": cannot open for writing: " + std::strerror(errno));
    };
    open_log(metrics_, "metrics.jsonl");
    if (files.completions) open_log(completions_, "completions.jsonl");
    if (files.save_rollouts) {
        open_log(rollouts_, "rollouts.jsonl");
        rollouts_path_ = (fs::path(output_dir) / "rollouts.jsonl").string();
    }
    if (files.tensorboard)
        tensorboard_ = std::make_unique<TensorBoardWriter>((fs::path(output_dir) / "runs").string(),
                                                           resume ? std::optional<int64_t>(resume->step) : std::nullopt);
}

namespace {
// A log line that did not reach the disk (a full disk, a removed folder) stops the run: the
// metrics would otherwise end silently while training goes on.
void require_written(std::ofstream& stream, const char* name) {
    if (!stream.flush())
        throw Error(ErrorKind::runtime, std::string(name) + ": write failed (" + std::strerror(errno) +
                                            "); free space in output.dir, then resume with --resume");
}
}  // namespace

void RunLog::write_metrics(int64_t step, const std::map<std::string, double>& metrics) {
    if (!metrics_.is_open()) return;
    json line = {{"step", step}};
    for (const auto& [k, v] : metrics) line[k] = std::isfinite(v) ? json(v) : json(nullptr);
    metrics_ << line.dump() << "\n";
    require_written(metrics_, "metrics.jsonl");
    if (tensorboard_) tensorboard_->write_scalars(step, metrics);
}

void RunLog::write_completions(int64_t step, const Rollout& rollout, const ScoredBatch& scored, std::optional<int64_t> limit) {
    if (!completions_.is_open()) return;
    const std::vector<float> advantages = scored.local_advantages();
    const int64_t rows = std::min<int64_t>(scored.local_rows, limit.value_or(scored.local_rows));
    for (int64_t i = 0; i < rows; ++i) {
        json line = {{"step", step},
                     {"prompt", rollout.rows[size_t(i)].prompt_text},
                     {"completion", scored.local_completions[size_t(i)]},
                     {"advantage", advantages[size_t(i)]}};
        for (size_t k = 0; k < scored.reward_names.size(); ++k)
            line["rewards"][scored.reward_names[k]] = scored.local_reward(k, i);
        for (const auto& [column, values] : scored.local_extra)  // checked to be JSON when logged
            if (!values[size_t(i)].empty()) line["extra"][column] = json::parse(values[size_t(i)]);
        completions_ << line.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    }
    require_written(completions_, "completions.jsonl");
}

void RunLog::write_rollouts(const Rollout& rollout, const ScoredBatch& scored) {
    if (!rollouts_.is_open()) return;
    const GenerationResult& c = rollout.completions;
    for (size_t i = 0; i < rollout.rows.size(); ++i) {
        const int64_t length = c.lengths[i];
        json line = json::parse(rollout.rows[i].columns_json);
        line["prompt_ids"] = rollout.rows[i].prompt_ids;
        const int64_t* ids = c.completion_ids[int64_t(i)].data_ptr<int64_t>();
        line["completion_ids"] = std::vector<int64_t>(ids, ids + length);
        at::Tensor lp = c.sampled_logprobs[int64_t(i)].narrow(0, 0, length).contiguous();
        line["sampling_logprobs"] = std::vector<float>(lp.data_ptr<float>(), lp.data_ptr<float>() + length);
        if (rollout.model_token_mask.defined()) {  // multi-turn: which tokens the model wrote, as TRL's env_mask
            at::Tensor m = rollout.model_token_mask[int64_t(i)].narrow(0, 0, length).contiguous();
            line["env_mask"] = std::vector<int64_t>(m.data_ptr<int64_t>(), m.data_ptr<int64_t>() + length);
        }
        for (size_t k = 0; k < scored.reward_names.size(); ++k) {
            const float v = scored.local_reward(k, int64_t(i));
            line["rewards"][scored.reward_names[k]] = std::isnan(v) ? json(nullptr) : json(v);
        }
        rollouts_ << line.dump() << "\n";
    }
    require_written(rollouts_, "rollouts.jsonl");
}

std::optional<int64_t> RunLog::rollouts_bytes() {
    if (!rollouts_.is_open()) return std::nullopt;
    // the file's size, not tellp(): what a stream opened to append reports differs between libraries.
    // Nothing throws here (rank 0 alone asks, just before every rank meets to write the checkpoint):
    // unknown leaves the file as it is on resume, and a failed write stops the run at the next row.
    rollouts_.flush();
    std::error_code error;
    const auto bytes = fs::file_size(rollouts_path_, error);
    if (error) return std::nullopt;
    return int64_t(bytes);
}

}  // namespace grove
