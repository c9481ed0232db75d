#include "speculate/sim_acceptance.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json_file.h"

#define MAX_PROFILE_BYTES (1 << 20)

struct ds_sim_profile {
    char name[128];
    int n;
    double p[DS_SIM_MAX_POSITIONS], kappa[DS_SIM_MAX_POSITIONS];
};

ds_error *ds_sim_profile_new(const char *name, const double *accept, int n, const double *kappa, double kappa_all,
                             ds_sim_profile **out) {
    *out = NULL;
    const char *who = name ? name : "simulated acceptance";
    if (n < 1 || n > DS_SIM_MAX_POSITIONS)
        return ds_errorf("%s: %d positions (1 to %d)", who, n, DS_SIM_MAX_POSITIONS);
    for (int k = 0; k < n; k++) {
        double pk = accept[k], kk = kappa ? kappa[k] : kappa_all;
        if (!(pk >= 0 && pk <= 1)) return ds_errorf("%s: acceptance[%d] = %g outside [0, 1]", who, k, pk);
        if (!(kk > 0) || !isfinite(kk)) return ds_errorf("%s: kappa at position %d = %g (finite and > 0)", who, k, kk);
    }
    ds_sim_profile *p = calloc(1, sizeof *p);
    if (!p) return ds_errorf("%s: out of memory", who);
    snprintf(p->name, sizeof p->name, "%s", who);
    p->n = n;
    for (int k = 0; k < n; k++) {
        p->p[k] = accept[k];
        p->kappa[k] = kappa ? kappa[k] : kappa_all;
    }
    *out = p;
    return NULL;
}

/* A number or an array of n numbers from field `field` of j, into v[0..n). */
static ds_error *numbers(const cJSON *j, const char *path, const char *field, bool scalar_ok, double *v, int *n) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, field);
    if (!f) return ds_errorf("%s: missing field %s", path, field);
    if (scalar_ok && cJSON_IsNumber(f)) {
        for (int k = 0; k < *n; k++) v[k] = f->valuedouble;
        return NULL;
    }
    int count = cJSON_IsArray(f) ? cJSON_GetArraySize(f) : -1;
    if (count < 1 || count > DS_SIM_MAX_POSITIONS || (scalar_ok && count != *n))
        return scalar_ok ? ds_errorf("%s: field %s is not a number or an array of one per position", path, field)
                         : ds_errorf("%s: field %s is not an array of 1 to %d numbers", path, field,
                                     DS_SIM_MAX_POSITIONS);
    for (int k = 0; k < count; k++) {
        const cJSON *x = cJSON_GetArrayItem(f, k);
        if (!cJSON_IsNumber(x)) return ds_errorf("%s: %s[%d] is not a number", path, field, k);
        v[k] = x->valuedouble;
    }
    *n = count;
    return NULL;
}

ds_error *ds_sim_profile_load(const char *path, ds_sim_profile **out) {
    *out = NULL;
    cJSON *j;
    DS_TRY(ds_json_file_read(path, MAX_PROFILE_BYTES, &j));
    double accept[DS_SIM_MAX_POSITIONS], kappa[DS_SIM_MAX_POSITIONS];
    int n = 0;
    ds_error *e = NULL;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    if (!cJSON_IsObject(j)) e = ds_errorf("%s: not a JSON object", path);
    else if (name && !cJSON_IsString(name)) e = ds_errorf("%s: field name is not a string", path);
    if (!e) e = numbers(j, path, "acceptance", false, accept, &n);
    if (!e) e = numbers(j, path, "kappa", true, kappa, &n);
    if (!e) e = ds_sim_profile_new(path, accept, n, kappa, 0, out); /* its errors name the file */
    if (!e && name) snprintf((*out)->name, sizeof (*out)->name, "%s", name->valuestring);
    cJSON_Delete(j);
    return e;
}

void ds_sim_profile_free(ds_sim_profile *p) { free(p); }
const char *ds_sim_profile_name(const ds_sim_profile *p) { return p->name; }
int ds_sim_profile_positions(const ds_sim_profile *p) { return p->n; }
double ds_sim_profile_accept(const ds_sim_profile *p, int k) { return k >= 0 && k < p->n ? p->p[k] : 0.0; }

double ds_sim_profile_tau(const ds_sim_profile *p, int gamma) {
    double tau = 1, s = 1;
    for (int k = 0; k < gamma && k < p->n; k++) tau += s *= p->p[k];
    return tau;
}

/* A 64-bit finalizer (MurmurHash3's), so nearby seeds and request ids give
 * unrelated streams. */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

void ds_sim_stream_seed(ds_rng *rng, uint64_t seed, uint64_t request) {
    ds_rng_seed(rng, mix64(mix64(seed) ^ (request + 0x9e3779b97f4a7c15ull)));
}

/* Uniform in (0, 1], safe to take the log of. */
static double uniform_pos(ds_rng *r) { return 1.0 - ds_rng_uniform(r); }

static double normal(ds_rng *r) {
    double u1 = uniform_pos(r), u2 = ds_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* log of a Gamma(shape, 1) draw: Marsaglia and Tsang's squeeze for shape >= 1;
 * below 1, Gamma(shape + 1) * U^(1/shape), kept in logs so that tiny shapes
 * (kappa * p near 0) do not underflow to 0 / 0 in the Beta below. */
static double log_gamma_draw(ds_rng *r, double shape) {
    if (shape < 1) return log_gamma_draw(r, shape + 1) + log(uniform_pos(r)) / shape;
    const double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = normal(r), v = 1.0 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        if (log(uniform_pos(r)) < 0.5 * x * x + d - d * v + d * log(v)) return log(d * v);
    }
}

/* Beta(a, b) = X / (X + Y) with X ~ Gamma(a), Y ~ Gamma(b). */
static double beta_draw(ds_rng *r, double a, double b) {
    double lx = log_gamma_draw(r, a), ly = log_gamma_draw(r, b);
    return 1.0 / (1.0 + exp(ly - lx));
}

ds_error *ds_sim_round(const ds_sim_profile *p, ds_rng *rng, int gamma, float *conf, int *first_reject) {
    if (gamma < 1 || gamma > p->n)
        return ds_errorf("%s: a round of %d drafts, but the profile has %d positions", p->name, gamma, p->n);
    *first_reject = gamma;
    for (int k = 0; k < gamma; k++) {
        double pk = p->p[k], c = pk;
        if (pk > 0 && pk < 1) c = beta_draw(rng, p->kappa[k] * pk, p->kappa[k] * (1 - pk));
        conf[k] = (float)c;
        /* Bernoulli of the float the scheduler sees, so calibration holds for it exactly */
        bool accepted = ds_rng_uniform(rng) < (double)conf[k];
        if (!accepted && *first_reject == gamma) *first_reject = k;
    }
    return NULL;
}
