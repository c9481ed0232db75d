/* Acceptance metrics (speculate/metrics.c, SPEC §5 "Metrics") against values
 * computed by hand on hand-made results, and the pooled summary line that
 * `dspark generate --json --prompt-file` ends with, recomputed from the
 * per-prompt lines the same run printed. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "speculate/metrics.h"
#include "testlib.h"

/* A result with the given rounds; the arrays are the caller's (not freed). */
static ds_gen_result make_result(int n_tokens, int rounds, int *accepted, int *proposed, int *accept_len,
                                 double total_s, double draft_s, double verify_s, double prefill_s) {
    ds_gen_result r = {.n_tokens = n_tokens, .rounds = rounds, .accepted = accepted, .proposed = proposed,
                       .accept_len = accept_len, .total_s = total_s, .draft_s = draft_s, .verify_s = verify_s,
                       .prefill_s = prefill_s};
    return r;
}

static void test_empty_metrics(void) {
    ds_metrics m = {0};
    CHECK(ds_metrics_tau(&m) == 0, "tau of nothing %g", ds_metrics_tau(&m));
    CHECK(ds_metrics_verify_rate(&m) == 0, "verify rate of nothing %g", ds_metrics_verify_rate(&m));
    CHECK(ds_metrics_accept_rate_at(&m, 0) == -1, "accept rate of nothing %g", ds_metrics_accept_rate_at(&m, 0));
}

/* Three results pooled: two with rounds (the second ends in a stop round,
 * where the engine records accepted = proposed = length = the drafts up to
 * and including the stop token), one stopped at its first token (0 rounds).
 * Times are binary fractions so that their sums are exact. */
static void test_pooled_by_hand(void) {
    int acc_a[] = {2, 0, 4}, prop_a[] = {4, 3, 4}, len_a[] = {3, 1, 5};
    int acc_b[] = {1, 3}, prop_b[] = {2, 3}, len_b[] = {2, 3};
    ds_gen_result a = make_result(9, 3, acc_a, prop_a, len_a, 1.5, 0.25, 0.5, 0.125);
    ds_gen_result b = make_result(6, 2, acc_b, prop_b, len_b, 0.75, 0.125, 0.25, 0.0625);
    ds_gen_result empty = make_result(1, 0, NULL, NULL, NULL, 0.0625, 0, 0, 0.03125);
    ds_metrics m = {0};
    ds_metrics_add(&m, &a);
    ds_metrics_add(&m, &empty);
    ds_metrics_add(&m, &b);
    CHECK(m.samples == 3 && m.rounds == 5 && m.tokens == 16, "samples %d rounds %d tokens %ld", m.samples, m.rounds,
          m.tokens);
    CHECK(m.accept_len_sum == 14 && m.proposal_sum == 16 && m.accepted_sum == 10, "sums %ld %ld %ld",
          m.accept_len_sum, m.proposal_sum, m.accepted_sum);
    CHECK(m.total_s == 2.3125 && m.draft_s == 0.375 && m.verify_s == 0.75 && m.prefill_s == 0.21875,
          "times %g %g %g %g", m.total_s, m.draft_s, m.verify_s, m.prefill_s);
    /* tau = (3+1+5+2+3) / 5 rounds; verify rate = 14 / (16 proposed + 5 rounds) */
    CHECK(ds_metrics_tau(&m) == 14.0 / 5, "tau %.17g", ds_metrics_tau(&m));
    CHECK(ds_metrics_verify_rate(&m) == 14.0 / 21, "verify rate %.17g", ds_metrics_verify_rate(&m));
    /* proposed {4,3,4,2,3}, accepted {2,0,4,1,3}: rounds accepting more than k
     * over rounds proposing more than k */
    const double want[] = {4.0 / 5, 3.0 / 5, 2.0 / 4, 1.0 / 2, -1, -1};
    for (int k = 0; k < 6; k++)
        CHECK(ds_metrics_accept_rate_at(&m, k) == want[k], "accept rate at %d: %.17g, expected %.17g", k,
              ds_metrics_accept_rate_at(&m, k), want[k]);
    const long want_props[] = {5, 5, 4, 2, 0}, want_accs[] = {4, 3, 2, 1, 0};
    for (int k = 0; k < 5; k++)
        CHECK(m.proposals_at[k] == want_props[k] && m.accepted_at[k] == want_accs[k], "at %d: %ld / %ld", k,
              m.accepted_at[k], m.proposals_at[k]);
}

