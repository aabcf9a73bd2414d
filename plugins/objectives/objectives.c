/* The objective plugins that ship with Grove, in plain C against the SDK header alone
 * (docs/objectives.md): "clipped" (the default: GRPO, and GSPO at sequence level), "cispo", "sapo"
 * and "vespo", each equal to TRL's _compute_loss for its loss_type. Per row b with advantage A and
 * token t (w = the reduction's weight, m = the mask, s = the host's policy_mask times its
 * sampling_ratio, each 1 when absent):
 *
 *   ratio      token level:    r = exp(logp - old)
 *              sequence level: r_b = exp(sum_t m (logp - old) / max(sum_t m, 1))   (GSPO)
 *   clipped:  P = -min(c1 A, c2 A), c1 = min(r, delta) when delta is set, else r,
 *                                    c2 = clamp(r, 1 - epsilon, 1 + epsilon_high)
 *   cispo:    P = -stop_gradient(min(r, epsilon_high)) A logp      (epsilon_high is the cap itself)
 *   sapo:     P = -(4 / tau) sigmoid(tau (r - 1)) A, tau = temperature_pos if A > 0 else temperature_neg
 *   vespo:    P = -stop_gradient(phi_b) A logp, phi_b = exp(lambda + k log W - lambda W), a gamma
 *             weight of the row's whole ratio W = exp(clamp(sum_t m clamp(logp - old, +-20)
 *             + sum_t clamp(log sampling_ratio, log 1e-8, 20), log 1e-8, 20)), with (k, lambda) =
 *             (k_pos, lambda_pos) if A >= 0 else (k_neg, lambda_neg); the sampling ratio is inside
 *             phi, so s is the policy mask alone
 *   kl = exp(ref - logp) - (ref - logp) - 1, times r with use_bias_correction_kl
 *   loss = sum_{b,t} w (s P + beta kl)
 *
 * and the exact derivative with respect to each logp, with the subgradients autograd takes: where
 * c1 A == c2 A each branch gets half, clamp passes the gradient on [lo, hi] inclusive, min(r, delta)
 * where r <= delta.
 */
#include <grove/grove_plugin.h>

#include <math.h>
#include <stdlib.h>

typedef enum { CLIPPED, CISPO, SAPO, VESPO } objective_kind;

typedef struct {
    double k_pos, lambda_pos, k_neg, lambda_neg;
} vespo_config;

typedef struct {
    objective_kind kind;
    double lo, hi, delta;                    /* from the batch: the clip range (cispo: hi is the cap), delta (NaN = none) */
    double temperature_pos, temperature_neg; /* sapo, from the plugin's configuration */
    vespo_config vespo;                      /* vespo, from the plugin's configuration */
    double row_phi;                          /* vespo: the current row's weight */
} objective;

typedef struct {
    double value, d_ratio, d_logp; /* the policy term, its derivative by the ratio and by logp directly */
} policy_term;

static double min2(double a, double b) { return a < b ? a : b; }

static policy_term clipped_term(const objective* o, double ratio, double advantage) {
    const int has_delta = !isnan(o->delta);
    const double c1 = has_delta ? min2(ratio, o->delta) : ratio;
    const double c2 = ratio < o->lo ? o->lo : (ratio > o->hi ? o->hi : ratio);
    const double a = c1 * advantage, b = c2 * advantage;
    const double share_a = a < b ? 1.0 : (a == b ? 0.5 : 0.0), share_b = 1.0 - share_a;
    const double d_c1 = has_delta ? (ratio <= o->delta) : 1.0, d_c2 = ratio >= o->lo && ratio <= o->hi;
    policy_term p = {-min2(a, b), -(share_a * advantage * d_c1 + share_b * advantage * d_c2), 0.0};
    return p;
}

