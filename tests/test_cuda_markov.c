/* The CUDA backend's Markov walks (markov.cu) and the LM head's bound
 * (head_bound.cu): the greedy walk bit for bit against the host's (logits,
 * tokens, emb), pruned by the principal-directions bound or not;
 * markov_greedy_head against the full head; the sampled walk against the
 * CPU backend's (cuda_vs_cpu.h's sampling bounds). Skips (exit 77) where no
 * CUDA device can be used. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_config.h"
#include "draft/markov_bound.h"
#include "sample/draw.h"
#include "cuda_vs_cpu.h"

/* A GPU-only bf16 weight [rows, cols] from the first rows x cols values of host. */
static ds_tensor bw_weight(const uint16_t *host, int64_t rows, int64_t cols) {
    ds_st_tensor st = {.name = "w", .dtype = DS_BF16, .ndim = 2, .shape = {rows, cols}, .data = host,
                       .nbytes = (size_t)(rows * cols) * 2};
    ds_tensor t = ds_no_tensor();
    ds_error *e = gpu->ops->weight(gpu, &st, rows, cols, &t);
    if (e) {
        CHECK(0, "weight: %s", ds_error_message(e));
        ds_error_free(e);
    }
    return t;
}

/* A bf16 weight from given values (each exactly representable in bf16). */
static ds_tensor gpu_bf16_weight(const float *v, int64_t rows, int64_t cols, uint16_t *buf) {
    for (int64_t i = 0; i < rows * cols; i++) buf[i] = ds_f32_to_bf16(v[i]);
    return bw_weight(buf, rows, cols);
}

/* The greedy Markov walk done by hand on the host: corrected logits want
 * [G, V] and tokens (argmax starting at column 0, first strict maximum). */
static void host_markov_walk(const float *base, const float *w1, const float *w2, int G, int V, int r, bool bf16,
                             int32_t anchor, float *want, int32_t *tok) {
    int32_t prev = anchor;
    for (int k = 0; k < G; k++) {
        const float *e = w1 + (size_t)prev * r;
        float *row = want + (size_t)k * V;
        for (int j = 0; j < V; j++) {
            float b = 0;
            for (int i = 0; i < r; i++) b += e[i] * w2[(size_t)j * r + i];
            const float x = base[(size_t)k * V + j];
            row[j] = bf16 ? ds_bf16_to_f32(ds_f32_to_bf16(x + ds_bf16_to_f32(ds_f32_to_bf16(b)))) : x + b;
        }
        int32_t best = 0;
        for (int j = 1; j < V; j++)
            if (row[j] > row[best]) best = j;
        tok[k] = prev = best;
    }
}

/* The principal-directions bound of w2 (V x r, fp32) as the drafter builds
 * it (host), and on both backends (b: the GPU's tensors). */
typedef struct {
    ds_markov_bound_host host;
    pair proj, coef, radius;
    ds_markov_bound b;
} test_bound;
static bool test_bound_make(test_bound *tb, const float *w2, int V, int r) {
    ds_error *e = ds_markov_bound_build(w2, DS_F32, V, r, DS_MARKOV_BOUND_K, &tb->host);
    CHECK(!e, "markov bound: %s", e ? ds_error_message(e) : "");
    if (e) {
        ds_error_free(e);
        return false;
    }
    tb->proj = act(tb->host.k, r, tb->host.proj);
    tb->coef = act(V, tb->host.k, tb->host.coef);
    tb->radius = act(1, V, tb->host.radius);
    tb->b = (ds_markov_bound){tb->proj.g, tb->coef.g, tb->radius.g};
    return true;
}
static void test_bound_free(test_bound *tb) {
    release(&tb->proj);
    release(&tb->coef);
    release(&tb->radius);
    ds_markov_bound_free(&tb->host);
}

