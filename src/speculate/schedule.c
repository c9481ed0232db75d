#include "speculate/schedule.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

/* Bounds that keep R * gamma and B far inside an int. */
#define MAX_REQUESTS (1 << 20)
#define MAX_GAMMA 1024

/* The caller's output arrays must be there for a non-empty step. */
static ds_error *check_out(const ds_schedule_input *in, const int *len, const ds_schedule_result *out) {
    if (!out || (in && in->n_requests > 0 && !len)) return ds_errorf("schedule: no output (len or result)");
    return NULL;
}

static int drafts_of(const ds_schedule_input *in, int r) { return in->n_drafts ? in->n_drafts[r] : in->gamma; }

static ds_error *check_shape(const ds_schedule_input *in, bool need_values) {
    if (!in) return ds_errorf("schedule: no input");
    if (in->n_requests < 0 || in->n_requests > MAX_REQUESTS)
        return ds_errorf("schedule: %d requests (0 to %d)", in->n_requests, MAX_REQUESTS);
    if (in->gamma < 0 || in->gamma > MAX_GAMMA) return ds_errorf("schedule: gamma %d (0 to %d)", in->gamma, MAX_GAMMA);
    bool any = false;
    for (int r = 0; r < in->n_requests; r++) {
        int n = drafts_of(in, r);
        if (n < 0 || n > in->gamma)
            return ds_errorf("schedule: request %d has %d drafts (0 to gamma %d)", r, n, in->gamma);
        any |= n > 0;
    }
    if (in->conf && in->survival) return ds_errorf("schedule: both confidences and survivals given (one of them)");
    if (need_values && any && !in->conf && !in->survival)
        return ds_errorf("schedule: neither confidences nor survivals given");
    return NULL;
}

/* Survivals of every drafted position, row-major R x gamma (positions past a
 * request's drafts left 0), checked: confidences in [0, 1]; survivals in
 * [0, 1] and non-increasing along the request. NaN fails every check. */
static ds_error *survivals(const ds_schedule_input *in, double **out) {
    *out = NULL;
    size_t n = (size_t)in->n_requests * (size_t)in->gamma;
    double *a = calloc(n ? n : 1, sizeof *a);
    if (!a) return ds_errorf("schedule: out of memory for %zu survivals", n);
    for (int r = 0; r < in->n_requests; r++) {
        double prev = 1.0;
        for (int j = 0; j < drafts_of(in, r); j++) {
            size_t at = (size_t)r * (size_t)in->gamma + (size_t)j;
            double v;
            if (in->conf) {
                double c = in->conf[at];
                if (!(c >= 0 && c <= 1)) {
                    free(a);
                    return ds_errorf("schedule: request %d position %d: confidence %g outside [0, 1]", r, j, c);
                }
                v = prev * c; /* fp64 product; c <= 1 so it never rises */
            } else {
                v = in->survival[at];
                if (!(v >= 0 && v <= prev)) {
                    free(a);
                    return ds_errorf("schedule: request %d position %d: survival %g outside [0, %g] (survival is in "
                                     "[0, 1] and never rises along a request)", r, j, v, prev);
                }
            }
            a[at] = prev = v;
        }
    }
    *out = a;
    return NULL;
}

/* Algorithm 1's order, produced lazily. Each request's survivals never rise
 * along its draft, so its positions already come in the order (a descending,
 * then j ascending); merging the R lists with a heap of their heads yields
 * exactly the sequence a full sort of all (r, j) would, one candidate at a
 * time, and the walk ends where Algorithm 1 stops: O(R + k log R) for k
 * admissions instead of sorting all N = R * gamma (bench/bench_schedule.c
 * times a call). */
typedef struct {
    double a; /* survival of (r, j) */
    int j, r;
} head;

typedef struct {
    const ds_schedule_input *in;
    const double *a; /* survivals, R x gamma */
    head *heap;      /* each request's next candidate (a > 0), best first */
    int n;
} order;

/* x before y: a descending, then j ascending, then r ascending (a total order, so
 * the admissions are deterministic). */
static bool before(const head *x, const head *y) {
    if (x->a != y->a) return x->a > y->a;
    if (x->j != y->j) return x->j < y->j;
    return x->r < y->r;
}

