/* The CUDA backend's shared state and helpers (CUDA C, included by the .cu
 * files only; one kernel family per file).
 *
 * Everything runs on one stream in call order. Ops have no error return
 * (backend.h): the first failure is recorded with the op's name and
 * returned by check(). Small host arrays an op takes (token ids, positions,
 * RoPE frequencies) travel as kernel parameters by value, at most
 * DS_CU_ROWS rows per launch: row-wise ops are split into launches of that
 * many rows, which changes nothing in any row's result. Inside a step
 * region (backend.h ds_step, graphs.cu) token ids, positions and the key
 * count are read from the device copy of the step instead, so that a
 * recorded graph replays with new values. */
#ifndef DS_CUDA_INTERNAL_H
#define DS_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend/spec_ops.h"
#include "backend/cuda/cuda_config.h"
}

/* Rows per launch for ops that take per-row host arrays. */
#define DS_CU_ROWS 64
/* Largest head_dim / 2 whose inv_freq table rides in a RoPE launch. */
#define DS_CU_MAX_HALF 256
/* Matmuls of at most this many rows use the row-invariant narrow kernel;
 * wider ones (prefill) go through cuBLAS. The CPU backend's threshold. */
#define DS_CU_NARROW_M 32
/* A grid's y extent for a kernel that walks rows from blockIdx.y in strides of gridDim.y (at most 65535). */
static inline unsigned ds_cu_rows_grid(int64_t rows) { return (unsigned)(rows < 65535 ? rows : 65535); }

/* Step regions (graphs.cu): the device copy of a region's ds_step, laid
 * out as [n_keys | walk (DS_CU_WALK) | ids | pos | out], int32. The walk is
 * the Markov walk's [anchor = ids[0], tokens..., ticket, rows done]. */
#define DS_CU_WALK (DS_CU_ROWS + 3)
/* Attention calls of at least this many rows (prefill chunks) run the tiled
 * kernel (attention_prefill.cu), whose rows are not bit-identical to rows
 * decoded alone. Every call the narrow matmuls take (up to DS_CU_NARROW_M
 * rows, row-invariant) stays on the decode kernel, so a verify's rows equal
 * decode's bit for bit for any drafter's gamma up to 31. */
#define DS_CU_PREFILL_ROWS (DS_CU_NARROW_M + 1)
/* cfg.invariant: a call of more than DS_CU_NARROW_M rows runs as slabs of
 * DS_CU_NARROW_M rows through the same op (row-wise ops: the same bits a
 * row gets in a call of its own slab), unless WIDE_OK: its weights take the
 * row-invariant wide product (matmul_invariant.h), which gives those bits
 * in one call. */
#define DS_CU_SLABS(cb, M, WIDE_OK, r0, n, CALL)                                                          \
    if ((cb)->cfg.invariant && (M) > ds_cu_narrow_rows(cb) && !(WIDE_OK)) {                               \
        const int64_t slab_ = ds_cu_narrow_rows(cb);                                                      \
        for (int64_t r0 = 0, n; r0 < (M) && (n = (M) - r0 < slab_ ? (M) - r0 : slab_, 1); r0 += slab_) \
            CALL;                                                                                         \
        return;                                                                                           \
    }
#define DS_CU_STEP_MAX 128 /* most ids, positions and outputs a recorded region takes */
#define DS_CU_STEP_INTS (1 + DS_CU_WALK + 3 * DS_CU_STEP_MAX)
#define DS_CU_STEP_SLOTS 8 /* host staging slots: a slot is refilled once its copy has run */
/* After the step, d_step holds DS_CU_STEP_MAX more ints: the kept outputs
 * of the last region that kept them (ds_step.keep_out), which a later
 * region's ids take (ds_step.n_ids_prev) with a device copy. */
#define DS_CU_CARRY DS_CU_STEP_INTS

typedef struct {
    bool active;          /* ops read the step's values from d_step (run now or recorded) */
    bool capturing;       /* the stream is being recorded */
    const ds_step *step;  /* the host step the ops' pointers point into */
    int off_ids, off_pos, off_out; /* int32 offsets of the arrays in d_step */
    int att_ny;           /* key chunks every attention's grid spans (a bucket of n_keys) */
    uint64_t cap_gen;     /* buffer generation when the recording began */
    struct ds_cu_graph *entry;
} ds_cu_region;