static policy_term term(const objective* o, double ratio, double advantage, double logp) {
    policy_term p = {0.0, 0.0, 0.0};
    if (o->kind == CLIPPED) return clipped_term(o, ratio, advantage);
    if (o->kind == CISPO) { /* the capped weight is a constant: the gradient is by logp alone */
        const double weight = min2(ratio, o->hi);
        p.value = -weight * advantage * logp;
        p.d_logp = -weight * advantage;
        return p;
    }
    if (o->kind == VESPO) { /* phi is a constant: the gradient is by logp alone */
        p.value = -o->row_phi * advantage * logp;
        p.d_logp = -o->row_phi * advantage;
        return p;
    }
    const double tau = advantage > 0 ? o->temperature_pos : o->temperature_neg;
    const double s = 1.0 / (1.0 + exp(-tau * (ratio - 1.0)));
    p.value = -s * 4.0 / tau * advantage;
    p.d_ratio = -4.0 * s * (1.0 - s) * advantage;
    return p;
}

/* Whether a token (or, at sequence level, a row) counts as clipped low / high in TRL's metrics. */
static void clip_flags(const objective* o, double ratio, double advantage, int* low, int* high) {
    if (o->kind == CISPO) {
        *low = 0;
        *high = ratio > o->hi && advantage > 0;
        return;
    }
    const double c1 = !isnan(o->delta) ? min2(ratio, o->delta) : ratio; /* the metrics see the capped ratio */
    *low = c1 < o->lo && advantage < 0;
    *high = c1 > o->hi && advantage > 0;
}

/* The host's policy mask and sampling ratio (ABI 1.6), NULL when absent or when the host predates them. */
static const float* policy_mask_of(const grove_objective_batch* in, uint32_t b) {
    return GROVE_HAS_FIELD(in, grove_objective_batch, policy_mask) && in->policy_mask
               ? in->policy_mask + (size_t)b * in->columns
               : NULL;
}
static const float* sampling_ratio_of(const grove_objective_batch* in, uint32_t b) {
    return GROVE_HAS_FIELD(in, grove_objective_batch, sampling_ratio) && in->sampling_ratio
               ? in->sampling_ratio + (size_t)b * in->columns
               : NULL;
}

static double clamp(double x, double lo, double hi) { return x < lo ? lo : (x > hi ? hi : x); }

/* vespo's weight of row b, in log space as TRL's get_gamma_weights: phi(1) = 1, 0 where it overflows. */
static double vespo_phi(const vespo_config* c, const grove_objective_batch* in, uint32_t b) {
    const size_t T = in->columns;
    const float *logp = in->logp + b * T, *m = in->mask + b * T;
    const float* old = in->old_logp ? in->old_logp + b * T : logp;
    const float* sampling = sampling_ratio_of(in, b);
    const double floor = log(1e-8);
    double log_w = 0.0;
    for (size_t t = 0; t < T; ++t) log_w += clamp((double)logp[t] - old[t], -20.0, 20.0) * m[t];
    if (sampling) /* every column, as TRL: padding carries ratio 1, log 0 */
        for (size_t t = 0; t < T; ++t) log_w += clamp(log(sampling[t]), floor, 20.0);
    log_w = clamp(log_w, floor, 20.0);
    const int non_negative = in->advantages[b] >= 0;
    const double k = non_negative ? c->k_pos : c->k_neg;
    const double lambda = fmax(non_negative ? c->lambda_pos : c->lambda_neg, 1e-4);
    const double phi = exp(lambda + k * log_w - lambda * exp(log_w));
    return isfinite(phi) ? phi : 0.0;
}

static double nan_min(double a, double b) { return isnan(a) ? b : (isnan(b) ? a : min2(a, b)); }
static double nan_max(double a, double b) { return isnan(a) ? b : (isnan(b) ? a : (a > b ? a : b)); }

typedef struct {
    double tokens, rows, kl_sum, low_sum, high_sum, region_sum, low_min, high_max, phi_sum;
} sums;

