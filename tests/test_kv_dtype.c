/* K/V caches in the model's dtype (model/kv_cache.h) on the CPU backend:
 * the dtype a config names; a store rounds each element to nearest even
 * (copy, the row stores of ds_store_rows_paged); attention over a bf16 /
 * f16 cache gives the bits of attention over an fp32 cache holding the
 * rounded keys and values (contiguous, ring, window, paged, non-causal,
 * a value head that is not a multiple of 64), row by row invariant; and a
 * position's bytes halve for a bf16 model (pico, a Qwen3-8B config). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "model/kv_cache.h"
#include "model/target.h"
#include "testlib.h"

static ds_backend *be;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-2, 2) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (4.0 / 16777216.0) - 2.0);
}

static ds_tensor tensor(ds_dtype dt, int64_t rows, int64_t cols) {
    ds_tensor t = ds_no_tensor();
    ds_error *e = be->ops->alloc(be, dt, rows, cols, &t);
    CHECK(!e, "alloc %lld x %lld", (long long)rows, (long long)cols);
    ds_error_free(e);
    return t;
}

/* fp32 into bf16 / f16 through copy: each element as ds_f32_to_bf16 /
 * ds_f32_to_f16 round it (ties to even, NaN kept, f16 overflow to inf); and
 * back to fp32 exactly. */
static void test_copy_rounds(void) {
    enum { N = 37 };
    float src[2 * N];
    for (int i = 0; i < 2 * N; i++) src[i] = frand() * (i % 5 == 0 ? 1e5f : 1.0f);
    src[0] = 1.0f + 0x1p-8f;       /* a bf16 tie: to even (1.0) */
    src[1] = 1.0f + 3 * 0x1p-8f;   /* a tie the other way (1 + 2^-6) */
    src[2] = NAN, src[3] = -INFINITY, src[4] = 70000.0f; /* f16: inf */
    src[5] = 1e-6f;                /* an f16 subnormal */
    const ds_dtype dts[2] = {DS_BF16, DS_F16};
    for (int k = 0; k < 2; k++) {
        ds_tensor f = tensor(DS_F32, 2, N), h = tensor(dts[k], 2, N), back = tensor(DS_F32, 2, N);
        be->ops->upload(be, f, src);
        be->ops->copy(be, h, f);
        be->ops->copy(be, back, h);
        const uint16_t *hv = h.data;
        int bad = -1;
        for (int i = 0; i < 2 * N && bad < 0; i++) {
            const uint16_t want = k ? ds_f32_to_f16(src[i]) : ds_f32_to_bf16(src[i]);
            const float wide = k ? ds_f16_to_f32(want) : ds_bf16_to_f32(want);
            const float got = ((const float *)back.data)[i];
            if (hv[i] != want || (memcmp(&got, &wide, 4) && !(isnan(got) && isnan(wide)))) bad = i;
        }
        CHECK(bad < 0, "%s: element %d of %g stored as %04x", ds_dtype_name(dts[k]), bad, bad >= 0 ? src[bad] : 0.0,
              bad >= 0 ? hv[bad] : 0);
        CHECK(hv[0] == 0x3f80 || k, "bf16(1 + 2^-8) = %04x, not 3f80 (ties to even)", hv[0]);
        CHECK(hv[4] == 0x7c00 || !k, "f16(70000) = %04x, not inf", hv[4]);
        be->ops->release(be, &f);
        be->ops->release(be, &h);
        be->ops->release(be, &back);
    }
}

typedef struct {
    const char *name;
    int H, KVH, D, Dv;
    bool causal;
    int window, ring, paged;
    int p0, M, n_keys; /* rows at p0 .. p0+M-1; non-causal: keys every row sees */
} acase;

/* One case in dtype dt: the fp32 K/V go into a dt cache through the row
 * stores (ds_store_rows_paged, copy); an fp32 cache gets the same values
 * rounded on the host. The outputs must be the same bits, each row alone
 * too; and near the unrounded fp32 cache's (the rounding is small, and
 * not nothing). */