/* Tile counter pairs of the ring matmul, used in turn (matmul_ring.cu). */
#define DS_CU_RING_CTRS 64

typedef struct {
    ds_backend base;
    ds_cuda_config cfg; /* the switches (cuda_config.h) */
    int device;
    int sms;      /* streaming multiprocessors: the persistent kernels' grid */
    int cc_major; /* compute capability (9: Hopper's copy engine for the ring matmul) */
    cudaStream_t stream;
    cublasHandle_t blas;
    ds_error *err;   /* first failure since the last check() */
    void *scratch;   /* grows on demand: attention partials, widened weight tiles */
    size_t scratch_bytes;
    void *tmp;       /* grows on demand: unfused fallbacks' intermediates (never the same op's scratch) */
    size_t tmp_bytes;
    void *tmp2;      /* the normed input of the fused-norm ops' fallbacks (which may use tmp) */
    size_t tmp2_bytes;
    void *profile;   /* per-op timing state (DS_CUDA_PROFILE), cuda_profile.cu */
    int32_t *idx;    /* device token indices (argmax results, the Markov walk's tokens) */
    int idx_len;
    uint64_t markov_rows, markov_steps; /* rows the pruned Markov steps computed, and the steps (profile) */
    int64_t markov_vocab;
    struct ds_cu_tmaps *tmaps; /* the ring matmul's tensor maps (matmul_ring.cu) */
    struct ds_cu_boxes *boxes; /* box-contiguous weight copies (weight_boxes.cu, cfg.ring_boxes), or NULL */
    struct ds_cu_head *head;   /* the drafter's LM head in int8 for its bounds (head_bound.cu), or NULL */
    int *ring_ctr;             /* the ring matmul's tile counters: DS_CU_RING_CTRS pairs (next tile, blocks done) */
    unsigned ring_seq;         /* ring launches so far: launch i uses pair i % DS_CU_RING_CTRS */
    struct ds_cu_ring_trace *ring_trace; /* DS_CUDA_RING_TRACE's timeline (ring_trace.cu), or NULL */
    /* Step regions and their CUDA graphs (graphs.cu). */
    bool graphs_on;       /* cfg.graphs, off with the profile or the ring trace */
    uint64_t gen;         /* bumped whenever device memory a recording may hold is (re)allocated or freed */
    int32_t *d_step;      /* DS_CU_STEP_INTS + DS_CU_STEP_MAX (the carry) on the device */
    int carry_n;          /* outputs held in the carry (0: none) */
    int32_t *h_step;      /* pinned staging: DS_CU_STEP_SLOTS slots of DS_CU_STEP_INTS, then the outputs */
    cudaEvent_t step_ev[DS_CU_STEP_SLOTS]; /* a slot's copy has been done (NULL: never used) */
    int step_slot;
    ds_cu_region reg;
    struct ds_cu_graph *graphs;
    int n_graphs, cap_graphs;
    void *retired[32];    /* buffers replaced while recording, freed after the next wait */
    int n_retired;
    ds_region_stats stats;
    struct ds_cu_page_tables *page_tables; /* paged attention's tables on the device (attention_paged.cu), or NULL */
    struct ds_cu_joined *joined; /* allocations weights_join made, each with its live weights */
    int n_joined, cap_joined;
} ds_cuda_backend;

/* The most rows a bf16 product takes on the narrow kernels: cfg.narrow_rows, DS_CU_NARROW_M where that is
 * outside 1..DS_CU_NARROW_M. */
static inline int64_t ds_cu_narrow_rows(const ds_cuda_backend *cb) {
    const int n = cb->cfg.narrow_rows;
    return n < 1 || n > DS_CU_NARROW_M ? DS_CU_NARROW_M : n;
}

static inline ds_cuda_backend *ds_cu(ds_backend *be) { return (ds_cuda_backend *)be; }

