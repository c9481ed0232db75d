/* The CUDA backend's ops timed on their own (moved out of the op tests:
 * tests assert numbers, benches time): narrow bf16 matmul bandwidth on a
 * weight much larger than L2, the Qwen3-8B decode projections as the model
 * calls them (fused ops, M = 1 and 8), and what a sampled verification
 * round and a sampled drafted block cost at Qwen3's vocabulary, and the
 * quantized (int4 / int8, group 64, bf16 scales) projections at the Qwen3-8B
 * shapes against the device's copy bandwidth. Reported, not checked;
 * `dspark bench` measures the whole engine.
 *
 *   bench_cuda_ops [--device N] [--test-config] [--batched [--rows M1,M2,...] [--inv 0|1] [--reps N]]
 *
 * --test-config: the thresholds the op tests lower (every shape through the
 * ring matmul however few its tiles, the fused norm + attention from one
 * row, packed attention however small the grid), as these numbers were
 * printed by test_cuda_ops before; without it the engine's config
 * (environment switches included). --batched: only the projections, at the
 * batched engine's row counts (8-512), with cfg.invariant off, then on, and
 * 16-32 rows again on the wide path (cfg.narrow_rows 8); --rows / --inv /
 * --reps narrow that to some row counts, one mode, N timed calls and no
 * warm-up (for a profiler: --reps 1 launches each projection once).
 * Exits 77 without a CUDA device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/spec_ops.h"
#include "backend/cuda/cuda_config.h"
#include "base/rng.h"

static ds_backend *gpu;
static ds_rng urng;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static void die_on(ds_error *e, const char *what) {
    if (!e) return;
    fprintf(stderr, "%s: %s\n", what, ds_error_message(e));
    ds_error_free(e);
    exit(1);
}

static void check_gpu_ok(const char *what) { die_on(ds_backend_check(gpu), what); }

/* A GPU activation [rows, cols], zeros or v. */
static ds_tensor act(int64_t rows, int64_t cols, const float *v) {
    ds_tensor t;
    die_on(gpu->ops->alloc(gpu, DS_F32, rows, cols, &t), "alloc");
    if (v) gpu->ops->upload(gpu, t, v);
    return t;
}

static ds_tensor act_rand(int64_t rows, int64_t cols, float scale) {
    const size_t n = (size_t)(rows * cols);
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
    ds_tensor t = act(rows, cols, v);
    free(v);
    return t;
}

/* A GPU-only bf16 weight [rows, cols] from the first rows x cols values of host. */
static ds_tensor bw_weight(const uint16_t *host, int64_t rows, int64_t cols) {
    ds_st_tensor st = {.name = "w", .dtype = DS_BF16, .ndim = 2, .shape = {rows, cols}, .data = host,
                       .nbytes = (size_t)(rows * cols) * 2};
    ds_tensor t = ds_no_tensor();
    die_on(gpu->ops->weight(gpu, &st, rows, cols, &t), "weight");
    return t;
}

/* A bf16 weight [rows, cols] of v's values rounded to bf16. */
static ds_tensor bf16_weight_of(const float *v, int64_t rows, int64_t cols) {
    uint16_t *b = malloc((size_t)(rows * cols) * 2);
    for (int64_t i = 0; i < rows * cols; i++) b[i] = ds_f32_to_bf16(v[i]);
    ds_tensor t = bw_weight(b, rows, cols);
    free(b);
    return t;
}

/* A random bf16 weight, multiples of 2^-10 in (-1, 1). */
static ds_tensor weight(int64_t rows, int64_t cols) {
    uint16_t *b = malloc((size_t)(rows * cols) * 2);
    for (int64_t i = 0; i < rows * cols; i++) b[i] = ds_f32_to_bf16((float)((int)(frand() * 1023.0f)) / 1024.0f);
    ds_tensor t = bw_weight(b, rows, cols);
    free(b);
    return t;
}

