/* The CPU backend's heavier kernels (one family per file). */
#ifndef DS_CPU_KERNELS_H
#define DS_CPU_KERNELS_H

#include <stdatomic.h>

#include "backend/spec_ops.h"
#include "base/threadpool.h"

/* The CPU backend: the generic part plus its thread pool. */
#define DS_CPU_MAX_THREADS 64

/* Per-thread scratch slots, grown on demand by the thread that owns the tid. */
enum { DS_SCRATCH_WEIGHTS, DS_SCRATCH_SCORES, DS_SCRATCH_NORM, DS_SCRATCH_KV, DS_SCRATCH_SLOTS };

/* Narrow-matmul weight panels (cpu_panel.c): DS_PANEL output features per
 * panel, k-major. */
#define DS_PANEL 16

typedef struct {
    const void *data; /* key (NULL: empty slot) */
    int64_t rows, cols, stride;
    ds_dtype dtype;
    void *panels; /* NULL until first used */
} ds_cpu_packed;

typedef struct {
    ds_cpu_packed *slots;
    size_t cap, used;
} ds_cpu_pack_cache;

static inline int64_t ds_cpu_panels(int64_t n) { return (n + DS_PANEL - 1) / DS_PANEL; }
/* Remembers a weight tensor (contents fixed from now on) for packing. */
void ds_cpu_pack_register(ds_cpu_pack_cache *c, ds_tensor w);
/* Drops every cached packing of this data. */
void ds_cpu_pack_forget(ds_cpu_pack_cache *c, const void *data);
void ds_cpu_pack_free(ds_cpu_pack_cache *c);
/* What a panel holds (cpu_panel.c). Quantized panels keep a group's 16
 * scales and 16 biases in fp32, then its codes: 16 bytes a k step (Q8), or
 * 16 bytes a pair of k steps (Q4: the even k in the low nibbles); the kernel
 * dequantizes with one fused multiply-add, the value fp32 panels of the
 * dequantized weight hold, so both give the same bits. */
typedef enum { DS_PAN_F32, DS_PAN_BF16, DS_PAN_Q8, DS_PAN_Q4 } ds_cpu_pan_kind;
/* Bytes of one panel of w in that kind. */
static inline size_t ds_cpu_panel_bytes(ds_tensor w, ds_cpu_pan_kind k) {
    if (k == DS_PAN_F32) return (size_t)(DS_PANEL * w.cols) * 4;
    if (k == DS_PAN_BF16) return (size_t)(DS_PANEL * w.cols) * 2;
    const int bits = k == DS_PAN_Q8 ? 8 : 4;
    return (size_t)(w.cols / w.q.group) * (2 * DS_PANEL * 4 + (size_t)w.q.group * DS_PANEL * bits / 8);
}
/* The panels of a registered weight, packed on first use (NULL: not
 * registered or out of memory), and their kind. */
const void *ds_cpu_pack_get(ds_cpu_pack_cache *c, ds_tensor w, ds_cpu_pan_kind *kind);
/* Panels [p0, p1) of any weight as fp32 panels into dst. */
void ds_cpu_pack_f32(ds_tensor w, int64_t p0, int64_t p1, float *dst);

typedef struct {
    ds_backend base;
    ds_pool *pool;
    ds_cpu_pack_cache packs;
    float *scratch[DS_CPU_MAX_THREADS][DS_SCRATCH_SLOTS];
    size_t scratch_cap[DS_CPU_MAX_THREADS][DS_SCRATCH_SLOTS];
    float *temp; /* the wide fused ops' intermediate (main thread), grown on demand */
    size_t temp_cap;
    /* The first failure since the last check() (ops have no error return;
     * workers may record one too, hence atomic). */
    _Atomic(ds_error *) err;
} ds_cpu_backend;

static inline ds_pool *ds_cpu_pool(ds_backend *be) { return ((ds_cpu_backend *)be)->pool; }
/* Records a failure of op (the first one wins; check() returns it):
 * "cpu <op>: <message>". Safe from worker threads. */
