#include "speculate/step_cost.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/json_file.h"

#define FORMAT "dspark step cost"
#define VERSION 1
#define MAX_CACHE_BYTES (1 << 20)

struct ds_step_cost {
    int n;
    int tokens[DS_STEP_COST_MAX_BUCKETS];
    double seconds[DS_STEP_COST_MAX_BUCKETS];  /* forced monotone */
    double measured[DS_STEP_COST_MAX_BUCKETS]; /* as timed (or given) */
    ds_step_cost_interp interp;
};

int ds_step_cost_default_buckets(int max_tokens, int *out, int cap) {
    /* (up to, step): every count to 8, then coarser where the curve is smoother */
    static const struct {
        long upto, step;
    } spans[] = {{8, 1}, {64, 8}, {256, 16}, {1024, 64}, {1L << 40, 256}};
    int n = 0;
    long from = 0;
    for (size_t s = 0; s < sizeof spans / sizeof spans[0]; from = spans[s++].upto)
        for (long t = from + spans[s].step; t <= spans[s].upto && t <= max_tokens && n < cap; t += spans[s].step)
            out[n++] = (int)t;
    if (n < cap && n > 0 && out[n - 1] < max_tokens) out[n++] = max_tokens;
    return n;
}

static ds_error *check_buckets(const int *tokens, int n, const char *where) {
    if (n < 1 || n > DS_STEP_COST_MAX_BUCKETS)
        return ds_errorf("%s: %d buckets (1 to %d)", where, n, DS_STEP_COST_MAX_BUCKETS);
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 1) return ds_errorf("%s: bucket %d has %d tokens (at least 1)", where, i, tokens[i]);
        if (i > 0 && tokens[i] <= tokens[i - 1])
            return ds_errorf("%s: bucket %d (%d tokens) does not follow bucket %d (%d tokens) in increasing order",
                             where, i, tokens[i], i - 1, tokens[i - 1]);
    }
    return NULL;
}

ds_error *ds_step_cost_new(const int *tokens, const double *seconds, int n, ds_step_cost_interp interp,
                           ds_step_cost **out) {
    *out = NULL;
    DS_TRY(check_buckets(tokens, n, "step cost"));
    if (interp != DS_STEP_COST_LINEAR && interp != DS_STEP_COST_PADDED)
        return ds_errorf("step cost: unknown interpolation %d", (int)interp);
    for (int i = 0; i < n; i++)
        if (!(seconds[i] > 0) || !isfinite(seconds[i]))
            return ds_errorf("step cost: bucket %d (%d tokens) takes %g seconds (must be finite and > 0)", i,
                             tokens[i], seconds[i]);
    ds_step_cost *c = calloc(1, sizeof *c);
    if (!c) return ds_errorf("step cost: out of memory");
    c->n = n;
    c->interp = interp;
    double run_max = 0;
    for (int i = 0; i < n; i++) {
        c->tokens[i] = tokens[i];
        c->measured[i] = seconds[i];
        run_max = fmax(run_max, seconds[i]);
        c->seconds[i] = run_max;
    }
    *out = c;
    return NULL;
}

void ds_step_cost_free(ds_step_cost *c) { free(c); }

int ds_step_cost_n(const ds_step_cost *c) { return c->n; }

void ds_step_cost_bucket(const ds_step_cost *c, int i, int *tokens, double *seconds, double *measured) {
    if (tokens) *tokens = c->tokens[i];
    if (seconds) *seconds = c->seconds[i];
    if (measured) *measured = c->measured[i];
}

