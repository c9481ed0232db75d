#include "batch/batch.h"

#include <stdlib.h>
#include <string.h>

#include "backend/comm.h"
#include "base/clock.h"
#include "draft/drafter_batch.h"
#include "sample/draw.h"
#include "sample/probs.h"
#include "speculate/round.h"
#include "speculate/schedule.h"

/* Context rows a sequence may hold (ds_batch.held): two blocks of the largest gamma. */
#define DS_HELD_MAX (2 * (DS_MAX_GAMMA + 1))

typedef enum { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE } seq_phase;

typedef struct {
    int64_t id;
    seq_phase phase;
    ds_gen_params p;
    int n_prompt;
    int32_t *hist; /* the prompt, then every committed token (untrimmed): what a recompute re-reads */
    int n_hist, cap_hist;
    /* The cache: target positions 0..cached-1; a sequence still filling it
     * (the prompt, or a recompute after preemption) runs prefill chunks up
     * to goal. */
    int cached, goal;
    bool started; /* the first token is drawn: decoding resumes after a recompute */
    int32_t anchor; /* the last committed token, at position start (not in the cache yet) */
    int start;
    /* The drafter: context positions 0..d_nctx-1; then held_n rows kept in
     * ds_batch.held (positions held_pos0.., rows held_rows) that it has not
     * received yet; then the rows of the last forward whose taps it has not
     * received (anchor + accepted drafts: ctx_n rows from ctx_row0, at
     * ctx_pos0), which the next step moves to the held rows. */
    int d_nctx, ctx_row0, ctx_pos0, ctx_n;
    int held_n, held_pos0;
    int32_t held_rows[DS_HELD_MAX];
    ds_page_list tp, dp;
    ds_rng rng;
    ds_gen_result res;
    int max_tokens;
    bool done, cancelled;
    /* This step: rows row0..row0+n_rows-1 of the forward, logits from logit0. */
    int row0, n_rows, logit0, n_drafts;
    int sched; /* drafts the schedule lets it verify this step */
    bool prefill_step, finishes_prefill;
    bool drafted_now; /* the drafter proposed for it this step */
    ds_proposal prop;
    int slot;          /* its draft-probability slot while running */
    ds_rng sim_rng;    /* opts.sim: this request's stream */
    float sim_conf[DS_MAX_GAMMA];
    int sim_reject;    /* opts.sim: the round's first rejected draft */
    float *host_probs; /* [gamma, V]: the proposal's distributions when drawn on the host */
    /* Its calibrated confidences of the last step it drafted (Algorithm 1):
     * what decides whether the next step drafts at all. -1: none yet. */
    float last_conf[DS_MAX_GAMMA];
    int last_nconf;
    /* This step's sampled verification (or first token), made for every sequence at once (verify_all). */
    bool vs_ready;
    int vs_accepted;
    int32_t vs_next;
} seq;

/* The held context (hold_pending): a step that does not draft for a
 * sequence does not append its new context rows to the drafter; their taps
 * wait in ds_batch.held (one row gather a step for every sequence) until it
 * drafts, or until a sequence holds held_cap rows or the buffer is full,
 * when one context pass appends everything held. Under load, where
 * Algorithm 1 declines to draft, the drafter's context then costs one pass
 * every few steps instead of one a step (its projections at several times
 * the rows), and nothing where a sequence never drafts again before it
 * ends. The drafter's context rows are row invariant, so a row appended
 * later holds the same bits. */
struct ds_batch {
    ds_target *t;
    ds_drafter *d;
    ds_backend *be;
    ds_batch_opts o;
    ds_page_pool tpool, dpool;
    /* Requests not yet released, in submission order (ids ascending: found
     * by bisection); ds_batch_release takes them out. */
    seq **seqs;
    int n_seqs, cap_seqs;
    int n_done;       /* of seqs[], those finished */
    int64_t next_id;
    /* per step */
    int32_t *ids, *pos, *row_table, *table, *logit_rows, *best, *zeros;
    int cap_table;
    float *logits_host, *scratch;
    float *conf;  /* [max_seqs * gamma]: this step's calibrated confidences, for Algorithm 1 */
    int *n_conf, *len;
    ds_tensor draft_probs; /* [max_seqs * gamma, V]: each running sequence's proposal distributions */
    /* a step's drafter round: the sequences drafting, their arguments and proposals */
    seq **drafting;
    ds_draft_seq *dseqs;
    ds_proposal *dprops;
    /* a step's sampled verifications: the sequences, their requests and results */
    seq **vseqs;
    ds_round_verify_req *vreq;
    int *vacc;
    int32_t *vnext;
    bool *slot_used;
    ds_tensor held;     /* [2 x max_seqs x (gamma + 1), taps]: held context rows (hold_pending) */
    int held_used;      /* rows of it in use (from 0; emptied when no sequence holds any) */
    int held_cap;       /* rows a sequence may hold */
    int32_t *held_src;  /* [max_seqs x (gamma + 1)]: a step's gather, rows of the target's taps */
    /* Whether to draft at all (DS_SCHEDULE_CONFIDENCE): the drafter pass's
     * measured seconds by request count (bucket floor(log2 R); 0: not
     * measured yet) and the steps since the last one drafted. */
    double draft_cost[16];
    int steps_undrafted;
    /* Probes that found drafting still not paying, in a row (the probe interval doubles with each, up to
     * 2^DS_PROBE_BACKOFF_MAX), and whether the last drafted step was a probe. */
    int probe_backoff;
    bool probing;
    /* This step's decision and predictions (opts.trace): why it drafts or not, the draft cost and the plain
     * step Algorithm 1 weighed, and (schedule) the verify step it admitted and the tokens it expects. */
    const char *tr_why;
    double tr_cost, tr_plain;
    ds_schedule_result tr_res;
    ds_batch_stats stats;
};

int ds_batch_drafter_rows(const ds_batch_opts *o, int gamma) {
    const int per_seq = (gamma + o->page_rows - 1) / o->page_rows + 1;
    return (o->n_pages + o->max_seqs * per_seq) * o->page_rows;
}

/* Rows of the held context buffer (hold_pending). */
static int64_t held_rows(const ds_batch_opts *o, int gamma) { return 2 * (int64_t)o->max_seqs * (gamma + 1); }

int64_t ds_batch_held_bytes(const ds_batch_opts *opts, int gamma, int64_t taps_cols) {
    return held_rows(opts, gamma) * taps_cols * (int64_t)sizeof(float);
}

