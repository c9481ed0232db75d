/* cuBLAS alone at the Qwen3-8B projection shapes, per row count M: what the
 * batched engine's wide products could take from a different call pattern,
 * before changing it. Side by side, in one run on one card:
 *   sep     the projections as the engine calls them today: one GEMM a
 *           weight (q, k, v; gate, up), bf16 in, fp32 out;
 *   stack   one GEMM over the weights stacked in one buffer (N = 6144 for
 *           QKV, 24576 for gate/up), fp32 out;
 *   bf16o   the stacked GEMM writing bf16 (half the output bytes);
 * with o_proj (4096 x 4096) and down (4096 x 12288) on their own, and the
 * limits measured on the card: the copy bandwidth (device-to-device) and
 * cuBLAS's own bf16 rate on an 8192-cubed GEMM. Each call alternates two
 * copies of its weights so that L2 does not hold them. Reported, not checked.
 *
 *   ./build-cuda/bench/bench_cublas_shapes [--rows 1,8,16,32,64,128,256,512] [--reps R]
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                                                   \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                            \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)
#define CB(call)                                                                                                   \
    do {                                                                                                           \
        cublasStatus_t s_ = (call);                                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                         \
            fprintf(stderr, "%s:%d: cuBLAS status %d\n", __FILE__, __LINE__, (int)s_);                             \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

static cublasHandle_t blas;
static cudaStream_t stream;

__global__ void fill_kernel(__nv_bfloat16 *p, size_t n, unsigned seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15;
        p[i] = __float2bfloat16(((int)(h & 2047) - 1024) / 1024.0f);
    }
}

static __nv_bfloat16 *bf16_buf(size_t n, unsigned seed) {
    __nv_bfloat16 *p;
    CK(cudaMalloc(&p, n * 2));
    fill_kernel<<<1024, 256, 0, stream>>>(p, n, seed);
    CK(cudaGetLastError());
    return p;
}

/* out[M, N] (row-major, ldo) = x[M, K] w[N, K]^T: the engine's column-major view. */
static void gemm(const __nv_bfloat16 *w, int N, int K, const __nv_bfloat16 *x, int M, void *out, bool out_bf16,
                 int ldo) {
    const float one = 1.0f, zero = 0.0f;
    CB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w, CUDA_R_16BF, K, x, CUDA_R_16BF, K, &zero, out,
                    out_bf16 ? CUDA_R_16BF : CUDA_R_32F, ldo, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

typedef struct {
    int n[2];           /* the projections' output widths (one or two weights; QKV's k and v as one: same N) */
    int parts[2];       /* how many weights of that width */
    int K;
} shape;

/* us a call of `mode` (0 sep, 1 stack, 2 bf16o) at M rows: two weight sets in turn, `reps` calls. */
static double time_shape(const shape *s, __nv_bfloat16 *const w[2], const __nv_bfloat16 *x, void *out, int M,
                         int mode, int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    int ntot = 0;
    for (int i = 0; i < 2; i++) ntot += s->n[i] * s->parts[i];
    for (int r = -2; r < reps; r++) {
        if (r == 0) CK(cudaEventRecord(a, stream));
        const __nv_bfloat16 *wc = w[r & 1];
        if (mode == 0) {
            size_t off = 0;
            int col = 0;
            for (int i = 0; i < 2; i++)
                for (int p = 0; p < s->parts[i]; p++) {
                    gemm(wc + off, s->n[i], s->K, x, M, (float *)out + col, false, ntot);
                    off += (size_t)s->n[i] * s->K;
                    col += s->n[i];
                }
        } else {
            gemm(wc, ntot, s->K, x, M, out, mode == 2, ntot);
        }
    }
    CK(cudaEventRecord(b, stream));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return 1e3 * ms / reps;
}

static double copy_bandwidth(void) {
    const size_t bytes = (size_t)1 << 30;
    void *src, *dst;
    CK(cudaMalloc(&src, bytes));
    CK(cudaMalloc(&dst, bytes));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    double best = 0;
    for (int r = 0; r < 6; r++) {
        CK(cudaEventRecord(a, stream));
        CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
        CK(cudaEventRecord(b, stream));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        const double bw = 2.0 * (double)bytes / (ms * 1e-3);
        if (r > 0 && bw > best) best = bw; /* the first copy warms up */
    }
    cudaFree(src);
    cudaFree(dst);
    return best;
}

static double peak_tflops(void) {
    const int n = 8192;
    __nv_bfloat16 *w = bf16_buf((size_t)n * n, 1), *x = bf16_buf((size_t)n * n, 2), *o = bf16_buf((size_t)n * n, 3);
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    double best = 0;
    for (int r = 0; r < 8; r++) {
        CK(cudaEventRecord(a, stream));
        gemm(w, n, n, x, n, o, true, n);
        CK(cudaEventRecord(b, stream));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        const double t = 2.0 * n * (double)n * n / (ms * 1e-3) / 1e12;
        if (r > 1 && t > best) best = t;
    }
    cudaFree(w);
    cudaFree(x);
    cudaFree(o);
    return best;
}

int main(int argc, char **argv) {
    int rows[32], nrows = 0, reps = 50;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows")) {
            for (char *p = argv[i + 1]; *p && nrows < 32;) {
                rows[nrows++] = (int)strtol(p, &p, 10);
                if (*p == ',') p++;
            }
        } else if (!strcmp(argv[i], "--reps")) {
            reps = atoi(argv[i + 1]);
        } else {
            fprintf(stderr, "usage: %s [--rows 1,8,...] [--reps R]\n", argv[0]);
            return 2;
        }
    }
    if (!nrows) {
        const int def[] = {1, 8, 16, 24, 32, 48, 64, 128, 256, 512};
        for (int v : def) rows[nrows++] = v;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    CK(cudaStreamCreate(&stream));
    CB(cublasCreate(&blas));
    CB(cublasSetStream(blas, stream));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const double bw = copy_bandwidth(), peak = peak_tflops();
    printf("# %s: copy bandwidth %.3f TB/s, cuBLAS bf16 8192^3 %.1f TFLOP/s (the limits below)\n", prop.name,
           bw / 1e12, peak);
    const int H = 4096, F = 12288, KV = 1024, MAXM = 512;
    const shape shapes[4] = {{{H, KV}, {1, 2}, H}, {{F, 0}, {2, 0}, H}, {{H, 0}, {1, 0}, H}, {{H, 0}, {1, 0}, F}};
    const char *names[4] = {"qkv 4096+1024+1024 x 4096", "gate+up 2 x 12288 x 4096", "o_proj 4096 x 4096",
                            "down 4096 x 12288"};
    __nv_bfloat16 *x = bf16_buf((size_t)MAXM * F, 7);
    float *out;
    CK(cudaMalloc(&out, (size_t)MAXM * 2 * F * sizeof(float)));
    printf("%-26s %5s %9s %9s %9s  %8s %8s  (us a call; stack: %% of the limits)\n", "shape", "M", "sep", "stack",
           "bf16o", "%bw", "%peak");
    for (int si = 0; si < 4; si++) {
        const shape *s = &shapes[si];
        size_t wn = 0;
        for (int i = 0; i < 2; i++) wn += (size_t)s->n[i] * s->parts[i] * s->K;
        __nv_bfloat16 *w[2] = {bf16_buf(wn, 11 + si), bf16_buf(wn, 23 + si)};
        for (int mi = 0; mi < nrows; mi++) {
            const int M = rows[mi];
            if (M < 1 || M > MAXM) continue;
            const double sep = s->parts[0] + s->parts[1] > 1 ? time_shape(s, w, x, out, M, 0, reps) : 0;
            const double st = time_shape(s, w, x, out, M, 1, reps), b16 = time_shape(s, w, x, out, M, 2, reps);
            const double floor_us = (double)wn * 2 / bw * 1e6, flop_us = 2.0 * M * (double)wn / (peak * 1e12) * 1e6;
            char sep_s[16] = "-";
            if (sep > 0) snprintf(sep_s, sizeof sep_s, "%.1f", sep);
            printf("%-26s %5d %9s %9.1f %9.1f  %7.1f%% %7.1f%%\n", names[si], M, sep_s, st, b16,
                   100.0 * floor_us / st, 100.0 * flop_us / st);
        }
        cudaFree(w[0]);
        cudaFree(w[1]);
    }
    cudaFree(x);
    cudaFree(out);
    cublasDestroy(blas);
    return 0;
}
