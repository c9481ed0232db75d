/* The batched engine under tensor parallelism (issue 43; src/batch/batch_tp.h), 2 ranks emulated by threads
 * on the CPU, on the bundled pico pair, for autoregressive decoding, fixed gamma and Algorithm 1 (whose
 * profile and draft-cost clock are rank 0's), at T = 0 and at T = 1 with a seed a request:
 *  - every request of a prompt set through the batched engine at tp 2 gets the tokens of its own solo run
 *    at tp 2 (ds_engine_generate): the ranks stepped together are the engine that runs alone, bit for bit
 *    (the engine also checks every step that the ranks committed the same tokens);
 *  - at T = 0 the tokens of tp 1's batched engine, up to where tp 1's logits hold a near tie (within one
 *    bf16 step of the top logit: the split sums each projection in another order, so the logits differ
 *    in their last bits, comm.h). At T = 1 those bits move the draws, so tp 2 is compared with tp 1 only
 *    for the record (the distribution is the same; the draws are not).
 * Algorithm 1 at T = 1 draws where its rounds end, which its measured costs decide: there every output is
 * checked whole. Then a small KV budget at tp 2: sequences are preempted and recomputed, and no request is
 * lost or changed; and requests that come and go (submit, step, cancel) as the server drives the engine.
 * DS_TEST_QUICK (the sanitizer build): 3 requests of 8 tokens instead of 6 of 16. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/comm.h"
#include "batch/batch_tp.h"
#include "dspark.h"
#include "model/target.h"
#include "speculate/round.h"
#include "pico_prompts.h"
#include "testlib.h"

#define N_REQ 6
#define NEW_TOKENS 16
#define TARGET DS_MODELS "/pico-qwen3"
#define DRAFTER DS_MODELS "/pico-qwen3-dspark"

static pico_prompt prompts[PICO_MAX_PROMPTS];
static const int32_t *ids[N_REQ];
static int n_req = N_REQ, new_tokens = NEW_TOKENS; /* DS_TEST_QUICK (CI's sanitizer build): fewer */
static bool quick;
static size_t lens[N_REQ];

typedef enum { AR, FIXED, ALG1 } mode;
static const char *const mode_names[] = {"AR", "fixed gamma", "Algorithm 1"};

static void setup(void) {
    const int n = pico_load_prompts(prompts, PICO_MAX_PROMPTS);
    const char *q = getenv("DS_TEST_QUICK");
    quick = q && *q && strcmp(q, "0");
    if (quick) n_req = 3, new_tokens = 8;
    CHECK(n >= N_REQ, "%d dev prompts", n);
    for (int i = 0; i < N_REQ; i++) {
        const int len = 12 + (i * 13) % 53; /* mixed lengths: prefills of one and of several chunks */
        ids[i] = prompts[i].ids;
        lens[i] = (size_t)(len < prompts[i].n_ids ? len : prompts[i].n_ids);
    }
}

static ds_engine *open_engine(int tp, mode m, int batch, int64_t kv_mem) {
    const ds_engine_opts o = {.model_dir = TARGET, .drafter_dir = m == AR ? NULL : DRAFTER, .threads = 2,
                              .no_sts = true, .tp = tp, .batch = batch, .ctx = batch ? 96 : 0, .kv_mem = kv_mem,
                              .confidence_schedule = m == ALG1};
    ds_engine *e = NULL;
    ds_error *err = ds_engine_open(&o, &e);
    if (err) { /* every later check needs it */
        fprintf(stderr, "FAIL: ds_engine_open (tp %d, %s, batch %d): %s\n", tp, mode_names[m], batch,
                ds_error_message(err));
        exit(1);
    }
    return e;
}

static ds_generate_opts opts_for(float temp, int i) {
    return (ds_generate_opts){.max_new = new_tokens, .temperature = temp, .seed = 100 + (uint64_t)i};
}