ds_error *ds_batch_new(ds_target *t, ds_drafter *d, const ds_batch_opts *opts, ds_batch **out) {
    *out = NULL;
    const ds_batch_opts o = *opts;
    if (o.max_seqs < 1 || o.step_rows < 1 || o.page_rows < 1 || o.n_pages < 1)
        return ds_errorf("batched engine: max_seqs %d, step_rows %d, page_rows %d, n_pages %d must be positive",
                         o.max_seqs, o.step_rows, o.page_rows, o.n_pages);
    if (o.sim && (!d || ds_sim_profile_positions(o.sim) < d->gamma))
        return ds_errorf("batched engine: simulated acceptance %s", d ? "has fewer positions than the drafter's block"
                                                                      : "needs a drafter");
    if (o.schedule == DS_SCHEDULE_CONFIDENCE && !o.sim && (!d || !d->confidence))
        return ds_errorf("batched engine: Algorithm 1 schedules by the drafter's confidences, but %s",
                         d ? "the drafter has no confidence head" : "there is no drafter");
    if (o.schedule == DS_SCHEDULE_CONFIDENCE && !o.sps)
        return ds_errorf("batched engine: Algorithm 1 needs the target's step cost (ds_batch_profile)");
    if (d && o.step_rows < d->gamma + 1)
        return ds_errorf("batched engine: %d rows a step cannot verify a block of %d", o.step_rows, d->gamma);
    if (!t->ops->forward_rows)
        return ds_errorf("%s: the %s architecture has no batched forward yet", t->ck->dir, t->model_type);
    if (t->max_rows < o.step_rows || t->max_logit_rows < o.step_rows)
        return ds_errorf("batched engine: %d rows a step, but the target takes %d rows and %d logit rows a forward",
                         o.step_rows, t->max_rows, t->max_logit_rows);
    if ((int64_t)o.n_pages * o.page_rows > t->cache_rows)
        return ds_errorf("batched engine: a pool of %d pages of %d rows, but the target's caches hold %d rows",
                         o.n_pages, o.page_rows, t->cache_rows);
    if (d) {
        if (!d->paged) return ds_errorf("%s: the %s drafter cannot run on paged caches yet", d->ck->dir, d->arch);
        if (d->cache_rows < ds_batch_drafter_rows(&o, d->gamma))
            return ds_errorf("batched engine: the drafter's caches hold %d rows, the pool needs %d", d->cache_rows,
                             ds_batch_drafter_rows(&o, d->gamma));
        if (d->be != t->be) return ds_errorf("batched engine: the target and the drafter are on different backends");
        if (t->n_taps != d->n_taps || memcmp(t->tap_layers, d->tap_layers, (size_t)d->n_taps * sizeof(int)))
            DS_TRY(ds_target_set_taps(t, d->tap_layers, d->n_taps));
        /* every decoding sequence's block in one pass; 2 at least, for the held rows' gather buffer */
        DS_TRY(ds_drafter_reserve_seqs(d, o.max_seqs > 1 ? o.max_seqs : 2));
    }
    ds_batch *b = calloc(1, sizeof *b);
    if (!b) return ds_errorf("out of memory");
    b->t = t, b->d = d, b->be = t->be, b->o = o;
    const int R = o.step_rows, G = d ? d->gamma : 0, V = t->vocab;
    const int zrows = d && d->max_rows > G ? d->max_rows : G > 0 ? G : 1;
    ds_error *e = ds_page_pool_init(&b->tpool, o.n_pages, o.page_rows);
    if (!e && d) e = ds_page_pool_init(&b->dpool, ds_batch_drafter_rows(&o, G) / o.page_rows, o.page_rows);
    b->ids = malloc((size_t)R * sizeof *b->ids);
    b->pos = malloc((size_t)R * sizeof *b->pos);
    b->row_table = malloc((size_t)R * sizeof *b->row_table);
    b->logit_rows = malloc((size_t)R * sizeof *b->logit_rows);
    b->best = malloc((size_t)R * sizeof *b->best);
    b->zeros = calloc((size_t)zrows, sizeof *b->zeros);
    b->logits_host = malloc((size_t)(G + 1) * V * sizeof *b->logits_host);
    b->scratch = malloc((size_t)2 * V * sizeof *b->scratch);
    b->slot_used = calloc((size_t)o.max_seqs, sizeof *b->slot_used);
    b->conf = malloc((size_t)o.max_seqs * (G > 0 ? G : 1) * sizeof *b->conf);
    b->n_conf = malloc((size_t)o.max_seqs * sizeof *b->n_conf);
    b->len = malloc((size_t)o.max_seqs * sizeof *b->len);
    b->drafting = malloc((size_t)o.max_seqs * sizeof *b->drafting);
    b->dseqs = malloc((size_t)o.max_seqs * sizeof *b->dseqs);
    b->dprops = malloc((size_t)o.max_seqs * sizeof *b->dprops);
    b->vseqs = malloc((size_t)o.max_seqs * sizeof *b->vseqs);
    b->vreq = malloc((size_t)o.max_seqs * sizeof *b->vreq);
    b->vacc = malloc((size_t)o.max_seqs * sizeof *b->vacc);
    b->vnext = malloc((size_t)o.max_seqs * sizeof *b->vnext);
    if (d) {
        b->held_src = malloc((size_t)o.max_seqs * (G + 1) * sizeof *b->held_src);
        b->held_cap = 2 * (G + 1) < DS_HELD_MAX ? 2 * (G + 1) : DS_HELD_MAX;
        if (b->held_cap > d->max_rows) b->held_cap = d->max_rows;
        if (b->held_cap > d->batch_taps.rows) b->held_cap = (int)d->batch_taps.rows;
        if (!e) e = t->be->ops->alloc(t->be, DS_F32, held_rows(&o, G), t->taps.cols, &b->held);
        if (!e && !b->held_src) e = ds_errorf("out of memory");
    }
    if (!e && (!b->ids || !b->pos || !b->row_table || !b->logit_rows || !b->best || !b->zeros || !b->logits_host ||
               !b->scratch || !b->slot_used || !b->conf || !b->n_conf || !b->len || !b->drafting || !b->dseqs ||
               !b->dprops || !b->vseqs || !b->vreq || !b->vacc || !b->vnext))
        e = ds_errorf("out of memory");
    if (e) {
        ds_batch_free(b);
        return e;
    }
    *out = b;
    return NULL;
}

static void seq_release(ds_batch *b, seq *s) {
    ds_page_list_release(&b->tpool, &s->tp);
    if (b->d) ds_page_list_release(&b->dpool, &s->dp);
    if (s->slot >= 0) b->slot_used[s->slot] = false;
    s->slot = -1;
    free(s->host_probs);
    s->host_probs = NULL;
}

void ds_batch_free(ds_batch *b) {
    if (!b) return;
    for (int i = 0; i < b->n_seqs; i++) {
        seq *s = b->seqs[i];
        seq_release(b, s);
        free(s->hist);
        ds_gen_result_free(&s->res);
        free(s);
    }
    free(b->seqs);
    ds_page_pool_free(&b->tpool);
    ds_page_pool_free(&b->dpool);
    free(b->ids), free(b->pos), free(b->row_table), free(b->table), free(b->logit_rows), free(b->best);
    free(b->zeros), free(b->logits_host), free(b->scratch), free(b->slot_used);
    free(b->conf), free(b->n_conf), free(b->len);
    free(b->drafting), free(b->dseqs), free(b->dprops);
    free(b->vseqs), free(b->vreq), free(b->vacc), free(b->vnext), free(b->held_src);
    b->be->ops->release(b->be, &b->draft_probs);
    b->be->ops->release(b->be, &b->held);
    free(b);
}

ds_batch_stats ds_batch_get_stats(const ds_batch *b) {
    ds_batch_stats st = b->stats;
    st.running = st.waiting = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        st.running += b->seqs[i]->phase == SEQ_RUNNING;
        st.waiting += b->seqs[i]->phase == SEQ_WAITING;
    }
    st.pages_used = b->tpool.n_pages - b->tpool.n_free;
    st.pages_total = b->tpool.n_pages;
    return st;
}

