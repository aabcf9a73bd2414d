/*
 * grove_plugin.h — the Grove plugin SDK, ABI version 1.9.
 *
 * This one C header is everything a plugin author needs. Read it top to bottom: it is written as
 * a tutorial. A plugin is a shared library (.so) that Grove loads at run time; it can be written in
 * C, C++, Rust or Zig, because everything that crosses the boundary is plain C.
 *
 *   1. What a plugin is, and its kinds    (reward, reduction, adapter, environment, objective)
 *   2. Versions: ABI major/minor and struct_size
 *   3. Errors: status codes and the error sink
 *   4. Configuration: the plugin's TOML table, typed
 *   5. The descriptor and the one exported entry point
 *   6. Reward plugins
 *   7. Reduction plugins
 *   8. Adapter plugins and the host tensor-op table
 *   9. Environment plugins (multi-turn episodes)
 *  10. A complete reward plugin in 40 lines          (see also examples/custom-reward/)
 *  11. Objective plugins: the policy loss and its gradient
 *
 * Rules that hold everywhere (the host relies on them):
 *   - Exceptions, longjmp and aborts never cross this boundary. Return a status instead. (The C++
 *     layer <grove/plugin.hpp> wraps every entry in try/catch for you.)
 *   - Every struct that crosses the boundary starts with `uint32_t struct_size`. A reader that finds
 *     a struct smaller than it knows treats the missing trailing fields as absent (zero / NULL).
 *   - Pointers the host passes in are BORROWED: valid only for the duration of that call. Copy what
 *     you want to keep.
 *   - Memory is never freed across the boundary: the host copies your messages, the host owns every
 *     output buffer it hands you, and your descriptors live in static storage.
 *   - Text is UTF-8, passed as pointer + byte length (not necessarily NUL-terminated) unless the
 *     field says "NUL-terminated".
 */
#ifndef GROVE_PLUGIN_H
#define GROVE_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================
 * 1. What a plugin is
 * ============================================================================================
 * Grove's core owns generation, grouping, advantages, the policy loss and the optimizer. A plugin
 * customises one of five things:
 *
 *   GROVE_PLUGIN_KIND_REWARD     scores a batch of completions: one float per completion
 *                                (NaN = "not applicable", TRL's None). Weights, NaN handling,
 *                                normalisation and advantages stay in the host.
 *   GROVE_PLUGIN_KIND_REDUCTION  turns the completion mask of a micro-batch into per-token loss
 *                                weights; the host forms loss = sum(weight * (policy + beta*kl)).
 *   GROVE_PLUGIN_KIND_ADAPTER    decides what trains: "full" (base weights) or extra parameters
 *                                (LoRA) built through a host tensor-op table, so it needs no libtorch.
 *   GROVE_PLUGIN_KIND_ENVIRONMENT  (ABI 1.2) answers the model's turns in multi-turn episodes (a
 *                                tool: a calculator, a program); its answers are context, never loss.
 *   GROVE_PLUGIN_KIND_OBJECTIVE  (ABI 1.5) the policy loss of a micro-batch from the tokens'
 *                                log-probabilities, and its gradient with respect to them; the host
 *                                back-propagates it into the model (section 11).
 *
 * One library may hold several plugins. Each has a kind, a unique name, and create/destroy for
 * its instances: the manifest's table for that plugin becomes the `grove_config` of one instance.
 */
typedef enum grove_plugin_kind {
    GROVE_PLUGIN_KIND_REWARD = 1,
    GROVE_PLUGIN_KIND_REDUCTION = 2,
    GROVE_PLUGIN_KIND_ADAPTER = 3,
    GROVE_PLUGIN_KIND_ENVIRONMENT = 4, /* ABI 1.2 */
    GROVE_PLUGIN_KIND_OBJECTIVE = 5    /* ABI 1.5 */
} grove_plugin_kind;

/* ============================================================================================
 * 2. Versions
 * ============================================================================================
 * The major version changes when anything existing changes; the host refuses a plugin built for
 * another major, with a message that names the plugin. The minor version grows when fields or
 * functions are APPENDED; a v1.0 plugin keeps working with a newer 1.x host and vice versa, because
 * each side reads only as far as the other side's struct_size says.
 */
#define GROVE_ABI_MAJOR 1
#define GROVE_ABI_MINOR 13

/* Symbols a plugin exports need default visibility (build with -fvisibility=hidden). */
#if defined(_WIN32)
#define GROVE_EXPORT __declspec(dllexport)
#else
#define GROVE_EXPORT __attribute__((visibility("default")))
#endif

/* True when a struct of the given size contains the field: use it to read appended fields. */
#define GROVE_HAS_FIELD(ptr, type, field) ((ptr)->struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

/* ============================================================================================
 * 3. Errors
 * ============================================================================================
 * Every plugin function that can fail returns a grove_status. On failure it first describes the
 * problem through the error sink it was given; the host COPIES the message immediately, so a
 * stack buffer is fine. If the problem concerns one configuration key, name it: the host then
 * prints the manifest's file:line of that key next to your message.
 */
typedef enum grove_status {
    GROVE_OK = 0,
    GROVE_ERROR_INVALID_ARGUMENT = 1, /* the input batch or context is malformed */
    GROVE_ERROR_CONFIG = 2,           /* a configuration value is unacceptable */
    GROVE_ERROR_UNSUPPORTED = 3,      /* valid, but this plugin cannot do it */
    GROVE_ERROR_OUT_OF_MEMORY = 4,
    GROVE_ERROR_INTERNAL = 5 /* a bug, or an exception caught at the boundary */
} grove_status;

typedef struct grove_error_sink grove_error_sink;
struct grove_error_sink {
    uint32_t struct_size;
    void* host_data; /* the host's; do not touch */
    /* key: the configuration key concerned, or NULL. message: NUL-terminated, copied by the host. */
    void (*report)(grove_error_sink* sink, const char* key, const char* message);
};

/* Convenience: report and return in one line, e.g. `return grove_fail(err, GROVE_ERROR_CONFIG,
 * "pattern", "the regex does not compile");` */