/* Frees the ring matmul's tensor map cache. */
void ds_cu_tmaps_free(ds_cuda_backend *cb);

/* Box-contiguous copies of bf16 weights for the ring (weight_boxes.cu; DS_CUDA_RING_BOXES=auto|1|0): a weight
 * is registered as it is uploaded (=1: copied then), found by its data (auto: copied at its first use outside a
 * recording, where memory allows), dropped with it. */
bool ds_cu_boxes_on(const ds_cuda_backend *cb);
void ds_cu_boxes_stats(const ds_cuda_backend *cb, int64_t *tensors, int64_t *bytes);
ds_error *ds_cu_boxes_add(ds_cuda_backend *cb, const char *name, const void *w, int64_t rows, int64_t cols);
const uint16_t *ds_cu_boxes_of(ds_cuda_backend *cb, const void *w, int64_t rows, int64_t cols, int64_t stride);
void ds_cu_boxes_drop(ds_cuda_backend *cb, const void *w);
void ds_cu_boxes_free(ds_cuda_backend *cb);

/* Step regions (graphs.cu). */
bool ds_cu_region_begin(ds_backend *be, const ds_region_key *key, ds_step *step);
void ds_cu_region_end(ds_backend *be);
void ds_cu_region_stats(ds_backend *be, ds_region_stats *out);
void ds_cu_graphs_init(ds_cuda_backend *cb);
void ds_cu_graphs_free(ds_cuda_backend *cb);
/* Frees the retired buffers (call after the stream has been waited for, outside a recording). */
void ds_cu_retired_free(ds_cuda_backend *cb);
/* In an active region: the device address of n entries of the step's ids,
 * pos or out arrays starting at host pointer p, or NULL with a recorded
 * failure when p does not point into them. Outside a region: NULL. */
const int32_t *ds_cu_step_ptr(ds_cuda_backend *cb, const char *op, const int32_t *p, int64_t n);
/* The device n_keys of the active region. */
static inline const int32_t *ds_cu_step_nkeys(ds_cuda_backend *cb) { return cb->d_step; }
/* Fails (recorded) when a region is active: op waits for the device or reads host memory. */
bool ds_cu_outside_region(ds_cuda_backend *cb, const char *op);

/* The memory bandwidth probe (copy_bandwidth.cu, ds_backend_ops.bandwidth). */
ds_error *ds_cu_bandwidth(ds_backend *be, size_t bytes, int reps, ds_bandwidth *out);

/* Records the first failure: "cuda <op>: <message>". */
void ds_cu_fail(ds_cuda_backend *cb, const char *op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Records e (if not cudaSuccess); returns true on success. */
bool ds_cu_ok(ds_cuda_backend *cb, const char *op, cudaError_t e);
/* Checks the last launch. */
static inline bool ds_cu_launched(ds_cuda_backend *cb, const char *op) { return ds_cu_ok(cb, op, cudaGetLastError()); }
/* Device scratch of at least `bytes`; NULL (and a recorded failure) if it cannot grow. */
void *ds_cu_scratch(ds_cuda_backend *cb, const char *op, size_t bytes);
/* Device int32 buffer of at least n entries (argmax results). */
int32_t *ds_cu_indices(ds_cuda_backend *cb, const char *op, int n);
/* Row argmaxes of x into device memory d_out (queued, no wait). */
bool ds_cu_argmax_dev(ds_cuda_backend *cb, ds_tensor x, int32_t *d_out);
/* A second such buffer, for intermediates that live across ops using scratch. */
void *ds_cu_tmp(ds_cuda_backend *cb, const char *op, size_t bytes);
void *ds_cu_tmp2(ds_cuda_backend *cb, const char *op, size_t bytes);
/* Weight-like tensors (weights, norm vectors, embedding tables) may be fp32,
 * bf16 or f16; anything else is refused with a recorded failure. */
bool ds_cu_float_dtype(ds_cuda_backend *cb, const char *op, ds_dtype t);

/* gelu_tanh(x) * u with the CPU's formula and order, each operation rounded
 * on its own (no contraction): the element-wise kernel and the matmul's
 * GeGLU epilogue give the same bits. */
__device__ __forceinline__ float ds_cu_gelu_tanh_mul(float x, float u) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    const float x3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
    const float t = tanhf(__fmul_rn(k, __fadd_rn(x, x3)));
    return __fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, t)), u);
}