/* Index of request id in seqs[], or -1 (released or never submitted). */
static int find(const ds_batch *b, int64_t id) {
    int lo = 0, hi = b->n_seqs - 1;
    while (lo <= hi) {
        const int mid = lo + (hi - lo) / 2;
        if (b->seqs[mid]->id == id) return mid;
        if (b->seqs[mid]->id < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

const ds_gen_result *ds_batch_result(const ds_batch *b, int64_t id) {
    const int i = find(b, id);
    return i >= 0 && b->seqs[i]->phase == SEQ_DONE ? &b->seqs[i]->res : NULL;
}

ds_error *ds_batch_state(const ds_batch *b, int64_t id, ds_batch_state_info *st) {
    const int i = find(b, id);
    if (i < 0) return ds_errorf("request %lld: no such request (never submitted, or released)", (long long)id);
    const seq *s = b->seqs[i];
    *st = (ds_batch_state_info){.res = &s->res, .n_prompt = s->n_prompt, .running = s->phase == SEQ_RUNNING,
                                .finished = s->phase == SEQ_DONE};
    return NULL;
}

/* The proposal positions s verifies: its gamma, or the drafter's block size. */
static int seq_gamma(const ds_batch *b, const seq *s) {
    const int G = b->d ? b->d->gamma : 0;
    return s->p.gamma > 0 && s->p.gamma < G ? s->p.gamma : G;
}

/* Rows a sequence at position start may need in the target's and the
 * drafter's caches for one more step. */
static int target_need(const ds_batch *b, const seq *s) { return s->start + (b->d ? b->d->gamma : 0) + 1; }

ds_error *ds_batch_submit(ds_batch *b, const ds_batch_request *req, int64_t *id) {
    const ds_target *t = b->t;
    const int n = req->n_prompt, G = b->d ? b->d->gamma : 0;
    const long long rid = (long long)b->next_id;
    *id = -1;
    if (n < 1) return ds_errorf("request %lld: empty prompt", rid);
    if (n >= t->max_ctx)
        return ds_errorf("request %lld: prompt of %d tokens does not fit the model's context of %d tokens", rid,
                         n, t->max_ctx);
    if (ds_pages_for(&b->tpool, n + G + 1) > b->tpool.n_pages)
        return ds_errorf("request %lld: prompt of %d tokens does not fit the KV pool (%d pages of %d rows)", rid,
                         n, b->tpool.n_pages, b->tpool.page_rows);
    if (req->params.max_new < 0) return ds_errorf("request %lld: max_new %d is negative", rid, req->params.max_new);
    if (req->params.verify) return ds_errorf("request %lld: the batched engine verifies with ds_verify only", rid);
    for (int i = 0; i < n; i++)
        if (req->prompt[i] < 0 || req->prompt[i] >= t->vocab)
            return ds_errorf("request %lld: prompt token %d at index %d is outside the vocabulary (0..%d)", rid,
                             req->prompt[i], i, t->vocab - 1);
    if (b->n_seqs == b->cap_seqs) {
        const int cap = b->cap_seqs ? 2 * b->cap_seqs : 16;
        seq **a = realloc(b->seqs, (size_t)cap * sizeof *a);
        if (!a) return ds_errorf("out of memory");
        b->seqs = a, b->cap_seqs = cap;
    }
    seq *s = calloc(1, sizeof *s);
    const int room = t->max_ctx - n + 1;
    s->max_tokens = req->params.max_new < room ? req->params.max_new : room;
    s->cap_hist = n + s->max_tokens + G + 2;
    if (s) s->hist = malloc((size_t)s->cap_hist * sizeof *s->hist);
    if (s) s->res.tokens = malloc((size_t)(s->max_tokens + 1) * sizeof *s->res.tokens);
    if (!s || !s->hist || !s->res.tokens) {
        if (s) free(s->hist), free(s->res.tokens);
        free(s);
        return ds_errorf("out of memory");
    }
    s->id = b->next_id++;
    s->p = req->params;
    s->n_prompt = s->goal = s->n_hist = n;
    memcpy(s->hist, req->prompt, (size_t)n * sizeof *s->hist);
    s->slot = -1;
    s->last_nconf = -1;
    s->done = s->p.max_new == 0;
    ds_rng_seed(&s->rng, s->p.seed);
    if (b->o.sim) ds_sim_stream_seed(&s->sim_rng, b->o.sim_seed, (uint64_t)s->id);
    s->phase = SEQ_WAITING;
    b->seqs[b->n_seqs++] = s;
    *id = s->id;
    return NULL;
}

/* ds_generate's emit: records the token unless the output is full, ends on a stop token. */
static void emit(ds_batch *b, seq *s, int32_t tok) {
    ds_gen_result *r = &s->res;
    if (s->done || r->n_tokens >= s->max_tokens) return;
    r->tokens[r->n_tokens++] = tok;
    b->stats.generation_tokens++;
    b->stats.token_hash = (b->stats.token_hash ^ ((uint64_t)s->id << 32 ^ (uint32_t)tok)) * 0x100000001b3ull;
    if (!s->p.ignore_stop && ds_target_is_stop(b->t, tok)) {
        r->stopped = true;
        s->done = true;
    }
}

static bool is_stop(const ds_batch *b, const seq *s, int32_t tok) {
    return !s->p.ignore_stop && ds_target_is_stop(b->t, tok);
}

/* Whether a decoding sequence runs another step (ds_generate's loops). */
static bool wants_step(const ds_batch *b, const seq *s) {
    if (s->done) return false;
    if (b->d) return s->start - s->n_prompt < s->p.max_new && s->start < b->t->max_ctx;
    return s->res.n_tokens < s->p.max_new && s->start < b->t->max_ctx;
}

static void finish(ds_batch *b, seq *s) {
    ds_gen_result *r = &s->res;
    r->stop_reason = r->stopped              ? DS_STOP_TOKEN
                     : s->cancelled          ? DS_STOP_CALLER
                     : r->n_tokens >= s->p.max_new ? DS_STOP_LENGTH
                                                   : DS_STOP_CONTEXT;
    seq_release(b, s);
    s->phase = SEQ_DONE;
    b->n_done++;
    b->stats.finished++;
}

ds_error *ds_batch_cancel(ds_batch *b, int64_t id) {
    const int i = find(b, id);
    if (i < 0) return ds_errorf("request %lld: no such request to cancel (never submitted, or released)", (long long)id);
    seq *s = b->seqs[i];
    if (s->phase == SEQ_DONE) return NULL;
    s->cancelled = s->done = true;
    finish(b, s); /* between steps no forward holds its pages */
    return NULL;
}

ds_error *ds_batch_release(ds_batch *b, int64_t id) {
    DS_TRY(ds_batch_cancel(b, id));
    const int i = find(b, id);
    seq *s = b->seqs[i];
    free(s->hist);
    ds_gen_result_free(&s->res);
    free(s);
    memmove(b->seqs + i, b->seqs + i + 1, (size_t)(b->n_seqs - i - 1) * sizeof *b->seqs);
    b->n_seqs--;
    b->n_done--;
    return NULL;
}

static void push_hist(seq *s, int32_t tok) {
    if (s->n_hist < s->cap_hist) s->hist[s->n_hist++] = tok;
}

/* Gives a running sequence's pages back; it waits to recompute its cache. */
static void preempt(ds_batch *b, seq *s) {
    seq_release(b, s);
    s->phase = SEQ_WAITING;
    s->cached = 0;
    s->d_nctx = 0;
    s->ctx_n = s->held_n = 0;
    s->goal = s->started ? s->start : s->n_prompt;
    b->stats.preemptions++;
}

/* The youngest running sequence other than keep (NULL if none). */
static seq *youngest_running(ds_batch *b, const seq *keep) {
    for (int i = b->n_seqs - 1; i >= 0; i--)
        if (b->seqs[i]->phase == SEQ_RUNNING && b->seqs[i] != keep) return b->seqs[i];
    return NULL;
}

/* Pages for this step's rows of s (its prefill chunk, or its verify block
 * and the drafter's block): preempting younger sequences while the pool is
 * short. False: s itself had to go (nothing younger to take from). */
static bool reserve(ds_batch *b, seq *s, int target_rows, int drafter_rows) {
    for (;;) {
        const bool tok = ds_page_list_reserve(&b->tpool, &s->tp, target_rows);
        const bool dok = !b->d || ds_page_list_reserve(&b->dpool, &s->dp, drafter_rows);
        if (tok && dok) return true;
        seq *v = youngest_running(b, s);
        if (!v || v->id < s->id) {
            preempt(b, s);
            return false;
        }
        preempt(b, v);
    }
}

/* Pages s still has to take to finish its prefill and verify one block. */
static int prefill_debt(const ds_page_pool *p, const ds_page_list *l, int rows) {
    const int need = ds_pages_for(p, rows) - l->n;
    return need > 0 ? need : 0;
}

/* Waiting sequences start, oldest first (the preempted before the new),
 * while the pages their prompts (or recomputes) and one block need are
 * free, counting what the running sequences' unfinished prefills will
 * still take. Growth past that may preempt later. */
static void admit(ds_batch *b) {
    const int G = b->d ? b->d->gamma : 0;
    int running = 0, tfree = b->tpool.n_free, dfree = b->dpool.n_free;
    for (int i = 0; i < b->n_seqs; i++) {
        const seq *s = b->seqs[i];
        if (s->phase != SEQ_RUNNING) continue;
        running++;
        if (s->cached < s->goal) {
            tfree -= prefill_debt(&b->tpool, &s->tp, s->goal + G + 1);
            if (b->d) dfree -= prefill_debt(&b->dpool, &s->dp, s->goal + G);
        }
    }
    for (int i = 0; i < b->n_seqs && running < b->o.max_seqs; i++) {
        seq *s = b->seqs[i];
        if (s->phase != SEQ_WAITING) continue;
        const int tneed = ds_pages_for(&b->tpool, s->goal + G + 1);
        const int dneed = b->d ? ds_pages_for(&b->dpool, s->goal + G) : 0;
        if (tneed > tfree || dneed > dfree) break;
        tfree -= tneed, dfree -= dneed;
        s->phase = SEQ_RUNNING;
        for (int k = 0; k < b->o.max_seqs; k++)
            if (!b->slot_used[k]) {
                b->slot_used[k] = true;
                s->slot = k;
                break;
            }
        running++;
    }
    if (running > b->stats.max_running) b->stats.max_running = running;
}

/* What s keeps of its proposal once the batched round has walked it (the
 * drafter's buffers serve the next sequence's walk): the proposal, and at
 * T > 0 its distributions in s's slot. */
static ds_error *keep_proposal(ds_batch *b, seq *s, const ds_proposal *out) {
    ds_drafter *d = b->d;
    s->prop = *out;
    if (b->o.sim) { /* the profile's confidences and outcome; the whole block is proposed */
        DS_TRY(ds_sim_round(b->o.sim, &s->sim_rng, d->gamma, s->sim_conf, &s->sim_reject));
        s->prop.n = d->gamma;
    }
    if (ds_sampling_greedy(&s->p.sampling)) return NULL;
    const int G = d->gamma, V = b->t->vocab;
    if (s->prop.probs_dev.data && ds_spec(b->be)->verify_sample) {
        ds_backend *be = b->be;
        if (!b->draft_probs.data) DS_TRY(be->ops->alloc(be, DS_F32, (int64_t)b->o.max_seqs * G, V, &b->draft_probs));
        be->ops->copy(be, ds_rows(b->draft_probs, (int64_t)s->slot * G, G), ds_rows(s->prop.probs_dev, 0, G));
        s->prop.probs_dev = ds_rows(b->draft_probs, (int64_t)s->slot * G, G);
        return NULL;
    }
    DS_TRY(ds_drafter_host_probs(d, &s->prop));
    if (!s->host_probs && !(s->host_probs = malloc((size_t)G * V * sizeof *s->host_probs)))
        return ds_errorf("out of memory");
    memcpy(s->host_probs, s->prop.probs, (size_t)G * V * sizeof *s->host_probs);
    s->prop.probs = s->host_probs;
    s->prop.probs_dev = ds_no_tensor();
    return NULL;
}

static ds_error *drafted(void *ctx, int r, ds_proposal *out) {
    ds_batch *b = ctx;
    seq *s = b->drafting[r];
    return ds_error_wrap(keep_proposal(b, s, out), "request %lld", (long long)s->id);
}

/* s's held context rows as a batched drafter round takes them (before its block at start). */
static ds_draft_seq held_seq(const ds_batch *b, seq *s) {
    return (ds_draft_seq){.id = s->id, .taps = b->held, .taps_rows = s->held_rows, .pos0 = s->held_pos0,
                          .n = s->held_n, .anchor = s->anchor, .start = s->start, .sampling = &s->p.sampling,
                          .threshold = s->p.threshold, .rng = &s->rng, .pages = s->dp.pages, .n_pages = s->dp.n,
                          .n_ctx = &s->d_nctx};
}

/* Empties the held buffer where no running sequence holds rows in it. */
static void held_compact(ds_batch *b) {
    for (int i = 0; i < b->n_seqs; i++)
        if (b->seqs[i]->phase == SEQ_RUNNING && b->seqs[i]->held_n > 0) return;
    b->held_used = 0;
}

/* Every held row to the drafter, in one context pass; the buffer empties. */
static ds_error *flush_held(ds_batch *b) {
    int R = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        seq *s = b->seqs[i];
        if (s->phase != SEQ_RUNNING || s->held_n == 0) continue;
        b->dseqs[R] = held_seq(b, s);
        b->dseqs[R].start = s->held_pos0 + s->held_n; /* (its newest rows may still wait in the target's taps) */
        b->drafting[R++] = s;
    }
    const ds_draft_batch_opts o = {.page_rows = b->o.page_rows, .taps = b->held};
    ds_error *e = ds_drafter_context_batch(b->d, R, b->dseqs, &o);
    for (int r = 0; r < R; r++) b->drafting[r]->held_n = 0;
    b->held_used = 0;
    return e;
}

/* The drafter's context must take every committed row's taps from the
 * forward that made them, before the next forward overwrites them: every
 * sequence's new context rows are gathered into the held buffer (after
 * everything held goes to the drafter, where a sequence would hold more
 * than held_cap rows or the buffer is full). */
static ds_error *hold_pending(ds_batch *b) {
    int add = 0;
    bool flush = false;
    for (int i = 0; i < b->n_seqs; i++) {
        const seq *s = b->seqs[i];
        if (s->phase != SEQ_RUNNING || s->ctx_n == 0) continue;
        add += s->ctx_n;
        flush = flush || s->held_n + s->ctx_n > b->held_cap;
    }
    if (add == 0) return NULL;
    if (flush || b->held_used + add > b->held.rows) DS_TRY(flush_held(b));
    int k = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        seq *s = b->seqs[i];
        if (s->phase != SEQ_RUNNING || s->ctx_n == 0) continue;
        if (s->held_n == 0) s->held_pos0 = s->ctx_pos0;
        if (s->held_pos0 + s->held_n != s->ctx_pos0)
            return ds_errorf("request %lld: context rows at position %d after %d held from %d", (long long)s->id,
                             s->ctx_pos0, s->held_n, s->held_pos0);
        for (int j = 0; j < s->ctx_n; j++, k++) {
            b->held_src[k] = s->ctx_row0 + j;
            s->held_rows[s->held_n++] = b->held_used + k;
        }
        s->ctx_n = 0;
    }
    b->be->ops->embed(b->be, ds_rows(b->held, b->held_used, add), b->t->taps, b->held_src, 1.0f);
    b->held_used += add;
    return NULL;
}

/* One drafter round for every decoding sequence that got its rows: each
 * one's held context rows, then a block after its anchor, on its own
 * pages, in one pass (draft/drafter_batch.h). */
static ds_error *draft_all(ds_batch *b) {
    int R = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        seq *s = b->seqs[i];
        if (s->phase != SEQ_RUNNING || s->prefill_step || s->n_rows == 0) continue;
        b->dseqs[R] = held_seq(b, s);
        b->drafting[R++] = s;
        s->drafted_now = true;
    }
    const ds_draft_batch_opts o = {.page_rows = b->o.page_rows, .taps = b->held, .done = drafted, .ctx = b};
    ds_error *e = ds_drafter_round_batch(b->d, R, b->dseqs, &o, b->dprops);
    for (int r = 0; r < R; r++) b->drafting[r]->held_n = 0;
    held_compact(b);
    return e;
}