static void release(ds_tensor *t) { gpu->ops->release(gpu, t); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Narrow matmul bandwidth on a bf16 weight much larger than L2. */
static void linear_bandwidth(void) {
    const int64_t N = 16384, K = 8192; /* 256 MiB of bf16 */
    ds_tensor w[2] = {weight(N, K), weight(N, K)};
    ds_tensor x = act_rand(64, K, 1.0f), out = act(64, N, NULL);
    const int64_t Ms[] = {1, 4, 8, 16, 32, 64};
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
        const int64_t M = Ms[i];
        for (int r = 0; r < 2; r++) gpu->ops->linear(gpu, ds_rows(out, 0, M), ds_rows(x, 0, M), w[r], ds_no_tensor());
        check_gpu_ok("bandwidth warm-up");
        const int reps = 20;
        double t0 = now_s();
        for (int r = 0; r < reps; r++)
            gpu->ops->linear(gpu, ds_rows(out, 0, M), ds_rows(x, 0, M), w[r % 2], ds_no_tensor());
        check_gpu_ok("bandwidth");
        double dt = (now_s() - t0) / reps;
        printf("  linear bf16 %lldx%lld, M=%-2lld (%s): %7.1f us  %6.0f GB/s of weights  %6.1f TFLOP/s\n",
               (long long)N, (long long)K, (long long)M, M > 32 ? "cuBLAS" : "narrow", dt * 1e6,
               (double)(N * K * 2) / dt / 1e9, 2.0 * (double)(M * N * K) / dt / 1e12);
    }
    release(&w[0]);
    release(&w[1]);
    release(&x);
    release(&out);
}

/* The Qwen3-8B projections as the model calls them (fused ops, M rows each
 * of Ms: decode 1 and 8 by default; --batched the batched engine's row
 * counts, with cfg.invariant off and on), each alternating two copies of its
 * weights so that L2 (50 MB) does not hold them: where the in-model matmul
 * time goes, shape by shape, and the TFLOP/s the wide calls reach. */
static int bench_reps = 40, bench_warmup = 2;
static void model_shapes_bandwidth(const int64_t *Ms, int nm) {
    const int64_t H = 4096, F = 12288, KV = 1024;
    uint16_t *host = malloc((size_t)(F * H) * 2); /* random bf16, shared by every weight */
    for (int64_t i = 0; i < F * H; i++) host[i] = ds_f32_to_bf16((float)((int)(frand() * 1023.0f)) / 1024.0f);
    ds_tensor q[2], k[2], v[2], o[2], g[2], u[2], d[2];
    for (int c = 0; c < 2; c++) {
        q[c] = bw_weight(host, H, H), k[c] = bw_weight(host, KV, H), v[c] = bw_weight(host, KV, H);
        o[c] = bw_weight(host, H, H), g[c] = bw_weight(host, F, H), u[c] = bw_weight(host, F, H);
        d[c] = bw_weight(host, H, F);
        /* as the model loads them (qwen3_layer.c): QKV and gate/up joined, one GEMM each on the wide path */
        ds_tensor *const qkv[3] = {&q[c], &k[c], &v[c]}, *const gu[2] = {&g[c], &u[c]};
        die_on(gpu->ops->weights_join(gpu, 3, qkv), "join qkv");
        die_on(gpu->ops->weights_join(gpu, 2, gu), "join gate/up");
    }
    free(host);
    int64_t maxm = 1;
    for (int i = 0; i < nm; i++) maxm = Ms[i] > maxm ? Ms[i] : maxm;
    ds_tensor nw = weight(1, H), xs = act_rand(maxm, F, 1.0f), hs = act_rand(maxm, F, 1.0f);
    ds_tensor oq = act(maxm, H, NULL), ok = act(maxm, KV, NULL), ov = act(maxm, KV, NULL);
    ds_tensor res = act_rand(maxm, H, 1.0f);
    /* The last: o_proj on one copy of its weights (32 MB, held by L2 after the warm-up): how fast an SM takes
     * weights that do not come from HBM (session 18: a ring landed before the first product was not consumed
     * faster than a streamed one). Session 19, H200: 16.0 us vs 16.2 from HBM at one row, 10.2 vs 12.4 at 8:
     * the one-row kernel is not bound by HBM alone (ncu: its consumer warps' chain per stage, and its tiles'
     * epilogues). */
    const char *what[5] = {"qkv: rmsnorm_linear_multi (4096+1024+1024) x 4096", "o_proj: linear_residual 4096 x 4096",
                           "gate/up: rmsnorm_linear_swiglu 2 x 12288 x 4096", "down: linear_residual 4096 x 12288",
                           "o_proj, one copy of the weights (from L2)"};
    const double bytes[5] = {2.0 * (H + 2 * KV) * H, 2.0 * H * H, 4.0 * F * H, 2.0 * H * F, 2.0 * H * H};
    for (int mi = 0; mi < nm; mi++) {
        const int64_t M = Ms[mi];
        ds_tensor xh = ds_cols(ds_rows(xs, 0, M), 0, H), xf = ds_rows(xs, 0, M), hh = ds_rows(hs, 0, M);
        double layer = 0;
        for (int op = 0; op < 5; op++) {
            if (op == 4 && M > 8) continue; /* the L2 probe is about decode */
            const int reps = bench_reps;
            double t0 = 0;
            for (int r = -bench_warmup; r < reps; r++) { /* warm-up calls first */
                if (r == 0) {
                    check_gpu_ok("bandwidth warm-up");
                    t0 = now_s();
                }
                const int c = op == 4 ? 0 : r & 1;
                if (op == 0) {
                    const ds_tensor outs[3] = {ds_rows(oq, 0, M), ds_rows(ok, 0, M), ds_rows(ov, 0, M)};
                    const ds_tensor ws[3] = {q[c], k[c], v[c]};
                    const ds_tensor bs[3] = {ds_no_tensor(), ds_no_tensor(), ds_no_tensor()};
                    gpu->ops->rmsnorm_linear_multi(gpu, 3, outs, xh, nw, 1e-6f, ws, bs);
                } else if (op == 1 || op == 4) {
                    gpu->ops->linear_residual(gpu, ds_rows(res, 0, M), xh, o[c], ds_no_tensor(),
                                              ds_rows(res, 0, M));
                } else if (op == 2) {
                    gpu->ops->rmsnorm_linear_swiglu(gpu, hh, xh, nw, 1e-6f, g[c], u[c]);
                } else {
                    gpu->ops->linear_residual(gpu, ds_rows(res, 0, M), xf, d[c], ds_no_tensor(),
                                              ds_rows(res, 0, M));
                }
            }
            check_gpu_ok("bandwidth");
            const double dt = (now_s() - t0) / reps;
            if (op < 4) layer += dt;
            printf("  %-52s M=%lld: %7.1f us  %5.2f TB/s of weights  %6.1f TFLOP/s\n", what[op], (long long)M,
                   dt * 1e6, bytes[op] / dt / 1e12, (double)M * bytes[op] / dt / 1e12);
        }
        printf("  a layer's projections, M=%lld: %.1f us (%.1f TFLOP/s)\n", (long long)M, layer * 1e6,
               (double)M * (bytes[0] + bytes[1] + bytes[2] + bytes[3]) / layer / 1e12);
    }
    for (int c = 0; c < 2; c++) {
        ds_tensor *all[] = {&q[c], &k[c], &v[c], &o[c], &g[c], &u[c], &d[c]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gpu->ops->release(gpu, all[i]);
    }
    ds_tensor *ps[] = {&nw, &xs, &hs, &oq, &ok, &ov, &res};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) release(ps[i]);
}

