/* A user objective in plain C, built against the installed SDK alone: dual-clip PPO (Ye et al. 2020,
 * "Mastering Complex Control in MOBA Games with Deep RL"; verl's clip_ratio_c), which TRL does not
 * have. GRPO's clipped ratio bounds the update of a token with a positive advantage; with a negative
 * advantage and a huge ratio (a token the old policy found unlikely and the new one likes) its loss
 * -A r grows without bound. Dual clip caps that loss at -A c:
 *
 *   r  = exp(clamp(logp - old, -20, 20))
 *   P1 = max(-A r, -A clamp(r, 1 - epsilon, 1 + epsilon_high))       (GRPO's, as a loss)
 *   P  = min(P1, -A c)  where A < 0,   P1 elsewhere                    (c = clip_ratio_c > 1)
 *   kl = exp(ref - logp) - (ref - logp) - 1
 *   loss = sum_{b,t} w (s P + beta kl),   s = the host's policy_mask x sampling_ratio (SDK 1.6)
 *
 * The host back-propagates sum(grad * logp) with grad = d loss / d logp (grove_plugin.h section 11),
 * so this file needs no autograd: only the derivative below. Ties (P1's two branches equal, or P1
 * equal to the cap) split the gradient half and half, as torch's maximum and minimum do.
 *
 * Build: cmake -S examples/custom-objective -B build-objective -DCMAKE_PREFIX_PATH=<grove prefix>
 * Use:   [objective] plugin = "path/to/libdual_clip_objective.so", config = { clip_ratio_c = 3.0 }
 */
#include <grove/grove_plugin.h>

#include <math.h>
#include <stdlib.h>

typedef struct {
    double clip_ratio_c;
} settings;

static grove_status create(const grove_config* config, void** instance, grove_error_sink* err) {
    const double c = grove_config_float(config, "clip_ratio_c", 3.0);
    if (!(c > 1.0)) return grove_fail(err, GROVE_ERROR_CONFIG, "clip_ratio_c", "must be > 1 (verl's default: 3.0)");
    settings* s = malloc(sizeof *s);
    if (!s) return grove_fail(err, GROVE_ERROR_OUT_OF_MEMORY, NULL, "out of memory");
    s->clip_ratio_c = c;
    *instance = s;
    return GROVE_OK;
}

/* d max(a, b) / d a: 1, 0, or 1/2 at a tie */
static double share_of_first(double a, double b) { return a > b ? 1.0 : (a == b ? 0.5 : 0.0); }

typedef struct {
    double value, d_ratio; /* P and dP / dr */
    int capped;            /* the dual clip decided P */
} policy_term;

static policy_term dual_clip(double r, double A, double lo, double hi, double c) {
    const double clipped = r < lo ? lo : (r > hi ? hi : r);
    const double loss1 = -A * r, loss2 = -A * clipped;
    const double share1 = share_of_first(loss1, loss2);
    policy_term p = {share1 == 1.0 ? loss1 : loss2, share1 * -A + (1.0 - share1) * -A * (r >= lo && r <= hi), 0};
    if (A < 0) {
        const double cap = -A * c;                          /* a constant: its derivative is 0 */
        const double keep = share_of_first(-p.value, -cap); /* min(P1, cap) = -max(-P1, -cap) */
        p.capped = cap < p.value;
        p.value = keep == 0.0 ? cap : p.value;
        p.d_ratio *= keep;
    }
    return p;
}

static grove_status loss(void* instance, const grove_objective_batch* in, grove_objective_output* out, grove_error_sink* err) {
    const settings* s = instance;
    if (in->importance_level != GROVE_IMPORTANCE_TOKEN)
        return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, NULL,
                          "dual_clip is token-level: set importance_sampling_level = \"token\"");
    if (!isnan(in->delta) || in->use_bias_correction_kl) /* refuse what this objective does not implement */
        return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, NULL,
                          "dual_clip implements neither loss.delta nor loss.use_bias_correction_kl: unset them");
    if (in->beta != 0.0 && !in->ref_logp)
        return grove_fail(err, GROVE_ERROR_INVALID_ARGUMENT, NULL, "beta != 0 needs the reference log-probabilities");
    /* the host's policy mask and sampling ratio: read only from a host that sends them */
    const int has_masks = GROVE_HAS_FIELD(in, grove_objective_batch, sampling_ratio);
    const float* policy_mask = has_masks ? in->policy_mask : NULL;
    const float* sampling_ratio = has_masks ? in->sampling_ratio : NULL;
    const double lo = 1.0 - in->epsilon, hi = 1.0 + in->epsilon_high;
    double total = 0.0, kl_sum = 0.0, capped = 0.0, tokens = 0.0;
    for (size_t i = 0; i < (size_t)in->rows * in->columns; ++i) {
        const double A = in->advantages[i / in->columns], logp = in->logp[i];
        const double log_ratio = in->old_logp ? logp - in->old_logp[i] : 0.0;
        const double r = exp(log_ratio < -20.0 ? -20.0 : (log_ratio > 20.0 ? 20.0 : log_ratio));
        const double dr_dlogp = log_ratio >= -20.0 && log_ratio <= 20.0 ? r : 0.0;
        const policy_term p = dual_clip(r, A, lo, hi, s->clip_ratio_c);
        const double scale = (policy_mask ? policy_mask[i] : 1.0) * (sampling_ratio ? sampling_ratio[i] : 1.0);
        double kl = 0.0, d_kl = 0.0;
        if (in->beta != 0.0) {
            const double d = (double)in->ref_logp[i] - logp;
            kl = exp(d) - d - 1.0;
            d_kl = 1.0 - exp(d);
        }
        total += in->weights[i] * (scale * p.value + in->beta * kl);
        out->grad[i] = (float)(in->weights[i] * (scale * p.d_ratio * dr_dlogp + in->beta * d_kl));
        kl_sum += kl * in->mask[i];
        capped += p.capped * in->mask[i];
        tokens += in->mask[i];
    }
    out->loss = total;
    if (in->beta != 0.0) out->metric_sums[0] = kl_sum, out->metric_counts[0] = tokens;
    out->metric_sums[1] = capped; /* the share of tokens the dual clip capped (verl: pg_clipfrac_lower) */
    out->metric_counts[1] = tokens;
    return GROVE_OK;
}

static const char* const metrics[] = {"kl", "dual_clip_ratio"};
static const grove_config_key keys[] = {
    {sizeof(grove_config_key), "clip_ratio_c", GROVE_VALUE_FLOAT, 0, "3.0",
     "cap of the loss of a negative-advantage token, in units of -A"},
};
static const grove_objective_api api = {sizeof(grove_objective_api), NULL, loss};
static const grove_plugin_descriptor dual_clip_descriptor = {
    sizeof(grove_plugin_descriptor),
    GROVE_PLUGIN_KIND_OBJECTIVE,
    "dual_clip",
    "1.0.0",
    "dual-clip PPO: GRPO's clipped ratio with the loss of negative-advantage tokens capped",
    GROVE_PLUGIN_THREAD_SAFE | GROVE_PLUGIN_DETERMINISTIC,
    keys,
    1,
    metrics,
    2,
    create,
    free,
    NULL,
    NULL,
    NULL,
    NULL,
    &api};
static const grove_plugin_descriptor* const all[] = {&dual_clip_descriptor};
static const grove_plugin_list list = {sizeof(grove_plugin_list), GROVE_ABI_MAJOR, GROVE_ABI_MINOR, 1, all};

GROVE_EXPORT const grove_plugin_list* grove_plugin_entry(const grove_host_api* host) {
    (void)host;
    return &list;
}
