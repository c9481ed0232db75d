/* The CUDA backend's norms and RoPE (norm_rope.cu) against the CPU backend
 * on random inputs: rmsnorm (and rmsnorm_add, the same bits as rmsnorm,
 * add, scale) within 2e-5, RoPE and the fused per-head norm + RoPE within
 * 2e-6, key_norm_rope_store_layers bit for bit against a layer at a time.
 * Skips (exit 77) where no CUDA device can be used. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_vs_cpu.h"

/* ---- norms, RoPE ---------------------------------------------------------- */

/* rmsnorm_add (Gemma's post-norms, the layer scalar with the last add):
 * the same bits as rmsnorm, add and scale on the GPU, in place (out = res)
 * as the model calls it; against the CPU's unfused sequence within 2e-5. */
static void rmsnorm_add_cases(void) {
    struct {
        int64_t rows, cols;
        ds_dtype wdt;
        float scale;
    } cs[] = {{5, 3840, DS_BF16, 1.0f}, {8, 3840, DS_BF16, 0.37f}, {3, 1000, DS_F32, 1.0f}, {1, 640, DS_F16, 2.5f}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const int64_t R = cs[i].rows, C = cs[i].cols;
        pair x = act_rand(R, C, 4.0f), res = act_rand(R, C, 1.0f), w = weight(cs[i].wdt, 1, C);
        float *r0 = fetch(gpu, res.g);
        pair ref = act(R, C, r0), tmp = act(R, C, NULL);
        free(r0);
        gpu->ops->rmsnorm_add(gpu, res.g, res.g, x.g, w.g, 1e-6f, cs[i].scale);
        gpu->ops->rmsnorm(gpu, tmp.g, x.g, w.g, (int)C, 1e-6f); /* the three ops it replaces */
        gpu->ops->add(gpu, ref.g, ref.g, tmp.g);
        if (cs[i].scale != 1.0f) gpu->ops->scale(gpu, ref.g, cs[i].scale);
        ds_rmsnorm_add(cpu, res.c, res.c, x.c, w.c, 1e-6f, cs[i].scale); /* the CPU: the unfused sequence */
        char what[96];
        snprintf(what, sizeof what, "rmsnorm_add %lldx%lld %s scale %g", (long long)R, (long long)C,
                 ds_dtype_name(cs[i].wdt), cs[i].scale);
        compare(res.g, res.c, 2e-5, what);
        float *a = fetch(gpu, res.g), *b = fetch(gpu, ref.g);
        CHECK(!memcmp(a, b, (size_t)(R * C) * 4), "%s: differs from rmsnorm, add, scale", what);
        free(a);
        free(b);
        check_gpu_ok(what);
        release(&x);
        release(&res);
        release(&w);
        release(&ref);
        release(&tmp);
    }
}

static void test_rmsnorm(void) {
    struct {
        int64_t rows, cols;
        int dim;
        ds_dtype wdt; /* DS_DTYPE_COUNT: no weight */
    } cs[] = {{5, 1000, 1000, DS_BF16}, {3, 4096, 4096, DS_F32}, {7, 16 * 64, 64, DS_F32},
              {2, 8 * 128, 128, DS_DTYPE_COUNT}, {40, 256, 256, DS_F16}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        pair x = act_rand(cs[i].rows, cs[i].cols, 4.0f), out = act(cs[i].rows, cs[i].cols, NULL), w = {0};
        bool hw = cs[i].wdt != DS_DTYPE_COUNT;
        if (hw) w = weight(cs[i].wdt, 1, cs[i].dim);
        gpu->ops->rmsnorm(gpu, out.g, x.g, hw ? w.g : ds_no_tensor(), cs[i].dim, 1e-6f);
        cpu->ops->rmsnorm(cpu, out.c, x.c, hw ? w.c : ds_no_tensor(), cs[i].dim, 1e-6f);
        char what[96];
        snprintf(what, sizeof what, "rmsnorm %lldx%lld dim %d %s", (long long)cs[i].rows, (long long)cs[i].cols,
                 cs[i].dim, hw ? ds_dtype_name(cs[i].wdt) : "no weight");
        compare(out.g, out.c, 2e-5, what);
        if (DS_X_BF16_ON) { /* the CPU takes the GPU's order (cpu_norm.c): the same bits */
            float *g = fetch(gpu, out.g), *c = fetch(cpu, out.c);
            CHECK(!memcmp(g, c, (size_t)(cs[i].rows * cs[i].cols) * 4), "%s: the GPU's bits differ from the CPU's",
                  what);
            free(g);
            free(c);
        }
        /* In place, as the model does for q/k norms: the same bits as out of place. */
        gpu->ops->rmsnorm(gpu, x.g, x.g, hw ? w.g : ds_no_tensor(), cs[i].dim, 1e-6f);
        float *a = fetch(gpu, x.g), *b = fetch(gpu, out.g);
        CHECK(!memcmp(a, b, (size_t)(cs[i].rows * cs[i].cols) * 4), "%s: in place differs from out of place", what);
        free(a);
        free(b);
        release(&x);
        release(&out);
        if (hw) release(&w);
    }
    rmsnorm_add_cases();
}

