/* Attention over a KV cache on the CPU: one (query row, head) pair per
 * task, scores and softmax in fp32, keys visited in position order so the
 * result for a row never depends on the other rows of the call. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"

typedef float v8f __attribute__((vector_size(32), aligned(4)));

/* q . k over d elements: 8-lane partial sums (fixed order), then a fixed reduction. */
static inline float dot(const float *a, const float *b, int d) {
    v8f acc = {0};
    int i = 0;
    for (; i + 8 <= d; i += 8) acc += *(const v8f *)(a + i) * *(const v8f *)(b + i);
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < d; i++) s += a[i] * b[i];
    return s;
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

/* Items are (query row, head) pairs. */
static void attn_chunk(void *ctx, int64_t i0, int64_t i1, int tid) {
    const attn_job *j = ctx;
    const ds_attn_params *p = j->p;
    const int H = p->n_heads, group = p->n_heads / p->n_kv_heads, D = p->head_dim, Dv = p->v_head_dim;
    float *scores = ds_cpu_scratch(j->be, tid, DS_SCRATCH_SCORES, (size_t)(p->n_keys > 0 ? p->n_keys : 1));
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
            float s = dot(qv, kv, D) * p->scale;
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
            axpy(o, scores[jj - lo] * inv, vv, Dv);
        }
    }
}

void ds_cpu_attention(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                      const ds_attn_params *p) {
    attn_job j = {.out = out, .q = q, .k = k, .v = v, .p = p, .be = be};
    ds_pool_run(ds_cpu_pool(be), q.rows * p->n_heads, 1, attn_chunk, &j);
}
