/* The CUDA backend's attention (attention.cu, attention_staged.cu,
 * attention_prefill.cu) against
 * the CPU backend on random inputs, within 2e-5: decode, verify and prefill
 * rows, GQA, head dims 16 to 512, windows, rings, non-causal. Row
 * invariance, bit for bit on the GPU: each row of a call (up to a verify's
 * rows) equals the row computed alone, with keys spanning several chunks,
 * windows and rings; a packed block's heads equal each head alone. The
 * fused q/k norm + RoPE + K/V store + attention against the two ops. Paged
 * caches (ds_kv_pages): rows of several sequences in one call (decode,
 * verify, prefill runs, non-causal row_keys, windows, D 32 to 512; fp32
 * and bf16 caches) against the CPU's paged attention, and bit for bit
 * against the same rows on pages in another order, alone, and on a
 * contiguous cache (the staged kernel's rows == the chunk kernel's); the paged
 * qk_norm_rope_attention against its two ops. Skips (exit 77) where no
 * CUDA device can be used. */
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

/* src's values in a new pair of dtype dt (the copy op's rounding). */
static pair cache_of(ds_dtype dt, const pair *src) {
    pair c = {ds_no_tensor(), ds_no_tensor(), NULL};
    ds_error *e = gpu->ops->alloc(gpu, dt, src->g.rows, src->g.cols, &c.g);
    if (!e) e = cpu->ops->alloc(cpu, dt, src->c.rows, src->c.cols, &c.c);
    CHECK(!e, "%s", e ? ds_error_message(e) : "");
    ds_error_free(e);
    gpu->ops->copy(gpu, c.g, src->g);
    cpu->ops->copy(cpu, c.c, src->c);
    return c;
}

/* ---- paged KV caches ----------------------------------------------------- */

/* One sequence of a paged call: query rows at positions pos0 .. pos0+rows-1,
 * keys 0 .. keys-1 (0: pos0 + rows, a causal step's). */
typedef struct {
    int pos0, rows, keys;
} pg_seq;

#define PG_MAX_SEQ 12

typedef struct {
    const char *name;
    int H, KVH, D, Dv;
    bool causal, row_keys; /* row_keys: each row limited to its sequence's keys (ds_kv_pages.row_keys) */
    int window, page_rows, n_seq;
    pg_seq seq[PG_MAX_SEQ];
} pg_case;

static int pg_keys(const pg_seq *s) { return s->keys ? s->keys : s->pos0 + s->rows; }

/* The sequences' keys and values placed in a pool of pages (3 spare) in a
 * shuffled order; the rows no sequence owns hold other random values. */
typedef struct {
    pair k, v;
    float *kh, *vh;           /* the pool's values on the host */
    int32_t *table;           /* the sequences' lists, concatenated */
    int list[PG_MAX_SEQ];     /* where sequence s's list starts in table */
    int64_t rows;
} pg_pool;

