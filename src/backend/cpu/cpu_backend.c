/* CPU backend: fp32 activations, weights used in place from the mmap'd
 * checkpoint (bf16 stays bf16 in memory and is widened on the fly; the panel
 * matmul keeps a repacked copy of what it multiplies, cpu_panel.c), our own
 * thread pool across cores. Every reduction runs in an order the code fixes
 * (not the SIMD width, a library's blocking or the thread count), so a
 * checkpoint and prompt give the same bits on any x86-64-v3 or newer host. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/spec_ops.h"
#include "backend/cpu/cpu_kernels.h"
#include "base/argmax.h"
#include "base/vmath.h"

static ds_error *cpu_alloc(ds_backend *be, ds_dtype dtype, int64_t rows, int64_t cols, ds_tensor *out) {
    size_t bytes = (size_t)(rows * cols) * ds_dtype_size(dtype);
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        return ds_errorf("cpu backend: cannot allocate %zu bytes", bytes);
    memset(p, 0, bytes);
    *out = (ds_tensor){.dtype = dtype, .data = p, .rows = rows, .cols = cols, .stride = cols, .owned = true};
    return NULL;
}

/* Weights are used where the mapping has them (no copy, no extra resident
 * memory). safetensors only promises byte alignment, so a tensor whose data
 * is not aligned to its element size gets an owned, aligned copy. */
static ds_error *cpu_weight(ds_backend *be, const ds_st_tensor *src, int64_t rows, int64_t cols, ds_tensor *out) {
    size_t es = ds_dtype_size(src->dtype);
    if ((size_t)(rows * cols) * es != src->nbytes)
        return ds_errorf("tensor %s: %zu bytes, expected %lld x %lld", src->name, src->nbytes, (long long)rows,
                         (long long)cols);
    if (((uintptr_t)src->data % es) == 0) {
        *out = (ds_tensor){.dtype = src->dtype, .data = (void *)src->data, .rows = rows, .cols = cols, .stride = cols};
    } else {
        DS_TRY(cpu_alloc(be, src->dtype, rows, cols, out));
        memcpy(out->data, src->data, src->nbytes);
    }
    /* A weight's contents are fixed: the panel matmul may cache it repacked. */
    ds_cpu_pack_register(&((ds_cpu_backend *)be)->packs, *out);
    return NULL;
}

static void cpu_release(ds_backend *be, ds_tensor *t) {
    ds_cpu_pack_forget(&((ds_cpu_backend *)be)->packs, t->data);
    if (t->owned) free(t->data);
    *t = ds_no_tensor();
}

static void cpu_upload(ds_backend *be, ds_tensor dst, const float *src) {
    for (int64_t r = 0; r < dst.rows; r++)
        memcpy((float *)dst.data + r * dst.stride, src + r * dst.cols, (size_t)dst.cols * 4);
}

static void cpu_download(ds_backend *be, ds_tensor src, float *dst) {
    for (int64_t r = 0; r < src.rows; r++)
        memcpy(dst + r * src.cols, (const float *)src.data + r * src.stride, (size_t)src.cols * 4);
}

/* Same dtypes: the bytes. fp32 into a bf16 / f16 tensor (a K/V cache in
 * the model's dtype, model/kv_cache.h): each element rounded to nearest
 * even, as ds_f32_to_bf16 / ds_f32_to_f16; bf16 / f16 into fp32: widened
 * (exact). Element by element either way, so a row's values never depend
 * on the rows copied with it. */