static void attention_case(const acase *c, ds_dtype dt) {
    const int n_pos = c->causal ? c->p0 + c->M : c->n_keys;
    const int page_rows = 16, seqs = c->paged ? 2 : 1;
    const int pages_per = (n_pos + page_rows - 1) / page_rows;
    const int64_t rows = c->paged ? (int64_t)seqs * pages_per * page_rows : c->ring ? c->ring : n_pos;
    const int64_t kd = (int64_t)c->KVH * c->D, vd = (int64_t)c->KVH * c->Dv;
    const int M = c->M * seqs; /* paged: every row once per sequence */
    ds_tensor q = tensor(DS_F32, M, (int64_t)c->H * c->D);
    ds_tensor kc = tensor(dt, rows, kd), vc = tensor(dt, rows, vd);
    ds_tensor kr = tensor(DS_F32, rows, kd), vr = tensor(DS_F32, rows, vd); /* fp32, rounded values */
    ds_tensor kf = tensor(DS_F32, rows, kd), vf = tensor(DS_F32, rows, vd); /* fp32, as computed */
    ds_tensor out[3] = {tensor(DS_F32, M, (int64_t)c->H * c->Dv), tensor(DS_F32, M, (int64_t)c->H * c->Dv),
                        tensor(DS_F32, M, (int64_t)c->H * c->Dv)};
    ds_tensor one = tensor(DS_F32, 1, (int64_t)c->H * c->Dv);
    int32_t *table = malloc((size_t)(seqs * pages_per) * sizeof *table), row_table[2 * 64], qpos[2 * 64];
    for (int i = 0; i < seqs * pages_per; i++) table[i] = seqs * pages_per - 1 - i; /* pages out of order */
    ds_kv_pages pg = {.page_rows = page_rows, .table = table, .row_table = row_table, .row_keys = NULL};
    /* Every position's K/V (of each sequence), stored a sequence at a time as a forward stores its rows. */
    int32_t *spos = malloc((size_t)n_pos * sizeof *spos), *srt = malloc((size_t)n_pos * sizeof *srt);
    ds_tensor k = tensor(DS_F32, n_pos, kd), v = tensor(DS_F32, n_pos, vd);
    for (int s = 0; s < seqs; s++) {
        float *kh = k.data, *vh = v.data;
        for (int64_t i = 0; i < n_pos * kd; i++) kh[i] = frand();
        for (int64_t i = 0; i < n_pos * vd; i++) vh[i] = frand();
        for (int i = 0; i < n_pos; i++) spos[i] = i, srt[i] = s * pages_per;
        const ds_kv_pages sp = {.page_rows = page_rows, .table = table, .row_table = srt};
        const int from = c->ring && n_pos > c->ring ? n_pos - c->ring : 0; /* a ring keeps the last ring rows */
        ds_tensor ks = ds_rows(k, from, n_pos - from), vs = ds_rows(v, from, n_pos - from);
        ds_store_rows_paged(be, kc, ks, c->ring, spos + from, c->paged ? &sp : NULL);
        ds_store_rows_paged(be, vc, vs, c->ring, spos + from, c->paged ? &sp : NULL);
        ds_store_rows_paged(be, kf, ks, c->ring, spos + from, c->paged ? &sp : NULL);
        ds_store_rows_paged(be, vf, vs, c->ring, spos + from, c->paged ? &sp : NULL);
    }
    /* The rounded fp32 copies: the fp32 caches' values, rounded on the host. */
    for (int t = 0; t < 2; t++) {
        const ds_tensor *src = t ? &vf : &kf, *dst = t ? &vr : &kr;
        const int64_t n = src->rows * src->cols;
        for (int64_t i = 0; i < n; i++) {
            const float x = ((const float *)src->data)[i];
            ((float *)dst->data)[i] =
                dt == DS_BF16 ? ds_bf16_to_f32(ds_f32_to_bf16(x)) : ds_f16_to_f32(ds_f32_to_f16(x));
        }
    }
    for (int64_t i = 0; i < q.rows * q.cols; i++) ((float *)q.data)[i] = frand();
    for (int s = 0; s < seqs; s++)
        for (int i = 0; i < c->M; i++) qpos[s * c->M + i] = c->p0 + i, row_table[s * c->M + i] = s * pages_per;
    ds_attn_params p = {.n_heads = c->H, .n_kv_heads = c->KVH, .head_dim = c->D, .v_head_dim = c->Dv,
                        .n_keys = n_pos, .causal = c->causal, .window = c->window, .ring_size = c->ring,
                        .scale = 1.0f / sqrtf((float)c->D), .q_pos = qpos, .pages = c->paged ? &pg : NULL};
    be->ops->attention(be, out[0], q, kc, vc, &p);
    be->ops->attention(be, out[1], q, kr, vr, &p);
    be->ops->attention(be, out[2], q, kf, vf, &p);
    const size_t n = (size_t)(M * out[0].cols);
    CHECK(!memcmp(out[0].data, out[1].data, n * 4), "%s, %s cache: attention differs from fp32 over rounded K/V",
          c->name, ds_dtype_name(dt));
    const double err = rel_err_max(out[0].data, out[2].data, n);
    CHECK(err > 0 && err < (dt == DS_BF16 ? 1e-1 : 1e-2), "%s, %s cache: %g from the unrounded fp32 cache's", c->name,
          ds_dtype_name(dt), err);
    int bad = -1;
    for (int i = 0; i < M && bad < 0; i++) {
        ds_attn_params p1 = p;
        p1.q_pos = qpos + i;
        const int32_t rt = row_table[i];
        ds_kv_pages pg1 = pg;
        pg1.row_table = &rt;
        if (c->paged) p1.pages = &pg1;
        be->ops->attention(be, one, ds_rows(q, i, 1), kc, vc, &p1);
        if (memcmp(one.data, (const float *)out[0].data + (size_t)i * out[0].cols, (size_t)one.cols * 4)) bad = i;
    }
    CHECK(bad < 0, "%s, %s cache: row %d of the call differs from the row alone", c->name, ds_dtype_name(dt), bad);
    CHECK_OK(ds_backend_check(be));
    ds_tensor all[] = {q, kc, vc, kr, vr, kf, vf, out[0], out[1], out[2], one, k, v};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) be->ops->release(be, &all[i]);
    free(table);
    free(spos);
    free(srt);
}