static inline grove_status grove_fail(grove_error_sink* sink, grove_status status, const char* key, const char* message) {
    if (sink && sink->report) sink->report(sink, key, message);
    return status;
}

/* ============================================================================================
 * 4. Configuration
 * ============================================================================================
 * The manifest gives each plugin instance a TOML table, for example
 *
 *     [[rewards]]
 *     plugin = "length_penalty"
 *     weight = 0.5
 *     config = { mode = "overlong", max_length = 256, cache = 64 }
 *
 * A plugin DECLARES the keys it accepts (grove_config_key, in its descriptor). The host then checks
 * the table before create(): unknown keys (with a "did you mean"), wrong types and missing required
 * keys are reported at the manifest's file:line, and integers are widened to floats where a float is
 * declared. create() receives only declared keys, each with its declared type; absent keys are
 * simply not in the list, so the plugin applies its own documented default. A key declared as
 * GROVE_VALUE_TABLE (ABI 1.7) takes a nested table, e.g. `kwargs = { n = 2 }`, which arrives as a
 * JSON object in string_value. The whole table is also in `raw_toml`, as TOML text.
 *
 * Paths in a configuration are the user's, written relative to the manifest: resolve a relative
 * path against `base_dir` (ABI 1.7), the manifest's folder, not against the current folder.
 */
typedef enum grove_value_type {
    GROVE_VALUE_STRING = 1,
    GROVE_VALUE_INT = 2,
    GROVE_VALUE_FLOAT = 3,
    GROVE_VALUE_BOOL = 4,
    GROVE_VALUE_STRING_ARRAY = 5,
    GROVE_VALUE_INT_ARRAY = 6,
    GROVE_VALUE_FLOAT_ARRAY = 7,
    GROVE_VALUE_TABLE = 8 /* ABI 1.7: a nested table, as a JSON object in string_value */
} grove_value_type;

typedef struct grove_config_key {
    uint32_t struct_size;
    const char* name;         /* NUL-terminated */
    uint32_t type;            /* grove_value_type */
    uint32_t required;        /* 1: the host refuses a table without it */
    const char* default_text; /* shown by `grove plugins info`, e.g. "16"; NULL if required */
    const char* help;         /* one line */
} grove_config_key;

typedef struct grove_config_value {
    uint32_t struct_size;
    const char* key;                 /* NUL-terminated */
    uint32_t type;                   /* grove_value_type, always the declared one */
    const char* string_value;        /* NUL-terminated; GROVE_VALUE_STRING, and GROVE_VALUE_TABLE's JSON */
    int64_t int_value;               /* GROVE_VALUE_INT */
    double float_value;              /* GROVE_VALUE_FLOAT */
    int32_t bool_value;              /* GROVE_VALUE_BOOL: 0 or 1 */
    uint32_t array_length;           /* the *_ARRAY types */
    const char* const* string_array; /* each NUL-terminated */
    const int64_t* int_array;
    const double* float_array;
} grove_config_value;

typedef struct grove_config {
    uint32_t struct_size;
    uint32_t count;
    const grove_config_value* values;
    const char* raw_toml;    /* NUL-terminated: the instance's whole table as TOML */
    const char* source_name; /* NUL-terminated, e.g. "grove.toml:14 [[rewards]] #2"; for messages */
    /* ABI 1.7: NUL-terminated absolute folder that relative paths in this table are relative to (the
     * manifest's); read it with GROVE_HAS_FIELD, and use the current folder when it is absent */
    const char* base_dir;
} grove_config;

/* Find a key; NULL if the manifest did not set it. */
static inline const grove_config_value* grove_config_find(const grove_config* config, const char* key) {
    uint32_t i;
    if (!config) return NULL;
    for (i = 0; i < config->count; ++i) {
        const char* a = config->values[i].key;
        const char* b = key;
        while (*a && *a == *b) {
            ++a;
            ++b;
        }
        if (*a == *b) return &config->values[i];
    }
    return NULL;
}
static inline double grove_config_float(const grove_config* c, const char* key, double fallback) {
    const grove_config_value* v = grove_config_find(c, key);
    return v ? v->float_value : fallback;
}
static inline int64_t grove_config_int(const grove_config* c, const char* key, int64_t fallback) {
    const grove_config_value* v = grove_config_find(c, key);
    return v ? v->int_value : fallback;
}
static inline int grove_config_bool(const grove_config* c, const char* key, int fallback) {
    const grove_config_value* v = grove_config_find(c, key);
    return v ? v->bool_value : fallback;
}
static inline const char* grove_config_string(const grove_config* c, const char* key, const char* fallback) {
    const grove_config_value* v = grove_config_find(c, key);
    return v ? v->string_value : fallback;
}

/* ============================================================================================
 * 5. The descriptor and the entry point
 * ============================================================================================
 * A library exports exactly one symbol:
 *
 *     GROVE_EXPORT const grove_plugin_list* grove_plugin_entry(const grove_host_api* host);
 *
 * The host calls it once after loading the library, passing its own API table (which outlives
 * every call into the library). It returns a list with static storage. The list's first three
 * fields are frozen forever so that any host can read the ABI version of any plugin.
 */
#define GROVE_PLUGIN_ENTRY_SYMBOL "grove_plugin_entry"

typedef enum grove_plugin_flags {
    GROVE_PLUGIN_THREAD_SAFE = 1u << 0,   /* instances may be called from several threads at once */
    GROVE_PLUGIN_DETERMINISTIC = 1u << 1, /* same inputs (and seed) give the same outputs */
    /* reductions: the sum of micro-batch losses over any equal-size split of a generation batch
     * (with gradient accumulation over the split) equals the whole-batch loss */
    GROVE_PLUGIN_SPLIT_INVARIANT = 1u << 2,
    /* adapters: the base model's own weights are trained (the "full" adapter sets it) */
    GROVE_PLUGIN_TRAINS_BASE_WEIGHTS = 1u << 3,
    /* rewards (ABI 1.1): `grove eval` reports this reward's mean as "accuracy" (1 = right answer)
     * or as "format_rate" (1 = well-formed); a manifest's [[rewards]] role overrides it */
    GROVE_PLUGIN_REPORTS_ACCURACY = 1u << 4,
    GROVE_PLUGIN_REPORTS_FORMAT_RATE = 1u << 5
} grove_plugin_flags;