static void cpu_copy(ds_backend *be, ds_tensor dst, ds_tensor src) {
    const size_t ds = ds_dtype_size(dst.dtype), ss = ds_dtype_size(src.dtype), n = (size_t)dst.cols;
    for (int64_t r = 0; r < dst.rows; r++) {
        char *d = (char *)dst.data + (size_t)(r * dst.stride) * ds;
        const char *s = (const char *)src.data + (size_t)(r * src.stride) * ss;
        if (dst.dtype == src.dtype) memmove(d, s, n * ds);
        else if (src.dtype != DS_F32) ds_to_f32(src.dtype, s, (float *)(void *)d, n);
        else {
            uint16_t *h = (uint16_t *)(void *)d;
            const float *f = (const float *)(const void *)s;
            if (dst.dtype == DS_BF16)
                for (size_t c = 0; c < n; c++) h[c] = ds_f32_to_bf16(f[c]);
            else
                for (size_t c = 0; c < n; c++) h[c] = ds_f32_to_f16(f[c]);
        }
    }
}

static void cpu_embed(ds_backend *be, ds_tensor out, ds_tensor table, const int32_t *ids, float scale) {
    for (int64_t i = 0; i < out.rows; i++) {
        float *o = (float *)out.data + i * out.stride;
        size_t es = ds_dtype_size(table.dtype);
        if (table.q.bits) ds_cpu_dequant_row(table, ids[i], o); /* a quantized table: the row's dequantized values */
        else
            ds_to_f32(table.dtype, (const char *)table.data + (size_t)ids[i] * (size_t)table.stride * es, o,
                      (size_t)out.cols);
        if (scale != 1.0f)
            for (int64_t c = 0; c < out.cols; c++) o[c] *= scale;
    }
}

static void cpu_rmsnorm(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, int dim, float eps) {
    int64_t groups = x.cols / dim;
    /* Called from the main thread only: its scratch slot holds the widened weight. */
    float *wf = NULL;
    if (w.data) {
        wf = ds_cpu_scratch(be, "rmsnorm", 0, DS_SCRATCH_NORM, (size_t)dim);
        if (!wf) return;
        ds_to_f32(w.dtype, w.data, wf, (size_t)dim);
    }
    for (int64_t r = 0; r < x.rows; r++)
        for (int64_t g = 0; g < groups; g++)
            ds_cpu_rmsnorm_row((float *)out.data + r * out.stride + g * dim,
                               (const float *)x.data + r * x.stride + g * dim, wf, dim, eps);
}

