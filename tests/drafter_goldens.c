/* Golden checks shared by the drafter tests (test_dspark.c for Qwen3,
 * test_dspark_gemma4.c for Gemma 4), against the reference's fp32 fixtures:
 *  - round 0: context projection, block hidden states, base logits (after
 *    any soft-cap) and Markov-corrected logits within 1e-4 relative error,
 *    draft tokens exact, confidences within 1e-5;
 *  - every round replayed from the golden verify inputs: drafts and
 *    confidences of all rounds, base / Markov logits of the recorded ones,
 *    which checks the incremental context rows;
 *  - the speculative greedy run: tokens and per-round accepted lengths
 *    identical, and plain greedy decoding gives the same tokens. */
#include "drafter_goldens.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "speculate/generate.h"
#include "testlib.h"

#define TOL 1e-4

static double sigmoid(double x) { return 1 / (1 + exp(-x)); }

ds_error *open_target_and_drafter(ds_backend *be, const char *target_dir, const ds_target_opts *topts,
                                  const char *drafter_dir, const ds_drafter_opts *dopts, ds_target **t,
                                  ds_drafter **d) {
    DS_TRY(ds_target_open(be, target_dir, topts, t));
    ds_error *e = ds_drafter_open(be, drafter_dir, *t, dopts, d);
    if (e) ds_target_free(*t);
    return e;
}

void check_drafter_round0(ds_backend *be, const char *target_dir, const char *drafter_dir, const char *golden) {
    ds_target *t;
    ds_drafter *d;
    CHECK_OK(open_target_and_drafter(be, target_dir, NULL, drafter_dir, NULL, &t, &d));
    if (d) d->keep_logits = true; /* the Markov-corrected logits are compared below */
    ds_safetensors *g = golden_open(golden);
    size_t T, n;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    float *ctx_want = golden_f32(g, "context_projected", NULL);
    float *hid_want = golden_f32(g, "round0_block_hidden", NULL);
    float *base_want = golden_f32(g, "round0_base_logits", NULL);
    float *markov_want = golden_f32(g, "round0_markov_logits", NULL);
    int32_t *draft_want = golden_i32(g, "round0_draft_tokens", &n);
    int32_t *block_in = golden_i32(g, "round0_block_input_ids", NULL);
    float *conf_want = golden_f32(g, "round0_confidence_logits", NULL);
    const int H = d->hidden, V = d->vocab, G = d->gamma;
    CHECK(n == (size_t)G, "gamma %d vs golden %zu", G, n);
    float *got = malloc(T * (size_t)V * sizeof *got);
    if (!ids || !ctx_want || !hid_want || !base_want || !markov_want || !draft_want || !block_in || !conf_want ||
        !got || n != (size_t)G)
        goto out;

    CHECK_OK(ds_target_set_taps(t, d->tap_layers, d->n_taps));
    CHECK_OK(ds_target_forward(t, ids, (int)T, 0, 1));
    CHECK_OK(ds_drafter_append(d, t->taps, 0, (int)T));
    be->ops->download(be, ds_rows(d->ctx, 0, (int64_t)T), got);
    double err = rel_err_max(got, ctx_want, T * (size_t)H);
    printf("  context projection rel err %.2e\n", err);
    CHECK(err < TOL, "context_projected rel err %.3g", err);

    ds_sampling greedy = {0};
    ds_proposal prop;
    CHECK_OK(ds_drafter_propose(d, block_in[0], (int)T, &greedy, 0, NULL, &prop));
    be->ops->download(be, d->block_hidden, got);
    err = rel_err_max(got, hid_want, (size_t)G * H);
    printf("  block hidden rel err %.2e\n", err);
    CHECK(err < TOL, "block hidden rel err %.3g", err);
    be->ops->download(be, d->logits, got);
    err = rel_err_max(got, base_want, (size_t)G * V);
    printf("  base logits rel err %.2e\n", err);
    CHECK(err < TOL, "base logits rel err %.3g", err);
    err = rel_err_max(prop.logits, markov_want, (size_t)G * V);
    printf("  markov logits rel err %.2e\n", err);
    CHECK(err < TOL, "markov logits rel err %.3g", err);
    for (int k = 0; k < G; k++)
        CHECK(prop.tokens[k] == draft_want[k], "draft %d: %d vs %d", k, prop.tokens[k], draft_want[k]);
    double cerr = 0;
    for (int k = 0; k < G; k++) cerr = fmax(cerr, fabs(sigmoid(prop.conf_logit[k]) - sigmoid(conf_want[k])));
    printf("  confidence max abs err %.2e\n", cerr);
    CHECK(cerr < 1e-5, "confidence err %.3g", cerr);
    CHECK(prop.n == G, "threshold 0 keeps all %d, got %d", G, prop.n);

out:
    free(got);
    free(ids);
    free(ctx_want);
    free(hid_want);
    free(base_want);
    free(markov_want);
    free(draft_want);
    free(block_in);
    free(conf_want);
    golden_close(g);
    ds_drafter_free(d);
    ds_target_free(t);
}

