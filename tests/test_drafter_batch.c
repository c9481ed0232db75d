/* ds_drafter_round_batch against ds_drafter_round, sequence by sequence:
 * seven sequences at different positions (prompts of 10..58 tokens) with 0
 * to gamma + 1 pending context rows, greedy and sampled (T = 1, and T = 0.8
 * with top-k and top-p), thresholds 0 and 0.5, each on its own scattered
 * pages of one pool. The batched round must give every sequence's proposal
 * bit for bit (tokens, confidence logits, n, the T > 0 distributions) and
 * its context length: once with a drafter sized for one sequence a pass,
 * once for 3 (passes of 3 + 3 + 1 blocks, the context in chunks) and once
 * for all 7 (one pass). On the pico pair (vanilla head), DFlash (no head),
 * DeepSpec's gated and RNN heads (qwen3-tiny) and a trained Gemma 4 drafter
 * (soft-capped logits); the pending taps copied a sequence at a time, and
 * gathered as rows of one tensor (ds_draft_batch_opts.taps). Then the
 * sequences it must refuse. On the GPU,
 * passes of more than 32 rows are row invariant with DS_CUDA_INVARIANT=1
 * (as test_batch). */
#include <stdlib.h>
#include <string.h>

#include "draft/drafter_batch.h"
#include "pico_prompts.h"
#include "testlib.h"

#define N_SEQS 7
#define PAGE_ROWS 8
#define POOL_PAGES 160
#define QWEN DS_TESTDATA "/fixtures/qwen3-tiny"
#define GEMMA DS_TESTDATA "/fixtures/gemma4-tiny"

static ds_backend *be;
static pico_prompt prompts[PICO_MAX_PROMPTS];

typedef struct {
    const char *name, *target, *drafter;
} pair;

static const pair pairs[] = {
    {"pico DSpark", DS_MODELS "/pico-qwen3", DS_MODELS "/pico-qwen3-dspark"},
    {"pico DFlash", DS_MODELS "/pico-qwen3", DS_DFLASH},
    {"qwen3-tiny gated", QWEN "/target", DS_TESTDATA "/fixtures/qwen3-tiny-heads/drafter-gated"},
    {"qwen3-tiny RNN", QWEN "/target", DS_TESTDATA "/fixtures/qwen3-tiny-heads/drafter-rnn"},
    {"Gemma 4 trained", GEMMA "/target", GEMMA "/drafter-trained"},
};

/* One sequence: its prompt, pending rows, sampling, two page lists (the
 * solo rounds' and the batched rounds'), and what the solo round gave. */
typedef struct {
    int len, pending, pre;
    int32_t ids[64], anchor;
    ds_sampling s;
    float threshold;
    int32_t pages_solo[16], pages_batch[16];
    int n_pages;
    ds_tensor taps; /* its pending rows' taps */
    ds_proposal solo;
    float *solo_probs, *batch_probs; /* [gamma, V] at T > 0 */
    int solo_nctx, batch_nctx;
} seq_case;

typedef struct {
    ds_drafter *d;
    seq_case *c;
    int calls;
} done_ctx;

/* The batched round's callback: the proposal's distributions leave the
 * drafter's buffers before the next sequence's walk. */
static ds_error *keep(void *ctx, int r, ds_proposal *out) {
    done_ctx *k = ctx;
    k->calls++;
    if (ds_sampling_greedy(&k->c[r].s)) return NULL;
    DS_TRY(ds_drafter_host_probs(k->d, out));
    memcpy(k->c[r].batch_probs, out->probs, (size_t)k->d->gamma * k->d->vocab * sizeof(float));
    out->probs = k->c[r].batch_probs;
    return NULL;
}

static void seed_rng(ds_rng *rng, int r) { ds_rng_seed(rng, 77 + 1000 * (uint64_t)r); }

/* The batched round over every case (pages_batch), compared with the solo
 * rounds; with src, the pending taps gathered from it (they are its rows). */
