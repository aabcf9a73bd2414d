#include "grove/trainer.hpp"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "grove/adapter_host.hpp"
#include "grove/advantages.hpp"
#include "grove/dataset.hpp"
#include "grove/distributed.hpp"
#include "grove/error.hpp"
#include "grove/generation.hpp"
#include "grove/manifest.hpp"
#include "grove/model.hpp"
#include "grove/optimizer.hpp"
#include "grove/plugin_host.hpp"
#include "grove/policy_loss.hpp"
#include "grove/safetensors.hpp"
#include "model/tensor_io.hpp"
#include "text/text_util.hpp"
#include "grove/tokenizer.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace grove {

namespace {

volatile std::sig_atomic_t g_stop_requested = 0;
extern "C" void request_stop(int) { g_stop_requested = 1; }

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// a checkpoint's unused micro-batches, one file per rank (rank 0 keeps the single-process name)
std::string buffer_file_name(int rank) {
    return rank == 0 ? "buffer.safetensors" : "buffer.rank" + std::to_string(rank) + ".safetensors";
}

// bfloat16 autocast on one device type for the scope's life (TRL's bf16 = True): matrix products
// run in bf16 while weights, gradients and optimizer state keep their dtype. No-op without a device.
class AutocastScope {
public:
    explicit AutocastScope(std::optional<at::DeviceType> device) : device_(device) {
        if (!device_) return;
        was_enabled_ = at::autocast::is_autocast_enabled(*device_);
        previous_dtype_ = at::autocast::get_autocast_dtype(*device_);
        at::autocast::set_autocast_enabled(*device_, true);
        at::autocast::set_autocast_dtype(*device_, at::kBFloat16);
        at::autocast::increment_nesting();
    }
    ~AutocastScope() {
        if (!device_) return;
        if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();  // cached bf16 weight casts
        at::autocast::set_autocast_enabled(*device_, was_enabled_);
        at::autocast::set_autocast_dtype(*device_, previous_dtype_);
    }
    AutocastScope(const AutocastScope&) = delete;
    AutocastScope& operator=(const AutocastScope&) = delete;

private:
    std::optional<at::DeviceType> device_;
    bool was_enabled_ = false;
    at::ScalarType previous_dtype_ = at::kBFloat16;
};

// One micro-batch of a generation batch, ready for the loss.
struct MicroBatch {
    at::Tensor prompt_ids, prompt_mask, completion_ids, completion_mask, advantages;
    std::optional<at::Tensor> old_logps, ref_logps;
};

}  // namespace

struct Trainer::State {
    State(const Manifest& m, const TrainerOptions& o) : manifest(m), options(o) {}
    // the model's adapted layers call into the adapter plugin when they are destroyed: model first
    ~State() {
        model.reset();
        reference.reset();
    }
    Manifest manifest;
    TrainerOptions options;
    std::unique_ptr<Model> model, reference;  // reference only for beta > 0 with the full adapter
    std::unique_ptr<Tokenizer> tokenizer;
    ChatTemplate chat = ChatTemplate::plain;
    std::unique_ptr<PluginHost> host;
    std::vector<PluginInstance> rewards;
    std::vector<std::string> reward_names;
    std::vector<double> reward_weights;
    std::unique_ptr<PluginInstance> adapter, reduction;
    std::unique_ptr<AdapterHost> adapter_host;
    bool lora = false;
    std::optional<at::DeviceType> autocast_device;  // train.mixed_precision resolved: bf16 autocast here

    std::vector<PromptRow> rows;
    std::vector<std::vector<int64_t>> prompt_tokens;  // per row, tokenized once
    std::vector<std::string> prompt_texts;

    // [rollouts] path: rows generated elsewhere, replayed in file order instead of generating
    struct ReplayRow {
        std::vector<int64_t> prompt_ids, completion_ids;
        std::vector<float> sampling_logprobs;  // empty when not given
        std::map<std::string, double> rewards;  // given values (NaN for null) replace the plugin's
        std::string prompt_text, columns_json;
    };
    std::vector<ReplayRow> replay;
    size_t replay_position = 0;
    std::ofstream rollouts_file;
    void load_replay(const std::string& path);

    // batching (reference §3)
    int64_t G = 8, batch = 8, accumulation = 1, steps_per_generation = 1, iterations = 1, generation_batch = 8;
    int64_t total = 0, warmup = 0;

    // sampler: epoch permutation and position; seeded per epoch so resume needs only (epoch, position)
    int64_t epoch = 0, position = 0;
    std::vector<int64_t> permutation;

    std::vector<at::Tensor> params;  // trainable tensors, in optimizer order
    std::unique_ptr<AdamW> optimizer;

    int64_t micro_step = 0, global_step = 0, generation_index = 0, num_tokens = 0;
    std::vector<MicroBatch> buffer;
    double generation_tokens = 0;
    std::map<std::string, double> generation_metrics;
    double generate_seconds = 0, reward_seconds = 0;

    std::string output;
    std::ofstream metrics_file, completions_file;

