/* STS calibration (SPEC §6): the metrics on hand-made rounds with numbers
 * worked out below, the fit recovering known temperatures, the temperature
 * file, the PNG encoder (decoded here by a small inflater of our own),
 * truncation under a temperature file (host and backend cut, and greedy
 * output unchanged), and `dspark calibrate` end to end on the pico pair. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/spec_ops.h"
#include "base/rng.h"
#include "draft/confidence.h"
#include "draft/sts_file.h"
#include "io/png_write.h"
#include "speculate/calibrate.h"
#include "testlib.h"

#define NEAR(a, b, tol) (fabs((a) - (b)) <= (tol))

static char tmp_dir[64];

static void path_in_tmp(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", tmp_dir, name); }

/* ---- metrics --------------------------------------------------------------- */

/* One position: 4 rounds at p = 0.5 (labels 1 1 1 0), 2 at 0.875 (1 1), 2
 * at 0.125 (0 1) (z = +-ln 7; no p on a bin edge). ECE = (0.25 * 4 + 0.125
 * * 2 + 0.375 * 2) / 8 = 0.25; Brier = (4 * 0.25 + 2 * 0.125^2 + 0.125^2 +
 * 0.875^2) / 8 = 0.2265625; AUROC: the two 0.875 positives outrank both
 * negatives (4 pairs), the three 0.5 positives outrank the 0.125 negative
 * (3) and tie the 0.5 one (1.5), the 0.125 positive ties the 0.125
 * negative (0.5): 9 of 6 * 2 = 0.75. At temperature 2 the 0.875 and 0.125
 * become a = sqrt 7 / (1 + sqrt 7) = 0.7257 and 1 - a (bins 14 and 5): ECE
 * (1 + 2 (1 - a) + 2 |1 - a - 0.5|) / 8 = 0.25 again, Brier (1 + 3 (1 -
 * a)^2 + a^2) / 8, the ranking unchanged. */
static void test_metrics_one_position(void) {
    ds_cal_rounds r;
    CHECK_OK(ds_cal_rounds_init(&r, 1));
    const float l7 = logf(7.0f);
    const struct {
        float z;
        int accepted;
    } rows[] = {{0, 1}, {0, 1}, {0, 1}, {0, 0}, {l7, 1}, {l7, 1}, {-l7, 0}, {-l7, 1}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) CHECK_OK(ds_cal_rounds_add(&r, &rows[i].z, 1, rows[i].accepted));
    ds_cal_metrics m;
    CHECK_OK(ds_cal_evaluate(&r, NULL, &m));
    CHECK(m.n == 8, "n %ld", m.n);
    CHECK(NEAR(m.ece, 0.25, 1e-6), "ece %.9f", m.ece);
    CHECK(NEAR(m.brier, 0.2265625, 1e-6), "brier %.9f", m.brier);
    CHECK(NEAR(m.auroc, 0.75, 1e-12), "auroc %.9f", m.auroc);
    CHECK(NEAR(m.pred_mean, 0.5, 1e-6) && NEAR(m.target_mean, 0.75, 1e-12), "means %f %f", m.pred_mean, m.target_mean);
    CHECK(m.bin_n[10] == 4 && m.bin_n[17] == 2 && m.bin_n[2] == 2 && m.bin_target[2] == 1, "bins %g %g %g",
          m.bin_n[10], m.bin_n[17], m.bin_n[2]);
    const float two = 2.0f;
    const double a = sqrt(7.0) / (1 + sqrt(7.0));
    CHECK_OK(ds_cal_evaluate(&r, &two, &m));
    CHECK(NEAR(m.ece, 0.25, 1e-6), "ece at s=2 %.9f", m.ece);
    CHECK(NEAR(m.brier, (1 + 3 * (1 - a) * (1 - a) + a * a) / 8, 1e-6), "brier at s=2 %.9f", m.brier);
    CHECK(NEAR(m.auroc, 0.75, 1e-12), "auroc at s=2 %.9f", m.auroc);
    CHECK(m.bin_n[14] == 2 && m.bin_n[5] == 2, "bins at s=2 %g %g", m.bin_n[14], m.bin_n[5]);
    ds_cal_rounds_free(&r);
}

/* Two positions: the cumulative product, the clamp and the labelled length.
 *   A: z (0, 0)       len 2, accepted 2: P = 0.5 (y 1), 0.25 (y 1)
 *   B: z (0, +inf)    len 2, accepted 1: P = 0.5 (y 1), 0.5 (y 0)
 *   C: z (0, -inf)    len 1, accepted 1: P = 0.5 (y 1); position 1 has no label
 *   D: z (-inf, 0)    len 2, accepted 0: P = 0 -> 1e-8 (y 0), 0 -> 1e-8 (y 0)
 *   E: len 0: no sample at all.
 * Position 0: ECE (3 * 0.5 + 1e-8) / 4, Brier (3 * 0.25 + 1e-16) / 4, AUROC 1.
 * Position 1: bins 5, 10, 0: ECE (0.75 + 0.5 + 1e-8) / 3, Brier (0.5625 +
 * 0.25 + 1e-16) / 3, AUROC: the positive beats one negative of two, 0.5. */
