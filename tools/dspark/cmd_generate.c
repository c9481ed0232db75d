/* dspark generate: text (or ids) in, continuation out, streamed as it is
 * committed; speculative with a DSpark drafter unless --no-draft. The
 * engine is the public one of include/dspark.h; this file is flags, prompt
 * files and printing. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_choice.h"
#include "cli_num.h"
#include "commands.h"
#include "dspark.h"
#include "io/checkpoint.h"
#include "io/prompt_file.h"
#include "size_arg.h"

typedef struct {
    const char *model, *drafter, *prompt, *prompt_file, *tokenizer, *sts;
    bool no_draft, json, ignore_eos, chat, no_sts;
    bool gamma_given; /* --gamma checked against the drafter's block size once it is open */
    int threads;
    int batch, ctx;           /* --batch N (the batched engine), --ctx N */
    int tp;                   /* --tp N: the target split across N ranks */
    int64_t kv_mem;           /* --kv-mem SIZE: the KV pool from a byte budget (0: batch x ctx) */
    bool schedule_confidence; /* --schedule confidence: Algorithm 1 */
    const char *sps_cache;
    bool cuda; /* --backend cuda */
    ds_generate_opts gen;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspark generate [-m MODEL_DIR] [-d DRAFTER_DIR | --no-draft] (-p TEXT | --prompt-file F.jsonl)\n"
            "                       [--tokenizer PATH] [--chat] [-n MAX_NEW] [--temp T] [--top-k K] [--top-p P] [--seed S]\n"
            "                       [--threshold C] [--gamma G] [--sts FILE | --no-sts] [--threads N] [--backend cpu|cuda]\n"
            "                       [--ignore-eos] [--json] [--batch N [--ctx N] [--kv-mem SIZE]\n"
            "                       [--schedule fixed|confidence] [--sps-cache FILE]]\n"
            "\n"
            "  -m DIR           target model directory (default: the bundled pico-qwen3)\n"
            "  -d DIR           DSpark/DFlash drafter directory (default with the bundled model:\n"
            "                   the bundled pico-qwen3-dspark)\n"
            "  --no-draft       plain autoregressive decoding\n"
            "  -p TEXT          prompt text (-p - reads it from standard input)\n"
            "  --prompt-file F  one JSON object per line: {\"prompt\": TEXT} or {\"input_ids\": [...]}\n"
            "                   (--prompt-file - reads the lines from standard input)\n"
            "  --tokenizer P    a tokenizer.json or a directory holding one (default: the model's;\n"
            "                   without any, prompts must be input_ids and output is ids only)\n"
            "  -n N             new tokens at most (default 128)\n"
            "  --temp T         temperature >= 0 (default 0 = greedy)\n"
            "  --top-k K, --top-p P   restrict sampling (applied to target and drafter alike);\n"
            "                   K >= 0 (0: off), P in (0, 1]\n"
            "  --seed S         random seed (default 0)\n"
            "  --threshold C    cut each proposal before the first confidence below C, C in [0, 1]\n"
            "                   (default 0: off); the confidence is the calibrated one when the drafter\n"
            "                   directory has an sts.json (dspark calibrate)\n"
            "  --sts FILE       STS temperatures from FILE instead; --no-sts: the confidence head as it is\n"
            "  --gamma G        use at most G (1 .. the drafter's block size) of its proposal positions\n"
            "  --backend B      cpu (default) or cuda (GPU 0)\n"
            "  --chat           render -p TEXT as a user turn with the model's chat template\n"
            "                   (prompt files may give {\"messages\": [{\"role\", \"content\"}...]})\n"
            "  --ignore-eos     do not stop at the model's stop tokens\n"
            "  --json           one JSON object per prompt (ids, text, timings, acceptance)\n"
            "  --batch N        the batched engine: the prompts N at a time over one target forward a step\n"
            "                   (output per prompt in input order, the same tokens as one at a time)\n"
            "  --ctx N          tokens a request may hold (with --batch: default 2048, the KV pool's size)\n"
            "  --kv-mem SIZE    with --batch: the KV pool (target and drafter) from a byte budget, e.g. 512M,\n"
            "                   8G, 1.5GiB (powers of 1024): as many pages as it holds, up to N x --ctx;\n"
            "                   short of one request of --ctx tokens is an error (the pool: on stderr)\n"
            "  --schedule S     with --batch: fixed (each proposal whole) or confidence (SPEC §6 Algorithm 1:\n"
            "                   the target's step cost is profiled first; --sps-cache FILE keeps it)\n"
            "  --tp N           tensor parallel: the target (Qwen3, Gemma 4) split across N ranks, one thread each (CUDA:\n"
            "                   GPUs 0..N-1; CPU: the threads shared out), the drafter on every rank; with\n"
            "                   --batch every step of the batched engine runs on all ranks\n");
}

