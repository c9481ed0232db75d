/* Golden checks shared by the target tests (test_qwen3.c, test_gemma4.c),
 * against the reference's fp32 fixtures: the prompt's logits and every
 * hidden state, and greedy decoding step by step. */
#include "target_goldens.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ds_error *open_target_fixture(ds_backend *be, const char *fix, const ds_target_opts *opts, ds_target **t,
                              ds_safetensors **g) {
    char path[512];
    snprintf(path, sizeof path, "%s/target", fix);
    DS_TRY(ds_target_open(be, path, opts, t));
    snprintf(path, sizeof path, "%s/golden.safetensors", fix);
    *g = golden_open(path);
    return NULL;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

void check_target_prompt(ds_target *t, ds_safetensors *g, double tol, const char *label) {
    ds_backend *be = t->be;
    size_t T;
    int32_t *ids = golden_i32(g, "prompt_ids", &T);
    float *logits = golden_f32(g, "target_logits_prompt", NULL);
    float *layers = golden_f32(g, "target_layer_outputs", NULL);
    float *hs = golden_f32(g, "target_hidden_states", NULL);
    float *fnorm = golden_f32(g, "target_final_norm", NULL);
    const int V = t->vocab, H = t->hidden, L = t->n_layers;
    int taps[DS_MAX_TAPS];
    for (int l = -1; l < L; l++) taps[l + 1] = l;
    CHECK_OK(ds_target_set_taps(t, taps, L + 1));
    CHECK_OK(ds_target_forward(t, ids, (int)T, 0, (int)T));

    float *got = malloc(T * (size_t)V * sizeof *got);
    be->ops->download(be, ds_rows(t->logits, 0, (int64_t)T), got);
    double err = rel_err_max(got, logits, T * (size_t)V), worst = 0;
    printf("  %s prompt logits: max rel err %.2e (tolerance %.0e)\n", label, err, tol);
    CHECK(err < tol, "prompt logits rel err %.3g", err);

    float *tp = malloc(T * (size_t)(L + 1) * H * sizeof *tp), *one = malloc(T * (size_t)H * sizeof *one);
    be->ops->download(be, ds_rows(t->taps, 0, (int64_t)T), tp);
    for (int l = -1; l < L; l++) {
        for (size_t r = 0; r < T; r++)
            memcpy(one + r * H, tp + r * (size_t)(L + 1) * H + (size_t)(l + 1) * H, (size_t)H * 4);
        /* hidden_states[0] = embeddings (x sqrt(H) for Gemma), [l+1] = layer l output for l < L-1;
         * layer_outputs[l] = raw layer l output (after Gemma's layer_scalar) for all. */
        err = rel_err_max(one, l < 0 ? hs : layers + (size_t)l * T * H, T * (size_t)H);
        if (err > worst) worst = err;
        CHECK(err < tol, "layer %d output rel err %.3g", l, err);
        if (l >= 0 && l < L - 1) {
            err = rel_err_max(one, hs + (size_t)(l + 1) * T * H, T * (size_t)H);
            CHECK(err < tol, "hidden_states[%d] rel err %.3g", l + 1, err);
        }
    }
    be->ops->download(be, ds_rows(t->final_hidden, 0, (int64_t)T), one);
    err = rel_err_max(one, fnorm, T * (size_t)H);
    printf("  hidden states: max rel err %.2e, final norm %.2e\n", worst, err);
    CHECK(err < tol, "final norm rel err %.3g", err);
    err = rel_err_max(one, hs + (size_t)L * T * H, T * (size_t)H);
    CHECK(err < tol, "hidden_states[L] rel err %.3g", err);

    free(got);
    free(tp);
    free(one);
    free(ids);
    free(logits);
    free(layers);
    free(hs);
    free(fnorm);
}

void check_target_greedy(ds_target *t, ds_safetensors *g, int pos, double tol, const char *label) {
    ds_backend *be = t->be;
    size_t N;
    int32_t *want = golden_i32(g, "ar_output_ids", &N);
    float *full = golden_f32(g, "target_logits_full", NULL);
    const int V = t->vocab;
    float *row = malloc((size_t)V * sizeof *row);
    double worst = 0;
    for (size_t i = 0; i < N; i++) {
        be->ops->download(be, ds_rows(t->logits, 0, 1), row);
        double err = rel_err_max(row, full + (size_t)(pos - 1) * V, (size_t)V);
        if (err > worst) worst = err;
        int32_t next = argmax(row, V);
        CHECK(next == want[i], "token %zu: got %d, want %d", i, next, want[i]);
        if (next != want[i]) break;
        CHECK_OK(ds_target_forward(t, &next, 1, pos++, 1));
    }
    printf("  %s greedy (max_rows %d): %zu tokens, step logits max rel err %.2e\n", label, t->max_rows, N, worst);
    CHECK(worst < tol, "decode logits rel err %.3g", worst);
    free(row);
    free(want);
    free(full);
}