static void test_rope(void) {
    const int hds[] = {64, 128, 512};
    for (int t = 0; t < 3; t++) {
        const int hd = hds[t], heads = 4, rows = 70;
        float *inv = malloc((size_t)(hd / 2) * sizeof *inv);
        for (int i = 0; i < hd / 2; i++) /* proportional RoPE: a zero tail */
            inv[i] = i < hd / 3 ? (float)(1.0 / pow(1e6, (double)(2 * i) / hd)) : 0.0f;
        int32_t *pos = malloc(rows * sizeof *pos);
        for (int i = 0; i < rows; i++) pos[i] = (int32_t)((frand() + 1.0f) * 4000.0f);
        pair x = act_rand(rows, (int64_t)heads * hd, 2.0f);
        gpu->ops->rope(gpu, x.g, hd, pos, inv);
        cpu->ops->rope(cpu, x.c, hd, pos, inv);
        char what[64];
        snprintf(what, sizeof what, "rope head_dim %d, 70 rows, pos < 8000", hd);
        compare(x.g, x.c, 2e-6, what);
        release(&x);
        free(inv);
        free(pos);
    }
}

/* The fused per-head norm + RoPE against the CPU's rmsnorm then rope. */
static void test_rmsnorm_rope(void) {
    const int hds[] = {64, 128, 256};
    for (int t = 0; t < 3; t++) {
        const int hd = hds[t], heads = 3, rows = 70;
        float *inv = malloc((size_t)(hd / 2) * sizeof *inv);
        for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(1e6, (double)(2 * i) / hd));
        int32_t *pos = malloc(rows * sizeof *pos);
        for (int i = 0; i < rows; i++) pos[i] = (int32_t)((frand() + 1.0f) * 4000.0f);
        pair x = act_rand(rows, (int64_t)heads * hd, 3.0f), w = weight(t == 1 ? DS_F32 : DS_BF16, 1, hd);
        gpu->ops->rmsnorm_rope(gpu, x.g, w.g, hd, 1e-6f, pos, inv);
        ds_rmsnorm_rope(cpu, x.c, w.c, hd, 1e-6f, pos, inv);
        char what[64];
        snprintf(what, sizeof what, "rmsnorm_rope head_dim %d, 70 rows", hd);
        compare(x.g, x.c, 2e-6, what);
        /* q (4 heads) and k (2 heads) in one launch against two CPU passes. */
        pair q = act_rand(rows, (int64_t)4 * hd, 3.0f), k = act_rand(rows, (int64_t)2 * hd, 2.0f);
        pair kw = weight(t == 2 ? DS_F32 : DS_BF16, 1, hd);
        gpu->ops->qk_norm_rope(gpu, q.g, w.g, k.g, kw.g, hd, 1e-6f, pos, inv);
        ds_qk_norm_rope(cpu, q.c, w.c, k.c, kw.c, hd, 1e-6f, pos, inv);
        snprintf(what, sizeof what, "qk_norm_rope q, head_dim %d, 70 rows", hd);
        compare(q.g, q.c, 2e-6, what);
        snprintf(what, sizeof what, "qk_norm_rope k, head_dim %d, 70 rows", hd);
        compare(k.g, k.c, 2e-6, what);
        release(&q);
        release(&k);
        release(&kw);
        release(&x);
        release(&w);
        free(inv);
        free(pos);
    }
}

/* key_norm_rope_store_layers (a drafter's context keys of every layer in one launch) against qk_norm_rope_store
 * a layer on the GPU, bit for bit, and the CPU's: 10 layers (two launches of at most 8) at 5 rows and 70 (two
 * row chunks), positions scattered in the caches. */