static void run_batch(ds_engine *e, int n, float temp, ds_output *outs, ds_batch_summary *sum) {
    ds_generate_opts o[N_REQ];
    for (int i = 0; i < n; i++) o[i] = opts_for(temp, i);
    CHECK_OK(ds_engine_generate_batch(e, (size_t)n, ids, lens, o, outs, sum));
}

static bool same_tokens(const ds_output *a, const ds_output *b) {
    return a->n_tokens == b->n_tokens &&
           (!a->n_tokens || !memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof *a->tokens));
}

/* Where tp 2's greedy tokens b leave tp 1's a (same prompt): tp 1's logits there must hold a near tie
 * between the two tokens (a within one bf16 step of the top). *same: the tokens before it. */
static void check_near_tie(const ds_output *a, const ds_output *b, int req, int *same) {
    int k = 0;
    while (k < a->n_tokens && k < b->n_tokens && a->tokens[k] == b->tokens[k]) k++;
    *same = k;
    if (k == a->n_tokens && k == b->n_tokens) return;
    if (k == a->n_tokens || k == b->n_tokens) {
        CHECK(false, "request %d: tp 1 and tp 2 give %d and %d tokens, the same as far as both go", req, a->n_tokens,
              b->n_tokens);
        return;
    }
    ds_backend *be;
    ds_target *t;
    CHECK_OK(ds_backend_cpu_new(1, &be));
    const ds_target_opts to = {.max_rows = 128, .max_logit_rows = 1};
    CHECK_OK(ds_target_open(be, TARGET, &to, &t));
    int32_t seq[128];
    const int n = (int)lens[req] + k;
    memcpy(seq, ids[req], lens[req] * sizeof *seq);
    memcpy(seq + lens[req], a->tokens, (size_t)k * sizeof *seq);
    float *lg = malloc((size_t)t->vocab * sizeof *lg);
    CHECK_OK(ds_target_forward(t, seq, n, 0, 1));
    CHECK_OK(ds_round_fetch_logits(t, 1, lg));
    const float top = lg[a->tokens[k]], other = lg[b->tokens[k]];
    const float step = ldexpf(1.0f, ilogbf(fabsf(top)) - 7); /* a bf16 ulp at the top logit */
    printf("  request %d: tp 2 leaves tp 1 at token %d: %d (logit %.4f) vs tp 1's %d (%.4f), one bf16 step %.4f\n",
           req, k, b->tokens[k], other, a->tokens[k], top, step);
    CHECK(top >= other && top - other <= step, "request %d: tp 2 leaves tp 1's greedy tokens at %d only at a near tie "
          "(gap %.4f, one bf16 step %.4f)", req, k, top - other, step);
    free(lg);
    ds_target_free(t);
    be->ops->destroy(be);
}

static void free_outs(ds_output *o, int n) {
    for (int i = 0; i < n; i++) ds_output_free(&o[i]);
}

