/* Objective "clipped": GRPO's clipped importance-ratio objective, the default (TRL's _compute_loss;
 * docs/objectives.md), in plain C against the SDK header alone. Per row b with advantage A and
 * token t (w = the reduction's weight, m = the mask):
 *
 *   ratio      token level:    r = exp(logp - old)
 *              sequence level: r_b = exp(sum_t m (logp - old) / max(sum_t m, 1))   (GSPO)
 *   c1 = min(r, delta) when delta is set, else r;   c2 = clamp(r, 1 - epsilon, 1 + epsilon_high)
 *   P = -min(c1 A, c2 A)
 *   kl = exp(ref - logp) - (ref - logp) - 1, times r with use_bias_correction_kl
 *   loss = sum_{b,t} w (P + beta kl)
 *
 * and its exact derivative with respect to each logp, with the subgradients autograd takes: where
 * c1 A == c2 A each branch gets half, clamp passes the gradient on [lo, hi] inclusive, min(r, delta)
 * where r <= delta. The logged metrics are TRL's: kl (beta != 0) and the clip ratios.
 */
#include <grove/grove_plugin.h>

#include <math.h>
#include <stdlib.h>

enum { KL, LOW_MEAN, HIGH_MEAN, REGION_MEAN, LOW_MIN, HIGH_MAX, METRICS };
static const char* const metric_names[METRICS] = {
    "kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max"};
static const uint8_t metric_aggregation[METRICS] = {GROVE_METRIC_MEAN, GROVE_METRIC_MEAN, GROVE_METRIC_MEAN,
                                                    GROVE_METRIC_MEAN, GROVE_METRIC_MIN,  GROVE_METRIC_MAX};

typedef struct {
    double lo, hi, delta, advantage;
    int has_delta;
} clip_rule;

/* -min(c1 A, c2 A) and its derivative with respect to the ratio */
static double policy_term(const clip_rule* c, double ratio, double* d_ratio) {
    const double c1 = c->has_delta && ratio > c->delta ? c->delta : ratio;
    const double c2 = ratio < c->lo ? c->lo : (ratio > c->hi ? c->hi : ratio);
    const double a = c1 * c->advantage, b = c2 * c->advantage;
    const double share_a = a < b ? 1.0 : (a == b ? 0.5 : 0.0), share_b = 1.0 - share_a;
    const double d_c1 = c->has_delta ? (ratio <= c->delta) : 1.0, d_c2 = ratio >= c->lo && ratio <= c->hi;
    *d_ratio = -(share_a * c->advantage * d_c1 + share_b * c->advantage * d_c2);
    return -(a < b ? a : b);
}

/* the ratio as the clip metrics see it: after the delta cap */
static double capped(const clip_rule* c, double ratio) { return c->has_delta && ratio > c->delta ? c->delta : ratio; }

static double nan_min(double a, double b) { return isnan(a) ? b : (isnan(b) ? a : (a < b ? a : b)); }
static double nan_max(double a, double b) { return isnan(a) ? b : (isnan(b) ? a : (a > b ? a : b)); }

static grove_status create(const grove_config* config, void** instance, grove_error_sink* err) {
    (void)config;
    (void)err;
    *instance = NULL;
    return GROVE_OK;
}