static void compare_batch(const pair *p, ds_drafter *d, seq_case *c, int R, ds_tensor src) {
    const int G = d->gamma, V = d->vocab;
    ds_draft_seq seqs[N_SEQS];
    ds_rng rngs[N_SEQS];
    ds_proposal props[N_SEQS];
    for (int r = 0; r < R; r++) {
        seed_rng(&rngs[r], r);
        c[r].batch_nctx = c[r].pre;
        seqs[r] = (ds_draft_seq){.id = r, .taps = c[r].taps, .pos0 = c[r].pre, .n = c[r].pending,
                                 .anchor = c[r].anchor, .start = c[r].len, .sampling = &c[r].s,
                                 .threshold = c[r].threshold, .rng = &rngs[r], .pages = c[r].pages_batch,
                                 .n_pages = c[r].n_pages, .n_ctx = &c[r].batch_nctx};
    }
    done_ctx k = {.d = d, .c = c};
    const ds_draft_batch_opts o = {.page_rows = PAGE_ROWS, .taps = src, .done = keep, .ctx = &k};
    CHECK_OK(ds_drafter_round_batch(d, R, seqs, &o, props));
    CHECK(k.calls == R, "%s: %d callbacks for %d sequences", p->name, k.calls, R);
    int same = 0, drafted = 0;
    for (int r = 0; r < R; r++) {
        const ds_proposal *a = &c[r].solo, *b = &props[r];
        bool ok = a->n == b->n && !memcmp(a->tokens, b->tokens, (size_t)G * sizeof *a->tokens) &&
                  c[r].solo_nctx == c[r].batch_nctx && b->n_kept == 0;
        if (d->confidence) ok = ok && !memcmp(a->conf_logit, b->conf_logit, (size_t)G * sizeof *a->conf_logit);
        if (!ds_sampling_greedy(&c[r].s))
            ok = ok && !memcmp(c[r].solo_probs, c[r].batch_probs, (size_t)G * V * sizeof(float));
        CHECK(ok, "%s, %d a pass: sequence %d (position %d, %d pending) differs: n %d vs %d, token 0 %d vs %d, "
                  "context %d vs %d",
              p->name, d->max_seqs, r, c[r].len, c[r].pending, a->n, b->n, a->tokens[0], b->tokens[0],
              c[r].solo_nctx, c[r].batch_nctx);
        same += ok;
        drafted += b->n;
    }
    printf("  %-18s %d a pass%s: %d/%d proposals identical (%d drafts kept)\n", p->name, d->max_seqs,
           src.data ? ", taps gathered" : "", same, R, drafted);
}