/* tp 2 against tp 1 (batched) and against each request's solo run at tp 2. */
static void test_modes(void) {
    ds_engine *solo = open_engine(2, FIXED, 0, 0); /* one generation at a time, drafted or not (no_draft) */
    for (mode m = AR; m <= ALG1; m++) {
        /* DS_TEST_QUICK: Algorithm 1 at tp 2 only (each engine profiles its step cost first: seconds under ASan) */
        ds_engine *e1 = quick && m == ALG1 ? NULL : open_engine(1, m, 4, 0), *e2 = open_engine(2, m, 4, 0);
        for (int ti = 0; ti < 2; ti++) {
            const float temp = (float)ti;
            ds_output o1[N_REQ] = {0}, o2[N_REQ];
            if (e1) run_batch(e1, n_req, temp, o1, NULL);
            run_batch(e2, n_req, temp, o2, NULL);
            const bool exact = !(m == ALG1 && temp > 0); /* Algorithm 1 at T > 0: rounds end where costs say */
            int same1 = 0, same_solo = 0, whole = 0, prefix = 0, total = 0;
            for (int i = 0; i < n_req; i++) {
                whole += o2[i].n_tokens == new_tokens || o2[i].finish_reason == DS_FINISH_STOP;
                if (e1) {
                    same1 += same_tokens(&o1[i], &o2[i]);
                    total += o1[i].n_tokens;
                    int k = 0;
                    if (temp == 0) check_near_tie(&o1[i], &o2[i], i, &k);
                    prefix += k;
                }
                if (!exact) continue;
                ds_generate_opts so = opts_for(temp, i);
                so.no_draft = m == AR;
                ds_output s;
                CHECK_OK(ds_engine_generate(solo, ids[i], lens[i], &so, NULL, NULL, &s));
                same_solo += same_tokens(&s, &o2[i]);
                ds_output_free(&s);
            }
            printf("%s, T=%g: tp 2 batched == its solo run at tp 2 %d/%d, == tp 1 batched %d/%d", mode_names[m],
                   temp, same_solo, exact ? n_req : 0, same1, e1 ? n_req : 0);
            if (temp == 0) printf(" (%d of %d tokens before a near tie)", prefix, total);
            printf(", whole %d/%d\n", whole, n_req);
            CHECK(whole == n_req, "%s, T=%g: every request's output whole at tp 2", mode_names[m], temp);
            if (exact) CHECK(same_solo == n_req, "%s, T=%g: tp 2 batched == solo for every request", mode_names[m], temp);
            free_outs(o1, n_req);
            free_outs(o2, n_req);
        }
        ds_engine_free(e2);
        ds_engine_free(e1);
    }
    ds_engine_free(solo);
}

/* A KV budget of about two requests for six at once: preemption and recompute under tp 2, every request
 * whole and as tp 2's unpreempted run (a pool for all six). */
static void test_preemption(void) {
    ds_engine *e1 = open_engine(2, FIXED, N_REQ, 0);
    ds_engine_info in1;
    ds_engine_get_info(e1, &in1);
    const int64_t budget = 2 * 120 * (in1.kv_target_row_bytes + in1.kv_drafter_row_bytes);
    ds_engine *e2 = open_engine(2, FIXED, N_REQ, budget);
    ds_engine_info in2;
    ds_engine_get_info(e2, &in2);
    ds_output o1[N_REQ], o2[N_REQ];
    ds_batch_summary s1, s2;
    run_batch(e1, N_REQ, 0, o1, &s1);
    run_batch(e2, N_REQ, 0, o2, &s2);
    int same = 0;
    for (int i = 0; i < N_REQ; i++) same += same_tokens(&o1[i], &o2[i]);
    printf("preemption: tp 2 over %d pages (the large pool: %d): %ld preemptions, %d/%d requests as tp 2's\n",
           in2.kv_pages, in1.kv_pages, s2.preemptions, same, N_REQ);
    CHECK(s1.preemptions == 0 && s2.preemptions > 0, "tp 2 preempted (%ld) where the large pool did not (%ld)",
          s2.preemptions, s1.preemptions);
    CHECK(same == N_REQ, "preemption at tp 2 lost or changed no request (%d/%d)", same, N_REQ);
    free_outs(o1, N_REQ);
    free_outs(o2, N_REQ);
    ds_engine_free(e2);
    ds_engine_free(e1);
}

