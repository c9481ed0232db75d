/* The training ops on one CUDA GPU (train_ops.h): GEMMs on cuBLAS in plain
 * fp32 (no TF32: the step must match the CPU's and PyTorch's fp32 goldens at
 * 1e-4), the rest our own kernels, everything on the legacy default stream in
 * call order. upload / download are synchronous cudaMemcpy's.
 *
 * Determinism: no kernel uses atomics and every reduction has a fixed shape
 * (a row's sum is a fixed tree, a column's partial sums are added in chunk
 * order, scatter_add adds rows in row order), so a step gives the same bits
 * every run on the same GPU — `dspark train`'s resumed runs stay
 * byte-identical to uninterrupted ones, as on the CPU.
 *
 * Errors: the ops table has no error return (its ops are void), so the first
 * failing CUDA call is recorded with the op's name and printed at once; after
 * it every op does nothing, download() fills its destination with NaN bytes
 * and sumsq() returns NaN. The trainer stops on a non-finite gradient norm
 * before anything reaches the weights; alloc() returns the recorded error. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "train/train_ops.h"
}

typedef struct {
    ds_train_dev base;
    int device;
    int smem_optin; /* the most dynamic shared memory a block may opt into */
    cublasHandle_t blas;
    void *scratch; /* per-op temporaries (column partials, per-row loss terms, ...) */
    size_t scratch_bytes;
    bool failed;
    char why[512];
} cu_dev;

static cu_dev *CU(ds_train_dev *d) { return (cu_dev *)d; }

static void fail(cu_dev *d, const char *op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(cu_dev *d, const char *op, const char *fmt, ...) {
    if (d->failed) return; /* keep the first: later ones are usually its consequences */
    d->failed = true;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(d->why, sizeof d->why, "cuda trainer %s: %s", op, msg);
    /* The step calls ops without checking each one (they return nothing): say it now. */
    fprintf(stderr, "dspark: %s\n", d->why);
}

static bool ok(cu_dev *d, const char *op, cudaError_t e) {
    if (e == cudaSuccess) return true;
    fail(d, op, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    return false;
}
static bool launched(cu_dev *d, const char *op) { return ok(d, op, cudaGetLastError()); }

/* Device scratch of at least `bytes`; NULL (and a recorded failure) if it cannot grow. Ops run in stream
 * order, so one op's scratch is free again for the next. */
static void *scratch(cu_dev *d, const char *op, size_t bytes) {
    if (d->failed) return NULL;
    if (bytes > d->scratch_bytes) {
        if (d->scratch) ok(d, op, cudaFree(d->scratch)); /* waits for the work still using it */
        d->scratch = NULL, d->scratch_bytes = 0;
        const size_t want = bytes + bytes / 4 + 4096;
        if (!ok(d, op, cudaMalloc(&d->scratch, want))) {
            d->scratch = NULL;
            return NULL;
        }
        d->scratch_bytes = want;
    }
    return d->scratch;
}

/* Grid-stride launches: enough blocks to fill the GPU, never more than the limit. */
static unsigned grid_for(size_t n, int threads) {
    const size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

/* ---- reductions (fixed trees: the same bits every run) ---- */

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The block's sum, in every thread (blockDim a multiple of 32). sh: 32 floats of shared memory. */
__device__ float block_sum(float v, float *sh) {
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    return warp_sum(lane < nw ? sh[lane] : 0.0f);
}
__device__ double block_sum_d(double v, double *sh) {
    v = warp_sum_d(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    return warp_sum_d(lane < nw ? sh[lane] : 0.0);
}

/* Online softmax statistics: (m, s) = (max, sum of exp(x - max)) merged with another pair. */
__device__ __forceinline__ void online_add(float &m, float &s, float x) {
    if (x > m) {
        s = s * expf(m - x) + 1.0f; /* m = -inf at first: 0 * 0 + 1 */
        m = x;
    } else {
        s += expf(x - m);
    }
}
__device__ __forceinline__ void online_merge(float &m, float &s, float m2, float s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
        m = m2, s = s2;
        return;
    }
    const float mx = fmaxf(m, m2);
    s = s * expf(m - mx) + s2 * expf(m2 - mx);
    m = mx;
}
__device__ void block_online(float &m, float &s, float *shm, float *shs) {
    for (int o = 16; o; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        online_merge(m, s, m2, s2);
    }
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) shm[w] = m, shs[w] = s;
    __syncthreads();
    m = lane < nw ? shm[lane] : -INFINITY;
    s = lane < nw ? shs[lane] : 0.0f;
    for (int o = 16; o; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        online_merge(m, s, m2, s2);
    }
}

/* ---- memory ---- */

static void cu_destroy(ds_train_dev *dv) {
    if (!dv) return;
    cu_dev *d = CU(dv);
    if (d->scratch) cudaFree(d->scratch);
    if (d->blas) cublasDestroy(d->blas);
    free(d);
}

static ds_error *cu_alloc(ds_train_dev *dv, size_t bytes, void **out) {
    cu_dev *d = CU(dv);
    *out = NULL;
    if (d->failed) return ds_errorf("%s (allocating %zu bytes after it)", d->why, bytes);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky: clear it, the caller decides */
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        return ds_errorf("cuda trainer: cannot allocate %zu bytes on GPU %d (%zu of %zu MiB free): %s", bytes,
                         d->device, free_b >> 20, total_b >> 20, cudaGetErrorString(e));
    }
    if (bytes && !ok(d, "alloc", cudaMemsetAsync(p, 0, bytes, 0))) {
        cudaFree(p);
        return ds_errorf("%s", d->why);
    }
    *out = p;
    return NULL;
}

static void cu_free(ds_train_dev *dv, void *p) {
    if (p) ok(CU(dv), "free", cudaFree(p));
}

static void cu_upload(ds_train_dev *dv, void *dst, const void *src, size_t bytes) {
    cu_dev *d = CU(dv);
    if (d->failed || !bytes) return;
    ok(d, "upload", cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

static void cu_download(ds_train_dev *dv, void *dst, const void *src, size_t bytes) {
    cu_dev *d = CU(dv);
    if (!bytes) return;
    if (d->failed || !ok(d, "download", cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost)))
        memset(dst, 0xff, bytes); /* NaN floats: a failed run cannot pass for a good one */
}

static void cu_zero(ds_train_dev *dv, void *p, size_t bytes) {
    cu_dev *d = CU(dv);
    if (d->failed || !bytes) return;
    ok(d, "zero", cudaMemsetAsync(p, 0, bytes, 0));
}

/* ---- GEMM, axpy ---- */

__global__ void scale_kernel(int M, int N, float beta, float *C, int ldc) {
    const size_t n = (size_t)M * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float *c = C + (i / N) * ldc + i % N;
        *c = beta == 0 ? 0.0f : beta * *c;
    }
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first, the sizes swapped,
 * and each operand's transpose flag as given (a row-major [r, c] array is a column-major [c, r] one). */
static void cu_gemm(ds_train_dev *dv, bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc) {
    cu_dev *d = CU(dv);
    if (d->failed || M <= 0 || N <= 0) return;
    if (K <= 0) { /* an empty product: C = beta * C */
        scale_kernel<<<grid_for((size_t)M * N, 256), 256>>>(M, N, beta, C, ldc);
        launched(d, "gemm (K = 0)");
        return;
    }
    const cublasStatus_t s = cublasSgemm(d->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N,
                                         M, K, &alpha, B, ldb, A, lda, &beta, C, ldc);
    if (s != CUBLAS_STATUS_SUCCESS)
        fail(d, "gemm", "cublasSgemm (ta %d, tb %d, M %d, N %d, K %d, lda %d, ldb %d, ldc %d): status %d", ta, tb, M,
             N, K, lda, ldb, ldc, (int)s);
}

__global__ void axpy_kernel(size_t n, float alpha, const float *x, float *y) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += alpha * x[i];
}

static void cu_axpy(ds_train_dev *dv, size_t n, float alpha, const float *x, float *y) {
    cu_dev *d = CU(dv);
    if (d->failed || !n) return;
    axpy_kernel<<<grid_for(n, 256), 256>>>(n, alpha, x, y);
    launched(d, "axpy");
}

/* ---- gather, scatter_add ---- */

__global__ void gather_kernel(int cols, const float *table, const int32_t *ids, float *out) {
    const float *src = table + (size_t)ids[blockIdx.x] * cols;
    float *dst = out + (size_t)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c];
}

