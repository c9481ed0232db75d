/* The op interface that model code is written against. A backend owns the
 * memory its tensors live in (host RAM for the CPU, HBM for CUDA) and
 * implements every op; model code never touches tensor data directly.
 *
 * Tensors are 2-D row-major views: `rows` x `cols` elements, `stride`
 * elements between row starts. Activations are fp32; weights may be fp32,
 * bf16 or f16 and matmuls accumulate in fp32.
 *
 * Row invariance: for every op, row i of the output depends only on row i
 * of the inputs (and on the weights / KV cache), never on how many rows
 * share the call. Verification scores n+1 rows at once where plain decoding
 * scores one, and lossless greedy output needs both to agree to the bit. */
#ifndef DS_BACKEND_H
#define DS_BACKEND_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/dtype.h"
#include "base/error.h"
#include "io/quant_checkpoint.h"
#include "io/safetensors.h"
#include "sample/sampling.h" /* ds_sampling, the sampling ops' parameters */

typedef struct ds_backend ds_backend;
typedef struct ds_spec_ops ds_spec_ops; /* the speculative ops (spec_ops.h) */

/* An affine-quantized weight (MLX's layout, base/affine_quant.h), bits 0
 * for a plain tensor. The tensor's data then holds the packed words (stride:
 * words a row, cols * bits / 32), rows x cols is the logical shape, and
 * dtype is that of the scales and biases ([rows, cols / group] each, backend
 * memory): the dtype the dequantized weight stands for, so code asking a
 * weight's dtype (are logits rounded to bf16? is x?) sees the model's.
 * Only weight_quant makes one; only linear (and the fused linear ops) and
 * embed take one; a backend without weight_quant never sees one. */
typedef struct {
    int bits, group;
    const void *scales, *biases;
} ds_quant;

typedef struct {
    ds_dtype dtype;
    void *data; /* backend memory */
    int64_t rows, cols, stride;
    bool owned; /* memory belongs to this tensor (not a view, not a mapped weight) */
    ds_quant q; /* q.bits > 0: a quantized weight */
} ds_tensor;

/* Rows [r0, r0+n) of t, as a view sharing t's memory. */
static inline ds_tensor ds_rows(ds_tensor t, int64_t r0, int64_t n) {
    ds_tensor v = t;
    v.data = (char *)t.data + (size_t)(r0 * t.stride) * ds_dtype_size(t.dtype);
    v.rows = n;
    v.owned = false;
    return v;
}
/* Whether b's rows follow a's in memory as rows of one matrix (same dtype,
 * width and stride, dense): weights_join made them so. */
static inline bool ds_weights_adjacent(ds_tensor a, ds_tensor b) {
    return a.data && b.data && !a.q.bits && !b.q.bits && a.dtype == b.dtype && a.cols == b.cols &&
           a.stride == b.stride && b.data == (const char *)a.data + (size_t)(a.rows * a.stride) * ds_dtype_size(a.dtype);
}
/* Most projections one linear_multi call takes (a DSpark drafter's context:
 * K and V of 5 layers from the same rows). */
#define DS_LINEAR_MULTI_MAX 10

/* Columns [c0, c0+n) of every row, as a view. */
static inline ds_tensor ds_cols(ds_tensor t, int64_t c0, int64_t n) {
    ds_tensor v = t;
    v.data = (char *)t.data + (size_t)c0 * ds_dtype_size(t.dtype);
    v.cols = n;
    v.owned = false;
    return v;
}

/* Paged KV caches (the batched engine): a cache tensor is a pool of pages
 * of page_rows rows each, and every sequence has its own list of pages (a
 * block table). Position j of query row i's sequence lives at cache row
 * ds_kv_page_row(pages, i, j). One call may mix rows of many sequences. */
typedef struct {
    int page_rows;            /* rows a page holds */
    const int32_t *table;     /* host: the sequences' page lists, concatenated */
    const int32_t *row_table; /* host, one per row: where that row's sequence's list starts in table */
    const int32_t *row_keys;  /* host, one per query row: the key positions its sequence has (0..row_keys-1)
                                 for attention; NULL: n_keys for every row */
} ds_kv_pages;

static inline int64_t ds_kv_page_row(const ds_kv_pages *pg, int64_t i, int64_t pos) {
    return (int64_t)pg->table[pg->row_table[i] + pos / pg->page_rows] * pg->page_rows + pos % pg->page_rows;
}

