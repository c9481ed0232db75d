/* The public API end to end on the bundled pico pair: text in, tokens out,
 * drafted greedy == plain greedy, streaming callback sees every token, a
 * callback can stop the generation, per-round metrics and their pooled
 * summary, chat prompts through a chat template, an engine without a
 * tokenizer (ids in, ids out) or with another's, and bad options are errors
 * that name the field. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "draft/drafter.h" /* test_kv_mem: the caches a model really allocates, counted */
#include "testlib.h"

static ds_engine *eng;

typedef struct {
    int seen, stop_after;
} counter;

static bool count(void *user, int32_t tok) {
    counter *c = user;
    c->seen++;
    return c->stop_after == 0 || c->seen < c->stop_after;
}

static void setup(void) {
    ds_engine_opts o = {.model_dir = DS_MODELS "/pico-qwen3", .drafter_dir = DS_MODELS "/pico-qwen3-dspark"};
    CHECK_OK(ds_engine_open(&o, &eng));
}

static void test_drafted_equals_plain(void) {
    const char *text = "It is a truth universally acknowledged, that a single man";
    int32_t *ids;
    size_t n;
    CHECK_OK(ds_tokenizer_encode(ds_engine_tokenizer(eng), text, strlen(text), false, &ids, &n));
    ds_generate_opts g = {.max_new = 48};
    ds_output a, b;
    counter c = {0};
    CHECK_OK(ds_engine_generate(eng, ids, n, &g, count, &c, &a));
    g.no_draft = true;
    CHECK_OK(ds_engine_generate(eng, ids, n, &g, NULL, NULL, &b));
    CHECK(a.n_tokens == b.n_tokens && !memcmp(a.tokens, b.tokens, (size_t)a.n_tokens * sizeof *a.tokens),
          "drafted and plain greedy outputs differ");
    CHECK(c.seen == a.n_tokens, "callback saw %d of %d tokens", c.seen, a.n_tokens);
    CHECK(a.rounds > 0 && a.acceptance_length > 1.0, "rounds %d tau %.2f", a.rounds, a.acceptance_length);
    CHECK(b.rounds == 0, "plain decoding reported %d rounds", b.rounds);
    char *out;
    size_t len;
    CHECK_OK(ds_tokenizer_decode(ds_engine_tokenizer(eng), a.tokens, (size_t)a.n_tokens, true, &out, &len));
    printf("  \"%s\" -> \"%s\" (tau %.2f)\n", text, out, a.acceptance_length);
    free(out);
    ds_output_free(&a);
    ds_output_free(&b);
    free(ids);
}

static void test_callback_stops(void) {
    int32_t ids[] = {2811, 385, 1969};
    ds_generate_opts g = {.max_new = 40};
    counter c = {.stop_after = 5};
    ds_output o;
    CHECK_OK(ds_engine_generate(eng, ids, 3, &g, count, &c, &o));
    CHECK(o.n_tokens == 5, "stopped after %d tokens, want 5", o.n_tokens);
    ds_output_free(&o);
}

/* Per round: accepted <= proposed <= block size, accept_len = accepted (+ 1
 * but in a stop round), tau their mean; the pooled stats of two outputs are
 * the stats of their rounds together. */