double ds_step_cost_seconds(const ds_step_cost *c, int tokens) {
    const int n = c->n;
    if (tokens <= c->tokens[0]) return c->seconds[0];
    if (tokens >= c->tokens[n - 1]) {
        if (n == 1) return c->seconds[0];
        double slope = (c->seconds[n - 1] - c->seconds[n - 2]) / (double)(c->tokens[n - 1] - c->tokens[n - 2]);
        return c->seconds[n - 1] + fmax(slope, 0.0) * (double)(tokens - c->tokens[n - 1]);
    }
    int lo = 0, hi = n - 1; /* tokens[lo] < tokens < = tokens[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (c->tokens[mid] < tokens) lo = mid;
        else hi = mid;
    }
    if (tokens == c->tokens[hi] || c->interp == DS_STEP_COST_PADDED) return c->seconds[hi];
    double f = (double)(tokens - c->tokens[lo]) / (double)(c->tokens[hi] - c->tokens[lo]);
    return c->seconds[lo] + f * (c->seconds[hi] - c->seconds[lo]);
}

double ds_step_cost_sps(const ds_step_cost *c, int tokens) { return 1.0 / ds_step_cost_seconds(c, tokens); }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The buckets o asks for: its own list or the default one. */
static ds_error *opts_buckets(const ds_step_cost_opts *o, int *buckets, int *n) {
    if (o->buckets) {
        DS_TRY(check_buckets(o->buckets, o->n_buckets, "step-cost options"));
        memcpy(buckets, o->buckets, (size_t)o->n_buckets * sizeof *buckets);
        *n = o->n_buckets;
        return NULL;
    }
    if (o->max_tokens < 1) return ds_errorf("step-cost options: max_tokens %d (at least 1)", o->max_tokens);
    *n = ds_step_cost_default_buckets(o->max_tokens, buckets, DS_STEP_COST_MAX_BUCKETS);
    return NULL;
}

ds_error *ds_step_cost_profile(const ds_step_cost_opts *o, ds_time_step_fn time_step, void *ctx,
                               ds_step_cost **out) {
    *out = NULL;
    int buckets[DS_STEP_COST_MAX_BUCKETS], n = 0;
    DS_TRY(opts_buckets(o, buckets, &n));
    if (o->reps < 1 || o->reps > 1000) return ds_errorf("step-cost options: reps %d (1 to 1000)", o->reps);
    if (o->warmup < 0 || o->warmup > 1000) return ds_errorf("step-cost options: warmup %d (0 to 1000)", o->warmup);
    /* Round by round over every bucket (warm-up rounds first), not bucket by bucket: what warms up or drifts
     * while profiling (first calls, clocks, caches) then lands on every bucket alike, not on the first ones
     * (on a CPU, the 1-token bucket timed twice the 2-token one when it was profiled first). */
    double medians[DS_STEP_COST_MAX_BUCKETS];
    double *samples = malloc((size_t)o->reps * (size_t)n * sizeof *samples);
    if (!samples) return ds_errorf("step-cost profile: out of memory");
    ds_error *e = NULL;
    for (int w = 0; w < o->warmup + o->reps && !e; w++)
        for (int i = 0; i < n && !e; i++) {
            double s = 0;
            e = time_step(ctx, buckets[i], &s);
            if (e) e = ds_error_wrap(e, "step-cost profile at %d tokens", buckets[i]);
            else if (!(s > 0) || !isfinite(s))
                e = ds_errorf("step-cost profile at %d tokens: a step timed %g seconds (must be finite and > 0)",
                              buckets[i], s);
            else if (w >= o->warmup) samples[(size_t)i * o->reps + (w - o->warmup)] = s;
        }
    for (int i = 0; i < n && !e; i++) {
        double *b = samples + (size_t)i * o->reps;
        qsort(b, (size_t)o->reps, sizeof *b, cmp_double);
        medians[i] = o->reps % 2 ? b[o->reps / 2] : 0.5 * (b[o->reps / 2 - 1] + b[o->reps / 2]);
    }
    free(samples);
    if (e) return e;
    return ds_step_cost_new(buckets, medians, n, o->interp, out);
}

static ds_error *check_key(const ds_step_cost_key *key) {
    if (!key || !key->device || !*key->device || !key->model || !*key->model || !key->build || !*key->build)
        return ds_errorf("step-cost cache key: device, model and build must each be a non-empty string");
    return NULL;
}

ds_error *ds_step_cost_save(const ds_step_cost *c, const ds_step_cost_key *key, const char *path) {
    DS_TRY(check_key(key));
    cJSON *j = cJSON_CreateObject(), *arr = NULL;
    bool ok = j && cJSON_AddStringToObject(j, "format", FORMAT) && cJSON_AddNumberToObject(j, "version", VERSION) &&
              cJSON_AddStringToObject(j, "device", key->device) && cJSON_AddStringToObject(j, "model", key->model) &&
              cJSON_AddStringToObject(j, "build", key->build) && (arr = cJSON_AddArrayToObject(j, "buckets"));
    for (int i = 0; ok && i < c->n; i++) {
        /* %.17g as raw text: cJSON prints 15 digits where they come within an epsilon, and a
           cache should give back the very curve that was measured */
        char num[32];
        snprintf(num, sizeof num, "%.17g", c->measured[i]);
        cJSON *b = cJSON_CreateObject();
        ok = b && cJSON_AddItemToArray(arr, b) && cJSON_AddNumberToObject(b, "tokens", c->tokens[i]) &&
             cJSON_AddRawToObject(b, "seconds", num);
    }
    ds_error *e = ok ? ds_json_file_write(path, j) : ds_errorf("%s: out of memory building the cache", path);
    cJSON_Delete(j);
    return e;
}

/* Checks one key field of the cache against this run's. */
static ds_error *match_string(const cJSON *j, const char *path, const char *field, const char *want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, field);
    if (!cJSON_IsString(v)) return ds_errorf("%s: malformed: field %s is missing or not a string", path, field);
    if (strcmp(v->valuestring, want) != 0)
        return ds_errorf("%s: stale: %s is \"%s\", this run's is \"%s\"", path, field, v->valuestring, want);
    return NULL;
}