static void test_metrics_cumulative(void) {
    ds_cal_rounds r;
    CHECK_OK(ds_cal_rounds_init(&r, 2));
    const float A[2] = {0, 0}, B[2] = {0, INFINITY}, C[2] = {0, -INFINITY}, D[2] = {-INFINITY, 0}, E[2] = {0, 0};
    CHECK_OK(ds_cal_rounds_add(&r, A, 2, 2));
    CHECK_OK(ds_cal_rounds_add(&r, B, 2, 1));
    CHECK_OK(ds_cal_rounds_add(&r, C, 1, 1));
    CHECK_OK(ds_cal_rounds_add(&r, D, 2, 0));
    CHECK_OK(ds_cal_rounds_add(&r, E, 0, 0));
    CHECK(r.n == 4, "rounds kept %ld (the empty one is skipped)", r.n);
    ds_cal_metrics m[2];
    CHECK_OK(ds_cal_evaluate(&r, NULL, m));
    CHECK(m[0].n == 4 && m[1].n == 3, "n %ld %ld", m[0].n, m[1].n);
    CHECK(NEAR(m[0].ece, (1.5 + 1e-8) / 4, 1e-15), "ece0 %.17g", m[0].ece);
    CHECK(NEAR(m[0].brier, (0.75 + 1e-16) / 4, 1e-15), "brier0 %.17g", m[0].brier);
    CHECK(m[0].auroc == 1.0, "auroc0 %.17g", m[0].auroc);
    CHECK(NEAR(m[1].ece, (1.25 + 1e-8) / 3, 1e-15), "ece1 %.17g", m[1].ece);
    CHECK(NEAR(m[1].brier, (0.8125 + 1e-16) / 3, 1e-15), "brier1 %.17g", m[1].brier);
    CHECK(m[1].auroc == 0.5, "auroc1 %.17g", m[1].auroc);
    /* One label only: no AUROC; no samples: nothing. */
    ds_cal_rounds one;
    CHECK_OK(ds_cal_rounds_init(&one, 2));
    CHECK_OK(ds_cal_rounds_add(&one, A, 1, 1));
    CHECK_OK(ds_cal_evaluate(&one, NULL, m));
    CHECK(m[0].n == 1 && isnan(m[0].auroc) && NEAR(m[0].ece, 0.5, 0), "one label: n %ld auroc %g", m[0].n, m[0].auroc);
    CHECK(m[1].n == 0 && isnan(m[1].ece) && isnan(m[1].brier), "no samples: n %ld ece %g", m[1].n, m[1].ece);
    ds_cal_rounds_free(&one);
    /* Bad rounds are refused, by name. */
    const float nan2[2] = {NAN, 0};
    CHECK_ERR(ds_cal_rounds_add(&r, nan2, 2, 0), "confidence logit 0 is NaN");
    CHECK_ERR(ds_cal_rounds_add(&r, A, 2, 3), "3 drafts accepted of a proposal of 2");
    CHECK_ERR(ds_cal_rounds_add(&r, A, 3, 0), "proposal of 3 (of 2 positions)");
    ds_cal_rounds_free(&r);
    CHECK_ERR(ds_cal_rounds_init(&r, 0), "0 confidence logits per round");
}

/* ---- the fit ------------------------------------------------------------ */

/* Rounds whose acceptance follows sigmoid(z_k / s_k) exactly (each position
 * accepted independently given the logits, the prefix until the first
 * rejection): the fit must find s_k near the true ones, and the calibrated
 * products must have a small ECE on fresh rounds of the same law. */
static void synth_rounds(ds_cal_rounds *r, const float *s_true, int gamma, long n, uint64_t seed) {
    ds_rng rng;
    ds_rng_seed(&rng, seed);
    for (long i = 0; i < n; i++) {
        float z[4];
        int accepted = gamma;
        for (int k = 0; k < gamma; k++) {
            z[k] = (float)(ds_rng_uniform(&rng) * 10.0 - 3.0); /* mostly confident, as heads are */
            const double q = 1.0 / (1.0 + exp(-(double)z[k] / s_true[k]));
            if (accepted == gamma && ds_rng_uniform(&rng) >= q) accepted = k;
        }
        ds_error *e = ds_cal_rounds_add(r, z, gamma, accepted);
        if (e) {
            CHECK(0, "%s", ds_error_message(e));
            ds_error_free(e);
            return;
        }
    }
}

static void test_sts_recovers_temperatures(void) {
    const int G = 3;
    const float s_true[3] = {0.5f, 2.0f, 1.3f};
    ds_cal_rounds cal, fresh;
    CHECK_OK(ds_cal_rounds_init(&cal, G));
    CHECK_OK(ds_cal_rounds_init(&fresh, G));
    synth_rounds(&cal, s_true, G, 40000, 7);
    synth_rounds(&fresh, s_true, G, 40000, 8);
    float s[3];
    CHECK_OK(ds_sts_fit(&cal, s));
    ds_cal_metrics before[3], after[3];
    CHECK_OK(ds_cal_evaluate(&fresh, NULL, before));
    CHECK_OK(ds_cal_evaluate(&fresh, s, after));
    for (int k = 0; k < G; k++) {
        fprintf(stderr, "  k=%d: s %.4f (true %.2f), fresh ECE %.4f -> %.4f\n", k, s[k], s_true[k], before[k].ece,
                after[k].ece);
        CHECK(fabsf(logf(s[k] / s_true[k])) < 0.1f, "position %d: fitted s %.4f, true %.2f", k, s[k], s_true[k]);
        CHECK(after[k].ece < 0.01, "position %d: ECE after %.4f on fresh rounds", k, after[k].ece);
        CHECK(before[k].ece > 2 * after[k].ece, "position %d: ECE %.4f before, %.4f after", k, before[k].ece,
              after[k].ece);
    }
    /* Already calibrated (s = 1 is the law): the fit stays near 1. */
    const float ones[3] = {1, 1, 1};
    ds_cal_rounds_free(&cal);
    CHECK_OK(ds_cal_rounds_init(&cal, G));
    synth_rounds(&cal, ones, G, 40000, 9);
    CHECK_OK(ds_sts_fit(&cal, s));
    for (int k = 0; k < G; k++) CHECK(fabsf(logf(s[k])) < 0.1f, "calibrated law: position %d fitted %.4f", k, s[k]);
    /* A position without samples keeps 1. */
    ds_cal_rounds short_r;
    CHECK_OK(ds_cal_rounds_init(&short_r, 2));
    const float z[2] = {3, 3};
    for (int i = 0; i < 10; i++) CHECK_OK(ds_cal_rounds_add(&short_r, z, 1, i % 2));
    CHECK_OK(ds_sts_fit(&short_r, s));
    CHECK(s[1] == 1.0f, "no samples at position 1: s %g", s[1]);
    ds_cal_rounds_free(&short_r);
    ds_cal_rounds_free(&cal);
    ds_cal_rounds_free(&fresh);
}