void ds_cpu_fail(ds_backend *be, const char *op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Scratch of n floats for thread tid; NULL (and a recorded failure naming
 * op) when out of memory. */
float *ds_cpu_scratch(ds_backend *be, const char *op, int tid, int slot, size_t n);

/* Quantized weights (cpu_quant.c): the weight_quant op, and row n of one
 * dequantized to fp32 (w.cols values: embedding rows, panel packing). */
ds_error *ds_cpu_weight_quant(ds_backend *be, const ds_quant_src *src, int64_t rows, int64_t cols, ds_tensor *out);
void ds_cpu_dequant_row(ds_tensor w, int64_t n, float *out);

/* The memory bandwidth probe (cpu_bandwidth.c, ds_backend_ops.bandwidth). */
ds_error *ds_cpu_bandwidth(ds_backend *be, size_t bytes, int reps, ds_bandwidth *out);
void ds_cpu_linear(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias);
/* Every matmul runs the row-invariant panel kernels (cpu_matmul.c); wider
 * calls (prefill) go in slabs of this many input rows. */
#define DS_CPU_SLAB_ROWS 32
/* What a panel matmul call does with its results. */
typedef enum {
    DS_EPI_STORE,    /* outs[i] = x ws[i]^T (+ biases[i]), n <= 3 */
    DS_EPI_RESIDUAL, /* outs[0] = res + (x ws[0]^T (+ biases[0])), n = 1 */
    DS_EPI_SWIGLU,   /* outs[0] = silu(x ws[0]^T) * (x ws[1]^T), n = 2, no biases */
} ds_cpu_epilogue;
/* The panel matmul (cpu_matmul.c), any row count; biases may be NULL. */
void ds_cpu_linear_panels(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, const ds_tensor *ws,
                          const ds_tensor *biases, ds_cpu_epilogue epi, ds_tensor res);
/* The fused ops of ds_backend_ops (cpu_linear_fused.c). */
void ds_cpu_linear_residual(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias, ds_tensor res);
void ds_cpu_linear_swiglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor wg, ds_tensor wu);
void ds_cpu_linear_multi(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, const ds_tensor *ws,
                         const ds_tensor *biases);
void ds_cpu_swiglu(ds_backend *be, ds_tensor out, ds_tensor gate, ds_tensor up);
void ds_cpu_attention(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                      const ds_attn_params *p);
void ds_cpu_rmsnorm_row(float *out, const float *x, const float *w, int dim, float eps);
/* DS_X_BF16: a fused norm's 1 / rms (the GPU's tile order; dim a multiple of 16) and the fused ops that apply it
 * to the products' sums (cpu_linear_fused.c). */
float ds_cpu_rms_inv_tiles(const float *x, int dim, float eps);
void ds_cpu_rmsnorm_linear_multi(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, ds_tensor norm_w,
                                 float eps, const ds_tensor *ws, const ds_tensor *biases);
void ds_cpu_rmsnorm_linear_swiglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor norm_w, float eps,
                                  ds_tensor wg, ds_tensor wu);
void ds_cpu_rmsnorm_linear_geglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor norm_w, float eps,
                                 ds_tensor wg, ds_tensor wu);
/* The sampling ops (cpu_sample.c). */
void ds_cpu_probs(ds_backend *be, ds_tensor out, ds_tensor logits, const ds_sampling *s);
void ds_cpu_sample(ds_backend *be, ds_tensor probs, const double *u, int32_t *out);
void ds_cpu_verify_sample(ds_backend *be, ds_tensor logits, const int32_t *draft, int n, ds_tensor draft_probs,
                          const ds_sampling *s, const double *u, int32_t *out);
void ds_cpu_markov_sample(ds_backend *be, ds_tensor base, ds_tensor out, ds_tensor probs, ds_tensor w1, ds_tensor w2,
                          bool bf16, int32_t anchor, const ds_sampling *s, const double *u, ds_tensor emb,
                          int32_t *tokens);

#endif