/* Bucket of the draft-cost table for R sequences. */
static int cost_bucket(int R) {
    int k = 0;
    while (R > 1 && k < 15) R >>= 1, k++;
    return k;
}

/* Under tensor parallelism every rank runs this engine on its shard and
 * must take the same decisions. They are functions of state the ranks share
 * (requests, pages, tokens, confidences), except where a clock enters: the
 * draft pass's measured cost (drafting_pays). That one is rank 0's, given
 * to every rank, so no rank decides from its own clock. */
static double rank0_seconds(const ds_batch *b, double seconds) {
    ds_comm *c = b->t->comm;
    return c ? ds_comm_from_rank0(c, (float)seconds) : seconds;
}

/* The draft pass's cost at R sequences: measured at R's bucket, else
 * bounded from a measured one (twice the sequences cost at most twice as
 * much; fewer cost no more), else 0 (unknown: draft, and so measure it).
 * Both bounds overestimate, so an unmeasured count leans to not drafting
 * until a probe measures it, instead of drafting once at each count that
 * admission ramps through. */
static double draft_cost_at(const ds_batch *b, int R) {
    const int k = cost_bucket(R);
    if (b->draft_cost[k] > 0) return b->draft_cost[k];
    for (int i = k - 1; i >= 0; i--)
        if (b->draft_cost[i] > 0) return b->draft_cost[i] * (double)(1 << (k - i));
    for (int i = k + 1; i < 16; i++)
        if (b->draft_cost[i] > 0) return b->draft_cost[i];
    return 0;
}