/* The device Markov walk against the host walk. The values are small
 * multiples of powers of two, so every product and sum is exact in fp32
 * whatever the order: both sides must agree to the bit, in the corrected
 * logits and in every drawn token (ties included). Without the logits
 * (tokens only) the device skips rows that the principal-directions bound
 * (draft/markov_bound.c, as the drafter builds it) says cannot win: the
 * tokens must still be the same, for a random w2 (loose bound) and a
 * low-rank one plus noise (tight bound, as trained heads), with the base
 * logits as close as the bias (many candidates, ties), spread wide (few
 * candidates), and with a NaN at column 0 (no pruning; the host scan
 * returns 0). */
static void test_markov_greedy(void) {
    const int G = 7, V = 3000, r = 64;
    float *base = malloc((size_t)G * V * sizeof *base), *w1 = malloc((size_t)V * r * sizeof *w1);
    float *w2 = malloc((size_t)V * r * sizeof *w2), *want = malloc((size_t)G * V * sizeof *want);
    float *got = malloc((size_t)G * V * sizeof *got);
    uint16_t *b1 = malloc((size_t)V * r * 2), *b2 = malloc((size_t)V * r * 2);
    for (int i = 0; i < V * r; i++) w1[i] = (float)(int)(frand() * 16) / 256.0f;
    ds_tensor tw1 = gpu_bf16_weight(w1, V, r, b1);
    const char *wnames[] = {"random w2", "low-rank w2"}, *names[] = {"close", "spread", "NaN at column 0"};
    for (int wk = 0; wk < 2; wk++) {
        if (wk == 0) {
            for (int i = 0; i < V * r; i++) w2[i] = (float)(int)(frand() * 16) / 256.0f;
        } else { /* (a_n u + b_n v + sparse noise) / 256, integers up to 33: exact in bf16 */
            int u[64], v[64];
            for (int i = 0; i < r; i++) u[i] = (int)(frand() * 9) - 4, v[i] = (int)(frand() * 7) - 3;
            for (int n = 0; n < V; n++) {
                const int a = (int)(frand() * 5) - 2, b = (int)(frand() * 5) - 2;
                for (int i = 0; i < r; i++)
                    w2[(size_t)n * r + i] = (float)(a * u[i] + b * v[i] + (frand() < 0.1 ? 1 : 0)) / 256.0f;
            }
        }
        ds_tensor tw2 = gpu_bf16_weight(w2, V, r, b2);
        test_bound tb;
        if (!test_bound_make(&tb, w2, V, r)) break;
        const ds_markov_bound bound = tb.b;
        for (int data = 0; data < 3; data++) {
            for (int i = 0; i < G * V; i++) base[i] = (float)(int)(frand() * 96) / (data == 1 ? 4.0f : 64.0f);
            if (data == 2) base[(size_t)3 * V] = NAN;
            for (int mode = 0; mode < 8; mode++) { /* bit 0: bf16; bit 1: tokens only (pruned); bit 2: per step */
                const bool bf16 = mode & 1, pruned = mode & 2, fused = !(mode & 4);
                if (!pruned && !fused) continue; /* only the pruned walk has the one-launch form */
                /* The pruned walk in one launch / a launch a step, whatever the vocabulary (markov.cu reads
                 * it at each call; by size, V = 3000 would take a launch a step) */
                ds_cuda_config_of(gpu)->markov_fused = fused;
                if ((data > 0 || wk > 0) && !pruned) continue; /* the full walk: the first data set */
                pair pb = act(G, V, base), po = act(G, V, NULL), pe = act(G, r + 3, NULL);
                ds_tensor emb = ds_cols(pe.g, 2, r); /* a column window, as the drafter passes it */
                const int32_t anchor = 1234;
                int32_t tok[8] = {0}, want_tok[8] = {0};
                ds_spec(gpu)->markov_greedy(gpu, pb.g, pruned ? ds_no_tensor() : po.g, tw1, tw2, pruned ? &bound : NULL,
                                        bf16, anchor, emb, tok);
                check_gpu_ok("markov_greedy");
                host_markov_walk(base, w1, w2, G, V, r, bf16, anchor, want, want_tok);
                int same = 0;
                for (int k = 0; k < G; k++) same += tok[k] == want_tok[k];
                bool logits_ok = true;
                if (!pruned) {
                    gpu->ops->download(gpu, po.g, got);
                    logits_ok = !memcmp(got, want, (size_t)G * V * 4);
                }
                printf("  markov_greedy (%s, %s, %s, %s%s): %d/%d tokens equal the host walk's%s\n", wnames[wk],
                       names[data], bf16 ? "bf16" : "fp32", pruned ? "tokens only" : "with logits",
                       pruned ? fused ? ", one launch" : ", a launch a step" : "", same, G,
                       pruned ? "" : logits_ok ? ", logits bit-identical" : ", logits DIFFER");
                CHECK(same == G, "markov_greedy (%s, %s): %d of %d tokens differ", wnames[wk], names[data], G - same,
                      G);
                CHECK(logits_ok, "markov_greedy: corrected logits differ");
                /* emb (the confidence head's input): row k = w1[the token before position k] */
                float *ge = malloc((size_t)G * (r + 3) * sizeof *ge);
                gpu->ops->download(gpu, pe.g, ge);
                int emb_bad = -1;
                for (int k = 0; k < G && emb_bad < 0; k++) {
                    const int prev = k ? want_tok[k - 1] : anchor;
                    if (memcmp(ge + (size_t)k * (r + 3) + 2, w1 + (size_t)prev * r, (size_t)r * sizeof *ge)) emb_bad = k;
                }
                CHECK(emb_bad < 0, "markov_greedy (%s, %s, %s): emb row %d is not w1[previous token]", wnames[wk],
                      names[data], fused ? "one launch" : "a launch a step", emb_bad);
                free(ge);
                release(&pb);
                release(&po);
                release(&pe);
            }
            ds_cuda_config_of(gpu)->markov_fused = -1;
        }
        test_bound_free(&tb);
        gpu->ops->release(gpu, &tw2);
    }
    gpu->ops->release(gpu, &tw1);
    free(base), free(w1), free(w2), free(want), free(got), free(b1), free(b2);
}

