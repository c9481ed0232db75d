/* The CUDA backend's quantized weights (matmul_quant.cu, quant_load.cuh;
 * issue 42) against the CPU backend's (test_quant checks those against
 * numpy). Bits 4 / 8, groups 32 / 64 / 128, bf16 and fp32 scales, every row
 * tier (narrow: up to 16 rows; wide: x prepared once, 32-row slabs), a last
 * partial 128-wide chunk of K (K = 1088) and tile counts that take every
 * tiles-a-warp choice (N = 300, 4000):
 * - bf16 scales (the tensor-core kernel on Hopper under DS_X_BF16): within
 *   QK_TOL normalized of the CPU. Both round x to bf16, so the difference
 *   is fp32 rounding alone: the GPU sums s * dot + b * xsum a group (dot and
 *   xsum on the tensor cores, whose fp32 accumulation truncates), the CPU
 *   x * fma(code, s, b) a weight. s * dot and b * xsum are each about twice
 *   a group's contribution for centred weights (b ~ -8 s at int4), so each
 *   group adds a few ulps of the output's scale: ~4 K / group * 2^-24
 *   ~ 1e-5 at K / group = 34, and QK_TOL leaves 5x room;
 * - fp32 scales (the CUDA-core kernel): within 2e-5 normalized (fp32 sums in
 *   another order), and at up to 32 rows bit for bit the GPU's own
 *   fp32-weight kernel over the dequantized values;
 * - rows independent of the call's row count, bit for bit: each row of
 *   calls of 1, 3, 8, 9, 16, 17, 33, 64 and 100 rows (every launch shape,
 *   tiles a warp, wide slabs) equals the row computed alone;
 * - the embedding gather of quantized rows exact;
 * - end to end: the tiny fixtures (fp32 scales) with prompt logits within
 *   1e-4 of the CPU's and greedy drafted == AR; the bundled pico pair
 *   quantized here (`dspark quantize`: bf16 scales, int4 target, int8
 *   drafter) with prompt logits within PICO_TOL of the CPU's (activations
 *   rounded to bf16 on both sides may round apart, and that grows over 8
 *   layers; a wrong layout gives errors of order 1) and greedy drafted ==
 *   AR on the GPU.
 * Skips (exit 77) where no CUDA device can be used. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_config.h"
#include "base/affine_quant.h"
#include "cuda_vs_cpu.h"
#include "pico_prompts.h"
#include "draft/drafter.h"
#include "model/target.h"
#include "speculate/generate.h"

#define FIX DS_TESTDATA "/fixtures/qwen3-tiny-quant"
#define QK_TOL 5e-5
#define PICO_TOL 2e-2

/* A quantized weight on both backends, with its host bytes (the CPU's tensor points into them) and its
 * dequantized values. */
typedef struct {
    ds_tensor g, c;
    uint32_t *words;
    void *scales, *biases;
    float *deq;
} qpair;

static qpair qweight(int bits, int group, ds_dtype sdt, int64_t N, int64_t K) {
    qpair p = {0};
    const int64_t G = K / group, W = K * bits / 32;
    const size_t es = ds_dtype_size(sdt);
    p.words = malloc((size_t)(N * W) * 4);
    p.scales = malloc((size_t)(N * G) * es);
    p.biases = malloc((size_t)(N * G) * es);
    p.deq = malloc((size_t)(N * K) * sizeof(float));
    float *row = rand_vec((size_t)K, 0.5f);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t k = 0; k < K; k++) row[k] = frand() * 0.5f;
        for (int64_t g = 0; g < G; g++) {
            float s, b;
            ds_quant_group(row + g * group, group, bits, p.words + n * W + g * group * bits / 32, &s, &b);
            if (sdt == DS_BF16) {
                ((uint16_t *)p.scales)[n * G + g] = ds_f32_to_bf16(s);
                ((uint16_t *)p.biases)[n * G + g] = ds_f32_to_bf16(b);
            } else {
                ((float *)p.scales)[n * G + g] = s;
                ((float *)p.biases)[n * G + g] = b;
            }
        }
        ds_dequant_row(p.words + n * W, (const char *)p.scales + (size_t)(n * G) * es,
                       (const char *)p.biases + (size_t)(n * G) * es, sdt, bits, group, K, p.deq + n * K);
    }
    free(row);
    ds_st_tensor tw = {.name = "w.weight", .dtype = DS_U32, .ndim = 2, .shape = {N, W}, .data = p.words,
                       .nbytes = (size_t)(N * W) * 4};
    ds_st_tensor ts = {.name = "w.scales", .dtype = sdt, .ndim = 2, .shape = {N, G}, .data = p.scales,
                       .nbytes = (size_t)(N * G) * es};
    ds_st_tensor tb = ts;
    tb.name = "w.biases";
    tb.data = p.biases;
    const ds_quant_src src = {.w = &tw, .scales = &ts, .biases = &tb, .bits = bits, .group = group};
    ds_error *e = gpu->ops->weight_quant(gpu, &src, N, K, &p.g);
    if (!e) e = cpu->ops->weight_quant(cpu, &src, N, K, &p.c);
    if (e) {
        CHECK(false, "weight_quant: %s", ds_error_message(e));
        ds_error_free(e);
    }
    return p;
}