#define DS_PROBE_BACKOFF_MAX 6

/* Whether this step drafts (DS_SCHEDULE_CONFIDENCE): Algorithm 1 over each
 * decoding sequence's last confidences (all ones for one that has not
 * drafted yet), with the drafter pass's cost at this request count
 * (draft_cost_at), must beat a plain autoregressive step
 * (ds_schedule_draft_pays). Under load the draft pass alone can cost more
 * than verification wins back; then the step decodes autoregressively, and
 * now and then a step drafts anyway so that the confidences (and the cost)
 * stay current: every 16th step, or rarer where a draft pass costs more
 * than 1.6 plain steps, so that these probes cost at most a tenth of the
 * plain steps between them; each probe that finds drafting still not paying
 * doubles the interval (up to 64x; reset once drafting pays), so that a
 * load where speculation never pays costs a few probes, not one every few
 * steps. Lossless either way: only how many drafts are verified changes. */
static ds_error *drafting_pays(ds_batch *b, bool *pays) {
    *pays = true;
    b->tr_why = "fixed", b->tr_cost = b->tr_plain = 0;
    if (b->o.schedule != DS_SCHEDULE_CONFIDENCE || !b->o.sps) return NULL;
    const int G = b->d->gamma;
    int R = 0;
    for (int i = 0; i < b->n_seqs; i++) { /* the decoding sequences (asked before the step gives out its rows) */
        const seq *s = b->seqs[i];
        if (s->phase != SEQ_RUNNING || !s->started || s->cached < s->goal) continue;
        const int n = s->last_nconf < 0 ? G : s->last_nconf;
        for (int j = 0; j < n; j++) b->conf[R * G + j] = s->last_nconf < 0 ? 1.0f : s->last_conf[j];
        b->n_conf[R++] = n;
    }
    const double cost = draft_cost_at(b, R);
    b->tr_why = "none";
    if (R == 0) return NULL;
    if (cost <= 0) { /* the cost is still to be measured */
        b->stats.draft_unmeasured++;
        b->tr_why = "unmeasured";
        return NULL;
    }
    const double plain = ds_step_cost_seconds(b->o.sps, R);
    b->tr_cost = cost, b->tr_plain = plain;
    const double every = (plain > 0 && 10 * cost / plain > 16 ? 10 * cost / plain : 16) * (1 << b->probe_backoff);
    if (b->steps_undrafted + 1 >= (every < 1000 ? every : 1000)) { /* the probe */
        b->probing = true;
        b->stats.draft_probes++;
        b->tr_why = "probe";
        return NULL;
    }
    const ds_schedule_input in = {.n_requests = R, .gamma = G, .n_drafts = b->n_conf, .conf = b->conf};
    const ds_schedule_opts o = {.draft_seconds = cost};
    DS_TRY(ds_schedule_draft_pays(&in, b->o.sps, &o, pays, NULL));
    b->tr_why = *pays ? "pays" : "declines";
    if (*pays) b->probe_backoff = 0;
    else if (b->probing && b->probe_backoff < DS_PROBE_BACKOFF_MAX) b->probe_backoff++;
    b->probing = false;
    return NULL;
}

/* The step's sampled verifications and first tokens on the backend, for
 * every sequence at once with one wait (ds_round_verify_sample_many), before
 * each sequence's bookkeeping (accept, next_token) takes its result: what
 * each would get from ds_round_verify_sample, its uniforms drawn from its
 * own stream as there. A wait a sequence cost a host round trip each (64 a
 * step at 64 in flight). */
static ds_error *verify_all(ds_batch *b) {
    ds_target *t = b->t;
    if (!ds_spec(t->be)->verify_sample) return NULL;
    int m = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        seq *s = b->seqs[i];
        s->vs_ready = false;
        if (s->phase != SEQ_RUNNING || s->n_rows == 0 || ds_sampling_greedy(&s->p.sampling)) continue;
        ds_round_verify_req q = {.row0 = s->logit0, .s = &s->p.sampling, .rng = &s->rng};
        if (s->prefill_step) { /* after_prefill draws the first token where the prompt ends */
            if (s->cached + s->n_rows < s->goal || s->started || s->done) continue;
        } else if (b->d && s->n_drafts > 0) { /* accept: the drafts against their distributions on the backend */
            if (!s->prop.probs_dev.data) continue;
            q.draft = s->prop.tokens, q.n = s->n_drafts, q.draft_probs = s->prop.probs_dev;
        } /* (no drafts verified this step: the next token drawn there too, as autoregressive decoding's) */
        b->vreq[m] = q;
        b->vseqs[m++] = s;
    }
    DS_TRY(ds_round_verify_sample_many(t, m, b->vreq, b->vacc, b->vnext));
    for (int k = 0; k < m; k++) {
        seq *s = b->vseqs[k];
        s->vs_ready = true, s->vs_accepted = b->vacc[k], s->vs_next = b->vnext[k];
    }
    return NULL;
}

/* s's result from verify_all (which makes every one this step's sampled rows need where the backend verifies). */
static ds_error *verified(seq *s, int *accepted, int32_t *next) {
    if (!s->vs_ready)
        return ds_errorf("request %lld: its sampled verification was not made with the step's", (long long)s->id);
    s->vs_ready = false;
    if (accepted) *accepted = s->vs_accepted;
    *next = s->vs_next;
    return NULL;
}

/* The token after s's logits row l (no drafts): ds_generate's next_token. */
static ds_error *next_token(ds_batch *b, seq *s, int l, int32_t *out) {
    ds_target *t = b->t;
    if (ds_sampling_greedy(&s->p.sampling)) {
        *out = b->best[l];
        return NULL;
    }
    if (ds_spec(t->be)->verify_sample) return verified(s, NULL, out); /* drawn by verify_all */
    ds_target_logits_sync(t);
    t->be->ops->download(t->be, ds_rows(t->logits, l, 1), b->logits_host);
    DS_TRY(ds_backend_check(t->be));
    ds_probs_from_logits(b->logits_host, t->vocab, &s->p.sampling, b->scratch);
    *out = ds_sample_probs(b->scratch, t->vocab, &s->rng);
    return NULL;
}

