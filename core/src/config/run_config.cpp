#include "grove/run_config.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "grove/error.hpp"
#include "grove/tokenizer.hpp"

namespace grove {

namespace {
template <typename Enum>
Enum enum_from(const std::string& text, std::initializer_list<std::pair<const char*, Enum>> names) {
    std::string valid;
    for (const auto& [name, value] : names) {
        if (text == name) return value;
        valid += std::string(valid.empty() ? "" : ", ") + name;
    }
    throw std::invalid_argument("'" + text + "' is not one of " + valid);
}

IntervalStrategy interval_strategy_from_name(const std::string& name) {
    return enum_from<IntervalStrategy>(
        name, {{"no", IntervalStrategy::no}, {"steps", IntervalStrategy::steps}, {"epoch", IntervalStrategy::epoch}});
}

IntervalStrategy save_strategy_from_name(const std::string& name) {
    return enum_from<IntervalStrategy>(name, {{"no", IntervalStrategy::no},
                                              {"steps", IntervalStrategy::steps},
                                              {"epoch", IntervalStrategy::epoch},
                                              {"best", IntervalStrategy::best}});
}

std::string number_text(double value) {
    std::ostringstream text;
    text << value;
    return text.str();
}

// save_steps, eval_steps, logging_steps: a whole number of steps, or a fraction below 1 of the run's
double interval_steps(const Manifest& m, const std::string& key, const std::string& manifest_path) {
    const double steps = m.number(key);
    if (steps >= 1 && steps != std::floor(steps)) {
        throw Error(ErrorKind::manifest, manifest_path + ": " + key + " = " + number_text(steps) +
                                             " is neither a whole number of optimizer steps nor a fraction below 1 of "
                                             "the run's steps (as transformers reads it): write e.g. " +
                                             std::to_string(int64_t(steps)) + " or 0.25");
    }
    return steps;
}

// train.eval_strategy unset: "steps" when eval_steps is set, else "no". Under "steps", eval_steps
// unset (0) means logging_steps, as transformers reads eval_steps = None; it means nothing under the others.
Interval evaluation_interval(const Manifest& m, const std::string& manifest_path) {
    const double eval_steps = interval_steps(m, "train.eval_steps", manifest_path);
    const std::optional<std::string> named = m.optional_string("train.eval_strategy");
    const IntervalStrategy strategy =
        named ? interval_strategy_from_name(*named) : (eval_steps > 0 ? IntervalStrategy::steps : IntervalStrategy::no);
    if (strategy != IntervalStrategy::steps && eval_steps > 0)
        throw Error(ErrorKind::manifest, manifest_path + ": train.eval_steps is the interval of train.eval_strategy = " +
                                             "\"steps\", and this manifest has eval_strategy = \"" + *named +
                                             "\": remove eval_steps, or set eval_strategy = \"steps\"");
    return {strategy, eval_steps > 0 ? eval_steps : interval_steps(m, "logging.logging_steps", manifest_path)};
}

// load_best_model_at_end loads the checkpoint of an evaluation, so (save_strategy = "best" aside) every
// checkpoint must be at one: the same strategy, and save_steps a multiple of eval_steps, as transformers requires.
void check_saves_follow_evaluations(const Interval& save, const Interval& eval, const std::string& manifest_path) {
    auto name = [](IntervalStrategy s) {
        return std::string(s == IntervalStrategy::steps ? "steps" : s == IntervalStrategy::epoch ? "epoch" : "no");
    };
    if (save.strategy != eval.strategy)
        throw Error(ErrorKind::manifest, manifest_path +
                                             ": train.load_best_model_at_end loads the checkpoint of the best "
                                             "evaluation, so checkpoints must be written at evaluations: "
                                             "output.save_strategy is \"" +
                                             name(save.strategy) + "\" and train.eval_strategy \"" + name(eval.strategy) +
                                             "\"; make them equal, or set output.save_strategy = \"best\"");
    if (save.strategy != IntervalStrategy::steps) return;
    const bool save_fraction = save.steps < 1, eval_fraction = eval.steps < 1;
    // transformers' test, as it writes it: two fractions are compared again in millionths, to forgive
    // their rounding; a fraction and a whole number must divide exactly
    const bool multiple = std::fmod(save.steps, eval.steps) == 0 ||
                          (save_fraction && eval_fraction && std::fmod(save.steps * 1e6, eval.steps * 1e6) == 0);
    if (!multiple)
        throw Error(ErrorKind::manifest, manifest_path +
                                             ": train.load_best_model_at_end loads a checkpoint written at an "
                                             "evaluation, so every checkpoint must be at one: output.save_steps = " +
                                             number_text(save.steps) +
                                             " is not a multiple of train.eval_steps = " + number_text(eval.steps) +
                                             (save_fraction != eval_fraction ? " (one is a fraction of the run, the other "
                                                                               "a number of steps)"
                                                                             : "") +
                                             "; set save_steps to a multiple of eval_steps, or output.save_strategy = "
                                             "\"best\"");
}

// train.metric_for_best_model (with or without its "eval_"; "loss" when only load_best_model_at_end is
// set), greater_is_better (unset: true unless the name ends in "loss"), load_best_model_at_end, and
// what they and output.save_strategy = "best" need: evaluations, and checkpoints where they are.
BestModelSettings best_model_settings(const Manifest& m, const RunConfig& c) {
    BestModelSettings b;
    b.load_at_end = m.boolean("train.load_best_model_at_end");
    std::optional<std::string> metric = m.optional_string("train.metric_for_best_model");
    const std::optional<bool> greater = m.optional_boolean("train.greater_is_better");
    const bool save_best = c.output.save.strategy == IntervalStrategy::best;
    if (!metric && b.load_at_end) metric = "loss";  // transformers' default
    if (!metric && save_best)
        throw Error(ErrorKind::manifest, c.manifest_path +
                                             ": output.save_strategy = \"best\" saves after an evaluation that "
                                             "improves train.metric_for_best_model, which is unset: set it, "
                                             "e.g. \"reward\" (grove train) or \"loss\" (grove sft)");
    if (!metric && greater)
        throw Error(ErrorKind::manifest, c.manifest_path +
                                             ": train.greater_is_better says which way "
                                             "train.metric_for_best_model improves, which is unset: set it, "
                                             "or remove greater_is_better");
    b.early_stopping_patience = m.optional_integer("train.early_stopping_patience");
    b.early_stopping_threshold = m.number("train.early_stopping_threshold");
    if (!metric && b.early_stopping_patience)  // EarlyStoppingCallback asserts it too
        throw Error(ErrorKind::manifest, c.manifest_path +
                                             ": train.early_stopping_patience stops the run when "
                                             "train.metric_for_best_model stops improving, which is unset: set it, "
                                             "e.g. \"reward\" (grove train) or \"loss\" (grove sft)");
    if (b.early_stopping_threshold != 0 && !b.early_stopping_patience)
        throw Error(ErrorKind::manifest, c.manifest_path +
                                             ": train.early_stopping_threshold is the least improvement that early "
                                             "stopping counts, and train.early_stopping_patience is unset: set it, "
                                             "or remove the threshold");
    if (!metric) return b;
    if (c.train.eval.strategy == IntervalStrategy::no)
        throw Error(ErrorKind::manifest,
                    c.manifest_path + ": " +
                        (save_best       ? std::string("output.save_strategy = \"best\"")
                         : b.load_at_end ? std::string("train.load_best_model_at_end")
                                         : "train.metric_for_best_model = \"" + *metric + "\"") +
                        " compares evaluations, and this run never evaluates: set train.eval_strategy (\"steps\" with "
                        "eval_steps, or \"epoch\") and data.eval_source");
    if (b.load_at_end && !save_best) check_saves_follow_evaluations(c.output.save, c.train.eval, c.manifest_path);
    b.greater_is_better = greater.value_or(!(metric->size() >= 4 && metric->compare(metric->size() - 4, 4, "loss") == 0));
    b.metric = metric->rfind("eval_", 0) == 0 ? *metric : "eval_" + *metric;
    return b;
}

// Each lr_scheduler_kwargs key belongs to its schedules: set with another it would do nothing, so it is
// refused; the min_lr schedules need their floor, warmup_stable_decay its decay's length, and
// polynomial must decay (transformers raises too).
void check_lr_scheduler_kwargs(const TrainSection& t, const std::string& manifest) {
    const LrSchedulerOptions& o = t.lr_scheduler_kwargs;
    const LrSchedulerOptions defaults;
    const LrSchedule schedule = t.lr_scheduler_type;
    const bool min_lr_schedule =
        schedule == LrSchedule::cosine_with_min_lr || schedule == LrSchedule::cosine_warmup_with_min_lr;
    const bool wsd = schedule == LrSchedule::warmup_stable_decay;
    if (!o.min_lr_rate && min_lr_schedule)  // transformers raises without it too
        throw Error(ErrorKind::manifest,
                    manifest + ": train.lr_scheduler_type = \"" +
                        (schedule == LrSchedule::cosine_with_min_lr
                             ? "cosine_with_min_lr\" decays to train.min_lr_rate, which is unset: set it (e.g. 0.1), or "
                               "use \"cosine\", which decays to 0"
                             : "cosine_warmup_with_min_lr\" decays to train.min_lr_rate, which is unset: set it (e.g. "
                               "0.1, or 0 to decay to 0)"));
    if (wsd && !o.num_decay_steps)
        throw Error(ErrorKind::manifest, manifest +
                                             ": train.lr_scheduler_type = \"warmup_stable_decay\" needs "
                                             "train.num_decay_steps, the length of its decay (transformers' "
                                             "lr_scheduler_kwargs require it too): set it, e.g. num_decay_steps = 100");
    const struct {
        const char* key;
        bool set;
        bool owned;  // by the schedule in use
        const char* owner_names;
    } options[] = {
        {"min_lr_rate", o.min_lr_rate.has_value(), min_lr_schedule, "\"cosine_with_min_lr\" and \"cosine_warmup_with_min_lr\""},
        {"warmup_lr_rate", o.warmup_lr_rate.has_value(), schedule == LrSchedule::cosine_warmup_with_min_lr,
         "\"cosine_warmup_with_min_lr\""},
        {"num_cycles", o.num_cycles != defaults.num_cycles, schedule == LrSchedule::cosine_with_restarts,
         "\"cosine_with_restarts\""},
        {"lr_end", o.lr_end != defaults.lr_end, schedule == LrSchedule::polynomial, "\"polynomial\""},
        {"power", o.power != defaults.power, schedule == LrSchedule::polynomial, "\"polynomial\""},
        {"num_decay_steps", o.num_decay_steps.has_value(), wsd, "\"warmup_stable_decay\""},
        {"num_stable_steps", o.num_stable_steps.has_value(), wsd, "\"warmup_stable_decay\""},
        {"warmup_type", o.warmup_type != defaults.warmup_type, wsd, "\"warmup_stable_decay\""},
        {"decay_type", o.decay_type != defaults.decay_type, wsd, "\"warmup_stable_decay\""},
        {"min_lr_ratio", o.min_lr_ratio != defaults.min_lr_ratio, wsd, "\"warmup_stable_decay\""}};
    for (const auto& option : options)
        if (option.set && !option.owned)
            throw Error(ErrorKind::manifest, manifest + ": train." + option.key +
                                                 " is an option of train.lr_scheduler_type = " + option.owner_names +
                                                 " and of no other schedule: set that schedule, or remove " + option.key);
    if (schedule == LrSchedule::polynomial && !(t.learning_rate > o.lr_end))
        throw Error(ErrorKind::manifest, manifest + ": train.lr_end (" + format_number(o.lr_end) +
                                             ") must be smaller than train.learning_rate (" + format_number(t.learning_rate) +
                                             "), which the polynomial schedule decays from (transformers refuses it too)");
}
}  // namespace

void RunConfig::check_adapter(const std::string& adapter_name, bool trains_base_weights) const {
    if (loss.sync_ref_model && !trains_base_weights)
        throw Error(ErrorKind::manifest, adapter.origin + ": loss.sync_ref_model moves a reference model, but with the '" +
                                             adapter_name +
                                             "' adapter the reference is the frozen base model (as in TRL, which refuses "
                                             "it with PEFT): use plugin = \"full\", or remove sync_ref_model");
    if ((!beside_adapter.empty() || beside_adapter.ensure_weight_tying) && trains_base_weights)
        throw Error(ErrorKind::manifest,
                    adapter.origin +
                        ": modules_to_save, ensure_weight_tying and trainable_token_indices train weights beside an "
                        "adapter, and the '" +
                        adapter_name + "' adapter trains every base weight already: remove them, or use plugin = \"lora\"");
}

double RunConfig::router_aux_loss_coef_for(const ModelConfig& model) const {
    if (!model.mixture_of_experts()) {
        if (loss.router_aux_loss_coef && *loss.router_aux_loss_coef != 0.0)
            throw Error(ErrorKind::manifest, manifest_path + ": loss.router_aux_loss_coef is set, but " + this->model.path +
                                                 " (" + model.architecture +
                                                 ") has no experts, so there is no load-balancing loss to weight; "
                                                 "remove the key");
        return 0.0;
    }
    return loss.router_aux_loss_coef.value_or(model.router_aux_loss_coef);
}

ChatTemplate RunConfig::chat_template(const TokenizerConfig& tokenizer) const {
    try {
        return chat_template_from_name(model.chat_template, tokenizer, model.enable_thinking);
    } catch (const Error& e) {
        throw Error(ErrorKind::manifest, manifest_path + ": " + e.what());
    }
}

ImportanceSamplingLevel importance_sampling_level_from_name(const std::string& name) {
    return enum_from<ImportanceSamplingLevel>(
        name, {{"token", ImportanceSamplingLevel::token}, {"sequence", ImportanceSamplingLevel::sequence}});
}
SamplingCorrection sampling_correction_from_name(const std::string& name) {
    return enum_from<SamplingCorrection>(name, {{"none", SamplingCorrection::none},
                                                {"token_truncate", SamplingCorrection::token_truncate},
                                                {"token_mask", SamplingCorrection::token_mask},
                                                {"sequence_truncate", SamplingCorrection::sequence_truncate},
                                                {"sequence_mask", SamplingCorrection::sequence_mask}});
}
ScaleRewards scale_rewards_from_name(const std::string& name) {
    return enum_from<ScaleRewards>(
        name, {{"group", ScaleRewards::group}, {"batch", ScaleRewards::batch}, {"none", ScaleRewards::none}});
}
RewardAggregation reward_aggregation_from_name(const std::string& name) {
    return enum_from<RewardAggregation>(name, {{"sum_then_normalize", RewardAggregation::sum_then_normalize},
                                               {"normalize_then_sum", RewardAggregation::normalize_then_sum}});
}
LrSchedule lr_schedule_from_name(const std::string& name) {
    return enum_from<LrSchedule>(name, {{"linear", LrSchedule::linear},
                                        {"cosine", LrSchedule::cosine},
                                        {"constant", LrSchedule::constant},
                                        {"constant_with_warmup", LrSchedule::constant_with_warmup},
                                        {"cosine_with_min_lr", LrSchedule::cosine_with_min_lr},
                                        {"cosine_with_restarts", LrSchedule::cosine_with_restarts},
                                        {"polynomial", LrSchedule::polynomial},
                                        {"inverse_sqrt", LrSchedule::inverse_sqrt},
                                        {"warmup_stable_decay", LrSchedule::warmup_stable_decay},
                                        {"cosine_warmup_with_min_lr", LrSchedule::cosine_warmup_with_min_lr}});
}

static WsdCurve wsd_curve_from_name(const std::string& name) {
    return enum_from<WsdCurve>(
        name, {{"linear", WsdCurve::linear}, {"cosine", WsdCurve::cosine}, {"1-sqrt", WsdCurve::one_minus_sqrt}});
}
MixedPrecision mixed_precision_from_name(const std::string& name) {
    return enum_from<MixedPrecision>(
        name, {{"auto", MixedPrecision::automatic}, {"bf16", MixedPrecision::bf16}, {"no", MixedPrecision::off}});
}
OptimizerKind optimizer_from_name(const std::string& name) {
    return enum_from<OptimizerKind>(name, {{"adamw_torch", OptimizerKind::adamw},
                                           {"adamw_torch_fused", OptimizerKind::adamw},
                                           {"adafactor", OptimizerKind::adafactor}});
}
const char* optimizer_name(OptimizerKind kind) { return kind == OptimizerKind::adafactor ? "adafactor" : "adamw"; }
std::string optimizer_settings_text(const std::string& name) {
    return name == "adamw" ? "train.optim = \"adamw_torch\" or \"adamw_torch_fused\"" : "train.optim = \"" + name + "\"";
}
DdpBackend ddp_backend_from_name(const std::string& name) {
    return enum_from<DdpBackend>(name,
                                 {{"auto", DdpBackend::automatic}, {"gloo", DdpBackend::gloo}, {"nccl", DdpBackend::nccl}});
}

RunConfig RunConfig::from(const Manifest& m, Kind kind) {
    RunConfig c;
    c.manifest_path = m.path();
    c.world_size = m.world_size();
    c.plugin_dirs = m.strings("plugin_dirs");

    c.model.path = m.string("model.path");
    c.model.revision = m.string("model.revision");
    c.model.dtype = m.string("model.dtype");
    c.model.device = m.string("model.device");
    c.model.chat_template = m.string("model.chat_template");
    c.model.enable_thinking = m.boolean("model.enable_thinking");
    c.model.cast_lm_head_to_fp32 = m.boolean("model.cast_lm_head_to_fp32");
    c.model.disable_dropout = m.boolean("model.disable_dropout");
    c.model.gradient_checkpointing = m.boolean("model.gradient_checkpointing");

    c.data.source = m.optional_string("data.source");
    c.data.eval_source = m.optional_string("data.eval_source");
    c.data.prompt_column = m.string("data.prompt_column");
    c.data.completion_column = m.string("data.completion_column");
    c.data.text_column = m.string("data.text_column");
    c.data.shuffle = m.boolean("data.shuffle");

    GenerationSection& g = c.generation;
    g.num_generations = m.integer("generation.num_generations");
    g.max_completion_length = m.integer("generation.max_completion_length");
    g.temperature = m.number("generation.temperature");
    g.top_p = m.number("generation.top_p");
    g.top_k = m.integer("generation.top_k");
    g.min_p = m.number("generation.min_p");
    g.repetition_penalty = m.number("generation.repetition_penalty");
    g.cuda_graphs = m.boolean("generation.cuda_graphs");
    g.split_attention = m.boolean("generation.split_attention");
    g.dynamic_sampling = m.boolean("generation.dynamic_sampling");
    g.dynamic_sampling_max_rounds = m.integer("generation.dynamic_sampling_max_rounds");

    LossSection& l = c.loss;
    l.beta = m.number("loss.beta");
    l.epsilon = m.number("loss.epsilon");
    l.epsilon_high = m.number("loss.epsilon_high");
    l.delta = m.optional_number("loss.delta");
    l.importance_sampling_level = importance_sampling_level_from_name(m.string("loss.importance_sampling_level"));
    l.num_iterations = m.integer("loss.num_iterations");
    l.scale_rewards = scale_rewards_from_name(m.string("loss.scale_rewards"));
    l.aggregation = reward_aggregation_from_name(m.string("loss.aggregation"));
    l.use_bias_correction_kl = m.boolean("loss.use_bias_correction_kl");
    l.sync_ref_model = m.boolean("loss.sync_ref_model");
    l.ref_model_mixup_alpha = m.number("loss.ref_model_mixup_alpha");
    l.ref_model_sync_steps = m.integer("loss.ref_model_sync_steps");
    if (l.sync_ref_model && l.beta == 0.0)
        throw Error(ErrorKind::manifest, c.manifest_path +
                                             ": loss.sync_ref_model = true moves the reference model, but loss.beta = 0 "
                                             "loads none: set loss.beta > 0 (e.g. 0.04), or remove sync_ref_model");
    l.mask_truncated_completions = m.boolean("loss.mask_truncated_completions");
    l.top_entropy_quantile = m.number("loss.top_entropy_quantile");
    l.entropy_coef = m.number("loss.entropy_coef");
    l.use_adaptive_entropy = m.boolean("loss.use_adaptive_entropy");
    l.entropy_coef_min = m.number("loss.entropy_coef_min");
    l.entropy_coef_max = m.number("loss.entropy_coef_max");
    l.entropy_coef_delta = m.number("loss.entropy_coef_delta");
    l.entropy_target = m.number("loss.entropy_target");
    l.off_policy_mask_threshold = m.optional_number("loss.off_policy_mask_threshold");
    l.router_aux_loss_coef = m.optional_number("loss.router_aux_loss_coef");
    l.sampling_correction = sampling_correction_from_name(m.string("loss.importance_sampling_correction"));
    l.sampling_clip_min = m.optional_number("loss.importance_sampling_clip_min");
    l.sampling_clip_max = m.optional_number("loss.importance_sampling_clip_max");

    TrainSection& t = c.train;
    t.per_device_train_batch_size = m.integer("train.per_device_train_batch_size");
    t.gradient_accumulation_steps = m.integer("train.gradient_accumulation_steps");
    t.generation_batch_size = m.integer("train.generation_batch_size");
    t.steps_per_generation = m.integer("train.steps_per_generation");
    // unset: GRPOConfig's default, or SFTConfig's for grove sft
    t.learning_rate = m.optional_number("train.learning_rate").value_or(kind == Kind::sft ? 2e-5 : 1e-6);
    t.lr_scheduler_type = lr_schedule_from_name(m.string("train.lr_scheduler_type"));
    t.warmup_steps = m.integer("train.warmup_steps");
    t.warmup_ratio = m.number("train.warmup_ratio");
    LrSchedulerOptions& o = t.lr_scheduler_kwargs;
    o.min_lr_rate = m.optional_number("train.min_lr_rate");
    o.num_cycles = m.integer("train.num_cycles");
    o.lr_end = m.number("train.lr_end");
    o.power = m.number("train.power");
    o.warmup_lr_rate = m.optional_number("train.warmup_lr_rate");
    o.num_decay_steps = m.optional_integer("train.num_decay_steps");
    o.num_stable_steps = m.optional_integer("train.num_stable_steps");
    o.warmup_type = wsd_curve_from_name(m.string("train.warmup_type"));
    o.decay_type = wsd_curve_from_name(m.string("train.decay_type"));
    o.min_lr_ratio = m.number("train.min_lr_ratio");
    check_lr_scheduler_kwargs(t, c.manifest_path);
    t.optim = optimizer_from_name(m.string("train.optim"));
    t.weight_decay = m.number("train.weight_decay");
    t.adam_beta1 = m.number("train.adam_beta1");
    t.adam_beta2 = m.number("train.adam_beta2");
    t.adam_epsilon = m.number("train.adam_epsilon");
    t.max_grad_norm = m.number("train.max_grad_norm");
    t.max_steps = m.integer("train.max_steps");
    t.num_train_epochs = m.number("train.num_train_epochs");
    t.seed = m.integer("train.seed");
    t.mixed_precision = mixed_precision_from_name(m.string("train.mixed_precision"));
    t.ddp_backend = ddp_backend_from_name(m.string("train.ddp_backend"));
    t.ddp_timeout = m.integer("train.ddp_timeout");
    t.shard_optimizer_state = m.boolean("train.shard_optimizer_state");
    t.eval = evaluation_interval(m, c.manifest_path);
    t.num_generations_eval = m.optional_integer("train.num_generations_eval").value_or(c.generation.num_generations);
    t.eval_on_start = m.boolean("train.eval_on_start");
    t.per_device_eval_batch_size = m.integer("train.per_device_eval_batch_size");
    if ((t.eval.strategy != IntervalStrategy::no || t.eval_on_start) && !c.data.eval_source)
        throw Error(ErrorKind::manifest, c.manifest_path + ": " +
                                             (t.eval.strategy != IntervalStrategy::no
                                                  ? (m.optional_string("train.eval_strategy")
                                                         ? "train.eval_strategy = \"" + m.string("train.eval_strategy") + "\""
                                                         : "train.eval_steps = " + number_text(m.number("train.eval_steps")))
                                                  : std::string("train.eval_on_start = true")) +
                                             " evaluates on held-out prompts: set data.eval_source (a JSONL file or "
                                             "builtin:NAME), or leave out train.eval_strategy and eval_steps and set "
                                             "eval_on_start = false");

    c.rollouts_path = m.optional_string("rollouts.path");
    c.sft.max_length = m.integer("sft.max_length");
    c.sft.keep_end = m.string("sft.truncation_mode") == "keep_end";
    c.sft.completion_only_loss = m.boolean("sft.completion_only_loss");
    c.sft.assistant_only_loss = m.boolean("sft.assistant_only_loss");
    c.sft.packing = m.boolean("sft.packing");
    c.sft.packing_strategy = m.string("sft.packing_strategy");
    c.sft.padding_free = m.boolean("sft.padding_free");
    c.sft.dft = m.string("sft.loss_type") == "dft";
    c.sft.neftune_noise_alpha = m.optional_number("sft.neftune_noise_alpha").value_or(0.0);
    c.sft.eval_packing = m.optional_boolean("sft.eval_packing").value_or(c.sft.packing);
    if (c.sft.eval_packing && !c.sft.packing)
        throw Error(ErrorKind::manifest, c.manifest_path +
                                             ": sft.eval_packing = true without sft.packing: TRL then packs the held-out "
                                             "examples into padded batches, where packed examples attend to each other; "
                                             "set sft.packing = true as well, or leave sft.eval_packing out");
    if (c.sft.padding_free && !c.sft.packing && c.sft.max_length > 0)
        throw Error(ErrorKind::manifest, c.manifest_path +
                                             ": sft.padding_free without sft.packing does not cut examples to "
                                             "sft.max_length (TRL refuses the pair too): set sft.packing = true, "
                                             "or sft.max_length = 0");
    if (c.sft.packing && c.sft.max_length == 0)
        throw Error(ErrorKind::manifest, c.manifest_path +
                                             ": sft.packing needs sft.max_length, the length of a packed "
                                             "row (TRL refuses max_length=None with packing too)");

    c.output.dir = m.string("output.dir");
    c.output.save = {save_strategy_from_name(m.string("output.save_strategy")),
                     interval_steps(m, "output.save_steps", c.manifest_path)};
    c.output.save_total_limit = m.optional_integer("output.save_total_limit");
    c.output.save_only_model = m.boolean("output.save_only_model");
    c.train.best_model = best_model_settings(m, c);
    c.logging.progress_lines = {interval_strategy_from_name(m.string("logging.logging_strategy")),
                                interval_steps(m, "logging.logging_steps", c.manifest_path)};
    c.logging.log_completions = m.boolean("logging.log_completions");
    c.logging.save_rollouts = m.boolean("logging.save_rollouts");
    c.logging.tensorboard = m.string("logging.report_to") == "tensorboard";
    c.logging.num_completions_to_print = m.optional_integer("logging.num_completions_to_print");

    c.rewards = m.rewards();
    c.adapter = m.adapter();
    c.beside_adapter.modules_to_save = m.strings("adapter.modules_to_save");
    c.beside_adapter.ensure_weight_tying = m.boolean("adapter.ensure_weight_tying");
    c.beside_adapter.trainable_token_indices = m.integers("adapter.trainable_token_indices");
    c.reduction = m.reduction();
    c.objective = m.objective();
    c.environment.use = m.environment();
    c.environment.max_turns = m.optional_integer("environment.max_turns").value_or(kNoTurnLimit);
    const bool isolated = m.string("environment.isolation") == "process";
    const double timeout = m.number("environment.timeout");
    if (c.environment.use) {
        c.environment.use->isolation.process = isolated;
        c.environment.use->isolation.timeout_seconds = timeout;
        if (!isolated && timeout > 0)
            throw Error(
                ErrorKind::manifest,
                c.environment.use->origin + ": timeout takes effect only in a worker process: add isolation = \"process\"");
    }
    c.environment.reward.weight = m.optional_number("environment.reward_weight");
    c.environment.reward.name = m.optional_string("environment.reward_name");
    if ((c.environment.reward.weight || c.environment.reward.name) && !c.environment.use)
        throw Error(ErrorKind::manifest, c.manifest_path + ": environment." +
                                             (c.environment.reward.weight ? "reward_weight" : "reward_name") +
                                             " needs environment.plugin");
    // GRPO needs a reward: a [[rewards]] table, or the environment's judgement of whole episodes
    // (TRL's environment that owns the reward), which make_environment checks once it knows the
    // plugin; grove sft needs none
    if (kind == Kind::grpo && c.rewards.empty() && !c.environment.use)
        throw Error(ErrorKind::manifest, no_reward_message(c.manifest_path));
    return c;
}

std::string no_reward_message(const std::string& where) {
    return where +
           ": error: no reward: add at least one [[rewards]] table, e.g.\n  [[rewards]]\n  plugin = \"correctness\"\n"
           "(or let an environment's judgement of whole episodes be the reward: a TRL class with get_reward(), or "
           "[environment] reward_weight = 1.0 with a plugin that scores episodes)";
}

bool Interval::due(int64_t step, int64_t total, double steps_per_epoch) const {
    switch (strategy) {
        case IntervalStrategy::no:
        case IntervalStrategy::best:
            return false;
        case IntervalStrategy::steps: {
            const int64_t every = steps < 1 ? int64_t(std::ceil(steps * double(total))) : int64_t(steps);
            return every > 0 && step % every == 0;
        }
        case IntervalStrategy::epoch: {  // the step whose end finishes an epoch, and the run's last (a part epoch's end)
            if (step == total) return true;
            auto epochs_done = [&](int64_t s) { return std::floor(double(s) / steps_per_epoch + 1e-9); };
            return steps_per_epoch > 0 && epochs_done(step) > epochs_done(step - 1);
        }
    }
    return false;
}

}  // namespace grove
