/* The CUDA backend's attention (attention.cu, attention_prefill.cu) against
 * the CPU backend on random inputs, within 2e-5: decode, verify and prefill
 * rows, GQA, head dims 16 to 512, windows, rings, non-causal. Row
 * invariance, bit for bit on the GPU: each row of a call (up to a verify's
 * rows) equals the row computed alone, with keys spanning several chunks,
 * windows and rings; a packed block's heads equal each head alone. The
 * fused q/k norm + RoPE + K/V store + attention against the two ops. Skips
 * (exit 77) where no CUDA device can be used. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_vs_cpu.h"

/* ---- attention ---------------------------------------------------------- */

typedef struct {
    const char *name;
    int H, KVH, D, Dv;
    bool causal;
    int window, ring;
    int p0, M; /* query rows at positions p0..p0+M-1 */
    int n_keys; /* non-causal: keys visible to every row */
} attn_case;

static void attention_case(const attn_case *ac) {
    const int cache_rows = ac->ring ? ac->ring : (ac->causal ? ac->p0 + ac->M : ac->n_keys);
    const int n_keys = ac->causal ? ac->p0 + ac->M : ac->n_keys;
    pair q = act_rand(ac->M, (int64_t)ac->H * ac->D, 1.0f);
    pair k = act_rand(cache_rows, (int64_t)ac->KVH * ac->D, 1.0f);
    pair v = act_rand(cache_rows, (int64_t)ac->KVH * ac->Dv, 1.0f);
    pair out = act(ac->M, (int64_t)ac->H * ac->Dv, NULL);
    int32_t *pos = malloc((size_t)ac->M * sizeof *pos);
    for (int i = 0; i < ac->M; i++) pos[i] = ac->p0 + i;
    ds_attn_params p = {.n_heads = ac->H, .n_kv_heads = ac->KVH, .head_dim = ac->D, .v_head_dim = ac->Dv,
                        .n_keys = n_keys, .causal = ac->causal, .window = ac->window, .ring_size = ac->ring,
                        .scale = 1.0f / sqrtf((float)ac->D), .q_pos = pos};
    gpu->ops->attention(gpu, out.g, q.g, k.g, v.g, &p);
    cpu->ops->attention(cpu, out.c, q.c, k.c, v.c, &p);
    char what[96];
    snprintf(what, sizeof what, "attention %s", ac->name);
    compare(out.g, out.c, 2e-5, what);
    /* Each row alone, as decode sees it: n_keys = its position + 1 when causal. Calls of DS_CU_PREFILL_ROWS
     * (33) rows or more (prefill chunks: more than any verify's gamma + 1) run the tiled kernel and are held to
     * the CPU only. */
    float *all = fetch(gpu, out.g);
    pair one = act(1, (int64_t)ac->H * ac->Dv, NULL);
    int bad = -1;
    for (int i = 0; i < ac->M && ac->M <= 32 && bad < 0; i++) {
        ds_attn_params p1 = p;
        p1.q_pos = pos + i;
        if (ac->causal) p1.n_keys = pos[i] + 1;
        gpu->ops->attention(gpu, one.g, ds_rows(q.g, i, 1), k.g, v.g, &p1);
        float *r = fetch(gpu, one.g);
        if (memcmp(r, all + (size_t)i * ac->H * ac->Dv, (size_t)ac->H * ac->Dv * 4)) bad = i;
        free(r);
    }
    CHECK(bad < 0, "attention %s: row %d of the %d-row call differs from the row alone", ac->name, bad, ac->M);
    check_gpu_ok(what);
    free(all);
    free(pos);
    release(&q);
    release(&k);
    release(&v);
    release(&out);
    release(&one);
}

static void attention_packed_cases(void);