/* An int option; out of int range leaves *end on the text so it is refused. */
static int int_arg(const char *s, char **end) {
    long v = strtol(s, end, 10);
    if (v < -2147483647L || v > 2147483647L) *end = (char *)s;
    return (int)v;
}

/* Each numeric option's range, written so that NaN fails it too (strtof
 * accepts "nan" and "inf", and every comparison with NaN is false). */
static int check_ranges(const options *o) {
    const ds_generate_opts *g = &o->gen;
    char bad[160] = "";
    if (!(g->max_new >= 0)) snprintf(bad, sizeof bad, "-n must be >= 0, got %d", g->max_new);
    else if (!(g->temperature >= 0 && isfinite(g->temperature)))
        snprintf(bad, sizeof bad, "--temp must be a finite number >= 0, got %g", g->temperature);
    else if (!(g->top_k >= 0)) snprintf(bad, sizeof bad, "--top-k must be >= 0, got %d", g->top_k);
    else if (!(g->top_p > 0 && g->top_p <= 1))
        snprintf(bad, sizeof bad, "--top-p must be in (0, 1], got %g", g->top_p);
    else if (!(g->threshold >= 0 && g->threshold <= 1))
        snprintf(bad, sizeof bad, "--threshold must be in [0, 1], got %g", g->threshold);
    else if (o->gamma_given && !(g->gamma >= 1))
        snprintf(bad, sizeof bad, "--gamma must be >= 1, got %d (leave it out for the drafter's block size)",
                 g->gamma);
    else if (!(o->threads >= 1)) snprintf(bad, sizeof bad, "--threads must be >= 1, got %d", o->threads);
    else if (!(o->batch >= 0)) snprintf(bad, sizeof bad, "--batch must be >= 1, got %d", o->batch);
    else if (!(o->ctx >= 0)) snprintf(bad, sizeof bad, "--ctx must be >= 1, got %d", o->ctx);
    else if (o->schedule_confidence && !o->batch) snprintf(bad, sizeof bad, "--schedule needs --batch");
    else if (o->kv_mem && !o->batch) snprintf(bad, sizeof bad, "--kv-mem needs --batch");
    else if (!(o->tp >= 0 && o->tp <= 64)) snprintf(bad, sizeof bad, "--tp must be in 1..64, got %d", o->tp);
    if (!*bad) return 0;
    fprintf(stderr, "dspark generate: %s\n", bad);
    return 2;
}

