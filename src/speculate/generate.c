#include "speculate/generate.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "sample/draw.h"
#include "sample/probs.h"
#include "speculate/round.h"

typedef struct {
    ds_target *t;
    const ds_gen_params *p;
    ds_token_fn on_token;
    void *user;
    ds_gen_result *r;
    int max_tokens; /* max_new, or fewer when the context ends first */
    bool done;      /* a stop token was emitted or the caller asked to stop */
    bool cancelled; /* the caller asked to stop */
} emitter;

/* Commits one token: records and streams it unless max_new tokens are out
 * already (the reference's last round may overshoot; its output is trimmed),
 * and ends the generation on a stop token or when the caller asks. */
static void emit(emitter *em, int32_t tok) {
    ds_gen_result *r = em->r;
    if (em->done || r->n_tokens >= em->max_tokens) return;
    r->tokens[r->n_tokens++] = tok;
    if (em->on_token && !em->on_token(em->user, tok)) em->done = em->cancelled = true;
    if (!em->p->ignore_stop && ds_target_is_stop(em->t, tok)) {
        r->stopped = true;
        em->done = true;
    }
}

static bool is_stop(const emitter *em, int32_t tok) { return !em->p->ignore_stop && ds_target_is_stop(em->t, tok); }

static int32_t pick(const float *logits, int V, const ds_sampling *s, ds_rng *rng, float *probs) {
    if (ds_sampling_greedy(s)) return ds_argmax(logits, V);
    ds_probs_from_logits(logits, V, s, probs);
    return ds_sample_probs(probs, V, rng);
}

/* Greedy decisions need only each row's argmax, computed where the logits
 * are (on a GPU only the indices cross to the host). */
static ds_error *fetch_argmax(ds_target *t, int rows, int32_t *out) {
    ds_target_argmax(t, rows, out);
    return ds_backend_check(t->be);
}

/* The token after the last forward's last row: its argmax (greedy) or a
 * draw from its processed distribution. */
static ds_error *next_token(ds_target *t, const ds_sampling *s, ds_rng *rng, float *logits, float *probs,
                            int32_t *out) {
    if (ds_sampling_greedy(s)) return fetch_argmax(t, 1, out);
    int unused;
    if (ds_spec(t->be)->verify_sample) return ds_round_verify_sample(t, 0, NULL, 0, ds_no_tensor(), s, rng, &unused, out);
    DS_TRY(ds_round_fetch_logits(t, 1, logits));
    *out = pick(logits, t->vocab, s, rng, probs);
    return NULL;
}

ds_error *ds_gen_result_add_round(ds_gen_result *r, int accepted, int proposed, int len) {
    /* Capacity 16, then doubled whenever the count reaches a power of two. */
    if (r->rounds == 0 || (r->rounds >= 16 && (r->rounds & (r->rounds - 1)) == 0)) {
        size_t cap = r->rounds ? (size_t)r->rounds * 2 : 16;
        int *a = realloc(r->accepted, cap * sizeof *a);
        if (a) r->accepted = a;
        int *p = realloc(r->proposed, cap * sizeof *p);
        if (p) r->proposed = p;
        int *l = realloc(r->accept_len, cap * sizeof *l);
        if (l) r->accept_len = l;
        if (!a || !p || !l) return ds_errorf("out of memory");
    }
    r->accepted[r->rounds] = accepted;
    r->proposed[r->rounds] = proposed;
    r->accept_len[r->rounds] = len;
    r->rounds++;
    return NULL;
}

/* Keeps the last recorded round's G confidence logits (record_conf), the
 * array growing as the rounds' do. */
static ds_error *record_conf(ds_gen_result *r, const float *conf, int G) {
    const int i = r->rounds - 1;
    if (i == 0 || (i >= 16 && (i & (i - 1)) == 0)) {
        float *c = realloc(r->conf, (size_t)(i ? 2 * i : 16) * (size_t)G * sizeof *c);
        if (!c) return ds_errorf("out of memory");
        r->conf = c;
    }
    memcpy(r->conf + (size_t)i * (size_t)G, conf, (size_t)G * sizeof *conf);
    return NULL;
}

/* Prefill in chunks; the drafter context receives every prompt row's taps. */
static ds_error *prefill(ds_target *t, ds_drafter *d, const int32_t *prompt, int n) {
    int chunk = t->max_rows;
    if (d && d->max_rows < chunk) chunk = d->max_rows;
    for (int p0 = 0; p0 < n; p0 += chunk) {
        int m = n - p0 < chunk ? n - p0 : chunk;
        DS_TRY(ds_target_forward(t, prompt + p0, m, p0, p0 + m == n ? 1 : 0));
        if (d) DS_TRY(ds_drafter_append(d, t->taps, p0, m));
    }
    return NULL;
}

/* DSpark rounds from the first token on, each committing its tokens as
 * soon as it ends, until the output or the context is full or a stop token
 * (speculate/round.c has the round itself). */