typedef struct grove_host_api grove_host_api;
typedef struct grove_reward_api grove_reward_api;
typedef struct grove_reduction_api grove_reduction_api;
typedef struct grove_adapter_api grove_adapter_api;
typedef struct grove_environment_api grove_environment_api;
typedef struct grove_objective_api grove_objective_api;

typedef struct grove_plugin_descriptor {
    uint32_t struct_size;
    uint32_t kind;           /* grove_plugin_kind */
    const char* name;        /* unique among all plugins Grove can see; [a-z0-9_-]+ */
    const char* version;     /* the plugin's own version, e.g. "1.2.0" */
    const char* description; /* one line for `grove plugins list` */
    uint64_t flags;          /* grove_plugin_flags */
    const grove_config_key* config_keys;
    uint32_t config_key_count;
    const char* const* metric_names; /* rewards: per-row metrics; objectives: the metrics it logs */
    uint32_t metric_count;

    /* create one instance from its configuration; *instance may stay NULL if no state is needed */
    grove_status (*create)(const grove_config* config, void** instance, grove_error_sink* err);
    void (*destroy)(void* instance); /* may be NULL; never fails */

    /* exactly one of these is non-NULL, matching `kind` */
    const grove_reward_api* reward;
    const grove_reduction_api* reduction;
    const grove_adapter_api* adapter;
    const grove_environment_api* environment; /* ABI 1.2; older descriptors end before it */
    const grove_objective_api* objective;     /* ABI 1.5 */
} grove_plugin_descriptor;

typedef struct grove_plugin_list {
    uint32_t struct_size; /* frozen: first three fields of every ABI major */
    uint32_t abi_major;   /* set to GROVE_ABI_MAJOR */
    uint32_t abi_minor;   /* set to GROVE_ABI_MINOR */
    uint32_t count;
    const grove_plugin_descriptor* const* plugins;
} grove_plugin_list;

/* What the host offers every plugin. Keep the pointer: it outlives the library's use. */
struct grove_host_api {
    uint32_t struct_size;
    uint32_t abi_major;
    uint32_t abi_minor;
    const char* host_version; /* e.g. "0.1.0" */
    /* level: 0 debug, 1 info, 2 warning. plugin_name and message NUL-terminated, copied. */
    void (*log)(int32_t level, const char* plugin_name, const char* message);
};

typedef const grove_plugin_list* (*grove_plugin_entry_fn)(const grove_host_api* host);

/* ============================================================================================
 * 6. Reward plugins
 * ============================================================================================
 * score() is called once per batch, not once per completion. Rows are GROUP-MAJOR: rows
 * [g*G, (g+1)*G) are the G = num_generations completions of the same prompt. The host pre-fills
 * scores (and metrics) with NaN; write one float per row. Leave NaN where the reward does not
 * apply (e.g. no reference answer): the host then excludes that row from this reward's sum, as TRL
 * does with None.
 *
 * A reward whose mean is a right-answer rate sets GROVE_PLUGIN_REPORTS_ACCURACY in its flags (a
 * well-formedness rate: GROVE_PLUGIN_REPORTS_FORMAT_RATE); `grove eval` then reports it as
 * "accuracy" ("format rate"). The host never guesses this from a plugin's name.
 *
 * With an environment (section 9) a completion is a whole episode: the model's turns with the
 * environment's observations between them, as the model saw them. `completions` and
 * `completion_tokens` hold all of it; `model_token_mask` (ABI 1.4) says which tokens the model wrote,
 * so a reward can judge only the model's words, e.g. its final answer after the last observation,
 * or count its tool calls. Counting the model's tokens of row i:
 *
 *   int64_t model_tokens = 0;
 *   for (int64_t t = b->completion_token_offsets[i]; t < b->completion_token_offsets[i + 1]; ++t)
 *       model_tokens += b->model_token_mask[t];
 *
 * A user may run your reward (or environment, section 9) in a worker process of its own
 * (isolation = "process"), so that a crash or a hang cannot take the training run with it. Nothing
 * changes for you: the same library, create() once, score() per batch, destroy() at the end. Do not
 * count on sharing memory with other plugins, and note that what you print on stdout appears on
 * stderr there.
 */
typedef struct grove_text {
    const char* data; /* UTF-8, NOT necessarily NUL-terminated */
    size_t size;      /* bytes */
} grove_text;

typedef struct grove_reward_batch {
    uint32_t struct_size;
    uint32_t count;                /* rows n = prompts x num_generations (local to this process) */
    uint32_t num_generations;      /* G */
    const grove_text* prompts;     /* [n] the prompt as the model saw it (chat template applied) */
    const grove_text* completions; /* [n] decoded completion, special tokens removed */
    /* completion token ids in CSR form: row i is tokens[offsets[i] .. offsets[i+1]) */
    const int64_t* completion_token_offsets; /* [n+1] */
    const int32_t* completion_tokens;
    const uint8_t* truncated;   /* [n] 1 when the completion hit max_completion_length without EOS */
    const grove_text* row_json; /* [n] the dataset row's other columns as a JSON object */
    int64_t step;               /* optimizer step that generated this batch */
    uint64_t seed;              /* derived from the run seed and step: use it for any randomness */
    uint32_t rank;              /* this process, of world_size (torch.distributed terms) */
    uint32_t world_size;
    uint64_t global_row_offset; /* index of row 0 in the global generation batch */
    /* ABI 1.4: who wrote each completion token, aligned with completion_tokens (same CSR offsets):
     * 1 = the model sampled it, 0 = an environment inserted it (a tool's observation, section 9;
     * TRL's env_mask). All 1 for single-turn completions. A plugin built for 1.4 that may run under
     * an older host reads it only if GROVE_HAS_FIELD(batch, grove_reward_batch, model_token_mask). */
    const uint8_t* model_token_mask;
    /* ABI 1.7: each row's prompt as the dataset gave it, as JSON: a string for a text prompt, or a
     * list of {"role", "content"} messages for a conversation (which `prompts` holds rendered with
     * the chat template). NULL when the rows come from no dataset prompt. TRL's reward functions
     * see this form: a list of messages makes the batch "conversational". */
    const grove_text* prompt_json;
    int64_t max_steps; /* ABI 1.7: the run's optimizer steps in all (TRL's trainer_state.max_steps); 0 = unknown */
    /* ABI 1.10: an episode's turns (section 9), each decoded with its special tokens kept, in CSR
     * form: row i's turns are episode_turns[episode_turn_offsets[i] .. episode_turn_offsets[i+1]).
     * They alternate, the model's first: a model turn, the environment's observation after it, the
     * next model turn, ... (where model_token_mask changes; an episode always has its first turn,
     * which may be empty). A row that is no episode (a run without an environment) has none: read
     * `completions`. Both NULL when no row has turns; read them only if
     * GROVE_HAS_FIELD(batch, grove_reward_batch, episode_turns). */
    const uint64_t* episode_turn_offsets; /* [n+1] */
    const grove_text* episode_turns;
} grove_reward_batch;