static void test_round_metrics(void) {
    ds_engine_info info;
    ds_engine_get_info(eng, &info);
    CHECK(info.has_drafter && info.has_tokenizer && info.block_size == 7 && info.context == 512 &&
              info.vocab_size > 0,
          "info: drafter %d tokenizer %d block %d context %d vocab %d", info.has_drafter, info.has_tokenizer,
          info.block_size, info.context, info.vocab_size);
    int32_t p1[] = {2811, 385, 1969}, p2[] = {1866, 379, 263, 4770};
    ds_generate_opts g = {.max_new = 40, .gamma = 4};
    ds_output a, b;
    CHECK_OK(ds_engine_generate(eng, p1, 3, &g, NULL, NULL, &a));
    CHECK_OK(ds_engine_generate(eng, p2, 4, &g, NULL, NULL, &b));
    const ds_output *outs[] = {&a, &b};
    long rounds = 0, len_sum = 0, proposed_sum = 0, tokens = 0;
    for (int o = 0; o < 2; o++) {
        const ds_output *r = outs[o];
        CHECK(r->rounds > 0 && r->accepted && r->proposed && r->accept_len, "output %d: %d rounds", o, r->rounds);
        CHECK(r->finish_reason == DS_FINISH_LENGTH && r->n_tokens == 40 && !r->stopped, "output %d: %s, %d tokens", o,
              ds_finish_reason_name(r->finish_reason), r->n_tokens);
        long sum = 0;
        for (int i = 0; i < r->rounds; i++) {
            CHECK(r->accepted[i] >= 0 && r->accepted[i] <= r->proposed[i] && r->proposed[i] <= 4,
                  "output %d round %d: accepted %d proposed %d", o, i, r->accepted[i], r->proposed[i]);
            CHECK(r->accept_len[i] == r->accepted[i] + 1, "output %d round %d: accept_len %d accepted %d", o, i,
                  r->accept_len[i], r->accepted[i]);
            sum += r->accept_len[i];
            proposed_sum += r->proposed[i];
        }
        /* The prefill's token, then every round's; the last round's may run past max_new. */
        CHECK(1 + sum >= r->n_tokens && 1 + sum <= r->n_tokens + 4, "output %d: %d tokens from rounds committing %ld",
              o, r->n_tokens, sum);
        CHECK(fabs(r->acceptance_length - (double)sum / r->rounds) < 1e-12, "output %d: tau %g, rounds say %g", o,
              r->acceptance_length, (double)sum / r->rounds);
        CHECK(r->draft_s > 0 && r->verify_s > 0 && r->total_s >= r->prefill_s + r->draft_s + r->verify_s - 1e-3,
              "output %d: times %g %g %g %g", o, r->prefill_s, r->draft_s, r->verify_s, r->total_s);
        rounds += r->rounds;
        len_sum += sum;
        tokens += r->n_tokens;
    }
    ds_stats *st;
    CHECK_OK(ds_stats_new(&st));
    ds_stats_add(st, &a);
    ds_stats_add(st, &b);
    ds_stats_summary m;
    ds_stats_summarize(st, &m);
    CHECK(m.outputs == 2 && m.tokens == tokens && m.rounds == rounds, "pooled: %d outputs %ld tokens %d rounds",
          m.outputs, m.tokens, m.rounds);
    CHECK(fabs(m.acceptance_length - (double)len_sum / rounds) < 1e-12, "pooled tau %g", m.acceptance_length);
    CHECK(fabs(m.verify_rate - (double)len_sum / (double)(proposed_sum + rounds)) < 1e-12, "verify rate %g",
          m.verify_rate);
    CHECK(fabs(m.proposed_per_round - (double)proposed_sum / rounds) < 1e-12, "proposed a round %g",
          m.proposed_per_round);
    CHECK(fabs(m.total_s - (a.total_s + b.total_s)) < 1e-9, "pooled time %g", m.total_s);
    /* gamma 4: positions 0..3 proposed in every round, none past them. */
    for (int k = 0; k < 4; k++) {
        long acc = 0;
        for (int o = 0; o < 2; o++)
            for (int i = 0; i < outs[o]->rounds; i++) acc += outs[o]->accepted[i] > k;
        double rate = ds_stats_accept_rate_at(st, k);
        CHECK(fabs(rate - (double)acc / rounds) < 1e-12, "position %d: rate %g, want %g", k, rate,
              (double)acc / rounds);
    }
    CHECK(ds_stats_accept_rate_at(st, 4) == -1 && ds_stats_accept_rate_at(st, -1) == -1 &&
              ds_stats_accept_rate_at(st, 1 << 20) == -1,
          "a rate where nothing was proposed");
    ds_stats_free(st);
    /* Plain decoding has no rounds: empty per-round arrays, zero ratios. */
    g.no_draft = true;
    ds_output c;
    CHECK_OK(ds_engine_generate(eng, p1, 3, &g, NULL, NULL, &c));
    CHECK(c.rounds == 0 && !c.accepted && !c.proposed && !c.accept_len && c.acceptance_length == 0,
          "plain decoding: %d rounds", c.rounds);
    CHECK_OK(ds_stats_new(&st));
    ds_stats_add(st, &c);
    ds_stats_summarize(st, &m);
    CHECK(m.outputs == 1 && m.tokens == 40 && m.rounds == 0 && m.acceptance_length == 0 && m.verify_rate == 0 &&
              ds_stats_accept_rate_at(st, 0) == -1,
          "plain summary: %d rounds tau %g", m.rounds, m.acceptance_length);
    ds_stats_free(st);
    ds_output_free(&a);
    ds_output_free(&b);
    ds_output_free(&c);
    CHECK(!a.tokens && !a.accepted && a.rounds == 0, "ds_output_free leaves the output empty");
}

/* Why each generation ended, and the names the CLI's JSON prints. */
static void test_finish_reasons(void) {
    int32_t ids[] = {2811, 385, 1969};
    ds_generate_opts g = {.max_new = 6, .ignore_eos = true};
    counter c = {.stop_after = 2};
    ds_output o;
    CHECK_OK(ds_engine_generate(eng, ids, 3, &g, count, &c, &o));
    CHECK(o.finish_reason == DS_FINISH_CALLER && !o.stopped, "callback stop: %s",
          ds_finish_reason_name(o.finish_reason));
    ds_output_free(&o);
    g.max_new = 2000; /* past the context of 512 */
    CHECK_OK(ds_engine_generate(eng, ids, 3, &g, NULL, NULL, &o));
    CHECK(o.finish_reason == DS_FINISH_CONTEXT && o.n_tokens == 512 - 3 + 1, "context: %s after %d tokens",
          ds_finish_reason_name(o.finish_reason), o.n_tokens);
    ds_output_free(&o);
    CHECK(!strcmp(ds_finish_reason_name(DS_FINISH_LENGTH), "length") &&
              !strcmp(ds_finish_reason_name(DS_FINISH_STOP), "stop") &&
              !strcmp(ds_finish_reason_name(DS_FINISH_CONTEXT), "context") &&
              !strcmp(ds_finish_reason_name(DS_FINISH_CALLER), "caller"),
          "finish reason names");
}

/* A scratch model directory: pico's files linked, plus a Qwen3 chat template. */
static char chat_dir[64];
static const char *const pico_files[] = {"config.json", "generation_config.json", "model.safetensors",
                                         "tokenizer.json"};

