// The GRPO trainer: load, step, run. A step is a short sequence of stages with value types between
// them (docs/architecture.md#the-training-step-as-stages):
//   rollout (train/rollout)  ->  scoring (train/scoring)  ->  micro-batches (train/micro_batches)
//   -> update (train/policy_step)  ->  checkpoint (train/checkpoint); logs in train/run_log.
#include "grove/trainer.hpp"

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "grove/adapter_checkpoint.hpp"
#include "grove/adapter_host.hpp"
#include "grove/distributed.hpp"
#include "grove/error.hpp"
#include "grove/evaluation.hpp"
#include "grove/model.hpp"
#include "grove/optimizer.hpp"
#include "grove/reward_model.hpp"
#include "grove/reward_set.hpp"
#include "grove/run_config.hpp"
#include "grove/safetensors.hpp"
#include "grove/tokenizer.hpp"
#include "model/autocast.hpp"
#include "grove/environment_host.hpp"
#include "train/checkpoint.hpp"
#include "train/dynamic_sampling.hpp"
#include "train/episodes.hpp"
#include "train/micro_batches.hpp"
#include "text/text_util.hpp"
#include "train/policy_step.hpp"
#include "train/rollout.hpp"
#include "train/run_log.hpp"
#include "train/scoring.hpp"

namespace fs = std::filesystem;

namespace grove {

namespace {
volatile std::sig_atomic_t g_stop_requested = 0;
extern "C" void request_stop(int signal_number) { g_stop_requested = signal_number; }

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The mean of each key over the generation batches a step made (TRL averages what it appended).
std::map<std::string, double> mean_per_key(const std::vector<std::map<std::string, double>>& maps) {
    std::map<std::string, std::pair<double, int>> sums;
    for (const auto& m : maps)
        for (const auto& [k, v] : m) sums[k].first += v, sums[k].second += 1;
    std::map<std::string, double> out;
    for (const auto& [k, s] : sums) out[k] = s.first / s.second;
    return out;
}

// TR-DPO's reference update (TRL's SyncRefModelCallback): ref = alpha * policy + (1 - alpha) * ref,
// tensor by tensor. Both models were loaded from one folder, so their tensors pair up in order.
void move_reference_toward_policy(Model& reference, const Model& policy, double alpha) {
    at::NoGradGuard no_grad;
    const auto targets = reference.named_parameters(), sources = policy.named_parameters();
    for (size_t i = 0; i < targets.size(); ++i) {
        const at::Tensor& target = targets[i].second;
        target.mul_(1.0 - alpha).add_(sources[i].second.to(target.scalar_type()), alpha);
    }
}

}  // namespace

// Peak GPU memory of each phase of a step, from the caching allocator's peak, which is reset when a
// phase closes: generation; rewards and the old/reference log-probabilities; the policy's
// forward/backward passes and the optimizer. The largest of them is the step's peak.
class PhasePeaks {
public:
    void close(const std::string& phase, const at::Device& device) {
        if (!device.is_cuda()) return;
        const double gib = double(at::accelerator::getDeviceStats(device.index()).allocated_bytes[0].peak) / double(1 << 30);
        gib_[phase] = std::max(gib_[phase], gib);
        overall_ = std::max(overall_, gib);
        at::accelerator::resetPeakStats(device.index());
    }
    void add_to(std::map<std::string, double>& metrics) const {
        if (gib_.empty()) return;
        for (const auto& [phase, gib] : gib_) metrics["memory/peak_" + phase + "_gib"] = gib;
        metrics["memory/peak_allocated_gib"] = overall_;  // since the run began, as torch.cuda.max_memory_allocated
    }
    void start_step() { gib_.clear(); }

private:
    std::map<std::string, double> gib_;
    double overall_ = 0;
};

struct Trainer::State {
    State(const Manifest& manifest, const TrainerOptions& o) : config(RunConfig::from(manifest)), options(o) {}
    // the model's adapted layers call into the adapter plugin when they are destroyed: model first
    ~State() {
        model.reset();
        reference.reset();
    }
    RunConfig config;
    TrainerOptions options;

    // what trains, and with what
    std::unique_ptr<Model> model, reference;  // reference only for beta > 0 with the full adapter
    bool reference_was_moved = false;         // restored from a checkpoint that sync_ref_model had moved
    std::unique_ptr<Tokenizer> tokenizer;
    ChatTemplate chat_template = ChatTemplate::plain;  // model.chat_template resolved against the tokenizer
    std::unique_ptr<PluginHost> host;
    std::unique_ptr<RewardSet> rewards;
    std::unique_ptr<PluginInstance> adapter, reduction, objective;
    std::unique_ptr<AdapterHost> adapter_host;
    std::unique_ptr<Environment> environment;       // multi-turn episodes, when [environment] names one
    std::optional<at::DeviceType> autocast_device;  // train.mixed_precision resolved
    std::vector<at::Tensor> params;                 // trainable tensors, in optimizer order
    std::unique_ptr<Optimizer> optimizer;
    double router_aux_loss_coef = 0;  // a mixture of experts' load-balancing loss weight (0: none)
    std::vector<int> owners;          // ZeRO stage 1: the rank that updates params[i]; empty: every rank, all of them
    std::unique_ptr<PromptSource> prompts;
    SamplingOptions sampling;  // stop and pad tokens filled; the seed is set per generation batch
    int64_t total = 0;
    double steps_per_epoch = 0;  // optimizer steps in one pass over the prompts (save/eval/logging "epoch")
    LearningRateSchedule schedule;