/* The raw bits of element i of a fp32 / bf16 / f16 array, and their value
 * as fp32 (exact widening). Loaded as bits, several elements can be in
 * flight before the first is widened: ds_cu_load's branch on the dtype
 * around each load makes a caller's loads one round trip each (the fused
 * attention prologue's eight weights took eight). */
__device__ __forceinline__ uint32_t ds_cu_load_bits(const void *p, int dtype, int64_t i) {
    return dtype == DS_F32 ? ((const uint32_t *)p)[i] : (uint32_t)((const uint16_t *)p)[i];
}
__device__ __forceinline__ float ds_cu_widen(uint32_t bits, int dtype) {
    if (dtype == DS_BF16) return __uint_as_float(bits << 16);
    if (dtype == DS_F16) return __half2float(__ushort_as_half((unsigned short)bits));
    return __uint_as_float(bits);
}

/* K/V caches in the model's dtype (model/kv_cache.h): fp32, bf16 or f16.
 * ds_cu_to16 rounds an fp32 value to nearest even in the 16-bit one
 * (ds_f32_to_bf16 / ds_f32_to_f16 bit for bit, NaN kept a NaN), ds_cu_from16
 * widens its bits back (exact); ds_cu_kv_dtype_ok: a dtype a cache may have. */
__device__ __forceinline__ uint16_t ds_cu_to16(float f, bool f16) {
    if (f16) return __half_as_ushort(__float2half_rn(f));
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
__device__ __forceinline__ float ds_cu_from16(uint32_t bits, bool f16) {
    return f16 ? __half2float(__ushort_as_half((unsigned short)bits)) : __uint_as_float(bits << 16);
}
static inline bool ds_cu_kv_dtype_ok(ds_dtype dt) { return dt == DS_F32 || dt == DS_BF16 || dt == DS_F16; }

/* Element i of a fp32 / bf16 / f16 array, as fp32 (exact widening). */
__device__ __forceinline__ float ds_cu_load(const void *p, int dtype, int64_t i) {
    if (dtype == DS_BF16) return ds_cu_widen(((const uint16_t *)p)[i], DS_BF16);
    if (dtype == DS_F16) return ds_cu_widen(((const unsigned short *)p)[i], DS_F16);
    return ((const float *)p)[i];
}

/* DS_CUDA_PROFILE=1: wraps every op with GPU timing (cuda_profile.cu). */
void ds_cu_profile_wrap(ds_cuda_backend *cb);

/* 8 fp32 values held in two float4 / 8 bf16 values held in a uint4, as fp32 (exact). */
__device__ __forceinline__ void ds_cu_unpack_f32x8(float4 a, float4 b, float f[8]) {
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void ds_cu_unpack_bf16x8(uint4 u, float f[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        f[2 * j] = __uint_as_float(w[j] << 16);
        f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
}

/* 8 consecutive elements from a 16-byte-aligned address, as fp32. */
template <int DT> __device__ __forceinline__ void ds_cu_load8(const void *p, int64_t i, float f[8]);
template <> __device__ __forceinline__ void ds_cu_load8<DS_F32>(const void *p, int64_t i, float f[8]) {
    const float4 *q = (const float4 *)((const float *)p + i);
    ds_cu_unpack_f32x8(__ldg(q), __ldg(q + 1), f);
}
template <> __device__ __forceinline__ void ds_cu_load8<DS_BF16>(const void *p, int64_t i, float f[8]) {
    ds_cu_unpack_bf16x8(__ldg((const uint4 *)((const uint16_t *)p + i)), f);
}
template <> __device__ __forceinline__ void ds_cu_load8<DS_F16>(const void *p, int64_t i, float f[8]) {
    const uint4 u = __ldg((const uint4 *)((const uint16_t *)p + i));
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        f[2 * j] = __half2float(__ushort_as_half((unsigned short)(w[j] & 0xffffu)));
        f[2 * j + 1] = __half2float(__ushort_as_half((unsigned short)(w[j] >> 16)));
    }
}

/* Kernel launches. Every kernel of this backend is started with
 * programmatic dependent launch (Hopper): it may be scheduled while the
 * kernel before it in the stream drains, and its first statement is
 * ds_cu_grid_wait(), which waits for that kernel's results. That hides the
 * launch gap between the ~250 small dependent kernels of a decode step. */
/* Whether positions pos[0..n) are pos[0], pos[0] + 1, ... */
static inline bool ds_cu_consecutive(const int32_t *pos, int64_t n) {
    for (int64_t i = 1; i < n; i++)
        if (pos[i] != pos[0] + i) return false;
    return true;
}

template <typename... P, typename... A>
static inline void ds_cu_launch_smem(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                     A &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...); /* errors surface in ds_cu_launched() */
}
template <typename... P, typename... A>
static inline void ds_cu_launch(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t stream, A &&...args) {
    ds_cu_launch_smem(kernel, grid, block, 0, stream, static_cast<A &&>(args)...);
}

/* A kernel's dynamic shared memory beyond what it may use by default (48 KB
 * less its static shared memory) must be allowed with cudaFuncSetAttribute,
 * which is a device's setting: each launch site keeps
 * `static ds_cu_smem_allowed allowed;` per kernel instantiation and asks
 * here, which sets the attribute the first time a device needs more than it
 * was allowed (several devices' backends, tensor parallel, each keep their
 * own entry). False (recorded on cb) when the device refuses. */
#define DS_CU_MAX_DEVICES 64
typedef struct {
    size_t bytes[DS_CU_MAX_DEVICES];
} ds_cu_smem_allowed;
template <typename... P>
static inline bool ds_cu_allow_smem(ds_cuda_backend *cb, const char *op, void (*kernel)(P...),
                                    ds_cu_smem_allowed *allowed, size_t bytes) {
    if (cb->device < 0 || cb->device >= DS_CU_MAX_DEVICES) {
        ds_cu_fail(cb, op, "device %d is past the %d this build keeps kernel settings for", cb->device,
                   DS_CU_MAX_DEVICES);
        return false;
    }
    size_t *a = &allowed->bytes[cb->device];
    if (bytes <= *a) return true; /* (no 48 KB shortcut: a kernel's static shared memory counts against it) */
    if (!ds_cu_ok(cb, op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes)))
        return false;
    *a = bytes;
    return true;
}