/* Golden per-round data, as the reference's loop recorded it. */
typedef struct {
    size_t T, R, nb;
    int32_t *ids, *start, *verify, *accepted;
    float *conf, *base, *markov;
} rounds_golden;

static void rounds_free(rounds_golden *r) {
    free(r->ids);
    free(r->start);
    free(r->verify);
    free(r->accepted);
    free(r->conf);
    free(r->base);
    free(r->markov);
}

/* Replays every round from the golden verify inputs and accepted lengths
 * (prefill with chunk-sized appends, then per round: propose, verify,
 * crop, append the anchor's and accepted drafts' taps), checking the
 * drafter's numbers of each round, not just round 0. */
static void replay_rounds(ds_backend *be, ds_target *t, ds_drafter *d, const rounds_golden *gr) {
    const int G = d->gamma, V = d->vocab, T = (int)gr->T;
    ds_sampling greedy = {0};
    double conf_err = 0, base_err = 0, markov_err = 0;
    float *got = malloc((size_t)G * V * sizeof *got);
    if (!got) return;
    const int chunk = t->max_rows < d->max_rows ? t->max_rows : d->max_rows;
    for (int p0 = 0; p0 < T; p0 += chunk) {
        int m = T - p0 < chunk ? T - p0 : chunk;
        CHECK_OK(ds_target_forward(t, gr->ids + p0, m, p0, p0 + m == T ? 1 : 0));
        CHECK_OK(ds_drafter_append(d, t->taps, p0, m));
    }
    for (size_t r = 0; r < gr->R; r++) {
        const int32_t *vin = gr->verify + r * (size_t)(G + 1);
        const int start = gr->start[r], a = gr->accepted[r];
        ds_proposal prop;
        CHECK_OK(ds_drafter_propose(d, vin[0], start, &greedy, 0, NULL, &prop));
        for (int k = 0; k < G; k++) {
            CHECK(prop.tokens[k] == vin[k + 1], "round %zu draft %d: %d vs %d", r, k, prop.tokens[k], vin[k + 1]);
            conf_err = fmax(conf_err, fabs(sigmoid(prop.conf_logit[k]) - sigmoid(gr->conf[r * G + k])));
        }
        if (r < gr->nb) {
            be->ops->download(be, d->logits, got);
            base_err = fmax(base_err, rel_err_max(got, gr->base + r * (size_t)G * V, (size_t)G * V));
            markov_err = fmax(markov_err, rel_err_max(prop.logits, gr->markov + r * (size_t)G * V, (size_t)G * V));
        }
        CHECK_OK(ds_target_forward(t, vin, G + 1, start, G + 1));
        ds_target_crop(t, start + a + 1);
        CHECK_OK(ds_drafter_append(d, t->taps, start, a + 1));
    }
    printf("  %zu rounds replayed: confidence max abs err %.2e; rounds 0..%zu base rel err %.2e, markov %.2e\n",
           gr->R, conf_err, gr->nb - 1, base_err, markov_err);
    CHECK(conf_err < 1e-5, "per-round confidence err %.3g", conf_err);
    CHECK(base_err < TOL, "per-round base logits rel err %.3g", base_err);
    CHECK(markov_err < TOL, "per-round markov logits rel err %.3g", markov_err);
    free(got);
}