/* markov_greedy_head (the LM head's int8 bounds and the walk computing only
 * the rows in contention, head_bound.cu) against the full head on the GPU
 * (linear, round_bf16, the pruned markov_greedy): the same tokens, which
 * needs the bounds to hold and the candidates' logits to have the full
 * head's bits. Heads: random (few candidates); a third of the rows one
 * vector and the rest half of it (hundreds of exact ties in the base
 * logits: many candidates, the bias and then the lowest id decide); a NaN
 * in x (infinite bounds: every row computed; all logits NaN, token 0 as the
 * host scan). The int8 copy must be made (one more weight copy in the
 * region stats at the first call), and the head bound off (the full head)
 * must agree too. */
static void test_markov_greedy_head(void) {
    const int G = 7, V = 3000, K = 4096, r = 64; /* K: the 8B head's, 8 chunks an emulated warp */
    float *w1 = malloc((size_t)V * r * sizeof *w1), *w2 = malloc((size_t)V * r * sizeof *w2);
    float *hw = malloc((size_t)V * K * sizeof *hw), *x = malloc((size_t)G * K * sizeof *x);
    uint16_t *b1 = malloc((size_t)V * r * 2), *b2 = malloc((size_t)V * r * 2), *bh = malloc((size_t)V * K * 2);
    for (int i = 0; i < V * r; i++) w1[i] = (float)(int)(frand() * 16) / 256.0f;
    for (int i = 0; i < V * r; i++) w2[i] = (float)(int)(frand() * 16) / 1024.0f;
    ds_tensor tw1 = gpu_bf16_weight(w1, V, r, b1), tw2 = gpu_bf16_weight(w2, V, r, b2);
    test_bound tb;
    if (!test_bound_make(&tb, w2, V, r)) return;
    const ds_markov_bound bound = tb.b;
    const char *names[] = {"random head", "tied rows", "NaN in x"};
    ds_cuda_config *cfg = ds_cuda_config_of(gpu);
    cfg->markov_fused = 1; /* V = 3000 would otherwise take a launch a step */
    for (int data = 0; data < 3; data++) {
        for (int i = 0; i < V * K; i++) hw[i] = ds_bf16_to_f32(ds_f32_to_bf16(frand() * 0.02f));
        if (data == 1)
            for (int n = 0; n < V; n++)
                for (int i = 0; i < K; i++) hw[(size_t)n * K + i] = n % 3 ? 0.5f * hw[i] : hw[i];
        for (int i = 0; i < G * K; i++) x[i] = frand() * 2.0f;
        if (data == 2) x[3 * K + 17] = NAN;
        ds_tensor th = gpu_bf16_weight(hw, V, K, bh);
        pair px = act(G, K, x), pb = act(G, V, NULL), pe = act(G, r, NULL);
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const int32_t anchor = 77;
            int32_t want[8] = {0}, got[8] = {0}, full[8] = {0};
            gpu->ops->linear(gpu, pb.g, px.g, th, ds_no_tensor());
            if (bf16) gpu->ops->round_bf16(gpu, pb.g);
            ds_spec(gpu)->markov_greedy(gpu, pb.g, ds_no_tensor(), tw1, tw2, &bound, bf16, anchor, pe.g, want);
            ds_region_stats s0, s1;
            gpu->ops->region_stats(gpu, &s0);
            ds_spec(gpu)->markov_greedy_head(gpu, px.g, th, pb.g, bf16, tw1, tw2, &bound, anchor, pe.g, got);
            check_gpu_ok("markov_greedy_head");
            gpu->ops->region_stats(gpu, &s1);
            cfg->head_bound = false;
            ds_spec(gpu)->markov_greedy_head(gpu, px.g, th, pb.g, bf16, tw1, tw2, &bound, anchor, pe.g, full);
            cfg->head_bound = true;
            check_gpu_ok("markov_greedy_head (full head)");
            int same = 0, same_full = 0;
            for (int k = 0; k < G; k++) same += got[k] == want[k], same_full += full[k] == want[k];
            /* a new head (a new tensor each data set): its copy is made at the first call */
            const bool copied = bf16 || s1.weight_copy_bytes - s0.weight_copy_bytes >= (int64_t)V * K;
            printf("  markov_greedy_head (%s, %s): %d/%d tokens equal the full head's (%d without the bound), "
                   "int8 copy %s; tokens %d %d %d ...\n",
                   names[data], bf16 ? "bf16" : "fp32", same, G, same_full, copied ? "made" : "MISSING", got[0],
                   got[1], got[2]);
            CHECK(same == G && same_full == G, "markov_greedy_head (%s, %s): %d / %d of %d tokens differ",
                  names[data], bf16 ? "bf16" : "fp32", G - same, G - same_full, G);
            CHECK(copied, "markov_greedy_head: no int8 copy of the head was made");
            if (data == 2) CHECK(got[3] == 0, "markov_greedy_head: a NaN row's token is %d, not 0", got[3]);
        }
        release(&px);
        release(&pb);
        release(&pe);
        gpu->ops->release(gpu, &th);
    }
    cfg->markov_fused = -1;
    test_bound_free(&tb);
    gpu->ops->release(gpu, &tw1);
    gpu->ops->release(gpu, &tw2);
    free(w1), free(w2), free(hw), free(x), free(b1), free(b2), free(bh);
}