static void check_pair(const pair *p) {
    ds_target *t;
    ds_drafter *d;
    CHECK_OK(ds_target_open(be, p->target, NULL, &t));
    const ds_drafter_opts dopts = {.cache_rows = POOL_PAGES * PAGE_ROWS};
    ds_error *e = ds_drafter_open(be, p->drafter, t, &dopts, &d);
    if (e) ds_target_free(t);
    CHECK_OK(e);
    CHECK_OK(ds_target_set_taps(t, d->tap_layers, d->n_taps));
    const int G = d->gamma, V = d->vocab;
    /* Pages handed out in a scattered order: page i of the pool is (i * 37) mod POOL_PAGES. */
    int next_page = 0;
    seq_case c[N_SEQS];
    memset(c, 0, sizeof c);
    ds_tensor all_taps; /* every sequence's pending taps: rows r (G + 1).. */
    CHECK_OK(be->ops->alloc(be, DS_F32, (int64_t)N_SEQS * (G + 1), t->taps.cols, &all_taps));
    for (int r = 0; r < N_SEQS; r++) {
        seq_case *q = &c[r];
        q->len = 10 + 8 * r;
        q->pending = r == N_SEQS - 1 ? G + 1 : r * 5 % (G + 2); /* 3 a pass: more than 3 x (G + 1) rows in all */
        q->pre = q->len - q->pending;
        for (int k = 0; k < q->len; k++) q->ids[k] = prompts[r].ids[k] % t->vocab;
        q->s = r % 3 == 0   ? (ds_sampling){.temperature = 0, .top_p = 1.0f}
               : r % 3 == 1 ? (ds_sampling){.temperature = 1.0f, .top_p = 1.0f}
                            : (ds_sampling){.temperature = 0.8f, .top_k = 20, .top_p = 0.9f};
        q->threshold = r % 2 ? 0.5f : 0;
        q->n_pages = (q->len + G + PAGE_ROWS - 1) / PAGE_ROWS;
        for (int i = 0; i < q->n_pages; i++) q->pages_solo[i] = (next_page++ * 37) % POOL_PAGES;
        for (int i = 0; i < q->n_pages; i++) q->pages_batch[i] = (next_page++ * 37) % POOL_PAGES;
        q->solo_probs = malloc((size_t)G * V * sizeof(float));
        q->batch_probs = malloc((size_t)G * V * sizeof(float));
        CHECK(q->solo_probs && q->batch_probs, "out of memory");
        /* the prompt's taps: the first pre rows into both page lists, the rest pending */
        int32_t best;
        CHECK_OK(ds_target_forward_argmax(t, q->ids, q->len, 0, 1, &best));
        q->anchor = best;
        q->taps = ds_rows(all_taps, (int64_t)r * (G + 1), G + 1);
        if (q->pending) be->ops->copy(be, ds_rows(q->taps, 0, q->pending), ds_rows(t->taps, q->pre, q->pending));
        const int32_t *lists[2] = {q->pages_solo, q->pages_batch};
        const int32_t zeros[64] = {0};
        for (int l = 0; l < 2; l++) {
            const ds_kv_pages pg = {.page_rows = PAGE_ROWS, .table = lists[l], .row_table = zeros};
            d->pages = &pg;
            d->n_ctx = 0;
            e = ds_drafter_append(d, t->taps, 0, q->pre);
            d->pages = NULL;
            CHECK_OK(e);
        }
    }
    /* solo rounds, one sequence a call, on the solo pages */
    for (int r = 0; r < N_SEQS; r++) {
        seq_case *q = &c[r];
        const ds_kv_pages pg = {.page_rows = PAGE_ROWS, .table = q->pages_solo, .row_table = (const int32_t[64]){0}};
        d->pages = &pg;
        d->n_ctx = q->pre;
        ds_rng rng;
        seed_rng(&rng, r);
        e = ds_drafter_round(d, q->taps, q->pre, q->pending, q->anchor, q->len, &q->s, q->threshold, false, &rng,
                             &q->solo);
        d->pages = NULL;
        q->solo_nctx = d->n_ctx;
        CHECK_OK(e);
        if (!ds_sampling_greedy(&q->s)) {
            CHECK_OK(ds_drafter_host_probs(d, &q->solo));
            memcpy(q->solo_probs, q->solo.probs, (size_t)G * V * sizeof(float));
        }
    }
    compare_batch(p, d, c, N_SEQS, ds_no_tensor()); /* opened for one sequence a pass */
    CHECK_OK(ds_drafter_reserve_seqs(d, 3));
    CHECK(d->max_seqs == 3, "%s: max_seqs %d after reserving 3", p->name, d->max_seqs);
    compare_batch(p, d, c, N_SEQS, ds_no_tensor()); /* 3 + 3 + 1 */
    compare_batch(p, d, c, N_SEQS, all_taps);
    CHECK_OK(ds_drafter_reserve_seqs(d, N_SEQS));
    compare_batch(p, d, c, N_SEQS, ds_no_tensor()); /* one pass */
    compare_batch(p, d, c, N_SEQS, all_taps);
    be->ops->release(be, &all_taps);
    for (int r = 0; r < N_SEQS; r++) {
        free(c[r].solo_probs);
        free(c[r].batch_probs);
    }
    ds_drafter_free(d);
    ds_target_free(t);
}

static void test_batch_equals_solo(void) {
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) check_pair(&pairs[i]);
}