typedef struct grove_reward_output grove_reward_output;
struct grove_reward_output {
    uint32_t struct_size;
    float* scores;         /* [n], host-owned, pre-filled with NaN */
    uint32_t metric_count; /* = the descriptor's metric_count */
    float* metrics;        /* [metric_count * n]: metric m of row i at metrics[m*n + i]; NaN-filled */
    /* ABI 1.7: log one scalar for this batch under a name of your choosing (TRL's log_metric), for
     * metrics not known when the descriptor is written. metrics.jsonl shows `name` as the mean of
     * the values logged in the step, over every process; every process must log the same names, and
     * at most n values per name and batch. Call it as out->log_metric(out, "name", value). */
    void* host_data; /* the host's; do not touch */
    void (*log_metric)(grove_reward_output* out, const char* name, double value);
    /* ABI 1.8: log one value per row under a column name (TRL's log_extra), e.g. what a row's answer
     * was parsed as. values[i] is row i's value as JSON text (a number, "a string", null, ...), for
     * the first `count` rows (count <= n); calling it again for the same column fills the rows after.
     * completions.jsonl shows the values under "extra"; a value that is not JSON is an error. A host
     * before 1.8 has no such field: call it only when GROVE_HAS_FIELD(out, grove_reward_output,
     * log_extra), as out->log_extra(out, "column", values, count). */
    void (*log_extra)(grove_reward_output* out, const char* column, const grove_text* values, uint32_t count);
};

struct grove_reward_api {
    uint32_t struct_size;
    grove_status (*score)(void* instance, const grove_reward_batch* batch, grove_reward_output* out, grove_error_sink* err);
};

/* ============================================================================================
 * 7. Reduction plugins
 * ============================================================================================
 * Every loss normalisation in use (TRL's grpo, bnpo, dr_grpo, dapo) is a per-token weight that
 * depends only on the mask and a few counts. The host computes, with autograd,
 *
 *     loss(micro-batch) = sum_{b,t} weight[b,t] * (policy_term[b,t] + beta * kl[b,t])
 *
 * so the KL term is always reduced exactly like the policy term. The loss returned per micro-batch
 * is what is back-propagated: if your normalisation needs a division by gradient-accumulation steps,
 * put it in the weights. Masked positions must get weight 0. Denominators must be clamped to >= 1 so
 * that a fully masked batch gives weight 0 everywhere, never NaN.
 */
typedef struct grove_reduction_context {
    uint32_t struct_size;
    uint32_t rows;                        /* B: rows of this micro-batch on this process */
    uint32_t columns;                     /* T: completion positions per row (padded) */
    const float* mask;                    /* [B*T] row-major, 1 = completion token that counts, 0 = padding/masked */
    uint32_t gradient_accumulation_steps; /* micro-batches per optimizer step */
    uint32_t steps_per_generation;        /* micro-batches per generation batch */
    uint32_t world_size;                  /* processes; DDP averages gradients over them */
    uint32_t max_completion_length;
    /* masked-token and sequence counts of the whole generation batch, summed over all processes */
    double generation_batch_tokens;
    double generation_batch_sequences;
    /* masked-token count of the micro-batches whose gradients accumulate into the SAME optimizer
     * step as this one, summed over all processes. Equals generation_batch_tokens when
     * steps_per_generation == gradient_accumulation_steps (the default). */
    double optimizer_window_tokens;
} grove_reduction_context;

struct grove_reduction_api {
    uint32_t struct_size;
    /* fill weight[B*T] (row-major, host-owned) for this micro-batch */
    grove_status (*weights)(void* instance, const grove_reduction_context* ctx, float* weight, grove_error_sink* err);
};

/* ============================================================================================
 * 8. Adapter plugins and the host tensor-op table
 * ============================================================================================
 * An adapter decides which parameters train. The host walks the model's linear layers and calls
 * attach() for each; the adapter may create parameters for that layer through `ops` and return a
 * layer state. On every forward of an attached layer the host calls forward() with the layer input
 * x [..., in] and adds the returned delta [..., out] to the base output W x + b. Tensors are opaque
 * handles; the host runs each op in libtorch and records autograd, so gradients reach your
 * parameters without you linking libtorch.
 *
 * Handle lifetime: parameters live as long as the adapter instance. Every other handle (op results,
 * the x you are given) lives until the call that produced it returns.
 *
 * Saving and merging: a checkpoint holds your parameters (adapter_model.safetensors, under the names
 * you gave them), your saved_config_json (adapter_config.json) and which plugin and configuration
 * made it (grove_adapter.json). `grove export --merge` re-creates your adapter from that record,
 * attaches it, loads the parameters and adds merged_delta() to each layer's weight, so implement
 * merged_delta() exactly as the weight change forward() applies.
 *
 * Adapters that rescale the layer (ABI 1.13). DoRA (the lora plugin's use_dora) multiplies each
 * output row of W + BA by a trained magnitude over that row's norm. Such an adapter needs the layer
 * itself, so the op table has (check GROVE_HAS_FIELD(ops, grove_tensor_ops, base_weight) first; an
 * older host lacks them):
 *   base_weight()     W [out, in], read-only and without gradient, in attach, forward and merged_delta;
 *   base_output(x)    forward() only: W x without the bias (free for the x the host passed in);
 *   parameter_from()  a parameter that starts as a copy of a tensor you computed (the rows' norms of W);
 *   detach(), div(), row_norm(), reshape()  the arithmetic the rescaling needs.
 * The host still adds what forward() returns to W x + b, so return (scale - 1) * W x + scale * delta.
 */