/* ---- sampling at T > 0 (markov_sample) ------------------------------------ */

/* The sampled Markov walk on both backends. Values are small multiples of
 * powers of two (as test_markov_greedy's), so the corrected logits are
 * exact on both and must agree to the bit, and so must the Markov inputs
 * (emb); the distributions within SAMPLE_PROB_TOL; the drawn tokens
 * exactly, up to the first step whose uniform is borderline (excluded:
 * the walks may part there, so the rest of that walk is not compared). */
static void test_sample_markov(void) {
    /* r = 60: w2's rows miss the one-launch step's alignment (gather, linear, add instead). */
    const struct {
        int64_t V;
        int r;
    } cfg[] = {{3000, 64}, {3000, 60}, {151936, 64}};
    int walks = 0, steps = 0, differ = 0, excluded = 0, logits_differ = 0, emb_differ = 0;
    double worst = 0;
    for (size_t vi = 0; vi < sizeof cfg / sizeof cfg[0]; vi++) {
        const int64_t V = cfg[vi].V;
        const int r = cfg[vi].r;
        const int G = V > 100000 ? 4 : 7;
        float *w1 = malloc((size_t)(V * r) * sizeof *w1), *w2 = malloc((size_t)(V * r) * sizeof *w2);
        float *base = malloc((size_t)(G * V) * sizeof *base), *pg = malloc((size_t)(G * V) * sizeof *pg);
        float *pc = malloc((size_t)(G * V) * sizeof *pc), *og = malloc((size_t)(G * V) * sizeof *og);
        float *oc = malloc((size_t)(G * V) * sizeof *oc);
        float eg[8 * 64], ec[8 * 64];
        for (int64_t i = 0; i < V * r; i++) w1[i] = (float)(int)(frand() * 16) / 256.0f;
        for (int64_t i = 0; i < V * r; i++) w2[i] = (float)(int)(frand() * 16) / 256.0f;
        for (int head = 0; head < 3; head++) { /* bf16 head, fp32 head, none */
            const bool markov = head < 2, bf16 = head == 0;
            const ds_dtype dt = bf16 ? DS_BF16 : DS_F32;
            pair pw1 = markov ? weight_of(dt, w1, V, r) : (pair){0}, pw2 = markov ? weight_of(dt, w2, V, r) : (pair){0};
            for (int si = 0; si < N_SAMP; si += (V > 100000 ? 3 : 1)) {
                const ds_sampling s = samp(&SAMP[si]);
                for (int64_t i = 0; i < G * V; i++) base[i] = (float)(int)(frand() * 96) / (si % 2 ? 4.0f : 64.0f);
                pair pb = act(G, V, base), po = act(G, V, NULL), pp = act(G, V, NULL), pe = act(G, r + 3, NULL);
                const bool keep = si % 2 == 0;
                double u[8];
                for (int k = 0; k < G; k++) u[k] = ds_rng_uniform(&urng);
                const int32_t anchor = (int32_t)(V / 3 + si);
                int32_t tg[8], tc[8];
                ds_spec(gpu)->markov_sample(gpu, pb.g, keep ? po.g : ds_no_tensor(), pp.g, markov ? pw1.g : ds_no_tensor(),
                                        markov ? pw2.g : ds_no_tensor(), bf16, anchor, &s, u,
                                        markov ? ds_cols(pe.g, 2, r) : ds_no_tensor(), tg);
                ds_spec(cpu)->markov_sample(cpu, pb.c, keep ? po.c : ds_no_tensor(), pp.c, markov ? pw1.c : ds_no_tensor(),
                                        markov ? pw2.c : ds_no_tensor(), bf16, anchor, &s, u,
                                        markov ? ds_cols(pe.c, 2, r) : ds_no_tensor(), tc);
                check_gpu_ok("markov_sample");
                gpu->ops->download(gpu, pp.g, pg);
                cpu->ops->download(cpu, pp.c, pc);
                if (keep) {
                    gpu->ops->download(gpu, po.g, og);
                    cpu->ops->download(cpu, po.c, oc);
                }
                if (markov) {
                    gpu->ops->download(gpu, ds_cols(pe.g, 2, r), eg);
                    cpu->ops->download(cpu, ds_cols(pe.c, 2, r), ec);
                }
                walks++;
                for (int k = 0; k < G; k++) {
                    const size_t o = (size_t)k * V;
                    if (keep) logits_differ += memcmp(og + o, oc + o, (size_t)V * sizeof *og) != 0;
                    if (markov) emb_differ += memcmp(eg + k * r, ec + k * r, (size_t)r * sizeof *eg) != 0;
                    worst = fmax(worst, rel_err_max(pg + o, pc + o, (size_t)V));
                    steps++;
                    if (tg[k] == tc[k]) continue;
                    if (ds_sample_probs_u(pg + o, (int)V, u[k]) != ds_sample_probs_u(pc + o, (int)V, u[k]) ||
                        draw_margin(pc + o, V, u[k]) < DRAW_EPS) {
                        excluded++;
                    } else {
                        differ++;
                        CHECK(0, "markov_sample V=%lld head %d T=%g k=%d p=%g step %d: gpu %d, cpu %d", (long long)V,
                              head, (double)s.temperature, s.top_k, (double)s.top_p, k, tg[k], tc[k]);
                    }
                    break; /* the walks part here */
                }
                release(&pb), release(&po), release(&pp), release(&pe);
            }
            if (markov) release(&pw1), release(&pw2);
        }
        free(w1), free(w2), free(base), free(pg), free(pc), free(og), free(oc);
    }
    printf("  markov_sample (V 3000 r 64 / 60, V 151936 r 64; bf16, fp32, no head): %d walks, %d steps: %d tokens differ, %d excluded "
           "(borderline); distributions worst err %.2e (bound %.0e); corrected logits differ in %d rows, Markov "
           "inputs in %d\n", walks, steps, differ, excluded, worst, SAMPLE_PROB_TOL, logits_differ, emb_differ);
    CHECK(worst <= SAMPLE_PROB_TOL, "markov_sample distributions: normalized error %.3g", worst);
    CHECK(logits_differ == 0 && emb_differ == 0, "corrected logits / Markov inputs differ");
}