/* One row: its loss into *total, its gradient into grad, its metric sums into *s. */
static void row_loss(objective* o, const grove_objective_batch* in, uint32_t b, double* total, float* grad, sums* s) {
    const size_t T = in->columns;
    const float *logp = in->logp + b * T, *m = in->mask + b * T, *w = in->weights + b * T;
    const float* old = in->old_logp ? in->old_logp + b * T : logp;
    const float* ref = in->ref_logp ? in->ref_logp + b * T : NULL;
    const float* policy_mask = policy_mask_of(in, b);
    const float* sampling = o->kind == VESPO ? NULL : sampling_ratio_of(in, b); /* vespo has it inside phi */
    if (o->kind == VESPO) s->phi_sum += o->row_phi = vespo_phi(&o->vespo, in, b);
    const double advantage = in->advantages[b];
    const int sequence = in->importance_level == GROVE_IMPORTANCE_SEQUENCE, bias = in->use_bias_correction_kl != 0;
    double row_tokens = 0.0, row_log_ratio = 0.0;
    for (size_t t = 0; t < T; ++t) {
        row_tokens += m[t];
        row_log_ratio += ((double)logp[t] - old[t]) * m[t];
    }
    const double divisor = row_tokens > 1.0 ? row_tokens : 1.0, row_ratio = exp(row_log_ratio / divisor);
    double d_row_ratio = 0.0, row_low = 0.0, row_high = 0.0; /* sequence level: d loss / d row_ratio */
    for (size_t t = 0; t < T; ++t) {
        const double ratio = sequence ? row_ratio : exp((double)logp[t] - old[t]);
        const policy_term p = term(o, ratio, advantage, logp[t]);
        const double scale = (policy_mask ? policy_mask[t] : 1.0) * (sampling ? sampling[t] : 1.0);
        double kl = 0.0, d_kl = 0.0; /* d_kl: by logp directly, the ratio held */
        if (in->beta != 0.0) {
            const double d = (double)ref[t] - logp[t];
            kl = exp(d) - d - 1.0;
            d_kl = (1.0 - exp(d)) * (bias ? ratio : 1.0);
        }
        const double kl_term = bias ? kl * ratio : kl;
        *total += w[t] * (scale * p.value + in->beta * kl_term);
        const double d_ratio = scale * p.d_ratio + (bias ? in->beta * kl : 0.0);
        const double direct = w[t] * (scale * p.d_logp + in->beta * d_kl);
        if (sequence) { /* the row ratio's share is added below, once d_row_ratio is complete */
            d_row_ratio += w[t] * d_ratio;
            grad[t] = (float)direct;
        } else {
            grad[t] = (float)(w[t] * d_ratio * ratio + direct);
            int low, high;
            clip_flags(o, ratio, advantage, &low, &high);
            row_low += low * m[t];
            row_high += high * m[t];
            s->region_sum += (low || high) * m[t];
        }
        s->kl_sum += kl_term * m[t];
    }
    if (sequence) {
        const double scale = d_row_ratio * row_ratio / divisor; /* d row_ratio / d logp[t] = row_ratio m[t] / divisor */
        for (size_t t = 0; t < T; ++t) grad[t] += (float)(scale * m[t]);
        int low, high;
        clip_flags(o, row_ratio, advantage, &low, &high);
        row_low = low;
        row_high = high;
        s->region_sum += low || high;
        /* every row counts (a row without tokens has ratio 1), as TRL's mean over [B, 1] */
        s->low_min = nan_min(s->low_min, row_low);
        s->high_max = nan_max(s->high_max, row_high);
    } else { /* each row's share of clipped tokens; NaN for a row without tokens */
        s->low_min = nan_min(s->low_min, row_low / row_tokens);
        s->high_max = nan_max(s->high_max, row_high / row_tokens);
    }
    s->low_sum += row_low;
    s->high_sum += row_high;
    s->tokens += row_tokens;
}

/* The loss of every row; the metric sums go to *s. */
static grove_status run(objective* o, const grove_objective_batch* in, grove_objective_output* out, grove_error_sink* err,
                        sums* s) {
    if (in->beta != 0.0 && !in->ref_logp)
        return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, NULL, "beta != 0 needs the reference log-probabilities");
    o->lo = 1.0 - in->epsilon;
    o->hi = o->kind == CISPO ? in->epsilon_high : 1.0 + in->epsilon_high;
    o->delta = in->delta;
    s->tokens = s->kl_sum = s->low_sum = s->high_sum = s->region_sum = s->phi_sum = 0.0;
    s->low_min = s->high_max = NAN;
    s->rows = in->rows;
    double total = 0.0;
    for (uint32_t b = 0; b < in->rows; ++b) row_loss(o, in, b, &total, out->grad + (size_t)b * in->columns, s);
    out->loss = total;
    /* the first metric of every objective here is kl, logged with beta != 0 only */
    if (in->beta != 0.0) out->metric_sums[0] = s->kl_sum, out->metric_counts[0] = s->tokens;
    return GROVE_OK;
}