static grove_status loss(void* instance, const grove_objective_batch* in, grove_objective_output* out, grove_error_sink* err) {
    (void)instance;
    if (in->beta != 0.0 && !in->ref_logp)
        return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, NULL, "beta != 0 needs the reference log-probabilities");
    const int sequence = in->importance_level == GROVE_IMPORTANCE_SEQUENCE;
    const size_t T = in->columns;
    double total = 0.0, tokens = 0.0, kl_sum = 0.0, low_sum = 0.0, high_sum = 0.0, region_sum = 0.0;
    double low_min = NAN, high_max = NAN;
    for (uint32_t b = 0; b < in->rows; ++b) {
        const float *logp = in->logp + b * T, *m = in->mask + b * T, *w = in->weights + b * T;
        const float* old = in->old_logp ? in->old_logp + b * T : logp;
        const float* ref = in->ref_logp ? in->ref_logp + b * T : NULL;
        float* grad = out->grad + b * T;
        const clip_rule clip = {1.0 - in->epsilon, 1.0 + in->epsilon_high, in->delta, in->advantages[b], !isnan(in->delta)};
        double row_tokens = 0.0, row_log_ratio = 0.0;
        for (size_t t = 0; t < T; ++t) {
            row_tokens += m[t];
            row_log_ratio += ((double)logp[t] - old[t]) * m[t];
        }
        const double row_ratio = exp(row_log_ratio / (row_tokens > 1.0 ? row_tokens : 1.0));
        double row_low = 0.0, row_high = 0.0;
        double d_row_ratio = 0.0, d_row_policy = 0.0; /* sequence level: d loss / d row_ratio */
        const double row_policy = policy_term(&clip, row_ratio, &d_row_policy);
        for (size_t t = 0; t < T; ++t) {
            const double ratio = sequence ? row_ratio : exp((double)logp[t] - old[t]);
            double d_policy = d_row_policy;
            const double policy = sequence ? row_policy : policy_term(&clip, ratio, &d_policy);
            double kl = 0.0, d_kl = 0.0; /* d_kl: with respect to logp directly, ratio held */
            if (in->beta != 0.0) {
                const double d = (double)ref[t] - logp[t];
                kl = exp(d) - d - 1.0;
                d_kl = 1.0 - exp(d);
                if (in->use_bias_correction_kl) d_kl *= ratio;
            }
            const double kl_term = in->use_bias_correction_kl ? kl * ratio : kl;
            total += w[t] * (policy + in->beta * kl_term);
            /* through the ratio: the policy term, and the KL term when it carries the ratio */
            const double d_through_ratio = d_policy + (in->use_bias_correction_kl ? in->beta * kl : 0.0);
            if (sequence) { /* the row ratio's share is added below, once d_row_ratio is complete */
                d_row_ratio += w[t] * d_through_ratio;
                grad[t] = (float)(w[t] * in->beta * d_kl);
            } else {
                grad[t] = (float)(w[t] * (d_through_ratio * ratio + in->beta * d_kl));
            }
            kl_sum += kl_term * m[t];
            if (!sequence) {
                const double c1 = capped(&clip, ratio);
                const double low = c1 < clip.lo && clip.advantage<0, high = c1> clip.hi && clip.advantage > 0;
                row_low += low * m[t];
                row_high += high * m[t];
                region_sum += (low || high) * m[t];
            }
        }
        if (sequence) {
            /* d row_ratio / d logp[t] = row_ratio m[t] / max(row_tokens, 1) */
            const double scale = d_row_ratio * row_ratio / (row_tokens > 1.0 ? row_tokens : 1.0);
            for (size_t t = 0; t < T; ++t) grad[t] += (float)(scale * m[t]);
            const double c1 = capped(&clip, row_ratio);
            row_low = c1 < clip.lo && clip.advantage < 0;
            row_high = c1 > clip.hi && clip.advantage > 0;
            region_sum += row_low || row_high;
            /* every row counts (a row without tokens has ratio 1), as TRL's mean over [B, 1] */
            low_min = nan_min(low_min, row_low);
            high_max = nan_max(high_max, row_high);
        } else {
            /* each row's share of clipped tokens; NaN for a row without tokens */
            low_min = nan_min(low_min, row_low / row_tokens);
            high_max = nan_max(high_max, row_high / row_tokens);
        }
        low_sum += row_low;
        high_sum += row_high;
        tokens += row_tokens;
    }
    out->loss = total;
    const double clip_count = sequence ? (double)in->rows : tokens;
    if (in->beta != 0.0) out->metric_sums[KL] = kl_sum, out->metric_counts[KL] = tokens;
    out->metric_sums[LOW_MEAN] = low_sum, out->metric_counts[LOW_MEAN] = clip_count;
    out->metric_sums[HIGH_MEAN] = high_sum, out->metric_counts[HIGH_MEAN] = clip_count;
    out->metric_sums[REGION_MEAN] = region_sum, out->metric_counts[REGION_MEAN] = clip_count;
    out->metric_sums[LOW_MIN] = low_min;
    out->metric_sums[HIGH_MAX] = high_max;
    return GROVE_OK;
}

static const grove_objective_api api = {sizeof(grove_objective_api), metric_aggregation, loss};
static const grove_plugin_descriptor descriptor = {
    sizeof(grove_plugin_descriptor),
    GROVE_PLUGIN_KIND_OBJECTIVE,
    "clipped",
    "1.0.0",
    "GRPO's clipped importance-ratio objective with optional KL (GSPO at sequence level); the default",
    GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC,
    NULL,
    0,
    metric_names,
    METRICS,
    create,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
    &api};
static const grove_plugin_descriptor* const all[] = {&descriptor};
static const grove_plugin_list list = {sizeof(grove_plugin_list), GROVE_ABI_MAJOR, GROVE_ABI_MINOR, 1, all};

GROVE_EXPORT const grove_plugin_list* grove_plugin_entry(const grove_host_api* host) {
    (void)host;
    return &list;
}