static int parse_args(int argc, char **argv, options *o) {
    enum { O_NO_DRAFT = 256, O_PROMPT_FILE, O_TEMP, O_TOP_K, O_TOP_P, O_SEED, O_THRESHOLD, O_GAMMA, O_THREADS,
           O_JSON, O_IGNORE_EOS, O_BACKEND, O_CHAT, O_TOKENIZER, O_STS, O_NO_STS, O_BATCH, O_CTX, O_SCHEDULE,
           O_SPS_CACHE, O_KV_MEM, O_TP };
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'}, {"drafter", required_argument, 0, 'd'},
        {"prompt", required_argument, 0, 'p'}, {"max-new", required_argument, 0, 'n'},
        {"no-draft", no_argument, 0, O_NO_DRAFT}, {"prompt-file", required_argument, 0, O_PROMPT_FILE},
        {"temp", required_argument, 0, O_TEMP}, {"top-k", required_argument, 0, O_TOP_K},
        {"top-p", required_argument, 0, O_TOP_P}, {"seed", required_argument, 0, O_SEED},
        {"threshold", required_argument, 0, O_THRESHOLD}, {"gamma", required_argument, 0, O_GAMMA},
        {"threads", required_argument, 0, O_THREADS}, {"json", no_argument, 0, O_JSON},
        {"ignore-eos", no_argument, 0, O_IGNORE_EOS}, {"backend", required_argument, 0, O_BACKEND},
        {"chat", no_argument, 0, O_CHAT}, {"tokenizer", required_argument, 0, O_TOKENIZER},
        {"sts", required_argument, 0, O_STS}, {"no-sts", no_argument, 0, O_NO_STS},
        {"batch", required_argument, 0, O_BATCH}, {"ctx", required_argument, 0, O_CTX},
        {"schedule", required_argument, 0, O_SCHEDULE}, {"sps-cache", required_argument, 0, O_SPS_CACHE},
        {"kv-mem", required_argument, 0, O_KV_MEM}, {"tp", required_argument, 0, O_TP},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    o->gen.max_new = 128;
    o->gen.top_p = 1.0f;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = cpus > 0 ? (int)cpus : 1;
    optind = 1;
    int c;
    char *end;
#define NUM(dst, conv, what) CLI_NUM("generate", dst, conv, what)
    while ((c = getopt_long(argc, argv, "m:d:p:n:h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'd': o->drafter = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'n': NUM(o->gen.max_new, int_arg(optarg, &end), "-n"); break;
        case O_NO_DRAFT: o->no_draft = true; break;
        case O_PROMPT_FILE: o->prompt_file = optarg; break;
        case O_TEMP: NUM(o->gen.temperature, strtof(optarg, &end), "--temp"); break;
        case O_TOP_K: NUM(o->gen.top_k, int_arg(optarg, &end), "--top-k"); break;
        case O_TOP_P: NUM(o->gen.top_p, strtof(optarg, &end), "--top-p"); break;
        case O_SEED: NUM(o->gen.seed, strtoull(optarg, &end, 10), "--seed"); break;
        case O_THRESHOLD: NUM(o->gen.threshold, strtof(optarg, &end), "--threshold"); break;
        case O_GAMMA:
            NUM(o->gen.gamma, int_arg(optarg, &end), "--gamma");
            o->gamma_given = true;
            break;
        case O_THREADS: NUM(o->threads, int_arg(optarg, &end), "--threads"); break;
        case O_JSON: o->json = true; break;
        case O_IGNORE_EOS: o->gen.ignore_eos = true; break;
        case O_CHAT: o->chat = true; break;
        case O_TOKENIZER: o->tokenizer = optarg; break;
        case O_STS: o->sts = optarg; break;
        case O_NO_STS: o->no_sts = true; break;
        case O_BATCH: NUM(o->batch, int_arg(optarg, &end), "--batch"); break;
        case O_CTX: NUM(o->ctx, int_arg(optarg, &end), "--ctx"); break;
        case O_TP: NUM(o->tp, int_arg(optarg, &end), "--tp"); break;
        case O_SPS_CACHE: o->sps_cache = optarg; break;
        case O_KV_MEM: {
            ds_error *e = ds_size_arg("--kv-mem", optarg, &o->kv_mem);
            if (e) {
                fprintf(stderr, "dspark generate: %s\n", ds_error_message(e));
                ds_error_free(e);
                return 2;
            }
            break;
        }
        case O_SCHEDULE: {
            const int c = cli_choice("generate", "--schedule", optarg, (const char *const[]){"fixed", "confidence", NULL});
            if (c < 0) return 2;
            o->schedule_confidence = c == 1;
            break;
        }
        case O_BACKEND: {
            const int b = cli_choice("generate", "--backend", optarg, CLI_BACKENDS);
            if (b < 0) return 2;
            o->cuda = b == 1;
            break;
        }
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
    }
#undef NUM
    if (optind < argc) {
        fprintf(stderr, "dspark generate: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o->sts && o->no_sts) {
        fprintf(stderr, "dspark generate: give at most one of --sts FILE and --no-sts\n");
        return 2;
    }
    if (!o->prompt == !o->prompt_file) {
        fprintf(stderr, "dspark generate: give exactly one of -p TEXT or --prompt-file F\n");
        usage(stderr);
        return 2;
    }
    return check_ranges(o);
}

typedef struct {
    ds_detok *detok;
    bool stream;
} stream_ctx;

static bool on_token(void *user, int32_t tok) {
    stream_ctx *s = user;
    if (!s->stream) return true;
    if (!s->detok) { /* no tokenizer: the ids, space-separated */
        printf("%d ", (int)tok);
        fflush(stdout);
        return true;
    }
    const char *text;
    size_t len;
    ds_error *e = ds_detok_push(s->detok, tok, &text, &len);
    if (e) {
        ds_error_free(e);
        return true;
    }
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

static cJSON *int_array(const int *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

/* The drafted fields a prompt's line and the summary both end with. */
static void add_draft_fields(cJSON *o, const ds_stats *st, double draft_s, double verify_s) {
    cJSON *pp = cJSON_AddArrayToObject(o, "per_position_acceptance");
    double rate;
    for (int k = 0; (rate = ds_stats_accept_rate_at(st, k)) >= 0; k++)
        cJSON_AddItemToArray(pp, cJSON_CreateNumber(rate));
    cJSON_AddNumberToObject(o, "draft_time_s", draft_s);
    cJSON_AddNumberToObject(o, "verify_time_s", verify_s);
}

/* Prints o as one line of JSON and frees it. */
static void put_json_line(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    puts(s);
    free(s);
    cJSON_Delete(o);
}

static ds_error *print_json(const ds_tokenizer *tok, const cJSON *id, int n_prompt, const ds_output *r,
                            bool drafted) {
    ds_stats *one = NULL;
    if (drafted) DS_TRY(ds_stats_new(&one));
    cJSON *o = cJSON_CreateObject();
    if (id) cJSON_AddItemToObject(o, "id", cJSON_Duplicate(id, 1));
    cJSON_AddNumberToObject(o, "prompt_tokens", n_prompt);
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    for (int i = 0; i < r->n_tokens; i++) cJSON_AddItemToArray(toks, cJSON_CreateNumber(r->tokens[i]));
    if (tok) { /* without a tokenizer the ids are the output */
        char *text = NULL;
        size_t len;
        ds_error *e = ds_tokenizer_decode(tok, r->tokens, (size_t)r->n_tokens, true, &text, &len);
        cJSON_AddStringToObject(o, "text", e ? "" : text);
        ds_error_free(e);
        free(text);
    }
    cJSON_AddBoolToObject(o, "stopped", r->stopped);
    cJSON_AddStringToObject(o, "stop_reason", ds_finish_reason_name(r->finish_reason));
    cJSON_AddNumberToObject(o, "time_s", r->total_s);
    cJSON_AddNumberToObject(o, "prefill_time_s", r->prefill_s);
    double decode_s = r->total_s - r->prefill_s;
    cJSON_AddNumberToObject(o, "tokens_per_s", r->total_s > 0 ? r->n_tokens / r->total_s : 0);
    cJSON_AddNumberToObject(o, "decode_tokens_per_s", decode_s > 0 && r->n_tokens > 1 ? (r->n_tokens - 1) / decode_s : 0);
    if (drafted) {
        ds_stats_add(one, r);
        cJSON_AddNumberToObject(o, "rounds", r->rounds);
        cJSON_AddItemToObject(o, "accepted", int_array(r->accepted, r->rounds));
        cJSON_AddItemToObject(o, "proposed", int_array(r->proposed, r->rounds));
        cJSON_AddNumberToObject(o, "acceptance_length", r->acceptance_length);
        add_draft_fields(o, one, r->draft_s, r->verify_s);
    }
    put_json_line(o);
    ds_stats_free(one);
    return NULL;
}

static void print_summary(const ds_stats *st, bool drafted) {
    ds_stats_summary m;
    ds_stats_summarize(st, &m);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "summary", drafted ? "speculative" : "autoregressive");
    cJSON_AddNumberToObject(o, "prompts", m.outputs);
    cJSON_AddNumberToObject(o, "tokens", (double)m.tokens);
    cJSON_AddNumberToObject(o, "time_s", m.total_s);
    cJSON_AddNumberToObject(o, "tokens_per_s", m.total_s > 0 ? m.tokens / m.total_s : 0);
    if (drafted) {
        cJSON_AddNumberToObject(o, "rounds", m.rounds);
        cJSON_AddNumberToObject(o, "acceptance_length", m.acceptance_length);
        cJSON_AddNumberToObject(o, "verify_rate", m.verify_rate);
        cJSON_AddNumberToObject(o, "draft_tokens_per_proposal", m.proposed_per_round);
        add_draft_fields(o, st, m.draft_s, m.verify_s);
    }
    put_json_line(o);
}

typedef struct {
    ds_engine *engine;
    ds_engine_info info;
    const char *model_dir;
} session;

static ds_error *open_session(const options *o, session *s) {
    const char *model = o->model ? o->model : DS_DEFAULT_MODEL_DIR "/pico-qwen3";
    const char *drafter = o->drafter;
    if (!drafter && !o->model) drafter = DS_DEFAULT_MODEL_DIR "/pico-qwen3-dspark";
    if (o->no_draft) drafter = NULL;
    s->model_dir = model;
    /* No tokenizer is fine while every prompt is input_ids (a `dspark synth`
     * checkpoint has none): text prompts then fail in need_tokenizer(). */
    ds_engine_opts eo = {.model_dir = model, .drafter_dir = drafter, .backend = o->cuda ? "cuda" : "cpu",
                         .threads = o->threads, .tokenizer = o->tokenizer, .sts = o->sts,
                         .no_sts = o->no_sts || o->no_draft, .batch = o->batch,
                         .ctx = o->ctx ? o->ctx : o->batch ? 2048 : 0, .kv_mem = o->kv_mem,
                         .confidence_schedule = o->schedule_confidence, .sps_cache = o->sps_cache, .tp = o->tp};
    DS_TRY(ds_engine_open(&eo, &s->engine));
    ds_engine_get_info(s->engine, &s->info);
    if (s->info.kv_pages) {
        char line[256];
        ds_kv_pool_line(&s->info, line, sizeof line);
        fprintf(stderr, "%s\n", line);
    }
    if (s->info.has_drafter && o->gamma_given && o->gen.gamma > s->info.block_size)
        return ds_errorf("--gamma %d is above the drafter's block size %d (%s/config.json block_size)", o->gen.gamma,
                         s->info.block_size, drafter);
    return NULL;
}

static ds_error *need_tokenizer(const session *s, const char *what) {
    if (s->info.has_tokenizer) return NULL;
    return ds_errorf("%s needs a tokenizer, and %s has no tokenizer.json: give --tokenizer PATH (a tokenizer.json or "
                     "a directory holding one), or give the prompt as input_ids in a --prompt-file",
                     what, s->model_dir);
}

static void close_session(session *s) { ds_engine_free(s->engine); }

/* Renders a conversation with the model's chat template and encodes it. */
static ds_error *chat_ids(session *s, const ds_chat_message *msgs, size_t n, int32_t **ids, size_t *n_ids) {
    DS_TRY(need_tokenizer(s, "a chat prompt"));
    return ds_engine_chat_encode(s->engine, msgs, n, ids, n_ids);
}

/* One prompt: its input_ids, its messages through the chat template, or its
 * text (a user turn with --chat) through the tokenizer. */
static ds_error *prompt_ids(const options *o, session *s, const ds_prompt *p, int32_t **ids, size_t *n) {
    switch (p->kind) {
    case DS_PROMPT_IDS:
        *n = p->n_ids;
        if (!(*ids = malloc(*n * sizeof **ids))) return ds_errorf("out of memory");
        memcpy(*ids, p->ids, *n * sizeof **ids);
        return NULL;
    case DS_PROMPT_MESSAGES: return chat_ids(s, p->messages, p->n_messages, ids, n);
    case DS_PROMPT_TEXT: break;
    }
    if (o->chat) {
        ds_chat_message user = {"user", p->text};
        return chat_ids(s, &user, 1, ids, n);
    }
    DS_TRY(need_tokenizer(s, "a text prompt"));
    return ds_tokenizer_encode(ds_engine_tokenizer(s->engine), p->text, strlen(p->text), false, ids, n);
}

static ds_error *run_one(const options *o, session *s, const ds_prompt *p, ds_stats *m) {
    int32_t *ids;
    size_t n;
    DS_TRY(prompt_ids(o, s, p, &ids, &n));
    const ds_tokenizer *tok = ds_engine_tokenizer(s->engine);
    stream_ctx sc = {.detok = tok ? ds_detok_new(tok, true) : NULL, .stream = !o->json};
    ds_output r;
    ds_error *e = ds_engine_generate(s->engine, ids, n, &o->gen, on_token, &sc, &r);
    if (!e && r.finish_reason == DS_FINISH_CONTEXT)
        fprintf(stderr, "dspark generate: warning: stopped after %d of %d new tokens: the model's context of %d "
                        "tokens is full (%zu prompt tokens)\n",
                r.n_tokens, o->gen.max_new, s->info.context, n);
    if (!e) {
        if (o->json) {
            e = print_json(tok, p->id, (int)n, &r, s->info.has_drafter);
        } else {
            const char *tail = "";
            size_t len = 0;
            if (sc.detok) ds_error_free(ds_detok_finish(sc.detok, &tail, &len));
            fwrite(tail, 1, len, stdout);
            putchar('\n');
            fprintf(stderr, "[%d tokens, %.1f tok/s", r.n_tokens, r.total_s > 0 ? r.n_tokens / r.total_s : 0.0);
            if (s->info.has_drafter) fprintf(stderr, ", tau %.2f over %d rounds", r.acceptance_length, r.rounds);
            fprintf(stderr, "]\n");
        }
        ds_stats_add(m, &r);
        ds_output_free(&r);
    }
    if (sc.detok) ds_detok_free(sc.detok);
    free(ids);
    return e;
}

/* The prompts are read (the whole file, or -p's text) before the model is
 * opened, so a bad line 30 is reported at once, not after a model load and
 * 29 generations. */
static ds_error *read_prompts(const options *o, ds_prompt_list *list, char **stdin_text) {
    *stdin_text = NULL;
    if (o->prompt_file) return ds_prompt_file_read(o->prompt_file, list);
    if (!(list->items = calloc(1, sizeof *list->items))) return ds_errorf("out of memory");
    list->n = 1;
    list->items[0] = (ds_prompt){.kind = DS_PROMPT_TEXT, .text = (char *)o->prompt};
    if (!strcmp(o->prompt, "-")) { /* -p - : the text is standard input */
        DS_TRY(ds_read_stream(stdin, "<stdin>", stdin_text, NULL));
        list->items[0].text = *stdin_text;
    }
    return NULL;
}

/* --batch: every prompt through the batched engine at once, then the
 * outputs in input order, as run_one prints them, and a line for the batch. */
static ds_error *run_batch(const options *o, session *s, const ds_prompt_list *list, ds_stats *m) {
    const size_t n = list->n;
    int32_t **ids = calloc(n ? n : 1, sizeof *ids);
    size_t *lens = calloc(n ? n : 1, sizeof *lens);
    ds_generate_opts *gen = calloc(n ? n : 1, sizeof *gen);
    ds_output *outs = calloc(n ? n : 1, sizeof *outs);
    ds_error *e = ids && lens && gen && outs ? NULL : ds_errorf("out of memory");
    for (size_t i = 0; i < n && !e; i++) {
        e = prompt_ids(o, s, &list->items[i], &ids[i], &lens[i]);
        if (e && o->prompt_file) e = ds_error_wrap(e, "%s:%d", o->prompt_file, list->items[i].line);
        gen[i] = o->gen;
    }
    ds_batch_summary sum = {0};
    if (!e) e = ds_engine_generate_batch(s->engine, n, (const int32_t *const *)ids, lens, gen, outs, &sum);
    const ds_tokenizer *tok = ds_engine_tokenizer(s->engine);
    long tokens = 0;
    for (size_t i = 0; i < n && !e; i++) {
        if (o->json) {
            e = print_json(tok, list->items[i].id, (int)lens[i], &outs[i], s->info.has_drafter);
        } else {
            char *text = NULL;
            size_t len = 0;
            if (tok) e = ds_tokenizer_decode(tok, outs[i].tokens, (size_t)outs[i].n_tokens, true, &text, &len);
            if (!e) printf("%s\n", text ? text : "");
            free(text);
        }
        tokens += outs[i].n_tokens;
        ds_stats_add(m, &outs[i]);
    }
    if (!e) {
        const double tps = sum.total_s > 0 ? (double)tokens / sum.total_s : 0;
        if (o->json) {
            printf("{\"batch\":{\"requests\":%zu,\"in_flight\":%d,\"most_at_once\":%d,\"tokens\":%ld,\"seconds\":%.6f,"
                   "\"tokens_per_s\":%.3f,\"steps\":%ld,\"preemptions\":%ld,\"schedule\":\"%s\"}}\n",
                   n, o->batch, sum.max_running, tokens, sum.total_s, tps, sum.steps, sum.preemptions,
                   o->schedule_confidence ? "confidence" : "fixed");
        } else {
            fprintf(stderr, "[batch of %zu, %d in flight: %ld tokens in %.2f s, %.1f tok/s, %ld steps]\n", n, o->batch,
                    tokens, sum.total_s, tps, sum.steps);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (ids) free(ids[i]);
        if (outs) ds_output_free(&outs[i]);
    }
    free(ids), free(lens), free(gen), free(outs);
    return e;
}

static ds_error *run_all(const options *o, session *s, const ds_prompt_list *list, ds_stats *m) {
    if (o->batch > 0) return run_batch(o, s, list, m);
    const char *name = !o->prompt_file ? NULL : strcmp(o->prompt_file, "-") ? o->prompt_file : "<stdin>";
    ds_error *e = NULL;
    for (size_t i = 0; i < list->n && !e; i++) {
        e = run_one(o, s, &list->items[i], m);
        if (name) e = ds_error_wrap(e, "%s:%d", name, list->items[i].line);
    }
    return e;
}

int cmd_generate(int argc, char **argv) {
    options o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    session s = {0};
    ds_stats *m = NULL;
    ds_prompt_list list = {0};
    char *stdin_text;
    ds_error *e = read_prompts(&o, &list, &stdin_text);
    if (!e) e = ds_stats_new(&m);
    if (!e) e = open_session(&o, &s);
    if (!e) e = run_all(&o, &s, &list, m);
    if (!e && o.json && o.prompt_file) print_summary(m, s.info.has_drafter);
    close_session(&s);
    ds_stats_free(m);
    if (!o.prompt_file && list.items) list.items[0].text = NULL; /* -p's text is argv's or stdin_text */
    ds_prompt_list_free(&list);
    free(stdin_text);
    if (e) {
        fprintf(stderr, "dspark generate: %s\n", ds_error_message(e));
        ds_error_free(e);
        return 1;
    }
    return 0;
}