static ds_error *speculate(emitter *em, ds_drafter *d, int n_prompt, int32_t first, ds_rng *rng, float *logits,
                           float *scratch) {
    ds_target *t = em->t;
    const ds_gen_params *p = em->p;
    ds_gen_result *r = em->r;
    const ds_round_params rp = {.sampling = p->sampling, .threshold = p->threshold, .gamma = p->gamma,
                                .ignore_stop = p->ignore_stop, .verify = p->verify, .logits = logits,
                                .scratch = scratch};
    /* Greedy rounds verified by the target's argmax keep the drafts on the
     * backend where its forward runs as a step region. */
    const bool keep = ds_sampling_greedy(&p->sampling) && !p->verify && t->graph_safe && !p->record_conf;
    ds_round_state st = {.anchor = first, .start = n_prompt, .ctx_pos0 = n_prompt, .ctx_n = 0};
    /* start - n_prompt, not n_prompt + max_new: max_new may be INT_MAX. */
    while (st.start - n_prompt < p->max_new && !em->done && st.start < t->max_ctx) {
        ds_round_result rr;
        DS_TRY(ds_round(t, d, &rp, keep, rng, &st, &rr));
        r->draft_s += rr.draft_s;
        r->verify_s += rr.verify_s;
        DS_TRY(ds_gen_result_add_round(r, rr.accepted, rr.proposed, rr.n_tokens));
        if (p->record_conf && rr.has_conf) DS_TRY(record_conf(r, rr.conf_logit, d->gamma));
        for (int i = 0; i < rr.n_tokens; i++) emit(em, rr.tokens[i]);
        if (rr.stop_draft || is_stop(em, st.anchor)) break;
    }
    /* The last round's rows: the drafter's context matches the target's. */
    return ds_drafter_append(d, t->taps, st.ctx_pos0, st.ctx_n);
}

static ds_error *autoregress(emitter *em, int n_prompt, int32_t last, ds_rng *rng, float *logits, float *probs) {
    ds_target *t = em->t;
    for (int pos = n_prompt; !em->done && em->r->n_tokens < em->p->max_new; pos++) {
        if (pos >= t->max_ctx) break;
        if (ds_sampling_greedy(&em->p->sampling)) { /* forward and argmax: one step region on the GPU */
            DS_TRY(ds_target_forward_argmax(t, &last, 1, pos, 1, &last));
            DS_TRY(ds_backend_check(t->be));
        } else {
            DS_TRY(ds_target_forward(t, &last, 1, pos, 1));
            DS_TRY(next_token(t, &em->p->sampling, rng, logits, probs, &last));
        }
        emit(em, last);
    }
    return NULL;
}

ds_error *ds_generate(ds_target *t, ds_drafter *d, const int32_t *prompt, int n_prompt, const ds_gen_params *p,
                      ds_token_fn on_token, void *user, ds_gen_result *out) {
    memset(out, 0, sizeof *out);
    if (n_prompt < 1) return ds_errorf("empty prompt");
    if (n_prompt >= t->max_ctx)
        return ds_errorf("prompt of %d tokens does not fit the model's context of %d tokens", n_prompt, t->max_ctx);
    if (p->max_new < 0) return ds_errorf("max_new %d is negative", p->max_new);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= t->vocab)
            return ds_errorf("prompt token %d at index %d is outside the vocabulary (0..%d)", prompt[i], i,
                             t->vocab - 1);
    if (d && (t->n_taps != d->n_taps || memcmp(t->tap_layers, d->tap_layers, (size_t)d->n_taps * sizeof(int))))
        DS_TRY(ds_target_set_taps(t, d->tap_layers, d->n_taps));
    const int V = t->vocab, G = d ? d->gamma : 0;
    /* Every generated token but the first needs a context position: size the
     * output by that, not by max_new (which may be INT_MAX). */
    const int room = t->max_ctx - n_prompt + 1, max_tokens = p->max_new < room ? p->max_new : room;
    out->tokens = malloc((size_t)(max_tokens + 1) * sizeof *out->tokens);
    float *logits = malloc((size_t)(G + 1) * V * sizeof *logits);
    float *scratch = malloc((size_t)2 * V * sizeof *scratch);
    ds_error *e = out->tokens && logits && scratch ? NULL : ds_errorf("out of memory");
    ds_rng rng;
    ds_rng_seed(&rng, p->seed);
    emitter em = {.t = t, .p = p, .on_token = on_token, .user = user, .r = out, .max_tokens = max_tokens,
                  .done = p->max_new == 0};
    double t0 = ds_now_s();
    ds_target_crop(t, 0);
    if (d) d->n_ctx = 0;
    if (!e) e = prefill(t, d, prompt, n_prompt);
    /* A GPU runs the prefill after its calls return: wait for it, or its time
     * is counted in the first decode step instead. The first token's argmax
     * waits for it anyway. */
    if (!e) e = ds_backend_check(t->be);
    if (!e && d && d->be != t->be) e = ds_backend_check(d->be);
    out->prefill_s = ds_now_s() - t0;
    int32_t first = 0;
    if (!e && !em.done) e = next_token(t, &p->sampling, &rng, logits, scratch, &first);
    if (!e && !em.done) {
        emit(&em, first);
        if (!is_stop(&em, first)) {
            if (d) e = speculate(&em, d, n_prompt, first, &rng, logits, scratch);
            else e = autoregress(&em, n_prompt, first, &rng, logits, scratch);
        }
    }
    out->total_s = ds_now_s() - t0;
    /* Neither a stop token, the caller nor max_new ended it: every loop
     * also ends where the context does. */
    out->stop_reason = out->stopped ? DS_STOP_TOKEN
                       : em.cancelled ? DS_STOP_CALLER
                       : out->n_tokens >= p->max_new ? DS_STOP_LENGTH
                                                     : DS_STOP_CONTEXT;
    free(logits);
    free(scratch);
    if (e) ds_gen_result_free(out);
    return e;
}

const char *ds_stop_reason_name(ds_stop_reason r) {
    switch (r) {
    case DS_STOP_LENGTH: return "length";
    case DS_STOP_TOKEN: return "stop";
    case DS_STOP_CONTEXT: return "context";
    case DS_STOP_CALLER: return "caller";
    }
    return "unknown";
}

void ds_gen_result_free(ds_gen_result *r) {
    free(r->tokens);
    free(r->accepted);
    free(r->proposed);
    free(r->accept_len);
    free(r->conf);
    memset(r, 0, sizeof *r);
}