    void load();
    void fill_permutation() {
        at::Generator g = at::detail::createCPUGenerator(uint64_t(manifest.integer("train.seed")) * 1000003ull + uint64_t(epoch));
        at::Tensor p = manifest.boolean("data.shuffle") ? at::randperm(int64_t(rows.size()), g, at::kLong)
                                                       : at::arange(int64_t(rows.size()), at::kLong);
        permutation.assign(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
    }
    std::vector<int64_t> next_prompts(int64_t count) {
        // TRL's RepeatSampler drops an incomplete last chunk of prompts
        std::vector<int64_t> out;
        if (position + count > int64_t(rows.size())) {
            ++epoch;
            position = 0;
            fill_permutation();
        }
        for (int64_t i = 0; i < count; ++i) out.push_back(permutation[size_t(position + i)]);
        position += count;
        return out;
    }
    void generate_buffer();
    at::Tensor logps_no_grad(Model& m, const MicroBatch& b);
};

// ---------------------------------------------------------------------------------------------
void Trainer::State::load() {
    const Manifest& m = manifest;
    if (options.world_size > 1 && (!options.group || options.group->world_size() != options.world_size))
        throw Error(ErrorKind::usage, "world size " + std::to_string(options.world_size) + " needs its process group "
                                      "(launch with `grove train --nproc N` or torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)");
    if (options.world_size > 1 && m.boolean("logging.save_rollouts"))
        throw Error(ErrorKind::manifest, m.path() + ": logging.save_rollouts writes one file from one process; with " +
                                             std::to_string(options.world_size) + " processes set it to false (or train with one)");
    G = m.integer("generation.num_generations");
    batch = m.integer("train.per_device_train_batch_size");
    accumulation = m.integer("train.gradient_accumulation_steps");
    steps_per_generation = m.integer("train.steps_per_generation");
    generation_batch = m.integer("train.generation_batch_size");
    iterations = m.integer("loss.num_iterations");
    if (steps_per_generation % accumulation != 0 && accumulation % steps_per_generation != 0)
        throw Error(ErrorKind::manifest, m.path() + ": train.steps_per_generation (" + std::to_string(steps_per_generation) +
                                             ") and train.gradient_accumulation_steps (" + std::to_string(accumulation) +
                                             ") must divide one another, so optimizer steps line up with generation batches");

    model = Model::load(m.string("model.path"), m.string("model.device"), m.string("model.dtype"));
    model->set_gradient_checkpointing(m.boolean("model.gradient_checkpointing"));  // the training forward only
    std::string precision = m.string("train.mixed_precision");
    if (precision == "bf16" || (precision == "auto" && model->device().is_cuda())) autocast_device = model->device().type();
    tokenizer = Tokenizer::load(m.string("model.path"));
    chat = chat_template_from_name(m.string("model.chat_template"), tokenizer->config());

    host = std::make_unique<PluginHost>(plugin_search_path(m.strings("plugin_dirs")));
    for (const auto& use : m.rewards()) {
        auto info = host->find(use.plugin, GROVE_PLUGIN_KIND_REWARD);
        rewards.emplace_back(info, PluginConfig(info, use.config.get(), use.origin + " config"));
        reward_names.push_back(use.name);
        reward_weights.push_back(use.weight);
    }
    {
        auto info = host->find(m.adapter().plugin, GROVE_PLUGIN_KIND_ADAPTER);
        adapter = std::make_unique<PluginInstance>(info, PluginConfig(info, m.adapter().config.get(), m.adapter().origin + " config"));
        info = host->find(m.reduction().plugin, GROVE_PLUGIN_KIND_REDUCTION);
        reduction = std::make_unique<PluginInstance>(info, PluginConfig(info, m.reduction().config.get(), m.reduction().origin + " config"));
    }
    at::manual_seed(uint64_t(m.integer("train.seed")));  // adapter initialisation
    adapter_host = std::make_unique<AdapterHost>(*adapter);
    bool full = adapter_host->trains_base_weights();
    model->set_base_trainable(full);
    if (!full) {
        model->attach_adapter(*adapter_host);
        lora = true;
    }
    // beta = 0 loads no reference model at all (the second source note); LoRA uses the base model
    if (m.number("loss.beta") != 0.0 && full) reference = Model::load(m.string("model.path"), m.string("model.device"), m.string("model.dtype"));

    params = model->trainable_parameters();
    AdamWOptions ao;
    ao.beta1 = m.number("train.adam_beta1");
    ao.beta2 = m.number("train.adam_beta2");
    ao.epsilon = m.number("train.adam_epsilon");
    ao.weight_decay = m.number("train.weight_decay");
    optimizer = std::make_unique<AdamW>(params, ao);
    if (options.group) {  // every rank starts from rank 0's trainable weights
        at::NoGradGuard no_grad;
        std::vector<at::Tensor> shared = params;
        options.group->broadcast(shared);
    }
    if (params.empty())
        throw Error(ErrorKind::plugin, "the adapter '" + adapter->info().name + "' left no trainable parameter: check its "
                                       "target_modules against the model's layer names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");

    if (auto path = m.optional_string("rollouts.path")) load_replay(*path);
    else rows = load_prompts(m.string("data.source"), m.string("data.prompt_column"));
    for (const auto& row : rows) {
        std::string text = prompt_text(row, chat, tokenizer->config());
        prompt_texts.push_back(text);
        prompt_tokens.push_back(tokenizer->encode(text, false));  // as TRL: templates carry their own specials
        if (prompt_tokens.back().empty()) throw Error(ErrorKind::input, row.origin + ": the prompt encodes to no tokens");
    }
    int64_t prompts_per_generation = generation_batch / G;
    if (!replay.empty()) {  // epochs count passes over the replayed groups
        for (size_t i = 0; i < replay.size(); i += size_t(G)) {
            PromptRow row;
            row.text = replay[i].prompt_text;
            rows.push_back(row);
        }
    }
    if (int64_t(rows.size()) < prompts_per_generation)
        throw Error(ErrorKind::input, m.string("data.source") + ": " + std::to_string(rows.size()) +
                                          " prompts, but one generation batch needs " + std::to_string(prompts_per_generation));
    int64_t micro_steps_per_epoch = int64_t(rows.size()) / prompts_per_generation * steps_per_generation * iterations;
    int64_t max_steps = m.integer("train.max_steps");
    total = max_steps > 0 ? max_steps
                          : int64_t(std::ceil(m.number("train.num_train_epochs") * double(micro_steps_per_epoch) / double(accumulation)));
    int64_t warmup_steps = m.integer("train.warmup_steps");
    warmup = warmup_steps > 0 ? warmup_steps : int64_t(std::ceil(m.number("train.warmup_ratio") * double(total)));
    fill_permutation();
}

void Trainer::State::load_replay(const std::string& path) {
    std::vector<std::string> origin;
    for_each_jsonl(path, "the rollouts (rollouts.path)", [&](json& j, const std::string& where) {
        ReplayRow r;
        try {
            if (j.contains("prompt_ids")) {
                r.prompt_ids = j["prompt_ids"].get<std::vector<int64_t>>();
                r.prompt_text = tokenizer->decode(r.prompt_ids, false);
            } else if (j.contains("prompt") && j["prompt"].is_string()) {
                r.prompt_text = j["prompt"];
                r.prompt_ids = tokenizer->encode(r.prompt_text, false);
            } else {
                throw Error(ErrorKind::input, where + ": a rollout needs \"prompt_ids\" or a text \"prompt\"");
            }
            if (!j.contains("completion_ids")) throw Error(ErrorKind::input, where + ": a rollout needs \"completion_ids\"");
            r.completion_ids = j["completion_ids"].get<std::vector<int64_t>>();
            if (j.contains("sampling_logprobs")) {
                r.sampling_logprobs = j["sampling_logprobs"].get<std::vector<float>>();
                if (r.sampling_logprobs.size() != r.completion_ids.size())
                    throw Error(ErrorKind::input, where + ": sampling_logprobs has " + std::to_string(r.sampling_logprobs.size()) +
                                                      " values for " + std::to_string(r.completion_ids.size()) + " completion tokens");
            }
            if (j.contains("rewards")) {
                for (const auto& [name, value] : j["rewards"].items()) {
                    if (std::find(reward_names.begin(), reward_names.end(), name) == reward_names.end())
                        throw Error(ErrorKind::input, where + ": reward \"" + name + "\" is not one of the manifest's rewards (" +
                                                          join(reward_names, ", ") + ")");
                    r.rewards[name] = value.is_null() ? std::nan("") : value.get<double>();
                }
            }
        } catch (const json::exception& e) {
            throw Error(ErrorKind::input, where + ": " + e.what());
        }
        for (int64_t id : r.prompt_ids)
            if (id < 0 || id >= model->config().vocab_size) throw Error(ErrorKind::input, where + ": prompt token id " + std::to_string(id) + " is outside the vocabulary");
        for (int64_t id : r.completion_ids)
            if (id < 0 || id >= model->config().vocab_size) throw Error(ErrorKind::input, where + ": completion token id " + std::to_string(id) + " is outside the vocabulary");
        if (r.prompt_ids.empty()) throw Error(ErrorKind::input, where + ": empty prompt");
        for (const char* key : {"prompt_ids", "prompt", "completion_ids", "sampling_logprobs", "rewards"}) j.erase(key);
        r.columns_json = j.dump();
        replay.push_back(std::move(r));
        origin.push_back(where);
    });
    if (replay.empty() || replay.size() % size_t(G) != 0)
        throw Error(ErrorKind::input, path + ": " + std::to_string(replay.size()) + " rollouts do not form whole groups of num_generations = " +
                                          std::to_string(G));
    for (size_t i = 0; i < replay.size(); ++i)
        if (replay[i].prompt_ids != replay[i - i % size_t(G)].prompt_ids)
            throw Error(ErrorKind::input, origin[i] + ": this row's prompt differs from its group's first row (" + origin[i - i % size_t(G)] +
                                              "); rows must come in consecutive groups of " + std::to_string(G) + " with the same prompt");
}

at::Tensor Trainer::State::logps_no_grad(Model& m, const MicroBatch& b) {
    at::NoGradGuard no_grad;
    return completion_logprobs(m, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask,
                               manifest.number("generation.temperature"));
}

void Trainer::State::generate_buffer() {
    const Manifest& m = manifest;
    auto t0 = Clock::now();
    AutocastScope autocast(autocast_device);  // sampling and old/reference log-probs, as TRL's accelerate wraps forward
    std::vector<std::vector<int64_t>> prompts;
    std::vector<std::string> row_prompt_text, row_columns;
    std::vector<const ReplayRow*> replayed;
    SamplingOptions o = sampling_options(m);
    set_stop_tokens(o, *model, tokenizer->config());
    // each rank samples its own slice with its own stream (rank 0 keeps the single-process seed)
    o.seed = uint64_t(m.integer("train.seed")) * 7919ull + uint64_t(generation_index) + uint64_t(options.rank) * 0x9E3779B97F4A7C15ull;
    GenerationResult result;
    adapter_host->set_training(false);  // no adapter dropout while sampling or computing old/reference log-probs
    // the global generation batch, the same on every rank (the sampler is seeded alike) ...
    if (replay.empty()) {
        for (int64_t index : next_prompts(generation_batch / G))
            for (int64_t j = 0; j < G; ++j) {  // each prompt G times, consecutively (group-major)
                prompts.push_back(prompt_tokens[size_t(index)]);
                row_prompt_text.push_back(prompt_texts[size_t(index)]);
                row_columns.push_back(rows[size_t(index)].columns_json);
            }
    } else {  // whole groups in file order
        for (int64_t i = 0; i < generation_batch; ++i) {
            if (replay_position >= replay.size()) {
                replay_position = 0;
                ++epoch;
            }
            const ReplayRow& r = replay[replay_position++];
            replayed.push_back(&r);
            prompts.push_back(r.prompt_ids);
            row_prompt_text.push_back(r.prompt_text);
            row_columns.push_back(r.columns_json);
        }
        position = int64_t(replay_position / size_t(G));
    }
    // ... of which this rank takes rows [rank * n, (rank + 1) * n), as accelerate shards TRL's (groups may span ranks)
    const int64_t local_rows = generation_batch / options.world_size, first_row = int64_t(options.rank) * local_rows;
    auto keep_local = [&](auto& v) {
        v = std::remove_reference_t<decltype(v)>(v.begin() + first_row, v.begin() + first_row + local_rows);
    };
    keep_local(prompts);
    keep_local(row_prompt_text);
    keep_local(row_columns);
    if (!replayed.empty()) keep_local(replayed);
    if (replayed.empty()) {
        result = generate(*model, prompts, o);
    } else {
        // a replayed completion ends at its first EOS id (kept), as generated ones do
        std::set<int64_t> eos(o.eos_token_ids.begin(), o.eos_token_ids.end());
        int64_t width = 1;
        for (const ReplayRow* r : replayed) width = std::max<int64_t>(width, int64_t(r->completion_ids.size()));
        result.completion_ids = at::full({local_rows, width}, o.pad_token_id, at::kLong);
        result.sampled_logprobs = at::zeros({local_rows, width}, at::kFloat);
        result.truncated = at::zeros({local_rows}, at::kBool);
        for (int64_t i = 0; i < local_rows; ++i) {
            const ReplayRow& r = *replayed[size_t(i)];
            int64_t length = int64_t(r.completion_ids.size());
            for (int64_t t = 0; t < int64_t(r.completion_ids.size()); ++t)
                if (eos.count(r.completion_ids[size_t(t)])) {
                    length = t + 1;
                    break;
                }
            if (length > 0) result.completion_ids[i].narrow(0, 0, length).copy_(at::tensor(std::vector<int64_t>(r.completion_ids.begin(), r.completion_ids.begin() + length), at::kLong));
            bool ended = length > 0 && eos.count(r.completion_ids[size_t(length - 1)]);
            result.truncated[i] = !ended;
            result.lengths.push_back(length);
        }
        result.completion_mask = (at::arange(width, at::kLong).unsqueeze(0) <
                                  at::tensor(result.lengths, at::kLong).unsqueeze(1)).to(at::kLong);
    }
    generate_seconds += seconds_since(t0);

    auto t1 = Clock::now();
    const int64_t N = int64_t(prompts.size());
    RewardRows batch_rows;
    batch_rows.num_generations = uint32_t(G);
    batch_rows.step = global_step;
    batch_rows.seed = o.seed;
    batch_rows.rank = uint32_t(options.rank);
    batch_rows.world_size = uint32_t(options.world_size);
    for (int64_t i = 0; i < N; ++i) {
        int64_t length = result.lengths[size_t(i)];
        std::vector<int64_t> ids(result.completion_ids[i].data_ptr<int64_t>(), result.completion_ids[i].data_ptr<int64_t>() + length);
        batch_rows.add(row_prompt_text[size_t(i)], tokenizer->decode(ids, true), std::vector<int32_t>(ids.begin(), ids.end()),
                       result.truncated[i].item<bool>(), row_columns[size_t(i)]);
    }
    const grove_reward_batch& rb = batch_rows.view();
    const std::vector<std::string>& completions = batch_rows.completions;
    const std::vector<std::string>& row_texts = batch_rows.prompts;
    const int K = int(rewards.size());
    std::vector<float> R(size_t(N) * K);
    std::vector<std::string> metric_names;
    std::vector<std::vector<double>> metric_columns;  // reward plugins' per-row metrics
    for (int k = 0; k < K; ++k) {
        const std::string& name = reward_names[size_t(k)];
        bool all_given = !replayed.empty() && std::all_of(replayed.begin(), replayed.end(),
                                                          [&](const ReplayRow* r) { return r->rewards.count(name) > 0; });
        std::vector<float> scores(static_cast<size_t>(N), 0.0f), metrics;
        if (!all_given) rewards[size_t(k)].score(rb, scores, metrics);  // replayed rows may bring their own values
        for (int64_t i = 0; i < N; ++i) {
            R[size_t(i) * K + k] = scores[size_t(i)];
            if (!replayed.empty() && replayed[size_t(i)]->rewards.count(name))
                R[size_t(i) * K + k] = float(replayed[size_t(i)]->rewards.at(name));
        }
        const auto& names = rewards[size_t(k)].info().metric_names;
        for (size_t mi = 0; mi < names.size() && !metrics.empty(); ++mi) {
            metric_names.push_back("rewards/" + reward_names[size_t(k)] + "/" + names[mi]);
            metric_columns.emplace_back(metrics.begin() + mi * N, metrics.begin() + (mi + 1) * N);
        }
    }
    // Every rank's rows: rewards, reward metrics, lengths, flags. Advantages and batch statistics are
    // computed on the whole generation batch, identically on every rank (reference §2.3, gather(R)).
    const int64_t F = K + int64_t(metric_columns.size()) + 3;
    at::Tensor local_table = at::empty({N, F}, at::kDouble);
    auto local_cell = local_table.accessor<double, 2>();
    for (int64_t i = 0; i < N; ++i) {
        for (int k = 0; k < K; ++k) local_cell[i][k] = R[size_t(i) * K + k];
        for (size_t c = 0; c < metric_columns.size(); ++c) local_cell[i][K + int64_t(c)] = metric_columns[c][size_t(i)];
        local_cell[i][F - 3] = double(result.lengths[size_t(i)]);
        local_cell[i][F - 2] = double(batch_rows.truncated[size_t(i)]);
        local_cell[i][F - 1] = double(prompts[size_t(i)].size());
    }
    at::Tensor table = options.group ? options.group->all_gather_rows(local_table) : local_table;
    const int64_t N_all = table.size(0);
    auto cell = table.accessor<double, 2>();
    std::vector<float> R_all(size_t(N_all) * K);
    for (int64_t i = 0; i < N_all; ++i)
        for (int k = 0; k < K; ++k) R_all[size_t(i) * K + k] = float(cell[i][k]);
    for (size_t c = 0; c < metric_columns.size(); ++c) {
        std::vector<double> column(static_cast<size_t>(N_all));
        for (int64_t i = 0; i < N_all; ++i) column[size_t(i)] = cell[i][K + int64_t(c)];
        generation_metrics[metric_names[c]] = nanmean(column);
    }
    AdvantageOptions ao;
    ao.num_generations = int(G);
    ao.scale_rewards = m.string("loss.scale_rewards");
    ao.aggregation = m.string("loss.aggregation");
    AdvantageResult adv = compute_advantages(R_all, K, reward_weights, ao);
    const std::vector<float> local_advantages(adv.advantages.begin() + first_row, adv.advantages.begin() + first_row + N);
    if (rollouts_file.is_open()) {  // what [rollouts] path replays: the same rows give the same update
        for (int64_t i = 0; i < N; ++i) {
            int64_t length = result.lengths[size_t(i)];
            json line = json::parse(row_columns[size_t(i)]);
            line["prompt_ids"] = prompts[size_t(i)];
            line["completion_ids"] = std::vector<int64_t>(result.completion_ids[i].data_ptr<int64_t>(),
                                                          result.completion_ids[i].data_ptr<int64_t>() + length);
            at::Tensor lp = result.sampled_logprobs[i].narrow(0, 0, length).contiguous();
            line["sampling_logprobs"] = std::vector<float>(lp.data_ptr<float>(), lp.data_ptr<float>() + length);
            for (int k = 0; k < K; ++k) {
                float v = R[size_t(i) * K + k];
                line["rewards"][reward_names[size_t(k)]] = std::isnan(v) ? json(nullptr) : json(v);
            }
            rollouts_file << line.dump() << "\n";
        }
        rollouts_file.flush();
    }
    if (adv.unscorable_rows && options.log && options.rank == 0)
        *options.log << "grove: warning: " << adv.unscorable_rows
                     << " completions got NaN from every reward; their advantage is 0\n";
    reward_seconds += seconds_since(t1);

    // completion statistics (reference §2.8), over the whole generation batch
    double length_sum = 0, length_min = 1e18, length_max = 0, clipped = 0, terminated_sum = 0, terminated = 0;
    double terminated_min = 1e18, terminated_max = 0;
    int64_t prompt_token_count = 0;
    for (int64_t i = 0; i < N_all; ++i) {
        double l = cell[i][F - 3];
        bool was_truncated = cell[i][F - 2] != 0.0;
        length_sum += l;
        length_min = std::min(length_min, l);
        length_max = std::max(length_max, l);
        clipped += was_truncated;
        if (!was_truncated) {
            terminated_sum += l;
            ++terminated;
            terminated_min = std::min(terminated_min, l);
            terminated_max = std::max(terminated_max, l);
        }
        prompt_token_count += int64_t(cell[i][F - 1]);
    }
    num_tokens += prompt_token_count + int64_t(length_sum);
    auto& gm = generation_metrics;
    gm["completions/mean_length"] = length_sum / double(N_all);
    gm["completions/min_length"] = length_min;
    gm["completions/max_length"] = length_max;
    gm["completions/clipped_ratio"] = clipped / double(N_all);
    gm["completions/mean_terminated_length"] = terminated ? terminated_sum / terminated : 0.0;
    gm["completions/min_terminated_length"] = terminated ? terminated_min : 0.0;
    gm["completions/max_terminated_length"] = terminated ? terminated_max : 0.0;
    gm["reward"] = adv.reward;
    gm["reward_std"] = adv.reward_std;
    gm["frac_reward_zero_std"] = adv.frac_reward_zero_std;
    for (int k = 0; k < K; ++k) {
        gm["rewards/" + reward_names[size_t(k)] + "/mean"] = adv.reward_mean[size_t(k)];
        gm["rewards/" + reward_names[size_t(k)] + "/std"] = adv.reward_std_per_function[size_t(k)];
    }

    if (completions_file.is_open() && m.boolean("logging.log_completions")) {
        int64_t limit = m.optional_integer("logging.num_completions_to_print").value_or(N);
        for (int64_t i = 0; i < std::min(N, limit); ++i) {
            json line = {{"step", global_step}, {"prompt", row_texts[size_t(i)]}, {"completion", completions[size_t(i)]},
                         {"advantage", local_advantages[size_t(i)]}};
            for (int k = 0; k < K; ++k) line["rewards"][reward_names[size_t(k)]] = R[size_t(i) * K + k];
            completions_file << line.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
        }
        completions_file.flush();
    }

    // tensors: left-padded prompts, right-padded completions
    int64_t P = 0;
    for (const auto& p : prompts) P = std::max<int64_t>(P, int64_t(p.size()));
    at::Tensor prompt_ids = at::full({N, P}, o.pad_token_id, at::kLong), prompt_mask = at::zeros({N, P}, at::kLong);
    for (int64_t i = 0; i < N; ++i) {
        int64_t n = int64_t(prompts[size_t(i)].size());
        prompt_ids[i].narrow(0, P - n, n).copy_(at::tensor(prompts[size_t(i)], at::kLong));
        prompt_mask[i].narrow(0, P - n, n).fill_(1);
    }
    at::Tensor completion_mask = result.completion_mask.clone();
    if (m.boolean("loss.mask_truncated_completions"))
        completion_mask.mul_(result.truncated.logical_not().to(at::kLong).unsqueeze(1));
    at::Tensor advantages = at::tensor(local_advantages, at::kFloat);
    generation_tokens = completion_mask.sum().item<double>();
    if (options.group) generation_tokens = options.group->sum(generation_tokens);  // every rank's (dapo's normaliser)

    bool all_sampling_logprobs = !replayed.empty() && std::all_of(replayed.begin(), replayed.end(), [](const ReplayRow* r) {
        return !r->sampling_logprobs.empty();
    });
    if (options.group) all_sampling_logprobs = options.group->max(all_sampling_logprobs ? 0.0 : 1.0) == 0.0;  // on every rank
    if (all_sampling_logprobs) {
        // how far the generator's log-probs are from the trainer's (reference §2.7's first metric)
        at::Tensor sampling = at::zeros(result.completion_ids.sizes(), at::kFloat);
        for (int64_t i = 0; i < N; ++i) {
            int64_t length = result.lengths[size_t(i)];
            if (length > 0)
                sampling[i].narrow(0, 0, length).copy_(at::tensor(std::vector<float>(replayed[size_t(i)]->sampling_logprobs.begin(),
                                                                                     replayed[size_t(i)]->sampling_logprobs.begin() + length)));
        }
        MicroBatch whole{prompt_ids, prompt_mask, result.completion_ids, result.completion_mask, advantages, std::nullopt, std::nullopt};
        at::Tensor trainer_logps = logps_no_grad(*model, whole).cpu();
        at::Tensor m = result.completion_mask.to(at::kFloat);
        at::Tensor diff = (trainer_logps - sampling).abs() * m;
        double diff_sum = diff.sum().item<double>(), count = m.sum().item<double>(), diff_max = diff.max().item<double>();
        if (options.group) {
            diff_sum = options.group->sum(diff_sum);
            count = options.group->sum(count);
            diff_max = options.group->max(diff_max);
        }
        generation_metrics["sampling/sampling_logp_difference/mean"] = diff_sum / std::max(1.0, count);
        generation_metrics["sampling/sampling_logp_difference/max"] = diff_max;
    }

    // shuffle rows (seeded), then split into steps_per_generation micro-batches
    at::Generator g = at::detail::createCPUGenerator(uint64_t(m.integer("train.seed")) * 104729ull + uint64_t(generation_index));
    at::Tensor order = at::randperm(N, g, at::kLong);
    buffer.clear();
    int64_t rows_per_micro = N / steps_per_generation;
    bool need_old = accumulation % (steps_per_generation * iterations) != 0;
    for (int64_t s = 0; s < steps_per_generation; ++s) {
        at::Tensor index = order.narrow(0, s * rows_per_micro, rows_per_micro);
        MicroBatch b{prompt_ids.index_select(0, index), prompt_mask.index_select(0, index), result.completion_ids.index_select(0, index),
                     completion_mask.index_select(0, index), advantages.index_select(0, index), std::nullopt, std::nullopt};
        if (need_old) b.old_logps = logps_no_grad(*model, b).cpu();
        if (m.number("loss.beta") != 0.0) {
            if (reference) {
                b.ref_logps = logps_no_grad(*reference, b).cpu();
            } else {  // LoRA: the base model is the adapter disabled
                model->set_adapters_enabled(false);
                b.ref_logps = logps_no_grad(*model, b).cpu();
                model->set_adapters_enabled(true);
            }
        }
        buffer.push_back(std::move(b));
    }
    ++generation_index;
}

// ---------------------------------------------------------------------------------------------
Trainer::Trainer(const Manifest& manifest, const TrainerOptions& options) : s_(new State(manifest, options)) {
    s_->output = manifest.string("output.dir");
    bool has_run = fs::exists(fs::path(s_->output) / "metrics.jsonl") || fs::exists(fs::path(s_->output) / "trainer_state.json");
    for (const auto& e : fs::exists(s_->output) ? fs::directory_iterator(s_->output) : fs::directory_iterator())
        has_run |= e.path().filename().string().rfind("checkpoint-", 0) == 0;
    if (has_run && !options.resume && !options.overwrite)
        throw Error(ErrorKind::usage, s_->output + " already holds a run: pass --resume to continue it, --overwrite to "
                                                   "replace it, or set output.dir to another folder");
    if (options.group) options.group->barrier();  // every rank has looked before rank 0 clears anything
    if (options.rank == 0) {
        if (has_run && options.overwrite && !options.resume) fs::remove_all(s_->output);
        fs::create_directories(s_->output);
    }
    if (options.group) options.group->barrier();
    s_->load();
    if (options.resume) {
        std::string dir = *options.resume;
        if (dir == "latest") {
            int64_t best = -1;
            for (const auto& e : fs::directory_iterator(s_->output)) {
                std::string name = e.path().filename().string();
                if (name.rfind("checkpoint-", 0) == 0) best = std::max<int64_t>(best, std::stoll(name.substr(11)));
            }
            if (best < 0) throw Error(ErrorKind::usage, s_->output + " has no checkpoint to resume from");
            dir = (fs::path(s_->output) / ("checkpoint-" + std::to_string(best))).string();
        }
        std::ifstream in(fs::path(dir) / "trainer_state.json");
        if (!in) throw Error(ErrorKind::input, dir + ": not a checkpoint (no trainer_state.json)");
        json st = json::parse(in);
        State& s = *s_;
        s.global_step = st["global_step"];
        s.micro_step = st["micro_step"];
        s.generation_index = st["generation_index"];
        s.epoch = st["epoch"];
        s.position = st["position"];
        s.num_tokens = st["num_tokens"];
        s.replay_position = st.value("replay_position", size_t(0));
        int saved_world = st.value("world_size", 1);
        if (saved_world != options.world_size)
            throw Error(ErrorKind::usage, dir + " was written by " + std::to_string(saved_world) + " process(es); resume it with " +
                                              "the same number (this run has " + std::to_string(options.world_size) + ")");
        s.fill_permutation();
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
            for (size_t i = 0; i < s.params.size(); ++i) {
                s.params[i].copy_(load(weights, "p" + std::to_string(i)));
                exp_avg.push_back(load(optimizer, "exp_avg." + std::to_string(i)));
                exp_avg_sq.push_back(load(optimizer, "exp_avg_sq." + std::to_string(i)));
            }
        }
        s.optimizer->restore(st["optimizer_steps"], exp_avg, exp_avg_sq);
        fs::path buffer_file = fs::path(dir) / buffer_file_name(options.rank);
        if (fs::exists(buffer_file)) {  // a checkpoint inside a generation batch: this rank's rows
            SafetensorsFile f(buffer_file.string());
            s.generation_tokens = st["generation_tokens"];
            s.generation_metrics = st["generation_metrics"].get<std::map<std::string, double>>();
            for (int64_t b = 0;; ++b) {
                std::string p = "b" + std::to_string(b) + ".";
                if (!f.find(p + "prompt_ids")) break;
                auto get = [&](const std::string& n) { return tensor_from_entry(*f.find(p + n), f.path()); };
                MicroBatch mb{get("prompt_ids"), get("prompt_mask"), get("completion_ids"), get("completion_mask"), get("advantages"),
                              std::nullopt, std::nullopt};
                if (f.find(p + "old_logps")) mb.old_logps = get("old_logps");
                if (f.find(p + "ref_logps")) mb.ref_logps = get("ref_logps");
                s.buffer.push_back(std::move(mb));
            }
        }
    }
    if (options.rank != 0) return;  // rank 0 writes the run's files
    std::ios::openmode mode = std::ios::out | (options.resume ? std::ios::app : std::ios::trunc);
    s_->metrics_file.open(fs::path(s_->output) / "metrics.jsonl", mode);
    s_->completions_file.open(fs::path(s_->output) / "completions.jsonl", mode);
    if (manifest.boolean("logging.save_rollouts")) s_->rollouts_file.open(fs::path(s_->output) / "rollouts.jsonl", mode);
}

