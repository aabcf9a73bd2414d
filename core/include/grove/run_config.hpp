// The run's configuration as typed structs, built once from a validated manifest (one struct per
// manifest section, enums for closed choices). train, sft and eval read these instead of looking
// values up by string key; `Manifest` stays the parser, validator and resolved-TOML printer.
// Adding a manifest key: its schema entry (config/manifest_schema.cpp), a field here, one line in
// RunConfig::from (config/run_config.cpp); a test fails while a schema key is read nowhere.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "grove/beside_adapter.hpp"
#include "grove/manifest.hpp"
#include "grove/model_config.hpp"

namespace grove {

enum class ChatTemplate;
struct TokenizerConfig;

enum class ImportanceSamplingLevel { token, sequence };
// TRL's vllm_importance_sampling_mode, plus none (off)
enum class SamplingCorrection { none, token_truncate, token_mask, sequence_truncate, sequence_mask };
enum class ScaleRewards { group, batch, none };
enum class RewardAggregation { sum_then_normalize, normalize_then_sum };
// transformers' lr_scheduler_type names; constant has no warmup there, constant_with_warmup has
enum class LrSchedule {
    linear,
    cosine,
    constant,
    constant_with_warmup,
    cosine_with_min_lr,
    cosine_with_restarts,
    polynomial,
    inverse_sqrt,
    warmup_stable_decay,
    cosine_warmup_with_min_lr
};
// the curve of warmup_stable_decay's warmup and of its decay (transformers' warmup_type, decay_type)
enum class WsdCurve { linear, cosine, one_minus_sqrt };
// transformers' lr_scheduler_kwargs, each an option of the schedule named beside it
struct LrSchedulerOptions {
    // cosine_with_min_lr, cosine_warmup_with_min_lr: the floor, as a fraction of learning_rate
    // (required there, 0 allowed, as transformers requires it)
    std::optional<double> min_lr_rate;
    int64_t num_cycles = 1;             // cosine_with_restarts: how many cosines (hard restarts) fill the decay
    double lr_end = 1e-7, power = 1.0;  // polynomial: decays to lr_end (a rate, not a fraction) as (1 - progress)^power
    // cosine_warmup_with_min_lr: the warmup's first rate, as a fraction; unset = 1 / warmup steps
    std::optional<double> warmup_lr_rate;
    // warmup_stable_decay: warmup, then the peak for num_stable_steps (unset: what the warmup and the
    // decay leave of the run), then num_decay_steps of decay; both curves run between min_lr_ratio
    // and 1, and after the decay the rate stays at min_lr_ratio
    std::optional<int64_t> num_decay_steps, num_stable_steps;
    WsdCurve warmup_type = WsdCurve::linear, decay_type = WsdCurve::cosine;
    double min_lr_ratio = 0.0;
};
enum class MixedPrecision { automatic, bf16, off };  // "auto" | "bf16" | "no"
enum class DdpBackend { automatic, gloo, nccl };     // "auto" | "gloo" | "nccl"
// train.optim: "adamw_torch" and "adamw_torch_fused" (the same update) | "adafactor" (transformers'
// Adafactor as Trainer sets it up: the given learning rate, no momentum, factored second moments)
enum class OptimizerKind { adamw, adafactor };

struct ModelSection {
    std::string path, dtype, device, chat_template;
    std::string revision;         // model.revision: where path was a Hub id, the cached revision path now holds
    bool enable_thinking = true;  // false: Qwen3's enable_thinking=False
    bool cast_lm_head_to_fp32 = false;
    bool disable_dropout = false;
    bool gradient_checkpointing = false;
};

struct DataSection {
    std::optional<std::string> source, eval_source;
    std::string prompt_column, completion_column, text_column;
    bool shuffle = true;
};

struct GenerationSection {
    int64_t num_generations = 8, max_completion_length = 512, top_k = 0;
    double temperature = 1.0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0;
    bool cuda_graphs = true;
    bool split_attention = true;    // SamplingOptions::split_attention
    bool dynamic_sampling = false;  // DAPO's filter groups
    int64_t dynamic_sampling_max_rounds = 10;
};

struct LossSection {
    double beta = 0.0, epsilon = 0.2, epsilon_high = 0.2;
    std::optional<double> delta;
    ImportanceSamplingLevel importance_sampling_level = ImportanceSamplingLevel::token;
    int64_t num_iterations = 1;
    ScaleRewards scale_rewards = ScaleRewards::group;
    RewardAggregation aggregation = RewardAggregation::sum_then_normalize;
    bool use_bias_correction_kl = false, mask_truncated_completions = false;
    // TR-DPO: every ref_model_sync_steps optimizer steps, ref = alpha * policy + (1 - alpha) * ref
    bool sync_ref_model = false;
    double ref_model_mixup_alpha = 0.6;
    int64_t ref_model_sync_steps = 512;
    // options the host applies to the policy term (docs/objectives.md#options-the-host-applies)
    double top_entropy_quantile = 1.0;
    double entropy_coef = 0.0;
    bool use_adaptive_entropy = false;
    double entropy_coef_min = 0.0, entropy_coef_max = 1.0, entropy_coef_delta = 0.005, entropy_target = 0.2;
    std::optional<double> off_policy_mask_threshold;
    // mixtures of experts: the load-balancing loss's weight; unset: the checkpoint's (TRL's None)
    std::optional<double> router_aux_loss_coef;
    SamplingCorrection sampling_correction = SamplingCorrection::none;
    std::optional<double> sampling_clip_min, sampling_clip_max;
};

// TrainingArguments' save_strategy, eval_strategy and logging_strategy: "no" | "steps" | "epoch", and
// for save_strategy alone "best" (after an evaluation that improves train.metric_for_best_model)
enum class IntervalStrategy { no, steps, epoch, best };

// When a run saves, evaluates or prints: every `steps` optimizer steps (below 1: that fraction of the
// run's steps, rounded up, as transformers reads save_steps, eval_steps and logging_steps), at the
// end of each epoch, or never ("best" is never due here: an evaluation decides).
struct Interval {
    IntervalStrategy strategy = IntervalStrategy::no;
    double steps = 0;
    // whether optimizer step `step` (1-based) is one, in a run of `total` steps of which
    // `steps_per_epoch` make an epoch
    bool due(int64_t step, int64_t total, double steps_per_epoch) const;
};

// TrainingArguments' metric_for_best_model, greater_is_better and load_best_model_at_end: which
// evaluation is the best so far, whose checkpoint save_total_limit never deletes (docs/training.md#the-best-checkpoint)
struct BestModelSettings {
    std::optional<std::string> metric;  // as the evaluation names it ("eval_reward"); unset: none tracked
    bool greater_is_better = false;
    bool load_at_end = false;  // the run's model is the best checkpoint's
    // transformers' EarlyStoppingCallback: stop after this many evaluations in a row that did not
    // improve on the best by more than the threshold; unset: never
    std::optional<int64_t> early_stopping_patience;
    double early_stopping_threshold = 0;
};

struct TrainSection {
    // batching, resolved by the manifest (docs/grpo.md#batching-and-grouping)
    int64_t per_device_train_batch_size = 8, gradient_accumulation_steps = 1, generation_batch_size = 8,
            steps_per_generation = 1;
    double learning_rate = 1e-6;
    OptimizerKind optim = OptimizerKind::adamw;
    LrSchedule lr_scheduler_type = LrSchedule::linear;
    int64_t warmup_steps = 0;
    LrSchedulerOptions lr_scheduler_kwargs;
    double warmup_ratio = 0.0, weight_decay = 0.0, adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8,
           max_grad_norm = 1.0;
    int64_t max_steps = -1;
    double num_train_epochs = 1.0;
    int64_t seed = 42;
    MixedPrecision mixed_precision = MixedPrecision::automatic;
    DdpBackend ddp_backend = DdpBackend::automatic;  // several processes: how they exchange tensors
    int64_t ddp_timeout = 1800;                      // and how long a rank waits for the others (seconds)
    bool shard_optimizer_state = false;              // several processes: ZeRO stage 1
    Interval eval;                                   // evaluate on data.eval_source (default: never)
    bool eval_on_start = false;                      // and before the first step (a step-0 line)
    int64_t per_device_eval_batch_size = 8;          // grove sft's evaluation batches
    int64_t num_generations_eval = 8;                // completions per held-out prompt (resolved)
    BestModelSettings best_model;
};

struct OutputSection {
    std::string dir;
    Interval save{IntervalStrategy::steps, 500};  // a run also saves at its end and when stopped by a signal
    std::optional<int64_t> save_total_limit;
    bool save_only_model = false;  // checkpoints during the run without what a resume needs
};

struct LoggingSection {
    Interval progress_lines{IntervalStrategy::steps, 10};  // metrics.jsonl gets every step
    bool log_completions = false, save_rollouts = false;
    bool tensorboard = false;  // report_to = "tensorboard"
    std::optional<int64_t> num_completions_to_print;
};

// grove sft's data preparation (TRL's SFTConfig options of the same names)
struct SftSection {
    int64_t max_length = 1024;  // 0 = no limit
    bool keep_end = false;      // truncation_mode = "keep_end"
    bool completion_only_loss = true;
    bool assistant_only_loss = false;
    bool packing = false;
    std::string packing_strategy = "bfd";  // bfd | bfd_split | wrapped
    bool padding_free = false;
    bool dft = false;                  // loss_type = "dft": each token's -log p weighted by its probability p
    double neftune_noise_alpha = 0.0;  // 0: no NEFTune noise
    bool eval_packing = false;         // the held-out examples packed (unset in the manifest: as packing)
};

// [environment] reward_weight / reward_name: whether and how the environment's judgement of whole
// episodes is a reward column. Unset, the plugin decides (SDK episode_reward; TRL's get_reward()
// is one with weight 1, named after its class); make_environment resolves the column.
struct EnvironmentRewardSettings {
    std::optional<double> weight;
    std::optional<std::string> name;
};

// [environment] max_turns unset: an episode goes on until the environment stops answering or its
// token budget is spent, as with TRL's max_tool_calling_iterations = None
inline constexpr int64_t kNoTurnLimit = std::numeric_limits<int64_t>::max();

struct EnvironmentSection {
    std::optional<PluginUse> use;  // unset: single-turn completions
    int64_t max_turns = kNoTurnLimit;
    EnvironmentRewardSettings reward;
};

struct RunConfig {
    std::string manifest_path;
    std::vector<std::string> plugin_dirs;
    ModelSection model;
    DataSection data;
    GenerationSection generation;
    LossSection loss;
    TrainSection train;
    SftSection sft;
    std::optional<std::string> rollouts_path;
    OutputSection output;
    LoggingSection logging;
    std::vector<PluginUse> rewards;
    PluginUse adapter, reduction, objective;
    BesideAdapter beside_adapter;  // [adapter] modules_to_save, ensure_weight_tying, trainable_token_indices
    EnvironmentSection environment;
    int world_size = 1;