/* The quantized matmul (matmul_quant.cu) at the Qwen3-8B shapes, int4 and
 * int8, group 64, bf16 scales, M = 1, 4, 8, 16, each call on one of two
 * copies of its weight in turn (L2 holds neither): the bytes it must read
 * (codes, scales, biases) / time, and that as a share of the copy bandwidth
 * the backend's probe measures (the floor `dspark bench` uses). */
static void quant_bandwidth(void) {
    ds_bandwidth bw;
    ds_error *e = ds_backend_bandwidth(gpu, (size_t)1 << 30, 5, &bw);
    if (e) {
        printf("  quantized linear: no copy bandwidth (%s)\n", ds_error_message(e));
        ds_error_free(e);
        return;
    }
    printf("  copy bandwidth %.0f GB/s (%s)\n", bw.bytes_per_s / 1e9, bw.method);
    const struct {
        const char *what;
        int64_t N, K;
    } shapes[] = {{"q/o_proj 4096x4096", 4096, 4096},
                  {"gate/up 12288x4096", 12288, 4096},
                  {"down 4096x12288", 4096, 12288},
                  {"lm_head 151936x4096", 151936, 4096}};
    const int group = 64;
    const int64_t Ms[] = {1, 4, 8, 16};
    ds_tensor x = act_rand(16, 12288, 1.0f), out = act(16, 151936, NULL);
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t N = shapes[si].N, K = shapes[si].K, W = K * bits / 32, G = K / group;
            uint32_t *words = malloc((size_t)(N * W) * 4);
            uint16_t *sc = malloc((size_t)(N * G) * 2), *bi = malloc((size_t)(N * G) * 2);
            uint64_t r = 0x2545f4914f6cdd1dull;
            for (int64_t i = 0; i < N * W; i++) {
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                words[i] = (uint32_t)(r >> 16);
            }
            for (int64_t i = 0; i < N * G; i++) { /* |w| <= ~0.03, as a trained layer's */
                sc[i] = ds_f32_to_bf16((bits == 4 ? 0.004f : 0.00025f) * (1.0f + 0.25f * frand()));
                bi[i] = ds_f32_to_bf16(-0.03f * (1.0f + 0.25f * frand()));
            }
            ds_st_tensor tw = {.name = "w.weight", .dtype = DS_U32, .ndim = 2, .shape = {N, W}, .data = words,
                               .nbytes = (size_t)(N * W) * 4};
            ds_st_tensor ts = {.name = "w.scales", .dtype = DS_BF16, .ndim = 2, .shape = {N, G}, .data = sc,
                               .nbytes = (size_t)(N * G) * 2};
            ds_st_tensor tb = ts;
            tb.name = "w.biases";
            tb.data = bi;
            const ds_quant_src src = {.w = &tw, .scales = &ts, .biases = &tb, .bits = bits, .group = group};
            ds_tensor w[2];
            for (int c = 0; c < 2; c++) die_on(gpu->ops->weight_quant(gpu, &src, N, K, &w[c]), "weight_quant");
            free(words), free(sc), free(bi);
            const double bytes = (double)(N * W) * 4 + (double)(N * G) * 4;
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                const int64_t M = Ms[mi];
                const ds_tensor xm = ds_cols(ds_rows(x, 0, M), 0, K), om = ds_cols(ds_rows(out, 0, M), 0, N);
                const int reps = 40;
                double t0 = 0;
                for (int rep = -2; rep < reps; rep++) { /* two warm-up calls */
                    if (rep == 0) {
                        check_gpu_ok("quantized warm-up");
                        t0 = now_s();
                    }
                    gpu->ops->linear(gpu, om, xm, w[rep & 1], ds_no_tensor());
                }
                check_gpu_ok("quantized linear");
                const double dt = (now_s() - t0) / reps;
                printf("  linear int%d g%d %-20s M=%-2lld: %8.1f us  %6.0f GB/s  %5.1f %% of copy\n", bits, group,
                       shapes[si].what, (long long)M, dt * 1e6, bytes / dt / 1e9, 100.0 * bytes / dt / bw.bytes_per_s);
            }
            release(&w[0]);
            release(&w[1]);
        }
    release(&x);
    release(&out);
}