/* ---- the calibrated confidence and the cutoffs ---------------------------- */

static void test_conf_prob_and_cutoff(void) {
    /* s = 1 is the head as it is, bit for bit. */
    for (float c = -20; c <= 20; c += 0.37f) {
        CHECK(ds_conf_prob(c, 1.0f) == 1.0f / (1.0f + expf(-c)), "ds_conf_prob(%g, 1)", c);
        CHECK(ds_conf_below_at(c, 1.0f, 0.6f) == ds_conf_below(c, 0.6f), "ds_conf_below_at(%g, 1, 0.6)", c);
    }
    CHECK(ds_conf_prob(logf(9.0f), 2.0f) > 0.7499f && ds_conf_prob(logf(9.0f), 2.0f) < 0.7501f, "sigmoid(ln 9 / 2)");
    /* The cutoff decides as the predicate does, at the cutoff and beside it. */
    const float temps[] = {0.25f, 0.7f, 1.0f, 1.9f, 8.0f}, ts[] = {0.05f, 0.3f, 0.5f, 0.77f, 0.99f, 1.0f};
    for (size_t i = 0; i < sizeof temps / sizeof *temps; i++)
        for (size_t j = 0; j < sizeof ts / sizeof *ts; j++) {
            const float s = temps[i], t = ts[j], cut = ds_conf_cutoff_at(t, s);
            const float probes[] = {cut, nextafterf(cut, -INFINITY), nextafterf(cut, INFINITY), cut * 0.5f, cut * 2.0f,
                                    -100.0f, 100.0f};
            for (size_t p = 0; p < sizeof probes / sizeof *probes; p++)
                CHECK((probes[p] < cut) == ds_conf_below_at(probes[p], s, t), "s %g t %g: c %.9g vs cutoff %.9g", s, t,
                      probes[p], cut);
        }
    /* ds_conf_keep: the first position whose calibrated confidence is below t. */
    const float z[4] = {2.0f, 1.0f, 0.5f, -1.0f}, s[4] = {1.0f, 0.25f, 4.0f, 1.0f};
    /* uncalibrated at 0.6: 0.881 0.731 0.622 0.269 -> keeps 3; calibrated: 0.881 0.982 0.531 -> keeps 2 */
    CHECK(ds_conf_keep(z, NULL, 4, 0.6f) == 3, "uncalibrated keep %d", ds_conf_keep(z, NULL, 4, 0.6f));
    CHECK(ds_conf_keep(z, s, 4, 0.6f) == 2, "calibrated keep %d", ds_conf_keep(z, s, 4, 0.6f));
    CHECK(ds_conf_keep(z, s, 4, 0.0f) == 4, "threshold 0 keeps all");
}

/* The backend's cut (conf_cut, one cutoff a position: what a drafter
 * walking on the device uploads) against ds_conf_keep with temperatures. */
static void test_conf_cut_with_temperatures(void) {
    ds_backend *be;
    CHECK_OK(test_backend_new(&be));
    enum { G = 7 };
    ds_tensor x, cut;
    CHECK_OK(be->ops->alloc(be, DS_F32, G, 1, &x));
    CHECK_OK(be->ops->alloc(be, DS_F32, G, 1, &cut));
    ds_rng rng;
    ds_rng_seed(&rng, 11);
    int disagreements = 0, cut_moved = 0;
    for (int trial = 0; trial < 300; trial++) {
        float s[G], z[G], c[G];
        const float t = (float)(0.05 + 0.9 * ds_rng_uniform(&rng));
        for (int k = 0; k < G; k++) {
            s[k] = (float)exp2(8 * ds_rng_uniform(&rng) - 4); /* 1/16 .. 16 */
            c[k] = ds_conf_cutoff_at(t, s[k]);
            z[k] = (float)(12 * ds_rng_uniform(&rng) - 3);
        }
        if (trial % 4 == 1) z[trial % G] = c[trial % G]; /* on a cutoff, and just below it */
        if (trial % 4 == 2) z[trial % G] = nextafterf(c[trial % G], -INFINITY);
        be->ops->upload(be, cut, c);
        be->ops->upload(be, x, z);
        int32_t got = -1;
        ds_conf_cut(be, x, cut, &got);
        CHECK_OK(ds_backend_check(be));
        disagreements += got != ds_conf_keep(z, s, G, t);
        cut_moved += ds_conf_keep(z, s, G, t) != ds_conf_keep(z, NULL, G, t);
    }
    CHECK(disagreements == 0, "conf_cut with per-position cutoffs disagreed with ds_conf_keep in %d of 300", disagreements);
    CHECK(cut_moved > 30, "the temperatures moved the cut in only %d of 300", cut_moved);
    be->ops->release(be, &x);
    be->ops->release(be, &cut);
    be->ops->destroy(be);
}

