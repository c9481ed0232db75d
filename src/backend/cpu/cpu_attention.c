/* Attention over a KV cache on the CPU: scores and softmax in fp32, keys
 * visited in position order, every (query row, head) computed on its own,
 * so the result for a row never depends on the other rows of the call.
 * A bf16 / f16 cache (the model's dtype, model/kv_cache.h) is widened to
 * fp32 a block of keys at a time; the arithmetic is then the fp32 cache's. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"
#include "base/vmath.h"

typedef float v8f __attribute__((vector_size(32), aligned(4)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* q . k over d elements: 8-lane partial sums (fixed order), then a fixed reduction. */
static inline float dot(const float *a, const float *b, int d) {
    v8f acc = {0};
    int i = 0;
    for (; i + 8 <= d; i += 8) acc += *(const v8f *)(a + i) * *(const v8f *)(b + i);
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < d; i++) s += a[i] * b[i];
    return s;
}

/* dot() of q with 8 keys at once: the same per-key arithmetic (8-lane
 * FMA chain over d, then the tree ((0+4)+(1+5))+((2+6)+(3+7)), then the
 * scalar tail), so a key's score does not depend on whether it fell in a
 * block of 8 or in the remainder; 8 independent chains instead of one, and
 * the 8 reductions done together by shuffles. */
static inline void dot8(const float *q, const float *const *k, int d, float *s) {
    v8f a[8];
    for (int j = 0; j < 8; j++) a[j] = (v8f){0};
    int i = 0;
    for (; i + 8 <= d; i += 8) {
        const v8f qv = *(const v8f *)(q + i);
        for (int j = 0; j < 8; j++) a[j] += qv * *(const v8f *)(k[j] + i);
    }
    const v8i lo_hi0 = {0, 1, 2, 3, 8, 9, 10, 11}, lo_hi1 = {4, 5, 6, 7, 12, 13, 14, 15};
    const v8i even = {0, 2, 4, 6, 8, 10, 12, 14}, odd = {1, 3, 5, 7, 9, 11, 13, 15};
    v8f b[4]; /* b[j/2] = [a_j[l] + a_j[l+4], a_{j+1}[l] + a_{j+1}[l+4]] */
    for (int j = 0; j < 4; j++)
        b[j] = __builtin_shuffle(a[2 * j], a[2 * j + 1], lo_hi0) + __builtin_shuffle(a[2 * j], a[2 * j + 1], lo_hi1);
    v8f c[2];
    for (int j = 0; j < 2; j++)
        c[j] = __builtin_shuffle(b[2 * j], b[2 * j + 1], even) + __builtin_shuffle(b[2 * j], b[2 * j + 1], odd);
    v8f r = __builtin_shuffle(c[0], c[1], even) + __builtin_shuffle(c[0], c[1], odd);
    for (int j = 0; j < 8; j++) {
        float t = r[j];
        for (int e = i; e < d; e++) t += q[e] * k[j][e];
        s[j] = t;
    }
}

/* o += w * v over d elements. */
static inline void axpy(float *o, float w, const float *v, int d) {
    int i = 0;
    for (; i + 8 <= d; i += 8) *(v8f *)(o + i) += w * *(const v8f *)(v + i);
    for (; i < d; i++) o[i] += w * v[i];
}

typedef struct {
    ds_tensor out, q, k, v;
    const ds_attn_params *p;
    ds_backend *be;
} attn_job;

#define UNIT_QUERIES 16 /* (row, head) queries per work item, all of one KV head */
#define KEY_BLOCK 32    /* keys per pass: their K or V rows stay in L1 across the item's queries */

typedef struct {
    const float *q;
    float *o, *sc; /* output row slice, scores */
    int64_t lo, hi; /* keys [lo, hi) */
    int64_t m;      /* its query row (for a paged cache's row of key jj) */
} query;

/* Key jj's row of query qq's sequence in cache t, from column col. */
static inline const char *key_row(const ds_tensor *t, const ds_attn_params *p, const query *qq, int64_t jj,
                                  int64_t col) {
    const int64_t row = p->pages ? ds_kv_page_row(p->pages, qq->m, jj) : p->ring_size > 0 ? jj % p->ring_size : jj;
    return (const char *)t->data + (size_t)(row * t->stride + col) * ds_dtype_size(t->dtype);
}

/* out[jj - a] = keys [a, b)'s rows of t (query qq's), n columns from col,
 * as fp32: an fp32 cache's own rows; a bf16 / f16 cache's widened into buf
 * (n floats a key; exact, so the sums below see the values a fp32 cache
 * holding the rounded keys gives), unless !fill: buf holds them already
 * (the same row and block for the previous query). */