static void cu_gather(ds_train_dev *dv, int rows, int cols, const float *table, const int32_t *ids, float *out) {
    cu_dev *d = CU(dv);
    if (d->failed || rows <= 0 || cols <= 0) return;
    gather_kernel<<<rows, 128>>>(cols, table, ids, out);
    launched(d, "gather");
}

/* dtable[ids[i]] += d[i] without atomics: the block of the first row with an id adds every row with that id,
 * in row order, onto the table row: the CPU's serial loop's additions exactly, so the same bits. Blocks of
 * later rows with the id do nothing. The id scans cost O(rows^2) comparisons in all (a micro-batch's Markov
 * rows: thousands), cheap next to the step. */
#define SCATTER_THREADS 256
__global__ void __launch_bounds__(SCATTER_THREADS) scatter_add_kernel(int rows, int cols, const float *d,
                                                                      const int32_t *ids, float *dt) {
    __shared__ int32_t match[SCATTER_THREADS];
    __shared__ int warp_n[SCATTER_THREADS / 32];
    const int i = blockIdx.x, t = threadIdx.x, lane = t & 31, w = t >> 5;
    const int32_t id = ids[i];
    int earlier = 0;
    for (int j = t; j < i; j += SCATTER_THREADS) earlier |= ids[j] == id;
    if (__syncthreads_or(earlier)) return; /* not the first row with this id */
    for (int c0 = 0; c0 < cols; c0 += SCATTER_THREADS) {
        const int c = c0 + t;
        float acc = c < cols ? dt[(size_t)id * cols + c] : 0.0f;
        for (int j0 = i; j0 < rows; j0 += SCATTER_THREADS) {
            /* this chunk's rows with the id, in order: a ballot per warp, then the warps' offsets */
            const bool hit = j0 + t < rows && ids[j0 + t] == id;
            const unsigned bal = __ballot_sync(0xffffffffu, hit);
            __syncthreads(); /* match[] of the previous chunk is read */
            if (lane == 0) warp_n[w] = __popc(bal);
            __syncthreads();
            int off = 0, n = 0;
            for (int k = 0; k < SCATTER_THREADS / 32; k++) off += k < w ? warp_n[k] : 0, n += warp_n[k];
            if (hit) match[off + __popc(bal & ((1u << lane) - 1))] = j0 + t;
            __syncthreads();
            if (c < cols)
                for (int k = 0; k < n; k++) acc += d[(size_t)match[k] * cols + c];
        }
        if (c < cols) dt[(size_t)id * cols + c] = acc;
    }
}

static void cu_scatter_add(ds_train_dev *dv, int rows, int cols, const float *dd, const int32_t *ids, float *dt) {
    cu_dev *d = CU(dv);
    if (d->failed || rows <= 0 || cols <= 0) return;
    scatter_add_kernel<<<rows, SCATTER_THREADS>>>(rows, cols, dd, ids, dt);
    launched(d, "scatter_add");
}

/* ---- RMSNorm ---- */

/* Rows of up to this many columns take a warp each (q / k norms: head_dim), wider ones a block each. */
#define NORM_WARP_MAX 512
#define NORM_THREADS 256