/* what clip metrics divide by: tokens, or every row at sequence level */
static double clip_count(const grove_objective_batch* in, const sums* s) {
    return in->importance_level == GROVE_IMPORTANCE_SEQUENCE ? s->rows : s->tokens;
}

static grove_status clipped_loss(void* instance, const grove_objective_batch* in, grove_objective_output* out,
                                 grove_error_sink* err) {
    objective o = {.kind = CLIPPED};
    sums s;
    (void)instance;
    const grove_status status = run(&o, in, out, err, &s);
    if (status != GROVE_OK) return status;
    const double values[5] = {s.low_sum, s.high_sum, s.region_sum, s.low_min, s.high_max};
    for (int k = 0; k < 5; ++k) out->metric_sums[1 + k] = values[k];
    for (int k = 0; k < 3; ++k) out->metric_counts[1 + k] = clip_count(in, &s);
    return GROVE_OK;
}

static grove_status cispo_loss(void* instance, const grove_objective_batch* in, grove_objective_output* out,
                               grove_error_sink* err) {
    objective o = {.kind = CISPO};
    sums s;
    (void)instance;
    const grove_status status = run(&o, in, out, err, &s);
    if (status != GROVE_OK) return status;
    out->metric_sums[1] = s.high_sum;
    out->metric_counts[1] = clip_count(in, &s);
    return GROVE_OK;
}

typedef struct {
    double temperature_pos, temperature_neg;
} sapo_config;

static grove_status sapo_create(const grove_config* config, void** instance, grove_error_sink* err) {
    sapo_config* c = malloc(sizeof *c);
    if (!c) return grove_fail(err, GROVE_ERROR_OUT_OF_MEMORY, NULL, "out of memory");
    c->temperature_pos = grove_config_float(config, "temperature_pos", 1.0);
    c->temperature_neg = grove_config_float(config, "temperature_neg", 1.05);
    if (!(c->temperature_pos > 0.0) || !(c->temperature_neg > 0.0)) {
        const char* key = c->temperature_pos > 0.0 ? "temperature_neg" : "temperature_pos";
        free(c);
        return grove_fail(err, GROVE_ERROR_CONFIG, key, "must be > 0 (TRL's defaults: 1.0 and 1.05)");
    }
    *instance = c;
    return GROVE_OK;
}

static grove_status sapo_loss(void* instance, const grove_objective_batch* in, grove_objective_output* out,
                              grove_error_sink* err) {
    const sapo_config* c = instance;
    objective o = {.kind = SAPO};
    o.temperature_pos = c->temperature_pos;
    o.temperature_neg = c->temperature_neg;
    sums s;
    return run(&o, in, out, err, &s);
}

static grove_status vespo_create(const grove_config* config, void** instance, grove_error_sink* err) {
    vespo_config* c = malloc(sizeof *c);
    if (!c) return grove_fail(err, GROVE_ERROR_OUT_OF_MEMORY, NULL, "out of memory");
    c->k_pos = grove_config_float(config, "k_pos", 2.0);
    c->lambda_pos = grove_config_float(config, "lambda_pos", 3.0);
    c->k_neg = grove_config_float(config, "k_neg", 3.0);
    c->lambda_neg = grove_config_float(config, "lambda_neg", 2.0);
    *instance = c;
    return GROVE_OK;
}

static grove_status vespo_loss(void* instance, const grove_objective_batch* in, grove_objective_output* out,
                               grove_error_sink* err) {
    objective o = {.kind = VESPO};
    sums s;
    o.vespo = *(const vespo_config*)instance;
    if (in->importance_level != GROVE_IMPORTANCE_TOKEN)
        return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, NULL,
                          "vespo weighs whole rows itself: it needs importance_sampling_level = \"token\"");
    const grove_status status = run(&o, in, out, err, &s);
    if (status != GROVE_OK) return status;
    out->metric_sums[1] = s.phi_sum; /* TRL's mean of phi over rows */
    out->metric_counts[1] = s.rows;
    return GROVE_OK;
}

