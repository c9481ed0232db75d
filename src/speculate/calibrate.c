#include "speculate/calibrate.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "draft/confidence.h"

ds_error *ds_cal_rounds_init(ds_cal_rounds *r, int gamma) {
    memset(r, 0, sizeof *r);
    if (gamma < 1 || gamma > DS_CAL_MAX_GAMMA)
        return ds_errorf("calibration: %d confidence logits per round (1 .. %d)", gamma, DS_CAL_MAX_GAMMA);
    r->gamma = gamma;
    return NULL;
}

void ds_cal_rounds_free(ds_cal_rounds *r) {
    free(r->logit);
    free(r->len);
    free(r->accepted);
    memset(r, 0, sizeof *r);
}

ds_error *ds_cal_rounds_add(ds_cal_rounds *r, const float *logit, int len, int accepted) {
    if (len < 0 || len > r->gamma || accepted < 0 || accepted > len)
        return ds_errorf("calibration round %ld: %d drafts accepted of a proposal of %d (of %d positions)", r->n,
                         accepted, len, r->gamma);
    for (int k = 0; k < len; k++)
        if (isnan(logit[k])) return ds_errorf("calibration round %ld: confidence logit %d is NaN", r->n, k);
    if (len == 0) return NULL;
    if (r->n == r->cap) {
        const long cap = r->cap ? r->cap * 2 : 1024;
        float *l = realloc(r->logit, (size_t)cap * (size_t)r->gamma * sizeof *l);
        if (l) r->logit = l;
        int *n = realloc(r->len, (size_t)cap * sizeof *n);
        if (n) r->len = n;
        int *a = realloc(r->accepted, (size_t)cap * sizeof *a);
        if (a) r->accepted = a;
        if (!l || !n || !a) return ds_errorf("out of memory");
        r->cap = cap;
    }
    memcpy(r->logit + (size_t)r->n * (size_t)r->gamma, logit, (size_t)r->gamma * sizeof *logit);
    r->len[r->n] = len;
    r->accepted[r->n] = accepted;
    r->n++;
    return NULL;
}

/* One position's samples: the product of the positions before it (fp64,
 * unclamped, as the cumulative product runs), its logit and its label. */
typedef struct {
    long n;
    double *prev;
    float *z;
    bool *y;
} samples;

static void gather(const ds_cal_rounds *r, int k, const double *prefix, samples *s) {
    s->n = 0;
    for (long i = 0; i < r->n; i++) {
        if (r->len[i] <= k) continue;
        s->prev[s->n] = prefix[i];
        s->z[s->n] = r->logit[(size_t)i * (size_t)r->gamma + (size_t)k];
        s->y[s->n] = k < r->accepted[i];
        s->n++;
    }
}

/* The prediction the metrics see: the product clamped into [eps, 1 - eps]. */
static double clamp_p(double p) { return p < DS_CAL_EPS ? DS_CAL_EPS : p > 1 - DS_CAL_EPS ? 1 - DS_CAL_EPS : p; }

static int bin_of(double p, int bins) {
    const int b = (int)(p * bins);
    return b < 0 ? 0 : b >= bins ? bins - 1 : b;
}

/* ECE bins only (the fit's objective). */
static void ece_bins(const samples *s, float temp, double *bin_n, double *bin_pred, double *bin_target) {
    memset(bin_n, 0, DS_CAL_ECE_BINS * sizeof *bin_n);
    memset(bin_pred, 0, DS_CAL_ECE_BINS * sizeof *bin_pred);
    memset(bin_target, 0, DS_CAL_ECE_BINS * sizeof *bin_target);
    for (long i = 0; i < s->n; i++) {
        const double p = clamp_p(s->prev[i] * (double)ds_conf_prob(s->z[i], temp));
        const int b = bin_of(p, DS_CAL_ECE_BINS);
        bin_n[b] += 1;
        bin_pred[b] += p;
        bin_target[b] += s->y[i];
    }
}

static double ece_of(const double *bin_n, const double *bin_pred, const double *bin_target, double total) {
    double sum = 0;
    for (int b = 0; b < DS_CAL_ECE_BINS; b++)
        if (bin_n[b] > 0) sum += fabs(bin_pred[b] / bin_n[b] - bin_target[b] / bin_n[b]) * bin_n[b];
    return sum / total;
}