/* markov_sample_seqs (the batched drafter's walks) against markov_sample run
 * on each sequence alone, both on the GPU: tokens, distributions and Markov
 * inputs bit for bit, with runs of equal and of different sampling rules
 * side by side; and where it must decline (a rule the spread distributions
 * do not take, a rank past one chunk, misaligned w2 rows, too many
 * sequences) it returns false. */
static void test_sample_markov_seqs(void) {
    static const int fast[] = {0, 1, 2, 3, 4, 5, 7, 8}; /* SAMP's settings the spread distributions take */
    const struct {
        int64_t V;
        int r, n;
        ds_dtype dt;
    } cfg[] = {{3000, 64, 2, DS_F32}, {3000, 256, 5, DS_BF16}, {151936, 256, 32, DS_BF16}, {151936, 64, 9, DS_F32}};
    int walks = 0, tok_differ = 0, prob_differ = 0, emb_differ = 0, declined = 0;
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        const int64_t V = cfg[ci].V;
        const int r = cfg[ci].r, n = cfg[ci].n, G = 7;
        const bool bf16 = cfg[ci].dt == DS_BF16;
        float *w1 = malloc((size_t)(V * r) * sizeof *w1), *w2 = malloc((size_t)(V * r) * sizeof *w2);
        float *base = malloc((size_t)n * G * V * sizeof *base), *pb = malloc((size_t)n * G * V * sizeof *pb);
        float *ps = malloc((size_t)G * V * sizeof *ps), *eb = malloc((size_t)n * G * r * sizeof *eb);
        float *es = malloc((size_t)G * r * sizeof *es);
        for (int64_t i = 0; i < V * r; i++) w1[i] = frand() / 8.0f, w2[i] = frand() / 8.0f;
        for (int64_t i = 0; i < (int64_t)n * G * V; i++) base[i] = 3.0f * frand();
        pair pw1 = weight_of(cfg[ci].dt, w1, V, r), pw2 = weight_of(cfg[ci].dt, w2, V, r);
        ds_sampling sv[DS_MARKOV_SEQS_MAX];
        const ds_sampling *sp[DS_MARKOV_SEQS_MAX];
        int32_t anchors[DS_MARKOV_SEQS_MAX], tb[DS_MARKOV_SEQS_MAX * 7], ts[7];
        double u[DS_MARKOV_SEQS_MAX * 7];
        for (int j = 0; j < n; j++) {
            sv[j] = samp(&SAMP[fast[(j / 2 + ci) % 8]]); /* pairs of sequences share a rule */
            sp[j] = &sv[j];
            anchors[j] = (int32_t)((V / 7) * (j % 7) + j);
            for (int k = 0; k < G; k++) u[j * G + k] = ds_rng_uniform(&urng);
        }
        pair pbat = act((int64_t)n * G, V, base), pe = act((int64_t)n * G, r + 3, NULL);
        const bool took = ds_spec(gpu)->markov_sample_seqs(gpu, n, pbat.g, pw1.g, pw2.g, bf16, anchors, sp, u,
                                                           ds_cols(pe.g, 2, r), tb);
        check_gpu_ok("markov_sample_seqs");
        CHECK(took, "markov_sample_seqs declined V=%lld r=%d n=%d", (long long)V, r, n);
        gpu->ops->download(gpu, pbat.g, pb);
        gpu->ops->download(gpu, ds_cols(pe.g, 2, r), eb);
        for (int j = 0; j < n && took; j++) {
            pair p1 = act(G, V, base + (size_t)j * G * V), pp = act(G, V, NULL), pe1 = act(G, r + 3, NULL);
            ds_spec(gpu)->markov_sample(gpu, p1.g, ds_no_tensor(), pp.g, pw1.g, pw2.g, bf16, anchors[j], sp[j],
                                        u + j * G, ds_cols(pe1.g, 2, r), ts);
            check_gpu_ok("markov_sample");
            gpu->ops->download(gpu, pp.g, ps);
            gpu->ops->download(gpu, ds_cols(pe1.g, 2, r), es);
            walks++;
            tok_differ += memcmp(ts, tb + j * G, sizeof ts) != 0;
            prob_differ += memcmp(ps, pb + (size_t)j * G * V, (size_t)G * V * sizeof *ps) != 0;
            emb_differ += memcmp(es, eb + (size_t)j * G * r, (size_t)G * r * sizeof *es) != 0;
            release(&p1), release(&pp), release(&pe1);
        }
        /* Where it must decline: nothing done. */
        if (ci == 3) { /* (V = 3000 would take top-k 5000 as no top-k) */
            const ds_sampling slow = samp(&SAMP[6]); /* top-k 5000 of 151936: the block-per-row kernels */
            const ds_sampling *mixed[2] = {sp[0], &slow};
            declined += !ds_spec(gpu)->markov_sample_seqs(gpu, 2, ds_rows(pbat.g, 0, 2 * G), pw1.g, pw2.g, bf16, anchors,
                                                          mixed, u, ds_cols(pe.g, 2, r), tb);
        }
        if (ci == 0) {
            pair pw2m = weight_of(cfg[ci].dt, w2, V, r - 4); /* rows of 60: not 16-byte runs of 8 */
            pair pw1m = weight_of(cfg[ci].dt, w1, V, r - 4);
            declined += !ds_spec(gpu)->markov_sample_seqs(gpu, 2, ds_rows(pbat.g, 0, 2 * G), pw1m.g, pw2m.g, bf16,
                                                          anchors, sp, u, ds_cols(pe.g, 2, r - 4), tb);
            release(&pw1m), release(&pw2m);
            declined += !ds_spec(gpu)->markov_sample_seqs(gpu, DS_MARKOV_SEQS_MAX + 1, pbat.g, pw1.g, pw2.g, bf16,
                                                          anchors, sp, u, ds_cols(pe.g, 2, r), tb);
            check_gpu_ok("markov_sample_seqs (declining)");
        }
        if (ci == 1) {
            pair w1b = weight_of(cfg[ci].dt, w1, V / 2, 2 * r), w2b = weight_of(cfg[ci].dt, w2, V / 2, 2 * r);
            pair pb2 = act(2 * G, V / 2, NULL), pe2 = act(2 * G, 2 * r, NULL);
            declined += !ds_spec(gpu)->markov_sample_seqs(gpu, 2, pb2.g, w1b.g, w2b.g, bf16, anchors, sp, u, pe2.g, tb);
            release(&w1b), release(&w2b), release(&pb2), release(&pe2);
        }
        release(&pbat), release(&pe), release(&pw1), release(&pw2);
        free(w1), free(w2), free(base), free(pb), free(ps), free(eb), free(es);
    }
    printf("  markov_sample_seqs (V 3000 / 151936, r 64 / 256, 2..32 sequences, mixed rules): %d walks vs alone: "
           "%d differ in tokens, %d in distributions, %d in Markov inputs; %d/4 refusals declined\n",
           walks, tok_differ, prob_differ, emb_differ, declined);
    CHECK(walks == 2 + 5 + 32 + 9, "%d walks compared", walks);
    CHECK(tok_differ == 0 && prob_differ == 0 && emb_differ == 0, "batched walks differ from the walks alone");
    CHECK(declined == 4, "markov_sample_seqs took %d calls it must decline", 4 - declined);
}