/* The two halves of ds_cu_grid_wait(), for a kernel that lets the next one
 * be scheduled later than its wait (attention: the next kernel's weight
 * stream would share HBM with its latency-bound key loads). */
__device__ __forceinline__ void ds_cu_grid_wait_only(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void ds_cu_grid_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
/* Waits for the previous kernel in the stream (its results are visible
 * after this), then lets the next kernel be scheduled: it launches once
 * every block of this one has passed here, i.e. while the last wave runs,
 * and waits in its own ds_cu_grid_wait() (see ds_cu_launch). */
__device__ __forceinline__ void ds_cu_grid_wait(void) {
    ds_cu_grid_wait_only();
    ds_cu_grid_trigger();
}

/* Round to nearest even bf16, kept as fp32 (ds_f32_to_bf16 bit for bit). */
__device__ __forceinline__ float ds_cu_rbf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float(((u >> 16) | 0x40u) << 16);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float((u >> 16) << 16);
}

/* Op entry points (backend.h signatures). */
void ds_cu_linear(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias);
/* Quantized weights (matmul_quant.cu): the weight_quant op, and ds_cu_linear's path for them (any row count). */
ds_error *ds_cu_weight_quant(ds_backend *be, const ds_quant_src *src, int64_t rows, int64_t cols, ds_tensor *out);
void ds_cu_linear_quant(ds_cuda_backend *cb, const char *op, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias);
/* out += x @ w^T as one cuBLAS GEMM (beta = 1) where the wide bf16 path takes the call and its rows need not be
 * invariant (linear_residual in place: no temporary, no add launch). False: not taken, nothing done; true:
 * taken (a failure is recorded). */