Trainer::~Trainer() = default;
int64_t Trainer::global_step() const { return s_->global_step; }
int64_t Trainer::total_steps() const { return s_->total; }
bool Trainer::has_reference_model() const { return s_->reference != nullptr; }
Model& Trainer::model() { return *s_->model; }

std::map<std::string, double> Trainer::step() {
    State& s = *s_;
    const Manifest& m = s.manifest;
    auto t0 = Clock::now();
    s.generate_seconds = s.reward_seconds = 0;
    double train_seconds = 0, loss_sum = 0, kl_sum = 0, entropy_sum = 0, token_count = 0, clip_low = 0, clip_high = 0, clip_region = 0, clip_count = 0;
    double bad_loss = 0.0;  // a non-finite micro-batch loss, if any
    int64_t bad_micro_step = -1;
    PolicyLossOptions lo;
    lo.beta = m.number("loss.beta");
    lo.epsilon = m.number("loss.epsilon");
    lo.epsilon_high = m.number("loss.epsilon_high");
    lo.delta = m.optional_number("loss.delta");
    lo.importance_sampling_level = m.string("loss.importance_sampling_level");
    lo.use_bias_correction_kl = m.boolean("loss.use_bias_correction_kl");
    double temperature = m.number("generation.temperature");
    for (int64_t a = 0; a < s.accumulation; ++a) {
        if (s.micro_step % (s.steps_per_generation * s.iterations) == 0 || s.buffer.empty()) s.generate_buffer();
        auto t1 = Clock::now();
        int64_t index = s.micro_step % s.steps_per_generation;
        const MicroBatch& b = s.buffer[size_t(index)];
        s.adapter_host->set_training(true);
        at::Tensor entropy, logp;
        {
            AutocastScope autocast(s.autocast_device);  // the forward only; backward follows the recorded dtypes
            logp = completion_logprobs(*s.model, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask,
                                       temperature, &entropy);
        }
        at::Tensor mask = b.completion_mask.to(at::kFloat).contiguous();
        entropy_sum += (entropy * mask.to(entropy.device())).sum().item<double>();
        // the tokens whose gradients accumulate into this optimizer step (the dapo normaliser)
        double window = 0;
        if (s.steps_per_generation >= s.accumulation) {
            int64_t first = index / s.accumulation * s.accumulation;
            for (int64_t w = first; w < first + s.accumulation; ++w) window += s.buffer[size_t(w)].completion_mask.sum().item<double>();
            if (s.options.group) window = s.options.group->sum(window);  // every rank's share of the window
        } else {  // the window spans several generation batches not generated yet: TRL #6024's estimate
            window = s.generation_tokens * double(s.accumulation) / double(s.steps_per_generation);
        }
        grove_reduction_context ctx{};
        ctx.struct_size = sizeof(ctx);
        ctx.rows = uint32_t(mask.size(0));
        ctx.columns = uint32_t(mask.size(1));
        ctx.mask = mask.data_ptr<float>();
        ctx.gradient_accumulation_steps = uint32_t(s.accumulation);
        ctx.steps_per_generation = uint32_t(s.steps_per_generation);
        ctx.world_size = uint32_t(s.options.world_size);
        ctx.max_completion_length = uint32_t(m.integer("generation.max_completion_length"));
        ctx.generation_batch_tokens = s.generation_tokens;
        ctx.generation_batch_sequences = double(s.generation_batch);
        ctx.optimizer_window_tokens = window;
        std::vector<float> weights;
        s.reduction->weights(ctx, weights);
        at::Tensor w = at::from_blob(weights.data(), {mask.size(0), mask.size(1)}, at::kFloat).clone().to(logp.device());
        auto result = policy_loss(logp, b.old_logps ? std::optional<at::Tensor>(b.old_logps->to(logp.device())) : std::nullopt,
                                  b.ref_logps ? std::optional<at::Tensor>(b.ref_logps->to(logp.device())) : std::nullopt,
                                  b.advantages.to(logp.device()), mask.to(logp.device()), w, lo);
        double value = result.loss.item<double>();
        if (!std::isfinite(value)) {  // reported after the loop, when every rank knows (they must not part ways)
            if (std::isfinite(bad_loss)) bad_loss = value, bad_micro_step = s.micro_step;
            ++s.micro_step;
            continue;
        }
        result.loss.backward();
        loss_sum += value;
        kl_sum += result.kl_sum;
        token_count += result.token_count;
        clip_low += result.clip_low_sum;
        clip_high += result.clip_high_sum;
        clip_region += result.clip_region_sum;
        clip_count += result.clip_count;
        ++s.micro_step;
        train_seconds += seconds_since(t1);
    }
    auto t2 = Clock::now();
    ProcessGroup* group = s.options.group;
    double any_bad = std::isfinite(bad_loss) ? 0.0 : 1.0;
    if (group) any_bad = group->max(any_bad);
    if (any_bad != 0.0)
        throw Error(ErrorKind::runtime, "the loss became " + (std::isfinite(bad_loss) ? std::string("non-finite on another rank")
                                                                                      : std::to_string(bad_loss) + " (micro-step " +
                                                                                            std::to_string(bad_micro_step) + ")") +
                                            " at step " + std::to_string(s.global_step + 1) + "; no update was applied. "
                                            "Lower train.learning_rate or set train.max_grad_norm; the last checkpoint in " + s.output +
                                            " is intact");
    if (group) {
        // DDP: the mean of the ranks' gradients (the reductions already count every rank's tokens)
        std::vector<at::Tensor> grads;
        for (at::Tensor& p : s.params) {
            if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
            grads.push_back(p.grad());
        }
        group->all_reduce_sum(grads);
        for (at::Tensor& g : grads) g.div_(double(group->world_size()));
        // metric sums over ranks; TRL logs the loss averaged over ranks
        std::vector<at::Tensor> sums{at::tensor({loss_sum, kl_sum, entropy_sum, token_count, clip_low, clip_high, clip_region, clip_count},
                                                at::kDouble)};
        group->all_reduce_sum(sums);
        auto v = sums[0].accessor<double, 1>();
        loss_sum = v[0] / double(group->world_size());
        kl_sum = v[1], entropy_sum = v[2], token_count = v[3], clip_low = v[4], clip_high = v[5], clip_region = v[6], clip_count = v[7];
    }
    // global gradient norm before clipping (what HF logs), then clip
    double grad_norm = s.optimizer->clip_grad_norm(m.number("train.max_grad_norm"));
    if (!std::isfinite(grad_norm))
        throw Error(ErrorKind::runtime, "the gradient norm became " + std::to_string(grad_norm) + " at step " +
                                            std::to_string(s.global_step + 1) + "; no update was applied; the last checkpoint in " +
                                            s.output + " is intact");
    double lr = m.number("train.learning_rate") *
                learning_rate_multiplier(m.string("train.lr_scheduler_type"), s.global_step, s.warmup, s.total);
    s.optimizer->step(lr);
    s.optimizer->zero_grad();
    ++s.global_step;
    train_seconds += seconds_since(t2);

    std::map<std::string, double> metrics = s.generation_metrics;
    metrics["loss"] = loss_sum;
    metrics["grad_norm"] = grad_norm;
    metrics["learning_rate"] = lr;
    metrics["num_tokens"] = double(s.num_tokens);
    if (lo.beta != 0.0) metrics["kl"] = kl_sum / std::max(token_count, 1.0);
    metrics["entropy"] = entropy_sum / std::max(token_count, 1.0);
    metrics["clip_ratio/low_mean"] = clip_low / std::max(clip_count, 1.0);
    metrics["clip_ratio/high_mean"] = clip_high / std::max(clip_count, 1.0);
    metrics["clip_ratio/region_mean"] = clip_region / std::max(clip_count, 1.0);
    metrics["step_time"] = seconds_since(t0);
    metrics["step_time/generate"] = s.generate_seconds;
    metrics["step_time/reward"] = s.reward_seconds;
    metrics["step_time/train"] = train_seconds;
    metrics["epoch"] = double(s.epoch) + double(s.position) / double(std::max<size_t>(1, s.rows.size()));
    return metrics;
}

