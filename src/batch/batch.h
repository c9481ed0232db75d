/* The batched engine: many requests at once over one target and one
 * drafter. Each step drafts for every decoding sequence in ONE drafter pass
 * (draft/drafter_batch.h), then runs ONE target forward over the ragged
 * rows of all of them (verify blocks, autoregressive rows and prefill
 * chunks mixed), whose keys and values live in a shared pool of pages
 * (pages.h); then accepts and commits each sequence on its own. Requests join between steps and leave when done.
 *
 * Batch invariance: every op is row invariant, attention reads only the
 * row's own sequence, and each request draws from its own random stream in
 * the order ds_generate draws, so a request's tokens are those of its solo
 * run (ds_generate with the same parameters) whatever else runs beside it,
 * at T = 0 and at T > 0 alike. Algorithm 1 (DS_SCHEDULE_CONFIDENCE) verifies
 * a prefix of each proposal chosen across the batch: still the target's
 * output exactly at T = 0 and its distribution exactly at T > 0, but at
 * T > 0 which tokens are drawn depends on where rounds end, so on the
 * batch. When the pool runs out, the youngest running
 * sequence is preempted: its pages go back and its cache is recomputed
 * later from its tokens, bit for bit the same rows. */
#ifndef DS_BATCH_H
#define DS_BATCH_H

#include <stdio.h>

#include "batch/pages.h"
#include "speculate/generate.h"
#include "speculate/sim_acceptance.h"
#include "speculate/step_cost.h"

typedef struct ds_batch ds_batch;

/* How many drafts each sequence verifies a step. */
typedef enum {
    DS_SCHEDULE_FIXED,      /* its whole proposal (after the threshold), up to its gamma: as ds_generate */
    DS_SCHEDULE_CONFIDENCE, /* SPEC §6 Algorithm 1 over every sequence's calibrated confidences, against the
                               target's step cost (sps): a prefix of each proposal, lossless */
} ds_schedule_kind;

typedef struct {
    int max_seqs;  /* sequences in flight at once (the rest wait) */
    int step_rows; /* most target rows per step (verify rows, decode rows and prefill chunks together) */
    int page_rows; /* rows a KV page holds */
    int n_pages;   /* pages of the target's pool (the drafter's gets as many, plus room for its blocks) */
    ds_schedule_kind schedule;
    const ds_step_cost *sps; /* DS_SCHEDULE_CONFIDENCE: the target's verify step cost by rows (the caller's;
                                ds_batch_profile makes one) */
    int profile_context;     /* ds_batch_profile: keys each profiled row attends to (0: 256) */
    /* Diagnostic for benchmarks at real shapes with synthetic weights (dspark bench --sim-acceptance): every
     * kernel runs as it would (draft, verify of the scheduled lengths, KV appends and crops), but each
     * round's confidences and its accepted count are drawn from this profile (one stream a request, from
     * sim_seed) instead of the drafter's and the verifier's. The output is then not the target's: never
     * for generation. NULL: off. */
    const ds_sim_profile *sim;
    uint64_t sim_seed;
    /* Diagnostic: one JSON object a line a step (dspark bench --trace): its rows, whether it drafted and why,
     * Algorithm 1's predictions (draft cost, plain step, verify step, tokens) beside the measured times and
     * tokens, so that the cost model can be checked against the machine. NULL: off. */
    FILE *trace;
} ds_batch_opts;

/* One request: the prompt (copied) and ds_generate's parameters (verify
 * must be NULL: the batched engine verifies with ds_verify). */
typedef struct {
    const int32_t *prompt;
    int n_prompt;
    ds_gen_params params;
} ds_batch_request;

/* Opens an engine over t and d (d NULL: autoregressive). Their caches must
 * be pools (ds_target_opts.cache_rows, ds_drafter_opts.cache_rows) of at
 * least n_pages x page_rows rows (the drafter's: ds_batch_drafter_rows), and
 * t->max_rows, t->max_logit_rows at least step_rows. d's buffers grow to
 * draft max_seqs sequences in one pass (ds_drafter_reserve_seqs). */
ds_error *ds_batch_new(ds_target *t, ds_drafter *d, const ds_batch_opts *opts, ds_batch **out);
void ds_batch_free(ds_batch *b);
/* Cache rows the drafter's pool needs for opts (the target's pages, plus
 * every sequence's block). */
int ds_batch_drafter_rows(const ds_batch_opts *opts, int gamma);
/* Bytes of the held drafter context ds_batch_new allocates beside a drafter
 * of block gamma and taps_cols taps a row (fp32): 2 x max_seqs x (gamma + 1) rows. */