/* Only a result without rounds: counted as a sample, no rates. */
static void test_only_empty_result(void) {
    ds_gen_result empty = make_result(1, 0, NULL, NULL, NULL, 0.5, 0, 0, 0.25);
    ds_metrics m = {0};
    ds_metrics_add(&m, &empty);
    CHECK(m.samples == 1 && m.tokens == 1 && m.rounds == 0, "samples %d tokens %ld rounds %d", m.samples, m.tokens,
          m.rounds);
    CHECK(ds_metrics_tau(&m) == 0 && ds_metrics_verify_rate(&m) == 0, "tau %g verify %g", ds_metrics_tau(&m),
          ds_metrics_verify_rate(&m));
    CHECK(ds_metrics_accept_rate_at(&m, 0) == -1, "%g", ds_metrics_accept_rate_at(&m, 0));
}

/* A full proposal of DS_MAX_GAMMA drafts, all accepted: the last position
 * has a rate; positions past it (and negative ones) have none, without
 * reading past the per-position arrays. */
static void test_positions_at_the_edges(void) {
    int acc[] = {DS_MAX_GAMMA, 0}, prop[] = {DS_MAX_GAMMA, 1}, len[] = {DS_MAX_GAMMA + 1, 1};
    ds_gen_result r = make_result(DS_MAX_GAMMA + 2, 2, acc, prop, len, 1, 0.5, 0.5, 0);
    ds_metrics m = {0};
    ds_metrics_add(&m, &r);
    CHECK(ds_metrics_tau(&m) == (DS_MAX_GAMMA + 2) / 2.0, "tau %g", ds_metrics_tau(&m));
    CHECK(ds_metrics_verify_rate(&m) == (DS_MAX_GAMMA + 2) / (double)(DS_MAX_GAMMA + 1 + 2), "verify %g",
          ds_metrics_verify_rate(&m));
    CHECK(ds_metrics_accept_rate_at(&m, 0) == 0.5, "at 0: %g", ds_metrics_accept_rate_at(&m, 0));
    CHECK(ds_metrics_accept_rate_at(&m, 1) == 1, "at 1: %g", ds_metrics_accept_rate_at(&m, 1));
    CHECK(ds_metrics_accept_rate_at(&m, DS_MAX_GAMMA - 1) == 1, "at %d: %g", DS_MAX_GAMMA - 1,
          ds_metrics_accept_rate_at(&m, DS_MAX_GAMMA - 1));
    CHECK(ds_metrics_accept_rate_at(&m, DS_MAX_GAMMA) == -1, "at %d: %g", DS_MAX_GAMMA,
          ds_metrics_accept_rate_at(&m, DS_MAX_GAMMA));
    CHECK(ds_metrics_accept_rate_at(&m, 1000) == -1, "at 1000: %g", ds_metrics_accept_rate_at(&m, 1000));
    CHECK(ds_metrics_accept_rate_at(&m, -1) == -1, "at -1: %g", ds_metrics_accept_rate_at(&m, -1));
}

/* ---- the CLI's summary ------------------------------------------------- */

#define NUM(o, k) cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k))

static bool close_to(double a, double b) { return fabs(a - b) <= 1e-9 * (fabs(b) > 1 ? fabs(b) : 1); }

/* Runs `dspark generate --json --prompt-file F ARGS` and returns its stdout
 * lines parsed (at most max); -1 and a failure if it did not exit 0. */
static int run_generate(const char *prompt_file, const char *args, cJSON **lines, int max) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' generate --json --threads 2 --prompt-file '%s' %s", DS_CLI, prompt_file, args);
    FILE *f = popen(cmd, "r");
    if (!f) {
        CHECK(0, "cannot run %s", cmd);
        return -1;
    }
    int n = 0;
    static char line[1 << 16];
    while (fgets(line, sizeof line, f)) {
        if (n >= max) {
            CHECK(0, "more than %d lines from %s", max, cmd);
            break;
        }
        lines[n] = cJSON_Parse(line);
        CHECK(cJSON_IsObject(lines[n]), "not a JSON object from %s: %s", cmd, line);
        if (!lines[n]) break;
        n++;
    }
    int st = pclose(f);
    CHECK(st == 0, "%s exited with status %d", cmd, st);
    return st == 0 ? n : -1;
}

/* Three id prompts from the dev set, short outputs; the third gives the
 * target's stop token 0 a chance (any mix is fine: every number is checked
 * against the per-prompt lines, whatever they are). */
static char *write_prompt_file(char *dir) {
    static const char *lines[] = {
        "{\"id\": \"a\", \"input_ids\": [2811, 385, 1969, 1866, 379, 263, 4770, 3484, 84, 273, 263, 1194]}\n",
        "{\"id\": \"b\", \"input_ids\": [13, 642, 295, 295, 287, 200, 2125, 1031, 370]}\n",
        "\n", /* blank lines are skipped */
        "{\"id\": \"c\", \"prompt\": \"It is a truth universally acknowledged\"}\n",
    };
    static char path[512];
    snprintf(path, sizeof path, "%s/prompts.jsonl", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        CHECK(0, "cannot write %s", path);
        return NULL;
    }
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) fputs(lines[i], f);
    fclose(f);
    return path;
}

