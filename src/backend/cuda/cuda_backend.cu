/* CUDA backend: device memory, transfers, error recording and the ops
 * table. Weights are copied to device memory in their checkpoint dtype
 * (bf16 stays bf16); activations and KV caches are fp32. All work goes to
 * one stream in call order; download() and check() wait for it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/head_bound.h"
#include "backend/cuda/ring_trace.h"

void ds_cu_fail(ds_cuda_backend *cb, const char *op, const char *fmt, ...) {
    if (cb->err) return; /* keep the first: later ones are usually its consequences */
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cb->err = ds_errorf("cuda %s: %s", op, msg);
    /* Model code calls ops without checking each one; say it at once too. */
    fprintf(stderr, "dspark: %s\n", ds_error_message(cb->err));
}

bool ds_cu_ok(ds_cuda_backend *cb, const char *op, cudaError_t e) {
    if (e == cudaSuccess) return true;
    ds_cu_fail(cb, op, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    return false;
}

/* A buffer being replaced: freed now (cudaFree waits for the work that may
 * still read it), or, while a step region is being recorded (whose earlier
 * nodes may hold it), after the next wait. Either way recordings made
 * before hold a stale pointer: the generation moves on. */
static bool drop(ds_cuda_backend *cb, const char *op, void *p) {
    cb->gen++;
    if (cb->reg.capturing) {
        if (cb->n_retired == (int)(sizeof cb->retired / sizeof cb->retired[0])) {
            ds_cu_fail(cb, op, "too many buffers replaced while recording a step region");
            return false;
        }
        cb->retired[cb->n_retired++] = p;
        return true;
    }
    return ds_cu_ok(cb, op, cudaFree(p));
}

static void *grow(ds_cuda_backend *cb, const char *op, void **buf, size_t *have, size_t bytes) {
    if (bytes <= *have) return *buf;
    size_t want = bytes + bytes / 4;
    if (*buf) {
        if (!drop(cb, op, *buf)) return NULL;
        *buf = NULL;
        *have = 0;
    }
    if (!ds_cu_ok(cb, op, cudaMalloc(buf, want))) {
        *buf = NULL;
        return NULL;
    }
    *have = want;
    return *buf;
}

void *ds_cu_scratch(ds_cuda_backend *cb, const char *op, size_t bytes) {
    return grow(cb, op, &cb->scratch, &cb->scratch_bytes, bytes);
}

int32_t *ds_cu_indices(ds_cuda_backend *cb, const char *op, int n) {
    if (n <= cb->idx_len) return cb->idx;
    const int want = n < 256 ? 256 : n;
    if (cb->idx && !drop(cb, op, cb->idx)) return NULL;
    cb->idx = NULL;
    cb->idx_len = 0;
    if (!ds_cu_ok(cb, op, cudaMalloc(&cb->idx, (size_t)want * sizeof(int32_t)))) {
        cb->idx = NULL;
        return NULL;
    }
    cb->idx_len = want;
    return cb->idx;
}

void *ds_cu_tmp(ds_cuda_backend *cb, const char *op, size_t bytes) { return grow(cb, op, &cb->tmp, &cb->tmp_bytes, bytes); }

void *ds_cu_tmp2(ds_cuda_backend *cb, const char *op, size_t bytes) {
    return grow(cb, op, &cb->tmp2, &cb->tmp2_bytes, bytes);
}

bool ds_cu_float_dtype(ds_cuda_backend *cb, const char *op, ds_dtype t) {
    if (t == DS_F32 || t == DS_BF16 || t == DS_F16) return true;
    ds_cu_fail(cb, op, "tensor dtype %s is not supported (F32, BF16, F16)", ds_dtype_name(t));
    return false;
}

static ds_error *cu_alloc(ds_backend *be, ds_dtype dtype, int64_t rows, int64_t cols, ds_tensor *out) {
    ds_cuda_backend *cb = ds_cu(be);
    size_t bytes = (size_t)(rows * cols) * ds_dtype_size(dtype);
    void *p = NULL;
    cb->gen++; /* a new buffer may take a freed one's address: recordings are made again */
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess)
        return ds_errorf("cuda backend: cannot allocate %zu bytes of device memory: %s", bytes, cudaGetErrorString(e));
    e = cudaMemsetAsync(p, 0, bytes, cb->stream);
    if (e != cudaSuccess) {
        cudaFree(p);
        return ds_errorf("cuda backend: cannot clear %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    *out = (ds_tensor){.dtype = dtype, .data = p, .rows = rows, .cols = cols, .stride = cols, .owned = true, .q = {}};
    return NULL;
}

static ds_error *cu_weight(ds_backend *be, const ds_st_tensor *src, int64_t rows, int64_t cols, ds_tensor *out) {
    ds_cuda_backend *cb = ds_cu(be);
    size_t es = ds_dtype_size(src->dtype);
    if ((size_t)(rows * cols) * es != src->nbytes)
        return ds_errorf("tensor %s: %zu bytes, expected %lld x %lld", src->name, src->nbytes, (long long)rows,
                         (long long)cols);
    DS_TRY(cu_alloc(be, src->dtype, rows, cols, out));
    /* On the stream, so that every later op sees the whole copy. */
    cudaError_t e = cudaMemcpyAsync(out->data, src->data, src->nbytes, cudaMemcpyHostToDevice, cb->stream);
    if (e != cudaSuccess) {
        cudaFree(out->data);
        *out = ds_no_tensor();
        return ds_errorf("cuda backend: cannot copy tensor %s (%zu bytes) to the device: %s", src->name, src->nbytes,
                         cudaGetErrorString(e));
    }
    if (src->dtype == DS_BF16) {
        ds_error *err = ds_cu_boxes_add(cb, src->name, out->data, rows, cols);
        if (err) {
            cudaFree(out->data);
            *out = ds_no_tensor();
            return err;
        }
    }
    return NULL;
}

/* An allocation of several weights (weights_join): freed with the last of them. */
struct ds_cu_joined {
    char *base;
    size_t bytes;
    int live;
};

static struct ds_cu_joined *joined_of(ds_cuda_backend *cb, const void *p) {
    for (int i = 0; i < cb->n_joined; i++)
        if ((const char *)p >= cb->joined[i].base && (const char *)p < cb->joined[i].base + cb->joined[i].bytes)
            return &cb->joined[i];
    return NULL;
}

static void cu_release(ds_backend *be, ds_tensor *t) {
    ds_cuda_backend *cb = ds_cu(be);
    if (t->owned && t->data) {
        cb->gen++;
        ds_cu_boxes_drop(cb, t->data);
        ds_cu_head_drop(cb, t->data);
        struct ds_cu_joined *j = joined_of(cb, t->data);
        if (!j) {
            ds_cu_ok(cb, "release", cudaFree(t->data));
        } else if (--j->live == 0) {
            ds_cu_ok(cb, "release", cudaFree(j->base));
            *j = cb->joined[--cb->n_joined];
        }
    }
    *t = ds_no_tensor();
}

/* weights_join (backend.h): one allocation, each weight copied into place and its own freed. The box copies the
 * ring streams (weight_boxes.cu) follow the weights to their new addresses. */
static ds_error *cu_weights_join(ds_backend *be, int n, ds_tensor *const *ws) {
    ds_cuda_backend *cb = ds_cu(be);
    if (n < 2) return NULL;
    const size_t es = ds_dtype_size(ws[0]->dtype);
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        const ds_tensor *w = ws[i];
        if (!w->owned || !w->data || w->q.bits || w->dtype != ws[0]->dtype || w->cols != ws[0]->cols ||
            w->stride != w->cols || joined_of(cb, w->data))
            return NULL; /* not joinable: each stays where it is */
        bytes += (size_t)(w->rows * w->cols) * es;
    }
    if (cb->n_joined == cb->cap_joined) {
        const int cap = cb->cap_joined ? 2 * cb->cap_joined : 64;
        struct ds_cu_joined *g = (struct ds_cu_joined *)realloc(cb->joined, (size_t)cap * sizeof *g);
        if (!g) return ds_errorf("cuda backend: out of host memory joining %d weights", n);
        cb->joined = g, cb->cap_joined = cap;
    }
    char *base = NULL;
    if (cudaMalloc(&base, bytes) != cudaSuccess) {
        cudaGetLastError(); /* short of memory: the weights stay apart (the products are the same) */
        return NULL;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const size_t b = (size_t)(ws[i]->rows * ws[i]->cols) * es;
        cudaError_t e = cudaMemcpyAsync(base + off, ws[i]->data, b, cudaMemcpyDeviceToDevice, cb->stream);
        if (e != cudaSuccess) {
            cudaFree(base);
            return ds_errorf("cuda backend: cannot copy a weight of %zu bytes to its joined place: %s", b,
                             cudaGetErrorString(e));
        }
        off += b;
    }
    cb->gen++;
    cb->joined[cb->n_joined++] = (struct ds_cu_joined){base, bytes, n};
    off = 0;
    for (int i = 0; i < n; i++) {
        ds_tensor *w = ws[i];
        ds_cu_boxes_drop(cb, w->data);
        cudaFree(w->data); /* (waits for the copy above) */
        w->data = base + off;
        off += (size_t)(w->rows * w->cols) * es;
    }
    for (int i = 0; i < n; i++)
        if (ws[i]->dtype == DS_BF16) DS_TRY(ds_cu_boxes_add(cb, "joined weight", ws[i]->data, ws[i]->rows, ws[i]->cols));
    return NULL;
}

static void cu_upload(ds_backend *be, ds_tensor dst, const float *src) {
    ds_cuda_backend *cb = ds_cu(be);
    if (dst.rows <= 0 || dst.cols <= 0 || !ds_cu_outside_region(cb, "upload")) return;
    /* From pageable memory the call returns once src has been staged: the
     * caller may reuse it at once. */
    ds_cu_ok(cb, "upload",
             cudaMemcpy2DAsync(dst.data, (size_t)dst.stride * 4, src, (size_t)dst.cols * 4, (size_t)dst.cols * 4,
                               (size_t)dst.rows, cudaMemcpyHostToDevice, cb->stream));
}

static void cu_download(ds_backend *be, ds_tensor src, float *dst) {
    ds_cuda_backend *cb = ds_cu(be);
    if (src.rows <= 0 || src.cols <= 0 || !ds_cu_outside_region(cb, "download")) return;
    if (ds_cu_ok(cb, "download",
                 cudaMemcpy2DAsync(dst, (size_t)src.cols * 4, src.data, (size_t)src.stride * 4, (size_t)src.cols * 4,
                                   (size_t)src.rows, cudaMemcpyDeviceToHost, cb->stream)) &&
        ds_cu_ok(cb, "download", cudaStreamSynchronize(cb->stream)))
        ds_cu_retired_free(cb);
    cb->stats.d2h++;
}

/* A kernel, not the copy engine: elementwise.cu says why. */
static void cu_copy(ds_backend *be, ds_tensor dst, ds_tensor src) {
    if (dst.rows <= 0 || dst.cols <= 0 || dst.data == src.data) return;
    ds_cu_copy_kernel(be, dst, src);
}

static ds_error *cu_check(ds_backend *be) {
    ds_cuda_backend *cb = ds_cu(be);
    if (ds_cu_outside_region(cb, "check") && ds_cu_ok(cb, "check", cudaStreamSynchronize(cb->stream)))
        ds_cu_retired_free(cb);
    ds_error *e = cb->err;
    cb->err = NULL;
    return e;
}

static void cu_bind_thread(ds_backend *be) {
    ds_cuda_backend *cb = (ds_cuda_backend *)be;
    const cudaError_t e = cudaSetDevice(cb->device);
    if (e != cudaSuccess && !cb->err)
        cb->err = ds_errorf("cuda backend: cannot use device %d from this thread: %s", cb->device, cudaGetErrorString(e));
}

static void cu_destroy(ds_backend *be) {
    ds_cuda_backend *cb = ds_cu(be);
    if (cb->reg.capturing) { /* a region left open: end its recording */
        cudaGraph_t g = NULL;
        if (cudaStreamEndCapture(cb->stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
        cb->reg.capturing = false;
    }
    if (cb->stream) cudaStreamSynchronize(cb->stream);
    ds_cu_graphs_free(cb);
    ds_cu_ring_trace_close(cb);
    if (cb->scratch) cudaFree(cb->scratch);
    if (cb->tmp) cudaFree(cb->tmp);
    if (cb->tmp2) cudaFree(cb->tmp2);
    if (cb->idx) cudaFree(cb->idx);
    if (cb->ring_ctr) cudaFree(cb->ring_ctr);
    ds_cu_tmaps_free(cb);
    ds_cu_boxes_free(cb);
    for (int i = 0; i < cb->n_joined; i++) cudaFree(cb->joined[i].base); /* (weights not released) */
    free(cb->joined);
    ds_cu_head_free(cb);
    ds_cu_page_tables_free(cb);
    if (cb->blas) cublasDestroy(cb->blas);
    if (cb->stream) cudaStreamDestroy(cb->stream);
    if (cb->err) ds_error_free(cb->err);
    free(cb);
}

static const ds_spec_ops cuda_spec_ops = {
    .markov_greedy = ds_cu_markov_greedy,
    .markov_greedy_head = ds_cu_markov_greedy_head,
    .conf_cut = ds_cu_conf_cut,
    .accept_prefix = ds_cu_accept_prefix,
    .verify_sample = ds_cu_verify_sample,
    .verify_sample_many = ds_cu_verify_sample_many,
    .markov_sample = ds_cu_markov_sample,
    .markov_greedy_seqs = ds_cu_markov_greedy_seqs,
    .markov_sample_seqs = ds_cu_markov_sample_seqs,
    .markov_greedy_latent = ds_cu_markov_greedy_latent,
    .markov_sample_latent = ds_cu_markov_sample_latent,
};

/* cfg.narrow_rows: the narrow kernels up to it, the wide path (cuBLAS) past it; 8 at least (1-8 rows: the ring
 * kernel, faster than cuBLAS there). Under cfg.invariant it stays: the wide invariant product gives the narrow
 * kernels' bits, but slower (9-32 rows: 610 us a layer's projections vs 212-309 narrow, H100, session 39). Without
 * it, 9-32 rows on cuBLAS: 183-186 us. */
static int cu_exact_rows(ds_backend *be, int rows) {
    ds_cuda_backend *cb = ds_cu(be);
    const int prev = (int)ds_cu_narrow_rows(cb);
    if (!cb->cfg.invariant) cb->cfg.narrow_rows = rows < 8 ? 8 : rows > DS_CU_NARROW_M ? DS_CU_NARROW_M : rows;
    return prev;
}

static const ds_backend_ops cuda_ops = {
    .name = "cuda",
    .prefill_rows = 512, /* 8B at 64 rows a chunk: every 64 prompt tokens re-read 16 GB of weights (3.8 ms) */
    .destroy = cu_destroy,
    .bind_thread = cu_bind_thread,
    .alloc = cu_alloc,
    .weight = cu_weight,
    .weight_quant = ds_cu_weight_quant, /* refused with DS_CUDA_QUANT=0 (matmul_quant.cu) */
    .weights_join = cu_weights_join,
    .exact_rows = cu_exact_rows,
    .release = cu_release,
    .upload = cu_upload,
    .download = cu_download,
    .copy = cu_copy,
    .embed = ds_cu_embed,
    .linear = ds_cu_linear,
    .rmsnorm = ds_cu_rmsnorm,
    .rope = ds_cu_rope,
    .attention = ds_cu_attention,
    .add = ds_cu_add,
    .scale = ds_cu_scale,
    .swiglu = ds_cu_swiglu,
    .geglu_tanh = ds_cu_geglu_tanh,
    .softcap = ds_cu_softcap,
    .round_bf16 = ds_cu_round_bf16,
    .argmax = ds_cu_argmax,
    .linear_residual = ds_cu_linear_residual,
    .linear_swiglu = ds_cu_linear_swiglu,
    .linear_multi = ds_cu_linear_multi,
    .rmsnorm_linear_multi = ds_cu_rmsnorm_linear_multi,
    .rmsnorm_linear_swiglu = ds_cu_rmsnorm_linear_swiglu,
    .rmsnorm_linear_geglu = ds_cu_rmsnorm_linear_geglu,
    .rmsnorm_add = ds_cu_rmsnorm_add,
    .rmsnorm_rope = ds_cu_rmsnorm_rope,
    .qk_norm_rope = ds_cu_qk_norm_rope,
    .probs = ds_cu_probs,
    .sample = ds_cu_sample,
    .qk_norm_rope_store = ds_cu_qk_norm_rope_store,
    .key_norm_rope_store_layers = ds_cu_key_norm_rope_store_layers,
    .qk_norm_rope_attention = ds_cu_qk_norm_rope_attention,
    .region_begin = ds_cu_region_begin,
    .region_end = ds_cu_region_end,
    .region_stats = ds_cu_region_stats,
    .check = cu_check,
    .bandwidth = ds_cu_bandwidth,
    .spec = &cuda_spec_ops,
};

extern "C" ds_error *ds_backend_cuda_new(int device, ds_backend **out) {
    *out = NULL;
    ds_cuda_config cfg;
    DS_TRY(ds_cuda_config_from_env(&cfg));
    return ds_backend_cuda_new_with(device, &cfg, out);
}

extern "C" ds_cuda_config *ds_cuda_config_of(ds_backend *be) {
    return be && be->ops == &cuda_ops ? &ds_cu(be)->cfg : NULL;
}

extern "C" ds_error *ds_backend_cuda_new_with(int device, const ds_cuda_config *config, ds_backend **out) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return ds_errorf("no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    if (device < 0 || device >= n) return ds_errorf("no CUDA device %d (%d present)", device, n);
    if ((e = cudaSetDevice(device)) != cudaSuccess)
        return ds_errorf("cuda backend: cannot use device %d: %s", device, cudaGetErrorString(e));
    ds_cuda_backend *cb = (ds_cuda_backend *)calloc(1, sizeof *cb);
    if (!cb) return ds_errorf("out of memory");
    cb->base.ops = &cuda_ops;
    cb->base.n_threads = 1;
    cb->cfg = *config;
    cb->base.mode = cb->cfg.invariant ? "invariant" : "";
    cb->device = device;
    if ((e = cudaDeviceGetAttribute(&cb->sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess || cb->sms < 1 ||
        (e = cudaDeviceGetAttribute(&cb->cc_major, cudaDevAttrComputeCapabilityMajor, device)) != cudaSuccess) {
        free(cb);
        return ds_errorf("cuda backend: cannot read device %d's multiprocessor count or compute capability: %s", device,
                         cudaGetErrorString(e));
    }
    if ((e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        cu_destroy(&cb->base);
        return ds_errorf("cuda backend: cannot create a stream on device %d: %s", device, cudaGetErrorString(e));
    }
    cublasStatus_t s = cublasCreate(&cb->blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cb->blas = NULL;
        cu_destroy(&cb->base);
        return ds_errorf("cuda backend: cannot start cuBLAS (status %d)", (int)s);
    }
    /* Plain fp32 products (no TF32): prefill rows then match the CPU's sgemm to rounding. */
    if (cublasSetStream(cb->blas, cb->stream) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(cb->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
        cu_destroy(&cb->base);
        return ds_errorf("cuda backend: cannot configure cuBLAS");
    }
    /* The ring matmul's tile counters start at zero and every launch leaves its pair there. */
    if ((e = cudaMalloc(&cb->ring_ctr, 2 * DS_CU_RING_CTRS * sizeof(int))) != cudaSuccess ||
        (e = cudaMemset(cb->ring_ctr, 0, 2 * DS_CU_RING_CTRS * sizeof(int))) != cudaSuccess) {
        cb->ring_ctr = NULL;
        cu_destroy(&cb->base);
        return ds_errorf("cuda backend: cannot allocate the matmul's tile counters on device %d: %s", device,
                         cudaGetErrorString(e));
    }
    if (cb->cfg.ring_trace[0]) {
        ds_error *te = ds_cu_ring_trace_open(cb, cb->cfg.ring_trace);
        if (te) {
            cu_destroy(&cb->base);
            return te;
        }
    }
    ds_cu_graphs_init(cb);
    if (cb->cfg.profile) ds_cu_profile_wrap(cb);
    *out = &cb->base;
    return NULL;
}