    // `kind` picks the defaults TRL's GRPOConfig and SFTConfig set differently (learning_rate).
    enum class Kind { grpo, sft };
    static RunConfig from(const Manifest& manifest, Kind kind = Kind::grpo);
    // The rules that need the adapter plugin: loss.sync_ref_model moves a reference model apart from
    // the policy, so an adapter that keeps the base model as its reference (LoRA) is refused, naming
    // [adapter]; so is training beside an adapter (modules_to_save, ...) with one that trains every base weight already. `grove train` and `grove check` both call it.
    void check_adapter(const std::string& adapter_name, bool trains_base_weights) const;
    // model.chat_template resolved against the checkpoint's tokenizer_config.json, with
    // model.enable_thinking; a switch the template lacks is a manifest error naming the file.
    ChatTemplate chat_template(const TokenizerConfig& tokenizer) const;
    // train.mixed_precision resolved: bf16 autocast for "bf16", and for "auto" on CUDA.
    bool bf16_autocast(bool on_cuda) const {
        return train.mixed_precision == MixedPrecision::bf16 || (train.mixed_precision == MixedPrecision::automatic && on_cuda);
    }
    // TRL's router_aux_loss_coef for this checkpoint: unset takes the config's; set (non-zero) for a
    // model without experts is a manifest error, there being no load-balancing loss to weight.
    double router_aux_loss_coef_for(const ModelConfig& model) const;
};

// The manifest's names of the enums (the schema's choices); a name outside them throws
// std::invalid_argument naming the valid ones.
ImportanceSamplingLevel importance_sampling_level_from_name(const std::string& name);
SamplingCorrection sampling_correction_from_name(const std::string& name);
ScaleRewards scale_rewards_from_name(const std::string& name);
RewardAggregation reward_aggregation_from_name(const std::string& name);
LrSchedule lr_schedule_from_name(const std::string& name);
MixedPrecision mixed_precision_from_name(const std::string& name);
OptimizerKind optimizer_from_name(const std::string& name);
// "adamw" | "adafactor": what a checkpoint records of the optimizer whose state it holds
const char* optimizer_name(OptimizerKind kind);
// the train.optim values that choose optimizer_name `name`: train.optim = "adamw_torch" or "adamw_torch_fused"
std::string optimizer_settings_text(const std::string& name);
DdpBackend ddp_backend_from_name(const std::string& name);

// A GRPO run's "no reward" error, after `where` (the manifest, or its environment and why it is no reward).
std::string no_reward_message(const std::string& where);

}  // namespace grove