typedef struct grove_tensor_opaque* grove_tensor;
typedef struct grove_op_context grove_op_context; /* the host's, per call */

typedef enum grove_init {
    GROVE_INIT_ZEROS = 1,
    GROVE_INIT_KAIMING_UNIFORM = 2, /* U(-b, b), b = gain*sqrt(3/fan_in), gain = sqrt(2/(1+a^2)); arg = a */
    GROVE_INIT_NORMAL = 3,          /* N(0, arg^2) */
    GROVE_INIT_ONES = 4
} grove_init;

typedef struct grove_tensor_ops {
    uint32_t struct_size;
    /* A trainable parameter of the current layer. `name` is its PEFT-style suffix, e.g.
     * "lora_A.weight"; saved as "base_model.model.<layer name>.<name>". attach() only. */
    grove_status (*parameter)(grove_op_context* ctx, const char* name, uint32_t ndim, const int64_t* shape, uint32_t init,
                              double init_arg, grove_tensor* out, grove_error_sink* err);
    /* y = x @ w^T  (x [..., in], w [out, in]) */
    grove_tensor (*linear)(grove_op_context* ctx, grove_tensor x, grove_tensor w);
    /* a @ b for 2-D tensors */
    grove_tensor (*matmul)(grove_op_context* ctx, grove_tensor a, grove_tensor b);
    grove_tensor (*add)(grove_op_context* ctx, grove_tensor a, grove_tensor b);
    grove_tensor (*mul)(grove_op_context* ctx, grove_tensor a, grove_tensor b);
    grove_tensor (*scale)(grove_op_context* ctx, grove_tensor a, double factor);
    /* dropout with probability p; identity when the host is not training or p == 0 */
    grove_tensor (*dropout)(grove_op_context* ctx, grove_tensor a, double p);
    /* number of dimensions; writes up to max_dims sizes */
    uint32_t (*shape)(grove_op_context* ctx, grove_tensor a, int64_t* sizes, uint32_t max_dims);
    /* ABI 1.13 (see "Adapters that rescale the layer" above) */
    /* the current layer's weight W [out, in]: read-only, no gradient flows into it */
    grove_tensor (*base_weight)(grove_op_context* ctx);
    /* forward() only: W x without the bias, for this call's x or a tensor shaped like it (x after
     * dropout); for x itself, and for dropout's unchanged x outside training, the host has it already */
    grove_tensor (*base_output)(grove_op_context* ctx, grove_tensor x);
    /* attach() only: a trainable parameter whose initial value is a copy of `initial` */
    grove_status (*parameter_from)(grove_op_context* ctx, const char* name, grove_tensor initial, grove_tensor* out,
                                   grove_error_sink* err);
    /* the same values with no gradient flowing back through them */
    grove_tensor (*detach)(grove_op_context* ctx, grove_tensor a);
    /* a / b, elementwise, broadcasting as add and mul do */
    grove_tensor (*div)(grove_op_context* ctx, grove_tensor a, grove_tensor b);
    /* the L2 norm of each row of a 2-D tensor: [rows, cols] -> [rows] */
    grove_tensor (*row_norm)(grove_op_context* ctx, grove_tensor a);
    /* the same values in another shape; one size may be -1 (inferred) */
    grove_tensor (*reshape)(grove_op_context* ctx, grove_tensor a, uint32_t ndim, const int64_t* shape);
} grove_tensor_ops;
/* Ops return NULL on failure (shape mismatch, ...): the host has then already recorded why; return
 * any non-OK status and it will report the first failure. */

typedef struct grove_linear_info {
    uint32_t struct_size;
    const char* name;       /* full module name, e.g. "model.layers.0.self_attn.q_proj" */
    const char* short_name; /* last component, e.g. "q_proj" */
    int64_t in_features;
    int64_t out_features;
    uint32_t layer_index; /* decoder layer, or UINT32_MAX outside the decoder stack */
    uint32_t has_bias;
} grove_linear_info;

/* Where an adapter writes text for the host (its saved configuration). The host copies it. */
typedef struct grove_text_sink grove_text_sink;
struct grove_text_sink {
    uint32_t struct_size;
    void* host_data;
    void (*append)(grove_text_sink* sink, const char* data, size_t size);
};

struct grove_adapter_api {
    uint32_t struct_size;
    /* Called once per linear layer. Set *layer_state to non-NULL to attach (your own pointer, or
     * any non-NULL token) and create its parameters with ops->parameter; leave NULL to skip. */
    grove_status (*attach)(void* instance, const grove_linear_info* layer, const grove_tensor_ops* ops, grove_op_context* ctx,
                           void** layer_state, grove_error_sink* err);
    /* The delta to add to the base output. params: this layer's parameters, in creation order. */
    grove_status (*forward)(void* instance, void* layer_state, const grove_tensor_ops* ops, grove_op_context* ctx,
                            const grove_tensor* params, uint32_t param_count, grove_tensor x, grove_tensor* delta,
                            grove_error_sink* err);
    /* The weight delta [out, in] that merging adds to W (for export without the adapter). */
    grove_status (*merged_delta)(void* instance, void* layer_state, const grove_tensor_ops* ops, grove_op_context* ctx,
                                 const grove_tensor* params, uint32_t param_count, grove_tensor* delta_weight,
                                 grove_error_sink* err);
    /* Release a layer state from attach(); may be NULL. */
    void (*detach)(void* instance, void* layer_state);
    /* The adapter's saved configuration as a JSON object (PEFT's adapter_config.json); may be NULL
     * for adapters that save nothing beyond the model. */
    grove_status (*saved_config_json)(void* instance, grove_text_sink* out, grove_error_sink* err);
};