/* Acceptance of s's n drafts against its verify rows: ds_round's rules. */
static ds_error *accept(ds_batch *b, seq *s, int *accepted, int32_t *next) {
    ds_target *t = b->t;
    const int n = s->n_drafts, l = s->logit0;
    const int32_t *x = s->prop.tokens;
    if (ds_sampling_greedy(&s->p.sampling)) {
        int a = 0;
        while (a < n && b->best[l + a] == x[a]) a++;
        for (int i = 0; i < a; i++)
            if (ds_target_placeholder_of(t, x[i]))
                return ds_errorf("request %lld: accepted draft token %d, a placeholder the model embeds as pad", (long long)s->id,
                                 x[i]);
        *accepted = a;
        *next = b->best[l + a];
        return NULL;
    }
    if ((n == 0 || s->prop.probs_dev.data) && ds_spec(t->be)->verify_sample) return verified(s, accepted, next); /* verify_all */
    ds_target_logits_sync(t);
    t->be->ops->download(t->be, ds_rows(t->logits, l, n + 1), b->logits_host);
    DS_TRY(ds_backend_check(t->be));
    *accepted = ds_verify(b->logits_host, t->vocab, x, n, s->prop.probs, &s->p.sampling, &s->rng, b->scratch, next);
    return NULL;
}

/* After the forward: every prefill chunk's taps to the drafter's context,
 * all sequences' in one context pass (rows of the target's taps, gathered). */
static ds_error *append_prefill(ds_batch *b) {
    int R = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        seq *s = b->seqs[i];
        if (s->phase != SEQ_RUNNING || !s->prefill_step || s->n_rows == 0) continue;
        b->dseqs[R] = (ds_draft_seq){.id = s->id, .taps = ds_rows(b->t->taps, s->row0, s->n_rows), .pos0 = s->cached,
                                     .n = s->n_rows, .start = s->cached + s->n_rows, .sampling = &s->p.sampling,
                                     .rng = &s->rng, .pages = s->dp.pages, .n_pages = s->dp.n, .n_ctx = &s->d_nctx};
        R++;
    }
    const ds_draft_batch_opts o = {.page_rows = b->o.page_rows, .taps = b->t->taps};
    return ds_drafter_context_batch(b->d, R, b->dseqs, &o);
}

/* After the forward: s's prefill chunk is in the cache (and its taps in the
 * drafter's context: append_prefill); at the prompt's end the first token is drawn. */
static ds_error *after_prefill(ds_batch *b, seq *s) {
    s->cached += s->n_rows;
    if (s->cached < s->goal) return NULL;
    if (s->started) return NULL; /* a recompute: decoding resumes at anchor, start */
    s->started = true;
    s->start = s->n_prompt;
    if (s->done) return NULL; /* max_new 0 */
    int32_t first;
    DS_TRY(next_token(b, s, s->logit0, &first));
    s->anchor = first;
    push_hist(s, first);
    emit(b, s, first);
    if (is_stop(b, s, first)) s->done = true;
    return NULL;
}

/* The speculative counters (ds_batch_stats) of one verify round. */
static void tally_round(ds_batch *b, int accepted, int proposed) {
    ds_batch_stats *st = &b->stats;
    if (proposed <= 0) return;
    st->drafts++;
    st->draft_tokens += proposed;
    st->accepted_tokens += accepted;
    for (int k = 0; k < accepted && k < DS_MAX_GAMMA; k++) st->accepted_pos[k]++;
}

/* After the forward: s's verify (or autoregressive) rows; commit. */
static ds_error *after_decode(ds_batch *b, seq *s) {
    int a = 0;
    int32_t next;
    if (b->d) DS_TRY(accept(b, s, &a, &next));
    else DS_TRY(next_token(b, s, s->logit0, &next));
    if (b->o.sim) { /* the profile's outcome: the verifier ran, its verdict is replaced */
        a = s->sim_reject < s->n_drafts ? s->sim_reject : s->n_drafts;
        if (ds_sampling_greedy(&s->p.sampling)) next = b->best[s->logit0 + a];
    }
    ds_gen_result *r = &s->res;
    if (b->d) {
        const int n = s->n_drafts;
        for (int i = 0; i < a && !s->p.ignore_stop; i++)
            if (ds_target_is_stop(b->t, s->prop.tokens[i])) { /* a stop draft ends the output after it */
                DS_TRY(ds_gen_result_add_round(r, i + 1, i + 1, i + 1));
                tally_round(b, i + 1, i + 1);
                for (int k = 0; k <= i; k++) emit(b, s, s->prop.tokens[k]);
                s->done = true;
                return NULL;
            }
        DS_TRY(ds_gen_result_add_round(r, a, n, a + 1));
        tally_round(b, a, n);
        for (int k = 0; k < a; k++) emit(b, s, s->prop.tokens[k]), push_hist(s, s->prop.tokens[k]);
        emit(b, s, next);
        push_hist(s, next);
        s->ctx_row0 = s->row0;
        s->ctx_pos0 = s->start;
        s->ctx_n = a + 1;
    } else {
        emit(b, s, next);
        push_hist(s, next);
    }
    s->start += a + 1;
    s->cached = s->start;
    s->anchor = next;
    if (is_stop(b, s, next)) s->done = true;
    ds_page_list_trim(&b->tpool, &s->tp, s->cached);
    return NULL;
}

/* How many drafts each decoding sequence verifies: its proposal up to its
 * cap (fixed), or the prefixes Algorithm 1 admits over all of them. */
static ds_error *schedule(ds_batch *b) {
    const ds_drafter *d = b->d;
    const int G = d ? d->gamma : 0;
    int R = 0;
    b->tr_res = (ds_schedule_result){0};
    for (int i = 0; i < b->n_seqs; i++) {
        seq *s = b->seqs[i];
        if (s->phase != SEQ_RUNNING || s->prefill_step || s->n_rows == 0) continue;
        const int cap = s->n_rows - 1;
        s->sched = d ? (s->prop.n < cap ? s->prop.n : cap) : 0;
        b->stats.drafted += s->sched;
        if (b->o.schedule != DS_SCHEDULE_CONFIDENCE) continue;
        if (!s->drafted_now) {
            b->n_conf[R++] = 0;
            continue;
        }
        for (int j = 0; j < s->sched; j++) {
            b->conf[R * G + j] = b->o.sim ? s->sim_conf[j] : ds_conf_prob(s->prop.conf_logit[j], d->conf_temp[j]);
            s->last_conf[j] = b->conf[R * G + j];
        }
        s->last_nconf = s->sched;
        b->n_conf[R++] = s->sched;
    }
    if (b->o.schedule == DS_SCHEDULE_CONFIDENCE && R > 0) {
        /* vLLM's draft cost by request count (schedule.h): Theta = tau* / (t_draft(R) + t_verify(B)), the step's
         * whole time. The draft pass has run by now whatever B becomes, and without its time in the denominator
         * the early stop comes where a verify row costs more than the plain step's share, not the round's: at
         * 8 in flight it verified tau 1.98 where fixed gamma 7 got 3.7 and ran 1.36x faster (H100, session 38).
         * bench/journal/schedule-sim.md: never below SPEC's Theta, up to 1.3x above it. */
        const ds_schedule_input in = {.n_requests = R, .gamma = G, .n_drafts = b->n_conf, .conf = b->conf};
        const ds_schedule_opts so = {.draft_seconds = draft_cost_at(b, R)};
        ds_schedule_result res;
        DS_TRY(ds_schedule_confidence(&in, b->o.sps, &so, b->len, &res));
        b->tr_res = res;
        R = 0;
        for (int i = 0; i < b->n_seqs; i++) {
            seq *s = b->seqs[i];
            if (s->phase == SEQ_RUNNING && !s->prefill_step && s->n_rows > 0) s->sched = b->len[R++];
        }
    }
    for (int i = 0; i < b->n_seqs; i++) {
        const seq *s = b->seqs[i];
        if (s->phase == SEQ_RUNNING && !s->prefill_step && s->n_rows > 0) b->stats.verified_drafts += s->sched;
    }
    return NULL;
}