static void qrelease(qpair *p) {
    gpu->ops->release(gpu, &p->g);
    cpu->ops->release(cpu, &p->c);
    free(p->words);
    free(p->scales);
    free(p->biases);
    free(p->deq);
}

static void test_linear(void) {
    const int64_t Ms[] = {1, 2, 3, 5, 8, 9, 13, 16, 17, 32, 33, 100};
    const int64_t shapes[][2] = {{300, 1024}, {4000, 1088}}; /* (N, K): 1088 = 8 chunks of 128 + 64 */
    const int groups[] = {32, 64, 128};
    for (int si = 0; si < 2; si++)
        for (int bits = 4; bits <= 8; bits += 4)
            for (int gi = 0; gi < 3; gi++)
                for (int s = 0; s < 2; s++) {
                    const int64_t N = shapes[si][0], K = shapes[si][1];
                    if (K % groups[gi]) continue;
                    const ds_dtype sdt = s ? DS_F32 : DS_BF16;
                    qpair w = qweight(bits, groups[gi], sdt, N, K);
                    if (!w.g.data || !w.c.data) return;
                    pair dense = weight_of(DS_F32, w.deq, N, K);
                    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                        const int64_t M = Ms[mi];
                        if (N > 300 && M != 1 && M != 8 && M != 16 && M != 33) continue; /* (the big shape's tiers) */
                        pair x = act_rand(M, K, 1.0f), out = act(M, N, NULL), ref = act(M, N, NULL);
                        gpu->ops->linear(gpu, out.g, x.g, w.g, ds_no_tensor());
                        cpu->ops->linear(cpu, out.c, x.c, w.c, ds_no_tensor());
                        char what[96];
                        snprintf(what, sizeof what, "quantized linear %lldx%lld int%d g%d %s M=%lld", (long long)N,
                                 (long long)K, bits, groups[gi], ds_dtype_name(sdt), (long long)M);
                        compare(out.g, out.c, sdt == DS_BF16 ? QK_TOL : 2e-5, what);
                        if (sdt == DS_F32 && M <= 32) { /* the fp32-weight CUDA-core kernel, same order */
                            gpu->ops->linear(gpu, ref.g, x.g, dense.g, ds_no_tensor());
                            float *a = fetch(gpu, out.g), *b = fetch(gpu, ref.g);
                            CHECK(!memcmp(a, b, (size_t)(M * N) * sizeof *a), "%s: not the fp32 kernel's bits", what);
                            free(a);
                            free(b);
                        }
                        release(&x);
                        release(&out);
                        release(&ref);
                    }
                    release(&dense);
                    qrelease(&w);
                }
    /* A bias (bf16), on both kernels. */
    for (int s = 0; s < 2; s++) {
        qpair w = qweight(4, 64, s ? DS_F32 : DS_BF16, 300, 1024);
        if (!w.g.data) return;
        pair b = weight(DS_BF16, 1, 300), x = act_rand(5, 1024, 1.0f), out = act(5, 300, NULL);
        gpu->ops->linear(gpu, out.g, x.g, w.g, b.g);
        cpu->ops->linear(cpu, out.c, x.c, w.c, b.c);
        compare(out.g, out.c, s ? 2e-5 : QK_TOL,
                s ? "quantized linear + bias, fp32 scales" : "quantized linear + bias");
        release(&b);
        release(&x);
        release(&out);
        qrelease(&w);
    }
    check_gpu_ok("quantized linear");
}