/* Sum over a JSON int array. */
static long sum_array(const cJSON *a) {
    long s = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) s += (long)cJSON_GetNumberValue(it);
    return s;
}

/* A model directory that is the bundled pico target (links to its files)
 * with the stop tokens {0, 263}: 263 is " the", which every dev-style output
 * contains, so prompts end on a stop token (inside a round's drafts or as its
 * bonus) and the summary pools stop rounds. */
static bool make_stop_model(const char *dir, char *model, size_t cap) {
    snprintf(model, cap, "%s/pico-stop-the", dir);
    if (mkdir(model, 0700)) return false;
    static const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    char from[1024], to[1024];
    for (int i = 0; i < 4; i++) {
        snprintf(from, sizeof from, "%s/pico-qwen3/%s", DS_MODELS, files[i]);
        snprintf(to, sizeof to, "%s/%s", model, files[i]);
        if (symlink(from, to)) return false;
    }
    snprintf(to, sizeof to, "%s/generation_config.json", model);
    FILE *f = fopen(to, "w");
    if (!f) return false;
    fputs("{\"eos_token_id\": [0, 263]}\n", f);
    return fclose(f) == 0;
}

static void remove_stop_model(const char *model) {
    static const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                  "generation_config.json"};
    char path[1024];
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/%s", model, files[i]);
        remove(path);
    }
    rmdir(model);
}