/* What a verification round and a drafted block cost on the GPU at Qwen3's
 * vocabulary: verify_sample of 17 rows (16 drafts) and a 16-position
 * sampled walk (vanilla head, r = 256, bf16), with top-k 20 and top-p
 * 0.95, and without truncation. */
static void sample_speed(void) {
    const int64_t V = 151936, G = 16, r = 256;
    float *l = malloc((size_t)((G + 1) * V) * sizeof *l);
    for (int64_t i = 0; i < (G + 1) * V; i++) l[i] = 4.0f * frand();
    float *w = malloc((size_t)(V * r) * sizeof *w);
    for (int64_t i = 0; i < V * r; i++) w[i] = (float)(int)(frand() * 16) / 256.0f;
    ds_tensor lt = act(G + 1, V, l), pd = act(G, V, NULL), pb = act(G, V, l), pe = act(G, r, NULL);
    ds_tensor pw1 = bf16_weight_of(w, V, r), pw2 = bf16_weight_of(w, V, r);
    const ds_sampling sets[2] = {{.temperature = 0.8f, .top_k = 20, .top_p = 0.95f}, {.temperature = 1.0f, .top_p = 1.0f}};
    for (int si = 0; si < 2; si++) {
        const ds_sampling *s = &sets[si];
        gpu->ops->probs(gpu, pd, ds_rows(lt, 0, G), s);
        int32_t x[16], out[2], tok[16];
        for (int i = 0; i < G; i++) x[i] = (int32_t)(i * 1000);
        double u[17];
        for (int i = 0; i <= G; i++) u[i] = ds_rng_uniform(&urng);
        const int reps = 10;
        double tv = 0, tv8 = 0, tm = 0, tp = 0;
        for (int rep = -1; rep < reps; rep++) { /* one warm-up */
            double t0 = now_s();
            ds_spec(gpu)->verify_sample(gpu, lt, x, (int)G, pd, s, u, out);
            double t1 = now_s();
            ds_spec(gpu)->markov_sample(gpu, pb, ds_no_tensor(), pd, pw1, pw2, true, 5, s, u, pe, tok);
            double t2 = now_s();
            ds_spec(gpu)->verify_sample(gpu, ds_rows(lt, 0, 9), x, 8, pd, s, u, out);
            double t3 = now_s();
            gpu->ops->probs(gpu, pd, ds_rows(lt, 0, G), s);
            check_gpu_ok("sampling speed");
            double t4 = now_s();
            if (rep >= 0) tv += t1 - t0, tm += t2 - t1, tv8 += t3 - t2, tp += t4 - t3;
        }
        check_gpu_ok("sampling speed");
        printf("  V=151936 T=%.1f top_k=%d top_p=%.2f: verify_sample (16 drafts) %.1f us, (8 drafts) %.1f us, "
               "markov_sample (16 steps, r=256 bf16) %.1f us (%.1f us a step), probs of 16 rows %.1f us\n",
               (double)s->temperature, s->top_k, (double)s->top_p, 1e6 * tv / reps, 1e6 * tv8 / reps,
               1e6 * tm / reps, 1e6 * tm / reps / G, 1e6 * tp / reps);
    }
    release(&lt), release(&pd), release(&pb), release(&pe), release(&pw1), release(&pw2);
    free(l), free(w);
}