bool ds_cu_linear_accumulate(ds_cuda_backend *cb, const char *op, ds_tensor out, ds_tensor x, ds_tensor w);
/* DS_X_BF16's prompt-sized product of an x already rounded to bf16 ([M, w.cols] contiguous; the fused norms' copy,
 * linear_fused.cu) with bf16 w: out = xh @ w^T (+ bias) on cuBLAS, no split launch. False (recorded) on failure. */
bool ds_cu_linear_wide_bf16x(ds_cuda_backend *cb, const char *op, ds_tensor out, const uint16_t *xh, int64_t M,
                             ds_tensor w, ds_tensor bias);
void ds_cu_attention(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v, const ds_attn_params *p);
void ds_cu_rmsnorm(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, int dim, float eps);
void ds_cu_rmsnorm_add(ds_backend *be, ds_tensor out, ds_tensor res, ds_tensor x, ds_tensor w, float eps,
                       float scale);
void ds_cu_rope(ds_backend *be, ds_tensor x, int head_dim, const int32_t *pos, const float *inv_freq);
void ds_cu_embed(ds_backend *be, ds_tensor out, ds_tensor table, const int32_t *ids, float scale);
void ds_cu_add(ds_backend *be, ds_tensor out, ds_tensor a, ds_tensor b);
void ds_cu_scale(ds_backend *be, ds_tensor x, float s);
void ds_cu_swiglu(ds_backend *be, ds_tensor out, ds_tensor gate, ds_tensor up);
void ds_cu_geglu_tanh(ds_backend *be, ds_tensor out, ds_tensor gate, ds_tensor up);
void ds_cu_softcap(ds_backend *be, ds_tensor x, float cap);
void ds_cu_round_bf16(ds_backend *be, ds_tensor x);
void ds_cu_copy_kernel(ds_backend *be, ds_tensor dst, ds_tensor src);
void ds_cu_argmax(ds_backend *be, ds_tensor x, int32_t *out);
void ds_cu_linear_residual(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias, ds_tensor res);
void ds_cu_linear_swiglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor wg, ds_tensor wu);
void ds_cu_linear_multi(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, const ds_tensor *ws,
                        const ds_tensor *biases);
void ds_cu_conf_cut(ds_backend *be, ds_tensor x, ds_tensor cut, int32_t *out);
void ds_cu_accept_prefix(ds_backend *be, const int32_t *draft, const int32_t *best, int n, const int32_t *limit,
                         int32_t *out);
void ds_cu_markov_greedy(ds_backend *be, ds_tensor base, ds_tensor out, ds_tensor w1, ds_tensor w2,
                         const ds_markov_bound *bound, bool bf16, int32_t anchor, ds_tensor emb, int32_t *tokens);
void ds_cu_markov_greedy_head(ds_backend *be, ds_tensor x, ds_tensor head, ds_tensor base, bool bf16, ds_tensor w1,
                              ds_tensor w2, const ds_markov_bound *bound, int32_t anchor, ds_tensor emb,
                              int32_t *tokens);
void ds_cu_rmsnorm_linear_multi(ds_backend *be, int n, const ds_tensor *outs, ds_tensor x, ds_tensor nw, float eps,
                                const ds_tensor *ws, const ds_tensor *biases);
void ds_cu_rmsnorm_linear_swiglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor nw, float eps, ds_tensor wg,
                                 ds_tensor wu);
void ds_cu_rmsnorm_linear_geglu(ds_backend *be, ds_tensor out, ds_tensor x, ds_tensor nw, float eps, ds_tensor wg,
                                ds_tensor wu);
void ds_cu_rmsnorm_rope(ds_backend *be, ds_tensor x, ds_tensor w, int head_dim, float eps, const int32_t *pos,
                        const float *inv_freq);
void ds_cu_qk_norm_rope(ds_backend *be, ds_tensor q, ds_tensor qw, ds_tensor k, ds_tensor kw, int head_dim,
                        float eps, const int32_t *pos, const float *inv_freq);