static void check_summary(bool drafted, bool stop_model) {
    char dir[] = "/tmp/ds_test_metrics_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    char *pf = write_prompt_file(dir), model[512], args[1024];
    cJSON *lines[8] = {0};
    int n = -1;
    if (stop_model && !make_stop_model(dir, model, sizeof model)) CHECK(0, "cannot make %s", model);
    else if (pf) {
        if (stop_model) snprintf(args, sizeof args, "-n 40 -m '%s' -d '%s/pico-qwen3-dspark'", model, DS_MODELS);
        else snprintf(args, sizeof args, "-n 40%s", drafted ? "" : " --no-draft");
        n = run_generate(pf, args, lines, 8);
    }
    if (stop_model) remove_stop_model(model);
    if (pf) remove(pf);
    rmdir(dir);
    if (n < 0) goto out;
    CHECK(n == 4, "%d lines: 3 prompts and the summary expected", n);
    if (n != 4) goto out;
    const cJSON *sum = lines[3];
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(sum, "summary"));
    CHECK(kind && !strcmp(kind, drafted ? "speculative" : "autoregressive"), "summary kind %s", kind ? kind : "(none)");
    CHECK(NUM(sum, "prompts") == 3, "prompts %g", NUM(sum, "prompts"));

    double tokens = 0, time_s = 0, rounds = 0, len_sum = 0, proposed = 0, draft_s = 0, verify_s = 0;
    long props_at[DS_MAX_GAMMA] = {0}, accs_at[DS_MAX_GAMMA] = {0};
    int n_stopped = 0;
    for (int i = 0; i < 3; i++) {
        const cJSON *p = lines[i];
        const cJSON *toks = cJSON_GetObjectItemCaseSensitive(p, "tokens");
        const int nt = cJSON_GetArraySize(toks);
        CHECK(nt >= 1 && nt <= 40 && NUM(p, "prompt_tokens") >= 1, "prompt %d: %d tokens", i, nt);
        tokens += nt;
        time_s += NUM(p, "time_s");
        if (!drafted) {
            CHECK(!cJSON_GetObjectItemCaseSensitive(p, "rounds"), "prompt %d: rounds without a drafter", i);
            continue;
        }
        const cJSON *acc = cJSON_GetObjectItemCaseSensitive(p, "accepted"),
                    *prop = cJSON_GetObjectItemCaseSensitive(p, "proposed");
        const int r = (int)NUM(p, "rounds");
        CHECK(cJSON_GetArraySize(acc) == r && cJSON_GetArraySize(prop) == r, "prompt %d: %d rounds, arrays %d %d", i,
              r, cJSON_GetArraySize(acc), cJSON_GetArraySize(prop));
        /* A round's length is accepted + 1, except a stop round whose stop token was a draft (accepted only). */
        const double plen = NUM(p, "acceptance_length") * r, full = (double)(sum_array(acc) + r);
        const bool stopped = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "stopped"));
        n_stopped += stopped;
        CHECK(r == 0 || close_to(plen, full) || (stopped && close_to(plen, full - 1)),
              "prompt %d: tau %g over %d rounds, accepted sum %ld", i, NUM(p, "acceptance_length"), r,
              sum_array(acc));
        /* The prefill's token, then each round's length in tokens; the last round may overshoot -n 40 (trimmed). */
        const int committed = 1 + (int)lround(plen);
        CHECK(nt == (committed < 40 ? committed : 40), "prompt %d: %d tokens from %d rounds of length %g", i,
              nt, r, plen);
        rounds += r;
        len_sum += plen;
        proposed += (double)sum_array(prop);
        draft_s += NUM(p, "draft_time_s");
        verify_s += NUM(p, "verify_time_s");
        for (int j = 0; j < r; j++) {
            const int a = (int)cJSON_GetNumberValue(cJSON_GetArrayItem(acc, j)),
                      q = (int)cJSON_GetNumberValue(cJSON_GetArrayItem(prop, j));
            CHECK(a >= 0 && a <= q && q <= DS_MAX_GAMMA, "prompt %d round %d: accepted %d of %d", i, j, a, q);
            for (int k = 0; k < DS_MAX_GAMMA; k++) {
                props_at[k] += q > k;
                accs_at[k] += a > k;
            }
        }
    }
    CHECK(NUM(sum, "tokens") == tokens, "summary tokens %g, per prompt %g", NUM(sum, "tokens"), tokens);
    CHECK(close_to(NUM(sum, "time_s"), time_s), "summary time %g, per prompt %g", NUM(sum, "time_s"), time_s);
    CHECK(close_to(NUM(sum, "tokens_per_s"), tokens / time_s), "summary tokens/s %g, expected %g",
          NUM(sum, "tokens_per_s"), tokens / time_s);
    if (!drafted) {
        CHECK(!cJSON_GetObjectItemCaseSensitive(sum, "rounds") &&
                  !cJSON_GetObjectItemCaseSensitive(sum, "acceptance_length"),
              "autoregressive summary with drafting fields");
        goto out;
    }
    CHECK(rounds > 0, "no rounds at all");
    CHECK(!stop_model || n_stopped > 0, "no prompt ended on the stop token 263 (\" the\")");
    CHECK(NUM(sum, "rounds") == rounds, "summary rounds %g, per prompt %g", NUM(sum, "rounds"), rounds);
    CHECK(close_to(NUM(sum, "acceptance_length"), len_sum / rounds), "summary tau %.17g, pooled %.17g",
          NUM(sum, "acceptance_length"), len_sum / rounds);
    CHECK(close_to(NUM(sum, "verify_rate"), len_sum / (proposed + rounds)), "summary verify rate %.17g, pooled %.17g",
          NUM(sum, "verify_rate"), len_sum / (proposed + rounds));
    CHECK(close_to(NUM(sum, "draft_tokens_per_proposal"), proposed / rounds), "summary proposal %.17g, pooled %.17g",
          NUM(sum, "draft_tokens_per_proposal"), proposed / rounds);
    CHECK(close_to(NUM(sum, "draft_time_s"), draft_s) && close_to(NUM(sum, "verify_time_s"), verify_s),
          "summary draft %g verify %g, per prompt %g %g", NUM(sum, "draft_time_s"), NUM(sum, "verify_time_s"),
          draft_s, verify_s);
    /* Per position: pooled counts, not an average of the prompts' rates. */
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(sum, "per_position_acceptance");
    int n_pos = 0;
    while (n_pos < DS_MAX_GAMMA && props_at[n_pos]) n_pos++;
    CHECK(cJSON_GetArraySize(pp) == n_pos, "%d positions in the summary, %d proposed", cJSON_GetArraySize(pp), n_pos);
    for (int k = 0; k < n_pos && k < cJSON_GetArraySize(pp); k++) {
        const double got = cJSON_GetNumberValue(cJSON_GetArrayItem(pp, k)), want = (double)accs_at[k] / props_at[k];
        CHECK(close_to(got, want), "position %d: %.17g, pooled %ld / %ld", k, got, accs_at[k], props_at[k]);
    }
out:
    for (int i = 0; i < 8; i++) cJSON_Delete(lines[i]);
}

static void test_cli_summary_drafted(void) { check_summary(true, false); }
static void test_cli_summary_drafted_stops(void) { check_summary(true, true); }
static void test_cli_summary_autoregressive(void) { check_summary(false, false); }

RUN_TESTS("metrics", test_empty_metrics, test_pooled_by_hand, test_only_empty_result, test_positions_at_the_edges,
          test_cli_summary_drafted, test_cli_summary_drafted_stops, test_cli_summary_autoregressive)