static void test_attention(void) {
    const attn_case cases[] = {
        {"decode-like D=64 GQA 4/2, 1 row at 40", 4, 2, 64, 64, true, 0, 0, 40, 1, 0},
        {"verify D=64 GQA 4/2, 8 rows at 3", 4, 2, 64, 64, true, 0, 0, 3, 8, 0},
        {"verify D=128 16/8 across chunk 256", 16, 8, 128, 128, true, 0, 0, 250, 9, 0},
        {"verify D=128 8/1 rows at 700 (3 chunks)", 8, 1, 128, 128, true, 0, 0, 700, 5, 0},
        {"prefill D=16 4/2, 70 rows at 0", 4, 2, 16, 16, true, 0, 0, 0, 70, 0},
        {"prefill D=128 GQA 8/2, 150 rows at 100 (key tiles past 256)", 8, 2, 128, 128, true, 0, 0, 100, 150, 0},
        {"prefill D=64 window 40, 70 rows at 30", 4, 2, 64, 64, true, 40, 0, 30, 70, 0},
        {"prefill D=128 window 100 ring 192, 40 rows at 300", 4, 1, 128, 128, true, 100, 192, 300, 40, 0},
        {"prefill non-causal D=64 Dv=32, 40 rows, 90 keys", 4, 2, 64, 32, false, 0, 0, 0, 40, 90},
        {"prefill D=256 GQA 8/4, 100 rows at 20 (2 row blocks)", 8, 4, 256, 256, true, 0, 0, 20, 100, 0},
        {"prefill D=256 window 100 ring 192, 40 rows at 300", 4, 2, 256, 256, true, 100, 192, 300, 40, 0},
        {"prefill D=512 GQA 4/1, 50 rows at 10 (4 row blocks)", 4, 1, 512, 512, true, 0, 0, 10, 50, 0},
        {"prefill D=512 window 60 ring 128, 36 rows at 500", 2, 1, 512, 512, true, 60, 128, 500, 36, 0},
        {"prefill non-causal D=512 Dv=256, 34 rows, 70 keys", 2, 1, 512, 256, false, 0, 0, 0, 34, 70},
        {"D=256 sliding window 100, ring 128", 2, 1, 256, 256, true, 100, 128, 300, 6, 0},
        {"D=512 window 300 ring 512 at 1000", 2, 2, 512, 512, true, 300, 512, 1000, 4, 0},
        {"drafter non-causal D=64, 7 rows, 300 keys", 4, 2, 64, 64, false, 0, 0, 293, 7, 300},
        {"non-causal D=128 Dv=64, 5 rows, 20 keys", 4, 4, 128, 64, false, 0, 0, 15, 5, 20},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) attention_case(&cases[i]);
    attention_packed_cases();
}

/* A block packs the R query heads of a kv head it can (R = 4 at GQA 4 and
 * 8, 2 at GQA 2; heads up to 128): each head's result must be the same
 * bits as that head computed alone (one head, one kv head: R = 1; its grid
 * of M blocks also loads keys two groups ahead), so neither the packing nor
 * the loads' depth can change what a row gets. */
