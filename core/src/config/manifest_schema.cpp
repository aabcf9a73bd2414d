// Every manifest key, once. Defaults follow TRL's GRPOConfig / TrainingArguments (trl 1.16,
// trl/trainer/grpo_config.py) unless the help text says otherwise; docs/grpo.md explains them.
#include "grove/manifest.hpp"

namespace grove {

namespace {
KeySpec key(const char* section, const char* name, KeyType type, const char* default_toml, const char* help) {
    KeySpec spec{};
    spec.section = section;
    spec.key = name;
    spec.type = type;
    spec.default_toml = default_toml;
    spec.help = help;
    return spec;
}
KeySpec range(KeySpec s, double min, double max, bool min_exclusive = false) {
    s.min = min;
    s.max = max;
    s.min_exclusive = min_exclusive;
    return s;
}
KeySpec required(KeySpec s) {
    s.required = true;
    return s;
}
KeySpec path(KeySpec s) {
    s.is_path = true;
    return s;
}
KeySpec trl(KeySpec s, const char* name) {
    s.trl_name = name;
    return s;
}
KeySpec pick(KeySpec s, const char* c) {
    s.choices = c;
    return s;
}
constexpr double kInf = 1e300;
// counts and lengths: far beyond any real run, small enough that the batch arithmetic (products of
// three of them) cannot overflow and a huge typo is refused at once
constexpr double kMaxCount = 1 << 24;
}  // namespace

const std::vector<KeySpec>& manifest_schema() {
    using T = KeyType;
    static const std::vector<KeySpec> schema = {
        path(key("", "plugin_dirs", T::string_array, "[]",
                 "extra folders searched for plugins, before GROVE_PLUGIN_PATH and the built-in folder")),

        required(path(key("model", "path", T::string, nullptr,
                          "Hugging Face model folder (config.json, safetensors, tokenizer), or the Hub id of a model in the "
                          "local Hugging Face cache"))),
        key("model", "revision", T::string, "\"main\"", "with a Hub id in model.path: the cached branch, tag or commit to use"),
        pick(key("model", "dtype", T::string, "\"float32\"",
                 "weights' dtype; TRL loads float32 master weights (bf16 autocast on CUDA)"),
             "float32|bfloat16"),
        pick(key("model", "device", T::string, "\"auto\"", "auto = cuda when available, else cpu"), "auto|cpu|cuda"),
        pick(key("model", "chat_template", T::string, "\"auto\"",
                 "auto = recognised from the checkpoint; none = prompts are used as plain text"),
             "auto|chatml|qwen3|qwen3_instruct|qwen3_thinking|llama3|llama3_1|llama3_2|llama2|phi3|phi4|phi4_mini|smollm3|"
             "gemma|tulu|mistral|"
             "deepseek_r1|plain|"
             "none"),
        trl(key("model", "enable_thinking", T::boolean, "true",
                "false: the qwen3 and smollm3 templates' generation prompt closes an empty <think> block, so the model "
                "answers without reasoning (refused for templates without that switch)"),
            "chat_template_kwargs.enable_thinking"),
        trl(key("model", "cast_lm_head_to_fp32", T::boolean, "false",
                "keep the output layer's weight in float32 and run its product in float32 outside autocast, for the "
                "policy and the reference (the ScaleRL recipe); no change for a float32 model without autocast"),
            "cast_lm_head_to_fp32"),
        trl(key("model", "disable_dropout", T::boolean, "false",
                "no dropout anywhere, the adapter's included (as TRL sets every dropout's p to 0), so the policy's "
                "log-probabilities while training equal those it sampled with"),
            "disable_dropout"),
        trl(key("model", "gradient_checkpointing", T::boolean, "false",
                "keep only each layer's input and recompute its activations in backward: less memory, one more "
                "forward pass, the same gradients (TRL's default is true)"),
            "gradient_checkpointing"),

        path(key("data", "source", T::string, nullptr,
                 "training prompts: a JSONL file (relative to the manifest) or builtin:NAME; required unless rollouts.path is "
                 "set or an [environment] writes the prompts (then each is one empty user message that the environment's "
                 "reset() / begin_episodes completes, as TRL without a train_dataset; train.max_steps required)")),
        path(key("data", "eval_source", T::string, nullptr,
                 "held-out prompts for `grove eval` and train.eval_steps: JSONL file or builtin:NAME")),
        key("data", "prompt_column", T::string, "\"prompt\"",
            "column holding the prompt (text or chat messages); with an environment that writes prompts a row may "
            "leave it out (one empty user message it completes, as TRL)"),
        key("data", "completion_column", T::string, "\"completion\"",
            "`grove sft`: column holding the reference completion: text, or turns [{role = model|environment, text}] of which "
            "only the model's are trained"),
        trl(key("data", "text_column", T::string, "\"text\"",
                "`grove sft`: column holding a language-modeling row's text, trained whole (rows without a prompt or "
                "\"messages\")"),
            "dataset_text_field"),
        trl(key("data", "shuffle", T::boolean, "true", "shuffle prompts each epoch with the run seed"), "shuffle_dataset"),

        trl(range(key("generation", "num_generations", T::integer, "8", "completions per prompt (G), at least 2"), 2,
                  kMaxCount),
            "num_generations"),
        trl(range(key("generation", "max_completion_length", T::integer, "512", "longest completion in tokens"), 1, kMaxCount),
            "max_completion_length"),
        trl(range(key("generation", "temperature", T::number, "1.0",
                      "sampling temperature; log-probabilities are computed at the same temperature"),
                  0, kInf, true),
            "temperature"),
        trl(range(key("generation", "top_p", T::number, "1.0", "nucleus sampling mass, (0, 1]"), 0, 1, true), "top_p"),
        trl(range(key("generation", "top_k", T::integer, "0", "keep the k most likely tokens; 0 disables"), 0, kInf), "top_k"),
        trl(range(key("generation", "min_p", T::number, "0.0", "drop tokens below min_p x the top probability; 0 disables"), 0,
                  1),
            "min_p"),
        trl(range(key("generation", "repetition_penalty", T::number, "1.0", "1.0 disables"), 0, kInf, true),
            "repetition_penalty"),
        key("generation", "cuda_graphs", T::boolean, "true",
            "on CUDA, generate with the static-shape engine: bf16 generation weights under bf16 autocast, the decode "
            "step replayed as a CUDA graph; false = the eager decode loop (multi-turn episodes always use it)"),
        key("generation", "split_attention", T::boolean, "true",
            "with cuda_graphs: decode attention splits each row's cache columns over more blocks when rows x KV heads "
            "are too few for the GPU (flash-decoding); false = one block per KV head and row"),
        key("generation", "dynamic_sampling", T::boolean, "false",
            "DAPO's filter groups: drop groups whose rewards all agree (zero advantage, no signal) and generate for "
            "more prompts until the generation batch is full of groups that disagree (one process)"),
        range(key("generation", "dynamic_sampling_max_rounds", T::integer, "10",
                  "generation rounds per batch at most, the first included (verl's max_num_gen_batches); still short "
                  "after them, the newest agreeing groups fill the batch"),
              1, kMaxCount),

        key("rewards[]", "plugin", T::string, nullptr, "reward plugin: a name, or a path to its library (or set model)"),
        key("rewards[]", "model", T::string, nullptr,
            "a reward model instead: a Hugging Face sequence-classification folder (Llama, Qwen2, Qwen3, Mistral "
            "or Phi-3 ForSequenceClassification), relative to the manifest, or a cached Hub id; its score of prompt + "
            "completion is the reward"),
        key("rewards[]", "revision", T::string, nullptr,
            "with a Hub id in model: the cached branch, tag or commit to use; unset = main"),
        trl(key("rewards[]", "weight", T::number, "1.0", "weight of this reward in the sum"), "reward_weights"),
        key("rewards[]", "name", T::string, nullptr, "name in metrics (rewards/<name>/mean); defaults to the plugin name"),
        pick(key("rewards[]", "role", T::string, nullptr,
                 "what `grove eval` reports this reward's mean as; unset = what the plugin declares (correctness: "
                 "accuracy, format: format_rate)"),
             "accuracy|format_rate|none"),
        key("rewards[]", "config", T::table, "{}", "the plugin's own settings (`grove plugins info NAME`)"),
        pick(key("rewards[]", "isolation", T::string, "\"none\"",
                 "process: run the plugin in a worker process of its own, so a crash or a hang cannot take the run "
                 "with it (docs/reliability.md#isolated-plugins)"),
             "none|process"),
        range(key("rewards[]", "timeout", T::number, "0",
                  "with isolation = process: seconds one batch may take before the worker is killed; 0 = no limit"),
              0, kInf),
        pick(key("rewards[]", "on_failure", T::string, "\"stop\"",
                 "with isolation = process: stop the run when the plugin crashes, hangs or fails (the last "
                 "checkpoint stays whole), or score that batch NaN and go on"),
             "stop|nan"),

        key("adapter", "plugin", T::string, "\"full\"", "what trains: full (all base weights) or lora"),
        key("adapter", "config", T::table, "{}", "the adapter's settings, e.g. { r = 16, alpha = 32 }"),
        trl(key("adapter", "modules_to_save", T::string_array, "[]",
                "modules trained whole beside the adapter, as PEFT's modules_to_save (a module whose name ends with "
                "one: \"lm_head\", \"embed_tokens\"); saved in the adapter's file; the reference model keeps the "
                "originals"),
            "modules_to_save"),
        trl(key("adapter", "ensure_weight_tying", T::boolean, "false",
                "with modules_to_save = [\"embed_tokens\"] on a model that ties its embeddings, train the tied "
                "matrix whole (lm_head with it), as PEFT's ensure_weight_tying"),
            "ensure_weight_tying"),
        trl(key("adapter", "trainable_token_indices", T::integer_array, "[]",
                "token ids whose embedding rows (and a tied lm_head's) train beside the adapter, as PEFT's "
                "trainable_token_indices (new tokens of a chat template)"),
            "trainable_token_indices"),

        trl(key("reduction", "plugin", T::string, "\"dapo\"",
                "loss normalisation: grpo, bnpo, dr_grpo, dapo or luspo (TRL's loss_type; docs/objectives.md)"),
            "loss_type"),
        key("reduction", "config", T::table, "{}", "the reduction's settings"),

        key("objective", "plugin", T::string, "\"clipped\"",
            "the policy loss and its gradient: clipped (GRPO's; GSPO at sequence level), cispo, sapo or vespo "
            "(docs/objectives.md)"),
        key("objective", "config", T::table, "{}", "the objective's own settings"),

        key("environment", "plugin", T::string, nullptr,
            "multi-turn episodes: an environment plugin (e.g. calculator) answers the model's turns; unset = "
            "single-turn completions"),
        key("environment", "config", T::table, "{}", "the environment's settings (`grove plugins info NAME`)"),
        pick(key("environment", "isolation", T::string, "\"none\"",
                 "process: run the environment in a worker process of its own, so a crash or a hang cannot take the "
                 "run with it (docs/reliability.md#isolated-plugins)"),
             "none|process"),
        range(key("environment", "timeout", T::number, "0",
                  "with isolation = process: seconds one call (a turn of every waiting episode) may take; 0 = no limit"),
              0, kInf),
        range(key("environment", "max_turns", T::integer, nullptr,
                  "model turns per episode at most (TRL's max_tool_calling_iterations + 1); unset = no limit, as "
                  "TRL's default: the episode ends when the environment stops answering or max_completion_length "
                  "is spent (every token of the episode counts toward it)"),
              1, kInf),
        key("environment", "reward_weight", T::number, nullptr,
            "makes the environment's own score of each whole episode (SDK score_episodes) a reward column with "
            "this weight; unset = as the plugin says (SDK episode_reward): a TRL class's get_reward() is one with "
            "weight 1, as TRL adds it; a score_episodes alone is not"),
        key("environment", "reward_name", T::string, nullptr,
            "that column's name (rewards/<name>/mean), distinct from every [[rewards]] name; unset = the "
            "plugin's (a TRL class's name, as TRL names it; several classes: a column each), else \"environment\""),

        trl(range(key("loss", "beta", T::number, "0.0",
                      "KL coefficient; 0 loads no reference model. 0.001 keeps long runs stable at little cost"),
                  0, kInf),
            "beta"),
        trl(range(key("loss", "epsilon", T::number, "0.2", "lower clip range of the ratio"), 0, kInf), "epsilon"),
        trl(range(key("loss", "epsilon_high", T::number, nullptr, "upper clip range; unset = epsilon (DAPO: 0.28)"), 0, kInf),
            "epsilon_high"),
        trl(range(key("loss", "delta", T::number, nullptr, "two-sided clip: ratio capped at delta; unset disables"), 0, kInf,
                  true),
            "delta"),
        trl(pick(key("loss", "importance_sampling_level", T::string, "\"token\"", "token, or sequence (GSPO)"),
                 "token|sequence"),
            "importance_sampling_level"),
        trl(range(key("loss", "num_iterations", T::integer, "1", "passes over each generation batch (mu)"), 1, kInf),
            "num_iterations"),
        trl(pick(key("loss", "scale_rewards", T::string, "\"group\"",
                     "divide advantages by the group std, the batch std, or not at all"),
                 "group|batch|none"),
            "scale_rewards"),
        trl(pick(key("loss", "aggregation", T::string, "\"sum_then_normalize\"",
                     "combine several rewards before (default) or after normalising each (GDPO)"),
                 "sum_then_normalize|normalize_then_sum"),
            "multi_objective_aggregation"),
        trl(key("loss", "sync_ref_model", T::boolean, "false",
                "TR-DPO: every ref_model_sync_steps optimizer steps, move the reference toward the policy: ref = "
                "alpha x policy + (1 - alpha) x ref (needs beta > 0 and the full adapter)"),
            "sync_ref_model"),
        trl(range(key("loss", "ref_model_mixup_alpha", T::number, "0.6",
                      "with sync_ref_model: the policy's share alpha of the new reference"),
                  0, 1),
            "ref_model_mixup_alpha"),
        trl(range(key("loss", "ref_model_sync_steps", T::integer, "512",
                      "with sync_ref_model: optimizer steps between two moves of the reference"),
                  1, kInf),
            "ref_model_sync_steps"),
        trl(key("loss", "use_bias_correction_kl", T::boolean, "false",
                "multiply the KL term by the importance ratio (unbiased reverse-KL gradient); newer TRL defaults to true"),
            "use_bias_correction_kl"),
        trl(key("loss", "mask_truncated_completions", T::boolean, "false",
                "exclude completions that hit max_completion_length from the loss"),
            "mask_truncated_completions"),
        trl(range(key("loss", "top_entropy_quantile", T::number, "1.0",
                      "train the policy term only on this top fraction of tokens by entropy (0.2 in the paper); 1 keeps all"),
                  0, 1),
            "top_entropy_quantile"),
        trl(range(key("loss", "entropy_coef", T::number, "0.0",
                      "entropy bonus: loss -= entropy_coef x the mean entropy of the trained tokens; 0 disables"),
                  -kInf, kInf),
            "entropy_coef"),
        trl(key("loss", "use_adaptive_entropy", T::boolean, "false",
                "adapt entropy_coef each optimizer step toward entropy_target (Skywork-OR1); applied only at or below it"),
            "use_adaptive_entropy"),
        trl(range(key("loss", "entropy_coef_min", T::number, "0.0", "adaptive entropy: lowest coefficient"), -kInf, kInf),
            "entropy_coef_min"),
        trl(range(key("loss", "entropy_coef_max", T::number, "1.0", "adaptive entropy: highest coefficient"), -kInf, kInf),
            "entropy_coef_max"),
        trl(range(key("loss", "entropy_coef_delta", T::number, "0.005", "adaptive entropy: step of the coefficient"), 0, kInf),
            "entropy_coef_delta"),
        trl(range(key("loss", "entropy_target", T::number, "0.2", "adaptive entropy: target mean entropy in nats"), 0, kInf),
            "entropy_target"),
        trl(range(key("loss", "router_aux_loss_coef", T::number, nullptr,
                      "mixtures of experts (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE): weight of the routers' load-balancing loss "
                      "added to the loss (grove train and grove sft); unset = the checkpoint's config.json "
                      "router_aux_loss_coef (0.001 in Qwen3-MoE's, 0.02 in Mixtral-8x7B's, 0.01 in OLMoE's), 0 "
                      "disables; refused for a model without experts"),
                  0, kInf),
            "router_aux_loss_coef"),
        trl(range(key("loss", "off_policy_mask_threshold", T::number, nullptr,
                      "drop negative-advantage rows whose mean KL(sampler || policy) exceeds it (DeepSeek-V3.2); unset "
                      "disables"),
                  0, kInf),
            "off_policy_mask_threshold"),
        trl(pick(key("loss", "importance_sampling_correction", T::string, "\"none\"",
                     "correct for the sampler's log-probabilities differing from the trainer's (replayed rollouts, GPU "
                     "kernels): weight the policy term by pi_old / pi_sampler, per token or per row, truncated to or "
                     "masked outside the clip range; none = off"),
                 "none|token_truncate|token_mask|sequence_truncate|sequence_mask"),
            "vllm_importance_sampling_mode"),
        trl(range(key("loss", "importance_sampling_clip_min", T::number, nullptr, "lower bound of that ratio; unset = none"), 0,
                  kInf),
            "vllm_importance_sampling_clip_min"),
        trl(range(key("loss", "importance_sampling_clip_max", T::number, "3.0", "upper bound of that ratio"), 0, kInf, true),
            "vllm_importance_sampling_clip_max"),

        trl(range(key("train", "per_device_train_batch_size", T::integer, "8",
                      "completions (not prompts) per micro-batch per process"),
                  1, kMaxCount),
            "per_device_train_batch_size"),
        trl(range(key("train", "gradient_accumulation_steps", T::integer, "1", "micro-batches per optimizer step"), 1,
                  kMaxCount),
            "gradient_accumulation_steps"),
        trl(range(key("train", "generation_batch_size", T::integer, nullptr,
                      "completions generated at once over all processes; unset = batch x processes x steps_per_generation"),
                  1, kMaxCount),
            "generation_batch_size"),
        trl(range(key("train", "steps_per_generation", T::integer, nullptr,
                      "micro-batches per generation batch; unset = gradient_accumulation_steps"),
                  1, kMaxCount),
            "steps_per_generation"),
        trl(range(key("train", "learning_rate", T::number, nullptr,
                      "peak learning rate; unset: 1e-6 for grove train (GRPOConfig's default), 2e-5 for grove sft "
                      "(SFTConfig's)"),
                  0, kInf),
            "learning_rate"),
        trl(pick(key("train", "lr_scheduler_type", T::string, "\"linear\"",
                     "after the warmup: linear decay to 0, cosine, cosine to min_lr_rate, cosines with hard restarts, "
                     "polynomial decay to lr_end, inverse square root (over the warmup steps, or 10000 without: get_scheduler "
                     "takes no timescale), or none; constant has no warmup (as in "
                     "transformers), constant_with_warmup has; warmup_stable_decay: warmup, the peak, then num_decay_steps "
                     "of decay; cosine_warmup_with_min_lr: transformers' cosine to min_lr_rate whose steps count from 1"),
                 "linear|cosine|cosine_with_min_lr|cosine_with_restarts|polynomial|inverse_sqrt|constant|"
                 "constant_with_warmup|warmup_stable_decay|cosine_warmup_with_min_lr"),
            "lr_scheduler_type"),
        trl(range(key("train", "min_lr_rate", T::number, nullptr,
                      "cosine_with_min_lr, cosine_warmup_with_min_lr (required there): the rate it decays to, as a "
                      "fraction of learning_rate"),
                  0, 1),
            "lr_scheduler_kwargs.min_lr_rate"),
        trl(range(key("train", "num_cycles", T::integer, "1",
                      "cosine_with_restarts: how many cosines, each from learning_rate to 0, fill the decay"),
                  1, kMaxCount),
            "lr_scheduler_kwargs.num_cycles"),
        trl(range(key("train", "lr_end", T::number, "1e-7", "polynomial: the learning rate it ends at (not a fraction)"), 0,
                  kInf),
            "lr_scheduler_kwargs.lr_end"),
        trl(range(key("train", "power", T::number, "1.0", "polynomial: the decay's power (1: linear to lr_end)"), 0, kInf,
                  /*min_exclusive=*/true),
            "lr_scheduler_kwargs.power"),
        trl(range(key("train", "warmup_lr_rate", T::number, nullptr,
                      "cosine_warmup_with_min_lr: the first warmup step's rate, as a fraction; unset = 1 / warmup steps"),
                  0, 1),
            "lr_scheduler_kwargs.warmup_lr_rate"),
        trl(range(key("train", "num_decay_steps", T::integer, nullptr,
                      "warmup_stable_decay (required there): the steps of its decay, at the end of the run"),
                  0, kMaxCount),
            "lr_scheduler_kwargs.num_decay_steps"),
        trl(range(key("train", "num_stable_steps", T::integer, nullptr,
                      "warmup_stable_decay: the steps at the peak; unset = what the warmup and the decay leave of the run"),
                  0, kMaxCount),
            "lr_scheduler_kwargs.num_stable_steps"),
        trl(pick(key("train", "warmup_type", T::string, "\"linear\"", "warmup_stable_decay: the warmup's curve"),
                 "linear|cosine|1-sqrt"),
            "lr_scheduler_kwargs.warmup_type"),
        trl(pick(key("train", "decay_type", T::string, "\"cosine\"",
                     "warmup_stable_decay: the decay's curve (cosine: half a cosine)"),
                 "linear|cosine|1-sqrt"),
            "lr_scheduler_kwargs.decay_type"),
        trl(range(key("train", "min_lr_ratio", T::number, "0.0",
                      "warmup_stable_decay: where the warmup starts and the decay ends, as a fraction of learning_rate"),
                  0, 1),
            "lr_scheduler_kwargs.min_lr_ratio"),
        trl(range(key("train", "warmup_steps", T::integer, "0", "linear warmup steps; overrides warmup_ratio when > 0"), 0,
                  kInf),
            "warmup_steps"),
        trl(range(key("train", "warmup_ratio", T::number, "0.0", "warmup as a fraction of all steps"), 0, 1), "warmup_ratio"),
        trl(pick(key("train", "optim", T::string, "\"adamw_torch\"",
                     "adamw_torch (adamw_torch_fused: the same update) = torch's AdamW; adafactor = transformers' "
                     "Adafactor as Trainer sets it up (learning_rate and its schedule, no momentum, second moments "
                     "factored into a row and a column per matrix: a fraction of AdamW's optimizer memory)"),
                 "adamw_torch|adamw_torch_fused|adafactor"),
            "optim"),
        trl(range(key("train", "weight_decay", T::number, "0.0", "decoupled weight decay; never applied to norms and biases"),
                  0, kInf),
            "weight_decay"),
        trl(range(key("train", "adam_beta1", T::number, "0.9", "AdamW beta1 (adafactor has no first moment)"), 0, 1),
            "adam_beta1"),
        trl(range(key("train", "adam_beta2", T::number, "0.999", "AdamW beta2 (adafactor's decay follows the step)"), 0, 1),
            "adam_beta2"),
        trl(range(key("train", "adam_epsilon", T::number, "1e-8", "AdamW epsilon (adafactor's are fixed)"), 0, kInf, true),
            "adam_epsilon"),
        trl(range(key("train", "max_grad_norm", T::number, "1.0", "global gradient-norm clip; 0 disables"), 0, kInf),
            "max_grad_norm"),
        trl(range(key("train", "max_steps", T::integer, "-1", "optimizer steps; -1 = num_train_epochs decides"), -1, kInf),
            "max_steps"),
        trl(range(key("train", "num_train_epochs", T::number, "3.0", "passes over the prompts when max_steps = -1"), 0, kInf,
                  true),
            "num_train_epochs"),
        trl(key("train", "seed", T::integer, "42", "seed of sampling, shuffling and initialisation"), "seed"),
        trl(pick(key("train", "mixed_precision", T::string, "\"auto\"",
                     "bf16 = the policy's forward passes under bfloat16 autocast, weights and optimizer in model.dtype; "
                     "auto = bf16 on CUDA, none on CPU; no = off"),
                 "auto|bf16|no"),
            "bf16"),
        trl(pick(key("train", "ddp_backend", T::string, "\"auto\"",
                     "several processes: nccl = GPU to GPU, one GPU per process; gloo = through host memory, any "
                     "device; auto = nccl when every local process has a GPU of its own, else gloo"),
                 "auto|gloo|nccl"),
            "ddp_backend"),
        trl(range(key("train", "ddp_timeout", T::integer, "1800",
                      "several processes: seconds a rank waits for the others to join a collective (or the "
                      "rendezvous) before the run stops with an error; raise it when a generation, evaluation or "
                      "reward can take longer"),
                  1, kMaxCount),
            "ddp_timeout"),
        trl(pick(key("train", "eval_strategy", T::string, nullptr,
                     "evaluate on data.eval_source: steps = every eval_steps, epoch = at each epoch's end (and the "
                     "run's), no = never; eval_* metrics in that step's line; unset = steps when eval_steps is set, "
                     "else no"),
                 "no|steps|epoch"),
            "eval_strategy"),
        trl(range(key("train", "eval_steps", T::number, "0",
                      "eval_strategy = \"steps\": evaluate every this many optimizer steps (below 1: that fraction of "
                      "the run's steps, rounded up); 0 = unset: logging_steps under eval_strategy = \"steps\""),
                  0, kMaxCount),
            "eval_steps"),
        trl(key("train", "eval_on_start", T::boolean, "false",
                "also evaluate before the first step (a line with step 0 in metrics.jsonl): the starting point"),
            "eval_on_start"),
        trl(key("train", "metric_for_best_model", T::string, nullptr,
                "the evaluation metric that picks the best checkpoint, as logged with or without eval_ (\"reward\", "
                "\"rewards/NAME/mean\"; grove sft: \"loss\"): save_total_limit never deletes that checkpoint; "
                "unset = \"loss\" with load_best_model_at_end, else none"),
            "metric_for_best_model"),
        trl(key("train", "greater_is_better", T::boolean, nullptr,
                "whether a larger metric_for_best_model is better; unset = true unless its name ends in \"loss\""),
            "greater_is_better"),
        trl(range(key("train", "early_stopping_patience", T::integer, nullptr,
                      "stop the run after this many evaluations in a row that do not improve metric_for_best_model "
                      "on the best by more than early_stopping_threshold (EarlyStoppingCallback); unset = never"),
                  1, kMaxCount),
            "callbacks=[EarlyStoppingCallback(early_stopping_patience)]"),
        trl(range(key("train", "early_stopping_threshold", T::number, "0",
                      "the least change of metric_for_best_model that early stopping counts as an improvement"),
                  0, kInf),
            "EarlyStoppingCallback(early_stopping_threshold)"),
        trl(key("train", "load_best_model_at_end", T::boolean, "false",
                "at the run's end, write the best checkpoint's model (metric_for_best_model) into output.dir; needs "
                "checkpoints where evaluations are (the same strategy, save_steps a multiple of eval_steps), or "
                "output.save_strategy = \"best\""),
            "load_best_model_at_end"),
        trl(range(key("train", "per_device_eval_batch_size", T::integer, "8",
                      "`grove sft`: held-out examples per evaluation batch (eval_loss weighs each batch's mean by its "
                      "size, as Trainer does)"),
                  1, kMaxCount),
            "per_device_eval_batch_size"),
        trl(range(key("train", "num_generations_eval", T::integer, nullptr,
                      "completions per held-out prompt when evaluating; unset = generation.num_generations"),
                  1, kMaxCount),
            "num_generations_eval"),
        key("train", "shard_optimizer_state", T::boolean, "false",
            "several processes: each keeps the optimizer's state for, and updates, its share of the trained tensors and "
            "sends them to the others (ZeRO stage 1): the same update with 1/N of the optimizer's memory"),

        path(key("rollouts", "path", T::string, nullptr,
                 "train on rollouts made elsewhere (JSONL: prompt_ids or prompt, completion_ids, optional "
                 "sampling_logprobs, rewards and multi-turn env_mask) instead of generating")),

        trl(range(key("sft", "max_length", T::integer, "1024",
                      "`grove sft`: longest example in tokens; longer ones are cut (truncation_mode) and those left "
                      "with no trained token are left out; 0 = no limit"),
                  0, kMaxCount),
            "max_length"),
        trl(pick(key("sft", "truncation_mode", T::string, "\"keep_start\"",
                     "`grove sft`: keep_start cuts a long example's end, keep_end its start"),
                 "keep_start|keep_end"),
            "truncation_mode"),
        trl(key("sft", "completion_only_loss", T::boolean, "true",
                "`grove sft`: train only the completion of prompt-completion rows; false trains the prompt too"),
            "completion_only_loss"),
        trl(key("sft", "assistant_only_loss", T::boolean, "false",
                "`grove sft`: train only the assistant turns of conversation rows (\"messages\"), as TRL marks them "
                "with its training chat templates (chatml, qwen3, qwen3_instruct, llama3 and gemma families)"),
            "assistant_only_loss"),
        trl(key("sft", "packing", T::boolean, "false",
                "`grove sft`: pack examples into rows of max_length tokens (fewer, fuller rows: a batch counts rows)"),
            "packing"),
        trl(pick(key("sft", "packing_strategy", T::string, "\"bfd\"",
                     "`grove sft`: bfd (best fit decreasing; longer examples cut), bfd_split (longer examples split), "
                     "wrapped (tokens cut every max_length, across examples)"),
                 "bfd|bfd_split|wrapped"),
            "packing_strategy"),
        trl(key("sft", "padding_free", T::boolean, "false",
                "`grove sft`: count each example's first token out of the step's trained tokens, as TRL's padding-free "
                "batches mask it (bfd packing sets it)"),
            "padding_free"),
        trl(key("sft", "eval_packing", T::boolean, nullptr,
                "`grove sft`: false evaluates the held-out examples unpacked while training packs (batches stay "
                "padding-free when training's are); unset = as sft.packing"),
            "eval_packing"),
        trl(range(key("sft", "neftune_noise_alpha", T::number, nullptr,
                      "`grove sft`: NEFTune: uniform noise of half-width alpha / sqrt(length x hidden size) added to the "
                      "token embeddings while training (5 in the NEFTune paper); unset = none"),
                  0, kInf, true),
            "neftune_noise_alpha"),
        trl(pick(key("sft", "loss_type", T::string, "\"nll\"",
                     "`grove sft`: nll (cross-entropy) or dft (each token's cross-entropy weighted by its probability, "
                     "Dynamic Fine-Tuning), in training and evaluation"),
                 "nll|dft"),
            "loss_type"),

        path(key("output", "dir", T::string, "\"output\"", "run folder: metrics, completions, checkpoints")),
        trl(pick(key("output", "save_strategy", T::string, "\"steps\"",
                     "when to checkpoint: steps = every save_steps, epoch = at each epoch's end, best = after an "
                     "evaluation that improves train.metric_for_best_model, no = not during the run; every run also "
                     "writes one at its end (the trained model) and when a signal stops it"),
                 "steps|epoch|best|no"),
            "save_strategy"),
        trl(range(key("output", "save_steps", T::number, "500",
                      "save_strategy = \"steps\": checkpoint every N optimizer steps (below 1: that fraction of the "
                      "run's steps, rounded up)"),
                  0, kMaxCount, true),
            "save_steps"),
        trl(range(key("output", "save_total_limit", T::integer, nullptr, "keep only the newest N checkpoints; unset keeps all"),
                  1, kInf),
            "save_total_limit"),
        trl(key("output", "save_only_model", T::boolean, "false",
                "checkpoints during the run hold the model alone, not the optimizer's state a resume needs (a "
                "fraction of the disk); the run's last checkpoint, and one a signal stops it at, stay whole"),
            "save_only_model"),

        trl(pick(key("logging", "logging_strategy", T::string, "\"steps\"",
                     "when to print a progress line: steps = every logging_steps, epoch = at each epoch's end, no = "
                     "never (metrics.jsonl gets every step either way)"),
                 "steps|epoch|no"),
            "logging_strategy"),
        trl(range(key("logging", "logging_steps", T::number, "10",
                      "logging_strategy = \"steps\": a progress line every N optimizer steps (below 1: that "
                      "fraction of the run's steps, rounded up)"),
                  0, kMaxCount, true),
            "logging_steps"),
        trl(key("logging", "log_completions", T::boolean, "false", "write sample completions to completions.jsonl"),
            "log_completions"),
        key("logging", "save_rollouts", T::boolean, "false",
            "write every generated row (prompt_ids, completion_ids, sampling_logprobs, rewards) to rollouts.jsonl, "
            "which [rollouts] path can replay"),
        trl(pick(key("logging", "report_to", T::string, "\"none\"",
                     "tensorboard: also write every step's metrics as TensorBoard scalars to OUTPUT/runs, tagged as "
                     "transformers' TensorBoardCallback tags them (train/reward, eval/reward); none: metrics.jsonl only"),
                 "none|tensorboard"),
            "report_to"),
        trl(range(key("logging", "num_completions_to_print", T::integer, nullptr,
                      "completions written to completions.jsonl per generation batch (its first N rows); unset = all"),
                  0, kInf),
            "num_completions_to_print"),
    };
    return schema;
}

}  // namespace grove