void ds_cu_probs(ds_backend *be, ds_tensor out, ds_tensor logits, const ds_sampling *s);
void ds_cu_sample(ds_backend *be, ds_tensor probs, const double *u, int32_t *out);
void ds_cu_verify_sample(ds_backend *be, ds_tensor logits, const int32_t *draft, int n, ds_tensor draft_probs,
                         const ds_sampling *s, const double *u, int32_t *out);
void ds_cu_verify_sample_many(ds_backend *be, int m, const ds_verify_job *jobs, int32_t *out);
void ds_cu_markov_sample(ds_backend *be, ds_tensor base, ds_tensor out, ds_tensor probs, ds_tensor w1, ds_tensor w2,
                         bool bf16, int32_t anchor, const ds_sampling *s, const double *u, ds_tensor emb,
                         int32_t *tokens);
bool ds_cu_markov_greedy_seqs(ds_backend *be, int n, ds_tensor base, ds_tensor w1, ds_tensor w2,
                              const ds_markov_bound *bound, bool bf16, const int32_t *anchors, ds_tensor emb,
                              int32_t *tokens);
bool ds_cu_markov_sample_seqs(ds_backend *be, int n, ds_tensor base, ds_tensor w1, ds_tensor w2, bool bf16,
                              const int32_t *anchors, const ds_sampling *const *s, const double *u, ds_tensor emb,
                              int32_t *tokens);
void ds_cu_markov_greedy_latent(ds_backend *be, const ds_markov_latent *lat, ds_tensor base, ds_tensor out,
                                ds_tensor w1, ds_tensor w2, const ds_markov_bound *bound, bool bf16, int32_t anchor,
                                ds_tensor emb, int32_t *tokens);
void ds_cu_markov_sample_latent(ds_backend *be, const ds_markov_latent *lat, ds_tensor base, ds_tensor out,
                                ds_tensor probs, ds_tensor w1, ds_tensor w2, bool bf16, int32_t anchor,
                                const ds_sampling *s, const double *u, ds_tensor emb, int32_t *tokens);
/* probs[V] = the processed distribution of x[V] and *d_token (device) =
 * a draw from it with uniform u, in one launch queued on the stream
 * (sample.cu; the sampled Markov walk's step). */
bool ds_cu_probs_draw_dev(ds_cuda_backend *cb, const char *op, const float *x, float *probs, int64_t V,
                          const ds_sampling *s, double u, int32_t *d_token);
/* Processed distributions spread over many blocks a row (sample.cu):
 * whether they apply to V and s (otherwise the block-per-row kernels do);
 * the device workspace for `rows` rows of V; zeroing its row states (before
 * the first run that uses them); queueing rows x[r] (stride xs) ->
 * out[r] (stride os) with workspace rows ws_row.. of ws_rows, and with
 * d_tok the draws with u[r] into d_tok[r] (device). max_ready: the max of
 * x/T is already in the row state (markov.cu's step kernel wrote it to
 * ds_cu_dist_max_slot). */
bool ds_cu_dist_fast(int64_t V, const ds_sampling *s);
size_t ds_cu_dist_bytes(int rows, int64_t V);
bool ds_cu_dist_reset(ds_cuda_backend *cb, const char *op, void *ws, int rows);
float *ds_cu_dist_max_slot(void *ws, int rows, int64_t V, int row);
bool ds_cu_dist_run(ds_cuda_backend *cb, const char *op, void *ws, int ws_rows, int ws_row, const float *x,
                    int64_t xs, float *out, int64_t os, int rows, int64_t V, const ds_sampling *s, const double *u,
                    int32_t *d_tok, bool max_ready);
/* Attention for a prefill chunk (DS_CU_PREFILL_ROWS rows or more at
 * consecutive positions, heads up to 128, outside a step region); false:
 * not such a call, use the decode kernel. */
bool ds_cu_attention_prefill(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                             const ds_attn_params *p);
void ds_cu_qk_norm_rope_attention(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor qw, ds_tensor k, ds_tensor kw,
                                  ds_tensor v, ds_tensor k_cache, ds_tensor v_cache, int head_dim, float eps,
                                  const float *inv_freq, const ds_attn_params *p);