/* The server's way: submit, step, cancel, release on rank 0's engine; the ranks follow. */
static void test_come_and_go(void) {
    ds_engine *e = open_engine(2, FIXED, 4, 0);
    ds_request_id a, b, c;
    const ds_generate_opts o = opts_for(0, 0), hot = opts_for(1, 1);
    CHECK_OK(ds_engine_submit(e, ids[0], lens[0], &o, &a));
    CHECK_OK(ds_engine_submit(e, ids[1], lens[1], &hot, &b));
    int active = 0;
    for (int k = 0; k < 3; k++) CHECK_OK(ds_engine_step(e, &active));
    CHECK_OK(ds_engine_cancel(e, b)); /* mid-run: its pages back on every rank */
    CHECK_OK(ds_engine_submit(e, ids[2], lens[2], &o, &c));
    do CHECK_OK(ds_engine_step(e, &active));
    while (active > 0);
    ds_request_state sa, sb, sc;
    CHECK_OK(ds_engine_request(e, a, &sa));
    CHECK_OK(ds_engine_request(e, b, &sb));
    CHECK_OK(ds_engine_request(e, c, &sc));
    CHECK(sa.finished && sc.finished && sb.finished && sb.finish_reason == DS_FINISH_CALLER,
          "requests that come and go at tp 2 end (cancelled: %s)", ds_finish_reason_name(sb.finish_reason));
    ds_output solo;
    CHECK_OK(ds_engine_generate(e, ids[2], lens[2], &o, NULL, NULL, &solo));
    CHECK(solo.n_tokens == (int)sc.n_tokens && !memcmp(solo.tokens, sc.tokens, sc.n_tokens * sizeof *sc.tokens),
          "a request submitted mid-run at tp 2 == its batch of one");
    ds_output_free(&solo);
    for (ds_request_id id = a; id <= c; id++) CHECK_OK(ds_engine_release(e, id));
    CHECK_ERR(ds_engine_cancel(e, a), "no such request");
    ds_engine_free(e);
}

/* ---- a rank that fails alone ------------------------------------------- */

typedef struct {
    ds_comm *comm;
    ds_backend *be;
    ds_target *t;
    ds_error *err;
} rank_open;

static void *open_rank(void *p) {
    rank_open *r = p;
    const ds_target_opts to = {.comm = r->comm, .max_rows = 64, .max_logit_rows = 64, .cache_rows = 16 * 16};
    r->err = ds_backend_cpu_new(1, &r->be);
    if (!r->err) r->err = ds_target_open(r->be, TARGET, &to, &r->t);
    return NULL;
}

/* Rank 1's forward fails while rank 0 is in a collective of the same call (its target made to refuse rows
 * past one a call): the step-cost profile (rank 1 a follower, rank 0 leading and timing) and then a step
 * return, no rank left waiting, the error naming rank 1; the group stays stopped. */
static void test_rank_failure(void) {
    ds_comm ranks[2];
    ds_comm_group *grp = NULL;
    CHECK_OK(ds_comm_group_threads(2, &grp, ranks));
    rank_open ro[2] = {{.comm = &ranks[0]}, {.comm = &ranks[1]}};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, open_rank, &ro[1]) == 0, "rank 1's thread");
    open_rank(&ro[0]);
    pthread_join(th, NULL);
    CHECK_OK(ro[0].err);
    CHECK_OK(ro[1].err);
    ds_target *t[2] = {ro[0].t, ro[1].t};
    const ds_batch_opts bo = {.max_seqs = 4, .step_rows = 64, .page_rows = 16, .n_pages = 16};
    ds_batch_tp *g = NULL;
    CHECK_OK(ds_batch_tp_new(2, t, NULL, &bo, &g));
    ro[1].t->max_rows = 1; /* rank 1 refuses the profile's forwards of 2 rows and more */
    ds_step_cost *sps = NULL;
    ds_error *e = ds_batch_tp_profile(g, NULL, NULL, NULL, &sps);
    const char *msg = e ? ds_error_message(e) : "";
    printf("  rank 1 failing in the step-cost profile: \"%s\"\n", msg);
    CHECK(e && strstr(msg, "rank 1") && strstr(msg, "rows") && !sps, "the profile's error names rank 1's forward");
    ds_error_free(e);
    int active = 0;
    e = ds_batch_tp_step(g, &active);
    msg = e ? ds_error_message(e) : "";
    CHECK(e && strstr(msg, "stopped after rank 1 failed"), "a stopped group refuses the next step: \"%s\"", msg);
    ds_error_free(e);
    ds_batch_tp_free(g);
    for (int r = 0; r < 2; r++) ds_target_free(ro[r].t), ro[r].be->ops->destroy(ro[r].be);
    ds_comm_group_free(grp);
}

RUN_TESTS("tp_batch", setup, test_modes, test_preemption, test_come_and_go, test_rank_failure)
