/* One speculative round (SPEC §5): the drafter proposes a block after the
 * anchor, one target forward verifies it, acceptance keeps what the target
 * agrees with (greedy: the longest agreeing prefix and the target's next
 * token; sampling: the rejection rule), and the commit crops the target's
 * KV cache to the committed tokens and leaves their taps for the drafter's
 * next round. ds_generate runs rounds until it stops; dspark bench times one. */
#ifndef DS_ROUND_H
#define DS_ROUND_H

#include "draft/drafter.h"
#include "model/target.h"
#include "sample/sampling.h"
#include "sample/verify.h"

/* What one round hands the next. */
typedef struct {
    int32_t anchor;      /* the last committed token, not yet in the target's KV cache */
    int start;           /* its position (the target caches positions 0..start-1) */
    int ctx_pos0, ctx_n; /* target rows whose taps the drafter has not received yet: the next
                            round appends them in the same drafter step as its block */
} ds_round_state;

typedef struct {
    ds_sampling sampling;
    float threshold;        /* confidence threshold (<= 0: keep all gamma) */
    int gamma;              /* proposal positions to verify (0: the drafter's block size) */
    bool ignore_stop;       /* a stop token among the accepted drafts does not end the round */
    ds_verify_fn verify;    /* NULL: ds_verify, or the target's own verification on the backend */
    float *logits, *scratch; /* host work of a host verification: [(block size + 1) * vocab],
                                [2 * vocab]; unused by greedy rounds */
} ds_round_params;

typedef struct {
    int32_t tokens[DS_MAX_GAMMA + 1]; /* committed, in order: the accepted drafts, then the
                                         target's token (none after a stop draft) */
    int n_tokens;
    int accepted;    /* drafts accepted (through the stop draft when one ends the round) */
    int proposed;    /* drafts verified (accepted, when a stop draft ends the round) */
    bool stop_draft; /* an accepted draft is a stop token: the output ends there, so the
                        caches and the state are left as the verify left them */
    bool has_conf;   /* conf_logit holds the drafter's gamma raw confidence logits (a confidence
                        head, and the proposal drafted on the host path: keep_on_backend false) */
    float conf_logit[DS_MAX_GAMMA];
    double draft_s, verify_s;
} ds_round_result;

/* One round from st, which it advances. keep_on_backend: a greedy round
 * verified by the target (p->verify NULL) may leave the drafted tokens and
 * the proposal length on the backend, where the verify step reads them, so
 * that the round costs one device->host copy (the target must run its
 * forward as a step region, t->graph_safe). */
ds_error *ds_round(ds_target *t, ds_drafter *d, const ds_round_params *p, bool keep_on_backend, ds_rng *rng,
                   ds_round_state *st, ds_round_result *out);

/* Greedy verification of prop as one target step: scores [anchor,
 * draft_0 .. draft_{cap-1}] at pos0.. (cap <= gamma, the drafter's block
 * size; rows past the proposal's length change nothing, rows being causal
 * and row invariant), takes each row's argmax into best[0..cap] and accepts
 * the longest prefix a < m = min(cap, prop->n) with best[i] == draft_i
 * (backend.h accept_prefix): *n_out = m, *accepted = a; the accepted
 * drafts are best[0..a), the next token best[a]. The proposal's first
 * prop->n_kept entries of [tokens, n] are on the backend (ds_proposal).
 * On a backend that records steps: one recording per (cap, gamma), one
 * device->host copy. */
ds_error *ds_round_verify_greedy(ds_target *t, int32_t anchor, const ds_proposal *prop, int gamma, int cap, int pos0,
                                 int32_t *best, int *n_out, int *accepted);

/* Rejection sampling where the logits are (backend.h verify_sample) of the
 * last forward's logits rows row0..row0+n (a batched step's sequence owns
 * some rows of it). With n = 0, one draw from row row0's processed
 * distribution, as the host's ds_sample_probs would draw it. */
ds_error *ds_round_verify_sample(ds_target *t, int64_t row0, const int32_t *draft, int n, ds_tensor draft_probs,
                                 const ds_sampling *s, ds_rng *rng, int *accepted, int32_t *next);

/* ds_round_verify_sample for m requests' rows of the last forward at once:
 * request i verifies rows row0..row0+n with its drafts, draft
 * distributions and rule, its n + 1 uniforms drawn from its rng as
 * ds_round_verify_sample draws them; accepted[i] and next[i] are what m
 * calls of it give, with one wait for all where the backend has
 * verify_sample_many (a batched step's requests). */
typedef struct {
    int64_t row0;
    const int32_t *draft;
    int n;
    ds_tensor draft_probs;
    const ds_sampling *s;
    ds_rng *rng;
} ds_round_verify_req;
ds_error *ds_round_verify_sample_many(ds_target *t, int m, const ds_round_verify_req *req, int *accepted,
                                      int32_t *next);

/* The last forward's first rows of logits on the host; a failed device op
 * surfaces here, the download waiting for the backend. */
ds_error *ds_round_fetch_logits(ds_target *t, int rows, float *logits);

#endif