/* ============================================================================================
 * 9. Environment plugins (ABI 1.2; score_episodes 1.3; begin_episodes 1.7; episode_reward 1.9): multi-turn episodes and tools
 * ============================================================================================
 * An episode starts from a dataset row's prompt. The model writes a turn, which ends at EOS, at one
 * of the environment's stop strings (say "</calc>"), or when the episode's token budget
 * (max_completion_length, which counts every token of the episode) runs out. The host then calls
 * step() once for ALL episodes waiting on the environment, never once per episode. For each one,
 * the environment appends the observation to its sink (say "<result>42</result>"), or appends
 * nothing, or sets done. The host tokenizes the observation once, appends its tokens to the
 * episode, and the model writes its next turn after them.
 *
 * An episode ends when:
 *   - the environment sets done, or appends no observation;
 *   - the model has written max_turns turns (the manifest's [environment] max_turns, if set);
 *   - the budget is spent. An observation longer than the remaining budget (or that would bring
 *     the sequence to the model's max_position_embeddings) is left out whole and the episode ends
 *     with the model's turn, as TRL rolls back a tool result that does not fit.
 *
 * The host works in token space and never re-tokenizes an episode's history. The observation's
 * tokens are context: they are excluded from the loss, the KL term, the reductions' token counts and
 * the completion lengths (TRL's env_mask = 0). Rewards see the whole episode, text and ids, and
 * (ABI 1.4) grove_reward_batch.model_token_mask says which tokens are the environment's (section 6),
 * so a reward can judge the model's final answer alone or count the observations it got; (ABI 1.10)
 * grove_reward_batch.episode_turns holds the same episode cut into its turns, as text.
 *
 * step() gets the model's last turn decoded with its special tokens kept (a tool's tag may be one;
 * a turn that ended with EOS ends with its text), and its token ids. Count
 * the tool calls and failed calls you saw in tool_calls and tool_failures: the host logs TRL's
 * tools/call_frequency and tools/failure_frequency from them. A failed call should still get an
 * observation (an error message the model can learn from); a step() that returns an error status
 * stops the run with your message, so keep that for broken configuration, not for bad tool calls.
 *
 * An environment may also judge whole episodes (ABI 1.3, optional; TRL's environment reward). The
 * host calls score_episodes() once per generation batch, after every episode has ended, with the
 * same batch struct describing each whole episode: turn_texts and turn_tokens hold the whole
 * completion (every model turn and observation, special tokens kept), turns the number of model
 * turns, turn_ended_with_eos whether the last model turn ended with EOS. Write episode i's score to
 * rewards[i] (host-filled NaN: no score). The manifest's [environment] reward_weight (or your
 * episode_reward, below) makes it a reward column, named by reward_name (else by episode_reward,
 * else "environment"), weighted like any [[rewards]] entry. Plugins built for 1.2
 * end their api struct before score_episodes; the host reads it only when struct_size covers it.
 *
 * Whether that judgement is a reward may also be the plugin's to say (ABI 1.9, optional):
 * episode_reward() tells, once after create(), how this instance's judgement counts, which matters
 * when it depends on the configuration (a Python class with or without TRL's get_reward()):
 *   GROVE_EPISODES_UNJUDGED           this instance judges nothing; score_episodes is never called
 *   GROVE_EPISODES_JUDGED_ON_REQUEST  a reward column when the manifest sets reward_weight (what a
 *                                     plugin with score_episodes and no episode_reward gets)
 *   GROVE_EPISODES_JUDGED_AS_REWARD   a reward column even without reward_weight, weighted 1: TRL
 *                                     adds an environment's get_reward() to the rewards this way
 * and the column's name for a manifest that sets no reward_name (TRL: the class's name; empty:
 * "environment"). The manifest's reward_weight and reward_name override both.
 *
 * An environment may also prepare each episode before the model's first turn (ABI 1.7, optional):
 * begin_episodes() gets every episode of the generation batch once, before generation, and may add
 * text to each episode's prompt (say, the board of a game reset for this episode). And it may
 * describe its tools (ABI 1.7, optional): tools_json() gives their schemas, which the host writes
 * into the prompt as the model's chat template does (ChatML models: the Qwen2.5 / Hermes "# Tools"
 * block, whose calls look like <tool_call>{"name": ..., "arguments": {...}}</tool_call>; Llama 3.1 /
 * 3.2: the first user message, whose calls are a whole turn {"name": ..., "parameters": {...}}).
 */
typedef struct grove_environment_batch {
    uint32_t struct_size;
    uint32_t count;                     /* episodes waiting on the environment, n */
    const uint64_t* episodes;           /* [n] each episode's row in the generation batch */
    const uint32_t* turns;              /* [n] model turns written so far (>= 1) */
    const grove_text* turn_texts;       /* [n] the last turn, decoded, special tokens kept */
    const int64_t* turn_token_offsets;  /* [n+1] CSR: turn i is turn_tokens[offsets[i] .. offsets[i+1]) */
    const int32_t* turn_tokens;         /* the last turns' token ids */
    const uint8_t* turn_ended_with_eos; /* [n] 1 when the turn ended with EOS, 0 with a stop string */
    const grove_text* prompts;          /* [n] the prompt as the model saw it */
    const grove_text* row_json;         /* [n] the dataset row's other columns as a JSON object */
    int64_t step;                       /* optimizer step that generates this batch */
    uint64_t seed;                      /* derived from the run seed and step */
    /* ABI 1.7: [n] the dataset's prompt as JSON (a string, or a list of messages), as in the reward
     * batch; NULL when there is none. TRL's environments are reset with it (reset(prompt=..., ...)).
     * ABI 1.12: an empty text: the dataset row has no prompt (an environment's run takes such rows, each one
     * empty user message the environment completes, and TRL resets it without `prompt`). */
    const grove_text* prompt_json;
} grove_environment_batch;