/* ---- the temperature file ----------------------------------------------- */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void test_sts_file(void) {
    char path[256];
    path_in_tmp(path, sizeof path, "round_trip.json");
    ds_sts s = {.n = 3, .temp = {0.1f + 1e-7f, 1.0f, 3.0f / 7.0f}}, back;
    cJSON *extra = cJSON_CreateObject();
    cJSON_AddStringToObject(extra, "note", "kept");
    cJSON_AddStringToObject(extra, "format", "not this one");
    CHECK_OK(ds_sts_write(path, &s, extra));
    CHECK_OK(ds_sts_read(path, &back));
    CHECK(back.n == 3, "n %d", back.n);
    for (int k = 0; k < 3; k++) CHECK(back.temp[k] == s.temp[k], "temp[%d] %.9g != %.9g", k, back.temp[k], s.temp[k]);
    cJSON *j = read_json_file(path);
    const cJSON *note = j ? cJSON_GetObjectItem(j, "note") : NULL, *fmt = j ? cJSON_GetObjectItem(j, "format") : NULL;
    CHECK(cJSON_IsString(note) && !strcmp(note->valuestring, "kept"), "extra field kept");
    CHECK(cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "dspark-sts"), "format not overridden");
    cJSON_Delete(j);

    const struct {
        const char *text, *needle;
    } bad[] = {
        {"{\"format\": \"dspark-sts\", \"version\": 1, \"block_size\": 2, \"temperatures\": [1, 2", "invalid JSON"},
        {"[1, 2]", "not a JSON object"},
        {"{\"version\": 1, \"block_size\": 1, \"temperatures\": [1]}", "field \"format\""},
        {"{\"format\": \"dspark-sts\", \"version\": 2, \"block_size\": 1, \"temperatures\": [1]}", "field \"version\""},
        {"{\"format\": \"dspark-sts\", \"version\": 1, \"block_size\": 1}", "field \"temperatures\" is missing"},
        {"{\"format\": \"dspark-sts\", \"version\": 1, \"block_size\": 0, \"temperatures\": []}", "has 0 entries"},
        {"{\"format\": \"dspark-sts\", \"version\": 1, \"block_size\": 3, \"temperatures\": [1, 2]}",
         "field \"block_size\" must be the number of temperatures, 2"},
        {"{\"format\": \"dspark-sts\", \"version\": 1, \"block_size\": 2, \"temperatures\": [1, -2]}", "temperatures[1]"},
        {"{\"format\": \"dspark-sts\", \"version\": 1, \"block_size\": 2, \"temperatures\": [0, 1]}", "temperatures[0]"},
        {"{\"format\": \"dspark-sts\", \"version\": 1, \"block_size\": 2, \"temperatures\": [1, \"2\"]}", "temperatures[1]"},
        {"{\"format\": \"dspark-sts\", \"version\": 1, \"block_size\": 1, \"temperatures\": [1e300]}", "temperatures[0]"},
    };
    path_in_tmp(path, sizeof path, "bad.json");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(path, bad[i].text);
        ds_error *e = ds_sts_read(path, &back);
        CHECK(e && strstr(ds_error_message(e), path), "bad file %zu: error does not name the file: %s", i,
              e ? ds_error_message(e) : "(none)");
        CHECK_ERR(e, bad[i].needle);
    }
    path_in_tmp(path, sizeof path, "missing.json");
    CHECK_ERR(ds_sts_read(path, &back), "missing.json");
}

/* ---- PNG ---------------------------------------------------------------- */

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* A small inflater (stored and fixed-Huffman blocks: what the encoder may
 * write), so the test reads back the pixels rather than trusting them. */
typedef struct {
    const uint8_t *p;
    size_t n, bit;
    bool bad;
} bits_in;

static uint32_t get_bits(bits_in *b, int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++, b->bit++) {
        if (b->bit / 8 >= b->n) {
            b->bad = true;
            return 0;
        }
        v |= (uint32_t)(b->p[b->bit / 8] >> (b->bit % 8) & 1) << i;
    }
    return v;
}

static uint32_t get_code(bits_in *b, int n) { /* Huffman codes: most significant bit first */
    uint32_t v = 0;
    for (int i = 0; i < n; i++) v = v << 1 | get_bits(b, 1);
    return v;
}

static int fixed_symbol(bits_in *b) {
    uint32_t c = get_code(b, 7);
    if (c <= 0x17) return 256 + (int)c;
    c = c << 1 | get_bits(b, 1);
    if (c >= 0x30 && c <= 0xbf) return (int)c - 0x30;
    if (c >= 0xc0 && c <= 0xc7) return 280 + (int)c - 0xc0;
    c = c << 1 | get_bits(b, 1);
    return c >= 0x190 && c <= 0x1ff ? 144 + (int)c - 0x190 : -1;
}