/* y = w * x * rs per row; `group` threads (a warp or the block) share a row. */
template <bool WARP>
__global__ void __launch_bounds__(NORM_THREADS) rmsnorm_kernel(int rows, int n, const float *x, const float *w,
                                                               float eps, float *y, float *rstd) {
    __shared__ float sh[32];
    const int g = WARP ? 32 : blockDim.x, t = WARP ? threadIdx.x & 31 : threadIdx.x;
    const int64_t r = WARP ? (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32 : blockIdx.x;
    if (WARP && r >= rows) return; /* whole warps: the shuffles stay full */
    const float *xr = x + r * n;
    float ss = 0;
    for (int i = t; i < n; i += g) ss += xr[i] * xr[i];
    ss = WARP ? warp_sum(ss) : block_sum(ss, sh);
    const float rs = 1.0f / sqrtf(ss / (float)n + eps);
    if (t == 0) rstd[r] = rs;
    float *yr = y + r * n;
    for (int i = t; i < n; i += g) yr[i] = w[i] * (xr[i] * rs);
}

static void cu_rmsnorm(ds_train_dev *dv, int rows, int n, const float *x, const float *w, float eps, float *y,
                       float *rstd) {
    cu_dev *d = CU(dv);
    if (d->failed || rows <= 0 || n <= 0) return;
    if (n <= NORM_WARP_MAX)
        rmsnorm_kernel<true><<<(rows + NORM_THREADS / 32 - 1) / (NORM_THREADS / 32), NORM_THREADS>>>(rows, n, x, w,
                                                                                                      eps, y, rstd);
    else
        rmsnorm_kernel<false><<<rows, NORM_THREADS>>>(rows, n, x, w, eps, y, rstd);
    launched(d, "rmsnorm");
}

/* dx = rs * (w*dy) - x * rs^3 * mean(w*dy*x) per row (add: dx +=). */
template <bool WARP>
__global__ void __launch_bounds__(NORM_THREADS) rmsnorm_dx_kernel(int rows, int n, const float *x, const float *w,
                                                                  const float *rstd, const float *dy, float *dx,
                                                                  bool add) {
    __shared__ float sh[32];
    const int g = WARP ? 32 : blockDim.x, t = WARP ? threadIdx.x & 31 : threadIdx.x;
    const int64_t r = WARP ? (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32 : blockIdx.x;
    if (WARP && r >= rows) return;
    const float *xr = x + r * n, *dyr = dy + r * n;
    const float rs = rstd[r];
    float dot = 0;
    for (int i = t; i < n; i += g) dot += w[i] * dyr[i] * xr[i];
    dot = WARP ? warp_sum(dot) : block_sum(dot, sh);
    const float c = rs * rs * rs * dot / (float)n;
    float *dxr = dx + r * n;
    for (int i = t; i < n; i += g) {
        const float v = rs * w[i] * dyr[i] - xr[i] * c;
        dxr[i] = add ? dxr[i] + v : v;
    }
}

/* dw: each block sums a chunk of rows for 128 columns into partial[chunk][col]; a second pass adds the
 * chunks in order onto dw. The chunking depends on the shape only: the same bits every run. */
#define DW_ROWS 64
#define DW_COLS 128
__global__ void rmsnorm_dw_partial(int rows, int n, const float *x, const float *rstd, const float *dy,
                                   float *partial) {
    const int c = blockIdx.x * DW_COLS + threadIdx.x;
    if (c >= n) return;
    const int r0 = blockIdx.y * DW_ROWS, r1 = min(rows, r0 + DW_ROWS);
    float s = 0;
    for (int r = r0; r < r1; r++) s += dy[(size_t)r * n + c] * x[(size_t)r * n + c] * rstd[r];
    partial[(size_t)blockIdx.y * n + c] = s;
}
__global__ void rmsnorm_dw_final(int chunks, int n, const float *partial, float *dw) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    float s = 0;
    for (int k = 0; k < chunks; k++) s += partial[(size_t)k * n + c];
    dw[c] += s;
}

static void cu_rmsnorm_bwd(ds_train_dev *dv, int rows, int n, const float *x, const float *w, const float *rstd,
                           const float *dy, float *dx, bool add_dx, float *dw) {
    cu_dev *d = CU(dv);
    if (d->failed || rows <= 0 || n <= 0) return;
    if (n <= NORM_WARP_MAX)
        rmsnorm_dx_kernel<true><<<(rows + NORM_THREADS / 32 - 1) / (NORM_THREADS / 32), NORM_THREADS>>>(
            rows, n, x, w, rstd, dy, dx, add_dx);
    else
        rmsnorm_dx_kernel<false><<<rows, NORM_THREADS>>>(rows, n, x, w, rstd, dy, dx, add_dx);
    if (!launched(d, "rmsnorm_bwd (dx)")) return;
    const int chunks = (rows + DW_ROWS - 1) / DW_ROWS;
    if (chunks > 65535) {
        fail(d, "rmsnorm_bwd", "%d rows: more than %d", rows, 65535 * DW_ROWS);
        return;
    }
    float *part = (float *)scratch(d, "rmsnorm_bwd", (size_t)chunks * n * sizeof(float));
    if (!part) return;
    rmsnorm_dw_partial<<<dim3((n + DW_COLS - 1) / DW_COLS, chunks), DW_COLS>>>(rows, n, x, rstd, dy, part);
    rmsnorm_dw_final<<<(n + 127) / 128, 128>>>(chunks, n, part, dw);
    launched(d, "rmsnorm_bwd (dw)");
}

/* ---- RoPE ---- */

__global__ void rope_kernel(int rows, int heads, int hd, const int32_t *pos, const float *inv_freq, float *x,
                            bool inverse) {
    const int half = hd / 2;
    const size_t n = (size_t)rows * half;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) {
        const size_t r = k / half;
        const int i = (int)(k % half);
        const float ang = (float)pos[r] * inv_freq[i];
        const float c = cosf(ang), s = inverse ? -sinf(ang) : sinf(ang);
        for (int h = 0; h < heads; h++) {
            float *v = x + r * heads * hd + (size_t)h * hd;
            const float a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

static void cu_rope(ds_train_dev *dv, int rows, int heads, int head_dim, const int32_t *pos, const float *inv_freq,
                    float *x, bool inverse) {
    cu_dev *d = CU(dv);
    if (d->failed || rows <= 0 || heads <= 0 || head_dim < 2) return;
    const size_t n = (size_t)rows * (head_dim / 2);
    rope_kernel<<<grid_for(n, 128), 128>>>(rows, heads, head_dim, pos, inv_freq, x, inverse);
    launched(d, "rope");
}

/* ---- the training attention ----
 *
 * Keys come in tiles of KT = 32 through shared memory, a row of head_dim floats padded to DP = NC*32 + 4
 * (NC = ceil(head_dim / 32); the padding columns are zeros): a lane reading its own key row with 16-byte
 * loads then hits distinct banks (DP = 4 mod 32), and lanes reading consecutive columns of one row do too.
 *
 * Forward and dq: a thread block per (block, head), a warp per ATT_R query rows; for each key tile a lane
 * scores one key against its warp's rows, the warp updates the rows' online softmax, and lane l accumulates
 * output columns l, l+32, ... Backward dK / dV: a thread block per (tile of a sequence's context keys, or a
 * block's own gamma keys) x KV head, looping over the blocks that see those keys (in block order) and their
 * query rows (head-major, as the CPU), so no two blocks write one key row: no atomics. */
#define KT 32
#define ATT_R 4 /* query rows a warp */
#define ATT_RC 32 /* query rows a backward chunk */
#define DKV_THREADS 256

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

/* The row of key k of block b (its na context keys, then its own rows); *ctx: a context row. */
__device__ __forceinline__ int64_t key_row(int64_t ctx0, int b, int g, int na, int k, bool *ctx) {
    *ctx = k < na;
    return k < na ? ctx0 + k : (int64_t)b * g + (k - na);
}

/* Fills n_rows_tile rows of s (stride DP) from the row pointers at(j), j < n: zeros past n and past D. */
template <int NC, typename F>
__device__ __forceinline__ void load_tile(float *s, int n_rows_tile, int n, int D, F at) {
    constexpr int W = NC * 32;
    for (int idx = threadIdx.x; idx < n_rows_tile * W; idx += blockDim.x) {
        const int j = idx / W, c = idx % W;
        s[j * (W + 4) + c] = j < n && c < D ? at(j)[c] : 0.0f;
    }
}

template <int NC>
__global__ void __launch_bounds__(256) attn_fwd_kernel(ds_train_attn a, const float *q, const float *kc,
                                                       const float *vc, const float *kb, const float *vb, float *out,
                                                       float *lse) {
    constexpr int W = NC * 32, DP = W + 4;
    extern __shared__ float4 smem4[];
    float *smem = (float *)smem4;
    const int b = blockIdx.x, h = blockIdx.y;
    const int H = a.n_heads, D = a.head_dim, g = a.gamma, kvh = h / (H / a.n_kv_heads), kvd = a.n_kv_heads * D;
    const int nw = blockDim.x / 32, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *Qs = smem, *Ks = Qs + nw * ATT_R * DP, *Vs = Ks + KT * DP;
    const int64_t ctx0 = a.ctx_start[a.seq[b]];
    const int na = a.anchor[b], nk = na + g;
    load_tile<NC>(Qs, nw * ATT_R, g, D, [&](int r) { return q + ((int64_t)b * g + r) * H * D + (int64_t)h * D; });
    float m[ATT_R], l[ATT_R], o[ATT_R][NC];
    for (int r = 0; r < ATT_R; r++) {
        m[r] = -INFINITY, l[r] = 0;
        for (int c = 0; c < NC; c++) o[r][c] = 0;
    }
    for (int t0 = 0; t0 < nk; t0 += KT) {
        __syncthreads(); /* the previous tile is read */
        const int nj = min(KT, nk - t0);
        auto krow = [&](int j, const float *ctxm, const float *blkm) {
            bool in_ctx;
            const int64_t row = key_row(ctx0, b, g, na, t0 + j, &in_ctx);
            return (in_ctx ? ctxm : blkm) + row * kvd + (int64_t)kvh * D;
        };
        load_tile<NC>(Ks, KT, nj, D, [&](int j) { return krow(j, kc, kb); });
        load_tile<NC>(Vs, KT, nj, D, [&](int j) { return krow(j, vc, vb); });
        __syncthreads();
        float s[ATT_R];
        for (int r = 0; r < ATT_R; r++) s[r] = 0;
        const float *kr = Ks + lane * DP;
        for (int c = 0; c < W; c += 4) {
            const float4 k4 = *(const float4 *)(kr + c);
            for (int r = 0; r < ATT_R; r++) s[r] += dot4(*(const float4 *)(Qs + (w * ATT_R + r) * DP + c), k4);
        }
        const bool valid = lane < nj;
        float p[ATT_R];
        for (int r = 0; r < ATT_R; r++) {
            const float sc = valid ? s[r] * a.scale : -INFINITY;
            const float mn = fmaxf(m[r], warp_max(sc)); /* finite: lane 0's key is valid */
            const float corr = expf(m[r] - mn);        /* 0 on the first tile */
            p[r] = valid ? expf(sc - mn) : 0.0f;
            l[r] = l[r] * corr + warp_sum(p[r]);
            m[r] = mn;
            for (int c = 0; c < NC; c++) o[r][c] *= corr;
        }
        for (int j = 0; j < nj; j++) {
            float pj[ATT_R];
            for (int r = 0; r < ATT_R; r++) pj[r] = __shfl_sync(0xffffffffu, p[r], j);
            for (int c = 0; c < NC; c++) {
                const float v = Vs[j * DP + lane + 32 * c];
                for (int r = 0; r < ATT_R; r++) o[r][c] += pj[r] * v;
            }
        }
    }
    for (int r = 0; r < ATT_R; r++) {
        const int rr = w * ATT_R + r;
        if (rr >= g) break;
        const int64_t row = (int64_t)b * g + rr;
        const float inv = 1.0f / l[r];
        for (int c = 0; c < NC; c++)
            if (lane + 32 * c < D) out[row * H * D + (int64_t)h * D + lane + 32 * c] = o[r][c] * inv;
        if (lane == 0) lse[row * H + h] = m[r] + logf(l[r]);
    }
}

/* Dd[row, h] = dout . out (the softmax backward's row term). A warp per (row, head). */
__global__ void attn_dd_kernel(int n, int D, const float *dout, const float *out, float *Dd) {
    const int64_t k = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (k >= n) return;
    const int lane = threadIdx.x & 31;
    float s = 0;
    for (int i = lane; i < D; i += 32) s += dout[k * D + i] * out[k * D + i];
    s = warp_sum(s);
    if (lane == 0) Dd[k] = s;
}

/* dq, as the forward: per key, p = exp(s*scale - lse), ds = p * (dout.v - Dd) * scale, dq += ds * k. */
template <int NC>
__global__ void __launch_bounds__(256) attn_dq_kernel(ds_train_attn a, const float *q, const float *kc,
                                                      const float *vc, const float *kb, const float *vb,
                                                      const float *lse, const float *dout, const float *Dd,
                                                      float *dq) {
    constexpr int W = NC * 32, DP = W + 4;
    extern __shared__ float4 smem4[];
    float *smem = (float *)smem4;
    const int b = blockIdx.x, h = blockIdx.y;
    const int H = a.n_heads, D = a.head_dim, g = a.gamma, kvh = h / (H / a.n_kv_heads), kvd = a.n_kv_heads * D;
    const int nw = blockDim.x / 32, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *Qs = smem, *Gs = Qs + nw * ATT_R * DP, *Ks = Gs + nw * ATT_R * DP, *Vs = Ks + KT * DP;
    const int64_t ctx0 = a.ctx_start[a.seq[b]];
    const int na = a.anchor[b], nk = na + g;
    load_tile<NC>(Qs, nw * ATT_R, g, D, [&](int r) { return q + ((int64_t)b * g + r) * H * D + (int64_t)h * D; });
    load_tile<NC>(Gs, nw * ATT_R, g, D, [&](int r) { return dout + ((int64_t)b * g + r) * H * D + (int64_t)h * D; });
    float L[ATT_R], Dr[ATT_R], acc[ATT_R][NC];
    for (int r = 0; r < ATT_R; r++) {
        const int rr = min(w * ATT_R + r, g - 1); /* rows past g: any valid row's numbers, never written */
        L[r] = lse[((int64_t)b * g + rr) * H + h], Dr[r] = Dd[((int64_t)b * g + rr) * H + h];
        for (int c = 0; c < NC; c++) acc[r][c] = 0;
    }
    for (int t0 = 0; t0 < nk; t0 += KT) {
        __syncthreads();
        const int nj = min(KT, nk - t0);
        auto krow = [&](int j, const float *ctxm, const float *blkm) {
            bool in_ctx;
            const int64_t row = key_row(ctx0, b, g, na, t0 + j, &in_ctx);
            return (in_ctx ? ctxm : blkm) + row * kvd + (int64_t)kvh * D;
        };
        load_tile<NC>(Ks, KT, nj, D, [&](int j) { return krow(j, kc, kb); });
        load_tile<NC>(Vs, KT, nj, D, [&](int j) { return krow(j, vc, vb); });
        __syncthreads();
        float s[ATT_R], gv[ATT_R];
        for (int r = 0; r < ATT_R; r++) s[r] = gv[r] = 0;
        const float *kr = Ks + lane * DP, *vr = Vs + lane * DP;
        for (int c = 0; c < W; c += 4) {
            const float4 k4 = *(const float4 *)(kr + c), v4 = *(const float4 *)(vr + c);
            for (int r = 0; r < ATT_R; r++) {
                s[r] += dot4(*(const float4 *)(Qs + (w * ATT_R + r) * DP + c), k4);
                gv[r] += dot4(*(const float4 *)(Gs + (w * ATT_R + r) * DP + c), v4);
            }
        }
        float ds[ATT_R];
        for (int r = 0; r < ATT_R; r++) {
            const float p = lane < nj ? expf(s[r] * a.scale - L[r]) : 0.0f;
            ds[r] = p * (gv[r] - Dr[r]) * a.scale;
        }
        for (int j = 0; j < nj; j++) {
            float dj[ATT_R];
            for (int r = 0; r < ATT_R; r++) dj[r] = __shfl_sync(0xffffffffu, ds[r], j);
            for (int c = 0; c < NC; c++) {
                const float k = Ks[j * DP + lane + 32 * c];
                for (int r = 0; r < ATT_R; r++) acc[r][c] += dj[r] * k;
            }
        }
    }
    for (int r = 0; r < ATT_R; r++) {
        const int rr = w * ATT_R + r;
        if (rr >= g) break;
        const int64_t row = (int64_t)b * g + rr;
        for (int c = 0; c < NC; c++)
            if (lane + 32 * c < D) dq[row * H * D + (int64_t)h * D + lane + 32 * c] = acc[r][c];
    }
}

/* dK, dV of one key tile (blockIdx.x < ctx_tasks: a tile of a sequence's context keys, else block
 * blockIdx.x - ctx_tasks's own keys) for KV head blockIdx.y. Thread t accumulates key t / 8's columns
 * (t % 8) * 4 + 32 i + e. */
template <int NC>
__global__ void __launch_bounds__(DKV_THREADS) attn_dkv_kernel(ds_train_attn a, int ctx_tasks, const float *q,
                                                               const float *kc, const float *vc, const float *kb,
                                                               const float *vb, const float *lse, const float *dout,
                                                               const float *Dd, float *dkc, float *dvc, float *dkb,
                                                               float *dvb) {
    constexpr int W = NC * 32, DP = W + 4, PS = KT + 1;
    extern __shared__ float4 smem4[];
    float *smem = (float *)smem4;
    float *Ks = smem, *Vs = Ks + KT * DP, *Qc = Vs + KT * DP, *Gc = Qc + ATT_RC * DP;
    float *P = Gc + ATT_RC * DP, *S = P + ATT_RC * PS, *Lc = S + ATT_RC * PS, *Dc = Lc + ATT_RC;
    __shared__ int task_seq, task_tile;
    const int H = a.n_heads, KV = a.n_kv_heads, D = a.head_dim, g = a.gamma, rep = H / KV, kvd = KV * D;
    const int kvh = blockIdx.y, t = threadIdx.x, lane = t & 31, w = t >> 5;
    const bool ctx = (int)blockIdx.x < ctx_tasks;
    int seq = -1, key0 = 0, nkeys, b_first, b_end;
    int64_t row0; /* the tile's first key row (context or block rows) */
    if (ctx) {
        if (t == 0) { /* tile blockIdx.x of the sequences' tiles, in sequence order */
            int k = blockIdx.x, s = 0;
            for (; s < a.n_seqs; s++) {
                const int nt = (a.ctx_start[s + 1] - a.ctx_start[s] + KT - 1) / KT;
                if (k < nt) break;
                k -= nt;
            }
            task_seq = s, task_tile = k;
        }
        __syncthreads();
        if (task_seq >= a.n_seqs) return; /* past the last tile (the grid is an upper bound) */
        seq = task_seq, key0 = task_tile * KT;
        nkeys = min(KT, a.ctx_start[seq + 1] - a.ctx_start[seq] - key0);
        row0 = (int64_t)a.ctx_start[seq] + key0;
        b_first = 0, b_end = a.n_blocks;
    } else {
        b_first = blockIdx.x - ctx_tasks, b_end = b_first + 1;
        nkeys = g;
        row0 = (int64_t)b_first * g;
    }
    const float *km = ctx ? kc : kb, *vm = ctx ? vc : vb;
    load_tile<NC>(Ks, KT, nkeys, D, [&](int j) { return km + (row0 + j) * kvd + (int64_t)kvh * D; });
    load_tile<NC>(Vs, KT, nkeys, D, [&](int j) { return vm + (row0 + j) * kvd + (int64_t)kvh * D; });
    const int kj = t >> 3, cg = (t & 7) * 4; /* this thread's key and first column */
    float dk[NC][4], dv[NC][4];
    for (int i = 0; i < NC; i++)
        for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0;
    const int nrows = rep * g;
    for (int b = b_first; b < b_end; b++) {
        if (ctx && (a.seq[b] != seq || a.anchor[b] <= key0)) continue; /* the same for every thread */
        const int nvis = ctx ? min(nkeys, a.anchor[b] - key0) : nkeys; /* keys j < nvis are seen by b */
        for (int r0 = 0; r0 < nrows; r0 += ATT_RC) {
            const int nr = min(ATT_RC, nrows - r0);
            __syncthreads(); /* the previous chunk is read (and the key tile loaded) */
            /* chunk row rr: head kvh*rep + (r0+rr)/g, block row (r0+rr)%g: heads outer, rows inner (CPU order) */
            auto qrow = [&](const float *m, int rr) {
                const int hh = (r0 + rr) / g, r = (r0 + rr) % g;
                return m + ((int64_t)b * g + r) * H * D + (int64_t)(kvh * rep + hh) * D;
            };
            load_tile<NC>(Qc, ATT_RC, nr, D, [&](int rr) { return qrow(q, rr); });
            load_tile<NC>(Gc, ATT_RC, nr, D, [&](int rr) { return qrow(dout, rr); });
            if (t < nr) {
                const int hh = (r0 + t) / g, r = (r0 + t) % g;
                const int64_t k = ((int64_t)b * g + r) * H + kvh * rep + hh;
                Lc[t] = lse[k], Dc[t] = Dd[k];
            }
            __syncthreads();
            /* P and dS for (row, key): lane = key, warp w = rows w, w+8, w+16, w+24 */
            {
                const float *kr = Ks + lane * DP, *vr = Vs + lane * DP;
                float s[ATT_RC / 8], gv[ATT_RC / 8];
                for (int i = 0; i < ATT_RC / 8; i++) s[i] = gv[i] = 0;
                for (int c = 0; c < W; c += 4) {
                    const float4 k4 = *(const float4 *)(kr + c), v4 = *(const float4 *)(vr + c);
                    for (int i = 0; i < ATT_RC / 8; i++) {
                        s[i] += dot4(*(const float4 *)(Qc + (w + 8 * i) * DP + c), k4);
                        gv[i] += dot4(*(const float4 *)(Gc + (w + 8 * i) * DP + c), v4);
                    }
                }
                for (int i = 0; i < ATT_RC / 8; i++) {
                    const int rr = w + 8 * i;
                    const bool live = rr < nr && lane < nvis;
                    const float p = live ? expf(s[i] * a.scale - Lc[rr]) : 0.0f;
                    P[rr * PS + lane] = p;
                    S[rr * PS + lane] = live ? p * (gv[i] - Dc[rr]) * a.scale : 0.0f;
                }
            }
            __syncthreads();
            for (int rr = 0; rr < nr; rr++) {
                const float p = P[rr * PS + kj], ds = S[rr * PS + kj];
                for (int i = 0; i < NC; i++) {
                    const float4 q4 = *(const float4 *)(Qc + rr * DP + cg + 32 * i);
                    const float4 g4 = *(const float4 *)(Gc + rr * DP + cg + 32 * i);
                    dk[i][0] += ds * q4.x, dk[i][1] += ds * q4.y, dk[i][2] += ds * q4.z, dk[i][3] += ds * q4.w;
                    dv[i][0] += p * g4.x, dv[i][1] += p * g4.y, dv[i][2] += p * g4.z, dv[i][3] += p * g4.w;
                }
            }
        }
    }
    if (kj >= nkeys) return;
    float *dkm = ctx ? dkc : dkb, *dvm = ctx ? dvc : dvb;
    const int64_t base = (row0 + kj) * kvd + (int64_t)kvh * D;
    for (int i = 0; i < NC; i++)
        for (int e = 0; e < 4; e++) {
            const int c = cg + 32 * i + e;
            if (c < D) dkm[base + c] = dk[i][e], dvm[base + c] = dv[i][e];
        }
}

/* Shared memory of each attention kernel (bytes), for nw warps (forward, dq). */
static size_t fwd_smem(int NC, int nw) { return (size_t)(nw * ATT_R + 2 * KT) * (NC * 32 + 4) * sizeof(float); }
static size_t dq_smem(int NC, int nw) { return (size_t)(2 * nw * ATT_R + 2 * KT) * (NC * 32 + 4) * sizeof(float); }
static size_t dkv_smem(int NC) {
    return ((size_t)(2 * KT + 2 * ATT_RC) * (NC * 32 + 4) + 2 * ATT_RC * (KT + 1) + 2 * ATT_RC) * sizeof(float);
}

/* Launches kernel with `smem` bytes of dynamic shared memory, opting into more than 48 KiB where needed. */
template <typename K, typename... A>
static void launch_smem(cu_dev *d, const char *op, K kernel, dim3 grid, dim3 block, size_t smem, A... args) {
    if (smem > (size_t)d->smem_optin) {
        fail(d, op, "needs %zu bytes of shared memory a block, the GPU allows %d", smem, d->smem_optin);
        return;
    }
    if (smem > 48 * 1024 &&
        !ok(d, op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)))
        return;
    kernel<<<grid, block, smem>>>(args...);
    launched(d, op);
}

static bool attn_shape_ok(cu_dev *d, const char *op, const ds_train_attn *a) {
    if (a->head_dim < 1 || a->head_dim > 256 || a->gamma < 1 || a->gamma > 32 || a->n_kv_heads < 1 ||
        a->n_heads % a->n_kv_heads) {
        fail(d, op, "head_dim %d (1..256), gamma %d (1..32), %d heads over %d KV heads: not supported", a->head_dim,
             a->gamma, a->n_heads, a->n_kv_heads);
        return false;
    }
    return true;
}

#define NC_SWITCH(NCV, CALL)                                                                                  \
    switch (NCV) {                                                                                            \
    case 1: { constexpr int NC = 1; CALL; } break;                                                             \
    case 2: { constexpr int NC = 2; CALL; } break;                                                             \
    case 3: { constexpr int NC = 3; CALL; } break;                                                             \
    case 4: { constexpr int NC = 4; CALL; } break;                                                             \
    case 5: { constexpr int NC = 5; CALL; } break;                                                             \
    case 6: { constexpr int NC = 6; CALL; } break;                                                             \
    case 7: { constexpr int NC = 7; CALL; } break;                                                             \
    default: { constexpr int NC = 8; CALL; } break;                                                            \
    }

static void cu_attn(ds_train_dev *dv, const ds_train_attn *a, const float *q, const float *kc, const float *vc,
                    const float *kb, const float *vb, float *out, float *lse) {
    cu_dev *d = CU(dv);
    if (d->failed || a->n_blocks <= 0 || a->n_heads <= 0 || !attn_shape_ok(d, "attn", a)) return;
    const int nc = (a->head_dim + 31) / 32, nw = (a->gamma + ATT_R - 1) / ATT_R;
    const dim3 grid(a->n_blocks, a->n_heads);
    NC_SWITCH(nc, launch_smem(d, "attn", attn_fwd_kernel<NC>, grid, dim3(nw * 32), fwd_smem(NC, nw), *a, q, kc, vc,
                              kb, vb, out, lse));
}

static void cu_attn_bwd(ds_train_dev *dv, const ds_train_attn *a, const float *q, const float *kc, const float *vc,
                        const float *kb, const float *vb, const float *out, const float *lse, const float *dout,
                        float *dq, float *dkc, float *dvc, float *dkb, float *dvb) {
    cu_dev *d = CU(dv);
    if (d->failed || a->n_blocks <= 0 || a->n_heads <= 0 || !attn_shape_ok(d, "attn_bwd", a)) return;
    const size_t kvd = (size_t)a->n_kv_heads * a->head_dim;
    const size_t n_ctx = (size_t)a->n_ctx, n_blk = (size_t)a->n_blocks * a->gamma;
    /* every key row a tile covers is written below; rows no sequence holds stay zero */
    if (n_ctx && (!ok(d, "attn_bwd", cudaMemsetAsync(dkc, 0, n_ctx * kvd * sizeof(float), 0)) ||
                  !ok(d, "attn_bwd", cudaMemsetAsync(dvc, 0, n_ctx * kvd * sizeof(float), 0))))
        return;
    if (!ok(d, "attn_bwd", cudaMemsetAsync(dkb, 0, n_blk * kvd * sizeof(float), 0)) ||
        !ok(d, "attn_bwd", cudaMemsetAsync(dvb, 0, n_blk * kvd * sizeof(float), 0)))
        return;
    const int n_rows_heads = (int)(n_blk * a->n_heads);
    float *Dd = (float *)scratch(d, "attn_bwd", (size_t)n_rows_heads * sizeof(float));
    if (!Dd) return;
    attn_dd_kernel<<<(n_rows_heads + 7) / 8, 256>>>(n_rows_heads, a->head_dim, dout, out, Dd);
    if (!launched(d, "attn_bwd (row terms)")) return;
    const int nc = (a->head_dim + 31) / 32, nw = (a->gamma + ATT_R - 1) / ATT_R;
    NC_SWITCH(nc, launch_smem(d, "attn_bwd (dq)", attn_dq_kernel<NC>, dim3(a->n_blocks, a->n_heads), dim3(nw * 32),
                              dq_smem(NC, nw), *a, q, kc, vc, kb, vb, lse, dout, (const float *)Dd, dq));
    if (d->failed) return;
    /* at most n_ctx / KT + n_seqs tiles of context keys (a sequence's last tile may be partial) */
    const int ctx_tasks = a->n_ctx / KT + a->n_seqs;
    const dim3 grid(ctx_tasks + a->n_blocks, a->n_kv_heads);
    NC_SWITCH(nc, launch_smem(d, "attn_bwd (dk, dv)", attn_dkv_kernel<NC>, grid, dim3(DKV_THREADS), dkv_smem(NC),
                              *a, ctx_tasks, q, kc, vc, kb, vb, lse, dout, (const float *)Dd, dkc, dvc, dkb, dvb));
}

/* ---- SwiGLU ---- */

__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void swiglu_kernel(size_t n, const float *gate, const float *up, float *m) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        m[i] = gate[i] * sigm(gate[i]) * up[i];
}

__global__ void swiglu_bwd_kernel(size_t n, const float *gate, const float *up, const float *dm, float *dgate,
                                  float *dup) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float x = gate[i], s = sigm(x), si = x * s, gr = dm[i], u = up[i];
        dgate[i] = gr * u * s * (1.0f + x * (1.0f - s));
        dup[i] = gr * si;
    }
}