int main(int argc, char **argv) {
    int device = 0;
    bool test_config = false, batched = false;
    int64_t rows[16];
    int n_rows = 0, only_inv = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            device = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
            for (char *p = argv[++i]; *p && n_rows < 16; p += *p == ',') {
                char *end;
                rows[n_rows] = strtoll(p, &end, 10);
                if (end == p || rows[n_rows] < 1) break;
                n_rows++, p = end;
            }
        } else if (!strcmp(argv[i], "--inv") && i + 1 < argc) {
            only_inv = atoi(argv[++i]) != 0;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            bench_reps = atoi(argv[++i]), bench_warmup = 0;
            if (bench_reps < 1) bench_reps = 1;
        } else if (!strcmp(argv[i], "--test-config")) {
            test_config = true;
        } else if (!strcmp(argv[i], "--batched")) {
            batched = true;
        } else {
            fprintf(stderr, "usage: %s [--device N] [--test-config] [--batched [--rows M1,M2,...] [--inv 0|1] [--reps N]]\n",
                    argv[0]);
            return 2;
        }
    }
    ds_cuda_config cfg;
    die_on(ds_cuda_config_from_env(&cfg), "config");
    if (test_config) cfg.ring_min_tiles = 1, cfg.fused_attn_min_rows = 1, cfg.att_pack_min_blocks = 1;
    ds_error *e = ds_backend_cuda_new_with(device, &cfg, &gpu);
    if (e) {
        printf("SKIP: no CUDA device [%s]\n", ds_error_message(e));
        ds_error_free(e);
        return 77;
    }
    ds_rng_seed(&urng, 31337);
    printf("# cuda ops, device %d, %s config\n", device, test_config ? "the op tests'" : "the engine's");
    if (batched) {
        const int64_t Ms[] = {8, 16, 24, 32, 33, 48, 64, 128, 256, 512}, mid[] = {16, 24, 32};
        for (int inv = 0; inv < 2; inv++) {
            if (only_inv >= 0 && inv != only_inv) continue;
            ds_cuda_config_of(gpu)->invariant = inv;
            ds_cuda_config_of(gpu)->narrow_rows = 32;
            printf("# batched projections, invariant %d\n", inv);
            if (n_rows) {
                model_shapes_bandwidth(rows, n_rows);
                continue;
            }
            model_shapes_bandwidth(Ms, (int)(sizeof Ms / sizeof Ms[0]));
            /* 9..32 rows on the wide path instead of the narrow kernels' 8-row tiles */
            ds_cuda_config_of(gpu)->narrow_rows = 8;
            printf("# batched projections, invariant %d, wide from 9 rows (narrow_rows 8)\n", inv);
            model_shapes_bandwidth(mid, (int)(sizeof mid / sizeof mid[0]));
        }
        check_gpu_ok("end");
        gpu->ops->destroy(gpu);
        return 0;
    }
    linear_bandwidth();
    const int64_t decode_rows[] = {1, 8};
    model_shapes_bandwidth(decode_rows, 2);
    quant_bandwidth();
    sample_speed();
    check_gpu_ok("end");
    gpu->ops->destroy(gpu);
    return 0;
}
