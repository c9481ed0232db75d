/* The CPU backend's linear op at decode / verify / prefill shapes: GMAC/s
 * and weight GB/s per row count M, to see where the row-invariant kernels
 * stand against the machine.
 *
 *   bench_matmul [--threads N] [--n N] [--k K] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    int threads = 2, N = 768, K = 256;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
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
    if (be->ops->weight(be, &src, N, K, &w)) return 1;
    be->ops->alloc(be, DS_F32, 64, K, &x);
    be->ops->alloc(be, DS_F32, 64, N, &y);
    float *xd = x.data;
    for (int i = 0; i < 64 * K; i++) xd[i] = (float)(i % 97) / 97.0f;
    printf("# linear y[M,%d] = x[M,%d] W^T, W bf16 (%.2f MB), %d threads\n", N, K, N * K * 2 / 1e6, threads);
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
               (double)N * K * 2 / best / 1e9);
    }
    be->ops->release(be, &w);
    be->ops->release(be, &x);
    be->ops->release(be, &y);
    be->ops->destroy(be);
    free(wd);
    return 0;
}
