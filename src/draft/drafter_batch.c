/* ds_drafter_round_batch: one context pass, one block forward and one LM
 * head for many sequences, then each sequence's walk (drafter_batch.h). */
#include "draft/drafter_batch.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Blocks one pass takes. */
static int seqs_per_pass(const ds_drafter *d) { return d->max_seqs > 1 ? d->max_seqs : 1; }

/* Allocates a fresh tensor, then releases the old one: a failed growth
 * leaves the old (smaller, still valid) buffer in place. */
static ds_error *regrow(ds_backend *be, ds_tensor *t, int64_t rows, int64_t cols) {
    ds_tensor n;
    DS_TRY(be->ops->alloc(be, DS_F32, rows, cols, &n));
    be->ops->release(be, t);
    *t = n;
    return NULL;
}

ds_error *ds_drafter_reserve_seqs(ds_drafter *d, int max_seqs) {
    if (max_seqs < 1) return ds_errorf("drafter: max_seqs %d must be at least 1", max_seqs);
    if (max_seqs <= seqs_per_pass(d)) return NULL;
    if (!d->ops->reserve)
        return ds_errorf("%s: the %s drafter cannot draft several sequences in one pass", d->ck->dir, d->arch);
    ds_backend *be = d->be;
    const int G = d->gamma;
    const int64_t rows = (int64_t)max_seqs * G, ctx = (int64_t)max_seqs * (G + 1);
    if (rows > (1 << 24)) return ds_errorf("drafter: max_seqs %d is too large", max_seqs);
    const int ctx_rows = ctx > d->max_rows ? (int)ctx : d->max_rows;
    DS_TRY(regrow(be, &d->batch_hidden, rows, d->hidden));
    DS_TRY(regrow(be, &d->batch_logits, rows, d->vocab));
    DS_TRY(regrow(be, &d->batch_taps, ctx, (int64_t)d->n_taps * d->hidden));
    if (d->ctx.rows < ctx_rows) DS_TRY(regrow(be, &d->ctx, ctx_rows, d->hidden));
    DS_TRY(d->ops->reserve(d, (int)rows, ctx_rows));
    if ((ds_spec(be)->markov_sample_seqs || ds_spec(be)->markov_greedy_seqs) && d->markov == DS_MARKOV_VANILLA &&
        !d->seqs_feat.data) {
        DS_TRY(regrow(be, &d->seqs_feat, (int64_t)DS_MARKOV_SEQS_MAX * G, (int64_t)d->hidden + d->markov_rank));
        DS_TRY(regrow(be, &d->seqs_conf, (int64_t)DS_MARKOV_SEQS_MAX * G, 1));
    }
    d->max_seqs = max_seqs;
    return NULL;
}

/* Everything ds_drafter_round would refuse, and what a batch adds (pages
 * that hold the block, where it drafts one), before any op runs. */
static ds_error *check_seq(const ds_drafter *d, const ds_draft_seq *q, int page_rows, bool block) {
    const long long id = (long long)q->id;
    if (!q->n_ctx || !q->sampling || !q->rng || !q->pages)
        return ds_errorf("drafter sequence %lld: no %s", id,
                         !q->n_ctx ? "n_ctx" : !q->sampling ? "sampling" : !q->rng ? "rng" : "page list");
    if (q->n < 0) return ds_errorf("drafter sequence %lld: %d pending context rows", id, q->n);
    if (q->n > 0) {
        if (q->n > d->max_rows)
            return ds_errorf("drafter sequence %lld: context append of %d rows (at most %d)", id, q->n, d->max_rows);
        if (q->pos0 < 0 || q->pos0 > *q->n_ctx)
            return ds_errorf("drafter sequence %lld: context append at position %d but it holds %d rows", id, q->pos0,
                             *q->n_ctx);
        if (q->pos0 + q->n > d->max_ctx)
            return ds_errorf("drafter sequence %lld: context of %d rows exceeds %d", id, q->pos0 + q->n, d->max_ctx);
        if (!q->taps.data || q->taps.rows < q->n || q->taps.cols != (int64_t)d->n_taps * d->hidden ||
            q->taps.dtype != DS_F32)
            return ds_errorf("drafter sequence %lld: taps of %lld x %lld for %d rows of %d fp32 taps x %d", id,
                             (long long)q->taps.rows, (long long)q->taps.cols, q->n, d->n_taps, d->hidden);
    }
    const int have = q->n > 0 ? q->pos0 + q->n : *q->n_ctx;
    if (q->start != have)
        return ds_errorf("drafter sequence %lld: drafting at position %d but its context holds %d rows", id, q->start,
                         have);
    if (q->anchor < 0 || q->anchor >= d->vocab)
        return ds_errorf("drafter sequence %lld: anchor token %d is outside the vocabulary (0..%d)", id, q->anchor,
                         d->vocab - 1);
    if (block && (int64_t)q->n_pages * page_rows < (int64_t)q->start + d->gamma)
        return ds_errorf("drafter sequence %lld: %d pages of %d rows cannot hold its block at positions %d..%d", id,
                         q->n_pages, page_rows, q->start, q->start + d->gamma - 1);
    return NULL;
}