static ds_error *grow_table(ds_batch *b, int need) {
    if (need <= b->cap_table) return NULL;
    int cap = b->cap_table ? b->cap_table : 256;
    while (cap < need) cap *= 2;
    int32_t *a = realloc(b->table, (size_t)cap * sizeof *a);
    if (!a) return ds_errorf("out of memory");
    b->table = a, b->cap_table = cap;
    return NULL;
}

/* Around the engine's forwards: no product needs one-row bits here (batch
 * invariance is the backend's own mode, which exact_rows leaves alone), so
 * the backend may take its fastest kernels at every row count; the
 * setting is put back after, for a single-request engine on the same
 * backend. */
static int rows_free(ds_backend *be) { return be->ops->exact_rows ? be->ops->exact_rows(be, 1) : 0; }
static void rows_restore(ds_backend *be, int prev) {
    if (be->ops->exact_rows) be->ops->exact_rows(be, prev);
}

static ds_error *step(ds_batch *b, int *active);
ds_error *ds_batch_step(ds_batch *b, int *active) {
    const int prev = rows_free(b->be); /* (the drafter's backend is the target's: ds_batch_new) */
    const int64_t steps = b->stats.steps, prefill = b->stats.prefill_rows, rows = b->stats.rows;
    const double t0 = ds_now_s();
    ds_error *e = step(b, active);
    if (!e && b->stats.steps > steps && b->stats.prefill_rows == prefill) { /* a step of decoding rows alone */
        b->stats.decode_steps++;
        b->stats.decode_step_s += ds_now_s() - t0;
        b->stats.decode_rows += b->stats.rows - rows;
    }
    rows_restore(b->be, prev);
    return e;
}

static void trace_step(ds_batch *b, int R, int rows, bool drafted, double t0, double t1, double t2, int64_t tokens0,
                       int64_t prefill0);
static ds_error *step(ds_batch *b, int *active) {
    ds_target *t = b->t;
    ds_drafter *d = b->d;
    const int G = d ? d->gamma : 0;
    const int64_t tokens0 = b->stats.generation_tokens, prefill0 = b->stats.prefill_rows;
    /* Sequences that need no more steps end here. */
    for (int i = 0; i < b->n_seqs; i++) {
        seq *s = b->seqs[i];
        if (s->phase == SEQ_RUNNING && s->started && s->cached >= s->goal && !wants_step(b, s)) finish(b, s);
    }
    admit(b);

    /* Whether this step drafts, before its rows are given out: a step that
     * does not gives each decoding sequence one row, not gamma + 1, and
     * prefill chunks the rest (reserved and unused, they cost Algorithm 1's
     * plain steps their prefill rows: 5 steps more than AR's 51, pico at 32
     * in flight). */
    bool draft_now = false;
    if (d) DS_TRY(drafting_pays(b, &draft_now));

    /* Pages first, for every row this step may write, preempting the
     * youngest where the pool is short: a sequence's random stream moves only
     * once its step is sure to run. Decoding sequences take their rows
     * before prefill chunks take what is left. */
    int rows = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < b->n_seqs; i++) {
            seq *s = b->seqs[i];
            if (s->phase != SEQ_RUNNING) continue;
            const bool decoding = s->started && s->cached >= s->goal;
            if (decoding != (pass == 0)) continue;
            s->n_rows = 0;
            s->prefill_step = !decoding;
            if (decoding) {
                const int gamma = draft_now ? seq_gamma(b, s) : 0;
                const int cap = gamma < t->max_ctx - s->start - 1 ? gamma : t->max_ctx - s->start - 1;
                if (rows + cap + 1 > b->o.step_rows) continue; /* next step */
                if (!reserve(b, s, target_need(b, s), s->start + G)) continue;
                s->n_rows = cap + 1; /* at most: the proposal may be shorter */
            } else {
                int m = s->goal - s->cached;
                const int left = b->o.step_rows - rows;
                if (m > left) m = left;
                if (d && m > d->max_rows) m = d->max_rows;
                if (m <= 0) continue;
                if (!reserve(b, s, s->cached + m + (s->cached + m == s->goal ? G + 1 : 0), s->cached + m)) continue;
                s->n_rows = m;
            }
            rows += s->n_rows;
        }

    /* Draft for every decoding sequence that got its rows, when drafting
     * pays; every sequence's new context rows wait in the held buffer. */
    const double t0 = ds_now_s();
    double tc = t0; /* after the held rows' flush */
    int R = 0; /* decoding sequences with rows this step */
    if (d) {
        for (int i = 0; i < b->n_seqs; i++) {
            seq *s = b->seqs[i];
            const bool decoding = s->phase == SEQ_RUNNING && !s->prefill_step && s->started && s->cached >= s->goal;
            s->drafted_now = false;
            if (!decoding) continue;
            R += s->n_rows > 0;
            if (!draft_now) s->prop.n = 0;
        }
        /* A step that drafts first appends what was held before it (timed apart: the draft cost Algorithm 1
         * weighs is a drafting step's, whose context is its last verify's rows alone). */
        if (R > 0 && draft_now) DS_TRY(flush_held(b));
        tc = ds_now_s();
        DS_TRY(hold_pending(b));
        if (R > 0 && draft_now) DS_TRY(draft_all(b));
        if (R > 0 && draft_now) {
            b->steps_undrafted = 0;
        } else if (R > 0) {
            b->steps_undrafted++;
            b->stats.draft_skips++;
        }
    }
    DS_TRY(schedule(b));
    const double t1 = ds_now_s();
    b->stats.draft_s += t1 - t0;
    if (draft_now && R > 0) {
        b->draft_cost[cost_bucket(R)] = rank0_seconds(b, t1 - tc);
        b->stats.draft_passes++;
        b->stats.draft_pass_s += t1 - tc;
    }

    /* The rows of one target forward. */
    int n = 0, n_logits = 0, n_table = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        seq *s = b->seqs[i];
        if (s->phase != SEQ_RUNNING || s->n_rows == 0) continue;
        DS_TRY(grow_table(b, n_table + s->tp.n));
        memcpy(b->table + n_table, s->tp.pages, (size_t)s->tp.n * sizeof *b->table);
        s->row0 = n;
        s->logit0 = n_logits;
        if (s->prefill_step) {
            for (int k = 0; k < s->n_rows; k++) b->ids[n + k] = s->hist[s->cached + k], b->pos[n + k] = s->cached + k;
            s->finishes_prefill = s->cached + s->n_rows == s->goal && !s->started;
            if (s->finishes_prefill) b->logit_rows[n_logits++] = n + s->n_rows - 1;
        } else {
            s->n_drafts = s->sched;
            s->n_rows = s->n_drafts + 1;
            b->ids[n] = s->anchor;
            b->pos[n] = s->start;
            for (int k = 0; k < s->n_drafts; k++) b->ids[n + 1 + k] = s->prop.tokens[k], b->pos[n + 1 + k] = s->start + 1 + k;
            for (int k = 0; k < s->n_rows; k++) b->logit_rows[n_logits++] = n + k;
        }
        for (int k = 0; k < s->n_rows; k++) b->row_table[n + k] = n_table;
        n_table += s->tp.n;
        n += s->n_rows;
    }
    *active = b->n_seqs - b->n_done;
    if (n == 0) {
        if (*active > 0 && !youngest_running(b, NULL))
            return ds_errorf("batched engine: %d requests wait, but the KV pool (%d pages) cannot take any", *active,
                             b->tpool.n_pages);
        return NULL;
    }
    const ds_kv_pages pg = {.page_rows = b->o.page_rows, .table = b->table, .row_table = b->row_table};
    const ds_target_rows tr = {.n = n, .ids = b->ids, .pos = b->pos, .pages = &pg, .n_logits = n_logits,
                               .logit_rows = b->logit_rows};
    DS_TRY(ds_target_forward_rows(t, &tr));
    if (n_logits) ds_target_argmax(t, n_logits, b->best);
    DS_TRY(ds_backend_check(t->be));
    DS_TRY(verify_all(b));
    b->stats.steps++;
    b->stats.rows += n;

    if (d) DS_TRY(append_prefill(b));
    for (int i = 0; i < b->n_seqs; i++) {
        seq *s = b->seqs[i];
        if (s->phase != SEQ_RUNNING || s->n_rows == 0) continue;
        if (s->prefill_step) {
            b->stats.prefill_rows += s->n_rows;
            DS_TRY(ds_error_wrap(after_prefill(b, s), "request %lld", (long long)s->id));
        } else {
            DS_TRY(ds_error_wrap(after_decode(b, s), "request %lld", (long long)s->id));
        }
        s->n_rows = 0;
        if (s->started && s->cached >= s->goal && !wants_step(b, s)) finish(b, s);
    }
    const double t2 = ds_now_s();
    b->stats.forward_s += t2 - t1;
    *active = b->n_seqs - b->n_done;
    if (b->o.trace) trace_step(b, R, n, draft_now && R > 0, t0, t1, t2, tokens0, prefill0);
    return NULL;
}

