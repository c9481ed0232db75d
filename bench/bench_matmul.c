/* The CPU backend's linear op at decode / verify / prefill shapes: GMAC/s
 * and weight GB/s per row count M, to see where the row-invariant kernels
 * stand against the machine.
 *
 *   bench_matmul [--threads N] [--n N] [--k K] [--bits 4|8 [--group G]]
 *
 * --bits: W affine-quantized (MLX's layout, bf16 scales and biases) from the
 * same bf16 values; GB/s then counts the bytes the kernel streams (codes,
 * plus fp32 scales and biases a group and 16 features). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "base/affine_quant.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    int threads = 2, N = 768, K = 256, bits = 0, group = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--bits")) bits = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--group")) group = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--n")) N = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--k")) K = atoi(argv[i + 1]);
    }
    ds_backend *be;
    ds_error *e = ds_backend_cpu_new(threads, &be);
    if (e) return 1;
    ds_tensor w, x, y;
    /* W comes in through weight(), as a checkpoint's tensors do (the backend
     * may keep a repacked copy of weights). */
    uint16_t *wd = malloc((size_t)N * K * sizeof *wd);
    for (int64_t i = 0; i < (int64_t)N * K; i++) wd[i] = ds_f32_to_bf16((float)((i * 7919) % 1000) / 1000.0f - 0.5f);
    ds_st_tensor src = {.name = "w", .dtype = DS_BF16, .ndim = 2, .shape = {N, K}, .data = wd,
                        .nbytes = (size_t)N * K * sizeof *wd};
    double wbytes = (double)N * K * 2;
    uint32_t *qw = NULL;
    uint16_t *qs = NULL, *qb = NULL;
    if (bits) {
        if (!ds_quant_bits_ok(bits) || !ds_quant_group_ok(group) || K % group) return 2;
        const int G = K / group;
        qw = malloc((size_t)N * K * bits / 8);
        qs = malloc((size_t)N * G * 2);
        qb = malloc((size_t)N * G * 2);
        float *row = malloc((size_t)K * sizeof *row);
        for (int64_t n = 0; n < N; n++) {
            ds_to_f32(DS_BF16, wd + n * K, row, (size_t)K);
            for (int g = 0; g < G; g++) {
                float sc, bi;
                ds_quant_group(row + g * group, group, bits, qw + (n * K + (int64_t)g * group) * bits / 32, &sc, &bi);
                qs[n * G + g] = ds_f32_to_bf16(sc);
                qb[n * G + g] = ds_f32_to_bf16(bi);
            }
        }
        free(row);
        ds_st_tensor tw = {.name = "w", .dtype = DS_U32, .ndim = 2, .shape = {N, K * bits / 32}, .data = qw,
                           .nbytes = (size_t)N * K * bits / 8};
        ds_st_tensor ts = {.name = "w.scales", .dtype = DS_BF16, .ndim = 2, .shape = {N, G}, .data = qs,
                           .nbytes = (size_t)N * G * 2};
        ds_st_tensor tb = ts;
        tb.name = "w.biases";
        tb.data = qb;
        ds_quant_src q = {.w = &tw, .scales = &ts, .biases = &tb, .bits = bits, .group = group};
        if (!be->ops->weight_quant || be->ops->weight_quant(be, &q, N, K, &w)) return 1;
        wbytes = (double)N * K * bits / 8 + (double)N * G * 8;
    } else if (be->ops->weight(be, &src, N, K, &w)) return 1;
    be->ops->alloc(be, DS_F32, 64, K, &x);
    be->ops->alloc(be, DS_F32, 64, N, &y);
    float *xd = x.data;
    for (int i = 0; i < 64 * K; i++) xd[i] = (float)(i % 97) / 97.0f;
    if (bits) printf("# linear y[M,%d] = x[M,%d] W^T, W int%d group %d (%.2f MB streamed), %d threads\n", N, K, bits, group,
                     wbytes / 1e6, threads);
    else printf("# linear y[M,%d] = x[M,%d] W^T, W bf16 (%.2f MB), %d threads\n", N, K, N * K * 2 / 1e6, threads);
    int ms[] = {1, 2, 4, 7, 8, 16, 32, 64};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        int M = ms[i];
        int iters = (int)(2e8 / ((double)M * N * K)) + 10;
        double best = 1e30;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = now_s();
            for (int it = 0; it < iters; it++) be->ops->linear(be, ds_rows(y, 0, M), ds_rows(x, 0, M), w, ds_no_tensor());
            double s = (now_s() - t0) / iters;
            if (s < best) best = s;
        }
        printf("M=%2d: %8.1f us  %6.1f GMAC/s  %6.1f GB/s of weights\n", M, best * 1e6, (double)M * N * K / best / 1e9,
               wbytes / best / 1e9);
    }
    be->ops->release(be, &w);
    be->ops->release(be, &x);
    be->ops->release(be, &y);
    be->ops->destroy(be);
    free(wd);
    free(qw);
    free(qs);
    free(qb);
    return 0;
}