static grove_status no_state(const grove_config* config, void** instance, grove_error_sink* err) {
    (void)config;
    (void)err;
    *instance = NULL;
    return GROVE_OK;
}

static const char* const clipped_metrics[] = {
    "kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max"};
static const uint8_t clipped_aggregation[] = {GROVE_METRIC_MEAN, GROVE_METRIC_MEAN, GROVE_METRIC_MEAN,
                                              GROVE_METRIC_MEAN, GROVE_METRIC_MIN,  GROVE_METRIC_MAX};
static const char* const cispo_metrics[] = {"kl", "cispo_clip_ratio"};
static const char* const sapo_metrics[] = {"kl"};
static const char* const vespo_metrics[] = {"kl", "vespo/phi_seq_mean"};

static const grove_config_key sapo_keys[] = {
    {sizeof(grove_config_key), "temperature_pos", GROVE_VALUE_FLOAT, 0, "1.0", "tau for tokens with positive advantage"},
    {sizeof(grove_config_key), "temperature_neg", GROVE_VALUE_FLOAT, 0, "1.05", "tau for the others"},
};

static const grove_config_key vespo_keys[] = {
    {sizeof(grove_config_key), "k_pos", GROVE_VALUE_FLOAT, 0, "2.0", "the gamma weight's shape k for rows with A >= 0"},
    {sizeof(grove_config_key), "lambda_pos", GROVE_VALUE_FLOAT, 0, "3.0", "its rate lambda for rows with A >= 0"},
    {sizeof(grove_config_key), "k_neg", GROVE_VALUE_FLOAT, 0, "3.0", "k for rows with A < 0"},
    {sizeof(grove_config_key), "lambda_neg", GROVE_VALUE_FLOAT, 0, "2.0", "lambda for rows with A < 0"},
};

static const grove_objective_api clipped_api = {sizeof(grove_objective_api), clipped_aggregation, clipped_loss};
static const grove_objective_api cispo_api = {sizeof(grove_objective_api), NULL, cispo_loss};
static const grove_objective_api sapo_api = {sizeof(grove_objective_api), NULL, sapo_loss};
static const grove_objective_api vespo_api = {sizeof(grove_objective_api), NULL, vespo_loss};

#define OBJECTIVE(variable, name, description, keys, key_count, metrics, metric_count, create, destroy, api) \
    static const grove_plugin_descriptor variable = {sizeof(grove_plugin_descriptor),                        \
                                                     GROVE_PLUGIN_KIND_OBJECTIVE,                            \
                                                     name,                                                   \
                                                     "1.0.0",                                                \
                                                     description,                                            \
                                                     GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC,  \
                                                     keys,                                                   \
                                                     key_count,                                              \
                                                     metrics,                                                \
                                                     metric_count,                                           \
                                                     create,                                                 \
                                                     destroy,                                                \
                                                     NULL,                                                   \
                                                     NULL,                                                   \
                                                     NULL,                                                   \
                                                     NULL,                                                   \
                                                     api}

OBJECTIVE(clipped, "clipped", "GRPO's clipped importance ratio with optional KL (GSPO at sequence level); the default", NULL, 0,
          clipped_metrics, 6, no_state, NULL, &clipped_api);
OBJECTIVE(cispo, "cispo", "CISPO: the capped, stop-gradient importance weight times A log p (cap = epsilon_high)", NULL, 0,
          cispo_metrics, 2, no_state, NULL, &cispo_api);
OBJECTIVE(sapo, "sapo", "SAPO: a sigmoid gate on the ratio in place of the hard clip", sapo_keys, 2, sapo_metrics, 1,
          sapo_create, free, &sapo_api);

OBJECTIVE(vespo, "vespo", "VESPO: a gamma weight of each row's whole importance ratio times A log p (token level)", vespo_keys,
          4, vespo_metrics, 2, vespo_create, free, &vespo_api);

static const grove_plugin_descriptor* const all[] = {&clipped, &cispo, &sapo, &vespo};
static const grove_plugin_list list = {sizeof(grove_plugin_list), GROVE_ABI_MAJOR, GROVE_ABI_MINOR, 4, all};

GROVE_EXPORT const grove_plugin_list* grove_plugin_entry(const grove_host_api* host) {
    (void)host;
    return &list;
}