/* Attention over a KV cache. Query row i (absolute position q_pos[i]) sees
 * key rows j < n_keys with: causal -> j <= q_pos[i] (and j > q_pos[i] - window
 * when window > 0); not causal -> every j. Keys/values are stored by
 * absolute position (row j holds position j) unless the cache is a ring:
 * ring_size > 0 means row = position % ring_size (sliding layers). */
typedef struct {
    int n_heads, n_kv_heads, head_dim, v_head_dim;
    int n_keys;            /* key rows to consider: positions 0..n_keys-1 */
    bool causal;
    int window;            /* sliding window (0 = none) */
    int ring_size;         /* 0 = cache indexed by position */
    float scale;
    const int32_t *q_pos;  /* host array, one position per query row */
    /* Paged caches (NULL: row = position, or position % ring_size): key j
     * of row i at ds_kv_page_row(pages, i, j), and with row_keys, row i's
     * keys are j < row_keys[i] (n_keys bounds them all). No ring. A backend
     * without paged attention fails the op, naming it. */
    const ds_kv_pages *pages;
} ds_attn_params;

/* Step regions: a sequence of ops that is the same from one step to the
 * next but for a few values (token ids, positions, the key count), which a
 * backend may record once and replay (CUDA graphs). The values live in a
 * ds_step the model owns; inside a region, ops take them by pointer into
 * it: embed's ids, rope / norm-rope / qk_norm_rope_store's positions and
 * attention's q_pos point into step->ids / step->pos (any offset), an
 * attention's n_keys equals step->n_keys, argmax's host outputs and those
 * of the spec ops (spec_ops.h: markov_greedy, conf_cut, accept_prefix)
 * point into step->out (accept_prefix's inputs into step->ids /
 * step->out), and markov_greedy's anchor is step->ids[0]. Every other argument (tensors, row counts, constants such
 * as inv_freq) must be a function of the region's key. No op in a region
 * may wait for the backend or move host memory (download, upload, check). */
typedef struct {
    int32_t n_keys;            /* the key count of every attention in the region */
    int32_t *ids, *pos, *out;  /* host arrays of cap entries each */
    int cap;
    int n_ids, n_pos, n_out;   /* entries the region reads (ids, pos) and leaves for the host (out) */
    /* Chaining two regions without a host round trip (a backend without
     * regions, or one that ran the region op by op, ignores these):
     * keep_out (set by the caller): out may stay on the backend, for the
     * next region's ids, instead of coming to the host at region_end;
     * out_kept (set false by the caller before region_begin, true by a
     * backend's region_end that kept them): out[] on the host holds
     * nothing new, the values are on the backend until the next region
     * that keeps its outputs. ids_prev_at, n_ids_prev (set by the caller):
     * ids[ids_prev_at + i] = out[i] of the last region whose outputs were
     * kept, for i < n_ids_prev (0: none); the host's ids there are
     * placeholders (valid ids: host-side checks read them). A backend that
     * runs this region op by op brings those values to the host first. */
    bool keep_out, out_kept;
    int ids_prev_at, n_ids_prev;
} ds_step;

/* What makes two regions the same recording: the model's kind of step, its
 * largest op row count and whatever else changes its op sequence. */
typedef struct {
    int kind;          /* DS_REGION_* */
    int rows;          /* the most rows any op of the region takes */
    int variant;       /* model-defined: anything else that changes the op sequence */
    const void *owner; /* the model object (two models on one backend never share a recording) */
} ds_region_key;
enum { DS_REGION_TARGET = 1, DS_REGION_DRAFT = 2 };

/* How a backend ran its regions (dspark bench, tests). */
typedef struct {
    bool enabled;         /* regions are recorded and replayed (CUDA graphs on) */
    int64_t captures;     /* recordings made (first capture and re-captures) */
    int64_t replays;      /* regions replayed from a recording */
    int64_t eager;        /* regions run op by op (warm-up, too many rows, graphs off) */
    int64_t graphs;       /* recordings held now */
    int64_t d2h;          /* device->host copies the host waited for (downloads, argmax / walk results outside
                             regions, region outputs): a greedy DSpark round with graphs on makes one */
    int64_t weight_copies;     /* weights the backend also holds in a layout of its own (CUDA: the ring's boxes,
                                  the drafter's LM head in int8 for its bounds) */
    int64_t weight_copy_bytes; /* the device memory those copies take */
} ds_region_stats;