/* episode_reward()'s answers (ABI 1.9) */
#define GROVE_EPISODES_UNJUDGED 0u
#define GROVE_EPISODES_JUDGED_ON_REQUEST 1u
#define GROVE_EPISODES_JUDGED_AS_REWARD 2u

typedef struct grove_environment_output {
    uint32_t struct_size;
    grove_text_sink* const* observations; /* [n] append episode i's observation to observations[i] */
    uint8_t* done;                        /* [n] host-filled 0; 1 ends the episode */
    uint32_t* tool_calls;                 /* [n] host-filled 0: tool calls in this turn */
    uint32_t* tool_failures;              /* [n] host-filled 0: of which failed */
} grove_environment_output;

struct grove_environment_api {
    uint32_t struct_size;
    /* Strings that end a model turn besides EOS: set *strings to a NULL-terminated array valid
     * until destroy() (the host copies it once, after create()), or leave it NULL for none. The
     * turn keeps the token that completes the string. */
    grove_status (*stop_strings)(void* instance, const char* const** strings, grove_error_sink* err);
    grove_status (*step)(void* instance, const grove_environment_batch* batch, grove_environment_output* out,
                         grove_error_sink* err);
    /* ABI 1.3, may be NULL: rewards[i] = your score of whole episode i (see above) */
    grove_status (*score_episodes)(void* instance, const grove_environment_batch* episodes, float* rewards,
                                   grove_error_sink* err);
    /* ABI 1.7, may be NULL: called once per generation batch before the model writes, with every
     * episode (turns 0, no turn text): set up each episode's state and append to observations[i]
     * any text for episode i's prompt (TRL's reset() observation). The host adds it to the end of
     * the prompt's last message (re-rendered with the chat template), or of a text prompt; the
     * model, the rewards and training then see that prompt. done and the tool counts are ignored. */
    grove_status (*begin_episodes)(void* instance, const grove_environment_batch* episodes, grove_environment_output* out,
                                   grove_error_sink* err);
    /* ABI 1.7, may be NULL: append to `out` the environment's tools as a JSON array of function
     * schemas, [{"type": "function", "function": {"name", "description", "parameters"}}, ...] (what
     * transformers' get_json_schema makes of a documented Python function). The host renders them
     * into every conversation's system prompt with the chat template, as apply_chat_template(tools=)
     * does; called once, after create().
     * ABI 1.11: or, for an environment that is several (TRL's environment_factory={name: factory}),
     * a JSON object {"select_by": COLUMN, "tools": {VALUE: [schemas...], ...}}: each row gets the
     * list named by its dataset column COLUMN (an empty list: no tools), and a row without the column
     * or with another value is refused, naming the row.
     * ABI 1.12: that object may also hold "reward_names": {VALUE: NAME, ...}: when the environment's
     * judgement is a reward and the manifest gives no reward_name, each named value's rows score
     * into a column NAME (values sharing a name share it), NaN in the others, and the rows of values
     * not named are not counted; as TRL logs one column per environment class with get_reward().
     * Without it (or with reward_name) every row scores into the one column. */
    grove_status (*tools_json)(void* instance, grove_text_sink* out, grove_error_sink* err);
    /* ABI 1.9, may be NULL: how this instance's judgement of whole episodes counts (see above): set
     * *judgement (host-filled GROVE_EPISODES_JUDGED_ON_REQUEST when score_episodes is set, else
     * GROVE_EPISODES_UNJUDGED) and append the reward column's default name to `name` (or nothing).
     * Called once, after create(). */
    grove_status (*episode_reward)(void* instance, uint32_t* judgement, grove_text_sink* name, grove_error_sink* err);
};

/* ============================================================================================
 * 10. A complete reward plugin, in C
 * ============================================================================================
 *
 *   #include <grove/grove_plugin.h>
 *   #include <string.h>
 *
 *   // 1.0 when the completion is non-empty and shorter than `max_bytes` (default 100)
 *   typedef struct { int64_t max_bytes; } short_answer;
 *
 *   static const grove_config_key keys[] = {
 *       {sizeof(grove_config_key), "max_bytes", GROVE_VALUE_INT, 0, "100", "longest accepted completion"},
 *   };
 *   static grove_status create(const grove_config* c, void** instance, grove_error_sink* err) {
 *       short_answer* s = malloc(sizeof *s);
 *       if (!s) return grove_fail(err, GROVE_ERROR_OUT_OF_MEMORY, NULL, "out of memory");
 *       s->max_bytes = grove_config_int(c, "max_bytes", 100);
 *       if (s->max_bytes <= 0) { free(s); return grove_fail(err, GROVE_ERROR_CONFIG, "max_bytes", "must be > 0"); }
 *       *instance = s;
 *       return GROVE_OK;
 *   }
 *   static void destroy(void* instance) { free(instance); }
 *   static grove_status score(void* instance, const grove_reward_batch* b, grove_reward_output* out,
 *                             grove_error_sink* err) {
 *       const short_answer* s = instance;
 *       for (uint32_t i = 0; i < b->count; ++i)
 *           out->scores[i] = (b->completions[i].size > 0 && (int64_t)b->completions[i].size < s->max_bytes);
 *       return GROVE_OK;
 *   }
 *   static const grove_reward_api api = {sizeof(grove_reward_api), score};
 *   static const grove_plugin_descriptor descriptor = {
 *       sizeof(grove_plugin_descriptor), GROVE_PLUGIN_KIND_REWARD, "short_answer", "1.0.0",
 *       "1.0 for a non-empty completion shorter than max_bytes",
 *       GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC, keys, 1, NULL, 0,
 *       create, destroy, &api, NULL, NULL, NULL, NULL};
 *   static const grove_plugin_descriptor* const all[] = {&descriptor};
 *   static const grove_plugin_list list = {sizeof(grove_plugin_list), GROVE_ABI_MAJOR, GROVE_ABI_MINOR, 1, all};
 *
 *   GROVE_EXPORT const grove_plugin_list* grove_plugin_entry(const grove_host_api* host) {
 *       (void)host;
 *       return &list;
 *   }
 *
 * Build it against the installed SDK (CMake: find_package(GroveSDK) and link GroveSDK::sdk, or
 * pkg-config grove-sdk), name it in a manifest by path (`plugin = "./libshort_answer.so"`) or put
 * it in a directory on GROVE_PLUGIN_PATH and name it "short_answer".
 */