static void cu_swiglu(ds_train_dev *dv, size_t n, const float *gate, const float *up, float *m) {
    cu_dev *d = CU(dv);
    if (d->failed || !n) return;
    swiglu_kernel<<<grid_for(n, 256), 256>>>(n, gate, up, m);
    launched(d, "swiglu");
}

static void cu_swiglu_bwd(ds_train_dev *dv, size_t n, const float *gate, const float *up, const float *dm,
                          float *dgate, float *dup) {
    cu_dev *d = CU(dv);
    if (d->failed || !n) return;
    swiglu_bwd_kernel<<<grid_for(n, 256), 256>>>(n, gate, up, dm, dgate, dup);
    launched(d, "swiglu_bwd");
}

/* ---- the DSpark loss: a block per row ----
 * Three passes over the row's draft and target logits: their softmax statistics (online max and sum, one
 * read of each), the L1 distance and sum(pd * sign(pd - pt)), and the gradient written over the draft.
 * Probabilities are recomputed from the logits in each pass (the same expression: the same bits). Per-row
 * terms go to acc[3][rows] as doubles; the host adds them in row order. */
template <bool VEC>
__device__ __forceinline__ void row_load(const float *p, int i, float v[4]) {
    if (VEC) {
        const float4 x = ((const float4 *)p)[i];
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else {
        v[0] = p[i];
    }
}

template <bool VEC>
__global__ void __launch_bounds__(1024) loss_kernel(int rows, int V, float *draft, float *target, const float *conf,
                                                    const int32_t *labels, const float *wt, float cce, float cl1,
                                                    float cconf, float *dconf, double *acc) {
    __shared__ float sh_a[32], sh_b[32];
    constexpr int E = VEC ? 4 : 1; /* elements a load */
    const int r = blockIdx.x, t = threadIdx.x, n = V / E;
    float *pd = draft + (size_t)r * V, *pt = target + (size_t)r * V;
    const float w = wt[r];
    if (w == 0) { /* no weight: no loss, no gradient */
        for (int v = t; v < V; v += blockDim.x) pd[v] = 0;
        if (t == 0) dconf[r] = 0, acc[r] = acc[rows + r] = acc[2 * rows + r] = 0;
        return;
    }
    const int lab = labels[r];
    const float zl = pd[lab]; /* read before any thread writes the row (after the reductions' barriers) */
    float md = -INFINITY, sd = 0, mt = -INFINITY, st = 0;
    for (int i = t; i < n; i += blockDim.x) {
        float z[4], y[4];
        row_load<VEC>(pd, i, z);
        row_load<VEC>(pt, i, y);
        for (int e = 0; e < E; e++) online_add(md, sd, z[e]), online_add(mt, st, y[e]);
    }
    block_online(md, sd, sh_a, sh_b);
    block_online(mt, st, sh_a, sh_b);
    const float lse = md + logf(sd), inv_d = 1.0f / sd, inv_t = 1.0f / st;
    float l1 = 0, sdot = 0;
    for (int i = t; i < n; i += blockDim.x) {
        float z[4], y[4];
        row_load<VEC>(pd, i, z);
        row_load<VEC>(pt, i, y);
        for (int e = 0; e < E; e++) {
            const float a = expf(z[e] - md) * inv_d, df = a - expf(y[e] - mt) * inv_t;
            l1 += fabsf(df);
            sdot += a * (float)((df > 0) - (df < 0));
        }
    }
    l1 = block_sum(l1, sh_a);
    sdot = block_sum(sdot, sh_b);
    if (t == 0) {
        const float c = conf[r];
        float cstar = 1.0f - 0.5f * l1;
        cstar = cstar < 0 ? 0 : cstar > 1 ? 1 : cstar;
        const float bce = fmaxf(c, 0) - c * cstar + log1pf(expf(-fabsf(c)));
        acc[r] = (double)w * (lse - zl);
        acc[rows + r] = (double)w * l1;
        acc[2 * rows + r] = (double)w * bce;
        dconf[r] = w * cconf * (sigm(c) - cstar);
    }
    /* d/dz: ce -> pd - onehot; l1 -> pd * (sign - sdot); bce (c* detached) -> only the confidence. */
    const float ace = w * cce, al1 = w * cl1;
    for (int i = t; i < n; i += blockDim.x) {
        float z[4], y[4], gr[4];
        row_load<VEC>(pd, i, z);
        row_load<VEC>(pt, i, y);
        for (int e = 0; e < E; e++) {
            const float a = expf(z[e] - md) * inv_d, df = a - expf(y[e] - mt) * inv_t;
            const float sg = (float)((df > 0) - (df < 0));
            gr[e] = ace * a + al1 * a * (sg - sdot);
            if (i * E + e == lab) gr[e] -= ace;
        }
        if (VEC) ((float4 *)pd)[i] = make_float4(gr[0], gr[1], gr[2], gr[3]);
        else pd[i] = gr[0];
    }
}

static void cu_dspark_loss(ds_train_dev *dv, int rows, int vocab, float *draft, float *target, const float *conf,
                           const int32_t *labels, const float *w, float coef_ce, float coef_l1, float coef_conf,
                           float *dconf, ds_train_terms *terms) {
    cu_dev *d = CU(dv);
    if (rows <= 0 || vocab <= 0) return;
    if (d->failed) {
        terms->ce = terms->l1 = terms->conf = NAN;
        return;
    }
    double *acc = (double *)scratch(d, "dspark_loss", (size_t)rows * 3 * sizeof(double));
    double *host = (double *)malloc((size_t)rows * 3 * sizeof(double));
    if (!acc || !host) {
        if (!host) fail(d, "dspark_loss", "out of host memory for %d rows' terms", rows);
        free(host);
        terms->ce = terms->l1 = terms->conf = NAN;
        return;
    }
    const bool vec = vocab % 4 == 0 && ((uintptr_t)draft | (uintptr_t)target) % 16 == 0;
    const int threads = vocab >= 32768 ? 1024 : 256;
    if (vec)
        loss_kernel<true><<<rows, threads>>>(rows, vocab, draft, target, conf, labels, w, coef_ce, coef_l1, coef_conf,
                                             dconf, acc);
    else
        loss_kernel<false><<<rows, threads>>>(rows, vocab, draft, target, conf, labels, w, coef_ce, coef_l1,
                                              coef_conf, dconf, acc);
    if (launched(d, "dspark_loss"))
        ok(d, "dspark_loss", cudaMemcpy(host, acc, (size_t)rows * 3 * sizeof(double), cudaMemcpyDeviceToHost));
    if (d->failed) {
        terms->ce = terms->l1 = terms->conf = NAN;
    } else {
        for (int r = 0; r < rows; r++) /* row order, as the CPU: the same sum every run */
            terms->ce += host[r], terms->l1 += host[rows + r], terms->conf += host[2 * rows + r];
    }
    free(host);
}

/* ---- sum of squares, AdamW ---- */

#define SUMSQ_THREADS 256
#define SUMSQ_MAX_BLOCKS 1024
__global__ void __launch_bounds__(SUMSQ_THREADS) sumsq_partial(size_t n, const float *x, double *part) {
    __shared__ double sh[32];
    double s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)x[i] * x[i];
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}
__global__ void __launch_bounds__(SUMSQ_THREADS) sumsq_final(int nb, double *part) {
    __shared__ double sh[32];
    double s = 0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) s += part[i];
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) part[nb] = s;
}