std::string Trainer::save_checkpoint() {
    State& s = *s_;
    ProcessGroup* group = s.options.group;
    std::string name = "checkpoint-" + std::to_string(s.global_step);
    fs::path final_dir = fs::path(s.output) / name, tmp = fs::path(s.output) / (".tmp-" + name);
    if (group) group->barrier();
    if (s.options.rank == 0) {
        fs::remove_all(tmp);
        fs::create_directories(tmp);
    }
    if (group) group->barrier();
    // a checkpoint inside a generation batch keeps each rank's unused micro-batches
    bool mid_generation = s.micro_step % (s.steps_per_generation * s.iterations) != 0;
    if (mid_generation) {
        std::vector<std::pair<std::string, at::Tensor>> buffer;
        for (size_t b = 0; b < s.buffer.size(); ++b) {
            std::string p = "b" + std::to_string(b) + ".";
            const MicroBatch& mb = s.buffer[b];
            for (auto [n, t] : {std::pair{"prompt_ids", mb.prompt_ids}, std::pair{"prompt_mask", mb.prompt_mask},
                                std::pair{"completion_ids", mb.completion_ids}, std::pair{"completion_mask", mb.completion_mask},
                                std::pair{"advantages", mb.advantages}})
                buffer.emplace_back(p + n, t);
            if (mb.old_logps) buffer.emplace_back(p + "old_logps", *mb.old_logps);
            if (mb.ref_logps) buffer.emplace_back(p + "ref_logps", *mb.ref_logps);
        }
        save_tensors((tmp / buffer_file_name(s.options.rank)).string(), buffer);
    }
    if (group) group->barrier();
    if (s.options.rank != 0) {  // rank 0 writes the rest and renames; the others wait for it
        if (group) group->barrier();
        return final_dir.string();
    }
    // the model as users load it: a Hugging Face folder (full) or a PEFT adapter folder (LoRA)
    if (s.lora) {
        save_tensors((tmp / "adapter_model.safetensors").string(), s.model->adapter_parameters(), {{"format", "pt"}});
        json config = json::parse(s.adapter_host->saved_config_json());
        config["base_model_name_or_path"] = fs::absolute(s.manifest.string("model.path")).string();
        write_file_atomically((tmp / "adapter_config.json").string(), config.dump(2) + "\n");
    } else {
        s.model->save(tmp.string());
    }
    copy_tokenizer_files(s.manifest.string("model.path"), tmp.string());
    // exact resume: trainable tensors, AdamW state, counters, the sampler, and a partly used generation batch
    std::vector<std::pair<std::string, at::Tensor>> trainable;
    for (size_t i = 0; i < s.params.size(); ++i) trainable.emplace_back("p" + std::to_string(i), s.params[i]);
    save_tensors((tmp / "trainable.safetensors").string(), trainable);
    save_tensors((tmp / "optimizer.safetensors").string(), s.optimizer->state());
    json state = {{"global_step", s.global_step}, {"micro_step", s.micro_step}, {"generation_index", s.generation_index},
                  {"epoch", s.epoch}, {"position", s.position}, {"optimizer_steps", s.optimizer->steps()},
                  {"num_tokens", s.num_tokens}, {"generation_tokens", s.generation_tokens},
                  {"generation_metrics", s.generation_metrics}, {"replay_position", s.replay_position},
                  {"world_size", s.options.world_size},
                  {"manifest", s.manifest.path()}};
    write_file_atomically((tmp / "trainer_state.json").string(), state.dump(2) + "\n");
    fs::remove_all(final_dir);
    fs::rename(tmp, final_dir);  // atomic: a crash leaves the previous checkpoints and a .tmp folder
    // <output>/latest names the checkpoint written last, so scripts need not know the step count;
    // a relative link survives moving the run folder, and rename() swaps it atomically
    fs::path link = fs::path(s.output) / "latest", tmp_link = fs::path(s.output) / ".tmp-latest";
    fs::remove(tmp_link);
    fs::create_directory_symlink(name, tmp_link);
    fs::rename(tmp_link, link);
    if (auto keep = s.manifest.optional_integer("output.save_total_limit")) {
        std::vector<int64_t> steps;
        for (const auto& e : fs::directory_iterator(s.output)) {
            std::string n = e.path().filename().string();
            if (n.rfind("checkpoint-", 0) == 0) steps.push_back(std::stoll(n.substr(11)));
        }
        std::sort(steps.begin(), steps.end());
        for (size_t i = 0; i + size_t(*keep) < steps.size(); ++i)
            fs::remove_all(fs::path(s.output) / ("checkpoint-" + std::to_string(steps[i])));
    }
    if (group) group->barrier();
    return final_dir.string();
}