/* A backend's memory bandwidth, measured (dspark bench's floors): what was
 * timed, on how large a buffer, and the best rate of the repetitions. */
typedef struct {
    double bytes_per_s; /* bytes moved (read, plus written for a copy) / seconds, best repetition */
    double buffer_bytes; /* bytes of each buffer the probe streamed (a probe may shrink it to fit) */
    const char *method;  /* e.g. "device-to-device copy, read + write bytes counted" */
    double peak_bytes_per_s; /* the datasheet figure where the backend can tell (CUDA: memory clock x bus
                                width x 2, from the device's attributes), else 0 */
    char device[96];     /* what was measured (CUDA: the device's name), or "" */
} ds_bandwidth;



typedef struct {
    const char *name;
    /* Rows a prefill forward takes unless the caller says (ds_target_opts,
     * ds_drafter_opts): a GPU streams every weight once per forward, so more
     * rows a chunk amortize it; the CPU's chunks stay cache-sized. */
    int prefill_rows;
    void (*destroy)(ds_backend *be);
    /* Makes the calling thread use this backend's device (CUDA: cudaSetDevice, a per-thread setting), for a
     * thread other than the one that created it: a tensor-parallel rank's. NULL: nothing to do (the CPU). */
    void (*bind_thread)(ds_backend *be);
    /* Memory. alloc zero-fills. weight() makes a tensor from a checkpoint
     * tensor (the CPU maps it in place; a GPU copies it to device memory). */
    ds_error *(*alloc)(ds_backend *be, ds_dtype dtype, int64_t rows, int64_t cols, ds_tensor *out);
    ds_error *(*weight)(ds_backend *be, const ds_st_tensor *src, int64_t rows, int64_t cols, ds_tensor *out);
    /* A quantized weight (ds_quant) of logical shape [rows, cols] from its
     * checkpoint tensors (validated: io/quant_checkpoint.h). Optional: NULL
     * for a backend without quantized weights (loading one is then an error
     * naming the tensor and the backend). */
    ds_error *(*weight_quant)(ds_backend *be, const ds_quant_src *src, int64_t rows, int64_t cols, ds_tensor *out);
    /* Moves n weights that one input always meets (QKV; gate and up) into
     * one allocation, ws[i + 1]'s rows right after ws[i]'s, so that a wide
     * product of them all can be one GEMM (ds_weights_adjacent). Values and
     * shapes stay; each is still released on its own (the allocation goes
     * with the last). Does nothing where they do not qualify (dtype, width,
     * quantized) or memory is short. Optional: NULL, nothing to gain. */
    ds_error *(*weights_join)(ds_backend *be, int n, ds_tensor *const *ws);
    /* How many rows a product may have and still give each row the bits a
     * one-row product gives it: the single-request engine verifies gamma + 1
     * rows and needs decode's bits there (the default, as many as a verify
     * takes); the batched engine without batch invariance needs none, and
     * asks for 1 around its steps, so that rows past it may take faster
     * kernels whose bits depend on the row count (CUDA: cuBLAS from 9 rows
     * instead of the narrow kernels; under cfg.invariant nothing changes).
     * Returns the previous setting, for the caller to restore. Optional:
     * NULL where every product is row-exact at any row count (CPU). */
    int (*exact_rows)(ds_backend *be, int rows);
    void (*release)(ds_backend *be, ds_tensor *t);
    void (*upload)(ds_backend *be, ds_tensor dst, const float *src);  /* host fp32 -> dst (fp32) */
    void (*download)(ds_backend *be, ds_tensor src, float *dst);      /* src (fp32) -> host */
    /* Same shape: fp32, or two tensors of one dtype (bytes), or fp32 into a
     * bf16 / f16 K/V cache (model/kv_cache.h: each element rounded to
     * nearest even) and back (widened, exact). */
    void (*copy)(ds_backend *be, ds_tensor dst, ds_tensor src);

    /* out[i] = table[ids[i]] * scale (ids on the host). */
    void (*embed)(ds_backend *be, ds_tensor out, ds_tensor table, const int32_t *ids, float scale);
    /* out[M,N] = x[M,K] @ w[N,K]^T (+ bias[N] when bias.data). */
    void (*linear)(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias);
    /* Row-wise RMSNorm over `cols`: out = x / rms(x) * (w or 1). Rows may be
     * heads: x viewed as [rows*k, cols/k] with dim = head size. */
    void (*rmsnorm)(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, int dim, float eps);
    /* In-place rotate-half RoPE on x[M, n_heads*head_dim]; inv_freq[head_dim/2]
     * (zeros give the identity tail of proportional RoPE). */
    void (*rope)(ds_backend *be, ds_tensor x, int head_dim, const int32_t *pos, const float *inv_freq);
    /* k, v: caches of fp32, bf16 or f16 (the model's dtype, model/kv_cache.h),
     * each element widened to fp32 as it is read; scores, softmax and the
     * output in fp32. */
    void (*attention)(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                      const ds_attn_params *p);
    void (*add)(ds_backend *be, ds_tensor out, ds_tensor a, ds_tensor b);      /* out = a + b */
    void (*scale)(ds_backend *be, ds_tensor x, float s);                       /* x *= s */
    void (*swiglu)(ds_backend *be, ds_tensor out, ds_tensor gate, ds_tensor up); /* silu(g)*u */
    void (*geglu_tanh)(ds_backend *be, ds_tensor out, ds_tensor gate, ds_tensor up);
    void (*softcap)(ds_backend *be, ds_tensor x, float cap);                   /* tanh(x/c)*c */
    /* Rounds fp32 values to the nearest bf16 (kept as fp32): for results the
     * reference computes in the checkpoint's bf16 dtype, such as logits. */
    void (*round_bf16)(ds_backend *be, ds_tensor x);
    /* out[r] = index of row r's largest value (ties go to the lowest index,
     * as torch.argmax; a NaN is never preferred), on the host; waits for the
     * backend.
     * Greedy decoding needs only this, not the whole row of logits. */
    void (*argmax)(ds_backend *be, ds_tensor x, int32_t *out);
    /* Fused ops, optional (NULL: model code runs the unfused sequence
     * through the ds_* helpers below). A backend provides them where one
     * pass beats several, as on a GPU where each op is a launch. Each must
     * keep the row invariance above. */
    /* out = res + x @ w^T (+ bias); out may be res. */
    void (*linear_residual)(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias, ds_tensor res);
    /* out = silu(x @ wg^T) * (x @ wu^T). */
    void (*linear_swiglu)(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor wg, ds_tensor wu);
    /* outs[i] = x @ ws[i]^T (+ biases[i]) for i < n <= DS_LINEAR_MULTI_MAX: projections of one input. */
    void (*linear_multi)(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, const ds_tensor *ws,
                         const ds_tensor *biases);
    /* outs[i] = n @ ws[i]^T (+ biases[i]), n = rmsnorm(x, norm_w) over the whole row. */
    void (*rmsnorm_linear_multi)(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, ds_tensor norm_w,
                                 float eps, const ds_tensor *ws, const ds_tensor *biases);
    /* out = silu(n @ wg^T) * (n @ wu^T), n = rmsnorm(x, norm_w). */
    void (*rmsnorm_linear_swiglu)(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor norm_w, float eps,
                                  ds_tensor wg, ds_tensor wu);
    /* out = gelu_tanh(n @ wg^T) * (n @ wu^T), n = rmsnorm(x, norm_w) (Gemma's MLP). */
    void (*rmsnorm_linear_geglu)(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor norm_w, float eps,
                                 ds_tensor wg, ds_tensor wu);
    /* out = (res + rmsnorm(x, w)) * scale over whole rows (Gemma's post-norms:
     * a sublayer's output normed before the residual add; scale: the layer
     * scalar, 1 for none); out may be res. The bits of rmsnorm, add, scale. */
    void (*rmsnorm_add)(ds_backend *be, ds_tensor out, ds_tensor res, ds_tensor x, ds_tensor w, float eps,
                        float scale);
    /* rmsnorm(x, w, head_dim, eps) then rope(x, head_dim, pos, inv_freq), in place. */
    void (*rmsnorm_rope)(ds_backend *be, ds_tensor x, ds_tensor w, int head_dim, float eps, const int32_t *pos,
                         const float *inv_freq);
    /* rmsnorm_rope of q (weights qw) and of k (kw) at the same positions,
     * in one pass (q and k have the same rows). */
    void (*qk_norm_rope)(ds_backend *be, ds_tensor q, ds_tensor qw, ds_tensor k, ds_tensor kw, int head_dim,
                         float eps, const int32_t *pos, const float *inv_freq);
    /* Sampling at T > 0 (ds_sampling_greedy(s) false) where the logits are,
     * so that a step moves a few ints to the host instead of rows of V
     * floats. Optional as a pair (with spec_ops.h's verify_sample and
     * markov_sample): NULL where the backend has none; callers then download
     * the logits and run src/sample/ (probs, draw) on the host, which these
     * ops follow. Uniforms are drawn on the host (ds_rng_uniform) in the
     * order the host path draws them, so a seeded generation gives the same
     * tokens on every backend except where rounding moves a uniform across
     * a CDF step. Host arrays and results, like argmax.
     * probs: out[r] = ds_probs_from_logits(logits[r]) (softmax(x/T) in fp32,
     * top-k, top-p over the kept mass, renormalised). */
    void (*probs)(ds_backend *be, ds_tensor out, ds_tensor logits, const ds_sampling *s);
    /* out[r] = ds_sample_probs_u(probs[r], u[r]), on the host when the call returns. */
    void (*sample)(ds_backend *be, ds_tensor probs, const double *u, int32_t *out);
    /* q (rows 0: none) and k: rmsnorm_rope in place, as qk_norm_rope /
     * rmsnorm_rope (weights qw, kw); then row i of k and of v goes to row
     * pos[i] of k_cache / v_cache (pos[i] % ring_size when ring_size > 0),
     * rounded to the caches' dtype as copy rounds.
     * Optional: NULL runs that sequence and row copies (ds_qk_norm_rope_store). */
    void (*qk_norm_rope_store)(ds_backend *be, ds_tensor q, ds_tensor qw, ds_tensor k, ds_tensor kw, ds_tensor v,
                               ds_tensor k_cache, ds_tensor v_cache, int ring_size, int head_dim, float eps,
                               const int32_t *pos, const float *inv_freq);
    /* qk_norm_rope_store without q or ring for n layers at the same
     * positions: k[i] (weight kw[i]) normed and rotated, its rows and v[i]'s
     * to rows pos of k_cache[i] / v_cache[i] (a drafter's context keys of
     * every layer: one launch on the GPU instead of one a layer). Optional:
     * NULL runs qk_norm_rope_store a layer (ds_key_norm_rope_store_layers). */
    void (*key_norm_rope_store_layers)(ds_backend *be, int n, const ds_tensor *k, const ds_tensor *kw,
                                       const ds_tensor *v, const ds_tensor *k_cache, const ds_tensor *v_cache,
                                       int head_dim, float eps, const int32_t *pos, const float *inv_freq);
    /* qk_norm_rope_store (no ring) then attention(out, q, k_cache,
     * v_cache, p): the q/k norms, RoPE and the K/V store of a decode or
     * verification step with its attention, p->q_pos == pos. The values are
     * those of the two calls; q may be left unnormed (nothing reads it
     * after); with p->pages the K/V rows go through the pages. Optional:
     * NULL runs the two calls (ds_qk_norm_rope_attention). */
    void (*qk_norm_rope_attention)(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor qw, ds_tensor k,
                                   ds_tensor kw, ds_tensor v, ds_tensor k_cache, ds_tensor v_cache, int head_dim,
                                   float eps, const float *inv_freq, const ds_attn_params *p);
    /* Step regions (see ds_step), optional (NULL: every region runs its ops
     * as written). region_begin returns true when the caller must issue the
     * region's ops (to run them, or to have them recorded), false when the
     * backend has replayed the recording of this key with step's values (the
     * caller then skips the ops). region_end is called either way; after it
     * step->out[0 .. n_out) holds the region's host outputs. Allocations and
     * releases invalidate recordings. */
    bool (*region_begin)(ds_backend *be, const ds_region_key *key, ds_step *step);
    void (*region_end)(ds_backend *be);
    void (*region_stats)(ds_backend *be, ds_region_stats *out);
    /* Ops queue work and have no error return: a backend records the first
     * failure (a GPU error, memory running out for a scratch buffer),
     * naming the op. check() waits for the queued work and returns that
     * error (NULL when none), clearing it. NULL for a backend whose ops
     * cannot fail. */
    ds_error *(*check)(ds_backend *be);
    /* Measures how fast the backend's memory streams (ds_bandwidth): buffers
     * of about `bytes` each, `reps` timed passes after a warm-up, the best
     * kept. Outside any step region; allocates and frees its own buffers.
     * NULL for a backend without a probe. */
    ds_error *(*bandwidth)(ds_backend *be, size_t bytes, int reps, ds_bandwidth *out);
    /* The drafter's walks and the verifier's decisions where the values are
     * (spec_ops.h), or NULL: speculative code then runs them on the host. */
    const ds_spec_ops *spec;
} ds_backend_ops;