/* ds_drafter_opts.max_seqs sizes the drafter at open; what a batched round must refuse, before anything runs. */
static void test_refusals(void) {
    ds_target *t;
    ds_drafter *d;
    CHECK_OK(ds_target_open(be, DS_MODELS "/pico-qwen3", NULL, &t));
    const ds_drafter_opts dopts = {.cache_rows = 16 * PAGE_ROWS, .max_seqs = 4};
    ds_error *e = ds_drafter_open(be, DS_MODELS "/pico-qwen3-dspark", t, &dopts, &d);
    if (e) ds_target_free(t);
    CHECK_OK(e);
    CHECK(d->max_seqs == 4, "max_seqs %d, opened for 4", d->max_seqs);
    const int G = d->gamma;
    int32_t pages[2] = {3, 5};
    int nctx = 0, nctx2 = 0;
    const ds_sampling greedy = {.temperature = 0, .top_p = 1.0f};
    ds_rng rng;
    ds_rng_seed(&rng, 1);
    ds_draft_seq seqs[2] = {
        {.id = 10, .anchor = 1, .start = 0, .sampling = &greedy, .rng = &rng, .pages = pages, .n_pages = 2,
         .n_ctx = &nctx},
        {.id = 11, .anchor = 1, .start = 0, .sampling = &greedy, .rng = &rng, .pages = pages, .n_pages = 2,
         .n_ctx = &nctx2},
    };
    ds_proposal out[2];
    const ds_draft_batch_opts o = {.page_rows = PAGE_ROWS};
    seqs[1].start = 4;
    CHECK_ERR(ds_drafter_round_batch(d, 2, seqs, &o, out),
              "drafter sequence 11: drafting at position 4 but its context holds 0 rows");
    seqs[1].start = 2 * PAGE_ROWS - G + 1, nctx2 = seqs[1].start;
    CHECK_ERR(ds_drafter_round_batch(d, 2, seqs, &o, out),
              "drafter sequence 11: 2 pages of 8 rows cannot hold its block");
    seqs[1].start = 0, nctx2 = 0;
    seqs[0].anchor = d->vocab;
    CHECK_ERR(ds_drafter_round_batch(d, 2, seqs, &o, out), "anchor token 8192 is outside the vocabulary");
    seqs[0].anchor = 1;
    seqs[0].n = 2, seqs[0].pos0 = 0, seqs[0].start = 2;
    CHECK_ERR(ds_drafter_round_batch(d, 2, seqs, &o, out), "drafter sequence 10: taps of 0 x 0 for 2 rows");
    ds_tensor taps, other;
    CHECK_OK(be->ops->alloc(be, DS_F32, 4, (int64_t)d->n_taps * d->hidden, &taps));
    CHECK_OK(be->ops->alloc(be, DS_F32, 4, (int64_t)d->n_taps * d->hidden, &other));
    seqs[0].taps = ds_rows(taps, 1, 2);
    const ds_draft_batch_opts from_other = {.page_rows = PAGE_ROWS, .taps = other};
    CHECK_ERR(ds_drafter_round_batch(d, 2, seqs, &from_other, out),
              "drafter sequence 10: its 2 taps rows are not rows of the batch's taps tensor");
    const ds_draft_batch_opts from_short = {.page_rows = PAGE_ROWS, .taps = ds_rows(taps, 0, 2)};
    CHECK_ERR(ds_drafter_round_batch(d, 2, seqs, &from_short, out), "are not rows of the batch's taps tensor");
    const int32_t rows_out[2] = {1, 4}; /* taps_rows: row 4 of a 4-row tensor */
    seqs[0].taps = taps, seqs[0].taps_rows = rows_out;
    const ds_draft_batch_opts from_taps = {.page_rows = PAGE_ROWS, .taps = taps};
    CHECK_ERR(ds_drafter_round_batch(d, 2, seqs, &from_taps, out),
              "drafter sequence 10: taps row 4 is outside the batch's 4");
    CHECK_ERR(ds_drafter_round_batch(d, 2, seqs, &o, out),
              "drafter sequence 10: rows of the batch's taps tensor, but there is none");
    seqs[0].taps_rows = NULL;
    be->ops->release(be, &taps);
    be->ops->release(be, &other);
    seqs[0].taps = ds_no_tensor();
    seqs[0].n = 0, seqs[0].start = 0;
    seqs[0].pages = NULL;
    CHECK_ERR(ds_drafter_round_batch(d, 2, seqs, &o, out), "drafter sequence 10: no page list");
    CHECK_ERR(ds_drafter_reserve_seqs(d, 0), "max_seqs 0");
    ds_drafter_free(d);
    ds_target_free(t);
}

static void setup(void) {
    CHECK_OK(test_backend_new(&be));
    CHECK(pico_load_prompts(prompts, PICO_MAX_PROMPTS) >= N_SEQS, "dev prompts");
}

static void teardown(void) {
    if (be) be->ops->destroy(be);
}

RUN_TESTS("drafter_batch", setup, test_batch_equals_solo, test_refusals, teardown)