ds_error *ds_step_cost_load(const char *path, const ds_step_cost_key *key, const ds_step_cost_opts *o,
                            ds_step_cost **out) {
    *out = NULL;
    DS_TRY(check_key(key));
    int want[DS_STEP_COST_MAX_BUCKETS], n_want = 0;
    DS_TRY(opts_buckets(o, want, &n_want));
    cJSON *j;
    DS_TRY(ds_json_file_read(path, MAX_CACHE_BYTES, &j));
    ds_error *e = NULL;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "buckets");
    int tokens[DS_STEP_COST_MAX_BUCKETS];
    double seconds[DS_STEP_COST_MAX_BUCKETS];
    int n = 0;
    if (!cJSON_IsObject(j) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, FORMAT) != 0)
        e = ds_errorf("%s: malformed: not a step-cost cache (no \"format\": \"" FORMAT "\")", path);
    else if (!cJSON_IsNumber(ver) || ver->valuedouble != VERSION)
        e = ds_errorf("%s: stale: cache version is not %d", path, VERSION);
    if (!e) e = match_string(j, path, "device", key->device);
    if (!e) e = match_string(j, path, "model", key->model);
    if (!e) e = match_string(j, path, "build", key->build);
    if (!e && (!cJSON_IsArray(arr) || (n = cJSON_GetArraySize(arr)) < 1 || n > DS_STEP_COST_MAX_BUCKETS))
        e = ds_errorf("%s: malformed: buckets is not an array of 1 to %d entries", path, DS_STEP_COST_MAX_BUCKETS);
    for (int i = 0; !e && i < n; i++) {
        const cJSON *b = cJSON_GetArrayItem(arr, i);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "tokens");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(b, "seconds");
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 1 ||
            t->valuedouble > 1e9)
            e = ds_errorf("%s: malformed: buckets[%d].tokens is not a positive integer", path, i);
        else if (!cJSON_IsNumber(s) || !(s->valuedouble > 0) || !isfinite(s->valuedouble))
            e = ds_errorf("%s: malformed: buckets[%d].seconds is not a positive number", path, i);
        else {
            tokens[i] = (int)t->valuedouble;
            seconds[i] = s->valuedouble;
        }
    }
    cJSON_Delete(j);
    if (!e && (n != n_want || memcmp(tokens, want, (size_t)n * sizeof *tokens) != 0))
        e = ds_errorf("%s: stale: its %d buckets (%d..%d tokens) are not the %d this run profiles (%d..%d)", path, n,
                      tokens[0], tokens[n - 1], n_want, want[0], want[n_want - 1]);
    if (e) return e;
    return ds_error_wrap(ds_step_cost_new(tokens, seconds, n, o->interp, out), "%s: malformed", path);
}

ds_error *ds_step_cost_cached(const char *path, const ds_step_cost_key *key, const ds_step_cost_opts *o,
                              ds_time_step_fn time_step, void *ctx, FILE *log, ds_step_cost **out,
                              bool *profiled) {
    *out = NULL;
    if (profiled) *profiled = false;
    DS_TRY(check_key(key));
    if (access(path, F_OK) == 0) {
        ds_error *e = ds_step_cost_load(path, key, o, out);
        if (!e) return NULL;
        if (log) fprintf(log, "step cost: %s; profiling again\n", ds_error_message(e));
        ds_error_free(e);
    } else if (log) {
        fprintf(log, "step cost: no cache at %s; profiling\n", path);
    }
    DS_TRY(ds_step_cost_profile(o, time_step, ctx, out));
    if (profiled) *profiled = true;
    ds_error *e = ds_step_cost_save(*out, key, path);
    if (e) {
        if (log) fprintf(log, "step cost: not cached: %s\n", ds_error_message(e));
        ds_error_free(e);
    }
    return NULL;
}