/* ============================================================================================
 * 11. Objective plugins: the policy loss and its gradient
 * ============================================================================================
 * Every policy-gradient objective in use (GRPO's clipped ratio, GSPO, CISPO, SAPO, ...) reaches the
 * model's weights only through the log-probabilities logp[b,t] of the sampled tokens. So an
 * objective needs no autograd: given the VALUES of logp (and of the old, reference and sampler
 * log-probabilities, the advantages and the reduction's weights), it returns the loss and
 *
 *     grad[b,t] = d loss / d logp[b,t]        (the total derivative: a sequence-level ratio
 *                                              couples every token of its row)
 *
 * and the host back-propagates  sum_{b,t} stop_gradient(grad[b,t]) * logp[b,t]  through the model.
 * Why this is exact: the loss depends on the weights theta only through logp, so by the chain rule
 * d loss/d theta = sum_{b,t} (d loss/d logp[b,t]) (d logp[b,t]/d theta), which is precisely the
 * gradient of that surrogate with grad held constant. Nothing is approximated; the loss you report
 * is what the host logs and checks (a NaN or infinite loss or grad stops the run, naming you).
 *
 * The host keeps what is not the objective's: the reduction (`weights`, section 7: the loss you
 * return should be sum_{b,t} weights[b,t] * your per-token loss, so every normalisation works with
 * every objective), the entropy metric, and the options of the manifest's [loss] table, which
 * arrive in the batch (epsilon, beta, ...). The default objective "clipped" is GRPO's (and, with
 * importance_sampling_level = sequence, GSPO's); its source, plugins/objectives/, is a worked example.
 * Positions where mask is 0 carry weight 0; their grad must be 0.
 *
 * Since ABI 1.6 the host's options may also shape the POLICY term (not the KL term): policy_mask
 * (the highest-entropy tokens, off-policy rows dropped) and sampling_ratio (the correction between
 * the sampler's and the trainer's log-probabilities). Both are constants, so per token
 *     loss  = sum w * (policy_mask * sampling_ratio * P + beta * kl)
 * and the gradient scales the same way. An objective built against 1.5 cannot see them: the host
 * refuses to run it with those options rather than silently ignore them. vespo in
 * plugins/objectives/ shows an objective that uses sampling_ratio inside its own weight instead.
 *
 * Metrics: name them in the descriptor's metric_names and say in metric_aggregation how the host
 * combines a micro-batch's (sum, count) over processes: GROVE_METRIC_MEAN logs
 * sum over processes of sum / max(sum over processes of count, 1) (TRL's masked mean); MIN and MAX
 * log the least / greatest `sum` over processes (NaN = none). Each line of metrics.jsonl then holds
 * the mean over the step's micro-batches. The host pre-fills sums and counts with NaN; a MEAN metric
 * whose count stays NaN is not logged (e.g. kl when beta = 0).
 */
typedef enum grove_importance_level {
    GROVE_IMPORTANCE_TOKEN = 0,   /* a ratio per token */
    GROVE_IMPORTANCE_SEQUENCE = 1 /* one ratio per row: the mean log-ratio over its masked tokens (GSPO) */
} grove_importance_level;

typedef enum grove_metric_aggregation {
    GROVE_METRIC_MEAN = 0,
    GROVE_METRIC_MIN = 1,
    GROVE_METRIC_MAX = 2
} grove_metric_aggregation;

typedef struct grove_objective_batch {
    uint32_t struct_size;
    uint32_t rows;    /* B */
    uint32_t columns; /* T: completion positions per row (padded) */
    /* [B*T] row-major, float32 values */
    const float* logp;       /* the policy's log-probabilities now (the values; the host holds the graph) */
    const float* old_logp;   /* at generation (off-policy passes), or NULL: then old = logp, ratio 1 */
    const float* ref_logp;   /* the reference model's, or NULL (beta = 0) */
    const float* mask;       /* 1 = a token of the loss */
    const float* weights;    /* the reduction plugin's (section 7) */
    const float* advantages; /* [B] */
    /* the manifest's [loss] options (TRL's names) */
    double beta;                     /* KL coefficient */
    double epsilon, epsilon_high;    /* the clip range [1 - epsilon, 1 + epsilon_high] */
    double delta;                    /* upper cap of the ratio (two-sided clipping), NaN = none */
    uint32_t importance_level;       /* grove_importance_level */
    uint32_t use_bias_correction_kl; /* 1: the KL term is multiplied by the importance ratio */
    /* ABI 1.6: the host's masks and weights on the policy term (the KL term never gets them) */
    const float* policy_mask;    /* [B*T] 0/1, or NULL (all 1): top_entropy_quantile's and
                                    off_policy_mask_threshold's masks; multiply your policy term by it */
    const float* sampling_ratio; /* [B*T], or NULL: the importance-sampling correction pi_old / pi_sampler
                                    (truncated or masked, per token or per row broadcast over it);
                                    multiply your policy term by it, or use it inside your own weight */
} grove_objective_batch;

typedef struct grove_objective_output {
    uint32_t struct_size;
    double loss;           /* sum over tokens of weight * your per-token loss */
    float* grad;           /* [B*T], host-owned, zero-filled: d loss / d logp */
    uint32_t metric_count; /* = the descriptor's metric_count */
    double* metric_sums;   /* [metric_count], NaN-filled */
    double* metric_counts; /* [metric_count], NaN-filled */
} grove_objective_output;

struct grove_objective_api {
    uint32_t struct_size;
    /* [metric_count] grove_metric_aggregation of each metric, or NULL: every one MEAN */
    const uint8_t* metric_aggregation;
    grove_status (*loss)(void* instance, const grove_objective_batch* batch, grove_objective_output* out,
                         grove_error_sink* err);
};

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GROVE_PLUGIN_H */