static void sift_down(order *o, int i) {
    head h = o->heap[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= o->n) break;
        if (c + 1 < o->n && before(&o->heap[c + 1], &o->heap[c])) c++;
        if (!before(&o->heap[c], &h)) break;
        o->heap[i] = o->heap[c];
        i = c;
    }
    o->heap[i] = h;
}

/* Request r's candidate at position j, if it has one. */
static bool candidate_at(const order *o, int r, int j, head *h) {
    if (j >= drafts_of(o->in, r)) return false;
    *h = (head){o->a[(size_t)r * (size_t)o->in->gamma + (size_t)j], j, r};
    return h->a > 0;
}

static ds_error *order_init(order *o, const ds_schedule_input *in, const double *a) {
    *o = (order){.in = in, .a = a};
    const int R = in->n_requests;
    o->heap = malloc((size_t)(R ? R : 1) * sizeof *o->heap);
    if (!o->heap) return ds_errorf("schedule: out of memory for %d requests", R);
    for (int r = 0; r < R; r++)
        if (candidate_at(o, r, 0, &o->heap[o->n])) o->n++;
    for (int i = o->n / 2 - 1; i >= 0; i--) sift_down(o, i);
    return NULL;
}

static void order_free(order *o) { free(o->heap); }

/* The next candidate (false when none is left); take it with order_take. */
static bool order_peek(const order *o, int *r, int *j, double *a) {
    if (!o->n) return false;
    *r = o->heap[0].r;
    *j = o->heap[0].j;
    *a = o->heap[0].a;
    return true;
}

/* Replaces the top with its request's next position, or drops it. */
static void order_take(order *o) {
    if (!candidate_at(o, o->heap[0].r, o->heap[0].j + 1, &o->heap[0])) o->heap[0] = o->heap[--o->n];
    if (o->n) sift_down(o, 0);
}

static ds_error *check_opts(const ds_schedule_opts *opts, double *draft_s) {
    *draft_s = opts ? opts->draft_seconds : 0.0;
    if (!(*draft_s >= 0) || !isfinite(*draft_s))
        return ds_errorf("schedule: draft_seconds %g (finite and >= 0)", *draft_s);
    return NULL;
}

static double theta_of(double tau, int b, const ds_step_cost *sps, double draft_s) {
    return tau / (draft_s + ds_step_cost_seconds(sps, b));
}

/* Admits candidates in Algorithm 1's order into len (zeroed by the caller):
 * at most `budget` of them and, with sps, only while each one raises theta
 * (the first that does not ends the step's admissions). *drafts, *tau and
 * *theta (NAN without sps) get what was admitted. */
static ds_error *admit(const ds_schedule_input *in, const ds_step_cost *sps, double draft_s, int budget, int *len,
                       int *drafts, double *tau, double *theta) {
    const int R = in->n_requests;
    *drafts = 0;
    *tau = R;
    *theta = sps ? theta_of(R, R, sps, draft_s) : NAN;
    double *a;
    DS_TRY(survivals(in, &a));
    order o;
    ds_error *e = order_init(&o, in, a);
    if (e) {
        free(a);
        return e;
    }
    int r, j;
    double cand;
    while (*drafts < budget && order_peek(&o, &r, &j, &cand)) {
        if (sps) {
            const double theta_next = theta_of(*tau + cand, R + *drafts + 1, sps, draft_s);
            if (!(theta_next > *theta)) break;
            *theta = theta_next;
        }
        *tau += cand;
        len[r] = j + 1; /* j == len[r] before: a request's positions arrive in order */
        (*drafts)++;
        order_take(&o);
    }
    order_free(&o);
    free(a);
    return NULL;
}

ds_error *ds_schedule_confidence(const ds_schedule_input *in, const ds_step_cost *sps,
                                 const ds_schedule_opts *opts, int *len, ds_schedule_result *out) {
    DS_TRY(check_out(in, len, out));
    double draft_s;
    DS_TRY(check_shape(in, true));
    DS_TRY(check_opts(opts, &draft_s));
    if (!sps) return ds_errorf("schedule: no step-cost curve");
    const int R = in->n_requests;
    for (int r = 0; r < R; r++) len[r] = 0;
    *out = (ds_schedule_result){0};
    if (R == 0) return NULL;
    int k;
    double tau, theta;
    DS_TRY(admit(in, sps, draft_s, INT_MAX, len, &k, &tau, &theta));
    *out = (ds_schedule_result){.verify_tokens = R + k, .drafts = k, .tau = tau, .theta = theta};
    return NULL;
}