int64_t Trainer::run() {
    State& s = *s_;
    g_stop_requested = 0;
    auto previous_int = std::signal(SIGINT, request_stop);
    auto previous_term = std::signal(SIGTERM, request_stop);
    int64_t logging = s.manifest.integer("logging.logging_steps"), save = s.manifest.integer("output.save_steps");
    int64_t ran = 0;
    double first_reward = -1e300, last_reward = 0;
    auto start = Clock::now();
    while (s.global_step < s.total) {
        auto metrics = step();
        ++ran;
        json line = {{"step", s.global_step}};
        for (const auto& [k, v] : metrics) line[k] = std::isfinite(v) ? json(v) : json(nullptr);
        if (s.metrics_file.is_open()) {
            s.metrics_file << line.dump() << "\n";
            s.metrics_file.flush();
        }
        if (first_reward < -1e299) first_reward = metrics["reward"];
        last_reward = metrics["reward"];
        if (s.options.log && s.options.rank == 0) {
            double elapsed = seconds_since(start), eta = elapsed / double(ran) * double(s.total - s.global_step);
            std::ostringstream os;
            os << std::fixed << std::setprecision(4) << "loss " << metrics["loss"] << "  reward " << metrics["reward"]
               << "  grad_norm " << metrics["grad_norm"] << "  lr " << std::scientific << std::setprecision(2)
               << metrics["learning_rate"] << std::fixed << std::setprecision(2) << "  " << metrics["step_time"] << " s/step";
            if (s.options.progress_bar) {  // one line redrawn in place on a terminal
                int width = 24, done = int(double(width) * double(s.global_step) / double(std::max<int64_t>(1, s.total)));
                *s.options.log << "\r[" << std::string(size_t(done), '#') << std::string(size_t(width - done), '.') << "] "
                               << s.global_step << "/" << s.total << "  " << os.str() << "  eta " << int64_t(eta) << " s   "
                               << (s.global_step == s.total ? "\n" : "") << std::flush;
            } else if (s.global_step % logging == 0 || s.global_step == s.total) {
                *s.options.log << "step " << s.global_step << "/" << s.total << "  " << os.str() << "  eta " << int64_t(eta)
                               << " s\n" << std::flush;
            }
        }
        bool stop = g_stop_requested != 0;
        if (s.options.group) stop = s.options.group->max(stop ? 1.0 : 0.0) != 0.0;  // all ranks stop at the same step
        if (s.global_step % save == 0 || s.global_step == s.total || stop) {
            std::string dir = save_checkpoint();
            if (s.options.log && stop && s.options.rank == 0) *s.options.log << "grove: stopped by signal; checkpoint written to " << dir << "\n";
        }
        if (stop) break;
    }
    std::signal(SIGINT, previous_int);
    std::signal(SIGTERM, previous_term);
    if (s.options.log && ran > 0 && s.options.rank == 0) {
        if (s.options.progress_bar && s.global_step != s.total) *s.options.log << "\n";
        double elapsed = seconds_since(start);
        std::ostringstream os;
        os << std::fixed << std::setprecision(3) << "grove: " << ran << " steps in " << std::setprecision(1) << elapsed << " s ("
           << std::setprecision(2) << elapsed / double(ran) << " s/step); reward " << std::setprecision(4) << first_reward
           << " at the first step of this run, " << last_reward << " at the last; step " << s.global_step << "/" << s.total
           << "; metrics in " << s.output << "/metrics.jsonl";
        *s.options.log << os.str() << "\n";
    }
    return ran;
}