/* Row i of a call of M rows == row i computed alone, bit for bit, for every launch shape. */
static void test_row_invariance(void) {
    const int64_t Ms[] = {3, 8, 9, 16, 17, 33, 64, 100}, MAXM = 100;
    const int64_t shapes[][2] = {{515, 2112}, {4000, 1024}}; /* 2112 = 16 chunks + 64 */
    const int groups[] = {32, 64, 128};
    for (int si = 0; si < 2; si++)
        for (int bits = 4; bits <= 8; bits += 4)
            for (int gi = 0; gi < 3; gi++) {
                const int64_t N = shapes[si][0], K = shapes[si][1];
                if (K % groups[gi]) continue;
                qpair w = qweight(bits, groups[gi], DS_BF16, N, K);
                if (!w.g.data) return;
                pair x = act_rand(MAXM, K, 1.0f), all = act(MAXM, N, NULL), one = act(1, N, NULL);
                float *alone = malloc((size_t)(MAXM * N) * sizeof *alone);
                for (int64_t i = 0; i < MAXM; i++) {
                    gpu->ops->linear(gpu, one.g, ds_rows(x.g, i, 1), w.g, ds_no_tensor());
                    float *b = fetch(gpu, one.g);
                    memcpy(alone + i * N, b, (size_t)N * sizeof *b);
                    free(b);
                }
                for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                    const int64_t M = Ms[mi];
                    gpu->ops->linear(gpu, ds_rows(all.g, 0, M), ds_rows(x.g, 0, M), w.g, ds_no_tensor());
                    float *a = fetch(gpu, ds_rows(all.g, 0, M));
                    for (int64_t i = 0; i < M; i++)
                        if (memcmp(a + i * N, alone + i * N, (size_t)N * sizeof *a)) {
                            CHECK(false, "%lldx%lld int%d g%d: row %lld of a %lld-row call != alone", (long long)N,
                                  (long long)K, bits, groups[gi], (long long)i, (long long)M);
                            break;
                        }
                    free(a);
                }
                printf("  row invariance %lldx%lld int%d g%d: checked\n", (long long)N, (long long)K, bits,
                       groups[gi]);
                free(alone);
                release(&x);
                release(&all);
                release(&one);
                qrelease(&w);
            }
    check_gpu_ok("quantized row invariance");
}

static void test_embed(void) {
    qpair t = qweight(4, 32, DS_BF16, 512, 256);
    if (!t.g.data) return;
    const int32_t ids[5] = {0, 511, 7, 7, 300};
    pair out = act(5, 256, NULL);
    gpu->ops->embed(gpu, out.g, t.g, ids, 1.0f);
    cpu->ops->embed(cpu, out.c, t.c, ids, 1.0f);
    compare(out.g, out.c, 0.0, "quantized embed");
    release(&out);
    qrelease(&t);
    check_gpu_ok("quantized embed");
}

static void test_fixture_end_to_end(void) {
    ds_safetensors *g = golden_open(FIX "/golden.safetensors");
    if (!g) return;
    size_t T;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    golden_close(g);
    ds_target *tg, *tc;
    ds_drafter *dg;
    CHECK_OK(ds_target_open(gpu, FIX "/target-q4g32", NULL, &tg));
    CHECK_OK(ds_target_open(cpu, FIX "/target-q4g32", NULL, &tc));
    CHECK_OK(ds_target_forward(tg, ids, (int)T, 0, (int)T));
    CHECK_OK(ds_target_forward(tc, ids, (int)T, 0, (int)T));
    compare(ds_rows(tg->logits, 0, (int64_t)T), ds_rows(tc->logits, 0, (int64_t)T), 1e-4, "q4g32 prompt logits");
    ds_target_crop(tg, 0);
    CHECK_OK(ds_drafter_open(gpu, FIX "/drafter-q8g32", tg, NULL, &dg));
    ds_gen_params p = {.max_new = 48, .ignore_stop = true};
    ds_gen_result ar = {0}, sp = {0};
    CHECK_OK(ds_generate(tg, NULL, ids, (int)T, &p, NULL, NULL, &ar));
    ds_target_crop(tg, 0);
    CHECK_OK(ds_generate(tg, dg, ids, (int)T, &p, NULL, NULL, &sp));
    CHECK(ar.n_tokens == sp.n_tokens && !memcmp(ar.tokens, sp.tokens, (size_t)ar.n_tokens * sizeof *ar.tokens),
          "GPU, q4g32 target + q8g32 drafter: drafted greedy != AR greedy");
    ds_gen_result_free(&ar);
    ds_gen_result_free(&sp);
    ds_drafter_free(dg);
    ds_target_free(tg);
    ds_target_free(tc);
    free(ids);
    check_gpu_ok("quantized fixture");
}