ds_error *ds_schedule_allocate(const ds_schedule_input *in, int drafts, int *len, ds_schedule_result *out) {
    DS_TRY(check_out(in, len, out));
    DS_TRY(check_shape(in, true));
    if (drafts < 0) return ds_errorf("schedule: a budget of %d drafts", drafts);
    const int R = in->n_requests;
    for (int r = 0; r < R; r++) len[r] = 0;
    *out = (ds_schedule_result){.verify_tokens = R, .tau = R, .theta = NAN};
    if (R == 0) return NULL;
    int k;
    double tau, theta;
    DS_TRY(admit(in, NULL, 0, drafts, len, &k, &tau, &theta));
    *out = (ds_schedule_result){.verify_tokens = R + k, .drafts = k, .tau = tau, .theta = NAN};
    return NULL;
}

ds_error *ds_schedule_predict(const ds_schedule_input *in, const int *len, const ds_step_cost *sps,
                              const ds_schedule_opts *opts, ds_schedule_result *out) {
    DS_TRY(check_out(in, len, out));
    double draft_s;
    DS_TRY(check_shape(in, false));
    DS_TRY(check_opts(opts, &draft_s));
    const int R = in->n_requests;
    int b = R;
    for (int r = 0; r < R; r++) {
        if (len[r] < 0 || len[r] > drafts_of(in, r))
            return ds_errorf("schedule: request %d verifies %d drafts of its %d", r, len[r], drafts_of(in, r));
        b += len[r];
    }
    *out = (ds_schedule_result){.verify_tokens = b, .drafts = b - R, .tau = NAN, .theta = NAN};
    if (R == 0) {
        out->tau = out->theta = 0;
        return NULL;
    }
    if (!in->conf && !in->survival) return NULL;
    double *a;
    DS_TRY(survivals(in, &a));
    double tau = R;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < len[r]; j++) tau += a[(size_t)r * (size_t)in->gamma + (size_t)j];
    free(a);
    out->tau = tau;
    if (sps) out->theta = theta_of(tau, b, sps, draft_s);
    return NULL;
}

ds_error *ds_schedule_fixed(const ds_schedule_input *in, int gamma, const ds_step_cost *sps,
                            const ds_schedule_opts *opts, int *len, ds_schedule_result *out) {
    DS_TRY(check_out(in, len, out));
    DS_TRY(check_shape(in, false));
    if (gamma < 0) return ds_errorf("schedule: fixed gamma %d (>= 0)", gamma);
    for (int r = 0; r < in->n_requests; r++) {
        int n = drafts_of(in, r);
        len[r] = gamma < n ? gamma : n;
    }
    return ds_schedule_predict(in, len, sps, opts, out);
}

ds_error *ds_schedule_confidence_stale(const ds_schedule_input *stale, const ds_schedule_input *current,
                                       const ds_step_cost *sps, const ds_schedule_opts *opts, int *len,
                                       ds_schedule_result *out) {
    DS_TRY(check_shape(stale, true));
    DS_TRY(check_shape(current, true));
    if (stale->n_requests != current->n_requests)
        return ds_errorf("schedule: %d stale rows for %d requests (one a request)", stale->n_requests,
                         current->n_requests);
    ds_schedule_result budget;
    DS_TRY(ds_schedule_confidence(stale, sps, opts, len, &budget));
    DS_TRY(ds_schedule_allocate(current, budget.drafts, len, out));
    return ds_schedule_predict(current, len, sps, opts, out);
}

ds_error *ds_schedule_draft_pays(const ds_schedule_input *in, const ds_step_cost *sps, const ds_schedule_opts *opts,
                                 bool *pays, ds_schedule_result *predicted) {
    if (!pays) return ds_errorf("schedule: no output (pays)");
    *pays = false;
    DS_TRY(check_shape(in, true));
    int *len = malloc((size_t)(in->n_requests ? in->n_requests : 1) * sizeof *len);
    if (!len) return ds_errorf("schedule: out of memory for %d requests", in->n_requests);
    ds_schedule_result res;
    ds_error *e = ds_schedule_confidence(in, sps, opts, len, &res);
    free(len);
    if (e) return e;
    if (predicted) *predicted = res;
    *pays = in->n_requests > 0 && res.theta > in->n_requests / ds_step_cost_seconds(sps, in->n_requests);
    return NULL;
}