// ---------------------------------------------------------------------------------------------
namespace {
// Adds (alpha/r) B A (alpha/sqrt(r) with rsLoRA) to every base weight the adapter has A and B for.
void merge_lora_adapter(Model& model, const std::string& adapter_dir, const std::string& base_dir) {
    std::ifstream in(fs::path(adapter_dir) / "adapter_config.json");
    if (!in) throw Error(ErrorKind::input, adapter_dir + ": no adapter_config.json (is this a LoRA checkpoint?)");
    json config = json::parse(in);
    if (config.value("peft_type", "") != "LORA")
        throw Error(ErrorKind::input, adapter_dir + "/adapter_config.json: peft_type must be LORA");
    double r = config.at("r").get<double>(), alpha = config.at("lora_alpha").get<double>();
    double scaling = config.value("use_rslora", false) ? alpha / std::sqrt(r) : alpha / r;
    SafetensorsFile adapter((fs::path(adapter_dir) / "adapter_model.safetensors").string());
    at::NoGradGuard no_grad;
    int merged = 0;
    for (auto& [name, weight] : model.named_parameters()) {
        std::string module = name.substr(0, name.size() - std::string(".weight").size());
        const TensorEntry* a = adapter.find("base_model.model." + module + ".lora_A.weight");
        const TensorEntry* b = adapter.find("base_model.model." + module + ".lora_B.weight");
        if (!a || !b) continue;
        at::Tensor A = tensor_from_entry(*a, adapter.path()).to(at::kFloat), B = tensor_from_entry(*b, adapter.path()).to(at::kFloat);
        weight.add_((scaling * at::matmul(B, A)).to(weight.device(), weight.scalar_type()));
        ++merged;
    }
    if (merged == 0) throw Error(ErrorKind::input, adapter_dir + ": no LoRA weight matches a layer of " + base_dir);
}
}  // namespace