static inline void kv_rows(const ds_tensor *t, const ds_attn_params *p, const query *qq, int64_t a, int64_t b,
                           int64_t col, int n, float *buf, bool fill, const float **out) {
    for (int64_t jj = a; jj < b; jj++) {
        if (t->dtype == DS_F32) {
            out[jj - a] = (const float *)(const void *)key_row(t, p, qq, jj, col);
            continue;
        }
        float *w = buf + (jj - a) * n;
        if (fill) ds_to_f32(t->dtype, key_row(t, p, qq, jj, col), w, (size_t)n);
        out[jj - a] = w;
    }
}

/* Items are (KV head, block of rows): the item's queries are every head of
 * that KV group for those rows, so each K and V row is read from L2 once
 * per item, not once per query. Every query is still computed on its own,
 * in a fixed order: scores key by key (dot and dot8 agree bit for bit),
 * max, exp, a left-to-right sum, then o accumulated over the keys in
 * order; which rows share the item changes nothing in a row's result. */
static void attn_chunk(void *ctx, int64_t i0, int64_t i1, int tid) {
    const attn_job *j = ctx;
    const ds_attn_params *p = j->p;
    const int H = p->n_heads, KVH = p->n_kv_heads, group = H / KVH, D = p->head_dim, Dv = p->v_head_dim;
    const int rows_per = UNIT_QUERIES / group > 0 ? UNIT_QUERIES / group : 1;
    const int64_t M = j->q.rows, nkeys = p->n_keys > 0 ? p->n_keys : 1;
    float *scratch = ds_cpu_scratch(j->be, "attention", tid, DS_SCRATCH_SCORES, (size_t)(rows_per * group * nkeys));
    if (!scratch) return; /* recorded: check() reports it */
    /* bf16 / f16 caches: a block of keys (or of 64 value columns) widened, for the queries of one row */
    const bool wide = j->k.dtype != DS_F32 || j->v.dtype != DS_F32;
    float *kvbuf = wide ? ds_cpu_scratch(j->be, "attention", tid, DS_SCRATCH_KV,
                                         (size_t)KEY_BLOCK * (size_t)(D > 64 ? D : 64))
                        : NULL;
    if (wide && !kvbuf) return; /* recorded: check() reports it */
    query local[UNIT_QUERIES], *qs = local;
    if (rows_per * group > UNIT_QUERIES && !(qs = malloc((size_t)(rows_per * group) * sizeof *qs))) {
        ds_cpu_fail(j->be, "attention", "out of memory for %d queries", rows_per * group);
        return;
    }
    for (int64_t it = i0; it < i1; it++) {
        const int kvh = (int)(it % KVH);
        const int64_t m0 = it / KVH * rows_per, m1 = m0 + rows_per < M ? m0 + rows_per : M;
        int nq = 0;
        int64_t kmin = INT64_MAX, kmax = 0;
        for (int64_t m = m0; m < m1; m++)
            for (int h = kvh * group; h < (kvh + 1) * group; h++, nq++) {
                query *qq = &qs[nq];
                qq->q = (const float *)j->q.data + m * j->q.stride + (int64_t)h * D;
                qq->o = (float *)j->out.data + m * j->out.stride + (int64_t)h * Dv;
                qq->sc = scratch + (size_t)nq * (size_t)nkeys;
                qq->m = m;
                qq->lo = 0, qq->hi = p->n_keys;
                if (p->pages && p->pages->row_keys && p->pages->row_keys[m] < qq->hi) qq->hi = p->pages->row_keys[m];
                if (p->causal) {
                    if (p->q_pos[m] + 1 < qq->hi) qq->hi = p->q_pos[m] + 1;
                    if (p->window > 0 && p->q_pos[m] - p->window + 1 > qq->lo) qq->lo = p->q_pos[m] - p->window + 1;
                }
                for (int d = 0; d < Dv; d++) qq->o[d] = 0;
                if (qq->hi <= qq->lo) qq->hi = qq->lo; /* no keys: o stays 0 */
                if (qq->lo < kmin) kmin = qq->lo;
                if (qq->hi > kmax) kmax = qq->hi;
            }
        /* scores, a block of keys at a time for all queries (a row's heads
         * are consecutive queries with the same keys: widened once for them) */
        for (int64_t kb = kmin; kb < kmax; kb += KEY_BLOCK) {
            int64_t held = -1; /* the row whose keys of this block kvbuf holds */
            for (int qi = 0; qi < nq; qi++) {
                query *qq = &qs[qi];
                const int64_t a = qq->lo > kb ? qq->lo : kb, b = qq->hi < kb + KEY_BLOCK ? qq->hi : kb + KEY_BLOCK;
                if (a >= b) continue;
                const float *kr[KEY_BLOCK];
                kv_rows(&j->k, p, qq, a, b, (int64_t)kvh * D, D, kvbuf, qq->m != held, kr);
                held = qq->m;
                int64_t jj = a;
                for (; jj + 8 <= b; jj += 8) dot8(qq->q, kr + (jj - a), D, qq->sc + (jj - qq->lo));
                for (; jj < b; jj++) qq->sc[jj - qq->lo] = dot(qq->q, kr[jj - a], D);
            }
        }
        /* softmax per query */
        for (int qi = 0; qi < nq; qi++) {
            float *sc = qs[qi].sc;
            const int64_t nk = qs[qi].hi - qs[qi].lo;
            if (nk <= 0) continue;
            float mx = -FLT_MAX;
            for (int64_t jj = 0; jj < nk; jj++) {
                const float sv = sc[jj] * p->scale;
                sc[jj] = sv;
                if (sv > mx) mx = sv;
            }
            /* e = exp(s - max) 8 at a time; the sum stays one left-to-right chain. */
            int64_t jj = 0;
            for (; jj + 8 <= nk; jj += 8) *(ds_v8f *)(sc + jj) = ds_v8f_exp(*(const ds_v8f *)(sc + jj) - ds_v8f_set1(mx));
            for (; jj < nk; jj++) sc[jj] = ds_v8f_exp(ds_v8f_set1(sc[jj] - mx))[0];
            float sum = 0;
            for (jj = 0; jj < nk; jj++) sum += sc[jj];
            const float inv = 1.0f / sum;
            for (jj = 0; jj < nk; jj++) sc[jj] *= inv;
        }
        /* o = sum over keys, in order, of w_j v_j: 64 columns at a time in
         * registers over a block of keys, the partial sums kept in o between
         * blocks (exact: a float stored and loaded is the same float). */
        int d0 = 0;
        for (; d0 + 64 <= Dv; d0 += 64)
            for (int64_t kb = kmin; kb < kmax; kb += KEY_BLOCK) {
                int64_t held = -1;
                for (int qi = 0; qi < nq; qi++) {
                    query *qq = &qs[qi];
                    const int64_t a = qq->lo > kb ? qq->lo : kb, b = qq->hi < kb + KEY_BLOCK ? qq->hi : kb + KEY_BLOCK;
                    if (a >= b) continue;
                    const float *vr[KEY_BLOCK];
                    kv_rows(&j->v, p, qq, a, b, (int64_t)kvh * Dv + d0, 64, kvbuf, qq->m != held, vr);
                    held = qq->m;
                    v8f acc[8];
                    for (int t = 0; t < 8; t++) acc[t] = *(const v8f *)(qq->o + d0 + 8 * t);
                    for (int64_t jj = a; jj < b; jj++) {
                        const float *vv = vr[jj - a];
                        const float w = qq->sc[jj - qq->lo];
                        const v8f wv = {w, w, w, w, w, w, w, w};
                        for (int t = 0; t < 8; t++) acc[t] += wv * *(const v8f *)(vv + 8 * t);
                    }
                    for (int t = 0; t < 8; t++) *(v8f *)(qq->o + d0 + 8 * t) = acc[t];
                }
            }
        if (d0 < Dv)
            for (int qi = 0; qi < nq; qi++)
                for (int64_t jj = qs[qi].lo; jj < qs[qi].hi; jj++) {
                    const float *vv;
                    kv_rows(&j->v, p, &qs[qi], jj, jj + 1, (int64_t)kvh * Dv + d0, Dv - d0, kvbuf, true, &vv);
                    axpy(qs[qi].o + d0, qs[qi].sc[jj - qs[qi].lo], vv, Dv - d0);
                }
    }
    if (qs != local) free(qs);
}

void ds_cpu_attention(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                      const ds_attn_params *p) {
    attn_job j = {.out = out, .q = q, .k = k, .v = v, .p = p, .be = be};
    const int group = p->n_heads / p->n_kv_heads;
    const int64_t rows_per = UNIT_QUERIES / group > 0 ? UNIT_QUERIES / group : 1;
    ds_pool_run(ds_cpu_pool(be), (q.rows + rows_per - 1) / rows_per * p->n_kv_heads, 1, attn_chunk, &j);
}