void check_drafter_rounds(ds_backend *be, const char *target_dir, const char *drafter_dir, const char *golden,
                          const ds_drafter_opts *dopts) {
    ds_target *t;
    ds_drafter *d;
    CHECK_OK(open_target_and_drafter(be, target_dir, NULL, drafter_dir, dopts, &t, &d));
    if (d) d->keep_logits = true;
    ds_safetensors *g = golden_open(golden);
    rounds_golden gr = {0};
    size_t nv, nc, nbase;
    gr.ids = golden_i32(g, "prompt_ids", &gr.T);
    gr.start = golden_i32(g, "spec_round_start", &gr.R);
    gr.verify = golden_i32(g, "spec_round_verify_input_ids", &nv);
    gr.accepted = golden_i32(g, "spec_accepted_draft_lengths", NULL);
    gr.conf = golden_f32(g, "spec_round_confidence_logits", &nc);
    gr.base = golden_f32(g, "spec_round_base_logits", &nbase);
    gr.markov = golden_f32(g, "spec_round_markov_logits", NULL);
    const size_t G = (size_t)d->gamma, V = (size_t)d->vocab;
    gr.nb = nbase / (G * V);
    CHECK(nv == gr.R * (G + 1) && nc == gr.R * G && gr.nb >= 1 && gr.nb <= gr.R, "golden round shapes");
    if (gr.ids && gr.start && gr.verify && gr.accepted && gr.conf && gr.base && gr.markov && nv == gr.R * (G + 1) &&
        nc == gr.R * G && gr.nb >= 1 && gr.nb <= gr.R) {
        ds_error *te = ds_target_set_taps(t, d->tap_layers, d->n_taps);
        CHECK(te == NULL, "set taps: %s", te ? ds_error_message(te) : "");
        ds_error_free(te);
        replay_rounds(be, t, d, &gr);
    }
    rounds_free(&gr);
    golden_close(g);
    ds_drafter_free(d);
    ds_target_free(t);
}

/* The speculative greedy run and plain greedy decoding on the same target:
 * both equal the golden (and so each other), round by round for the former. */
void check_drafter_spec_run(ds_backend *be, const char *target_dir, const char *drafter_dir, const char *golden) {
    ds_target *t;
    ds_drafter *d;
    CHECK_OK(open_target_and_drafter(be, target_dir, NULL, drafter_dir, NULL, &t, &d));
    ds_safetensors *g = golden_open(golden);
    size_t T, N, R, NA;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    int32_t *want = golden_i32(g, "spec_output_ids", &N);
    int32_t *ar_want = golden_i32(g, "ar_output_ids", &NA);
    int32_t *acc_want = golden_i32(g, "spec_accepted_draft_lengths", &R);
    ds_gen_params p = {.max_new = (int)N, .ignore_stop = true};
    ds_gen_result r, ar;
    ds_error *e = ds_generate(t, d, ids, (int)T, &p, NULL, NULL, &r);
    CHECK(e == NULL, "speculative run: %s", e ? ds_error_message(e) : "");
    if (!e && ids && want && acc_want) {
        CHECK(r.n_tokens == (int)N, "%d tokens, want %zu", r.n_tokens, N);
        for (int i = 0; i < r.n_tokens && i < (int)N; i++)
            CHECK(r.tokens[i] == want[i], "token %d: %d vs %d", i, r.tokens[i], want[i]);
        CHECK(r.rounds == (int)R, "%d rounds, want %zu", r.rounds, R);
        for (int i = 0; i < r.rounds && i < (int)R; i++)
            CHECK(r.accepted[i] == acc_want[i], "round %d accepted %d, want %d", i, r.accepted[i], acc_want[i]);
        int sum = 0;
        for (int i = 0; i < r.rounds; i++) sum += r.accepted[i];
        printf("  %d rounds, %d drafts accepted\n", r.rounds, sum);
        ds_gen_result_free(&r);
    }
    ds_error_free(e);
    e = ds_generate(t, NULL, ids, (int)T, &p, NULL, NULL, &ar);
    CHECK(e == NULL, "autoregressive run: %s", e ? ds_error_message(e) : "");
    if (!e && ar_want && want) {
        CHECK(ar.n_tokens == (int)NA, "AR: %d tokens, want %zu", ar.n_tokens, NA);
        for (int i = 0; i < ar.n_tokens && i < (int)NA && i < (int)N; i++)
            CHECK(ar.tokens[i] == ar_want[i] && ar.tokens[i] == want[i], "AR token %d: %d vs %d", i, ar.tokens[i],
                  ar_want[i]);
        ds_gen_result_free(&ar);
    }
    ds_error_free(e);
    free(ids);
    free(want);
    free(ar_want);
    free(acc_want);
    golden_close(g);
    ds_drafter_free(d);
    ds_target_free(t);
}

