/* Stop tokens in the generation loop (SPEC §5 "Stop tokens"), on the bundled
 * pico pair at T = 0:
 * - a stop token among a round's accepted drafts: the output is cut right
 *   after it, no bonus follows, that round counts `accepted` (the drafts up
 *   to and including the stop token) as its accepted, proposed and length;
 * - a stop token as a round's bonus: emitted, then the end; the round is
 *   recorded as it ran (accepted, proposed, accepted + 1);
 * - a stop token as the first token (the prefill's argmax): 0 rounds.
 * Each case's stop token is found at run time: plain decoding without stop
 * tokens gives the output, a drafted run of the same prompt gives the rounds
 * (where each output position lies: a draft, a bonus, the first), and a token
 * whose first occurrence lies in the wanted place becomes the only stop
 * token. Nothing here depends on one machine's rounding: the expected
 * sequences are that host's own plain-decoding output, cut. */
#include <stdlib.h>
#include <string.h>

#include "draft/drafter.h"
#include "pico_prompts.h"
#include "speculate/generate.h"
#include "testlib.h"

#define NEW_TOKENS 48

static ds_backend *be;
static ds_target *target;
static ds_drafter *drafter;
static pico_prompt prompts[PICO_MAX_PROMPTS];
static int n_prompts;

static void setup(void) {
    CHECK_OK(test_backend_new(&be));
    ds_target_opts o = {.max_rows = 64, .max_logit_rows = DS_MAX_GAMMA + 1};
    CHECK_OK(ds_target_open(be, DS_MODELS "/pico-qwen3", &o, &target));
    CHECK_OK(ds_drafter_open(be, DS_MODELS "/pico-qwen3-dspark", target, NULL, &drafter));
    n_prompts = pico_load_prompts(prompts, PICO_MAX_PROMPTS);
    CHECK(n_prompts > 0, "no dev prompts");
}

static void set_stop(int32_t id) {
    target->n_stop = id >= 0;
    target->stop_ids[0] = id;
}

/* Counts the streamed tokens and checks they are the result's, in order. */
typedef struct {
    int n;
    int32_t tokens[NEW_TOKENS + 1];
} stream;

static bool on_token(void *user, int32_t tok) {
    stream *s = user;
    if (s->n <= NEW_TOKENS) s->tokens[s->n] = tok;
    s->n++;
    return true;
}

/* Greedy generation of prompt p with stop token `stop` (-1: none), drafted or not. */
static ds_error *run(const pico_prompt *p, int32_t stop, bool drafted, ds_gen_result *r) {
    set_stop(stop);
    ds_gen_params gp = {.max_new = NEW_TOKENS};
    stream s = {0};
    ds_error *e = ds_generate(target, drafted ? drafter : NULL, p->ids, p->n_ids, &gp, on_token, &s, r);
    if (!e) {
        CHECK(s.n == r->n_tokens && !memcmp(s.tokens, r->tokens, (size_t)s.n * sizeof *s.tokens),
              "streamed %d tokens, result has %d (or they differ)", s.n, r->n_tokens);
        int acc = 0;
        for (int i = 0; i < r->rounds; i++) acc += r->accept_len[i];
        /* the prefill's token, then each round's length, trimmed at NEW_TOKENS */
        CHECK(!drafted || r->n_tokens == (1 + acc < NEW_TOKENS ? 1 + acc : NEW_TOKENS),
              "%d tokens from rounds of total length %d", r->n_tokens, acc);
    }
    return e;
}

/* Where an output position lies in the unstopped drafted run. */
typedef enum { AT_FIRST, AT_DRAFT, AT_BONUS } place;

typedef struct {
    place where;
    int round; /* the round that committed it (AT_DRAFT, AT_BONUS) */
    int draft; /* its index among that round's accepted drafts (AT_DRAFT) */
} position;