/* markov_greedy_seqs (the batched drafter's greedy walks, one wait)
 * against markov_greedy on each sequence alone, both on the GPU and pruned
 * by the same bound: tokens and Markov inputs bit for bit. */
static void test_greedy_markov_seqs(void) {
    const struct {
        int64_t V;
        int n;
    } cfg[] = {{3000, 5}, {151936, 12}};
    const int r = 64, G = 7;
    int walks = 0, tok_differ = 0, emb_differ = 0;
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        const int64_t V = cfg[ci].V;
        const int n = cfg[ci].n;
        float *w1 = malloc((size_t)(V * r) * sizeof *w1), *w2 = malloc((size_t)(V * r) * sizeof *w2);
        float *base = malloc((size_t)n * G * V * sizeof *base), *eb = malloc((size_t)n * G * r * sizeof *eb);
        float es[7 * 64];
        for (int64_t i = 0; i < V * r; i++) /* exact in bf16: the bound, built from these values, holds */
            w1[i] = (float)(int)(frand() * 16) / 256.0f, w2[i] = (float)(int)(frand() * 16) / 256.0f;
        for (int64_t i = 0; i < (int64_t)n * G * V; i++) base[i] = (float)(int)(frand() * 96) / 64.0f;
        pair pw1 = weight_of(DS_BF16, w1, V, r), pw2 = weight_of(DS_BF16, w2, V, r);
        test_bound tb;
        if (!test_bound_make(&tb, w2, (int)V, r)) break;
        int32_t anchors[DS_MARKOV_SEQS_MAX], tb_tok[DS_MARKOV_SEQS_MAX * 7], ts[7];
        for (int j = 0; j < n; j++) anchors[j] = (int32_t)((V / 11) * (j % 11) + j);
        pair pbat = act((int64_t)n * G, V, base), pe = act((int64_t)n * G, r + 3, NULL);
        const bool took = ds_spec(gpu)->markov_greedy_seqs(gpu, n, pbat.g, pw1.g, pw2.g, &tb.b, true, anchors,
                                                           ds_cols(pe.g, 2, r), tb_tok);
        check_gpu_ok("markov_greedy_seqs");
        CHECK(took, "markov_greedy_seqs declined V=%lld n=%d", (long long)V, n);
        gpu->ops->download(gpu, ds_cols(pe.g, 2, r), eb);
        for (int j = 0; j < n && took; j++) {
            pair p1 = act(G, V, base + (size_t)j * G * V), pe1 = act(G, r + 3, NULL);
            ds_spec(gpu)->markov_greedy(gpu, p1.g, ds_no_tensor(), pw1.g, pw2.g, &tb.b, true, anchors[j],
                                        ds_cols(pe1.g, 2, r), ts);
            check_gpu_ok("markov_greedy");
            gpu->ops->download(gpu, ds_cols(pe1.g, 2, r), es);
            walks++;
            tok_differ += memcmp(ts, tb_tok + j * G, sizeof ts) != 0;
            emb_differ += memcmp(es, eb + (size_t)j * G * r, (size_t)G * r * sizeof *es) != 0;
            release(&p1), release(&pe1);
        }
        test_bound_free(&tb);
        release(&pbat), release(&pe), release(&pw1), release(&pw2);
        free(w1), free(w2), free(base), free(eb);
    }
    printf("  markov_greedy_seqs (V 3000 / 151936, r 64, 5 / 12 sequences, pruned): %d walks vs alone: %d differ in "
           "tokens, %d in Markov inputs\n", walks, tok_differ, emb_differ);
    CHECK(walks == 5 + 12, "%d walks compared", walks);
    CHECK(tok_differ == 0 && emb_differ == 0, "batched greedy walks differ from the walks alone");
}

RUN_CUDA_TESTS("cuda_markov", test_markov_greedy, test_markov_greedy_head, test_sample_markov, test_sample_markov_seqs,
               test_greedy_markov_seqs)