int64_t ds_batch_held_bytes(const ds_batch_opts *opts, int gamma, int64_t taps_cols);

/* Queues a request; *id numbers it from 0 in submission order. Refuses a
 * request that could never run (empty or over-long prompt, a prompt the
 * whole pool cannot hold, bad ids) with a message naming it. */
ds_error *ds_batch_submit(ds_batch *b, const ds_batch_request *req, int64_t *id);
/* One engine step: admit, draft, one target forward, accept, commit.
 * *active: requests not finished after it (0: all done). */
ds_error *ds_batch_step(ds_batch *b, int *active);
/* Steps until every submitted request has finished. */
ds_error *ds_batch_run(ds_batch *b);
/* A finished request's result (NULL while it runs, or released); owned by
 * the engine. */
const ds_gen_result *ds_batch_result(const ds_batch *b, int64_t id);

/* Where a request is between steps: its result so far (res->tokens: every
 * committed token; res->stop_reason once finished), owned by the engine. */
typedef struct {
    const ds_gen_result *res;
    int n_prompt;
    bool running;  /* holds pages (prefilling or decoding) */
    bool finished;
} ds_batch_state_info;
/* An unknown (released or never submitted) id is an error. */
ds_error *ds_batch_state(const ds_batch *b, int64_t id, ds_batch_state_info *st);
/* Ends a request between steps (stop reason DS_STOP_CALLER), its pages
 * back to the pools at once; its tokens stay readable. No-op when finished. */
ds_error *ds_batch_cancel(ds_batch *b, int64_t id);
/* Forgets a request, cancelling it first: a server's engine runs for days,
 * so finished requests must not pile up. */
ds_error *ds_batch_release(ds_batch *b, int64_t id);

/* The step-cost cache key's build field: a cached curve of an older probe shape is profiled again. */
#define DS_BATCH_PROFILE_BUILD "dspark batch v3 (decode-shaped rows, round-robin buckets)"
/* Profiles the target's step cost (steps per second by rows a step) on b's
 * own pool, cached at cache_path (NULL: not cached) under key: the curve
 * Algorithm 1 weighs drafts against. Run before any request is submitted.
 * Under tensor parallelism (the target's comm) every rank calls it at once;
 * rank 0 times (and caches) and the others run its forwards beside it: *out
 * is rank 0's alone (NULL on the others), for every rank's ds_batch_opts.sps. */
ds_error *ds_batch_profile(ds_batch *b, const ds_step_cost_key *key, const char *cache_path, FILE *log,
                           ds_step_cost **out);

/* What the engine did so far. */
typedef struct {
    int64_t steps, rows, prefill_rows, preemptions;
    int64_t drafted, verified_drafts; /* drafts proposed (after the threshold) and sent to verification */
    int64_t generation_tokens, finished; /* tokens committed; requests ended */
    int64_t draft_skips; /* steps that decoded autoregressively because drafting was predicted not to pay */
    /* Drafted steps that Algorithm 1 did not predict to pay: probes (drafting
     * now and then to keep the confidences and the cost current), and steps
     * at a request count whose draft cost was not yet measured or bounded. */
    int64_t draft_probes, draft_unmeasured;
    /* Verify rounds (vLLM's spec_decode counters): rounds with drafts, the
     * drafts they verified, those accepted, and per draft position k the
     * rounds that accepted it. */
    int64_t drafts, draft_tokens, accepted_tokens, accepted_pos[DS_MAX_GAMMA];
    int max_running;   /* most sequences in flight in one step */
    int running, waiting;          /* now: sequences holding pages, sequences queued (or preempted) */
    int pages_used, pages_total;   /* now: the target's pool */
    double forward_s;  /* time in target forwards (outputs included) */
    double draft_s;    /* time in drafter rounds (steps that verify without drafting: the context append alone) */
    int64_t draft_passes; /* steps that drafted, and their draft time (the rest of draft_s: context appends) */
    double draft_pass_s;
    /* Steps with no prefill rows and their whole time (draft, forward,
     * commit): a speculative round's cost against a plain step's, prompts
     * left out (bench: decode_step_s per arm). */
    int64_t decode_steps;
    double decode_step_s;
    int64_t decode_rows; /* target rows those steps ran (the forwards' work there, for their TFLOP/s) */
    uint64_t token_hash; /* a running hash of every committed (request, token): ranks under TP compare it */
} ds_batch_stats;
ds_batch_stats ds_batch_get_stats(const ds_batch *b);

#endif