static void packed_case(const char *name, int H, int KVH, int D, int p0, int M) {
    const int n_keys = p0 + M;
    pair q = act_rand(M, (int64_t)H * D, 1.0f), k = act_rand(n_keys, (int64_t)KVH * D, 1.0f);
    pair v = act_rand(n_keys, (int64_t)KVH * D, 1.0f), out = act(M, (int64_t)H * D, NULL), one = act(M, D, NULL);
    int32_t *pos = malloc((size_t)M * sizeof *pos);
    for (int i = 0; i < M; i++) pos[i] = p0 + i;
    ds_attn_params p = {.n_heads = H, .n_kv_heads = KVH, .head_dim = D, .v_head_dim = D, .n_keys = n_keys,
                        .causal = true, .scale = 1.0f / sqrtf((float)D), .q_pos = pos};
    gpu->ops->attention(gpu, out.g, q.g, k.g, v.g, &p);
    float *all = fetch(gpu, out.g);
    int bad = -1;
    for (int h = 0; h < H && bad < 0; h++) { /* head h alone: column views of its q and its kv head */
        const int kvh = h / (H / KVH);
        ds_tensor qh = q.g, kh = k.g, vh = v.g;
        qh.data = (float *)qh.data + (int64_t)h * D, qh.cols = D;
        kh.data = (float *)kh.data + (int64_t)kvh * D, kh.cols = D;
        vh.data = (float *)vh.data + (int64_t)kvh * D, vh.cols = D;
        ds_attn_params p1 = p;
        p1.n_heads = p1.n_kv_heads = 1;
        gpu->ops->attention(gpu, one.g, qh, kh, vh, &p1);
        float *r = fetch(gpu, one.g);
        for (int i = 0; i < M && bad < 0; i++)
            if (memcmp(r + (size_t)i * D, all + ((size_t)i * H + h) * D, (size_t)D * 4)) bad = h;
        free(r);
    }
    CHECK(bad < 0, "attention packed %s: head %d differs from the head computed alone", name, bad);
    check_gpu_ok(name);
    free(all);
    free(pos);
    pair *ps[] = {&q, &k, &v, &out, &one};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) release(ps[i]);
}

static void attention_packed_cases(void) {
    packed_case("decode GQA 8/2 D=128, 1 row at 40", 8, 2, 128, 40, 1);
    packed_case("verify GQA 8/2 D=128, 8 rows at 700 (3 chunks)", 8, 2, 128, 700, 8);
    packed_case("verify GQA 6/3 D=64, 5 rows at 250 (across chunk 256)", 6, 3, 64, 250, 5);
    packed_case("GQA 4/1 D=32, 3 rows at 10", 4, 1, 32, 10, 3);
    packed_case("GQA 16/2 D=128, 2 rows at 300", 16, 2, 128, 300, 2);
}

/* The step's q/k norms, RoPE, K/V store and attention in one launch
 * (qk_norm_rope_attention) against the two ops on the GPU, bit for bit
 * (output and both caches), against the CPU's two ops within attention's
 * bound, and each causal row decoded alone against its row of the call. */
typedef struct {
    const char *name;
    int H, KVH, D, p0, n, n_keys; /* n_keys 0: causal (p0 + n) */
} nra_case;

