#include "train/checkpoint.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "grove/distributed.hpp"
#include "grove/error.hpp"
#include "grove/optimizer.hpp"
#include "grove/safetensors.hpp"
#include "model/tensor_io.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace grove {

namespace {
// a checkpoint's unused micro-batches, one file per rank (rank 0 keeps the single-process name)
std::string buffer_file_name(int rank) {
    return rank == 0 ? "buffer.safetensors" : "buffer.rank" + std::to_string(rank) + ".safetensors";
}

std::vector<std::pair<std::string, at::Tensor>> micro_batch_tensors(const std::vector<MicroBatch>& batches) {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (size_t b = 0; b < batches.size(); ++b) {
        const std::string p = "b" + std::to_string(b) + ".";
        const MicroBatch& mb = batches[b];
        out.emplace_back(p + "prompt_ids", mb.prompt_ids);
        out.emplace_back(p + "prompt_mask", mb.prompt_mask);
        out.emplace_back(p + "completion_ids", mb.completion_ids);
        out.emplace_back(p + "completion_mask", mb.completion_mask);
        out.emplace_back(p + "loss_mask", mb.loss_mask);
        out.emplace_back(p + "advantages", mb.advantages);
        if (mb.old_logps) out.emplace_back(p + "old_logps", *mb.old_logps);
        if (mb.ref_logps) out.emplace_back(p + "ref_logps", *mb.ref_logps);
        if (mb.sampling_logps) out.emplace_back(p + "sampling_logps", *mb.sampling_logps);
        if (mb.sampling_ratio) out.emplace_back(p + "sampling_ratio", *mb.sampling_ratio);
    }
    return out;
}

std::vector<MicroBatch> read_micro_batches(const SafetensorsFile& f) {
    std::vector<MicroBatch> out;
    for (int64_t b = 0;; ++b) {
        const std::string p = "b" + std::to_string(b) + ".";
        if (!f.find(p + "prompt_ids")) break;
        auto get = [&](const std::string& n) {
            const TensorEntry* e = f.find(p + n);
            if (!e) throw Error(ErrorKind::input, f.path() + ": missing \"" + p + n + "\"");
            return tensor_from_entry(*e, f.path());
        };
        at::Tensor completion_mask = get("completion_mask");
        // checkpoints from before multi-turn rows: the loss counted every completion token
        at::Tensor loss_mask = f.find(p + "loss_mask") ? get("loss_mask") : completion_mask;
        MicroBatch mb{get("prompt_ids"), get("prompt_mask"), get("completion_ids"),
                      completion_mask,   loss_mask,          get("advantages")};
        for (auto [name, field] :
             {std::pair{"old_logps", &mb.old_logps}, std::pair{"ref_logps", &mb.ref_logps},
              std::pair{"sampling_logps", &mb.sampling_logps}, std::pair{"sampling_ratio", &mb.sampling_ratio}})
            if (f.find(p + name)) *field = get(name);
        out.push_back(std::move(mb));
    }
    return out;
}

json progress_json(const TrainingProgress& p) {
    return {{"global_step", p.global_step},
            {"micro_step", p.micro_step},
            {"generation_index", p.generation_index},
            {"epoch", p.sampler.epoch},
            {"position", p.sampler.position},
            {"replay_position", p.sampler.replay_position},
            {"num_tokens", p.num_tokens},
            {"generation_tokens", p.generation_tokens},
            {"entropy_coef", p.entropy.coef},
            // JSON has no infinity: null = no entropy measured yet
            {"last_world_entropy", std::isfinite(p.entropy.last_entropy) ? json(p.entropy.last_entropy) : json(nullptr)}};
}

// `p` holds what a checkpoint from before a field was added keeps (the entropy coefficient from the manifest).
TrainingProgress progress_from_json(const json& st, TrainingProgress p) {
    p.global_step = st.at("global_step");
    p.micro_step = st.at("micro_step");
    p.generation_index = st.at("generation_index");
    p.sampler.epoch = st.at("epoch");
    p.sampler.position = st.at("position");
    p.sampler.replay_position = st.value("replay_position", size_t(0));
    p.num_tokens = st.at("num_tokens");
    p.generation_tokens = st.value("generation_tokens", 0.0);
    p.entropy.coef = st.value("entropy_coef", p.entropy.coef);
    if (st.contains("last_world_entropy") && !st["last_world_entropy"].is_null())
        p.entropy.last_entropy = st["last_world_entropy"].get<double>();
    return p;
}
}  // namespace

std::string checkpoint_name(int64_t step) { return "checkpoint-" + std::to_string(step); }

std::optional<int64_t> checkpoint_step(const std::string& name) {
    const std::string prefix = "checkpoint-";
    if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return std::nullopt;
    const std::string digits = name.substr(prefix.size());
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) || digits.size() > 18)
        return std::nullopt;
    return std::stoll(digits);
}

namespace {
std::vector<int64_t> checkpoint_steps(const std::string& output) {
    std::vector<int64_t> steps;
    if (!fs::is_directory(output)) return steps;
    for (const auto& e : fs::directory_iterator(output))
        if (auto step = checkpoint_step(e.path().filename().string()); step && e.is_directory()) steps.push_back(*step);
    std::sort(steps.begin(), steps.end());
    return steps;
}
}  // namespace

std::optional<std::string> latest_checkpoint(const std::string& output) {
    auto steps = checkpoint_steps(output);
    if (steps.empty()) return std::nullopt;
    return (fs::path(output) / checkpoint_name(steps.back())).string();
}