/* The bundled pico pair quantized with bf16 scales (the tensor-core kernel): logits near the CPU's, drafted == AR. */
static void test_pico_end_to_end(void) {
    char root[] = "/tmp/ds_cuda_quant_XXXXXX";
    if (!mkdtemp(root)) {
        CHECK(false, "mkdtemp");
        return;
    }
    char tdir[600], ddir[600], cmd[2048];
    snprintf(tdir, sizeof tdir, "%s/target-q4g64", root);
    snprintf(ddir, sizeof ddir, "%s/drafter-q8g64", root);
    snprintf(cmd, sizeof cmd, "%s quantize -m %s --bits 4 --group 64 --out %s >/dev/null 2>&1", DS_CLI,
             DS_MODELS "/pico-qwen3", tdir);
    bool made = system(cmd) == 0;
    CHECK(made, "%s failed", cmd);
    snprintf(cmd, sizeof cmd, "%s quantize -m %s --bits 8 --group 64 --out %s >/dev/null 2>&1", DS_CLI,
             DS_MODELS "/pico-qwen3-dspark", ddir);
    made = made && system(cmd) == 0;
    CHECK(made, "%s failed", cmd);
    static pico_prompt prompts[PICO_MAX_PROMPTS];
    const int np = pico_load_prompts(prompts, PICO_MAX_PROMPTS);
    ds_target *tg = NULL, *tc = NULL;
    ds_drafter *dg = NULL;
    if (np > 0 && made) {
        CHECK_OK(ds_target_open(gpu, tdir, NULL, &tg));
        CHECK_OK(ds_target_open(cpu, tdir, NULL, &tc));
    }
    if (tg && tc) {
        const pico_prompt *p = &prompts[0];
        CHECK_OK(ds_target_forward(tg, p->ids, p->n_ids, 0, p->n_ids));
        CHECK_OK(ds_target_forward(tc, p->ids, p->n_ids, 0, p->n_ids));
        compare(ds_rows(tg->logits, 0, p->n_ids), ds_rows(tc->logits, 0, p->n_ids), PICO_TOL,
                "pico q4g64 prompt logits");
        ds_target_crop(tg, 0);
        CHECK_OK(ds_drafter_open(gpu, ddir, tg, NULL, &dg));
    }
    for (int i = 0; dg && i < 4 && i < np; i++) {
        const pico_prompt *p = &prompts[i];
        ds_gen_params gp = {.max_new = 48, .ignore_stop = true};
        ds_gen_result ar = {0}, sp = {0};
        ds_target_crop(tg, 0);
        CHECK_OK(ds_generate(tg, NULL, p->ids, p->n_ids, &gp, NULL, NULL, &ar));
        ds_target_crop(tg, 0);
        CHECK_OK(ds_generate(tg, dg, p->ids, p->n_ids, &gp, NULL, NULL, &sp));
        CHECK(ar.n_tokens == sp.n_tokens && !memcmp(ar.tokens, sp.tokens, (size_t)ar.n_tokens * sizeof *ar.tokens),
              "GPU, pico q4g64 target + q8g64 drafter, prompt %d: drafted greedy != AR greedy", i);
        ds_gen_result_free(&ar);
        ds_gen_result_free(&sp);
    }
    if (dg) ds_drafter_free(dg);
    if (tg) ds_target_free(tg);
    if (tc) ds_target_free(tc);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0, "%s", cmd);
    check_gpu_ok("pico quantized");
}

/* DS_CUDA_QUANT=0 (cfg.quant off): a quantized weight is refused by name. */
static void test_kill_switch(void) {
    ds_cuda_config_of(gpu)->quant = false;
    uint32_t words[8] = {0};
    uint16_t sb[2] = {0x3f80, 0};
    ds_st_tensor tw = {.name = "w.weight", .dtype = DS_U32, .ndim = 2, .shape = {1, 8}, .data = words,
                       .nbytes = sizeof words};
    ds_st_tensor ts = {.name = "w.scales", .dtype = DS_BF16, .ndim = 2, .shape = {1, 1}, .data = sb, .nbytes = 2};
    ds_st_tensor tb = ts;
    tb.name = "w.biases";
    tb.data = sb + 1;
    const ds_quant_src src = {.w = &tw, .scales = &ts, .biases = &tb, .bits = 4, .group = 64};
    ds_tensor t = ds_no_tensor();
    ds_error *e = gpu->ops->weight_quant(gpu, &src, 1, 64, &t);
    CHECK(e && strstr(ds_error_message(e), "DS_CUDA_QUANT=0"), "DS_CUDA_QUANT=0: a quantized weight loaded");
    ds_error_free(e);
    ds_cuda_config_of(gpu)->quant = true;
}

RUN_CUDA_TESTS("cuda_quant", test_linear, test_row_invariance, test_embed, test_fixture_end_to_end,
               test_pico_end_to_end, test_kill_switch)
