/* Token distributions: greedy is one-hot at the lowest-id maximum; top-k
 * and top-p keep exactly what a full ranking would keep (the engine ranks
 * only the head of the distribution); draws follow the distribution. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample/draw.h"
#include "sample/probs.h"
#include "testlib.h"

typedef struct {
    float p;
    int id;
} cand;

static int by_rank(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id > y->id ? 1 : -1;
}

/* The definition: rank everything, keep top-k, then the top-p prefix. */
static void reference(const float *base, int V, const ds_sampling *s, float *out) {
    cand *c = malloc((size_t)V * sizeof *c);
    for (int i = 0; i < V; i++) c[i] = (cand){base[i], i};
    qsort(c, (size_t)V, sizeof *c, by_rank);
    int keep = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    double mass = 0;
    for (int i = 0; i < keep; i++) mass += c[i].p;
    if (s->top_p < 1) {
        double cum = 0, target = s->top_p * mass;
        int n = 0;
        while (n < keep) {
            cum += c[n++].p;
            if (cum >= target) break;
        }
        keep = n;
        mass = cum;
    }
    memset(out, 0, (size_t)V * sizeof *out);
    for (int i = 0; i < keep; i++) out[c[i].id] = (float)(c[i].p / mass);
    free(c);
}

static void test_greedy_ties_to_lowest_id(void) {
    float l[5] = {1, 3, 2, 3, 0}, p[5];
    ds_sampling g = {0};
    ds_probs_from_logits(l, 5, &g, p);
    CHECK(p[1] == 1 && p[3] == 0, "one-hot at id 1, got p[1]=%g p[3]=%g", p[1], p[3]);
    CHECK(ds_argmax(l, 5) == 1, "argmax %d", ds_argmax(l, 5));
}

static void test_top_k_top_p_match_full_ranking(void) {
    const int V = 3000;
    float *l = malloc(V * sizeof *l), *got = malloc(V * sizeof *got), *base = malloc(V * sizeof *base),
          *want = malloc(V * sizeof *want);
    ds_rng r;
    ds_rng_seed(&r, 7);
    int mismatches = 0;
    for (int trial = 0; trial < 300; trial++) {
        int levels = trial % 2 ? 50 : 5000; /* coarse logits make many exact ties */
        for (int i = 0; i < V; i++) l[i] = (float)(ds_rng_next(&r) % (uint64_t)levels) / 7.0f;
        ds_sampling s = {.temperature = 0.9f,
                         .top_k = trial % 3 ? 1 + (int)(ds_rng_next(&r) % 400) : 0,
                         .top_p = trial % 4 ? 0.05f + (float)(ds_rng_next(&r) % 95) / 100.0f : 1.0f};
        ds_sampling plain = {.temperature = 0.9f, .top_p = 1};
        ds_probs_from_logits(l, V, &s, got);
        ds_probs_from_logits(l, V, &plain, base);
        reference(base, V, &s, want);
        mismatches += memcmp(got, want, V * sizeof *got) != 0;
    }
    CHECK(mismatches == 0, "%d of 300 distributions differ from the full ranking", mismatches);
    free(l);
    free(got);
    free(base);
    free(want);
}

/* 200k draws from a fixed distribution: chi-square at alpha = 1e-3 (df 7,
 * critical value 24.32). */
static void test_draws_follow_distribution(void) {
    const float p[8] = {0.3f, 0.2f, 0.15f, 0.1f, 0.1f, 0.08f, 0.05f, 0.02f};
    long count[8] = {0};
    ds_rng r;
    ds_rng_seed(&r, 12345);
    const int N = 200000;
    for (int i = 0; i < N; i++) count[ds_sample_probs(p, 8, &r)]++;
    double chi2 = 0;
    for (int i = 0; i < 8; i++) chi2 += pow(count[i] - N * p[i], 2) / (N * p[i]);
    printf("  chi2 = %.2f (df 7, critical 24.32 at alpha 1e-3)\n", chi2);
    CHECK(chi2 < 24.32, "chi2 %.2f", chi2);
}

RUN_TESTS("sampler", test_greedy_ties_to_lowest_id, test_top_k_top_p_match_full_ranking,
          test_draws_follow_distribution)