static double cu_sumsq(ds_train_dev *dv, size_t n, const float *x) {
    cu_dev *d = CU(dv);
    if (!n) return 0;
    if (d->failed) return NAN;
    /* the block count depends on n only: the same partial sums every run */
    const size_t want = (n + SUMSQ_THREADS * 8 - 1) / (SUMSQ_THREADS * 8);
    const int nb = (int)(want > SUMSQ_MAX_BLOCKS ? SUMSQ_MAX_BLOCKS : want);
    double *part = (double *)scratch(d, "sumsq", (size_t)(nb + 1) * sizeof(double));
    if (!part) return NAN;
    sumsq_partial<<<nb, SUMSQ_THREADS>>>(n, x, part);
    sumsq_final<<<1, SUMSQ_THREADS>>>(nb, part);
    double s = NAN;
    if (launched(d, "sumsq") && ok(d, "sumsq", cudaMemcpy(&s, part + nb, sizeof s, cudaMemcpyDeviceToHost))) return s;
    return NAN;
}

__global__ void adamw_kernel(size_t n, float *p, const float *g, float *m, float *v, float clip, float beta1,
                             float beta2, float eps, float step, float bc2s, float decay) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float gi = g[i] * clip;
        float pi = p[i] * decay, mi = m[i], vi = v[i];
        mi += (1.0f - beta1) * (gi - mi);
        vi = vi * beta2 + (1.0f - beta2) * gi * gi;
        pi -= step * mi / (sqrtf(vi) / bc2s + eps);
        p[i] = pi, m[i] = mi, v[i] = vi;
    }
}