static void locate(const ds_gen_result *sp, position *pos) {
    pos[0] = (position){AT_FIRST, -1, -1};
    int q = 1;
    for (int i = 0; i < sp->rounds && q < sp->n_tokens; i++) {
        for (int j = 0; j < sp->accepted[i] && q < sp->n_tokens; j++) pos[q++] = (position){AT_DRAFT, i, j};
        if (q < sp->n_tokens) pos[q++] = (position){AT_BONUS, i, -1};
    }
}

static bool first_occurrence(const ds_gen_result *r, int q) {
    for (int i = 0; i < q; i++)
        if (r->tokens[i] == r->tokens[q]) return false;
    return true;
}

/* Runs one case: stop token = the output's token at q; plain decoding and
 * drafting both end there; the drafted rounds before the stop round are the
 * unstopped run's, the stop round as the case says. */
static void check_case(const pico_prompt *p, const ds_gen_result *ar, const ds_gen_result *sp, int q,
                       const position *at, const char *what) {
    const int32_t stop = ar->tokens[q];
    printf("  %s: prompt of %d tokens, stop token %d at output position %d", what, p->n_ids, stop, q);
    if (at->where != AT_FIRST) printf(" (round %d, %d drafts accepted)", at->round, sp->accepted[at->round]);
    printf("\n");
    ds_gen_result a = {0}, d = {0};
    ds_error *e = run(p, stop, false, &a);
    if (!e) e = run(p, stop, true, &d);
    set_stop(-1);
    if (e) {
        CHECK(0, "%s: %s", what, ds_error_message(e));
        ds_error_free(e);
        goto out;
    }
    /* plain decoding: the unstopped output up to and including the stop token */
    CHECK(a.stopped && a.n_tokens == q + 1 && !memcmp(a.tokens, ar->tokens, (size_t)(q + 1) * sizeof *a.tokens),
          "%s: plain decoding gave %d tokens (stopped %d), expected the first %d", what, a.n_tokens, a.stopped, q + 1);
    /* drafting: exactly plain decoding's tokens */
    CHECK(d.stopped && d.n_tokens == a.n_tokens && !memcmp(d.tokens, a.tokens, (size_t)a.n_tokens * sizeof *a.tokens),
          "%s: drafted %d tokens (stopped %d), plain decoding %d", what, d.n_tokens, d.stopped, a.n_tokens);
    const int want_rounds = at->where == AT_FIRST ? 0 : at->round + 1;
    CHECK(d.rounds == want_rounds, "%s: %d rounds, expected %d", what, d.rounds, want_rounds);
    if (d.rounds != want_rounds) goto out;
    for (int i = 0; i + 1 < d.rounds; i++)
        CHECK(d.accepted[i] == sp->accepted[i] && d.proposed[i] == sp->proposed[i] &&
                  d.accept_len[i] == sp->accept_len[i],
              "%s: round %d (%d, %d, %d), unstopped (%d, %d, %d)", what, i, d.accepted[i], d.proposed[i],
              d.accept_len[i], sp->accepted[i], sp->proposed[i], sp->accept_len[i]);
    if (at->where == AT_FIRST) goto out;
    const int r = at->round;
    if (at->where == AT_DRAFT) { /* cut after the stop draft: accepted = proposed = length = its index + 1 */
        const int k = at->draft + 1;
        CHECK(d.accepted[r] == k && d.proposed[r] == k && d.accept_len[r] == k,
              "%s: stop round (accepted %d, proposed %d, length %d), expected %d for all three", what, d.accepted[r],
              d.proposed[r], d.accept_len[r], k);
    } else { /* the bonus: the round as it ran */
        CHECK(d.accepted[r] == sp->accepted[r] && d.proposed[r] == sp->proposed[r] &&
                  d.accept_len[r] == sp->accepted[r] + 1,
              "%s: stop round (accepted %d, proposed %d, length %d), expected (%d, %d, %d)", what, d.accepted[r],
              d.proposed[r], d.accept_len[r], sp->accepted[r], sp->proposed[r], sp->accepted[r] + 1);
    }
out:
    ds_gen_result_free(&a);
    ds_gen_result_free(&d);
}