void ds_cu_qk_norm_rope_store(ds_backend *be, ds_tensor q, ds_tensor qw, ds_tensor k, ds_tensor kw, ds_tensor v,
                              ds_tensor k_cache, ds_tensor v_cache, int ring_size, int head_dim, float eps,
                              const int32_t *pos, const float *inv_freq);
void ds_cu_key_norm_rope_store_layers(ds_backend *be, int n, const ds_tensor *k, const ds_tensor *kw,
                                      const ds_tensor *v, const ds_tensor *kc, const ds_tensor *vc, int head_dim,
                                      float eps, const int32_t *pos, const float *inv_freq);
/* Paged KV caches (backend.h ds_kv_pages; attention_paged.cu). A paged
 * call's page table travels to the device once per distinct table (pinned
 * staging, an async copy on the stream); its rows run the same kernels as
 * contiguous rows, only a key's cache row comes from the table: key j of a
 * launch's row i at tab[base[i] + j / page_rows] * page_rows + j % page_rows.
 * Outside step regions only (the tables are host arrays). */
typedef struct {
    const int32_t *tab;  /* device: the call's table */
    int page_rows;
    const int32_t *base; /* host, one per row handed to the launch: where its sequence's list starts in tab */
} ds_cu_pages;
/* A paged call's rows (p's positions, pages' list starts, keys[i] row i's
 * key limit) in groups of one sequence's rows, however many sequences and
 * key limits (attention_blocks.cu: a verify's or a drafter block's rows
 * share their keys' copy): false where it does not apply (fp32 caches,
 * heads past 128, a window, rows mostly one a sequence), nothing launched. */
bool ds_cu_attention_blocks(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                            const ds_attn_params *p, const ds_cu_pages *pages, const int32_t *keys);
/* ds_cu_attention for p->pages: rows grouped into runs of one sequence at
 * consecutive positions; runs of DS_CU_PREFILL_ROWS rows or more on the
 * tiled kernel, the rest on the chunk kernel, as contiguous calls of those
 * rows would. */
void ds_cu_attention_paged(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                           const ds_attn_params *p);
/* The chunk kernel (attention.cu) on rows q (positions p->q_pos, keys below
 * p->n_keys; p->pages ignored), their keys through pg (NULL: contiguous). */
void ds_cu_attention_rows(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                          const ds_attn_params *p, const ds_cu_pages *pg);
/* A paged call's run of one sequence's rows for the tiled kernel: rows
 * [row0, row0 + rows) of q / out (DS_CU_PREFILL_ROWS or more) at positions
 * pos0 .., keys below n_keys, its page list at base in the table. */
typedef struct {
    int64_t row0;
    int rows, pos0, n_keys, base;
} ds_cu_prefill_run;
/* The runs on the tiled kernel, many sequences' in one launch (keys through
 * tab, page_rows a page); false (nothing launched) where it does not take
 * this call's rows (cfg.invariant, head size, cache dtype): the decode
 * kernel does. */
bool ds_cu_attention_prefill_runs(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                                  const ds_attn_params *p, const ds_cu_prefill_run *runs, int n, const int32_t *tab,
                                  int page_rows);
/* qk_norm_rope_attention on paged caches: the q/k norms and RoPE (the
 * qk_norm_rope op), the step's K/V rows stored through the pages in one
 * launch, then paged attention; the bits of ds_qk_norm_rope_then_attention. */
void ds_cu_qk_norm_rope_attention_paged(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor qw, ds_tensor k,
                                        ds_tensor kw, ds_tensor v, ds_tensor k_cache, ds_tensor v_cache, int head_dim,
                                        float eps, const float *inv_freq, const ds_attn_params *p);
/* Frees the page tables' device and pinned buffers (cu_destroy). */
void ds_cu_page_tables_free(ds_cuda_backend *cb);
/* Shape and dtype checks of linear (recorded as op's failure); true when the call may run. */
bool ds_cu_linear_ok(ds_cuda_backend *cb, const char *op, ds_tensor out, ds_tensor x, ds_tensor w, ds_tensor bias);

#endif