static void cpu_rope(ds_backend *be, ds_tensor x, int head_dim, const int32_t *pos, const float *inv_freq) {
    int half = head_dim / 2;
    int64_t heads = x.cols / head_dim;
    for (int64_t r = 0; r < x.rows; r++) {
        float *row = (float *)x.data + r * x.stride;
        for (int i = 0; i < half; i++) {
            float ang = (float)pos[r] * inv_freq[i];
            /* Same as the reference: angle = pos * inv_freq in fp32, then cos/sin. */
            float c = cosf(ang), s = sinf(ang);
            for (int64_t h = 0; h < heads; h++) {
                float *v = row + h * head_dim;
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

static void cpu_add(ds_backend *be, ds_tensor out, ds_tensor a, ds_tensor b) {
    for (int64_t r = 0; r < out.rows; r++) {
        float *o = (float *)out.data + r * out.stride;
        const float *x = (const float *)a.data + r * a.stride, *y = (const float *)b.data + r * b.stride;
        for (int64_t c = 0; c < out.cols; c++) o[c] = x[c] + y[c];
    }
}

static void cpu_scale(ds_backend *be, ds_tensor x, float s) {
    for (int64_t r = 0; r < x.rows; r++) {
        float *o = (float *)x.data + r * x.stride;
        for (int64_t c = 0; c < x.cols; c++) o[c] *= s;
    }
}

typedef struct {
    ds_tensor out, gate, up;
} swiglu_job;

/* Items are (row, 256-column slice) pairs. */
#define SWIGLU_SLICE 256
static void swiglu_chunk(void *ctx, int64_t i0, int64_t i1, int tid) {
    const swiglu_job *j = ctx;
    const int64_t slices = (j->out.cols + SWIGLU_SLICE - 1) / SWIGLU_SLICE;
    for (int64_t it = i0; it < i1; it++) {
        const int64_t r = it / slices, c0 = it % slices * SWIGLU_SLICE;
        const int64_t c1 = c0 + SWIGLU_SLICE < j->out.cols ? c0 + SWIGLU_SLICE : j->out.cols;
        float *o = (float *)j->out.data + r * j->out.stride;
        const float *g = (const float *)j->gate.data + r * j->gate.stride;
        const float *u = (const float *)j->up.data + r * j->up.stride;
        int64_t c = c0;
        for (; c + 8 <= c1; c += 8) {
            const ds_v8f gv = *(const ds_v8f *)(g + c);
            *(ds_v8f *)(o + c) = gv / (ds_v8f_set1(1.0f) + ds_v8f_exp(-gv)) * *(const ds_v8f *)(u + c);
        }
        for (; c < c1; c++) {
            const ds_v8f gv = ds_v8f_set1(g[c]); /* the same exp as the vector lanes */
            o[c] = g[c] / (1.0f + ds_v8f_exp(-gv)[0]) * u[c];
        }
    }
}

/* Across the pool: one exp per element makes this the costliest
 * elementwise op of a verify pass (8 x 768 per layer on pico). */
void ds_cpu_swiglu(ds_backend *be, ds_tensor out, ds_tensor gate, ds_tensor up) {
    swiglu_job j = {.out = out, .gate = gate, .up = up};
    const int64_t slices = (out.cols + SWIGLU_SLICE - 1) / SWIGLU_SLICE;
    ds_pool_run(ds_cpu_pool(be), out.rows * slices, 2, swiglu_chunk, &j);
}

static void cpu_geglu_tanh(ds_backend *be, ds_tensor out, ds_tensor gate, ds_tensor up) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t r = 0; r < out.rows; r++) {
        float *o = (float *)out.data + r * out.stride;
        const float *g = (const float *)gate.data + r * gate.stride, *u = (const float *)up.data + r * up.stride;
        for (int64_t c = 0; c < out.cols; c++) {
            float x = g[c];
            o[c] = 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x))) * u[c];
        }
    }
}

static void cpu_softcap(ds_backend *be, ds_tensor x, float cap) {
    for (int64_t r = 0; r < x.rows; r++) {
        float *o = (float *)x.data + r * x.stride;
        for (int64_t c = 0; c < x.cols; c++) o[c] = tanhf(o[c] / cap) * cap;
    }
}

static void cpu_round_bf16(ds_backend *be, ds_tensor x) {
    for (int64_t r = 0; r < x.rows; r++) ds_round_bf16_n((float *)x.data + r * x.stride, (size_t)x.cols);
}

void ds_cpu_fail(ds_backend *be, const char *op, const char *fmt, ...) {
    ds_cpu_backend *cb = (ds_cpu_backend *)be;
    if (atomic_load(&cb->err)) return;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ds_error *e = ds_errorf("cpu %s: %s", op, msg), *none = NULL;
    if (!atomic_compare_exchange_strong(&cb->err, &none, e)) ds_error_free(e);
}

float *ds_cpu_scratch(ds_backend *be, const char *op, int tid, int slot, size_t n) {
    ds_cpu_backend *cb = (ds_cpu_backend *)be;
    if (cb->scratch_cap[tid][slot] < n) {
        free(cb->scratch[tid][slot]);
        void *p = NULL;
        const bool ok = n <= SIZE_MAX / sizeof(float) && posix_memalign(&p, 64, n * sizeof(float)) == 0;
        cb->scratch[tid][slot] = ok ? p : NULL;
        cb->scratch_cap[tid][slot] = ok ? n : 0;
        if (!ok) ds_cpu_fail(be, op, "out of memory for %zu floats of scratch", n);
    }
    return cb->scratch[tid][slot];
}