static void cu_adamw(ds_train_dev *dv, size_t n, float *p, const float *g, float *m, float *v, float clip, float lr,
                     float beta1, float beta2, float eps, float wd, float bc1, float bc2) {
    cu_dev *d = CU(dv);
    if (d->failed || !n) return;
    /* the CPU's per-step constants, computed the same way on the host */
    const float step = lr / bc1, bc2s = sqrtf(bc2), decay = 1.0f - lr * wd;
    adamw_kernel<<<grid_for(n, 256), 256>>>(n, p, g, m, v, clip, beta1, beta2, eps, step, bc2s, decay);
    launched(d, "adamw");
}

static ds_error *cu_set_tf32(ds_train_dev *dev, bool on) {
    cu_dev *d = (cu_dev *)dev;
    if (cublasSetMathMode(d->blas, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS)
        return ds_errorf("cuda trainer: cannot set cuBLAS's math mode (TF32 %s)", on ? "on" : "off");
    return NULL;
}

static const ds_train_ops cuda_ops = {
    /* .name = */ "cuda",
    /* .logit_values = */ (int64_t)256 << 20, /* 1 GiB: chunks of hundreds to thousands of rows */
    /* .set_tf32 = */ cu_set_tf32,
    /* .destroy = */ cu_destroy,
    /* .alloc = */ cu_alloc,
    /* .free = */ cu_free,
    /* .upload = */ cu_upload,
    /* .download = */ cu_download,
    /* .zero = */ cu_zero,
    /* .gemm = */ cu_gemm,
    /* .axpy = */ cu_axpy,
    /* .gather = */ cu_gather,
    /* .scatter_add = */ cu_scatter_add,
    /* .rmsnorm = */ cu_rmsnorm,
    /* .rmsnorm_bwd = */ cu_rmsnorm_bwd,
    /* .rope = */ cu_rope,
    /* .attn = */ cu_attn,
    /* .attn_bwd = */ cu_attn_bwd,
    /* .swiglu = */ cu_swiglu,
    /* .swiglu_bwd = */ cu_swiglu_bwd,
    /* .dspark_loss = */ cu_dspark_loss,
    /* .sumsq = */ cu_sumsq,
    /* .adamw = */ cu_adamw,
};

extern "C" ds_error *ds_train_dev_cuda(int device, ds_train_dev **out) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return ds_errorf("cuda trainer: no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    }
    if (device < 0 || device >= n) return ds_errorf("cuda trainer: no CUDA device %d (%d present)", device, n);
    if ((e = cudaSetDevice(device)) != cudaSuccess)
        return ds_errorf("cuda trainer: cannot use device %d: %s", device, cudaGetErrorString(e));
    cu_dev *d = (cu_dev *)calloc(1, sizeof *d);
    if (!d) return ds_errorf("cuda trainer: out of memory");
    d->base.ops = &cuda_ops;
    d->device = device;
    if ((e = cudaDeviceGetAttribute(&d->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) != cudaSuccess) {
        free(d);
        return ds_errorf("cuda trainer: cannot read device %d's shared memory size: %s", device, cudaGetErrorString(e));
    }
    cublasStatus_t s = cublasCreate(&d->blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        free(d);
        return ds_errorf("cuda trainer: cannot start cuBLAS on device %d (status %d)", device, (int)s);
    }
    /* Plain fp32 products, no TF32: the step matches the CPU's and PyTorch's fp32 goldens. */
    if (cublasSetMathMode(d->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(d->blas, 0) != CUBLAS_STATUS_SUCCESS) {
        cu_destroy(&d->base);
        return ds_errorf("cuda trainer: cannot configure cuBLAS on device %d", device);
    }
    *out = &d->base;
    return NULL;
}