struct ds_backend {
    const ds_backend_ops *ops;
    int n_threads;
    /* What else changes its timings and bits beside the ops' name ("" for
     * none; CUDA: "invariant" under DS_CUDA_INVARIANT=1): part of the key of
     * a cached step-cost curve, so a curve measured in one mode is not reused
     * in the other. */
    const char *mode;
};

ds_error *ds_backend_cpu_new(int n_threads, ds_backend **out);
/* The CUDA backend on GPU `device` (bf16/f16/fp32 weights in device memory,
 * fp32 activations). Fails with a message saying why when the build has no
 * CUDA support ("CUDA support is not compiled in") or there is no such
 * device ("no CUDA device"). */
ds_error *ds_backend_cuda_new(int device, ds_backend **out);

/* Rows a prefill forward takes when its caller does not say (ds_backend_ops.prefill_rows; 64 where unset). */
static inline int ds_backend_prefill_rows(const ds_backend *be) {
    return be->ops->prefill_rows > 0 ? be->ops->prefill_rows : 64;
}

/* The backend's measured memory bandwidth (ds_backend_ops.bandwidth), or an error saying it has no probe. */
static inline ds_error *ds_backend_bandwidth(ds_backend *be, size_t bytes, int reps, ds_bandwidth *out) {
    if (!be->ops->bandwidth) return ds_errorf("backend %s has no memory bandwidth probe", be->ops->name);
    return be->ops->bandwidth(be, bytes, reps, out);
}