void export_merged(const std::string& adapter_dir, const std::string& base_dir, const std::string& out_dir) {
    auto model = Model::load(base_dir, "cpu", "float32");
    merge_lora_adapter(*model, adapter_dir, base_dir);
    model->save(out_dir);
    copy_tokenizer_files(base_dir, out_dir);
}

std::unique_ptr<Model> load_model_or_lora_checkpoint(const std::string& folder, const std::string& device,
                                                     const std::string& dtype) {
    const fs::path dir(folder);
    if (fs::exists(dir / "config.json") || !fs::exists(dir / "adapter_config.json")) return Model::load(folder, device, dtype);
    std::ifstream in(dir / "adapter_config.json");
    json config = json::parse(in, nullptr, false);
    std::string base = config.is_object() ? config.value("base_model_name_or_path", "") : "";
    if (base.empty())
        throw Error(ErrorKind::input, folder + "/adapter_config.json: no base_model_name_or_path; merge it with "
                                      "`grove export --merge " + folder + " --base MODEL_DIR OUT_DIR`");
    fs::path base_dir = fs::path(base).is_absolute() ? fs::path(base) : dir / base;
    if (!fs::exists(base_dir / "config.json"))
        throw Error(ErrorKind::input, folder + "/adapter_config.json: its base model " + base_dir.string() +
                                      " is not a model folder here; merge it with `grove export --merge " + folder +
                                      " --base MODEL_DIR OUT_DIR`");
    auto model = Model::load(base_dir.string(), device, dtype);
    merge_lora_adapter(*model, folder, base_dir.string());
    return model;
}

}  // namespace grove
