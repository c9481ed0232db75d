/* The principal-directions bound of the Markov bias (markov_bound.h). */
#include "draft/markov_bound.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rows sampled for the directions' Gram matrix: enough to find where the
 * rows' energy lies, few enough to cost ~0.1 s at r = 256. */
#define SAMPLE_ROWS 4096
/* Subspace iterations: the directions need not converge for the bound to
 * be exact, only to be good. */
#define ITERATIONS 40

/* A fixed, portable start for the iteration (no rng state to carry). */
static double start_value(int i, int j) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(j * 40503u + 0x9e3779b9u);
    h ^= h >> 15, h *= 0x2c1b3c6du, h ^= h >> 12, h *= 0x297a2d39u, h ^= h >> 15;
    return (double)h / 4294967296.0 - 0.5;
}

/* Orthonormalizes the k columns of q (r x k, row-major) in place, modified
 * Gram-Schmidt run twice; a column that vanishes becomes zero (a zero
 * direction only makes the bound looser). */
static void orthonormalize(double *q, int r, int k) {
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < k; j++) {
            for (int l = 0; l < j; l++) {
                double d = 0;
                for (int i = 0; i < r; i++) d += q[i * k + j] * q[i * k + l];
                for (int i = 0; i < r; i++) q[i * k + j] -= d * q[i * k + l];
            }
            double nn = 0;
            for (int i = 0; i < r; i++) nn += q[i * k + j] * q[i * k + j];
            const double s = nn > 1e-200 ? 1.0 / sqrt(nn) : 0.0;
            for (int i = 0; i < r; i++) q[i * k + j] *= s;
        }
}

/* The smallest float >= x (x finite and >= 0), inf otherwise. */
static float round_up(double x) {
    if (!(x >= 0) || !isfinite(x)) return INFINITY;
    float f = (float)x;
    if ((double)f < x) f = nextafterf(f, INFINITY);
    return f;
}

static ds_error *directions(const void *w2, ds_dtype dt, int64_t V, int r, int k, float *proj) {
    const size_t esz = ds_dtype_size(dt);
    double *gram = calloc((size_t)r * r, sizeof *gram);
    double *q = malloc((size_t)r * k * sizeof *q), *z = malloc((size_t)r * k * sizeof *z);
    float *row = malloc((size_t)r * sizeof *row);
    if (!gram || !q || !z || !row) {
        free(gram), free(q), free(z), free(row);
        return ds_errorf("out of memory");
    }
    const int64_t step = V > SAMPLE_ROWS ? V / SAMPLE_ROWS : 1;
    for (int64_t n = 0; n < V; n += step) {
        ds_to_f32(dt, (const char *)w2 + (size_t)n * r * esz, row, (size_t)r);
        for (int i = 0; i < r; i++) {
            if (!isfinite(row[i])) continue; /* such rows get an infinite radius anyway */
            for (int j = i; j < r; j++)
                if (isfinite(row[j])) gram[(size_t)i * r + j] += (double)row[i] * row[j];
        }
    }
    for (int i = 0; i < r; i++)
        for (int j = 0; j < i; j++) gram[(size_t)i * r + j] = gram[(size_t)j * r + i];
    for (int i = 0; i < r; i++)
        for (int j = 0; j < k; j++) q[i * k + j] = start_value(i, j);
    orthonormalize(q, r, k);
    for (int it = 0; it < ITERATIONS; it++) {
        for (int i = 0; i < r; i++)
            for (int j = 0; j < k; j++) {
                double s = 0;
                for (int l = 0; l < r; l++) s += gram[(size_t)i * r + l] * q[l * k + j];
                z[i * k + j] = s;
            }
        /* Rescale so repeated products stay in range before normalizing. */
        orthonormalize(z, r, k);
        memcpy(q, z, (size_t)r * k * sizeof *q);
    }
    for (int j = 0; j < k; j++)
        for (int i = 0; i < r; i++) proj[(size_t)j * r + i] = (float)q[i * k + j];
    free(gram), free(q), free(z), free(row);
    return NULL;
}

ds_error *ds_markov_bound_build(const void *w2, ds_dtype dt, int64_t V, int r, int k, ds_markov_bound_host *out) {
    memset(out, 0, sizeof *out);
    if (V <= 0 || r <= 0) return ds_errorf("markov bound: empty w2 (%lld x %d)", (long long)V, r);
    if (dt != DS_F32 && dt != DS_BF16 && dt != DS_F16)
        return ds_errorf("markov bound: w2 of type %s (fp32, bf16 or f16 expected)", ds_dtype_name(dt));
    if (k > DS_MARKOV_BOUND_K) k = DS_MARKOV_BOUND_K;
    if (k > r) k = r;
    if (k < 1) k = 1;
    out->k = k, out->r = r, out->vocab = V;
    out->proj = malloc((size_t)k * r * sizeof *out->proj);
    out->coef = malloc((size_t)V * k * sizeof *out->coef);
    out->radius = malloc((size_t)V * sizeof *out->radius);
    float *row = malloc((size_t)r * sizeof *row);
    if (!out->proj || !out->coef || !out->radius || !row) {
        free(row);
        ds_markov_bound_free(out);
        return ds_errorf("out of memory");
    }
    ds_error *e = directions(w2, dt, V, r, k, out->proj);
    if (e) {
        free(row);
        ds_markov_bound_free(out);
        return e;
    }
    double pnorm[DS_MARKOV_BOUND_K];
    for (int j = 0; j < k; j++) {
        double s = 0;
        for (int i = 0; i < r; i++) s += (double)out->proj[(size_t)j * r + i] * out->proj[(size_t)j * r + i];
        pnorm[j] = sqrt(s);
    }
    const double slack = ds_markov_bound_slack(r, k);
    const size_t esz = ds_dtype_size(dt);
    for (int64_t n = 0; n < V; n++) {
        ds_to_f32(dt, (const char *)w2 + (size_t)n * r * esz, row, (size_t)r);
        float *c = out->coef + (size_t)n * k;
        double cabs = 0, wn = 0;
        for (int j = 0; j < k; j++) {
            const float *p = out->proj + (size_t)j * r;
            double s = 0;
            for (int i = 0; i < r; i++) s += (double)row[i] * p[i];
            c[j] = isfinite(s) ? (float)s : 0.0f;
            cabs += fabs((double)c[j]) * pnorm[j];
        }
        /* rest = w2[n] - coef[n] proj, with the stored (rounded) values. */
        double rn = 0;
        for (int i = 0; i < r; i++) {
            double v = row[i];
            for (int j = 0; j < k; j++) v -= (double)c[j] * out->proj[(size_t)j * r + i];
            rn += v * v;
            wn += (double)row[i] * row[i];
        }
        out->radius[n] = round_up((sqrt(rn) + slack * (sqrt(wn) + cabs)) * (1.0 + 0x1p-20));
    }
    free(row);
    return NULL;
}

void ds_markov_bound_free(ds_markov_bound_host *b) {
    free(b->proj);
    free(b->coef);
    free(b->radius);
    b->proj = b->coef = b->radius = NULL;
}