/* Ops run to completion before they return: nothing to wait for. */
static ds_error *cpu_check(ds_backend *be) { return atomic_exchange(&((ds_cpu_backend *)be)->err, NULL); }

static void cpu_argmax(ds_backend *be, ds_tensor x, int32_t *out) {
    for (int64_t r = 0; r < x.rows; r++) out[r] = (int32_t)ds_argmax_f32((const float *)x.data + r * x.stride, x.cols);
}

static void cpu_conf_cut(ds_backend *be, ds_tensor x, ds_tensor cut, int32_t *out) {
    (void)be;
    out[0] = (int32_t)x.rows;
    for (int64_t r = 0; r < x.rows; r++)
        if (((const float *)x.data)[r * x.stride] < ((const float *)cut.data)[r * cut.stride]) {
            out[0] = (int32_t)r;
            break;
        }
}

static void cpu_accept_prefix(ds_backend *be, const int32_t *draft, const int32_t *best, int n, const int32_t *limit,
                              int32_t *out) {
    ds_accept_prefix_host(draft, best, n, limit, out);
}

static void cpu_destroy(ds_backend *be) {
    ds_cpu_backend *cb = (ds_cpu_backend *)be;
    ds_pool_free(cb->pool);
    ds_cpu_pack_free(&cb->packs);
    for (int t = 0; t < DS_CPU_MAX_THREADS; t++)
        for (int s = 0; s < DS_SCRATCH_SLOTS; s++) free(cb->scratch[t][s]);
    free(cb->temp);
    ds_error_free(atomic_load(&cb->err));
    free(cb);
}

static const ds_spec_ops cpu_spec_ops = {
    .conf_cut = cpu_conf_cut,
    .accept_prefix = cpu_accept_prefix,
    .verify_sample = ds_cpu_verify_sample,
    .markov_sample = ds_cpu_markov_sample,
};

static const ds_backend_ops cpu_ops = {
    .name = "cpu",
    .prefill_rows = 64,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .weight = cpu_weight,
    .weight_quant = ds_cpu_weight_quant,
    .release = cpu_release,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .embed = cpu_embed,
    .linear = ds_cpu_linear,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention = ds_cpu_attention,
    .add = cpu_add,
    .scale = cpu_scale,
    .swiglu = ds_cpu_swiglu,
    .geglu_tanh = cpu_geglu_tanh,
    .softcap = cpu_softcap,
    .round_bf16 = cpu_round_bf16,
    .argmax = cpu_argmax,
    .linear_residual = ds_cpu_linear_residual,
    .linear_swiglu = ds_cpu_linear_swiglu,
    .linear_multi = ds_cpu_linear_multi,
#if DS_X_BF16_ON
    .rmsnorm_linear_multi = ds_cpu_rmsnorm_linear_multi,
    .rmsnorm_linear_swiglu = ds_cpu_rmsnorm_linear_swiglu,
    .rmsnorm_linear_geglu = ds_cpu_rmsnorm_linear_geglu,
#endif
    .probs = ds_cpu_probs,
    .sample = ds_cpu_sample,
    .check = cpu_check,
    .bandwidth = ds_cpu_bandwidth,
    .spec = &cpu_spec_ops,
};

ds_error *ds_backend_cpu_new(int n_threads, ds_backend **out) {
    ds_cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return ds_errorf("out of memory");
    cb->base.ops = &cpu_ops;
    cb->base.n_threads = n_threads > 0 ? n_threads : 1;
    if (cb->base.n_threads > DS_CPU_MAX_THREADS) cb->base.n_threads = DS_CPU_MAX_THREADS;
    cb->pool = ds_pool_new(cb->base.n_threads);
    if (!cb->pool) {
        free(cb);
        return ds_errorf("cpu backend: cannot start %d threads", n_threads);
    }
    cb->base.n_threads = ds_pool_threads(cb->pool);
    *out = &cb->base;
    return NULL;
}