/* Host arrays of one call: the sequences' page lists concatenated (base[r]:
 * where r's starts), and per row of a context chunk or a block pass its
 * position, list start, and (blocks) id and key limit. */
typedef struct {
    int32_t *table, *base;
    int32_t *cpos, *crt, *csrc;           /* context chunk rows (csrc: row of o->taps it gathers) */
    int32_t *ids, *bpos, *brt, *bkeys;    /* block rows */
} host_rows;

/* The row of o->taps where q's taps start (check_taps_source: they are rows of it). */
static int32_t taps_row(const ds_draft_batch_opts *o, const ds_draft_seq *q) {
    const uintptr_t row_bytes = (uintptr_t)o->taps.stride * sizeof(float);
    return (int32_t)(((uintptr_t)q->taps.data - (uintptr_t)o->taps.data) / row_bytes);
}

/* The row of o->taps that holds q's pending row i. */
static int32_t source_row(const ds_draft_batch_opts *o, const ds_draft_seq *q, int i) {
    return q->taps_rows ? q->taps_rows[i] : taps_row(o, q) + i;
}

/* With o->taps: q's pending rows must be whole rows of it (or the rows taps_rows names). */
static ds_error *check_taps_source(const ds_drafter *d, const ds_draft_batch_opts *o, const ds_draft_seq *q) {
    if (q->taps_rows && !o->taps.data)
        return ds_errorf("drafter sequence %lld: rows of the batch's taps tensor, but there is none", (long long)q->id);
    if (!o->taps.data || q->n == 0) return NULL;
    if (q->taps_rows) {
        if (q->n > d->batch_taps.rows)
            return ds_errorf("drafter sequence %lld: %d gathered taps rows, but the drafter gathers at most %lld",
                             (long long)q->id, q->n, (long long)d->batch_taps.rows);
        for (int i = 0; i < q->n; i++)
            if (q->taps_rows[i] < 0 || q->taps_rows[i] >= o->taps.rows)
                return ds_errorf("drafter sequence %lld: taps row %d is outside the batch's %lld", (long long)q->id,
                                 q->taps_rows[i], (long long)o->taps.rows);
        return NULL;
    }
    const uintptr_t base = (uintptr_t)o->taps.data, at = (uintptr_t)q->taps.data;
    const uintptr_t row_bytes = (uintptr_t)o->taps.stride * sizeof(float);
    if (o->taps.dtype != DS_F32 || o->taps.cols != q->taps.cols || q->taps.stride != o->taps.stride || at < base ||
        (at - base) % row_bytes || (at - base) / row_bytes + (uintptr_t)q->n > (uintptr_t)o->taps.rows)
        return ds_errorf("drafter sequence %lld: its %d taps rows are not rows of the batch's taps tensor",
                         (long long)q->id, q->n);
    return NULL;
}

/* The pending context of seqs[0..R): chunks of whole sequences of up to
 * cap rows (all of them at once when d was reserved for R; cap 0: one
 * sequence a chunk), each gathered into batch_taps (one sequence alone is
 * read in place), then projected and stored in one pass, every row
 * through its own sequence's pages. */
static void context_pass(ds_drafter *d, int R, const ds_draft_seq *seqs, const ds_draft_batch_opts *o,
                         const host_rows *h, int cap) {
    ds_backend *be = d->be;
    for (int r = 0; r < R;) {
        int r1 = r, rows = 0, used = 0, last = -1;
        while (r1 < R && (seqs[r1].n == 0 || rows == 0 || rows + seqs[r1].n <= cap)) {
            const ds_draft_seq *q = &seqs[r1];
            for (int i = 0; i < q->n; i++) h->cpos[rows + i] = q->pos0 + i, h->crt[rows + i] = h->base[r1];
            if (q->n > 0) used++, last = r1;
            rows += q->n;
            r1++;
        }
        if (used > 0) {
            ds_tensor taps = ds_rows(seqs[last].taps, 0, rows);
            if (used > 1 || seqs[last].taps_rows) {
                taps = ds_rows(d->batch_taps, 0, rows);
                if (o->taps.data) { /* one gather: each row from its place in o->taps */
                    for (int k = r, at = 0; k < r1; at += seqs[k].n, k++)
                        for (int i = 0; i < seqs[k].n; i++) h->csrc[at + i] = source_row(o, &seqs[k], i);
                    be->ops->embed(be, taps, o->taps, h->csrc, 1.0f);
                } else {
                    for (int k = r, at = 0; k < r1; at += seqs[k].n, k++)
                        if (seqs[k].n > 0)
                            be->ops->copy(be, ds_rows(taps, at, seqs[k].n), ds_rows(seqs[k].taps, 0, seqs[k].n));
                }
            }
            const ds_kv_pages pg = {.page_rows = o->page_rows, .table = h->table, .row_table = h->crt};
            d->pages = &pg;
            ds_drafter_context(d, taps, rows, h->cpos);
            d->pages = NULL;
        }
        r = r1;
    }
}