/* "cuda 1 threads invariant": what a cached step-cost curve was measured on
 * (the ops' name, threads, mode), into buf; snprintf's return. */
static inline int ds_backend_label(const ds_backend *be, char *buf, size_t n) {
    const bool mode = be->mode && *be->mode;
    return snprintf(buf, n, "%s %d threads%s%s", be->ops->name, be->n_threads, mode ? " " : "", mode ? be->mode : "");
}

/* The pending error of a backend's ops, if any (see ds_backend_ops.check). */
static inline ds_error *ds_backend_check(ds_backend *be) { return be->ops->check ? be->ops->check(be) : NULL; }

static inline ds_tensor ds_no_tensor(void) {
    ds_tensor t = {DS_F32, NULL, 0, 0, 0, false, {0, 0, NULL, NULL}}; /* (no compound literal: CUDA C++ includes this too) */
    return t;
}

/* The fused ops, or their unfused sequence where a backend has none. tmp:
 * scratch of out's shape (unused by a backend that fuses). */
static inline void ds_linear_residual(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias,
                                      ds_tensor res, ds_tensor tmp) {
    if (be->ops->linear_residual) {
        be->ops->linear_residual(be, out, x, w, bias, res);
        return;
    }
    be->ops->linear(be, tmp, x, w, bias);
    be->ops->add(be, out, res, tmp);
}
/* tmp: scratch of out's shape. */
static inline void ds_linear_swiglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor wg, ds_tensor wu,
                                    ds_tensor tmp) {
    if (be->ops->linear_swiglu) {
        be->ops->linear_swiglu(be, out, x, wg, wu);
        return;
    }
    be->ops->linear(be, out, x, wg, ds_no_tensor());
    be->ops->linear(be, tmp, x, wu, ds_no_tensor());
    be->ops->swiglu(be, out, out, tmp);
}
static inline void ds_linear_multi(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, const ds_tensor *ws,
                                   const ds_tensor *biases) {
    if (be->ops->linear_multi) {
        be->ops->linear_multi(be, n, outs, x, ws, biases);
        return;
    }
    for (int i = 0; i < n; i++) be->ops->linear(be, outs[i], x, ws[i], biases[i]);
}
/* xn: scratch of x's shape for the unfused norm. */
static inline void ds_rmsnorm_linear_multi(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x,
                                           ds_tensor norm_w, float eps, const ds_tensor *ws, const ds_tensor *biases,
                                           ds_tensor xn) {
    if (be->ops->rmsnorm_linear_multi) {
        be->ops->rmsnorm_linear_multi(be, n, outs, x, norm_w, eps, ws, biases);
        return;
    }
    be->ops->rmsnorm(be, xn, x, norm_w, (int)x.cols, eps);
    ds_linear_multi(be, n, outs, xn, ws, biases);
}
/* xn: scratch of x's shape; tmp: of out's shape. */
static inline void ds_rmsnorm_linear_swiglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor norm_w, float eps,
                                            ds_tensor wg, ds_tensor wu, ds_tensor xn, ds_tensor tmp) {
    if (be->ops->rmsnorm_linear_swiglu) {
        be->ops->rmsnorm_linear_swiglu(be, out, x, norm_w, eps, wg, wu);
        return;
    }
    be->ops->rmsnorm(be, xn, x, norm_w, (int)x.cols, eps);
    ds_linear_swiglu(be, out, xn, wg, wu, tmp);
}
/* xn: scratch of x's shape; tmp: of out's shape. */
static inline void ds_rmsnorm_linear_geglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor norm_w, float eps,
                                           ds_tensor wg, ds_tensor wu, ds_tensor xn, ds_tensor tmp) {
    if (be->ops->rmsnorm_linear_geglu) {
        be->ops->rmsnorm_linear_geglu(be, out, x, norm_w, eps, wg, wu);
        return;
    }
    be->ops->rmsnorm(be, xn, x, norm_w, (int)x.cols, eps);
    be->ops->linear(be, out, xn, wg, ds_no_tensor());
    be->ops->linear(be, tmp, xn, wu, ds_no_tensor());
    be->ops->geglu_tanh(be, out, out, tmp);
}
/* x: scratch the unfused sequence norms in place. */
static inline void ds_rmsnorm_add(ds_backend *be, ds_tensor out, ds_tensor res, ds_tensor x, ds_tensor w, float eps,
                                  float scale) {
    if (be->ops->rmsnorm_add) {
        be->ops->rmsnorm_add(be, out, res, x, w, eps, scale);
        return;
    }
    be->ops->rmsnorm(be, x, x, w, (int)x.cols, eps);
    be->ops->add(be, out, res, x);
    if (scale != 1.0f) be->ops->scale(be, out, scale);
}
static inline void ds_rmsnorm_rope(ds_backend *be, ds_tensor x, ds_tensor w, int head_dim, float eps,
                                   const int32_t *pos, const float *inv_freq) {
    if (be->ops->rmsnorm_rope) {
        be->ops->rmsnorm_rope(be, x, w, head_dim, eps, pos, inv_freq);
        return;
    }
    be->ops->rmsnorm(be, x, x, w, head_dim, eps);
    be->ops->rope(be, x, head_dim, pos, inv_freq);
}
static inline void ds_qk_norm_rope(ds_backend *be, ds_tensor q, ds_tensor qw, ds_tensor k, ds_tensor kw,
                                   int head_dim, float eps, const int32_t *pos, const float *inv_freq) {
    if (be->ops->qk_norm_rope) {
        be->ops->qk_norm_rope(be, q, qw, k, kw, head_dim, eps, pos, inv_freq);
        return;
    }
    ds_rmsnorm_rope(be, q, qw, head_dim, eps, pos, inv_freq);
    ds_rmsnorm_rope(be, k, kw, head_dim, eps, pos, inv_freq);
}