    // where the run is
    TrainingProgress progress;
    std::vector<MicroBatch> buffer;  // the current generation batch's micro-batches
    std::vector<std::map<std::string, double>> generations_this_step;
    double generate_seconds = 0, reward_seconds = 0;
    PhasePeaks memory;
    int64_t batches_without_tool_calls = 0;  // consecutive generation batches (for the warning below)
    std::unique_ptr<Checkpoints> checkpoints;
    std::unique_ptr<RunLog> log;
    int stop_signal = 0;  // the signal that stopped the last run(), 0 if none
    void (*previous_sigint)(int) = SIG_DFL;
    void (*previous_sigterm)(int) = SIG_DFL;

    void load();
    std::unique_ptr<PromptSource> load_prompts_or_rollouts() const;
    void make_generation_batch();
    ScoredRollout generate_and_score(int64_t round);
    AdvantageOptions advantage_options() const;
    ReductionCounts reduction_counts(int64_t micro_batch) const;
    void warn_when_the_tool_is_never_called(double call_frequency);
    void export_model(const std::string& folder) const;
    PolicyLossOptions loss_options() const;
    CheckpointedState checkpointed_state();
    std::vector<std::pair<std::string, double>> reward_columns() const;
    std::map<std::string, double> evaluate_held_out();
    bool inside_generation_batch() const {
        return progress.micro_step % (config.train.steps_per_generation * config.loss.num_iterations) != 0;
    }
};

// ---------------------------------------------------------------------------------------------
void Trainer::State::load() {
    const RunConfig& c = config;
    if (options.world_size > 1 && (!options.group || options.group->world_size() != options.world_size))
        throw Error(ErrorKind::usage,
                    "world size " + std::to_string(options.world_size) +
                        " needs its process group "
                        "(launch with `grove train --nproc N` or torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)");
    if (options.world_size > 1 && c.logging.save_rollouts)
        throw Error(ErrorKind::manifest, c.manifest_path + ": logging.save_rollouts writes one file from one process; with " +
                                             std::to_string(options.world_size) +
                                             " processes set it to false (or train with one)");
    const int64_t S = c.train.steps_per_generation, A = c.train.gradient_accumulation_steps;
    if (S % A != 0 && A % S != 0)
        throw Error(ErrorKind::manifest, c.manifest_path + ": train.steps_per_generation (" + std::to_string(S) +
                                             ") and train.gradient_accumulation_steps (" + std::to_string(A) +
                                             ") must divide one another, so optimizer steps line up with generation batches");

    // the environment before the model: whether it is the run's reward is known only once it is
    // created, and a run without one should stop before loading a large checkpoint
    host = std::make_unique<PluginHost>(plugin_search_path(c.plugin_dirs));
    if (c.environment.use) {
        if (c.rollouts_path)
            throw Error(ErrorKind::manifest, c.environment.use->origin +
                                                 ": replayed rollouts ([rollouts] path) are never generated, so no "
                                                 "environment takes part; remove one of the two");
        environment = make_environment(*host, *c.environment.use, c.environment.reward, c.rewards, c.rewards.empty());
    }

    const std::string device = options.device.value_or(c.model.device);
    model = Model::load(c.model.path, device, c.model.dtype);
    if (c.model.cast_lm_head_to_fp32) model->keep_lm_head_in_float32();  // before any tensor of it is collected
    if (model->config().sequence_classifier)
        throw Error(ErrorKind::input, c.model.path + " is a " + model->config().architecture +
                                          " (a reward model), not a policy to train: load it with [[rewards]] model = \"" +
                                          c.model.path + "\" and give [model] path a causal LM");
    router_aux_loss_coef = c.router_aux_loss_coef_for(model->config());
    model->set_gradient_checkpointing(c.model.gradient_checkpointing);  // the training forward only
    if (c.bf16_autocast(model->device().is_cuda())) autocast_device = model->device().type();
    tokenizer = Tokenizer::load(c.model.path);
    chat_template = c.chat_template(tokenizer->config());

    rewards = std::make_unique<RewardSet>(*host, c.rewards, reward_model_factory(model->device().str()));
    if (c.train.best_model.metric) {  // a misnamed metric fails now, not at the first evaluation
        EvaluationRequest request = evaluation_request(c);
        request.samples = c.train.num_generations_eval;
        std::vector<std::string> evaluated =
            evaluation_metric_names({*model, *tokenizer, *rewards, environment.get()}, request);
        evaluated.push_back("eval_runtime");
        check_metric_is_evaluated(c.train.best_model, evaluated, c.manifest_path);
    }
    adapter = std::make_unique<PluginInstance>(create_plugin(*host, c.adapter, GROVE_PLUGIN_KIND_ADAPTER));
    reduction = std::make_unique<PluginInstance>(create_plugin(*host, c.reduction, GROVE_PLUGIN_KIND_REDUCTION));
    objective = std::make_unique<PluginInstance>(create_plugin(*host, c.objective, GROVE_PLUGIN_KIND_OBJECTIVE));
    at::manual_seed(uint64_t(c.train.seed));  // adapter initialisation
    adapter_host = std::make_unique<AdapterHost>(*adapter);
    const bool full = adapter_host->trains_base_weights();
    model->set_base_trainable(full);
    if (!full) {
        model->attach_adapter(*adapter_host);
        train_beside_adapter(*model, c.beside_adapter, c.adapter);
    }
    // beta = 0 loads no reference model at all (docs/grpo.md#kl-to-the-reference); LoRA uses the base model
    if (c.loss.beta != 0.0 && full) reference = Model::load(c.model.path, device, c.model.dtype);
    if (reference && c.model.cast_lm_head_to_fp32) reference->keep_lm_head_in_float32();  // as TRL casts both
    c.check_adapter(adapter->info().name, full);

    const auto named_params = trainable_parameters_or_refuse(*model, c.adapter, adapter->info().name);
    for (const auto& [name, tensor] : named_params) params.push_back(tensor);
    std::vector<bool> updated;  // empty: all
    if (c.train.shard_optimizer_state && options.group) {
        owners = shard_owners(params, options.world_size);
        for (int owner : owners) updated.push_back(owner == options.rank);
    }
    optimizer = make_optimizer(c.train, named_params, updated);
    if (options.group) {  // every rank starts from rank 0's trainable weights
        at::NoGradGuard no_grad;
        std::vector<at::Tensor> shared = params;
        options.group->broadcast(shared);
    }

    progress.entropy.coef = c.loss.entropy_coef;  // a resumed run's checkpoint replaces it
    sampling = sampling_options(c);
    set_stop_tokens(sampling, *model, tokenizer->config());
    prompts = load_prompts_or_rollouts();
    const int64_t prompts_per_generation = c.train.generation_batch_size / c.generation.num_generations;
    if (int64_t(prompts->prompt_count()) < prompts_per_generation)
        throw Error(ErrorKind::input, c.data.source.value_or(c.rollouts_path.value_or("")) + ": " +
                                          std::to_string(prompts->prompt_count()) +
                                          " prompts, but one generation batch needs " + std::to_string(prompts_per_generation));
    const int64_t micro_steps_per_epoch = int64_t(prompts->prompt_count()) / prompts_per_generation * S * c.loss.num_iterations;
    steps_per_epoch = double(micro_steps_per_epoch) / double(A);
    total = c.train.max_steps > 0 ? c.train.max_steps : int64_t(std::ceil(c.train.num_train_epochs * steps_per_epoch));
    schedule = LearningRateSchedule::of(c.train, total);
    if (options.rank == 0 && options.log)
        *options.log << schedule.ignored_warmup_warning() << ignored_optimizer_settings_warning(c.train);
}

namespace {
// Without data.source the environment writes every prompt, as TRL's environments do without a
// train_dataset: one that writes none, or several chosen by a dataset column, is refused up front.
void check_environment_writes_prompts(const Environment& environment, const std::string& manifest_path) {
    if (!environment.begins_episodes())
        throw Error(ErrorKind::manifest, manifest_path + ": without data.source the environment writes every prompt, but " +
                                             "plugin " + environment.info().display() +
                                             " writes none (it has no begin_episodes): set data.source");
    if (!environment.tools_column().empty())
        throw Error(ErrorKind::manifest, manifest_path + ": several environments, chosen by each row's \"" +
                                             environment.tools_column() + "\" column, need data.source with that column " +
                                             "(as TRL's environment_factory={name: factory} needs a train_dataset)");
}
}  // namespace

std::unique_ptr<PromptSource> Trainer::State::load_prompts_or_rollouts() const {
    const RunConfig& c = config;
    if (c.rollouts_path)
        return std::make_unique<PromptSource>(read_rollouts(*c.rollouts_path, c.generation.num_generations, *tokenizer,
                                                            model->config().vocab_size, rewards->names()),
                                              c.generation.num_generations);
    if (!c.data.source) check_environment_writes_prompts(*environment, c.manifest_path);
    std::vector<BatchRow> rows;
    const std::vector<PromptRow> dataset =
        c.data.source ? load_prompts(*c.data.source, c.data.prompt_column, Environment::rows_without_prompt(environment.get()))
                      : environment_owned_prompts(size_t(c.train.generation_batch_size / c.generation.num_generations));
    for (const PromptRow& row : dataset) {
        BatchRow r;
        r.prompt_messages = row.messages;
        r.prompt_text = prompt_text(row, chat_template, tokenizer->config(),
                                    environment ? environment->tools_for(row.columns_json, row.origin) : "");
        // as TRL 1.16: a text prompt gets the tokenizer's special tokens (processing_class(text=prompts):
        // Llama 3's and Gemma's BOS); a rendered conversation carries the template's own
        r.prompt_ids = tokenizer->encode(r.prompt_text, row.messages.empty());
        if (r.prompt_ids.empty()) throw Error(ErrorKind::input, row.origin + ": the prompt encodes to no tokens");
        r.columns_json = row.columns_json;
        r.prompt_given = row.prompt_given;
        rows.push_back(std::move(r));
    }
    return std::make_unique<PromptSource>(std::move(rows), c.generation.num_generations, uint64_t(c.train.seed),
                                          c.data.shuffle);
}

// One generation batch: rollout -> scoring -> logs -> micro-batches with old/reference log-probs.
// Stages 1 and 2 for the next prompts: a rollout and its scores. Round r > 0 of dynamic sampling
// draws new prompts and samples with a stream of its own.
ScoredRollout Trainer::State::generate_and_score(int64_t round) {
    const RunConfig& c = config;
    auto t0 = Clock::now();
    SamplingOptions o = sampling;
    // each rank samples its own slice with its own stream (rank 0 keeps the single-process seed)
    o.seed = uint64_t(c.train.seed) * 7919ull + uint64_t(progress.generation_index) +
             uint64_t(options.rank) * 0x9E3779B97F4A7C15ull + uint64_t(round) * 0xD1B54A32D192ED03ull;
    std::vector<BatchRow> rows =
        shard_rows(prompts->next_batch(c.train.generation_batch_size), options.rank, options.world_size);
    progress.sampler = prompts->position();
    const int64_t first_row = int64_t(options.rank) * int64_t(rows.size());
    const bool replay = !rows.empty() && rows[0].replay;
    Rollout rollout = replay        ? replay_rollout(std::move(rows), o, first_row)
                      : environment ? generate_episodes(*model, *tokenizer, *environment, std::move(rows), o,
                                                        {c.environment.max_turns, c.generation.max_completion_length,
                                                         progress.global_step, chat_template},
                                                        first_row, environment->reward_column() != nullptr)
                                    : generate_rollout(*model, std::move(rows), o, first_row);
    generate_seconds += seconds_since(t0);
    memory.close("generate", model->device());

    auto t1 = Clock::now();
    const Environment* environment_reward =
        environment && !replay && environment->reward_column() ? environment.get() : nullptr;
    ScoredBatch scored =
        score_rollout(rollout, *rewards, *tokenizer, advantage_options(),
                      {progress.global_step, options.rank, options.world_size, options.group, environment_reward, total});
    reward_seconds += seconds_since(t1);
    return {std::move(rollout), std::move(scored)};
}

AdvantageOptions Trainer::State::advantage_options() const {
    return {int(config.generation.num_generations), config.loss.scale_rewards, config.loss.aggregation};
}

// One generation batch: rollout -> scoring (-> dynamic sampling) -> logs -> micro-batches with
// old/reference log-probs.
void Trainer::State::make_generation_batch() {
    const RunConfig& c = config;
    ProcessGroup* group = options.group;
    AutocastScope autocast(autocast_device);  // sampling and old/reference log-probs, as TRL's accelerate wraps forward
    adapter_host->set_training(false);        // no adapter dropout while sampling or computing old/reference log-probs
    ScoredRollout batch;
    std::map<std::string, double> filtering;
    if (c.generation.dynamic_sampling) {
        std::tie(batch, filtering) =
            fill_with_informative_groups([&](int64_t round) { return generate_and_score(round); },
                                         c.train.generation_batch_size / c.generation.num_generations,
                                         c.generation.dynamic_sampling_max_rounds, advantage_options(), sampling.pad_token_id);
    } else {
        batch = generate_and_score(0);
    }
    Rollout& rollout = batch.rollout;
    ScoredBatch& scored = batch.scored;
    log->write_rollouts(rollout, scored);
    if (scored.statistics.unscorable_rows && options.log && options.rank == 0)
        *options.log << "grove: warning: " << scored.statistics.unscorable_rows
                     << " completions got NaN from every reward; their advantage is 0\n";

    std::map<std::string, double> metrics = scored_batch_metrics(scored);
    metrics.insert(filtering.begin(), filtering.end());
    if (environment) {
        for (const auto& [k, v] : episode_metrics(rollout, group)) metrics[k] = v;
        warn_when_the_tool_is_never_called(metrics["tools/call_frequency"]);
    }
    for (size_t i = 0; i < scored.completion_lengths.size(); ++i)
        progress.num_tokens += scored.prompt_lengths[i] + scored.completion_lengths[i];
    if (c.logging.log_completions)
        log->write_completions(progress.global_step, rollout, scored, c.logging.num_completions_to_print);

    MicroBatch whole =
        pad_rollout(rollout, scored.local_advantages(), c.loss.mask_truncated_completions, sampling.pad_token_id);
    progress.generation_tokens = whole.loss_mask.sum().item<double>();
    if (group) progress.generation_tokens = group->sum(progress.generation_tokens);  // every rank's (dapo's normaliser)
    if (auto d = sampling_logprob_difference(rollout, whole, *model, c.generation.temperature, group)) {
        metrics["sampling/sampling_logp_difference/mean"] = d->mean;
        metrics["sampling/sampling_logp_difference/max"] = d->max;
    }
    const int64_t S = c.train.steps_per_generation;
    buffer = split_micro_batches(whole, S, uint64_t(c.train.seed) * 104729ull + uint64_t(progress.generation_index));
    // the correction compares the sampler with the trainer at generation: it always needs old log-probs (TRL)
    const bool correcting = c.loss.sampling_correction != SamplingCorrection::none;
    LogprobSources sources{model.get(), reference.get(),
                           correcting || c.train.gradient_accumulation_steps % (S * c.loss.num_iterations) != 0,
                           c.loss.beta != 0.0, c.generation.temperature};
    add_old_and_reference_logprobs(buffer, sources);
    for (const auto& [k, v] :
         add_sampling_ratios(buffer, c.loss.sampling_correction, c.loss.sampling_clip_min, c.loss.sampling_clip_max, group))
        metrics[k] = v;
    memory.close("logprobs", model->device());
    generations_this_step.push_back(std::move(metrics));
    ++progress.generation_index;
}

// A tool (an environment with stop strings) that no episode calls teaches nothing about the tool;
// after this many generation batches in a row, say so, once per such streak (the model may not
// know the call format).
constexpr int64_t kBatchesBeforeTheNoToolWarning = 10;

void Trainer::State::warn_when_the_tool_is_never_called(double call_frequency) {
    batches_without_tool_calls = call_frequency > 0 ? 0 : batches_without_tool_calls + 1;
    if (batches_without_tool_calls != kBatchesBeforeTheNoToolWarning || environment->stop_strings().empty() || !options.log ||
        options.rank != 0)
        return;
    std::string stops;
    for (const std::string& s : environment->stop_strings()) stops += (stops.empty() ? "\"" : ", \"") + s + "\"";
    *options.log << "grove: warning: no episode called the environment '" << config.environment.use->plugin << "' in "
                 << kBatchesBeforeTheNoToolWarning << " generation batches in a row (its stop strings: " << stops
                 << "). The model may not know the call format: show it in the prompt, or warm-start with grove sft "
                    "on reference episodes (docs/training.md#multi-turn-episodes-environment)\n";
}

// The reduction's counts for micro-batch `index` of the current generation batch.
ReductionCounts Trainer::State::reduction_counts(int64_t index) const {
    const int64_t A = config.train.gradient_accumulation_steps, S = config.train.steps_per_generation;
    // the tokens whose gradients accumulate into this optimizer step (the dapo normaliser)
    double window = 0;
    if (S >= A) {
        const int64_t first = index / A * A;
        for (int64_t w = first; w < first + A; ++w) window += buffer[size_t(w)].loss_mask.sum().item<double>();
        if (options.group) window = options.group->sum(window);  // every rank's share of the window
    } else {  // the window spans generation batches not generated yet: TRL #6024's estimate
        window = progress.generation_tokens * double(A) / double(S);
    }
    ReductionCounts counts;
    counts.gradient_accumulation_steps = uint32_t(A);
    counts.steps_per_generation = uint32_t(S);
    counts.world_size = uint32_t(options.world_size);
    counts.max_completion_length = uint32_t(config.generation.max_completion_length);
    counts.generation_batch_tokens = progress.generation_tokens;
    counts.generation_batch_sequences = double(config.train.generation_batch_size);
    counts.optimizer_window_tokens = window;
    return counts;
}

// What the objective and the host's loss options need for this step's micro-batches.
PolicyLossOptions Trainer::State::loss_options() const {
    const LossSection& l = config.loss;
    PolicyLossOptions o;
    o.beta = l.beta;
    o.epsilon = l.epsilon;
    o.epsilon_high = l.epsilon_high;
    o.delta = l.delta;
    o.importance_sampling_level = l.importance_sampling_level;
    o.use_bias_correction_kl = l.use_bias_correction_kl;
    o.top_entropy_quantile = l.top_entropy_quantile;
    o.off_policy_mask_threshold = l.off_policy_mask_threshold;
    o.entropy_bonus = l.entropy_coef != 0.0 || l.use_adaptive_entropy;
    o.entropy_coef = progress.entropy.applied(l);
    o.gradient_accumulation_steps = config.train.gradient_accumulation_steps;
    return o;
}

// The model as users load it: a Hugging Face folder (full) or an adapter folder (PEFT's layout).
void Trainer::State::export_model(const std::string& folder) const {
    if (adapter_host->trains_base_weights())
        model->save(folder);
    else
        save_adapter_checkpoint(folder, *model, *adapter_host, config.adapter, config.model.path);
    copy_tokenizer_files(config.model.path, folder);
}

// TRL's evaluation (eval_strategy = "steps"): the policy as it is now samples num_generations_eval
// completions of each held-out prompt, as `grove eval` would from a checkpoint of this step (the
// same batches and seeds; on CUDA, where sampling runs under the run's autocast, close rather than
// equal), and every rank takes its share of the batches. Sampling has generators of its own, so
// training goes on as it would without the evaluation.
std::map<std::string, double> Trainer::State::evaluate_held_out() {
    const auto start = Clock::now();
    AutocastScope autocast(autocast_device);
    adapter_host->set_training(false);
    EvaluationRequest request = evaluation_request(config);
    request.data_source = *config.data.eval_source;
    request.samples = config.train.num_generations_eval;
    request.step = progress.global_step;
    const LoadedEvaluator loaded{*model, *tokenizer, *rewards, environment.get()};
    std::map<std::string, double> metrics =
        evaluation_metrics(evaluate(loaded, request, options.group), loaded, request, options.group);
    metrics["eval_runtime"] = seconds_since(start);
    return metrics;
}

// Every reward column's name and weight, in the order scoring weighs them: the [[rewards]], then the
// environment's (scoring.cpp).
std::vector<std::pair<std::string, double>> Trainer::State::reward_columns() const {
    std::vector<std::pair<std::string, double>> columns;
    for (size_t i = 0; i < rewards->names().size(); ++i) columns.emplace_back(rewards->names()[i], rewards->weights()[i]);
    if (environment)
        for (const PluginUse& column : environment->reward_columns()) columns.emplace_back(column.name, column.weight);
    return columns;
}

CheckpointedState Trainer::State::checkpointed_state() {
    CheckpointedState state{progress, buffer, params, *optimizer, owners};
    if (reference) state.reference = reference->named_parameters();
    // a moved reference stays in every checkpoint, even once the sync is off, so later resumes keep it
    state.reference_moves = config.loss.sync_ref_model || reference_was_moved;
    return state;
}

// ---------------------------------------------------------------------------------------------
Trainer::Trainer(const Manifest& given, const TrainerOptions& options) {
    const Manifest manifest = manifest_to_resume(given, options.resume, options.rank == 0 ? options.log : nullptr);
    s_.reset(new State(manifest, options));
    // from here on SIGINT/SIGTERM ask for a stop (a checkpoint after the step in flight) instead of
    // killing the process mid-load; the destructor restores the previous handlers
    g_stop_requested = 0;
    s_->previous_sigint = std::signal(SIGINT, request_stop);
    s_->previous_sigterm = std::signal(SIGTERM, request_stop);
    const std::string& output = s_->config.output.dir;
    const RunStart start =
        run_start(output, s_->config.model.path, options.resume, options.overwrite, options.rank == 0 ? options.log : nullptr);
    const std::optional<std::string>& resume_from = start.resume_from;
    if (options.group) options.group->barrier();  // every rank has looked before rank 0 clears anything
    if (options.rank == 0) prepare_output_folder(output, start.clear);
    if (options.group) options.group->barrier();
    State& s = *s_;
    s.load();
    s.checkpoints = std::make_unique<Checkpoints>(output, options.rank, options.world_size, options.group,
                                                  manifest.resolved_toml(true), s.reward_columns());
    if (resume_from) {
        CheckpointedState state = s.checkpointed_state();
        s.checkpoints->restore(*resume_from, state);
        s.checkpoints->warn_of_changed_settings(*resume_from, options.rank == 0 ? options.log : nullptr);
        s.reference_was_moved = state.reference_restored;
        if (state.reference_restored && !s.config.loss.sync_ref_model && options.rank == 0 && options.log)
            *options.log << "grove: note: " << *resume_from
                         << " holds the reference that loss.sync_ref_model moved; the run keeps it, fixed from here on "
                            "(set loss.sync_ref_model = true to go on moving it)\n";
        s.prompts->restore(s.progress.sampler);
        // only adaptive control carries its coefficient across a resume (TRL); a static one is the manifest's
        if (!s.config.loss.use_adaptive_entropy) s.progress.entropy = EntropyControl{s.config.loss.entropy_coef};
    }
    // a resume drops what the logs hold after its step (all of it when it starts from step 0)
    std::optional<RunLog::Resume> log_resume;
    if (options.resume)
        log_resume = RunLog::Resume{s.progress.global_step,
                                    s.progress.global_step == 0 ? std::optional<int64_t>(0) : s.progress.rollouts_bytes};
    s.log = std::make_unique<RunLog>(output, options.rank == 0, log_resume,
                                     RunLog::Files{s.config.logging.save_rollouts, s.config.logging.tensorboard});
    test_kill_point("startup", s.progress.global_step);
}

Trainer::~Trainer() {
    std::signal(SIGINT, s_->previous_sigint);
    std::signal(SIGTERM, s_->previous_sigterm);
}
int64_t Trainer::global_step() const { return s_->progress.global_step; }
int64_t Trainer::total_steps() const { return s_->total; }
bool Trainer::has_reference_model() const { return s_->reference != nullptr; }
Model& Trainer::model() { return *s_->model; }

std::map<std::string, double> Trainer::step() {
    State& s = *s_;
    const RunConfig& c = s.config;
    TrainingProgress& p = s.progress;
    ProcessGroup* group = s.options.group;
    auto t0 = Clock::now();
    s.generate_seconds = s.reward_seconds = 0;
    s.generations_this_step.clear();
    s.memory.start_step();
    const PolicyLossOptions loss_options = s.loss_options();
    const int64_t S = c.train.steps_per_generation;
    double train_seconds = 0, loss_sum = 0, bad_loss = 0.0;   // bad_loss: a non-finite micro-batch loss, if any
    double trained_entropy_sum = 0, trained_token_count = 0;  // adaptive entropy's window
    int64_t bad_micro_step = -1;
    StepMetrics step_metrics;
    seed_step_randomness(c.train.seed, p.global_step);
    for (int64_t a = 0; a < c.train.gradient_accumulation_steps; ++a) {
        if (p.micro_step % (S * c.loss.num_iterations) == 0 || s.buffer.empty()) {
            s.memory.close("train", s.model->device());  // micro-batches already trained this step (or a checkpoint)
            s.make_generation_batch();
        }
        auto t1 = Clock::now();
        const int64_t index = p.micro_step % S;
        s.adapter_host->set_training(!c.model.disable_dropout);  // dropout (the adapter's) only while training
        MicroStepResult r;
        try {
            const ReductionCounts counts = s.reduction_counts(index);
            r = train_micro_batch(*s.model, s.buffer[size_t(index)],
                                  {*s.reduction, counts, *s.objective, loss_options, c.generation.temperature,
                                   s.autocast_device, group, s.router_aux_loss_coef});
        } catch (const Error& e) {  // which update failed; the last checkpoint on disk is untouched
            throw Error(e.kind(), "optimizer step " + std::to_string(p.global_step + 1) + ", micro-batch " +
                                      std::to_string(a + 1) + " of " + std::to_string(c.train.gradient_accumulation_steps) +
                                      ": " + e.what());
        }
        if (!std::isfinite(r.loss)) {  // reported after the loop, when every rank knows (they must not part ways)
            if (std::isfinite(bad_loss)) bad_loss = r.loss, bad_micro_step = p.micro_step;
        } else {
            loss_sum += r.loss;
            step_metrics.add(r.metrics);
            trained_entropy_sum += r.trained_entropy_sum;
            trained_token_count += r.trained_token_count;
        }
        ++p.micro_step;
        train_seconds += seconds_since(t1);
    }
    test_kill_point("step", p.global_step + 1);  // gradients accumulated, no update applied yet
    auto t2 = Clock::now();
    double any_bad = std::isfinite(bad_loss) ? 0.0 : 1.0;
    if (group) any_bad = group->max(any_bad);
    if (any_bad != 0.0)
        throw Error(ErrorKind::runtime, "the loss became " +
                                            (std::isfinite(bad_loss) ? std::string("non-finite on another rank")
                                                                     : std::to_string(bad_loss) + " (micro-step " +
                                                                           std::to_string(bad_micro_step) + ")") +
                                            " at step " + std::to_string(p.global_step + 1) +
                                            "; no update was applied. "
                                            "Lower train.learning_rate or set train.max_grad_norm; the last checkpoint in " +
                                            c.output.dir + " is intact");
    if (group) {  // DDP: the mean of the ranks' gradients (the reductions already count every rank's tokens)
        // a tensor no rank reached (an expert) keeps no gradient, as under torch's DDP with
        // find_unused_parameters (Trainer's default), so the optimizer leaves it alone
        std::vector<float> reached_here(s.params.size(), 0.0f);
        std::vector<at::Tensor> grads;
        for (size_t i = 0; i < s.params.size(); ++i) {
            at::Tensor& param = s.params[i];
            if (param.grad().defined())
                reached_here[i] = 1.0f;
            else
                param.mutable_grad() = at::zeros_like(param);
            grads.push_back(param.grad());
        }
        std::vector<at::Tensor> reached{at::tensor(reached_here)};
        group->all_reduce_max(reached);
        group->all_reduce_sum(grads);
        for (at::Tensor& g : grads) g.div_(double(group->world_size()));
        const auto* reached_by = reached[0].data_ptr<float>();
        for (size_t i = 0; i < s.params.size(); ++i)
            if (reached_by[i] == 0.0f) s.params[i].mutable_grad().reset();
        loss_sum = group->sum(loss_sum) / double(group->world_size());  // TRL logs the loss averaged over ranks
    }
    // global gradient norm before clipping (what HF logs), then clip
    const double grad_norm = s.optimizer->clip_grad_norm(c.train.max_grad_norm);
    if (!std::isfinite(grad_norm))
        throw Error(ErrorKind::runtime, "the gradient norm became " + std::to_string(grad_norm) + " at step " +
                                            std::to_string(p.global_step + 1) +
                                            "; no update was applied; the last checkpoint in " + c.output.dir + " is intact");
    const double lr = s.schedule.rate(p.global_step);
    s.optimizer->step(lr);
    s.optimizer->zero_grad();
    if (!s.owners.empty()) {  // ZeRO stage 1: each rank updated its share; everyone gets every tensor
        at::NoGradGuard no_grad;
        group->broadcast_from_owners(s.params, s.owners);
    }
    ++p.global_step;
    if (c.loss.sync_ref_model && p.global_step % c.loss.ref_model_sync_steps == 0)
        move_reference_toward_policy(*s.reference, *s.model, c.loss.ref_model_mixup_alpha);
    if (c.loss.use_adaptive_entropy) {  // the window's entropy over every rank decides the next step's coefficient
        if (group) trained_entropy_sum = group->sum(trained_entropy_sum), trained_token_count = group->sum(trained_token_count);
        p.entropy.finish_step(trained_entropy_sum / std::max(trained_token_count, 1.0), c.loss);
    }
    train_seconds += seconds_since(t2);

    // generation-side metrics only on steps that generated (TRL logs what was appended since the last log)
    std::map<std::string, double> metrics = mean_per_key(s.generations_this_step);
    for (const auto& [k, v] : step_metrics.finish(group)) metrics[k] = v;
    metrics["loss"] = loss_sum;
    if (loss_options.entropy_bonus) metrics["entropy_coef"] = p.entropy.coef;  // as TRL: after the update
    metrics["grad_norm"] = grad_norm;
    metrics["learning_rate"] = lr;
    metrics["num_tokens"] = double(p.num_tokens);
    metrics["step_time"] = seconds_since(t0);
    metrics["step_time/generate"] = s.generate_seconds;
    metrics["step_time/reward"] = s.reward_seconds;
    metrics["step_time/train"] = train_seconds;
    s.memory.close("train", s.model->device());
    s.memory.add_to(metrics);
    metrics["epoch"] = s.prompts->epoch_progress();
    if (c.train.eval.due(p.global_step, s.total, s.steps_per_epoch))
        for (const auto& [key, value] : s.evaluate_held_out()) metrics[key] = value;
    return metrics;
}

std::string Trainer::save_checkpoint(bool model_only) {
    State& s = *s_;
    CheckpointedState state = s.checkpointed_state();
    s.progress.rollouts_bytes = s.log->rollouts_bytes();
    return s.checkpoints->save(
        state, s.inside_generation_batch(), s.config.manifest_path, [&](const std::string& folder) { s.export_model(folder); },
        s.config.output.save_total_limit, model_only);
}

int64_t Trainer::run() {
    State& s = *s_;
    const RunConfig& c = s.config;
    int64_t ran = 0;
    bool stopped_early = false;  // train.early_stopping_patience ended the run
    std::optional<double> first_reward, last_reward;
    auto start = Clock::now();
    if (c.train.eval_on_start && s.progress.global_step == 0) {  // the starting point, as a line of step 0
        const auto metrics = s.evaluate_held_out();
        s.log->write_metrics(0, metrics);
        if (s.options.log && s.options.rank == 0 && metrics.count("eval_reward"))
            *s.options.log << "grove: before training, eval_reward " << metrics.at("eval_reward") << "\n";
    }
    while (s.progress.global_step < s.total) {
        // a signal before this run's first step leaves nothing new to save (one process; ranks
        // agree on stopping after a step, below)
        if (g_stop_requested && !s.options.group && ran == 0) break;
        auto metrics = step();
        ++ran;
        s.log->write_metrics(s.progress.global_step, metrics);
        auto reward = metrics.find("reward");
        if (reward != metrics.end()) {
            if (!first_reward) first_reward = reward->second;
            last_reward = reward->second;
        }
        if (s.options.log && s.options.rank == 0) print_progress(metrics, ran, seconds_since(start));
        bool stop = g_stop_requested != 0;
        if (s.options.group) stop = s.options.group->max(stop ? 1.0 : 0.0) != 0.0;  // all ranks stop at the same step
        // every rank has the same evaluation metrics, so every rank finds the same best and stops with the others
        const EvaluationOutcome evaluation =
            c.train.eval.due(s.progress.global_step, s.total, s.steps_per_epoch)
                ? record_evaluation(c.train.best_model, metrics, s.progress.global_step, s.progress.best)
                : EvaluationOutcome{};
        stopped_early = evaluation.stop_early;
        // the run's last checkpoint stays whole, so that it can always be resumed (or extended)
        const bool last = s.progress.global_step == s.total || stop || stopped_early;
        if (last || checkpoint_due(c.output, s.progress.global_step, s.total, s.steps_per_epoch, evaluation.new_best)) {
            std::string dir = save_checkpoint(c.output.save_only_model && !last);
            if (s.options.log && stop && s.options.rank == 0)
                *s.options.log << "grove: stopped by signal; checkpoint written to " << dir << "\n";
        }
        if (stopped_early && s.options.log && s.options.rank == 0)
            *s.options.log << early_stopping_note(c.train.best_model, s.progress.best, s.progress.global_step, s.total);
        if (stop || stopped_early) break;
    }
    s.stop_signal = int(g_stop_requested);
    // load_best_model_at_end: the best checkpoint's model beside the checkpoints, as TRL's save_model() writes it
    if ((s.progress.global_step == s.total || stopped_early) && s.options.rank == 0)
        s.checkpoints->write_best_model(c.train.best_model, s.progress.best, s.options.log);
    if (s.options.log && ran > 0 && s.options.rank == 0) {
        if (s.options.progress_bar && s.progress.global_step != s.total) *s.options.log << "\n";
        const double elapsed = seconds_since(start);
        std::ostringstream os;
        os << std::fixed << "grove: " << ran << " steps in " << std::setprecision(1) << elapsed << " s ("
           << std::setprecision(2) << elapsed / double(ran) << " s/step); reward " << std::setprecision(4)
           << first_reward.value_or(NAN) << " at the first step of this run, " << last_reward.value_or(NAN)
           << " at the last; step " << s.progress.global_step << "/" << s.total << "; metrics in " << c.output.dir
           << "/metrics.jsonl";
        *s.options.log << os.str() << "\n";
    }
    return ran;
}

int Trainer::stop_signal() const { return s_->stop_signal; }

void Trainer::print_progress(const std::map<std::string, double>& metrics, int64_t ran, double elapsed) const {
    const State& s = *s_;
    const int64_t step = s.progress.global_step, total = s.total;
    const double eta = elapsed / double(ran) * double(total - step);
    auto value = [&](const char* key) {
        auto it = metrics.find(key);
        return it == metrics.end() ? NAN : it->second;
    };
    std::ostringstream os;
    os << std::fixed << std::setprecision(4) << "loss " << value("loss");
    if (metrics.count("reward")) os << "  reward " << value("reward");  // steps that generated
    if (metrics.count("eval_reward")) os << "  eval_reward " << value("eval_reward");
    os << "  grad_norm " << value("grad_norm") << "  lr " << std::scientific << std::setprecision(2) << value("learning_rate")
       << std::fixed << std::setprecision(2) << "  " << value("step_time") << " s/step";
    std::ostream& out = *s.options.log;
    if (s.options.progress_bar) {  // one line redrawn in place on a terminal
        const int width = 24, done = int(double(width) * double(step) / double(std::max<int64_t>(1, total)));
        out << "\r[" << std::string(size_t(done), '#') << std::string(size_t(width - done), '.') << "] " << step << "/" << total
            << "  " << os.str() << "  eta " << int64_t(eta) << " s   " << (step == total ? "\n" : "") << std::flush;
    } else if (const Interval& lines = s.config.logging.progress_lines;
               lines.strategy != IntervalStrategy::no && (lines.due(step, total, s.steps_per_epoch) || step == total)) {
        out << "step " << step << "/" << total << "  " << os.str() << "  eta " << int64_t(eta) << " s\n" << std::flush;
    }
}

}  // namespace grove