static void test_attention_over_rounded(void) {
    static const acase cases[] = {
        {"decode D=64 GQA 4/2", 4, 2, 64, 64, true, 0, 0, 0, 40, 1, 0},
        {"verify D=128 8/2, 9 rows", 8, 2, 128, 128, true, 0, 0, 0, 70, 9, 0},
        {"prefill D=80 (a 16-column value tail) 4/1, 40 rows", 4, 1, 80, 80, true, 0, 0, 0, 0, 40, 0},
        {"sliding window 24, ring 40", 4, 2, 32, 32, true, 24, 40, 0, 60, 5, 0},
        {"paged, 2 sequences, D=64", 4, 2, 64, 64, true, 0, 0, 1, 37, 4, 0},
        {"non-causal block, 12 keys", 4, 2, 64, 64, false, 0, 0, 0, 12, 6, 12},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        attention_case(&cases[i], DS_BF16);
        attention_case(&cases[i], DS_F16);
    }
}

/* A scratch model directory holding only config.json with text. */
static void with_config(const char *text, ds_error **e, int64_t *bytes) {
    char dir[] = "/tmp/ds_kv_dtype_XXXXXX", path[64];
    *bytes = -1;
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
    *e = ds_target_kv_row_bytes(dir, bytes);
    remove(path);
    rmdir(dir);
}

/* Bytes a position takes, from configs: Qwen3-8B's (36 layers x K and V
 * x 8 KV heads x 128) in bf16 is half its fp32; "torch_dtype" counts as
 * "dtype"; none named is fp32; another dtype is refused, named. pico
 * (bfloat16) and the fp32 fixture at their dtypes. */