bool holds_run(const std::string& output) {
    return fs::exists(fs::path(output) / "metrics.jsonl") || fs::exists(fs::path(output) / "trainer_state.json") ||
           !checkpoint_steps(output).empty();
}

std::string Checkpoints::save(const CheckpointedState& state, bool inside_generation_batch, const std::string& manifest_path,
                              const std::function<void(const std::string&)>& export_model, std::optional<int64_t> keep_last) {
    const TrainingProgress& progress = state.progress;
    const std::string name = checkpoint_name(progress.global_step);
    const fs::path final_dir = fs::path(output_) / name, tmp = fs::path(output_) / (".tmp-" + name);
    if (group_) group_->barrier();
    if (rank_ == 0) {
        fs::remove_all(tmp);
        fs::create_directories(tmp);
    }
    if (group_) group_->barrier();
    if (inside_generation_batch)
        save_tensors((tmp / buffer_file_name(rank_)).string(), micro_batch_tensors(state.unused_micro_batches));
    if (group_) group_->barrier();
    if (rank_ != 0) {  // rank 0 writes the rest and renames; the others wait for it
        if (group_) group_->barrier();
        return final_dir.string();
    }
    export_model(tmp.string());
    std::vector<std::pair<std::string, at::Tensor>> trainable;
    for (size_t i = 0; i < state.trainable.size(); ++i) trainable.emplace_back("p" + std::to_string(i), state.trainable[i]);
    save_tensors((tmp / "trainable.safetensors").string(), trainable);
    save_tensors((tmp / "optimizer.safetensors").string(), state.optimizer.state());
    json st = progress_json(progress);
    st["optimizer_steps"] = state.optimizer.steps();
    st["world_size"] = world_size_;
    st["manifest"] = manifest_path;
    write_file_atomically((tmp / "trainer_state.json").string(), st.dump(2) + "\n");
    fs::remove_all(final_dir);
    fs::rename(tmp, final_dir);  // atomic: a crash leaves the previous checkpoints and a .tmp folder
    // <output>/latest names the checkpoint written last, so scripts need not know the step count;
    // a relative link survives moving the run folder, and rename() swaps it atomically
    const fs::path link = fs::path(output_) / "latest", tmp_link = fs::path(output_) / ".tmp-latest";
    fs::remove(tmp_link);
    fs::create_directory_symlink(name, tmp_link);
    fs::rename(tmp_link, link);
    if (keep_last) {
        auto steps = checkpoint_steps(output_);
        for (size_t i = 0; i + size_t(*keep_last) < steps.size(); ++i)
            fs::remove_all(fs::path(output_) / checkpoint_name(steps[i]));
    }
    if (group_) group_->barrier();
    return final_dir.string();
}

void Checkpoints::restore(const std::string& folder, CheckpointedState& state) const {
    std::string dir = folder;
    if (dir == "latest") {
        auto latest = latest_checkpoint(output_);
        if (!latest) throw Error(ErrorKind::usage, output_ + " has no checkpoint to resume from");
        dir = *latest;
    }
    const fs::path state_file = fs::path(dir) / "trainer_state.json";
    std::ifstream in(state_file);
    if (!in) throw Error(ErrorKind::input, dir + ": not a checkpoint (no trainer_state.json)");
    json st = json::parse(in, nullptr, false);
    TrainingProgress progress;
    progress.entropy.coef = state.progress.entropy.coef;
    int64_t optimizer_steps = 0;
    int saved_world = 1;
    try {
        if (st.is_discarded() || !st.is_object()) throw Error(ErrorKind::input, state_file.string() + ": not a JSON object");
        progress = progress_from_json(st, progress);
        optimizer_steps = st.at("optimizer_steps");
        saved_world = st.value("world_size", 1);
    } catch (const json::exception& e) {
        throw Error(ErrorKind::input,
                    state_file.string() + ": " + e.what() + " (the file is damaged; resume from another checkpoint)");
    }
    if (saved_world != world_size_)
        throw Error(ErrorKind::usage, dir + " was written by " + std::to_string(saved_world) + " process(es); resume it with " +
                                          "the same number (this run has " + std::to_string(world_size_) + ")");
    SafetensorsFile weights((fs::path(dir) / "trainable.safetensors").string());
    SafetensorsFile optimizer((fs::path(dir) / "optimizer.safetensors").string());
    auto load = [&](const SafetensorsFile& f, const std::string& name) {
        const TensorEntry* e = f.find(name);
        if (!e) throw Error(ErrorKind::input, f.path() + ": missing \"" + name + "\" (was the manifest changed?)");
        return tensor_from_entry(*e, f.path());
    };
    std::vector<at::Tensor> exp_avg, exp_avg_sq;
    {
        at::NoGradGuard no_grad;
        for (size_t i = 0; i < state.trainable.size(); ++i) {
            at::Tensor p = state.trainable[i];
            p.copy_(load(weights, "p" + std::to_string(i)));
            exp_avg.push_back(load(optimizer, "exp_avg." + std::to_string(i)));
            exp_avg_sq.push_back(load(optimizer, "exp_avg_sq." + std::to_string(i)));
        }
    }
    state.optimizer.restore(optimizer_steps, exp_avg, exp_avg_sq);
    const fs::path buffer_file = fs::path(dir) / buffer_file_name(rank_);
    state.unused_micro_batches.clear();
    if (fs::exists(buffer_file)) {
        state.unused_micro_batches = read_micro_batches(SafetensorsFile(buffer_file.string()));
    } else {  // at a generation boundary the next step generates anew
        progress.generation_tokens = 0;
    }
    state.progress = progress;
}

}  // namespace grove
