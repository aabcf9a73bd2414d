#include "train/checkpoint.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <csignal>
#include <cstdlib>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "grove/distributed.hpp"
#include "grove/error.hpp"
#include "grove/hub_cache.hpp"
#include "grove/manifest.hpp"
#include "grove/optimizer.hpp"
#include "grove/safetensors.hpp"
#include "io/file_checksum.hpp"
#include "io/json_values.hpp"
#include "model/tensor_io.hpp"
#include "text/text_util.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace grove {

namespace {
// the run's settings, as Manifest::resolved_toml wrote them
constexpr const char* kResolvedManifestFile = "manifest.resolved.toml";
// the reference model, when sync_ref_model moves it
constexpr const char* kReferenceFile = "reference.safetensors";

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

json reward_columns_json(const std::vector<std::pair<std::string, double>>& columns) {
    json list = json::array();
    for (const auto& [name, weight] : columns) list.push_back({{"name", name}, {"weight", weight}});
    return list;
}

std::string reward_columns_text(const json& columns) {
    std::string text;
    for (const json& column : columns)
        if (column.is_object())
            text += (text.empty() ? "" : ", ") + column.value("name", std::string("?")) + ": " +
                    column.value("weight", json()).dump();
    return "[" + text + "]";
}

json progress_json(const TrainingProgress& p) {
    json st = {{"global_step", p.global_step},
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
    if (p.rollouts_bytes) st["rollouts_bytes"] = *p.rollouts_bytes;
    // transformers' names (its best_model_checkpoint, a folder, is added where the run's folder is known)
    st["best_metric"] = p.best.metric && std::isfinite(*p.best.metric) ? json(*p.best.metric) : json(nullptr);
    st["best_global_step"] = p.best.step ? json(*p.best.step) : json(nullptr);
    st["early_stopping_patience_counter"] = p.best.evaluations_without_improvement;
    return st;
}

// `p` holds what a checkpoint from before a field was added keeps (the entropy coefficient from the manifest).
TrainingProgress progress_from_json(const json& st, TrainingProgress p, const std::string& file) {
    auto count = [&](const char* key) { return json_integer(st.at(key), file + ": " + key, 0); };
    p.global_step = count("global_step");
    p.micro_step = count("micro_step");
    p.generation_index = count("generation_index");
    p.sampler.epoch = count("epoch");
    p.sampler.position = count("position");
    p.sampler.replay_position = st.contains("replay_position") ? size_t(count("replay_position")) : 0;
    p.num_tokens = count("num_tokens");
    p.generation_tokens =
        st.contains("generation_tokens") ? json_number(st["generation_tokens"], file + ": generation_tokens") : 0.0;
    if (st.contains("entropy_coef")) p.entropy.coef = json_number(st["entropy_coef"], file + ": entropy_coef");
    if (st.contains("last_world_entropy") && !st["last_world_entropy"].is_null())
        p.entropy.last_entropy = json_number(st["last_world_entropy"], file + ": last_world_entropy");
    p.rollouts_bytes.reset();  // a checkpoint without it (older, or no rollouts written) leaves the file as it is
    if (st.contains("rollouts_bytes")) p.rollouts_bytes = count("rollouts_bytes");
    p.best = {};
    if (st.contains("best_metric") && !st["best_metric"].is_null())
        p.best.metric = json_number(st["best_metric"], file + ": best_metric");
    if (st.contains("best_global_step") && !st["best_global_step"].is_null()) p.best.step = count("best_global_step");
    if (st.contains("early_stopping_patience_counter"))
        p.best.evaluations_without_improvement = count("early_stopping_patience_counter");
    if (st.contains("best_model_checkpoint") && st["best_model_checkpoint"].is_string())
        p.best.checkpoint = checkpoint_step(fs::path(st["best_model_checkpoint"].get<std::string>()).filename().string());
    return p;
}

// A tensor of a checkpoint's file, of the run's `shape`: another shape means another model or adapter.
at::Tensor saved_tensor(const SafetensorsFile& f, const std::string& name, at::IntArrayRef shape) {
    const TensorEntry* e = f.find(name);
    if (!e) throw Error(ErrorKind::input, f.path() + ": missing \"" + name + "\" (was the manifest changed?)");
    at::Tensor saved = tensor_from_entry(*e, f.path());
    if (saved.sizes() != shape)
        throw Error(ErrorKind::input, f.path() + ": \"" + name + "\" is " + shape_text(saved.sizes().vec()) +
                                          " but this run's tensor is " + shape_text(shape.vec()) +
                                          ": the checkpoint was written for another model or [adapter] (model.path or "
                                          "the adapter's config changed?); resume with the manifest it was written "
                                          "with, or start again with --overwrite");
    return saved;
}

// Every file of a checkpoint folder but trainer_state.json (which records them), by path relative to
// the folder.
std::set<std::string> checkpoint_files(const fs::path& folder) {
    std::set<std::string> files;
    for (const auto& entry : fs::recursive_directory_iterator(folder))
        if (entry.is_regular_file() && entry.path().filename() != "trainer_state.json")
            files.insert(fs::relative(entry.path(), folder).generic_string());
    return files;
}

// Each of them with its size and checksum.
json checksum_files(const fs::path& folder) {
    json files = json::object();
    for (const std::string& file : checkpoint_files(folder)) {
        const FileChecksum sum = file_checksum((folder / file).string());
        files[file] = {{"bytes", sum.bytes}, {"xxh3", sum.xxh3}};
    }
    return files;
}

// Each trained tensor's own optimizer step count; checkpoints written before Grove counted them
// per tensor had every tensor at optimizer_steps.
std::vector<int64_t> saved_tensor_steps(const json& st, const std::string& file, int64_t optimizer_steps, size_t tensors) {
    if (!st.contains("optimizer_tensor_steps")) return std::vector<int64_t>(tensors, optimizer_steps);
    std::vector<int64_t> steps =
        json_integers(st["optimizer_tensor_steps"], file + ": optimizer_tensor_steps", 0, optimizer_steps);
    if (steps.size() != tensors)
        throw Error(ErrorKind::input, file + ": optimizer_tensor_steps has " + std::to_string(steps.size()) +
                                          " counts, and this run trains " + std::to_string(tensors) + " tensors");
    return steps;
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

std::optional<int64_t> newest_resumable_step(const std::string& output, std::optional<int64_t> before) {
    std::optional<int64_t> newest;
    for (int64_t step : checkpoint_steps(output)) {
        if (before && step >= *before) break;
        std::ifstream in(fs::path(output) / checkpoint_name(step) / "trainer_state.json");
        const json st = json::parse(in, nullptr, false);
        // a damaged state is the resume's to report; only a model-only checkpoint is passed over
        if (!st.is_object() || !st.value("model_only", false)) newest = step;
    }
    return newest;
}

std::optional<std::string> latest_checkpoint(const std::string& output) {
    const std::optional<int64_t> step = newest_resumable_step(output);
    if (!step) return std::nullopt;
    return (fs::path(output) / checkpoint_name(*step)).string();
}

bool holds_run(const std::string& output) {
    return fs::exists(fs::path(output) / "metrics.jsonl") || fs::exists(fs::path(output) / "trainer_state.json") ||
           !checkpoint_steps(output).empty();
}

void prepare_output_folder(const std::string& output, bool clear) {
    try {
        if (clear) fs::remove_all(output);
        fs::create_directories(output);
        const std::string probe = (fs::path(output) / ".grove-write-check").string();
        write_file_atomically(probe, "grove checks that it can write here\n");
        fs::remove(probe);
    } catch (const std::exception& e) {
        throw Error(ErrorKind::runtime, "output.dir " + output + " is not writable (" + e.what() +
                                            "): fix its permissions or free space, or set output.dir to another folder");
    }
}

RunStart run_start(const std::string& output, const std::string& model_path, const std::optional<std::string>& resume,
                   bool overwrite, std::ostream* log) {
    const bool has_run = holds_run(output);
    if (has_run && !resume && !overwrite)
        throw Error(ErrorKind::usage, output +
                                          " already holds a run: pass --resume to continue it, --overwrite to "
                                          "replace it, or set output.dir to another folder");
    RunStart start{resume, has_run && overwrite && !resume};
    const fs::path folder = fs::weakly_canonical(output), model = fs::weakly_canonical(model_path);
    if (start.clear && std::mismatch(folder.begin(), folder.end(), model.begin(), model.end()).first == folder.end())
        throw Error(ErrorKind::usage, "--overwrite would delete " + output + ", which holds the model it trains (model.path " +
                                          model_path + "): set output.dir to another folder");
    if (start.resume_from != std::string("latest")) return start;
    const std::optional<int64_t> resumable = newest_resumable_step(output);
    const std::vector<int64_t> steps = checkpoint_steps(output);
    if (!resumable) {  // killed before its first checkpoint: the run resumes from its beginning
        if (log)
            *log << "grove: " << output
                 << (steps.empty() ? " has no checkpoint yet"
                                   : " has no checkpoint to resume from yet (its checkpoints hold only the model: "
                                     "output.save_only_model)")
                 << "; starting from step 0\n";
        start.resume_from.reset();
    } else if (steps.back() != *resumable && log) {
        *log << "grove: resuming from " << checkpoint_name(*resumable) << ", the newest checkpoint that holds what a resume "
             << "needs; " << checkpoint_name(steps.back()) << " holds only the model (output.save_only_model)\n";
    }
    return start;
}

bool checkpoint_due(const OutputSection& output, int64_t step, int64_t total, double steps_per_epoch, bool new_best) {
    return output.save.strategy == IntervalStrategy::best ? new_best : output.save.due(step, total, steps_per_epoch);
}

void seed_step_randomness(int64_t seed, int64_t step) {
    // splitmix64's mix, so that neighbouring steps (and seeds) get unrelated generator states
    uint64_t x = uint64_t(seed) * 0x9E3779B97F4A7C15ull + uint64_t(step) + 1;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    at::manual_seed(x ^ (x >> 31));
}

Manifest manifest_to_resume(const Manifest& manifest, const std::optional<std::string>& resume, std::ostream* log) {
    if (!resume) return manifest;
    const std::optional<std::string> checkpoint =
        *resume == "latest" ? latest_checkpoint(manifest.string("output.dir")) : std::optional<std::string>(*resume);
    if (!checkpoint) return manifest;
    std::ifstream in(fs::path(*checkpoint) / kResolvedManifestFile);
    if (!in) return manifest;
    std::stringstream saved;
    saved << in.rdbuf();
    const std::optional<std::string> started_on = Manifest::resolved_string(saved.str(), "model.path");
    const std::string now = manifest.string("model.path");
    if (!started_on || *started_on == now) return manifest;
    // the snapshot named by its path alone: it may have left the cache, or the cache may have moved
    const auto was = hub_model_named_by_path(*started_on), is = cached_hub_model_of(now);
    if (!was || !is || was->id != is->id || was->commit == is->commit)
        return manifest;  // not a moved revision: the settings warning names a changed path
    std::error_code error;
    if (!fs::is_directory(*started_on, error))
        throw Error(ErrorKind::input,
                    *checkpoint + " was trained on " + was->id + " at " + was->commit + ", whose snapshot (" + *started_on +
                        ") has left the Hugging Face cache, and the manifest's revision now names " + is->commit +
                        "; a resume there would go on from another base model. Put the snapshot back (`hf "
                        "download " +
                        was->id + " --revision " + was->commit + "`) and resume, or start a new run on the new revision");
    Manifest kept = manifest;
    kept.use_model_folder(*started_on);
    if (log)
        *log << "grove: note: resuming on " << was->id << " at " << was->commit << ", the snapshot " << *checkpoint
             << " was trained on; the manifest's revision now names " << is->commit << " (start a new run to train on it)\n";
    return kept;
}

void test_kill_point(const char* point, int64_t step) {
    static const char* wanted = std::getenv("GROVE_TEST_KILL_AT");
    if (!wanted) return;
    const std::string here = std::string(point) + ":" + std::to_string(step);
    const char* rank = std::getenv("RANK");  // set by `--nproc`; a single process is rank 0
    if (wanted == here || wanted == here + "@" + (rank ? rank : "0")) ::kill(::getpid(), SIGKILL);
}

namespace {
// "a/checkpoint-2/" as "a/checkpoint-2" ("checkpoint-2" as "./checkpoint-2"): its parent is then the
// output folder of the run that wrote it, which --resume DIR may name apart from this run's
fs::path normalized_folder(const std::string& folder) {
    fs::path p = fs::path(folder).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    return p.has_parent_path() ? p : fs::path(".") / p;
}
}  // namespace

std::string Checkpoints::start_again_advice(const fs::path& writer) const {
    std::error_code ignored;
    return fs::weakly_canonical(writer, ignored) == fs::weakly_canonical(output_, ignored) ? "start again with --overwrite"
                                                                                           : "start without --resume";
}

std::string Checkpoints::resume_advice(const std::string& damaged) const {
    const fs::path checkpoint = normalized_folder(damaged), writer = checkpoint.parent_path();
    const std::optional<int64_t> previous =
        newest_resumable_step(writer.string(), checkpoint_step(checkpoint.filename().string()));
    if (previous) return "resume from the previous checkpoint: --resume " + (writer / checkpoint_name(*previous)).string();
    return "no earlier checkpoint is left; " + start_again_advice(writer);
}

std::string Checkpoints::save(const CheckpointedState& state, bool inside_generation_batch, const std::string& manifest_path,
                              const std::function<void(const std::string&)>& export_model, std::optional<int64_t> keep_last,
                              bool model_only) {
    const std::string name = checkpoint_name(state.progress.global_step);
    if (state.progress.best.step == state.progress.global_step) state.progress.best.checkpoint = state.progress.global_step;
    try {
        return write(state, inside_generation_batch, manifest_path, export_model, keep_last, model_only);
    } catch (const std::exception& e) {  // a full disk, a folder made read-only: the earlier checkpoints are whole
        std::error_code ignored;
        fs::remove_all(fs::path(output_) / (".tmp-" + name), ignored);
        const std::optional<int64_t> whole = newest_resumable_step(output_);
        const std::string last = whole ? (fs::path(output_) / checkpoint_name(*whole)).string() : "";
        throw Error(ErrorKind::runtime,
                    "could not write " + (fs::path(output_) / name).string() + ": " + e.what() + ". " +
                        (whole ? "The last checkpoint, " + last +
                                     ", is whole: free space or fix the folder, then resume with --resume " + last
                               : std::string("No checkpoint was written yet: free space or fix the folder, then start "
                                             "again with --overwrite")));
    }
}

std::string Checkpoints::write(const CheckpointedState& state, bool inside_generation_batch, const std::string& manifest_path,
                               const std::function<void(const std::string&)>& export_model, std::optional<int64_t> keep_last,
                               bool model_only) {
    const TrainingProgress& progress = state.progress;
    const std::string name = checkpoint_name(progress.global_step);
    const fs::path final_dir = fs::path(output_) / name, tmp = fs::path(output_) / (".tmp-" + name);
    if (group_) group_->barrier();
    if (rank_ == 0) {
        fs::remove_all(tmp);
        fs::create_directories(tmp);
    }
    if (group_) group_->barrier();
    if (inside_generation_batch && !model_only)
        save_tensors((tmp / buffer_file_name(rank_)).string(), micro_batch_tensors(state.unused_micro_batches));
    if (!model_only) save_optimizer((tmp / "optimizer.safetensors").string(), state);
    test_kill_point("shards", progress.global_step);  // this rank's part written, nothing renamed
    if (group_) group_->barrier();
    if (rank_ != 0) {  // rank 0 writes the rest and renames; the others wait for it
        if (group_) group_->barrier();
        return final_dir.string();
    }
    const std::set<std::string> resume_files = checkpoint_files(tmp);
    export_model(tmp.string());
    json model_files = json::array();  // what users load, and load_best_model_at_end copies
    for (const std::string& file : checkpoint_files(tmp))
        if (!resume_files.count(file)) model_files.push_back(file);
    if (!resolved_manifest_.empty()) write_file_atomically((tmp / kResolvedManifestFile).string(), resolved_manifest_);
    if (!model_only) {
        std::vector<std::pair<std::string, at::Tensor>> trainable;
        for (size_t i = 0; i < state.trainable.size(); ++i) trainable.emplace_back("p" + std::to_string(i), state.trainable[i]);
        save_tensors((tmp / "trainable.safetensors").string(), trainable);
        if (state.reference_moves) save_tensors((tmp / kReferenceFile).string(), state.reference);
    }
    test_kill_point("save", progress.global_step);
    json st = progress_json(progress);
    if (progress.best.checkpoint)
        st["best_model_checkpoint"] = (fs::path(output_) / checkpoint_name(*progress.best.checkpoint)).string();
    st["optimizer_steps"] = state.optimizer.steps();
    st["optimizer_tensor_steps"] = state.optimizer.tensor_steps();
    st["optimizer"] = optimizer_name(state.optimizer.kind());
    st["world_size"] = world_size_;
    st["reward_columns"] = reward_columns_json(reward_columns_);
    st["manifest"] = manifest_path;
    st["model_files"] = model_files;
    if (model_only) st["model_only"] = true;
    st["files"] = checksum_files(tmp);  // written last: a checkpoint is whole when its state names every file
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
        // after a model-only checkpoint, the newest whole one stays too: the run can still be resumed
        const std::optional<int64_t> resumable = model_only ? newest_resumable_step(output_) : std::nullopt;
        for (int64_t step : checkpoints_beyond_limit(checkpoint_steps(output_), *keep_last, progress.best.checkpoint))
            if (step != resumable) fs::remove_all(fs::path(output_) / checkpoint_name(step));
    }
    if (group_) group_->barrier();
    return final_dir.string();
}

void Checkpoints::save_optimizer(const std::string& file, const CheckpointedState& state) const {
    if (state.owners.empty()) {
        if (rank_ == 0) save_tensors(file, state.optimizer.state());
        return;
    }
    // the file's tensors: the optimizer's state of every trained tensor, whoever keeps it
    std::vector<TensorBytes> layout;
    std::vector<std::pair<size_t, size_t>> slot_of;  // layout entry -> (tensor, slot)
    for (size_t i = 0; i < state.trainable.size(); ++i) {
        const std::vector<OptimizerSlot> slots = state.optimizer.slots(i);
        for (size_t k = 0; k < slots.size(); ++k) {
            const OptimizerSlot& slot = slots[k];
            layout.push_back({slot.name + "." + std::to_string(i), dtype_of(slot.dtype), slot.shape, nullptr,
                              size_t(c10::multiply_integers(slot.shape)) * c10::elementSize(slot.dtype)});
            slot_of.emplace_back(i, k);
        }
    }
    at::Tensor current;
    // entry e from its owner to every rank (all ranks call this in the file's order)
    auto receive = [&](size_t e) {
        const auto [i, k] = slot_of[e];
        const TensorBytes& entry = layout[e];
        std::vector<at::Tensor> buffer{
            state.optimizer.updates(i)
                ? state.optimizer.state_of(i)[k]
                : at::empty(entry.shape, state.trainable[i].options().dtype(state.optimizer.slots(i)[k].dtype))};
        group_->broadcast(buffer, state.owners[i]);
        current = buffer[0].detach().to(at::kCPU).contiguous();
        return static_cast<const void*>(current.data_ptr());
    };
    if (rank_ == 0) {
        write_safetensors(file, layout, {}, receive);  // one moment in host memory at a time
        return;
    }
    for (size_t k : storage_order(layout)) receive(k);  // the order in which rank 0 asks
}

void Checkpoints::verify_files(const std::string& dir, const json& files) const {
    if (!files.is_object()) throw Error(ErrorKind::input, dir + "/trainer_state.json: \"files\" is not an object");
    for (const auto& [name, expected] : files.items()) {
        const fs::path file = fs::path(dir) / name;
        if (!fs::is_regular_file(file))
            throw Error(ErrorKind::input, file.string() + " is missing: the checkpoint is incomplete");
        const FileChecksum sum = file_checksum(file.string());
        if (json_integer(expected.at("bytes"), dir + "/trainer_state.json: files." + name + ".bytes", 0) != int64_t(sum.bytes))
            throw Error(ErrorKind::input, file.string() + " has " + std::to_string(sum.bytes) + " bytes where " +
                                              expected.at("bytes").dump() + " were written: the file is truncated or damaged");
        if (expected.at("xxh3") != sum.xxh3)
            throw Error(ErrorKind::input, file.string() + " does not match the checksum written with it: the file is damaged");
    }
}

std::string Checkpoints::folder_of(const std::string& folder) const {
    if (folder != "latest") return folder;
    auto latest = latest_checkpoint(output_);
    if (!latest) throw Error(ErrorKind::usage, output_ + " has no checkpoint to resume from");
    return *latest;
}

std::vector<std::string> Checkpoints::changed_settings(const std::string& folder) const {
    const fs::path dir = folder_of(folder);
    std::ifstream in(dir / kResolvedManifestFile);
    if (!in) return {};
    std::stringstream saved;
    saved << in.rdbuf();
    std::vector<std::string> changes = Manifest::resolved_changes(saved.str(), resolved_manifest_);
    // a column a plugin adds (a TRL class that gained get_reward()) changes the advantages with no
    // manifest line to show it
    std::ifstream state_file(dir / "trainer_state.json");
    const json state = json::parse(state_file, nullptr, false);
    const json now = reward_columns_json(reward_columns_);
    if (state.is_object() && state.contains("reward_columns") && state["reward_columns"] != now)
        changes.push_back("reward columns (name: weight): " + reward_columns_text(state["reward_columns"]) + " -> " +
                          reward_columns_text(now));
    return changes;
}

void Checkpoints::warn_of_changed_settings(const std::string& folder, std::ostream* log) const {
    const std::vector<std::string> changes = changed_settings(folder);
    if (!log || changes.empty()) return;
    *log << "grove: warning: resuming " << folder_of(folder) << " with settings changed since it was written:";
    for (const std::string& change : changes) *log << "\n  " << change;
    *log << "\nThe run goes on with the new settings, so it is not the run the old ones would have made (train.max_steps, "
            "for one, shapes the learning-rate schedule).\n";
}

void Checkpoints::restore(const std::string& folder, CheckpointedState& state) const {
    const std::string dir = folder_of(folder);
    const fs::path state_file = fs::path(dir) / "trainer_state.json";
    std::ifstream in(state_file);
    if (!in)
        throw Error(ErrorKind::input, dir + ": not a checkpoint, or one whose writing was cut short (no trainer_state.json); " +
                                          resume_advice(dir));
    json st = json::parse(in, nullptr, false);
    TrainingProgress progress;
    progress.entropy.coef = state.progress.entropy.coef;
    int64_t optimizer_steps = 0;
    std::vector<int64_t> tensor_steps;
    int64_t saved_world = 1;
    std::string saved_optimizer = optimizer_name(OptimizerKind::adamw);  // checkpoints before train.optim: AdamW's
    try {
        if (st.is_discarded()) throw Error(ErrorKind::input, state_file.string() + " is not valid JSON (cut short or damaged)");
        if (!st.is_object()) throw Error(ErrorKind::input, state_file.string() + ": not a JSON object");
        progress = progress_from_json(st, progress, state_file.string());
        optimizer_steps = json_integer(st.at("optimizer_steps"), state_file.string() + ": optimizer_steps", 0);
        tensor_steps = saved_tensor_steps(st, state_file.string(), optimizer_steps, state.trainable.size());
        if (st.contains("world_size")) saved_world = json_integer(st["world_size"], state_file.string() + ": world_size", 1);
        if (st.contains("optimizer")) saved_optimizer = st["optimizer"].get<std::string>();
        if (st.contains("files")) verify_files(dir, st["files"]);
    } catch (const json::exception& e) {
        throw Error(ErrorKind::input, state_file.string() + ": " + e.what() + " (the file is damaged); " + resume_advice(dir));
    } catch (const Error& e) {
        throw Error(e.kind(), std::string(e.what()) + "; " + resume_advice(dir));
    }
    if (st.value("model_only", false)) {
        const fs::path writer = normalized_folder(dir).parent_path();
        const std::optional<int64_t> whole = newest_resumable_step(writer.string());
        throw Error(
            ErrorKind::usage,
            dir + " holds only the model (output.save_only_model = true), without the optimizer's state a resume needs; " +
                (whole ? "resume from the run's last whole checkpoint, --resume " + (writer / checkpoint_name(*whole)).string()
                       : start_again_advice(writer)) +
                (fs::exists(fs::path(dir) / "config.json")
                     ? ", or start a new run from its model (model.path = \"" + dir + "\")"
                     : std::string()));
    }
    if (saved_world != world_size_)
        throw Error(ErrorKind::usage, dir + " was written by " + std::to_string(saved_world) + " process(es); resume it with " +
                                          "the same number (this run has " + std::to_string(world_size_) + ")");
    if (saved_optimizer != optimizer_name(state.optimizer.kind()))
        throw Error(ErrorKind::usage, dir + " holds the state of the " + saved_optimizer + " optimizer (" +
                                          optimizer_settings_text(saved_optimizer) + "), and this run has " +
                                          optimizer_settings_text(optimizer_name(state.optimizer.kind())) +
                                          ": resume with the optimizer it was written with, or start again with --overwrite");
    SafetensorsFile weights((fs::path(dir) / "trainable.safetensors").string());
    SafetensorsFile optimizer((fs::path(dir) / "optimizer.safetensors").string());
    std::vector<std::vector<at::Tensor>> optimizer_state(state.trainable.size());
    {
        at::NoGradGuard no_grad;
        for (size_t i = 0; i < state.trainable.size(); ++i) {
            at::Tensor p = state.trainable[i];
            p.copy_(saved_tensor(weights, "p" + std::to_string(i), p.sizes()));
            if (!state.optimizer.updates(i)) continue;  // sharded: this rank's share only
            for (const OptimizerSlot& slot : state.optimizer.slots(i))
                optimizer_state[i].push_back(saved_tensor(optimizer, slot.name + "." + std::to_string(i), slot.shape));
        }
    }
    state.optimizer.restore(optimizer_steps, std::move(tensor_steps), optimizer_state);
    if (const fs::path file = fs::path(dir) / kReferenceFile; !state.reference.empty() && fs::exists(file)) {
        SafetensorsFile reference(file.string());
        at::NoGradGuard no_grad;
        for (auto& [name, tensor] : state.reference) tensor.copy_(saved_tensor(reference, name, tensor.sizes()));
        state.reference_restored = true;
    }
    const fs::path buffer_file = fs::path(dir) / buffer_file_name(rank_);
    state.unused_micro_batches.clear();
    if (fs::exists(buffer_file)) {
        state.unused_micro_batches = read_micro_batches(SafetensorsFile(buffer_file.string()));
    } else {  // at a generation boundary the next step generates anew
        progress.generation_tokens = 0;
    }
    state.progress = progress;
}

bool Checkpoints::write_best_model(const BestModelSettings& settings, const BestSoFar& best, std::ostream* log) const {
    if (!settings.load_at_end) return false;
    const std::string metric = settings.metric.value_or("eval_loss");
    if (!best.checkpoint) {
        if (log)
            *log << "grove: train.load_best_model_at_end: no checkpoint was written at a best-so-far evaluation of " << metric
                 << ", so the model is the last step's\n";
        return false;
    }
    const fs::path dir = fs::path(output_) / checkpoint_name(*best.checkpoint);
    try {
        std::ifstream in(dir / "trainer_state.json");
        const json st = json::parse(in, nullptr, false);  // a missing file is discarded too
        if (!st.is_object() || !st.contains("files") || !st.contains("model_files"))
            throw Error(ErrorKind::input, (dir / "trainer_state.json").string() + " is missing or damaged");
        verify_files(dir.string(), st["files"]);
        // every file copied beside its place first, then all renamed: a failed copy (a full disk)
        // leaves the folder's model as it was; only a failing rename could leave it mixed
        std::vector<std::pair<fs::path, fs::path>> copies;  // (partial, final)
        try {
            for (const json& file : st["model_files"]) {
                const fs::path to = fs::path(output_) / file.get<std::string>();
                copies.emplace_back(to.string() + ".tmp", to);
                fs::create_directories(to.parent_path());
                fs::copy_file(dir / file.get<std::string>(), copies.back().first, fs::copy_options::overwrite_existing);
            }
            for (const auto& [partial, to] : copies) fs::rename(partial, to);  // within one folder: no copying
        } catch (...) {
            std::error_code ignored;
            for (const auto& [partial, to] : copies) fs::remove(partial, ignored);
            throw;
        }
    } catch (const std::exception& e) {
        throw Error(ErrorKind::runtime, "train.load_best_model_at_end: could not copy the model of " + dir.string() + " into " +
                                            output_ + ": " + e.what() + "; the run's checkpoints are whole");
    }
    if (!log) return true;
    *log << "grove: train.load_best_model_at_end: the model written to " << output_ << " is "
         << checkpoint_name(*best.checkpoint) << "'s, ";
    if (best.step == best.checkpoint)
        *log << "whose " << metric << " " << best.metric.value_or(NAN) << " was the best\n";
    else  // save_steps a multiple of eval_steps leaves evaluations without a checkpoint, as in transformers
        *log << "the newest checkpoint written at a best-so-far evaluation; the best, " << metric << " "
             << best.metric.value_or(NAN) << " after step " << best.step.value_or(0) << ", has none\n";
    return true;
}

}  // namespace grove