/* One line of opts.trace (batch.h): this step's rows, decision and predictions beside what it measured. */
static void trace_step(ds_batch *b, int R, int rows, bool drafted, double t0, double t1, double t2, int64_t tokens0,
                       int64_t prefill0) {
    const ds_schedule_result *r = &b->tr_res;
    fprintf(b->o.trace,
            "{\"step\":%lld,\"decoding\":%d,\"rows\":%d,\"prefill_rows\":%lld,\"drafted\":%s,\"why\":\"%s\","
            "\"draft_cost_pred\":%.6f,\"plain_pred\":%.6f,\"verify_tokens\":%d,\"tau_pred\":%.4f,"
            "\"step_pred\":%.6f,\"draft_s\":%.6f,\"forward_s\":%.6f,\"tokens\":%lld}\n",
            (long long)b->stats.steps, R, rows, (long long)(b->stats.prefill_rows - prefill0), drafted ? "true" : "false",
            b->tr_why ? b->tr_why : "none", b->tr_cost, b->tr_plain, r->verify_tokens, r->tau == r->tau ? r->tau : 0,
            b->o.sps && rows > 0 ? ds_step_cost_seconds(b->o.sps, rows) : 0, t1 - t0, t2 - t1,
            (long long)(b->stats.generation_tokens - tokens0));
}

ds_error *ds_batch_run(ds_batch *b) {
    int active = 1;
    while (active > 0) DS_TRY(ds_batch_step(b, &active));
    return NULL;
}

/* One forward of `tokens` rows shaped as a decoding step's (the work
 * Algorithm 1 weighs verify rows by): blocks of DS_PROBE_BLOCK rows, each
 * one scratch sequence at positions ctx .. ctx + 7 over a context of ctx
 * keys (o.profile_context, else 256, within the model's context), every
 * block reading the same scratch page list; every row with logits;
 * waited for. (Rows at positions 0.. of long sequences, as a prompt's, made
 * the curve a prefill's: its attention grows with the square of the rows,
 * and 2,048 rows cost 13.5x 256 at the Qwen3-8B shape, where verify rows
 * cost about as much each as decode rows.) The blocks write their keys to
 * the same cache rows: the values are scratch, only the time is kept. */
#define DS_PROBE_BLOCK 8
static ds_error *time_rows(void *ctx, int tokens, double *seconds) {
    ds_batch *b = ctx;
    ds_target *t = b->t;
    if (tokens > b->o.step_rows) tokens = b->o.step_rows;
    const int P = b->o.page_rows;
    int keys = b->o.profile_context > 0 ? b->o.profile_context : 256;
    if (keys > t->max_ctx - DS_PROBE_BLOCK) keys = t->max_ctx - DS_PROBE_BLOCK;
    if (keys > b->tpool.n_pages * P - DS_PROBE_BLOCK) keys = b->tpool.n_pages * P - DS_PROBE_BLOCK;
    if (keys < 0)
        return ds_errorf("step-cost profile: a context of %d or a pool of %d pages of %d rows holds no block of %d",
                         t->max_ctx, b->tpool.n_pages, P, DS_PROBE_BLOCK);
    ds_page_list pl = {0};
    if (!ds_page_list_reserve(&b->tpool, &pl, keys + DS_PROBE_BLOCK))
        return ds_errorf("step-cost profile: the pool has no room for %d rows", keys + DS_PROBE_BLOCK);
    const int n_logits = tokens < t->max_logit_rows ? tokens : t->max_logit_rows;
    for (int i = 0; i < tokens; i++)
        b->ids[i] = i % t->vocab, b->pos[i] = keys + i % DS_PROBE_BLOCK, b->row_table[i] = 0;
    for (int i = 0; i < n_logits; i++) b->logit_rows[i] = tokens - n_logits + i;
    const ds_kv_pages pg = {.page_rows = b->o.page_rows, .table = pl.pages, .row_table = b->row_table};
    const ds_target_rows tr = {.n = tokens, .ids = b->ids, .pos = b->pos, .pages = &pg, .n_logits = n_logits,
                               .logit_rows = b->logit_rows};
    const int prev = rows_free(t->be); /* the kernels the steps take */
    const double t0 = ds_now_s();
    ds_error *e = ds_target_forward_rows(t, &tr);
    if (!e) ds_target_argmax(t, n_logits, b->best);
    if (!e) e = ds_backend_check(t->be);
    *seconds = ds_now_s() - t0;
    rows_restore(t->be, prev);
    ds_page_list_release(&b->tpool, &pl);
    return e;
}

/* Tensor parallel: rank 0 profiles (or reads its cache), and before each
 * timed forward tells the other ranks how many rows, so that they run the
 * same forwards and the collectives inside meet; -1 ends. The curve is
 * rank 0's clock alone: every rank schedules by it (ds_batch_profile). */
static ds_error *time_rows_lead(void *ctx, int tokens, double *seconds) {
    ds_batch *b = ctx;
    ds_comm_from_rank0(b->t->comm, (float)tokens);
    return time_rows(ctx, tokens, seconds);
}

static ds_error *follow_profile(ds_batch *b) {
    ds_comm *c = b->t->comm;
    for (;;) {
        const int tokens = (int)ds_comm_from_rank0(c, 0);
        /* A stopped group's gathers give zeros, never the end: stop here (the failed rank's error is the one
         * reported). A forward that fails here returns at once: the caller stops the group (ds_comm_abort), so
         * rank 0 does not wait in a collective for this rank. */
        if (ds_comm_failed_rank(c) >= 0)
            return ds_errorf("step-cost profile: the ranks stopped after rank %d failed", ds_comm_failed_rank(c));
        if (tokens < 0) return NULL;
        double unused;
        DS_TRY(time_rows(b, tokens, &unused));
    }
}

ds_error *ds_batch_profile(ds_batch *b, const ds_step_cost_key *key, const char *cache_path, FILE *log,
                           ds_step_cost **out) {
    *out = NULL;
    for (int i = 0; i < b->n_seqs; i++)
        if (b->seqs[i]->phase == SEQ_RUNNING)
            return ds_errorf("step-cost profile: requests are running (profile before submitting)");
    ds_comm *c = b->t->comm;
    if (c && c->rank != 0) return follow_profile(b);
    const ds_step_cost_opts o = {.max_tokens = b->o.step_rows, .warmup = 1, .reps = 5,
                                 .interp = DS_STEP_COST_LINEAR};
    const ds_time_step_fn fn = c ? time_rows_lead : time_rows;
    ds_error *e = cache_path ? ds_step_cost_cached(cache_path, key, &o, fn, b, log, out, NULL)
                             : ds_step_cost_profile(&o, fn, b, out);
    if (c) ds_comm_from_rank0(c, -1);
    return e;
}