/* Finds, over the dev prompts, a first occurrence in each place and runs the
 * three cases (a stop draft with accepted drafts after it, so the cut drops
 * some; the bonus; the first token), the first two in a round after two others. */
static void test_stop_positions(void) {
    if (!target || !drafter) return;
    bool done_draft = false, done_bonus = false, done_first = false;
    for (int i = 0; i < n_prompts && !(done_draft && done_bonus && done_first); i++) {
        const pico_prompt *p = &prompts[i];
        ds_gen_result ar = {0}, sp = {0};
        ds_error *e = run(p, -1, false, &ar);
        if (!e) e = run(p, -1, true, &sp);
        if (e) {
            CHECK(0, "prompt %d: %s", i, ds_error_message(e));
            ds_error_free(e);
            ds_gen_result_free(&ar);
            ds_gen_result_free(&sp);
            return;
        }
        CHECK(!ar.stopped && ar.n_tokens == NEW_TOKENS, "prompt %d: %d tokens without stop tokens", i, ar.n_tokens);
        CHECK(sp.n_tokens == ar.n_tokens && !memcmp(sp.tokens, ar.tokens, (size_t)ar.n_tokens * sizeof *ar.tokens),
              "prompt %d: drafted greedy differs from plain greedy", i);
        position pos[NEW_TOKENS];
        locate(&sp, pos);
        if (!done_first) {
            check_case(p, &ar, &sp, 0, &pos[0], "stop at the first token");
            done_first = true;
        }
        for (int q = 1; q < sp.n_tokens && !(done_draft && done_bonus); q++) {
            /* from round 2 on, so that the rounds before the stop round are compared too */
            if (!first_occurrence(&ar, q) || pos[q].round < 2) continue;
            if (!done_draft && pos[q].where == AT_DRAFT && pos[q].draft + 1 < sp.accepted[pos[q].round]) {
                check_case(p, &ar, &sp, q, &pos[q], "stop among the accepted drafts");
                done_draft = true;
            } else if (!done_bonus && pos[q].where == AT_BONUS) {
                check_case(p, &ar, &sp, q, &pos[q], "stop at the bonus");
                done_bonus = true;
            }
        }
        ds_gen_result_free(&ar);
        ds_gen_result_free(&sp);
    }
    CHECK(done_draft && done_bonus && done_first, "cases found: draft %d, bonus %d, first %d", done_draft, done_bonus,
          done_first);
}

/* ignore_stop runs past a stop token: the same tokens as with no stop token. */
static void test_ignore_stop(void) {
    if (!target || !drafter) return;
    ds_gen_result plain = {0}, ignoring = {0};
    ds_error *e = run(&prompts[0], -1, true, &plain);
    if (!e) {
        set_stop(plain.tokens[0]);
        ds_gen_params gp = {.max_new = NEW_TOKENS, .ignore_stop = true};
        e = ds_generate(target, drafter, prompts[0].ids, prompts[0].n_ids, &gp, NULL, NULL, &ignoring);
        set_stop(-1);
    }
    if (e) {
        CHECK(0, "%s", ds_error_message(e));
        ds_error_free(e);
    } else {
        CHECK(!ignoring.stopped && ignoring.n_tokens == plain.n_tokens &&
                  !memcmp(ignoring.tokens, plain.tokens, (size_t)plain.n_tokens * sizeof *plain.tokens) &&
                  ignoring.rounds == plain.rounds,
              "ignore_stop: %d tokens (stopped %d), %d rounds; without stop tokens %d, %d", ignoring.n_tokens,
              ignoring.stopped, ignoring.rounds, plain.n_tokens, plain.rounds);
    }
    ds_gen_result_free(&plain);
    ds_gen_result_free(&ignoring);
}

static void teardown(void) {
    ds_drafter_free(drafter);
    ds_target_free(target);
    if (be) be->ops->destroy(be);
}

RUN_TESTS("stop", setup, test_stop_positions, test_ignore_stop, teardown)
