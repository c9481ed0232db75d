/* Attention over a KV cache on the CPU: one (query row, head) pair per
 * task, scores and softmax in fp32, keys visited in position order so the
 * result for a row never depends on the other rows of the call. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"

typedef struct {
    ds_tensor out, q, k, v;
    const ds_attn_params *p;
    float **scores; /* per thread */
} attn_job;

/* Items are (query row, head) pairs. */
static void attn_chunk(void *ctx, int64_t i0, int64_t i1, int tid) {
    const attn_job *j = ctx;
    const ds_attn_params *p = j->p;
    const int H = p->n_heads, group = p->n_heads / p->n_kv_heads, D = p->head_dim, Dv = p->v_head_dim;
    float *scores = j->scores[tid];
    for (int64_t it = i0; it < i1; it++) {
        const int64_t m = it / H;
        const int h = (int)(it % H);
        const float *qv = (const float *)j->q.data + m * j->q.stride + (int64_t)h * D;
        float *o = (float *)j->out.data + m * j->out.stride + (int64_t)h * Dv;
        const int kvh = h / group;
        int64_t lo = 0, hi = p->n_keys; /* keys [lo, hi) */
        if (p->causal) {
            if (p->q_pos[m] + 1 < hi) hi = p->q_pos[m] + 1;
            if (p->window > 0 && p->q_pos[m] - p->window + 1 > lo) lo = p->q_pos[m] - p->window + 1;
        }
        for (int d = 0; d < Dv; d++) o[d] = 0;
        if (hi <= lo) continue;
        float mx = -FLT_MAX;
        for (int64_t jj = lo; jj < hi; jj++) {
            int64_t row = p->ring_size > 0 ? jj % p->ring_size : jj;
            const float *kv = (const float *)j->k.data + row * j->k.stride + (int64_t)kvh * D;
            float s = 0;
            for (int d = 0; d < D; d++) s += qv[d] * kv[d];
            s *= p->scale;
            scores[jj - lo] = s;
            if (s > mx) mx = s;
        }
        float sum = 0;
        for (int64_t jj = lo; jj < hi; jj++) {
            float e = expf(scores[jj - lo] - mx);
            scores[jj - lo] = e;
            sum += e;
        }
        float inv = 1.0f / sum;
        for (int64_t jj = lo; jj < hi; jj++) {
            int64_t row = p->ring_size > 0 ? jj % p->ring_size : jj;
            const float *vv = (const float *)j->v.data + row * j->v.stride + (int64_t)kvh * Dv;
            float w = scores[jj - lo] * inv;
            for (int d = 0; d < Dv; d++) o[d] += w * vv[d];
        }
    }
}

void ds_cpu_attention(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                      const ds_attn_params *p) {
    ds_pool *pool = ds_cpu_pool(be);
    int nt = ds_pool_threads(pool);
    float *scores[64] = {0};
    for (int t = 0; t < nt && t < 64; t++) scores[t] = malloc((size_t)(p->n_keys > 0 ? p->n_keys : 1) * sizeof(float));
    attn_job j = {.out = out, .q = q, .k = k, .v = v, .p = p, .scores = scores};
    ds_pool_run(pool, q.rows * p->n_heads, 1, attn_chunk, &j);
    for (int t = 0; t < nt && t < 64; t++) free(scores[t]);
}