/* Sequence r's walk over its rows of the pass's block hidden states and
 * logits: the drafter's block_hidden / logits point there meanwhile, so the
 * walk is the very code ds_drafter_round runs. */
static void walk(ds_drafter *d, ds_tensor hidden, ds_tensor logits, int j, const ds_draft_seq *q, ds_proposal *out) {
    const int G = d->gamma;
    const ds_tensor keep_hidden = d->block_hidden, keep_logits = d->logits;
    d->block_hidden = ds_rows(hidden, (int64_t)j * G, G);
    d->logits = ds_rows(logits, (int64_t)j * G, G);
    out->n_kept = 0;
    ds_markov_chain(d, q->anchor, q->sampling, q->rng, out);
    out->n = d->confidence ? ds_conf_keep(out->conf_logit, d->conf_temp, G, q->threshold) : G;
    d->block_hidden = keep_hidden;
    d->logits = keep_logits;
}

/* The walks of sequences j.. (at most left of them) at once, where at least
 * two in a row are greedy, or sample, and the backend takes them
 * (ds_markov_chain_seqs): the proposals walk() would give each, bit for
 * bit. Returns how many it took (0: none; walk() each). */
static int walk_seqs(ds_drafter *d, ds_tensor hidden, ds_tensor logits, int j, int left, const ds_draft_seq *q,
                     ds_proposal *out) {
    const int G = d->gamma;
    int m = 0;
    const bool greedy = ds_sampling_greedy(q[0].sampling);
    while (m < left && m < DS_MARKOV_SEQS_MAX && ds_sampling_greedy(q[m].sampling) == greedy) m++;
    if (m < 2) return 0;
    int32_t anchors[DS_MARKOV_SEQS_MAX];
    const ds_sampling *s[DS_MARKOV_SEQS_MAX];
    ds_rng *rng[DS_MARKOV_SEQS_MAX];
    for (int i = 0; i < m; i++) anchors[i] = q[i].anchor, s[i] = q[i].sampling, rng[i] = q[i].rng;
    if (!ds_markov_chain_seqs(d, ds_rows(hidden, (int64_t)j * G, (int64_t)m * G),
                              ds_rows(logits, (int64_t)j * G, (int64_t)m * G), m, anchors, s, rng, out))
        return 0;
    for (int i = 0; i < m; i++) {
        out[i].n_kept = 0;
        out[i].n = d->confidence ? ds_conf_keep(out[i].conf_logit, d->conf_temp, G, q[i].threshold) : G;
    }
    return m;
}

/* What both batched calls do first: check every sequence, lay out the
 * host rows (h, in *mem, the caller's to free) with every page list
 * concatenated, and append each sequence's pending context rows. *cap: the
 * context rows a chunk takes. */