static void test_row_bytes(void) {
    static const char *const fmt =
        "{\"model_type\": \"qwen3\", \"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 151936, "
        "\"hidden_size\": 4096, \"num_hidden_layers\": 36, \"num_attention_heads\": 32, "
        "\"num_key_value_heads\": 8, \"head_dim\": 128, \"intermediate_size\": 12288, "
        "\"max_position_embeddings\": 40960%s}";
    static const struct {
        const char *extra;
        int64_t bytes;
    } cases[] = {
        {", \"torch_dtype\": \"bfloat16\"", 36 * 2 * 8 * 128 * 2}, /* 144 KiB */
        {", \"dtype\": \"bfloat16\"", 36 * 2 * 8 * 128 * 2},
        {", \"dtype\": \"float16\"", 36 * 2 * 8 * 128 * 2},
        {", \"dtype\": \"float32\"", 36 * 2 * 8 * 128 * 4}, /* 288 KiB */
        {"", 36 * 2 * 8 * 128 * 4},
        {", \"dtype\": null, \"torch_dtype\": \"bfloat16\"", 36 * 2 * 8 * 128 * 2},
    };
    char text[1024];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(text, sizeof text, fmt, cases[i].extra);
        ds_error *e = NULL;
        int64_t b;
        with_config(text, &e, &b);
        CHECK(!e && b == cases[i].bytes, "Qwen3-8B%s: %lld bytes a position (%s), expected %lld", cases[i].extra,
              (long long)b, e ? ds_error_message(e) : "ok", (long long)cases[i].bytes);
        ds_error_free(e);
    }
    snprintf(text, sizeof text, fmt, ", \"dtype\": \"float8_e4m3fn\"");
    ds_error *e = NULL;
    int64_t b;
    with_config(text, &e, &b);
    CHECK_ERR(e, "config field dtype = float8_e4m3fn is not supported (float32, bfloat16 or float16)");
    CHECK_OK(ds_target_kv_row_bytes(DS_MODELS "/pico-qwen3", &b));
    CHECK(b == 8 * 2 * 2 * 64 * 2, "pico: %lld bytes a position (bf16: 4096)", (long long)b);
    CHECK_OK(ds_target_kv_row_bytes(DS_TESTDATA "/fixtures/qwen3-tiny/target", &b));
    CHECK(b == 4 * 2 * 2 * 16 * 4, "qwen3-tiny: %lld bytes a position (fp32: 1024)", (long long)b);
}

/* The model-level rule, ds_kv_dtype_read: a wrapper's top level first, then its text_config. */
static void test_dtype_read(void) {
    cJSON *outer = cJSON_Parse("{\"dtype\": \"bfloat16\", \"text_config\": {\"dtype\": \"float32\"}}");
    cJSON *bare = cJSON_Parse("{\"text_config\": {\"torch_dtype\": \"float16\"}}");
    ds_dtype dt;
    CHECK_OK(ds_kv_dtype_read(outer, cJSON_GetObjectItem(outer, "text_config"), "outer", &dt));
    CHECK(dt == DS_BF16, "the top level's dtype first: %s", ds_dtype_name(dt));
    CHECK_OK(ds_kv_dtype_read(bare, cJSON_GetObjectItem(bare, "text_config"), "bare", &dt));
    CHECK(dt == DS_F16, "the text_config's where the top names none: %s", ds_dtype_name(dt));
    CHECK_OK(ds_kv_dtype_read(bare, NULL, "bare", &dt));
    CHECK(dt == DS_F32, "none named: fp32, not %s", ds_dtype_name(dt));
    cJSON_Delete(outer);
    cJSON_Delete(bare);
}

static void setup(void) { CHECK_OK(ds_backend_cpu_new(2, &be)); }
static void teardown(void) { be->ops->destroy(be); }

RUN_TESTS("kv_dtype", setup, test_copy_rounds, test_attention_over_rounded, test_row_bytes, test_dtype_read, teardown)