static void norm_rope_attention_case(const nra_case *c) {
    const bool causal = c->n_keys == 0;
    const int n_keys = causal ? c->p0 + c->n : c->n_keys, rows = n_keys + 3;
    const int64_t qc = (int64_t)c->H * c->D, kc = (int64_t)c->KVH * c->D;
    float *kv0 = rand_vec((size_t)(rows * kc), 1.0f), *vv0 = rand_vec((size_t)(rows * kc), 1.0f);
    float *qv = rand_vec((size_t)(c->n * qc), 3.0f);
    pair q = act(c->n, qc, qv), q2 = act(c->n, qc, qv), k = act_rand(c->n, kc, 2.0f), v = act_rand(c->n, kc, 1.0f);
    pair ka = act(rows, kc, kv0), va = act(rows, kc, vv0), kb = act(rows, kc, kv0), vb = act(rows, kc, vv0);
    pair qw = weight(DS_BF16, 1, c->D), kw = weight(DS_F32, 1, c->D);
    pair outa = act(c->n, qc, NULL), outb = act(c->n, qc, NULL);
    float *inv = malloc((size_t)(c->D / 2) * sizeof *inv);
    for (int i = 0; i < c->D / 2; i++) inv[i] = (float)(1.0 / pow(1e6, (double)(2 * i) / c->D));
    int32_t *pos = malloc((size_t)c->n * sizeof *pos);
    for (int i = 0; i < c->n; i++) pos[i] = c->p0 + i;
    ds_attn_params p = {.n_heads = c->H, .n_kv_heads = c->KVH, .head_dim = c->D, .v_head_dim = c->D,
                        .n_keys = n_keys, .causal = causal, .scale = 1.0f / sqrtf((float)c->D), .q_pos = pos};
    /* The two ops (a), the fused op (b); the CPU's two ops on (a)'s CPU side. */
    gpu->ops->qk_norm_rope_store(gpu, q.g, qw.g, k.g, kw.g, v.g, ka.g, va.g, 0, c->D, 1e-6f, pos, inv);
    gpu->ops->attention(gpu, outa.g, q.g, ka.g, va.g, &p);
    gpu->ops->qk_norm_rope_attention(gpu, outb.g, q2.g, qw.g, k.g, kw.g, v.g, kb.g, vb.g, c->D, 1e-6f, inv, &p);
    ds_qk_norm_rope_attention(cpu, outa.c, q.c, qw.c, k.c, kw.c, v.c, ka.c, va.c, c->D, 1e-6f, inv, &p);
    char what[128];
    snprintf(what, sizeof what, "qk_norm_rope_attention %s", c->name);
    compare(outb.g, outa.c, 2e-5, what);
    const ds_tensor ga[3] = {outa.g, ka.g, va.g}, gb[3] = {outb.g, kb.g, vb.g};
    const char *names[3] = {"output", "K cache", "V cache"};
    for (int t = 0; t < 3; t++) {
        float *a = fetch(gpu, ga[t]), *b = fetch(gpu, gb[t]);
        CHECK(!memcmp(a, b, (size_t)(ga[t].rows * ga[t].cols) * 4), "%s: %s differs from the two ops'", what,
              names[t]);
        free(a), free(b);
    }
    if (causal) { /* each row alone (decode), its keys before it in the cache the call wrote */
        float *all = fetch(gpu, outb.g);
        pair one = act(1, qc, NULL), q1 = act(c->n, qc, qv);
        int bad = -1;
        for (int i = 0; i < c->n && bad < 0; i++) {
            ds_attn_params p1 = p;
            p1.q_pos = pos + i;
            p1.n_keys = pos[i] + 1;
            gpu->ops->qk_norm_rope_attention(gpu, one.g, ds_rows(q1.g, i, 1), qw.g, ds_rows(k.g, i, 1), kw.g,
                                             ds_rows(v.g, i, 1), kb.g, vb.g, c->D, 1e-6f, inv, &p1);
            float *r = fetch(gpu, one.g);
            if (memcmp(r, all + (size_t)i * qc, (size_t)qc * 4)) bad = i;
            free(r);
        }
        CHECK(bad < 0, "%s: row %d of the %d-row call differs from the row alone", what, bad, c->n);
        free(all);
        release(&one), release(&q1);
    }
    check_gpu_ok(what);
    pair *all[] = {&q, &q2, &k, &v, &ka, &va, &kb, &vb, &qw, &kw, &outa, &outb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(all[i]);
    free(kv0), free(vv0), free(qv), free(inv), free(pos);
}

static void test_norm_rope_attention(void) {
    const nra_case cases[] = {
        {"decode D=128 32/8, 1 row at 40", 32, 8, 128, 40, 1, 0},
        {"verify D=128 32/8, 8 rows at 3", 32, 8, 128, 3, 8, 0},
        {"verify D=128 16/4, 8 rows at 250 (fresh keys across chunk 256)", 16, 4, 128, 250, 8, 0},
        {"verify D=128 8/1, 5 rows at 700 (3 chunks)", 8, 1, 128, 700, 5, 0},
        {"verify D=64 4/2, 3 rows at 0", 4, 2, 64, 0, 3, 0},
        {"drafter non-causal D=128 32/8, 7 rows, 300 keys", 32, 8, 128, 293, 7, 300},
        {"9 rows (the two ops)", 8, 2, 128, 20, 9, 0},
        {"D=256 (the two ops)", 4, 2, 256, 30, 2, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) norm_rope_attention_case(&cases[i]);
}

RUN_CUDA_TESTS("cuda_attention", test_attention, test_norm_rope_attention)