static ds_error *begin(ds_drafter *d, int R, const ds_draft_seq *seqs, const ds_draft_batch_opts *o, bool block,
                       host_rows *h, int32_t **mem) {
    *mem = NULL;
    if (!seqs || !o) return ds_errorf("drafter batch round: no %s", !seqs ? "sequences" : "options");
    if (o->page_rows < 1) return ds_errorf("drafter batch round: page_rows %d must be at least 1", o->page_rows);
    int64_t n_table = 0;
    int most = 0;
    for (int r = 0; r < R; r++) {
        DS_TRY(check_seq(d, &seqs[r], o->page_rows, block));
        if (!block && (int64_t)seqs[r].n_pages * o->page_rows < (int64_t)seqs[r].pos0 + seqs[r].n)
            return ds_errorf("drafter sequence %lld: %d pages of %d rows cannot hold its context rows %d..%d",
                             (long long)seqs[r].id, seqs[r].n_pages, o->page_rows, seqs[r].pos0,
                             seqs[r].pos0 + seqs[r].n - 1);
        DS_TRY(check_taps_source(d, o, &seqs[r]));
        n_table += seqs[r].n_pages;
        if (seqs[r].n > most) most = seqs[r].n;
    }
    const int G = d->gamma, S = seqs_per_pass(d);
    /* Context rows a chunk takes: all of S sequences' pending rows (what
     * reserve sized batch_taps and the architecture's scratch for). */
    const int cap = S > 1 ? (int)d->batch_taps.rows : 0;
    const int crows = cap > most ? cap : most, brows = S * G;
    int32_t *m = malloc(((size_t)n_table + (size_t)R + 3 * (size_t)crows + 4 * (size_t)brows) * sizeof *m);
    if (!m) return ds_errorf("out of memory");
    *h = (host_rows){.table = m};
    h->base = h->table + n_table;
    h->cpos = h->base + R, h->crt = h->cpos + crows, h->csrc = h->crt + crows;
    h->ids = h->csrc + crows, h->bpos = h->ids + brows, h->brt = h->bpos + brows, h->bkeys = h->brt + brows;
    for (int r = 0, at = 0; r < R; at += seqs[r].n_pages, r++) {
        h->base[r] = at;
        memcpy(h->table + at, seqs[r].pages, (size_t)seqs[r].n_pages * sizeof *h->table);
    }
    *mem = m;
    const ds_kv_pages *pages = d->pages;
    context_pass(d, R, seqs, o, h, cap);
    d->pages = pages;
    for (int r = 0; r < R; r++)
        if (seqs[r].n > 0) *seqs[r].n_ctx = seqs[r].pos0 + seqs[r].n;
    return NULL;
}

ds_error *ds_drafter_context_batch(ds_drafter *d, int R, const ds_draft_seq *seqs, const ds_draft_batch_opts *o) {
    if (R <= 0) return NULL;
    host_rows h;
    int32_t *mem;
    ds_error *e = begin(d, R, seqs, o, false, &h, &mem);
    free(mem);
    return e ? e : ds_backend_check(d->be);
}

ds_error *ds_drafter_round_batch(ds_drafter *d, int R, const ds_draft_seq *seqs, const ds_draft_batch_opts *o,
                                 ds_proposal *out) {
    if (R <= 0) return NULL;
    if (!out) return ds_errorf("drafter batch round: no output array");
    host_rows h;
    int32_t *mem;
    ds_error *err = begin(d, R, seqs, o, true, &h, &mem);
    if (err) {
        free(mem);
        return err;
    }
    ds_backend *be = d->be;
    const int G = d->gamma, S = seqs_per_pass(d);
    const ds_kv_pages *pages = d->pages;

    /* Blocks, S sequences a pass: ids [anchor, mask...] at start.., each
     * row's keys its own sequence's 0..start+G-1 (the block's own K/V
     * stored at start.. of its pages first). A drafter sized for one
     * sequence writes its own G-row buffers, as ds_drafter_round does. */
    ds_error *e = NULL;
    for (int r0 = 0; r0 < R && !e; r0 += S) {
        const int ns = R - r0 < S ? R - r0 : S, rows = ns * G;
        int n_keys = 0;
        for (int j = 0; j < ns; j++) {
            const ds_draft_seq *q = &seqs[r0 + j];
            for (int k = 0; k < G; k++) {
                const int i = j * G + k;
                h.ids[i] = k ? d->mask_id : q->anchor;
                h.bpos[i] = q->start + k;
                h.brt[i] = h.base[r0 + j];
                h.bkeys[i] = q->start + G;
            }
            if (q->start + G > n_keys) n_keys = q->start + G;
        }
        const ds_tensor hidden = ds_rows(S > 1 ? d->batch_hidden : d->block_hidden, 0, rows);
        const ds_tensor logits = ds_rows(S > 1 ? d->batch_logits : d->logits, 0, rows);
        const ds_kv_pages pg = {.page_rows = o->page_rows, .table = h.table, .row_table = h.brt, .row_keys = h.bkeys};
        d->pages = &pg;
        d->ops->block(d, rows, h.ids, h.bpos, n_keys, hidden);
        d->pages = NULL;
        ds_drafter_lm_head(d, logits, hidden);
        for (int j = 0; j < ns && !e;) {
            int took = walk_seqs(d, hidden, logits, j, ns - j, &seqs[r0 + j], &out[r0 + j]);
            if (!took) walk(d, hidden, logits, j, &seqs[r0 + j], &out[r0 + j]), took = 1;
            for (int i = 0; i < took && !e; i++)
                if (o->done) e = o->done(o->ctx, r0 + j + i, &out[r0 + j + i]);
            j += took;
        }
    }
    d->pages = pages;
    free(mem);
    if (e) return e;
    return ds_backend_check(be);
}