/* Step regions: begin / end, for backends with or without them. */
static inline bool ds_region_begin(ds_backend *be, const ds_region_key *key, ds_step *step) {
    return be->ops->region_begin ? be->ops->region_begin(be, key, step) : true;
}
static inline void ds_region_end(ds_backend *be) {
    if (be->ops->region_end) be->ops->region_end(be);
}
static inline ds_region_stats ds_backend_region_stats(ds_backend *be) {
    ds_region_stats s = {false, 0, 0, 0, 0, 0, 0, 0};
    if (be->ops->region_stats) be->ops->region_stats(be, &s);
    return s;
}



/* Row i of src to row pos[i] (mod ring; through pages when paged) of dst,
 * as runs of consecutive rows. */
static inline int64_t ds_cache_row(const ds_kv_pages *pages, int ring, int64_t i, int64_t pos) {
    return pages ? ds_kv_page_row(pages, i, pos) : ring > 0 ? pos % ring : pos;
}
static inline void ds_store_rows_paged(ds_backend *be, ds_tensor dst, ds_tensor src, int ring, const int32_t *pos,
                                       const ds_kv_pages *pages) {
    for (int64_t i = 0; i < src.rows;) {
        const int64_t r0 = ds_cache_row(pages, ring, i, pos[i]);
        int64_t n = 1;
        while (i + n < src.rows && ds_cache_row(pages, ring, i + n, pos[i + n]) == r0 + n && (ring <= 0 || r0 + n < ring))
            n++;
        be->ops->copy(be, ds_rows(dst, r0, n), ds_rows(src, i, n));
        i += n;
    }
}
/* pages: paged caches (ds_kv_pages; no ring), or NULL. */
static inline void ds_qk_norm_rope_store(ds_backend *be, ds_tensor q, ds_tensor qw, ds_tensor k, ds_tensor kw,
                                         ds_tensor v, ds_tensor k_cache, ds_tensor v_cache, int ring_size,
                                         int head_dim, float eps, const int32_t *pos, const float *inv_freq,
                                         const ds_kv_pages *pages) {
    if (be->ops->qk_norm_rope_store && !pages) {
        be->ops->qk_norm_rope_store(be, q, qw, k, kw, v, k_cache, v_cache, ring_size, head_dim, eps, pos, inv_freq);
        return;
    }
    if (q.rows > 0) ds_qk_norm_rope(be, q, qw, k, kw, head_dim, eps, pos, inv_freq);
    else ds_rmsnorm_rope(be, k, kw, head_dim, eps, pos, inv_freq);
    ds_store_rows_paged(be, k_cache, k, ring_size, pos, pages);
    ds_store_rows_paged(be, v_cache, v, ring_size, pos, pages);
}
static inline void ds_key_norm_rope_store_layers(ds_backend *be, int n, const ds_tensor *k, const ds_tensor *kw,
                                                 const ds_tensor *v, const ds_tensor *k_cache,
                                                 const ds_tensor *v_cache, int head_dim, float eps,
                                                 const int32_t *pos, const float *inv_freq,
                                                 const ds_kv_pages *pages) {
    if (be->ops->key_norm_rope_store_layers && !pages) {
        be->ops->key_norm_rope_store_layers(be, n, k, kw, v, k_cache, v_cache, head_dim, eps, pos, inv_freq);
        return;
    }
    for (int i = 0; i < n; i++)
        ds_qk_norm_rope_store(be, ds_rows(k[i], 0, 0), ds_no_tensor(), k[i], kw[i], v[i], k_cache[i], v_cache[i], 0,
                              head_dim, eps, pos, inv_freq, pages);
}
/* qk_norm_rope_attention as its two calls (a backend's own op falls back
 * to this where its fused launch does not apply). */
static inline void ds_qk_norm_rope_then_attention(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor qw,
                                                  ds_tensor k, ds_tensor kw, ds_tensor v, ds_tensor k_cache,
                                                  ds_tensor v_cache, int head_dim, float eps, const float *inv_freq,
                                                  const ds_attn_params *p) {
    ds_qk_norm_rope_store(be, q, qw, k, kw, v, k_cache, v_cache, 0, head_dim, eps, p->q_pos, inv_freq, p->pages);
    be->ops->attention(be, out, q, k_cache, v_cache, p);
}
static inline void ds_qk_norm_rope_attention(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor qw, ds_tensor k,
                                             ds_tensor kw, ds_tensor v, ds_tensor k_cache, ds_tensor v_cache,
                                             int head_dim, float eps, const float *inv_freq,
                                             const ds_attn_params *p) {
    if (be->ops->qk_norm_rope_attention)
        be->ops->qk_norm_rope_attention(be, out, q, qw, k, kw, v, k_cache, v_cache, head_dim, eps, inv_freq, p);
    else ds_qk_norm_rope_then_attention(be, out, q, qw, k, kw, v, k_cache, v_cache, head_dim, eps, inv_freq, p);
}

#endif
