/* One drafter pass for many sequences (the batched engine, issue 39).
 * Drafting sequence by sequence reads every drafter weight once per
 * sequence; here the sequences' pending context rows go through one context
 * projection and K/V store, their blocks through one backbone forward and
 * one LM head, each row reading and writing its own sequence's pages
 * (ds_kv_pages: row_table, and row_keys for the block's attention). Then
 * each sequence's Markov walk, confidence and truncation run as
 * ds_drafter_round runs them. Every op is row invariant and a row sees only
 * its own sequence's keys, so each proposal is bit for bit the one
 * ds_drafter_round gives that sequence alone. */
#ifndef DS_DRAFTER_BATCH_H
#define DS_DRAFTER_BATCH_H

#include "draft/drafter.h"

/* One sequence of a batched round: ds_drafter_round's arguments, its page
 * list in the drafter's pool and its context length. */
typedef struct {
    int64_t id;                 /* named in errors (the caller's request number) */
    ds_tensor taps;             /* [>= n, n_taps * hidden] fp32: target taps of its pending context rows */
    /* Optional (with ds_draft_batch_opts.taps): the row of o->taps that
     * holds each pending row, in position order (taps: o->taps itself): rows
     * kept over several steps, wherever they are. At most the drafter's
     * gather buffer (ds_drafter_reserve_seqs: (gamma + 1) x max_seqs rows, 2
     * or more sequences). */
    const int32_t *taps_rows;
    int pos0, n;                /* their positions pos0..pos0+n-1 (n 0: none); pos0 <= *n_ctx, n <= d->max_rows */
    int32_t anchor;             /* the block's first token, at position start */
    int start;                  /* pos0 + n (*n_ctx when n is 0) */
    const ds_sampling *sampling;
    float threshold;
    ds_rng *rng;                /* its own stream: a sampled walk draws from it as ds_drafter_round would */
    const int32_t *pages;       /* its page list: must cover positions 0..start+gamma-1 */
    int n_pages;
    int *n_ctx;                 /* in: the context rows its pages hold; out: after this round's append */
} ds_draft_seq;

typedef struct {
    int page_rows; /* rows a page of the drafter's caches holds */
    /* Optional: the tensor every sequence's taps are rows of (a view of its
     * own allocation: the target's taps). The context pass then gathers
     * them with one row gather (the backend's embed) per 64 rows instead of
     * one copy a sequence: at 256 in flight, 256 launches a step. */
    ds_tensor taps;
    /* Optional: called once sequence r's proposal is final, before the next
     * sequence's walk reuses the drafter buffers that out->probs,
     * out->probs_dev and out->logits point into, so the caller can keep
     * them. An error stops the round and is returned. */
    ds_error *(*done)(void *ctx, int r, ds_proposal *out);
    void *ctx;
} ds_draft_batch_opts;

/* Grows d's buffers (never shrinks them) so that one pass takes max_seqs
 * blocks and their sequences' pending context (max_seqs x (gamma + 1)
 * rows). ds_drafter_open does it for ds_drafter_opts.max_seqs. */
ds_error *ds_drafter_reserve_seqs(ds_drafter *d, int max_seqs);

/* Drafts for seqs[0..R) at once: out[r] is what ds_drafter_round(d,
 * seqs[r].taps, pos0, n, anchor, start, sampling, threshold, false, rng)
 * gives with d->pages on that sequence's list and d->n_ctx = *n_ctx, bit for
 * bit (tokens, confidence logits, n, distributions). More sequences than
 * d->max_seqs run as several passes of at most max_seqs blocks. Every
 * sequence is checked before anything runs. d->pages and d->n_ctx are left
 * as they were. */
ds_error *ds_drafter_round_batch(ds_drafter *d, int R, const ds_draft_seq *seqs, const ds_draft_batch_opts *o,
                                 ds_proposal *out);
/* The context half alone: each sequence's pending rows appended (what
 * ds_drafter_append would do for each), in the passes ds_drafter_round_batch
 * makes, and no block: for a step that verifies without drafting. */
ds_error *ds_drafter_context_batch(ds_drafter *d, int R, const ds_draft_seq *seqs, const ds_draft_batch_opts *o);

#endif