static void make_chat_model(void) {
    snprintf(chat_dir, sizeof chat_dir, "/tmp/ds_engine_api_XXXXXX");
    CHECK(mkdtemp(chat_dir) != NULL, "mkdtemp %s", chat_dir);
    char from[512], to[512];
    for (size_t i = 0; i < sizeof pico_files / sizeof *pico_files; i++) {
        snprintf(from, sizeof from, "%s/pico-qwen3/%s", DS_MODELS, pico_files[i]);
        snprintf(to, sizeof to, "%s/%s", chat_dir, pico_files[i]);
        CHECK(symlink(from, to) == 0, "symlink %s", to);
    }
    snprintf(to, sizeof to, "%s/chat_template.jinja", chat_dir);
    FILE *f = fopen(to, "w");
    CHECK(f != NULL, "cannot write %s", to);
    if (f) {
        fputs("{{ '<|im_start|>assistant\\n' }}{% if enable_thinking is false %}"
              "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}",
              f);
        fclose(f);
    }
}

static void remove_chat_model(void) {
    char path[512];
    for (size_t i = 0; i < sizeof pico_files / sizeof *pico_files; i++) {
        snprintf(path, sizeof path, "%s/%s", chat_dir, pico_files[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/chat_template.jinja", chat_dir);
    unlink(path);
    rmdir(chat_dir);
}

/* Messages rendered by the model's chat template, encoded without added
 * special tokens; a model without a template, and bad messages, are errors. */
static void test_chat(void) {
    ds_chat_message hi[] = {{"system", "Be brief."}, {"user", "Hello there"}};
    int32_t *ids;
    size_t n;
    CHECK_ERR(ds_engine_chat_encode(eng, hi, 2, &ids, &n), "pico-qwen3 (model_type \"qwen3\"): no chat template");
    make_chat_model();
    ds_engine *ce;
    ds_engine_opts o = {.model_dir = chat_dir, .drafter_dir = DS_MODELS "/pico-qwen3-dspark", .threads = 1};
    ds_error *err = ds_engine_open(&o, &ce);
    remove_chat_model(); /* the engine has read what it needs, the template but for its first use */
    CHECK_OK(err);
    char *text;
    CHECK_ERR(ds_engine_chat_render(ce, hi, 2, &text), "no chat template"); /* found on first use: gone now */
    ds_engine_free(ce);
    make_chat_model();
    err = ds_engine_open(&o, &ce);
    CHECK_OK(err);
    err = ds_engine_chat_render(ce, hi, 2, &text);
    remove_chat_model();
    CHECK_OK(err);
    const char *want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n"
                       "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    CHECK(!strcmp(text, want), "rendered:\n%s", text);
    int32_t *want_ids;
    size_t want_n;
    CHECK_OK(ds_tokenizer_encode(ds_engine_tokenizer(ce), text, strlen(text), false, &want_ids, &want_n));
    free(text);
    CHECK_OK(ds_engine_chat_encode(ce, hi, 2, &ids, &n));
    CHECK(n == want_n && !memcmp(ids, want_ids, n * sizeof *ids), "chat ids: %zu, the text's %zu", n, want_n);
    ds_generate_opts g = {.max_new = 8};
    ds_output out;
    CHECK_OK(ds_engine_generate(ce, ids, n, &g, NULL, NULL, &out));
    CHECK(out.n_tokens == 8 && out.rounds > 0, "chat generation: %d tokens, %d rounds", out.n_tokens, out.rounds);
    ds_output_free(&out);
    free(ids);
    free(want_ids);
    ds_chat_message bad[] = {{"robot", "beep"}};
    CHECK_ERR(ds_engine_chat_encode(ce, bad, 1, &ids, &n), "chat message 0: role \"robot\" is not system, user or");
    CHECK_ERR(ds_engine_chat_encode(ce, hi, 0, &ids, &n), "the conversation has no messages");
    ds_engine_free(ce);
}

/* The qwen3-tiny fixture has no tokenizer.json: the engine opens, takes ids
 * and gives the reference's ids; text and chat prompts need a tokenizer,
 * which opts.tokenizer may give (a file or a directory holding one). */
static void test_ids_without_tokenizer(void) {
    static const int32_t prompt[] = {401, 486, 458, 307, 274, 357, 222, 314, 270, 349, 135, 218,
                                     25,  272, 295, 92,  17,  261, 169, 180, 244, 400, 145, 246};
    static const int32_t want[] = {291, 17, 511, 276, 198, 224, 454, 40};
    const char *fix = DS_TESTDATA "/fixtures/qwen3-tiny";
    char target[512], drafter[512];
    snprintf(target, sizeof target, "%s/target", fix);
    snprintf(drafter, sizeof drafter, "%s/drafter", fix);
    ds_engine *te;
    ds_engine_opts o = {.model_dir = target, .drafter_dir = drafter, .threads = 1};
    CHECK_OK(ds_engine_open(&o, &te));
    ds_engine_info info;
    ds_engine_get_info(te, &info);
    CHECK(!info.has_tokenizer && !ds_engine_tokenizer(te) && info.has_drafter && info.context == 1024,
          "tiny: tokenizer %d drafter %d context %d", info.has_tokenizer, info.has_drafter, info.context);
    for (int draft = 0; draft < 2; draft++) {
        ds_generate_opts g = {.max_new = 8, .no_draft = !draft};
        ds_output out;
        CHECK_OK(ds_engine_generate(te, prompt, 24, &g, NULL, NULL, &out));
        CHECK(out.n_tokens == 8 && !memcmp(out.tokens, want, sizeof want), "tiny %s: not the reference's ids",
              draft ? "drafted" : "plain");
        ds_output_free(&out);
    }
    ds_chat_message hi = {"user", "hi"};
    int32_t *ids;
    size_t n;
    CHECK_ERR(ds_engine_chat_encode(te, &hi, 1, &ids, &n), "a chat prompt needs a tokenizer, and");
    CHECK_ERR(ds_engine_chat_encode(te, &hi, 1, &ids, &n), "ds_engine_opts.tokenizer");
    ds_engine_free(te);
    char file[512];
    snprintf(file, sizeof file, "%s/pico-qwen3/tokenizer.json", DS_MODELS);
    const char *given[] = {DS_MODELS "/pico-qwen3", file};
    for (int i = 0; i < 2; i++) {
        o.tokenizer = given[i];
        CHECK_OK(ds_engine_open(&o, &te));
        ds_engine_get_info(te, &info);
        CHECK(info.has_tokenizer && ds_engine_tokenizer(te), "tokenizer %s not loaded", given[i]);
        ds_engine_free(te);
    }
    o.tokenizer = DS_MODELS "/no-such-tokenizer.json";
    CHECK_ERR(ds_engine_open(&o, &te), "no-such-tokenizer.json");
}

/* Threads are a choice of speed, not of result; CUDA device numbers are checked. */
static void test_backend_choice(void) {
    int32_t ids[] = {2811, 385, 1969};
    ds_generate_opts g = {.max_new = 16};
    ds_output a, b;
    CHECK_OK(ds_engine_generate(eng, ids, 3, &g, NULL, NULL, &a));
    ds_engine *one;
    ds_engine_opts o = {.model_dir = DS_MODELS "/pico-qwen3", .drafter_dir = DS_MODELS "/pico-qwen3-dspark",
                        .backend = "cpu", .threads = 1};
    CHECK_OK(ds_engine_open(&o, &one));
    CHECK_OK(ds_engine_generate(one, ids, 3, &g, NULL, NULL, &b));
    CHECK(a.n_tokens == b.n_tokens && !memcmp(a.tokens, b.tokens, (size_t)a.n_tokens * sizeof *a.tokens),
          "1 thread and all threads differ");
    ds_output_free(&a);
    ds_output_free(&b);
    ds_engine_free(one);
    ds_engine_opts bad = {.model_dir = DS_MODELS "/pico-qwen3", .backend = "cuda", .device = -1};
    CHECK_ERR(ds_engine_open(&bad, &one), "device must be >= 0, got -1");
    bad = (ds_engine_opts){.model_dir = DS_MODELS "/pico-qwen3", .threads = -2};
    CHECK_ERR(ds_engine_open(&bad, &one), "threads must be >= 0 (0: all CPUs), got -2");
}

static void test_bad_options(void) {
    ds_engine *e2;
    ds_engine_opts o = {.model_dir = DS_MODELS "/pico-qwen3", .backend = "tpu"};
    CHECK_ERR(ds_engine_open(&o, &e2), "unknown backend \"tpu\"");
    ds_engine_opts none = {0};
    CHECK_ERR(ds_engine_open(&none, &e2), "no model directory");
    o = (ds_engine_opts){.model_dir = DS_MODELS "/no-such-model"};
    CHECK_ERR(ds_engine_open(&o, &e2), "no-such-model");
    int32_t ids[600] = {0};
    ds_generate_opts g = {.max_new = 4};
    ds_output out;
    CHECK_ERR(ds_engine_generate(eng, ids, 600, &g, NULL, NULL, &out), "does not fit the model's context of 512");
    int32_t bad[] = {9000};
    CHECK_ERR(ds_engine_generate(eng, bad, 1, &g, NULL, NULL, &out), "outside the vocabulary");
    static const struct {
        ds_generate_opts g;
        const char *message;
    } cases[] = {
        {{.max_new = -1}, "ds_generate_opts.max_new must be >= 0, got -1"},
        {{.max_new = 4, .temperature = NAN}, "ds_generate_opts.temperature must be a finite number >= 0, got nan"},
        {{.max_new = 4, .temperature = -1}, "temperature must be a finite number >= 0, got -1"},
        {{.max_new = 4, .top_k = -1}, "ds_generate_opts.top_k must be >= 0"},
        {{.max_new = 4, .top_p = NAN}, "ds_generate_opts.top_p must be >= 0"},
        {{.max_new = 4, .threshold = 1.5f}, "ds_generate_opts.threshold must be in [0, 1], got 1.5"},
        {{.max_new = 4, .gamma = -1}, "ds_generate_opts.gamma must be >= 0"},
        {{.max_new = 4, .gamma = 8}, "ds_generate_opts.gamma 8 is above the drafter's block size 7"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        CHECK_ERR(ds_engine_generate(eng, ids, 3, &cases[i].g, NULL, NULL, &out), cases[i].message);
    /* Without drafting, gamma is not used. */
    g = (ds_generate_opts){.max_new = 2, .gamma = 8, .no_draft = true};
    CHECK_OK(ds_engine_generate(eng, ids, 3, &g, NULL, NULL, &out));
    ds_output_free(&out);
}

/* The batched engine through the public API: prompts of several lengths at
 * T = 0 and T = 1, 3 in flight, each output the single engine's for it; a
 * batch of one through ds_engine_generate; the options it refuses. */
static void test_batch(void) {
    ds_engine *be_;
    ds_engine_opts o = {.model_dir = DS_MODELS "/pico-qwen3", .drafter_dir = DS_MODELS "/pico-qwen3-dspark",
                        .batch = 3, .ctx = 256};
    CHECK_OK(ds_engine_open(&o, &be_));
    static const char *texts[] = {"It is a truth universally acknowledged", "Call me", "The war in Europe",
                                  "Once upon a time there was", "Happy families are all alike; every unhappy"};
    enum { N = sizeof texts / sizeof texts[0] };
    int32_t *ids[N];
    size_t lens[N];
    ds_generate_opts g[N];
    for (int i = 0; i < N; i++) {
        CHECK_OK(ds_tokenizer_encode(ds_engine_tokenizer(eng), texts[i], strlen(texts[i]), false, &ids[i], &lens[i]));
        g[i] = (ds_generate_opts){.max_new = 24, .temperature = i % 2 ? 1.0f : 0.0f, .seed = 7 + (uint64_t)i};
    }
    ds_output outs[N];
    ds_batch_summary sum;
    CHECK_OK(ds_engine_generate_batch(be_, N, (const int32_t *const *)ids, lens, g, outs, &sum));
    for (int i = 0; i < N; i++) {
        ds_output solo;
        CHECK_OK(ds_engine_generate(eng, ids[i], lens[i], &g[i], NULL, NULL, &solo));
        CHECK(solo.n_tokens == outs[i].n_tokens &&
                  !memcmp(solo.tokens, outs[i].tokens, (size_t)solo.n_tokens * sizeof *solo.tokens) &&
                  solo.rounds == outs[i].rounds,
              "request %d (T=%g): batched output differs from the single engine's", i, g[i].temperature);
        ds_output_free(&solo);
        ds_output_free(&outs[i]);
    }
    CHECK(sum.max_running == 3 && sum.steps > 0, "%d at once, %ld steps", sum.max_running, sum.steps);
    ds_output one;
    counter c = {0};
    CHECK_OK(ds_engine_generate(be_, ids[0], lens[0], &g[0], count, &c, &one));
    CHECK(c.seen == one.n_tokens && one.n_tokens == 24, "a batch of one: %d tokens, callback saw %d", one.n_tokens,
          c.seen);
    ds_output_free(&one);
    g[0].no_draft = true;
    CHECK_ERR(ds_engine_generate_batch(be_, 1, (const int32_t *const *)ids, lens, g, outs, NULL), "no_draft");
    CHECK_ERR(ds_engine_generate_batch(eng, 1, (const int32_t *const *)ids, lens, g, outs, NULL), "batch > 0");
    for (int i = 0; i < N; i++) free(ids[i]);
    ds_engine_free(be_);
    o.ctx = 0;
    CHECK_ERR(ds_engine_open(&o, &be_), "ctx");
}

/* The batched engine stepped by its caller (a server's loop): tokens grow a
 * step at a time and end as the solo run's, a cancel ends a request at once
 * and gives its pages back, released ids are unknown, and the speculative
 * counters add up to the requests' own rounds. */
static void test_submit_step(void) {
    ds_engine *be_;
    const ds_engine_opts o = {.model_dir = DS_MODELS "/pico-qwen3", .drafter_dir = DS_MODELS "/pico-qwen3-dspark",
                              .batch = 2, .ctx = 128};
    CHECK_OK(ds_engine_open(&o, &be_));
    static const char *texts[] = {"It is a truth universally acknowledged", "Call me", "The war in Europe"};
    enum { N = 3 };
    int32_t *ids[N];
    size_t lens[N];
    ds_generate_opts g[N];
    ds_request_id rid[N];
    for (int i = 0; i < N; i++) {
        CHECK_OK(ds_tokenizer_encode(ds_engine_tokenizer(eng), texts[i], strlen(texts[i]), false, &ids[i], &lens[i]));
        g[i] = (ds_generate_opts){.max_new = 20, .temperature = i == 1 ? 1.0f : 0.0f, .seed = 11 + (uint64_t)i};
        CHECK_OK(ds_engine_submit(be_, ids[i], lens[i], &g[i], &rid[i]));
    }
    CHECK(rid[0] == 0 && rid[1] == 1 && rid[2] == 2, "ids %lld %lld %lld", (long long)rid[0], (long long)rid[1],
          (long long)rid[2]);
    ds_engine_metrics m;
    ds_engine_get_metrics(be_, &m);
    CHECK(m.waiting == 3 && m.running == 0 && m.kv_pages_used == 0 && m.kv_pages_total > 0, "before: %d waiting, %d "
          "running, %d of %d pages", m.waiting, m.running, m.kv_pages_used, m.kv_pages_total);
    size_t seen[N] = {0};
    int steps = 0, active = N;
    bool cancelled = false;
    while (active > 0) {
        CHECK_OK(ds_engine_step(be_, &active));
        steps++;
        ds_engine_get_metrics(be_, &m);
        CHECK(m.running <= 2, "%d running with batch 2", m.running);
        for (int i = 0; i < N; i++) {
            ds_request_state st;
            CHECK_OK(ds_engine_request(be_, rid[i], &st));
            CHECK(st.n_tokens >= seen[i] && st.n_prompt == lens[i], "request %d: %zu tokens after %zu", i,
                  st.n_tokens, seen[i]);
            seen[i] = st.n_tokens;
            if (i == 2 && !cancelled && st.n_tokens >= 3) { /* the third ends early, by its caller */
                const int used = m.kv_pages_used;
                CHECK_OK(ds_engine_cancel(be_, rid[2]));
                CHECK_OK(ds_engine_request(be_, rid[2], &st));
                CHECK(st.finished && st.finish_reason == DS_FINISH_CALLER && !st.running && st.n_tokens == seen[2],
                      "cancelled: finished %d, reason %s, %zu tokens", st.finished,
                      ds_finish_reason_name(st.finish_reason), st.n_tokens);
                ds_engine_get_metrics(be_, &m);
                CHECK(m.kv_pages_used < used, "a cancel gives pages back: %d -> %d", used, m.kv_pages_used);
                cancelled = true;
            }
        }
    }
    CHECK(cancelled && steps > 3, "cancelled %d after %d steps", cancelled, steps);
    int64_t drafts = 0, drafted = 0, accepted = 0;
    for (int i = 0; i < N; i++) {
        ds_request_state st;
        CHECK_OK(ds_engine_request(be_, rid[i], &st));
        CHECK(st.finished, "request %d unfinished", i);
        drafts += st.rounds, drafted += st.proposed, accepted += st.accepted;
        if (i == 2) continue;
        ds_output solo;
        CHECK_OK(ds_engine_generate(eng, ids[i], lens[i], &g[i], NULL, NULL, &solo));
        CHECK(solo.n_tokens == (int)st.n_tokens &&
                  !memcmp(solo.tokens, st.tokens, st.n_tokens * sizeof *st.tokens) && solo.rounds == st.rounds,
              "request %d: stepped output differs from the single engine's", i);
        ds_output_free(&solo);
    }
    ds_engine_get_metrics(be_, &m);
    CHECK(m.running == 0 && m.waiting == 0 && m.kv_pages_used == 0 && m.requests_finished == N,
          "after: %d running, %d waiting, %d pages, %lld finished", m.running, m.waiting, m.kv_pages_used,
          (long long)m.requests_finished);
    CHECK(m.drafts == drafts && m.draft_tokens == drafted && m.accepted_tokens == accepted && drafts > 0,
          "spec counters %lld/%lld/%lld vs the requests' %lld/%lld/%lld", (long long)m.drafts,
          (long long)m.draft_tokens, (long long)m.accepted_tokens, (long long)drafts, (long long)drafted,
          (long long)accepted);
    int64_t per_pos = 0;
    for (int k = 0; k < DS_METRICS_POSITIONS; k++) {
        per_pos += m.accepted_per_pos[k];
        CHECK(k == 0 || m.accepted_per_pos[k] <= m.accepted_per_pos[k - 1], "position %d accepted more than %d", k,
              k - 1);
    }
    CHECK(per_pos == accepted && m.generation_tokens == (int64_t)(seen[0] + seen[1] + seen[2]),
          "per position %lld, accepted %lld; %lld tokens", (long long)per_pos, (long long)accepted,
          (long long)m.generation_tokens);
    for (int i = 0; i < N; i++) CHECK_OK(ds_engine_release(be_, rid[i]));
    ds_request_state st;
    CHECK_ERR(ds_engine_request(be_, rid[0], &st), "no such request");
    CHECK_ERR(ds_engine_cancel(be_, 99), "no such request");
    int32_t bad = 1 << 30;
    ds_request_id id;
    CHECK_ERR(ds_engine_submit(be_, &bad, 1, &g[0], &id), "outside the vocabulary");
    CHECK(id == -1, "a refused request got id %lld", (long long)id);
    CHECK_ERR(ds_engine_submit(eng, ids[0], lens[0], &g[0], &id), "batch > 0");
    for (int i = 0; i < N; i++) free(ids[i]);
    ds_engine_info info, big;
    ds_engine_get_info(be_, &info);
    ds_engine_free(be_);
    /* A ctx beyond the model's context (pico: 512) sizes the pool for the model's context. */
    ds_engine_opts o2 = o;
    o2.ctx = 1 << 20;
    CHECK_OK(ds_engine_open(&o2, &be_));
    ds_engine_get_info(be_, &big);
    o2.ctx = big.context;
    ds_engine_free(be_);
    CHECK_OK(ds_engine_open(&o2, &be_));
    ds_engine_get_info(be_, &info);
    CHECK(big.context == 512 && big.kv_pages == info.kv_pages, "ctx 2^20: %d pages, ctx %d: %d pages", big.kv_pages,
          big.context, info.kv_pages);
    ds_engine_free(be_);
}

/* The backend's alloc, counted: the bytes a model really allocates. */
static const ds_backend_ops *real_ops;
static int64_t counted_bytes;

static ds_error *counted_alloc(ds_backend *be, ds_dtype dt, int64_t rows, int64_t cols, ds_tensor *out) {
    counted_bytes += rows * cols * (int64_t)ds_dtype_size(dt);
    return real_ops->alloc(be, dt, rows, cols, out);
}

/* Bytes the target in dir (and, given one, its drafter) allocate for each
 * cache row, from opening them with a pool of 32 and of 64 rows: whatever
 * else they allocate is the same both times. */
static void measured_row_bytes(const char *dir, const char *drafter, int64_t *trow, int64_t *drow) {
    *trow = *drow = -1;
    ds_backend *be;
    CHECK_OK(ds_backend_cpu_new(1, &be));
    real_ops = be->ops;
    ds_backend_ops ops = *be->ops;
    ops.alloc = counted_alloc;
    be->ops = &ops;
    int64_t t_bytes[2] = {0}, d_bytes[2] = {0};
    ds_error *e = NULL;
    for (int i = 0; i < 2 && !e; i++) {
        ds_target *t;
        counted_bytes = 0;
        const ds_target_opts to = {.cache_rows = 32 * (i + 1)};
        if ((e = ds_target_open(be, dir, &to, &t))) break;
        t_bytes[i] = counted_bytes;
        if (drafter) {
            ds_drafter *d;
            counted_bytes = 0;
            const ds_drafter_opts dopts = {.cache_rows = 32 * (i + 1)};
            if (!(e = ds_drafter_open(be, drafter, t, &dopts, &d))) ds_drafter_free(d);
            d_bytes[i] = counted_bytes;
        }
        ds_target_free(t);
    }
    be->ops = real_ops;
    be->ops->destroy(be);
    CHECK_OK(e);
    *trow = (t_bytes[1] - t_bytes[0]) / 32;
    *drow = drafter ? (d_bytes[1] - d_bytes[0]) / 32 : 0;
}

/* ds_engine_opts.kv_mem: the pool's pages from a byte budget, at the bytes
 * a position takes (hand-computed here from each config, and measured as
 * allocated), for the pico pair, Gemma 4 (sliding and full layers of their
 * own geometry) and Gemma 4 E (KV-shared layers hold no cache); a budget
 * short of one request is an error naming both numbers; a large one stops
 * at what `batch` requests can use. */
static void test_kv_mem(void) {
    static const struct {
        const char *target, *drafter;
        int64_t trow, drow;
    } models[] = {
        /* 8 layers x K and V x 2 KV heads x head_dim 64 x 2 bytes (bf16: both configs name bfloat16,
         * model/kv_cache.h; 4 when the caches were fp32); the drafter's 3 layers alike */
        {DS_MODELS "/pico-qwen3", DS_MODELS "/pico-qwen3-dspark", 8 * 2 * 2 * 64 * 2, 3 * 2 * 2 * 64 * 2},
        /* 2 sliding layers of 2 KV heads x 16 and 2 full ones of 1 global KV head x 32 (attention_k_eq_v),
         * K and V each, fp32 (the fixtures' configs name float32); the drafter's 2 full layers */
        {DS_TESTDATA "/fixtures/gemma4-tiny/target", DS_TESTDATA "/fixtures/gemma4-tiny/drafter-trained",
         (2 * 2 * 16 + 2 * 1 * 32) * 2 * 4, 2 * 1 * 32 * 2 * 4},
        /* 6 layers, the last 2 KV-shared: sliding 0, 1, 3 (2 x 16) and full 2 (2 x 32, per_layer_config) */
        {DS_TESTDATA "/fixtures/gemma4-e-tiny/target", NULL, (3 * 2 * 16 + 2 * 32) * 2 * 4, 0},
    };
    for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
        const char *name = models[m].target;
        const int64_t trow = models[m].trow, drow = models[m].drow;
        int64_t got_t, got_d;
        CHECK_OK(ds_target_kv_row_bytes(name, &got_t));
        got_d = 0;
        if (models[m].drafter) CHECK_OK(ds_drafter_kv_row_bytes(models[m].drafter, &got_d));
        int64_t alloc_t, alloc_d;
        measured_row_bytes(name, models[m].drafter, &alloc_t, &alloc_d);
        CHECK(got_t == trow && got_d == drow && alloc_t == trow && alloc_d == drow,
              "%s: bytes a row: config %lld + %lld, allocated %lld + %lld, by hand %lld + %lld", name,
              (long long)got_t, (long long)got_d, (long long)alloc_t, (long long)alloc_d, (long long)trow,
              (long long)drow);
        /* batch 2, ctx 40: one request is (40 + a block of 33) rows = 5 pages of 16; the drafter's pool
         * adds (32 / 16 + 1) pages for each sequence's block (ds_batch_drafter_rows). */
        const int64_t page = 16 * (trow + drow), blocks = 2 * 3 * 16 * drow;
        ds_engine_opts o = {.model_dir = name, .drafter_dir = models[m].drafter, .batch = 2, .ctx = 40,
                            .kv_mem = blocks + 7 * page + page - 1};
        ds_engine *e;
        CHECK_OK(ds_engine_open(&o, &e));
        ds_engine_info in;
        ds_engine_get_info(e, &in);
        ds_engine_free(e);
        CHECK(in.kv_pages == 7 && in.kv_page_rows == 16 && in.kv_tokens == 7 * 16 && in.kv_target_row_bytes == trow &&
                  in.kv_drafter_row_bytes == drow && in.kv_bytes == blocks + 7 * page && in.kv_bytes <= o.kv_mem,
              "%s: %d pages x %d rows = %lld tokens, %lld bytes (%lld + %lld a row) from %lld", name, in.kv_pages,
              in.kv_page_rows, (long long)in.kv_tokens, (long long)in.kv_bytes, (long long)in.kv_target_row_bytes,
              (long long)in.kv_drafter_row_bytes, (long long)o.kv_mem);
        /* More than 2 requests of 40 tokens can use: their 10 pages; no budget: the same. */
        for (int k = 0; k < 2; k++) {
            o.kv_mem = k ? 0 : (int64_t)1 << 40;
            CHECK_OK(ds_engine_open(&o, &e));
            ds_engine_get_info(e, &in);
            ds_engine_free(e);
            CHECK(in.kv_pages == 10 && in.kv_bytes == blocks + 10 * page, "%s, kv_mem %lld: %d pages, %lld bytes",
                  name, (long long)o.kv_mem, in.kv_pages, (long long)in.kv_bytes);
        }
        /* One byte short of one request: an error naming the budget and what one request needs. */
        o.kv_mem = blocks + 5 * page - 1;
        ds_error *err = ds_engine_open(&o, &e);
        char budget[96], need[64];
        snprintf(budget, sizeof budget, "kv_mem (a request: ctx 40 tokens and a block): %lld bytes cannot hold",
                 (long long)o.kv_mem);
        snprintf(need, sizeof need, "needs %lld bytes", (long long)(blocks + 5 * page));
        CHECK(err && strstr(ds_error_message(err), budget) && strstr(ds_error_message(err), need), "%s: %s", name,
              err ? ds_error_message(err) : "opened");
        ds_error_free(err);
        o.kv_mem = blocks + 5 * page;
        CHECK_OK(ds_engine_open(&o, &e));
        ds_engine_get_info(e, &in);
        ds_engine_free(e);
        CHECK(in.kv_pages == 5, "%s: a budget of exactly one request gives %d pages", name, in.kv_pages);
    }
    /* A config whose K/V no pool's arithmetic could hold (2^30 layers) is refused, read before anything loads. */
    char bogus[] = "/tmp/ds_kv_mem_XXXXXX", path[64];
    CHECK(mkdtemp(bogus), "mkdtemp");
    snprintf(path, sizeof path, "%s/config.json", bogus);
    FILE *f = fopen(path, "w");
    CHECK(f, "%s", path);
    if (f) {
        fputs("{\"model_type\": \"qwen3\", \"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 512, "
              "\"hidden_size\": 64, \"num_hidden_layers\": 1073741824, \"num_attention_heads\": 4, "
              "\"intermediate_size\": 128}",
              f);
        fclose(f);
    }
    int64_t rb;
    CHECK_ERR(ds_target_kv_row_bytes(bogus, &rb), "would take over 1073741824 bytes a position");
    ds_engine *e;
    ds_engine_opts o = {.model_dir = bogus, .batch = 2, .ctx = 40, .kv_mem = 1 << 30};
    CHECK_ERR(ds_engine_open(&o, &e), "config.json: its layers' K/V would take over");
    remove(path);
    rmdir(bogus);
    o = (ds_engine_opts){.model_dir = DS_MODELS "/pico-qwen3", .kv_mem = 1 << 20};
    CHECK_ERR(ds_engine_open(&o, &e), "kv_mem sizes the batched engine's KV pool: give batch > 0");
    o = (ds_engine_opts){.model_dir = DS_MODELS "/pico-qwen3", .batch = 2, .ctx = 40, .kv_mem = -1};
    CHECK_ERR(ds_engine_open(&o, &e), "ds_engine_opts.kv_mem must be >= 0");
    ds_engine_info in;
    ds_engine_get_info(eng, &in);
    CHECK(in.kv_pages == 0 && in.kv_bytes == 0, "an engine that is not batched reports a pool of %d pages",
          in.kv_pages);
}

/* A pool from kv_mem of one request's pages, 3 requests in flight that
 * outgrow it: sequences are preempted and recomputed, and each request
 * still gets exactly its solo tokens (T = 0 and T = 1). */
static void test_kv_mem_preemption(void) {
    /* ctx 64: one request is (64 + 33) rows = 7 pages; the drafter's 3 blocks of 3 pages beside them. */
    const int64_t page = 16 * (4096 + 1536), blocks = 3 * 3 * 16 * 1536; /* bf16 rows (test_kv_mem) */
    const ds_engine_opts o = {.model_dir = DS_MODELS "/pico-qwen3", .drafter_dir = DS_MODELS "/pico-qwen3-dspark",
                              .batch = 3, .ctx = 64, .kv_mem = blocks + 7 * page};
    ds_engine *be_;
    CHECK_OK(ds_engine_open(&o, &be_));
    ds_engine_info in;
    ds_engine_get_info(be_, &in);
    CHECK(in.kv_pages == 7, "%d pages", in.kv_pages);
    static const char *texts[] = {"It is a truth universally acknowledged", "Call me", "The war in Europe",
                                  "Once upon a time there was"};
    enum { N = sizeof texts / sizeof texts[0] };
    int32_t *ids[N];
    size_t lens[N];
    ds_generate_opts g[N];
    for (int i = 0; i < N; i++) {
        CHECK_OK(ds_tokenizer_encode(ds_engine_tokenizer(eng), texts[i], strlen(texts[i]), false, &ids[i], &lens[i]));
        g[i] = (ds_generate_opts){.max_new = 40, .temperature = i % 2 ? 1.0f : 0.0f, .seed = 3 + (uint64_t)i,
                                  .ignore_eos = true};
    }
    ds_output outs[N];
    ds_batch_summary sum;
    CHECK_OK(ds_engine_generate_batch(be_, N, (const int32_t *const *)ids, lens, g, outs, &sum));
    CHECK(sum.preemptions > 0, "3 requests of up to %d tokens in %d pages: no preemption", 8 + 40 + 8, in.kv_pages);
    for (int i = 0; i < N; i++) {
        ds_output solo;
        CHECK_OK(ds_engine_generate(eng, ids[i], lens[i], &g[i], NULL, NULL, &solo));
        CHECK(solo.n_tokens == outs[i].n_tokens && outs[i].n_tokens == 40 &&
                  !memcmp(solo.tokens, outs[i].tokens, (size_t)solo.n_tokens * sizeof *solo.tokens),
              "request %d (T=%g): %d tokens in the small pool, %d solo, or they differ", i, g[i].temperature,
              outs[i].n_tokens, solo.n_tokens);
        ds_output_free(&solo);
        ds_output_free(&outs[i]);
        free(ids[i]);
    }
    ds_engine_free(be_);
}

static void teardown(void) { ds_engine_free(eng); }

RUN_TESTS("engine_api", setup, test_drafted_equals_plain, test_callback_stops, test_round_metrics,
          test_finish_reasons, test_chat, test_ids_without_tokenizer, test_backend_choice, test_bad_options, test_batch,
          test_submit_step, test_kv_mem, test_kv_mem_preemption, teardown)