static pg_pool pg_pool_make(const pg_case *c, float *const *kh, float *const *vh) {
    pg_pool pl = {0};
    const int pr = c->page_rows, kc = c->KVH * c->D, vc = c->KVH * c->Dv;
    int n = 0;
    for (int s = 0; s < c->n_seq; s++) n += (pg_keys(&c->seq[s]) + pr - 1) / pr;
    const int pages = n + 3;
    int32_t *perm = malloc((size_t)pages * sizeof *perm);
    for (int i = 0; i < pages; i++) perm[i] = i;
    for (int i = pages - 1; i > 0; i--) {
        int j = (int)((frand() + 1.0f) * 0.5f * (float)(i + 1));
        j = j > i ? i : j;
        const int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    pl.rows = (int64_t)pages * pr;
    pl.kh = rand_vec((size_t)(pl.rows * kc), 1.0f);
    pl.vh = rand_vec((size_t)(pl.rows * vc), 1.0f);
    pl.table = malloc((size_t)n * sizeof *pl.table);
    int off = 0;
    for (int s = 0; s < c->n_seq; s++) {
        const int K = pg_keys(&c->seq[s]), np = (K + pr - 1) / pr;
        pl.list[s] = off;
        for (int i = 0; i < np; i++) pl.table[off + i] = perm[off + i];
        for (int j = 0; j < K; j++) {
            const int64_t r = (int64_t)pl.table[off + j / pr] * pr + j % pr;
            memcpy(pl.kh + r * kc, kh[s] + (int64_t)j * kc, (size_t)kc * 4);
            memcpy(pl.vh + r * vc, vh[s] + (int64_t)j * vc, (size_t)vc * 4);
        }
        off += np;
    }
    pl.k = act(pl.rows, kc, pl.kh);
    pl.v = act(pl.rows, vc, pl.vh);
    free(perm);
    return pl;
}

static void pg_pool_free(pg_pool *pl) {
    release(&pl->k), release(&pl->v);
    free(pl->kh), free(pl->vh), free(pl->table);
}

/* Rows [r0, r0+n) of a against b's n rows (row width w), bit for bit: the first row that differs, or -1. */
static int rows_differ(const float *a, int64_t r0, const float *b, int n, int64_t w) {
    for (int i = 0; i < n; i++)
        if (memcmp(a + (r0 + i) * w, b + (int64_t)i * w, (size_t)w * 4)) return i;
    return -1;
}

/* One call over the rows of every sequence of c (in c's order), each
 * sequence's keys in its own shuffled pages: against the CPU's paged
 * attention within attention's bound; bit for bit against the same call on
 * a pool in another page order, each sequence's rows alone (paged), and
 * each sequence's rows on a contiguous cache holding its keys (the
 * contiguous kernels: decode / verify rows, a prefill chunk's tiles). */
static void paged_case(const pg_case *c, ds_dtype dt) {
    const int kc = c->KVH * c->D, vc = c->KVH * c->Dv, qc = c->H * c->D, oc = c->H * c->Dv;
    float *kh[PG_MAX_SEQ], *vh[PG_MAX_SEQ];
    int M = 0, n_keys = 0, r0s[PG_MAX_SEQ];
    for (int s = 0; s < c->n_seq; s++) {
        const int K = pg_keys(&c->seq[s]);
        kh[s] = rand_vec((size_t)K * kc, 1.0f);
        vh[s] = rand_vec((size_t)K * vc, 1.0f);
        r0s[s] = M;
        M += c->seq[s].rows;
        if (K > n_keys) n_keys = K;
    }
    pg_pool a = pg_pool_make(c, kh, vh), b = pg_pool_make(c, kh, vh);
    if (dt != DS_F32) /* the pools in the caches' dtype */
        for (pg_pool *pl = &a; pl; pl = pl == &a ? &b : NULL) {
            pair k16 = cache_of(dt, &pl->k), v16 = cache_of(dt, &pl->v);
            release(&pl->k), release(&pl->v);
            pl->k = k16, pl->v = v16;
        }
    int32_t *pos = malloc((size_t)M * sizeof *pos), *rt = malloc((size_t)M * sizeof *rt);
    int32_t *rk = malloc((size_t)M * sizeof *rk), *zeros = calloc((size_t)M, sizeof *zeros);
    for (int s = 0; s < c->n_seq; s++)
        for (int i = 0; i < c->seq[s].rows; i++) {
            pos[r0s[s] + i] = c->seq[s].pos0 + i;
            rt[r0s[s] + i] = a.list[s]; /* the same in both pools: only the page ids differ */
            rk[r0s[s] + i] = pg_keys(&c->seq[s]);
        }
    pair q = act_rand(M, qc, 1.0f), out = act(M, oc, NULL), out_b = act(M, oc, NULL);
    ds_kv_pages pga = {.page_rows = c->page_rows, .table = a.table, .row_table = rt,
                       .row_keys = c->row_keys ? rk : NULL};
    ds_kv_pages pgb = pga;
    pgb.table = b.table;
    ds_attn_params p = {.n_heads = c->H, .n_kv_heads = c->KVH, .head_dim = c->D, .v_head_dim = c->Dv,
                        .n_keys = n_keys, .causal = c->causal, .window = c->window,
                        .scale = 1.0f / sqrtf((float)c->D), .q_pos = pos, .pages = &pga};
    gpu->ops->attention(gpu, out.g, q.g, a.k.g, a.v.g, &p);
    cpu->ops->attention(cpu, out.c, q.c, a.k.c, a.v.c, &p);
    char what[160];
    snprintf(what, sizeof what, "paged %s, %s caches", c->name, ds_dtype_name(dt));
    compare(out.g, out.c, 2e-5, what);
    float *all = fetch(gpu, out.g);
    ds_attn_params pb = p;
    pb.pages = &pgb;
    gpu->ops->attention(gpu, out_b.g, q.g, b.k.g, b.v.g, &pb);
    float *other = fetch(gpu, out_b.g);
    const int bad_order = rows_differ(all, 0, other, M, oc);
    CHECK(bad_order < 0, "%s: row %d differs with the pages in another order", what, bad_order);
    for (int s = 0; s < c->n_seq; s++) {
        const pg_seq *sq = &c->seq[s];
        const int K = pg_keys(sq), r0 = r0s[s];
        pair one = act(sq->rows, oc, NULL);
        /* Alone, paged: its own list, n_keys its own. */
        ds_kv_pages pg1 = {.page_rows = c->page_rows, .table = a.table + a.list[s], .row_table = zeros,
                           .row_keys = c->row_keys ? rk + r0 : NULL};
        ds_attn_params p1 = p;
        p1.q_pos = pos + r0;
        p1.n_keys = K;
        p1.pages = &pg1;
        gpu->ops->attention(gpu, one.g, ds_rows(q.g, r0, sq->rows), a.k.g, a.v.g, &p1);
        float *r = fetch(gpu, one.g);
        const int bad_alone = rows_differ(all, r0, r, sq->rows, oc);
        CHECK(bad_alone < 0, "%s: sequence %d's row %d differs from its rows alone", what, s, bad_alone);
        free(r);
        /* Contiguous: a cache of its keys in position order. */
        pair kq = act(K, kc, kh[s]), vq = act(K, vc, vh[s]);
        if (dt != DS_F32) {
            pair k16 = cache_of(dt, &kq), v16 = cache_of(dt, &vq);
            release(&kq), release(&vq);
            kq = k16, vq = v16;
        }
        ds_attn_params p2 = p1;
        p2.pages = NULL;
        gpu->ops->attention(gpu, one.g, ds_rows(q.g, r0, sq->rows), kq.g, vq.g, &p2);
        r = fetch(gpu, one.g);
        const int bad_contig = rows_differ(all, r0, r, sq->rows, oc);
        CHECK(bad_contig < 0, "%s: sequence %d's row %d differs from its rows on a contiguous cache", what, s,
              bad_contig);
        free(r);
        release(&one), release(&kq), release(&vq);
    }
    check_gpu_ok(what);
    for (int s = 0; s < c->n_seq; s++) free(kh[s]), free(vh[s]);
    pg_pool_free(&a), pg_pool_free(&b);
    release(&q), release(&out), release(&out_b);
    free(all), free(other), free(pos), free(rt), free(rk), free(zeros);
}

static void test_paged_attention(void) {
    static const pg_case cases[] = {
        {"decode: 5 seqs x 1 row, D=128 GQA 8/2, pages of 16", 8, 2, 128, 128, true, false, 0, 16, 5,
         {{39, 1, 0}, {299, 1, 0}, {699, 1, 0}, {0, 1, 0}, {256, 1, 0}}},
        {"decode: 12 seqs x 1 row, D=128 GQA 32/8, pages of 16", 32, 8, 128, 128, true, false, 0, 16, 12,
         {{5, 1, 0}, {17, 1, 0}, {255, 1, 0}, {256, 1, 0}, {511, 1, 0}, {1000, 1, 0}, {64, 1, 0}, {1, 1, 0},
          {300, 1, 0}, {90, 1, 0}, {770, 1, 0}, {33, 1, 0}}},
        {"verify: 3 seqs x 8 rows, D=64 GQA 4/2, pages of 16", 4, 2, 64, 64, true, false, 0, 16, 3,
         {{3, 8, 0}, {250, 8, 0}, {700, 8, 0}}},
        {"verify 8 + prefill 70 + decode 1, D=128 8/2, pages of 32", 8, 2, 128, 128, true, false, 0, 32, 3,
         {{500, 8, 0}, {100, 70, 0}, {40, 1, 0}}},
        {"prefill 64 rows at 0 and 40 rows at 300, D=128 16/4, pages of 16", 16, 4, 128, 128, true, false, 0, 16, 2,
         {{0, 64, 0}, {300, 40, 0}}},
        {"pages of 24 (across chunks), D=128 16/8, verify + decode", 16, 8, 128, 128, true, false, 0, 24, 3,
         {{250, 8, 0}, {530, 3, 0}, {20, 1, 0}}},
        {"drafter blocks: non-causal, row_keys 300/40/7, D=128 8/2", 8, 2, 128, 128, false, true, 0, 16, 3,
         {{293, 7, 300}, {33, 7, 40}, {0, 7, 7}}},
        {"non-causal row_keys, a 40-row run + 5 rows, D=64 Dv=32", 4, 2, 64, 32, false, true, 0, 16, 2,
         {{50, 40, 90}, {0, 5, 20}}},
        {"causal, row_keys below some positions, D=64 4/4", 4, 4, 64, 64, true, true, 0, 8, 3,
         {{100, 4, 90}, {50, 2, 60}, {10, 3, 0}}},
        {"window 100: prefill 40 + verify 5 + decode 3, D=64 4/2", 4, 2, 64, 64, true, false, 100, 16, 3,
         {{300, 40, 0}, {150, 5, 0}, {20, 3, 0}}},
        {"D=256: verify 6 + decode 1 + 4 rows, pages of 8", 4, 2, 256, 256, true, false, 0, 8, 3,
         {{300, 6, 0}, {10, 1, 0}, {100, 4, 0}}},
        {"D=512: prefill 36 + verify 2 + decode 1, pages of 16", 2, 1, 512, 512, true, false, 0, 16, 3,
         {{10, 36, 0}, {600, 2, 0}, {3, 1, 0}}},
        {"D=256 window 100 (a sliding layer): prefill 36 + verify 4 + decode 1", 8, 4, 256, 256, true, false, 100,
         16, 3, {{400, 36, 0}, {250, 4, 0}, {60, 1, 0}}},
        {"pages of 1, D=32 4/1", 4, 1, 32, 32, true, false, 0, 1, 3, {{30, 3, 0}, {5, 2, 0}, {280, 1, 0}}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        paged_case(&cases[i], DS_F32);
        paged_case(&cases[i], DS_BF16); /* the batched engine's caches at real shapes */
    }
}

/* qk_norm_rope_attention on paged caches (the norms, one launch storing the
 * step's K/V rows through the pages, paged attention) against
 * ds_qk_norm_rope_then_attention on the GPU, bit for bit (output and both
 * pools), and against the CPU's within attention's bound. */
static void paged_norm_rope_case(const pg_case *c) {
    const int kc = c->KVH * c->D, qc = c->H * c->D;
    float *kh[PG_MAX_SEQ], *vh[PG_MAX_SEQ];
    int M = 0, n_keys = 0, r0s[PG_MAX_SEQ];
    for (int s = 0; s < c->n_seq; s++) {
        const int K = pg_keys(&c->seq[s]);
        kh[s] = rand_vec((size_t)K * kc, 1.0f);
        vh[s] = rand_vec((size_t)K * kc, 1.0f);
        r0s[s] = M;
        M += c->seq[s].rows;
        if (K > n_keys) n_keys = K;
    }
    pg_pool pl = pg_pool_make(c, kh, vh);
    pair kb = act(pl.rows, kc, pl.kh), vb = act(pl.rows, kc, pl.vh); /* a second pool, the same values */
    int32_t *pos = malloc((size_t)M * sizeof *pos), *rt = malloc((size_t)M * sizeof *rt);
    for (int s = 0; s < c->n_seq; s++)
        for (int i = 0; i < c->seq[s].rows; i++) pos[r0s[s] + i] = c->seq[s].pos0 + i, rt[r0s[s] + i] = pl.list[s];
    float *qv = rand_vec((size_t)M * qc, 3.0f), *kv = rand_vec((size_t)M * kc, 2.0f);
    float *vv = rand_vec((size_t)M * kc, 1.0f);
    pair qa = act(M, qc, qv), qb = act(M, qc, qv), ka = act(M, kc, kv), k2 = act(M, kc, kv), v = act(M, kc, vv);
    pair qw = weight(DS_BF16, 1, c->D), kw = weight(DS_F32, 1, c->D);
    pair outa = act(M, qc, NULL), outb = act(M, qc, NULL);
    float *inv = malloc((size_t)(c->D / 2) * sizeof *inv);
    for (int i = 0; i < c->D / 2; i++) inv[i] = (float)(1.0 / pow(1e6, (double)(2 * i) / c->D));
    ds_kv_pages pg = {.page_rows = c->page_rows, .table = pl.table, .row_table = rt};
    ds_attn_params p = {.n_heads = c->H, .n_kv_heads = c->KVH, .head_dim = c->D, .v_head_dim = c->D,
                        .n_keys = n_keys, .causal = true, .scale = 1.0f / sqrtf((float)c->D), .q_pos = pos,
                        .pages = &pg};
    gpu->ops->qk_norm_rope_attention(gpu, outa.g, qa.g, qw.g, ka.g, kw.g, v.g, pl.k.g, pl.v.g, c->D, 1e-6f, inv, &p);
    ds_qk_norm_rope_then_attention(gpu, outb.g, qb.g, qw.g, k2.g, kw.g, v.g, kb.g, vb.g, c->D, 1e-6f, inv, &p);
    ds_qk_norm_rope_attention(cpu, outa.c, qa.c, qw.c, ka.c, kw.c, v.c, pl.k.c, pl.v.c, c->D, 1e-6f, inv, &p);
    char what[160];
    snprintf(what, sizeof what, "paged qk_norm_rope_attention %s", c->name);
    compare(outa.g, outa.c, 2e-5, what);
    const ds_tensor ga[3] = {outa.g, pl.k.g, pl.v.g}, gb[3] = {outb.g, kb.g, vb.g};
    const char *names[3] = {"output", "K pool", "V pool"};
    for (int t = 0; t < 3; t++) {
        float *x = fetch(gpu, ga[t]), *y = fetch(gpu, gb[t]);
        CHECK(!memcmp(x, y, (size_t)(ga[t].rows * ga[t].cols) * 4), "%s: %s differs from the two ops'", what,
              names[t]);
        free(x), free(y);
    }
    check_gpu_ok(what);
    for (int s = 0; s < c->n_seq; s++) free(kh[s]), free(vh[s]);
    pg_pool_free(&pl);
    pair *ps[] = {&kb, &vb, &qa, &qb, &ka, &k2, &v, &qw, &kw, &outa, &outb};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) release(ps[i]);
    free(pos), free(rt), free(qv), free(kv), free(vv), free(inv);
}

static void test_paged_norm_rope_attention(void) {
    static const pg_case cases[] = {
        {"decode 4 seqs, D=128 32/8, pages of 16", 32, 8, 128, 128, true, false, 0, 16, 4,
         {{40, 1, 0}, {300, 1, 0}, {0, 1, 0}, {700, 1, 0}}},
        {"verify 8 + 8 + decode 1, D=128 16/4, pages of 16", 16, 4, 128, 128, true, false, 0, 16, 3,
         {{250, 8, 0}, {3, 8, 0}, {90, 1, 0}}},
        {"prefill 40 + verify 4, D=64 4/2, pages of 24", 4, 2, 64, 64, true, false, 0, 24, 2,
         {{100, 40, 0}, {7, 4, 0}}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) paged_norm_rope_case(&cases[i]);
}

/* A page table naming a page past the pool is refused, naming the op (the
 * kernels would read outside the cache). */
static void test_paged_bad_table(void) {
    pair q = act_rand(2, 64, 1.0f), k = act_rand(32, 64, 1.0f), v = act_rand(32, 64, 1.0f), out = act(2, 64, NULL);
    const int32_t table[] = {1, 3, 9}, rt[] = {0, 0}, pos[] = {20, 21};
    const ds_kv_pages pg = {.page_rows = 8, .table = table, .row_table = rt};
    ds_attn_params p = {.n_heads = 1, .n_kv_heads = 1, .head_dim = 64, .v_head_dim = 64, .n_keys = 22,
                        .causal = true, .scale = 0.125f, .q_pos = pos, .pages = &pg};
    gpu->ops->attention(gpu, out.g, q.g, k.g, v.g, &p);
    CHECK_ERR(ds_backend_check(gpu), "page table entry 2 is page 9 of a pool of 4");
    release(&q), release(&k), release(&v), release(&out);
}

/* A pair of dt tensors holding pair src's values rounded (the copy op: copy_cast_kernel on the GPU). */

/* K/V caches in bf16 / f16 (the model's dtype, model/kv_cache.h): the copy
 * op's rounding into them equals the CPU's bit for bit (and back out);
 * attention over them (the chunk kernel and the tiled prefill kernel with
 * KB = 2, contiguous and paged) against the CPU's within 2e-5; the q/k norm
 * + RoPE + store into them (rmsnorm_rope_kernel's 16-bit stores; the fused
 * launch is fp32-only, so the two ops run) against the CPU's, the caches
 * after it within one rounding step. */
static void test_kv_dtype_caches(void) {
    static const struct {
        int H, KVH, D, p0, M, window, ring, paged;
    } cases[] = {
        {8, 2, 128, 300, 1, 0, 0, 0},  /* decode across chunks of 256 */
        {8, 2, 128, 60, 8, 0, 0, 0},   /* verify */
        {4, 2, 64, 0, 40, 0, 0, 0},    /* prefill: the tiled kernel */
        {4, 2, 256, 50, 3, 16, 24, 0}, /* sliding window over a ring */
        {4, 2, 64, 37, 4, 0, 0, 1},    /* paged, decode / verify rows */
        {4, 2, 64, 0, 40, 0, 0, 1},    /* paged prefill run */
    };
    const ds_dtype dts[2] = {DS_BF16, DS_F16};
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            const int H = cases[i].H, KVH = cases[i].KVH, D = cases[i].D, M = cases[i].M, n = cases[i].p0 + M;
            const int ring = cases[i].ring, rows = ring ? ring : (n + 15) / 16 * 16;
            char what[128];
            snprintf(what, sizeof what, "%s cache, D=%d, %d rows at %d%s%s", ds_dtype_name(dts[t]), D, M,
                     cases[i].p0, ring ? ", ring" : "", cases[i].paged ? ", paged" : "");
            pair k32 = act_rand(rows, (int64_t)KVH * D, 1.0f), v32 = act_rand(rows, (int64_t)KVH * D, 1.0f);
            pair kc = cache_of(dts[t], &k32), vc = cache_of(dts[t], &v32);
            pair back = act(rows, (int64_t)KVH * D, NULL);
            gpu->ops->copy(gpu, back.g, kc.g);
            cpu->ops->copy(cpu, back.c, kc.c);
            compare(back.g, back.c, 0.0, what); /* the same rounding, bit for bit */
            pair q = act_rand(M, (int64_t)H * D, 1.0f), out = act(M, (int64_t)H * D, NULL);
            int32_t pos[64], table[64], rt[64];
            const int pages = rows / 16;
            for (int j = 0; j < M; j++) pos[j] = cases[i].p0 + j, rt[j] = 0;
            for (int j = 0; j < pages; j++) table[j] = pages - 1 - j;
            const ds_kv_pages pg = {.page_rows = 16, .table = table, .row_table = rt};
            ds_attn_params p = {.n_heads = H, .n_kv_heads = KVH, .head_dim = D, .v_head_dim = D, .n_keys = n,
                                .causal = true, .window = cases[i].window, .ring_size = ring,
                                .scale = 1.0f / sqrtf((float)D), .q_pos = pos, .pages = cases[i].paged ? &pg : NULL};
            gpu->ops->attention(gpu, out.g, q.g, kc.g, vc.g, &p);
            cpu->ops->attention(cpu, out.c, q.c, kc.c, vc.c, &p);
            compare(out.g, out.c, 2e-5, what);
            if (!ring) { /* the step's K/V normed, rotated and stored into the 16-bit caches, then attended */
                pair k = act_rand(M, (int64_t)KVH * D, 1.0f), v = act_rand(M, (int64_t)KVH * D, 1.0f);
                pair qw = weight(DS_BF16, 1, D), kw = weight(DS_BF16, 1, D);
                float *inv = rand_vec((size_t)D / 2, 0.5f);
                ds_qk_norm_rope_attention(gpu, out.g, q.g, qw.g, k.g, kw.g, v.g, kc.g, vc.g, D, 1e-6f, inv, &p);
                ds_qk_norm_rope_attention(cpu, out.c, q.c, qw.c, k.c, kw.c, v.c, kc.c, vc.c, D, 1e-6f, inv, &p);
                compare(out.g, out.c, 2e-5, what);
                gpu->ops->copy(gpu, back.g, kc.g);
                cpu->ops->copy(cpu, back.c, kc.c);
                compare(back.g, back.c, dts[t] == DS_BF16 ? 1e-2 : 2e-3, what); /* a rounding step apart at most */
                free(inv);
                release(&k), release(&v), release(&qw), release(&kw);
            }
            check_gpu_ok(what);
            release(&k32), release(&v32), release(&kc), release(&vc), release(&back), release(&q), release(&out);
        }
}

RUN_CUDA_TESTS("cuda_attention", test_attention, test_norm_rope_attention, test_paged_attention,
               test_paged_norm_rope_attention, test_paged_bad_table, test_kv_dtype_caches)