static void test_key_layers(void) {
    enum { L = 10, HEADS = 2, D = 128, CACHE = 200 };
    const int rows_cases[] = {5, 70};
    float *inv = malloc((D / 2) * sizeof *inv);
    for (int i = 0; i < D / 2; i++) inv[i] = (float)(1.0 / pow(1e6, (double)(2 * i) / D));
    for (int rc = 0; rc < 2; rc++) {
        const int rows = rows_cases[rc];
        int32_t *pos = malloc((size_t)rows * sizeof *pos);
        for (int i = 0; i < rows; i++) pos[i] = (i * 37 + 11) % CACHE; /* distinct: 37 and 200 are coprime */
        pair k[L], v[L], kw[L], ka[L], va[L], kb[L], vb[L];
        ds_tensor gk[L], gkw[L], gv[L], gka[L], gva[L], ck[L], ckw[L], cv[L], cka[L], cva[L];
        for (int l = 0; l < L; l++) {
            k[l] = act_rand(rows, HEADS * D, 2.0f), v[l] = act_rand(rows, HEADS * D, 1.0f);
            kw[l] = weight(l % 2 ? DS_BF16 : DS_F32, 1, D);
            float *z = calloc((size_t)CACHE * HEADS * D, sizeof *z);
            ka[l] = act(CACHE, HEADS * D, z), va[l] = act(CACHE, HEADS * D, z);
            kb[l] = act(CACHE, HEADS * D, z), vb[l] = act(CACHE, HEADS * D, z);
            free(z);
            gk[l] = k[l].g, gkw[l] = kw[l].g, gv[l] = v[l].g, gka[l] = ka[l].g, gva[l] = va[l].g;
            ck[l] = k[l].c, ckw[l] = kw[l].c, cv[l] = v[l].c, cka[l] = ka[l].c, cva[l] = va[l].c;
        }
        /* per layer into (b) first: the op normalizes k in place, so the one-launch op (a) runs on fresh copies */
        pair k2[L];
        for (int l = 0; l < L; l++) {
            float *kv = fetch(gpu, k[l].g);
            k2[l] = act(rows, HEADS * D, kv);
            free(kv);
            gpu->ops->qk_norm_rope_store(gpu, ds_rows(k2[l].g, 0, 0), ds_no_tensor(), k2[l].g, kw[l].g, v[l].g,
                                         kb[l].g, vb[l].g, 0, D, 1e-6f, pos, inv);
        }
        gpu->ops->key_norm_rope_store_layers(gpu, L, gk, gkw, gv, gka, gva, D, 1e-6f, pos, inv);
        ds_key_norm_rope_store_layers(cpu, L, ck, ckw, cv, cka, cva, D, 1e-6f, pos, inv, NULL);
        check_gpu_ok("key_norm_rope_store_layers");
        int differ = 0;
        for (int l = 0; l < L; l++) {
            const size_t bytes = (size_t)CACHE * HEADS * D * 4;
            float *a = fetch(gpu, ka[l].g), *b = fetch(gpu, kb[l].g);
            float *c = fetch(gpu, va[l].g), *d = fetch(gpu, vb[l].g);
            differ += memcmp(a, b, bytes) != 0 || memcmp(c, d, bytes) != 0;
            free(a), free(b), free(c), free(d);
        }
        CHECK(differ == 0, "key_norm_rope_store_layers, %d rows: %d of %d layers' caches differ from "
                           "qk_norm_rope_store's", rows, differ, L);
        char what[96];
        snprintf(what, sizeof what, "key_norm_rope_store_layers %d rows, K of layer 9", rows);
        compare(ka[L - 1].g, ka[L - 1].c, 2e-6, what);
        snprintf(what, sizeof what, "key_norm_rope_store_layers %d rows, V of layer 0", rows);
        compare(va[0].g, va[0].c, 0, what);
        for (int l = 0; l < L; l++) {
            release(&k[l]), release(&v[l]), release(&kw[l]), release(&k2[l]);
            release(&ka[l]), release(&va[l]), release(&kb[l]), release(&vb[l]);
        }
        free(pos);
    }
    free(inv);
}

RUN_CUDA_TESTS("cuda_norm_rope", test_rmsnorm, test_rope, test_rmsnorm_rope, test_key_layers)