/* Inflates a raw deflate stream into out (cap bytes); returns the length or -1. */
static long inflate_simple(const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
    static const int lb[29] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
    static const int le[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
    static const int db[30] = {1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
    static const int de[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
    bits_in b = {in, n, 0, false};
    size_t o = 0;
    for (int final = 0; !final;) {
        final = (int)get_bits(&b, 1);
        const uint32_t type = get_bits(&b, 2);
        if (type == 0) {
            b.bit = (b.bit + 7) / 8 * 8;
            const uint32_t len = get_bits(&b, 16), nlen = get_bits(&b, 16);
            if ((len ^ 0xffffu) != nlen || o + len > cap) return -1;
            for (uint32_t i = 0; i < len; i++) out[o++] = (uint8_t)get_bits(&b, 8);
        } else if (type == 1) {
            for (;;) {
                const int sym = fixed_symbol(&b);
                if (sym < 0 || sym > 285 || b.bad) return -1;
                if (sym < 256) {
                    if (o >= cap) return -1;
                    out[o++] = (uint8_t)sym;
                    continue;
                }
                if (sym == 256) break;
                const int len = lb[sym - 257] + (int)get_bits(&b, le[sym - 257]);
                const int dc = (int)get_code(&b, 5);
                if (dc > 29) return -1;
                const size_t dist = (size_t)(db[dc] + (int)get_bits(&b, de[dc]));
                if (dist > o || o + (size_t)len > cap) return -1;
                for (int i = 0; i < len; i++, o++) out[o] = out[o - dist];
            }
        } else {
            return -1;
        }
        if (b.bad) return -1;
    }
    return (long)o;
}

/* Checks a PNG file's structure (signature, chunk CRCs, IHDR, IDAT's zlib
 * header and Adler-32) and returns its decoded pixels (malloc'd: rows
 * without filter bytes), or NULL after a failure. */
static uint8_t *decode_png(const uint8_t *png, size_t n, int *w, int *h, int *channels, int *n_colors) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    CHECK(n > 8 && !memcmp(png, sig, 8), "PNG signature");
    if (n <= 8 || memcmp(png, sig, 8)) return NULL;
    uint8_t *idat = NULL;
    size_t idat_n = 0, at = 8;
    bool ihdr = false, iend = false;
    *n_colors = 0;
    while (at + 12 <= n && !iend) {
        const uint32_t len = be32(png + at);
        if (at + 12 + len > n) break;
        const uint8_t *type = png + at + 4, *data = png + at + 8;
        CHECK(ds_crc32(type, 4 + len) == be32(data + len), "chunk %.4s: CRC", type);
        if (!memcmp(type, "IHDR", 4)) {
            *w = (int)be32(data);
            *h = (int)be32(data + 4);
            CHECK(data[8] == 8 && (data[9] == 2 || data[9] == 3) && !data[10] && !data[11] && !data[12], "IHDR fields");
            *channels = data[9] == 2 ? 3 : 1;
            ihdr = true;
        } else if (!memcmp(type, "PLTE", 4)) {
            *n_colors = (int)len / 3;
        } else if (!memcmp(type, "IDAT", 4)) {
            uint8_t *p = realloc(idat, idat_n + len + 1);
            if (p) {
                memcpy(p + idat_n, data, len);
                idat = p;
                idat_n += len;
            }
        } else if (!memcmp(type, "IEND", 4)) {
            iend = true;
        }
        at += 12 + len;
    }
    CHECK(ihdr && iend && idat && at == n, "chunks: IHDR %d IEND %d IDAT %d, %zu of %zu bytes", ihdr, iend, idat != NULL,
          at, n);
    if (!ihdr || !idat || idat_n < 6) {
        free(idat);
        return NULL;
    }
    CHECK((idat[0] & 0x0f) == 8 && (idat[0] << 8 | idat[1]) % 31 == 0, "zlib header %02x %02x", idat[0], idat[1]);
    const size_t stride = (size_t)*w * (size_t)*channels + 1, raw_n = stride * (size_t)*h;
    uint8_t *raw = malloc(raw_n + 1);
    const long got = raw ? inflate_simple(idat + 2, idat_n - 6, raw, raw_n) : -1;
    CHECK(got == (long)raw_n, "inflated %ld bytes, expected %zu", got, raw_n);
    CHECK(got < 0 || ds_adler32(raw, (size_t)got) == be32(idat + idat_n - 4), "IDAT Adler-32");
    free(idat);
    if (got != (long)raw_n) {
        free(raw);
        return NULL;
    }
    uint8_t *px = malloc(raw_n);
    for (int y = 0; y < *h; y++) {
        CHECK(raw[(size_t)y * stride] == 0, "row %d filter %d", y, raw[(size_t)y * stride]);
        memcpy(px + (size_t)y * (stride - 1), raw + (size_t)y * stride + 1, stride - 1);
    }
    free(raw);
    return px;
}

static void test_png(void) {
    /* Known checksums: CRC-32 of "123456789" and Adler-32 of "Wikipedia". */
    CHECK(ds_crc32((const uint8_t *)"123456789", 9) == 0xcbf43926u, "crc32 check value");
    CHECK(ds_adler32((const uint8_t *)"Wikipedia", 9) == 0x11e60398u, "adler32 check value");
    /* A palette image with runs, repeated rows and noise; an RGB image. */
    enum { W = 203, H = 37 };
    static uint8_t idx[W * H], rgb[W * H * 3];
    ds_rng rng;
    ds_rng_seed(&rng, 3);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            idx[y * W + x] = y % 5 == 4 ? idx[(y - 1) * W + x] : x < 80 ? (uint8_t)(y % 3) : (uint8_t)(ds_rng_uniform(&rng) * 4);
            for (int c = 0; c < 3; c++) rgb[(y * W + x) * 3 + c] = x > 150 ? (uint8_t)(x * 7 + c * 50 + y) : (uint8_t)(c * 100);
        }
    static const uint8_t pal[12] = {255, 255, 255, 0, 0, 0, 200, 0, 0, 0, 0, 200};
    const ds_png_image imgs[2] = {{.width = W, .height = H, .channels = 1, .pixels = idx, .palette = pal, .n_colors = 4},
                                  {.width = W, .height = H, .channels = 3, .pixels = rgb}};
    for (int i = 0; i < 2; i++) {
        uint8_t *png;
        size_t n;
        CHECK_OK(ds_png_encode(&imgs[i], &png, &n));
        int w = 0, h = 0, ch = 0, nc = 0;
        uint8_t *px = decode_png(png, n, &w, &h, &ch, &nc);
        CHECK(w == W && h == H && ch == imgs[i].channels && nc == (i == 0 ? 4 : 0), "image %d: %dx%d, %d channels, %d colours", i, w, h, ch, nc);
        CHECK(px && !memcmp(px, imgs[i].pixels, (size_t)W * H * (size_t)imgs[i].channels), "image %d: pixels round trip", i);
        CHECK(n < (size_t)W * H * (size_t)imgs[i].channels, "image %d: %zu bytes, no smaller than raw", i, n);
        free(px);
        free(png);
    }
    uint8_t *png;
    size_t n;
    idx[5] = 4;
    CHECK_ERR(ds_png_encode(&imgs[0], &png, &n), "palette index 4");
    const ds_png_image empty = {.width = 0, .height = 3, .channels = 3, .pixels = rgb};
    CHECK_ERR(ds_png_encode(&empty, &png, &n), "0 x 3 pixels");
}

/* ---- truncation under a temperature file, through the engine -------------- */

static const char *drafter_files[] = {"config.json", "model.safetensors"};

/* A drafter directory of symlinks to the bundled one, with sts.json beside. */
static void make_drafter_dir(char *dir, size_t n, const float *temps, int gamma) {
    snprintf(dir, n, "%s/drafter", tmp_dir);
    CHECK(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    char from[512], to[512];
    for (size_t i = 0; i < sizeof drafter_files / sizeof *drafter_files; i++) {
        snprintf(from, sizeof from, "%s/pico-qwen3-dspark/%s", DS_MODELS, drafter_files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, drafter_files[i]);
        CHECK(symlink(from, to) == 0, "symlink %s", to);
    }
    ds_sts s = {.n = gamma};
    memcpy(s.temp, temps, (size_t)gamma * sizeof *temps);
    snprintf(to, sizeof to, "%s/sts.json", dir);
    ds_error *e = ds_sts_write(to, &s, NULL);
    CHECK(!e, "%s", e ? ds_error_message(e) : "");
    ds_error_free(e);
}

static ds_error *gen(ds_engine *eng, const int32_t *ids, size_t n, float threshold, bool record, ds_output *out) {
    ds_generate_opts o = {.max_new = 48, .threshold = threshold, .record_confidence = record, .ignore_eos = true};
    return ds_engine_generate(eng, ids, n, &o, NULL, NULL, out);
}

/* Each round's proposal length is where the calibrated confidence first
 * falls below the threshold (ds_conf_keep with the file's temperatures), on
 * the host path (recording) and the backend's cut (not recording) alike;
 * the output is the plain greedy one whatever the temperatures. */
static void test_truncation_follows_temperatures(void) {
    const float temps[7] = {0.5f, 3.0f, 1.0f, 0.3f, 6.0f, 1.5f, 0.8f};
    char dir[256];
    make_drafter_dir(dir, sizeof dir, temps, 7);
    char model[512];
    snprintf(model, sizeof model, "%s/pico-qwen3", DS_MODELS);
    ds_engine *cal = NULL, *raw = NULL;
    /* DS_BACKEND=cuda: the GPU, where a greedy round cuts on the device. */
    const char *backend = getenv("DS_BACKEND") && !strcmp(getenv("DS_BACKEND"), "cuda") ? "cuda" : "cpu";
    ds_engine_opts eo = {.model_dir = model, .drafter_dir = dir, .threads = 2, .backend = backend};
    CHECK_OK(ds_engine_open(&eo, &cal));
    ds_engine_info info;
    ds_engine_get_info(cal, &info);
    CHECK(info.has_confidence && info.calibrated, "sts.json beside the drafter is picked up");
    eo.no_sts = true;
    ds_error *e = ds_engine_open(&eo, &raw);
    ds_engine_get_info(raw ? raw : cal, &info);
    CHECK(!e && !info.calibrated, "--no-sts: the head as it is");
    const int32_t prompts[3][6] = {{2811, 385, 1969, 1866, 379, 263}, {50, 51, 52, 53, 54, 55}, {1000, 7, 99, 5, 310, 12}};
    const float t = 0.55f;
    long rounds = 0, cut_differs = 0;
    for (int p = 0; p < 3 && !e; p++) {
        ds_output rec_cal, rec_raw, dev_cal, ar;
        CHECK_OK(gen(cal, prompts[p], 6, t, true, &rec_cal));
        CHECK_OK(gen(raw, prompts[p], 6, t, true, &rec_raw));
        CHECK_OK(gen(cal, prompts[p], 6, t, false, &dev_cal));
        ds_generate_opts o = {.max_new = 48, .no_draft = true, .ignore_eos = true};
        CHECK_OK(ds_engine_generate(cal, prompts[p], 6, &o, NULL, NULL, &ar));
        CHECK(rec_cal.confidence && !dev_cal.confidence, "confidence recorded only when asked");
        for (int r = 0; r < rec_cal.rounds && rec_cal.confidence; r++) {
            const float *z = rec_cal.confidence + (size_t)r * 7;
            const int want = ds_conf_keep(z, temps, 7, t);
            CHECK(rec_cal.proposed[r] == want, "prompt %d round %d: proposed %d, calibrated cut at %d", p, r,
                  rec_cal.proposed[r], want);
            cut_differs += want != ds_conf_keep(z, NULL, 7, t);
            rounds++;
        }
        for (int r = 0; r < rec_raw.rounds && rec_raw.confidence; r++)
            CHECK(rec_raw.proposed[r] == ds_conf_keep(rec_raw.confidence + (size_t)r * 7, NULL, 7, t),
                  "prompt %d round %d: uncalibrated cut", p, r);
        /* The backend's cut (per-position cutoffs) decides as the host's. */
        CHECK(dev_cal.rounds == rec_cal.rounds, "prompt %d: %d rounds on the backend path, %d recording", p,
              dev_cal.rounds, rec_cal.rounds);
        for (int r = 0; r < dev_cal.rounds && r < rec_cal.rounds; r++)
            CHECK(dev_cal.proposed[r] == rec_cal.proposed[r], "prompt %d round %d: backend cut %d, host cut %d", p, r,
                  dev_cal.proposed[r], rec_cal.proposed[r]);
        /* Lossless: every variant is plain greedy decoding. */
        const ds_output *outs[3] = {&rec_cal, &rec_raw, &dev_cal};
        for (int v = 0; v < 3; v++)
            CHECK(outs[v]->n_tokens == ar.n_tokens &&
                      !memcmp(outs[v]->tokens, ar.tokens, (size_t)ar.n_tokens * sizeof *ar.tokens),
                  "prompt %d variant %d: drafted output differs from autoregressive", p, v);
        ds_output_free(&rec_cal);
        ds_output_free(&rec_raw);
        ds_output_free(&dev_cal);
        ds_output_free(&ar);
    }
    fprintf(stderr, "  %ld rounds, the temperatures moved the cut in %ld\n", rounds, cut_differs);
    CHECK(cut_differs > 0, "the temperatures never changed a cut in %ld rounds", rounds);
    ds_error_free(e);
    ds_engine_free(cal);
    ds_engine_free(raw);

    /* A file for another block size, a broken file, or a named file that is not there: errors naming it. */
    char path[512];
    snprintf(path, sizeof path, "%s/sts.json", dir);
    ds_sts five = {.n = 5, .temp = {1, 1, 1, 1, 1}};
    CHECK_OK(ds_sts_write(path, &five, NULL));
    eo.no_sts = false;
    ds_engine *x = NULL;
    CHECK_ERR(ds_engine_open(&eo, &x), "block_size is 7");
    write_text(path, "{\"format\": \"dspark-sts\"");
    CHECK_ERR(ds_engine_open(&eo, &x), path);
    eo.no_sts = true;
    CHECK_OK(ds_engine_open(&eo, &x)); /* --no-sts does not read it */
    ds_engine_free(x);
    x = NULL;
    eo.no_sts = false;
    snprintf(path, sizeof path, "%s/none.json", tmp_dir);
    eo.sts = path;
    CHECK_ERR(ds_engine_open(&eo, &x), "none.json");
}

/* ---- dspark calibrate --------------------------------------------------- */

/* The first n lines of src into dst. */
static void head_lines(const char *src, const char *dst, int n) {
    FILE *in = fopen(src, "r"), *out = fopen(dst, "w");
    CHECK(in && out, "cannot copy %s to %s", src, dst);
    char line[8192];
    for (int i = 0; in && out && i < n && fgets(line, sizeof line, in); i++) fputs(line, out);
    if (in) fclose(in);
    if (out) fclose(out);
}

static void test_cli_end_to_end(void) {
    char cal[256], ev[256], out[256], png[256], stdout_path[256], src[512], cmd[2048];
    path_in_tmp(cal, sizeof cal, "cal.jsonl");
    path_in_tmp(ev, sizeof ev, "eval.jsonl");
    path_in_tmp(out, sizeof out, "cli_sts.json");
    path_in_tmp(png, sizeof png, "cli_sts-reliability.png");
    path_in_tmp(stdout_path, sizeof stdout_path, "cli.stdout");
    snprintf(src, sizeof src, "%s/sts/cal.jsonl", DS_TESTDATA);
    head_lines(src, cal, 6);
    snprintf(src, sizeof src, "%s/sts/eval.jsonl", DS_TESTDATA);
    head_lines(src, ev, 6);
    snprintf(cmd, sizeof cmd, "'%s' calibrate --prompt-file '%s' --eval-file '%s' --out '%s' -n 48 --threads 2 --json >'%s'",
             DS_CLI, cal, ev, out, stdout_path);
    int st = system(cmd);
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: exit %d", cmd, st);
    char *text = read_text_file(stdout_path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    CHECK(j != NULL, "calibrate --json printed: %s", text ? text : "(nothing)");
    free(text);
    if (!j) return;
    const cJSON *pos = cJSON_GetObjectItem(j, "positions"), *temps = cJSON_GetObjectItem(j, "temperatures");
    CHECK(cJSON_GetArraySize(pos) == 7 && cJSON_GetArraySize(temps) == 7, "7 positions and temperatures");
    ds_sts file;
    ds_error *e = ds_sts_read(out, &file);
    CHECK(!e && file.n == 7, "the temperature file: %s", e ? ds_error_message(e) : "");
    ds_error_free(e);
    int k = 0;
    for (const cJSON *p = pos ? pos->child : NULL; p; p = p->next, k++) {
        const char *fields[] = {"ece_before", "ece_after", "auroc_before", "auroc_after", "brier_before", "brier_after"};
        CHECK(cJSON_GetObjectItem(p, "k")->valuedouble == k, "positions[%d].k", k);
        CHECK(cJSON_GetObjectItem(p, "n")->valuedouble > 20, "positions[%d].n %g", k, cJSON_GetObjectItem(p, "n")->valuedouble);
        for (int f = 0; f < 6; f++) {
            const cJSON *v = cJSON_GetObjectItem(p, fields[f]);
            CHECK(cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 1, "positions[%d].%s", k, fields[f]);
        }
        const float s = (float)cJSON_GetArrayItem(temps, k)->valuedouble;
        CHECK(s > 0 && (e || s == file.temp[k]), "temperatures[%d] %g printed, %g in the file", k, s, file.temp[k]);
    }
    cJSON_Delete(j);
    size_t n = 0;
    char *bytes = read_text_file(png, &n);
    CHECK(bytes && n > 1000 && n < 200000, "%s: %zu bytes", png, n);
    int w = 0, h = 0, ch = 0, nc = 0;
    uint8_t *px = bytes ? decode_png((const uint8_t *)bytes, n, &w, &h, &ch, &nc) : NULL;
    CHECK(px && w > 1000 && h > 600 && ch == 1 && nc >= 6, "the diagram: %dx%d", w, h);
    free(px);
    free(bytes);

    /* Without an evaluation file the metrics are the calibration rounds':
     * at position 0 the fit can only lower the ECE (s = 1 is on the grid). */
    snprintf(cmd, sizeof cmd, "'%s' calibrate --prompt-file '%s' --out '%s' -n 32 --threads 2 --json >'%s'", DS_CLI, cal,
             out, stdout_path);
    st = system(cmd);
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: exit %d", cmd, st);
    text = read_text_file(stdout_path, NULL);
    j = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *p0 = j ? cJSON_GetArrayItem(cJSON_GetObjectItem(j, "positions"), 0) : NULL;
    CHECK(p0 && cJSON_GetObjectItem(p0, "ece_after")->valuedouble <= cJSON_GetObjectItem(p0, "ece_before")->valuedouble,
          "position 0: the fit raised the calibration ECE");
    cJSON_Delete(j);

    /* Bad input: named. */
    snprintf(cmd, sizeof cmd, "'%s' calibrate --out '%s' >/dev/null 2>&1", DS_CLI, out);
    st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2, "no --prompt-file: exit %d", WEXITSTATUS(st));
    char bad[256];
    path_in_tmp(bad, sizeof bad, "bad.jsonl");
    write_text(bad, "{\"prompt\": \"fine\"}\n{\"prompt\": 3}\n");
    snprintf(cmd, sizeof cmd, "'%s' calibrate --prompt-file '%s' --out '%s' 2>'%s'", DS_CLI, bad, out, stdout_path);
    st = system(cmd);
    text = read_text_file(stdout_path, NULL);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1 && text && strstr(text, "bad.jsonl:2"), "bad prompt file: %s", text ? text : "");
    free(text);
    /* A drafter without a confidence head has nothing to calibrate. */
    snprintf(cmd, sizeof cmd, "'%s' calibrate -m '%s/pico-qwen3' -d '%s' --prompt-file '%s' --out '%s' 2>'%s'",
             DS_CLI, DS_MODELS, DS_DFLASH, cal, out, stdout_path);
    st = system(cmd);
    text = read_text_file(stdout_path, NULL);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1 && text && strstr(text, "no confidence head"), "dflash: %s", text ? text : "");
    free(text);
    /* generate --sts names a missing file; --sts and --no-sts together are refused. */
    snprintf(cmd, sizeof cmd, "'%s' generate -p x -n 1 --sts '%s/none.json' 2>'%s'", DS_CLI, tmp_dir, stdout_path);
    st = system(cmd);
    text = read_text_file(stdout_path, NULL);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1 && text && strstr(text, "none.json"), "--sts missing: %s", text ? text : "");
    free(text);
    snprintf(cmd, sizeof cmd, "'%s' generate -p x -n 1 --sts '%s' --no-sts >/dev/null 2>&1", DS_CLI, out);
    st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2, "--sts with --no-sts: exit %d", WEXITSTATUS(st));
    snprintf(cmd, sizeof cmd, "'%s' generate -p x -n 4 --threshold 0.5 --sts '%s' >/dev/null 2>&1", DS_CLI, out);
    st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "generate --sts FILE: exit %d", WEXITSTATUS(st));
}

static void setup(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ds_calibrate_XXXXXX");
    CHECK(mkdtemp(tmp_dir) != NULL, "mkdtemp");
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    CHECK(system(cmd) == 0, "%s", cmd);
}

RUN_TESTS("calibrate", setup, test_metrics_one_position, test_metrics_cumulative, test_sts_recovers_temperatures,
          test_conf_prob_and_cutoff, test_conf_cut_with_temperatures, test_sts_file, test_png, test_truncation_follows_temperatures, test_cli_end_to_end,
          teardown)