static void metrics_of(const samples *s, float temp, ds_cal_metrics *m, double *pos, double *neg) {
    memset(m, 0, sizeof *m);
    m->n = s->n;
    if (s->n == 0) {
        m->ece = m->auroc = m->brier = m->pred_mean = m->target_mean = NAN;
        return;
    }
    ece_bins(s, temp, m->bin_n, m->bin_pred, m->bin_target);
    memset(pos, 0, DS_CAL_AUROC_BINS * sizeof *pos);
    memset(neg, 0, DS_CAL_AUROC_BINS * sizeof *neg);
    double brier = 0;
    for (long i = 0; i < s->n; i++) {
        const double p = clamp_p(s->prev[i] * (double)ds_conf_prob(s->z[i], temp)), y = s->y[i];
        (s->y[i] ? pos : neg)[bin_of(p, DS_CAL_AUROC_BINS)] += 1;
        brier += (p - y) * (p - y);
    }
    const double total = (double)s->n;
    m->ece = ece_of(m->bin_n, m->bin_pred, m->bin_target, total);
    m->brier = brier / total;
    double pred = 0, target = 0, n_pos = 0, n_neg = 0, pairs = 0, neg_below = 0;
    for (int b = 0; b < DS_CAL_ECE_BINS; b++) {
        pred += m->bin_pred[b];
        target += m->bin_target[b];
    }
    m->pred_mean = pred / total;
    m->target_mean = target / total;
    /* A positive outranks every negative in a lower bin and half of those
     * in its own. */
    for (int b = 0; b < DS_CAL_AUROC_BINS; b++) {
        pairs += pos[b] * neg_below + 0.5 * pos[b] * neg[b];
        neg_below += neg[b];
        n_pos += pos[b];
        n_neg += neg[b];
    }
    m->auroc = n_pos > 0 && n_neg > 0 ? pairs / (n_pos * n_neg) : NAN;
}

/* Work arrays for one pass over the positions. */
typedef struct {
    double *prefix; /* per round: the product through the position before */
    samples s;
} work;

static ds_error *work_new(const ds_cal_rounds *r, work *w) {
    const size_t n = r->n > 0 ? (size_t)r->n : 1;
    w->prefix = malloc(n * sizeof *w->prefix);
    w->s.prev = malloc(n * sizeof *w->s.prev);
    w->s.z = malloc(n * sizeof *w->s.z);
    w->s.y = malloc(n * sizeof *w->s.y);
    if (!w->prefix || !w->s.prev || !w->s.z || !w->s.y) return ds_errorf("out of memory");
    for (long i = 0; i < r->n; i++) w->prefix[i] = 1.0;
    return NULL;
}

static void work_free(work *w) {
    free(w->prefix);
    free(w->s.prev);
    free(w->s.z);
    free(w->s.y);
}

/* Multiplies position k's confidence at temp into every round's product. */
static void advance(const ds_cal_rounds *r, int k, float temp, double *prefix) {
    for (long i = 0; i < r->n; i++)
        if (r->len[i] > k) prefix[i] *= (double)ds_conf_prob(r->logit[(size_t)i * (size_t)r->gamma + (size_t)k], temp);
}

ds_error *ds_cal_evaluate(const ds_cal_rounds *r, const float *temp, ds_cal_metrics *out) {
    work w = {0};
    double *hist = malloc(2 * DS_CAL_AUROC_BINS * sizeof *hist);
    ds_error *e = hist ? work_new(r, &w) : ds_errorf("out of memory");
    for (int k = 0; k < r->gamma && !e; k++) {
        const float s = temp ? temp[k] : 1.0f;
        gather(r, k, w.prefix, &w.s);
        metrics_of(&w.s, s, &out[k], hist, hist + DS_CAL_AUROC_BINS);
        advance(r, k, s, w.prefix);
    }
    work_free(&w);
    free(hist);
    return e;
}

/* The ECE of position k's samples at temperature s. */
static double ece_at(const samples *smp, float s) {
    double bn[DS_CAL_ECE_BINS], bp[DS_CAL_ECE_BINS], bt[DS_CAL_ECE_BINS];
    ece_bins(smp, s, bn, bp, bt);
    return ece_of(bn, bp, bt, (double)smp->n);
}

/* Keeps (s, ece) when it is better, or as good and nearer 1 in log s. */
static void consider(const samples *smp, double log2_s, float *best_s, double *best_ece, double *best_log) {
    const float s = (float)exp2(log2_s);
    const double e = ece_at(smp, s);
    if (e < *best_ece || (e == *best_ece && fabs(log2_s) < fabs(*best_log))) {
        *best_s = s;
        *best_ece = e;
        *best_log = log2_s;
    }
}

ds_error *ds_sts_fit(const ds_cal_rounds *r, float *temp) {
    work w = {0};
    ds_error *e = work_new(r, &w);
    for (int k = 0; k < r->gamma && !e; k++) {
        gather(r, k, w.prefix, &w.s);
        temp[k] = 1.0f;
        if (w.s.n > 0) {
            float best_s = 1.0f;
            double best_ece = INFINITY, best_log = 0;
            const int half = DS_STS_OCTAVES * DS_STS_STEPS;
            for (int i = -half; i <= half; i++) consider(&w.s, (double)i / DS_STS_STEPS, &best_s, &best_ece, &best_log);
            const double step = 1.0 / DS_STS_STEPS, center = best_log;
            for (int j = 0; j <= DS_STS_REFINE; j++)
                consider(&w.s, center - step + 2 * step * j / DS_STS_REFINE, &best_s, &best_ece, &best_log);
            temp[k] = best_s;
        }
        advance(r, k, temp[k], w.prefix);
    }
    work_free(&w);
    return e;
}
