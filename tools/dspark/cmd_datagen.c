/* dspark datagen: the training cache of SPEC §7 (src/train/datagen.h): the
 * target's continuations of a prompt set with its tapped and final hidden
 * states, bf16, sharded for mmap (src/io/train_cache.h), resumable. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_choice.h"
#include "cli_num.h"
#include "commands.h"
#include "io/config.h"
#include "io/json_file.h"
#include "io/prompt_file.h"
#include "tokenizer/chat_template.h"
#include "train/datagen.h"

typedef struct {
    const char *model, *drafter, *prompt_file, *raw_file, *out, *taps_arg, *tokenizer;
    bool cuda, ignore_eos;
    int threads, max_new, top_k, batch;
    float temp, top_p;
    uint64_t seed;
    long long shard_tokens;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspark datagen [-m TARGET_DIR] --prompt-file F.jsonl --out CACHE_DIR [-d DRAFTER_DIR | --tap-layers L,...]\n"
            "                      [-n MAX_NEW] [--temp T] [--top-p P] [--top-k K] [--seed S] [--ignore-eos]\n"
            "                      [--raw-file R.jsonl] [--shard-tokens N] [--batch N] [--tokenizer PATH]\n"
            "                      [--backend cpu|cuda] [--threads N]\n"
            "\n"
            "Training data for a drafter (SPEC §7): the target continues every prompt (prompt i sampled with seed\n"
            "S + i), then one forward over prompt + continuation records, for every position, the hidden states\n"
            "of the tapped layers and the final-normed hidden state (what the LM head reads), bf16, with the ids\n"
            "and a loss mask (prompt 0, generated 1), in shards of about --shard-tokens tokens and a manifest.\n"
            "Rerunning the same command resumes: complete shards are kept, the rest is made again, bytes equal to\n"
            "an uninterrupted run's.\n"
            "\n"
            "  -m DIR            target (default: the bundled pico-qwen3)\n"
            "  --prompt-file F   generate's prompt-file format (input_ids, prompt text, or chat messages)\n"
            "  --out DIR         the cache directory (created; an existing cache is resumed)\n"
            "  --raw-file R      sequences stored as they are, after the prompts' (same format): nothing generated,\n"
            "                    loss mask 1 on every token (the reference recipe's raw train windows)\n"
            "  -d DIR            tap the layers this drafter reads (config.json target_layer_ids)\n"
            "  --tap-layers L    the layers to tap, e.g. 1,3,5 (-1: the embedding output). Default: -d's, else\n"
            "                    the bundled pico drafter's\n"
            "  -n N              new tokens per prompt at most (default 256; fewer where the context ends)\n"
            "  --temp T          sampling temperature (default 0.7; 0: greedy)\n"
            "  --top-p P         (default 0.95; 1: off)   --top-k K (default 0: off)\n"
            "  --seed S          (default 0)              --ignore-eos: do not stop at stop tokens\n"
            "  --shard-tokens N  a shard closes once it holds N tokens (default 65536)\n"
            "  --batch N         generate N continuations at once on the batched engine (the same tokens, sooner\n"
            "                    where a step of N rows costs about one's: a GPU). Default 0: one at a time. On\n"
            "                    CUDA set DS_CUDA_INVARIANT=1 for the solo run's tokens, which a resumed run needs\n"
            "                    to repeat an interrupted one's bytes (its batches start where it resumes)\n"
            "  --tokenizer PATH  for text and chat prompts (default: TARGET_DIR/tokenizer.json)\n"
            "  --backend B       cpu (default) or cuda (GPU 0)\n"
            "  --threads N       CPU threads (default: all online CPUs)\n");
}

static int parse_args(int argc, char **argv, options *o) {
    enum { O_PROMPT_FILE = 256, O_OUT, O_TEMP, O_TOP_P, O_TOP_K, O_SEED, O_TAPS, O_SHARD, O_BACKEND, O_THREADS,
           O_IGNORE_EOS, O_TOKENIZER, O_BATCH, O_RAW };
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},       {"drafter", required_argument, 0, 'd'},
        {"max-new", required_argument, 0, 'n'},     {"prompt-file", required_argument, 0, O_PROMPT_FILE},
        {"out", required_argument, 0, O_OUT},       {"temp", required_argument, 0, O_TEMP},
        {"top-p", required_argument, 0, O_TOP_P},   {"top-k", required_argument, 0, O_TOP_K},
        {"seed", required_argument, 0, O_SEED},     {"tap-layers", required_argument, 0, O_TAPS},
        {"shard-tokens", required_argument, 0, O_SHARD}, {"backend", required_argument, 0, O_BACKEND},
        {"threads", required_argument, 0, O_THREADS}, {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
        {"tokenizer", required_argument, 0, O_TOKENIZER}, {"batch", required_argument, 0, O_BATCH},
        {"raw-file", required_argument, 0, O_RAW},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    o->max_new = 256;
    o->temp = 0.7f;
    o->top_p = 0.95f;
    o->shard_tokens = 65536;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = cpus > 0 ? (int)cpus : 1;
    optind = 1;
    int c;
    char *end;
#define NUM(dst, conv, what) CLI_NUM("datagen", dst, conv, what)
    long v;
    while ((c = getopt_long(argc, argv, "m:d:n:h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'd': o->drafter = optarg; break;
        case 'n': NUM(v, strtol(optarg, &end, 10), "-n"); o->max_new = v < 0 || v > 1 << 24 ? -1 : (int)v; break;
        case O_PROMPT_FILE: o->prompt_file = optarg; break;
        case O_RAW: o->raw_file = optarg; break;
        case O_OUT: o->out = optarg; break;
        case O_TEMP: NUM(o->temp, strtof(optarg, &end), "--temp"); break;
        case O_TOP_P: NUM(o->top_p, strtof(optarg, &end), "--top-p"); break;
        case O_TOP_K: NUM(v, strtol(optarg, &end, 10), "--top-k"); o->top_k = v < 0 || v > 1 << 30 ? -1 : (int)v; break;
        case O_SEED: NUM(o->seed, strtoull(optarg, &end, 10), "--seed"); break;
        case O_TAPS: o->taps_arg = optarg; break;
        case O_SHARD: NUM(o->shard_tokens, strtoll(optarg, &end, 10), "--shard-tokens"); break;
        case O_THREADS: NUM(v, strtol(optarg, &end, 10), "--threads"); o->threads = v < 1 || v > 4096 ? 0 : (int)v; break;
        case O_IGNORE_EOS: o->ignore_eos = true; break;
        case O_BATCH: NUM(v, strtol(optarg, &end, 10), "--batch"); o->batch = v < 0 || v > 4096 ? -1 : (int)v; break;
        case O_TOKENIZER: o->tokenizer = optarg; break;
        case O_BACKEND: {
            const int b = cli_choice("datagen", "--backend", optarg, CLI_BACKENDS);
            if (b < 0) return 2;
            o->cuda = b == 1;
            break;
        }
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
    }
#undef NUM
    const char *bad = optind < argc                                   ? "unexpected argument"
                      : !o->prompt_file                               ? "--prompt-file is required"
                      : !o->out                                       ? "--out is required"
                      : o->max_new < 0                                ? "-n must be in 0 .. 16777216"
                      : !(o->temp >= 0 && isfinite(o->temp))          ? "--temp must be a finite number >= 0"
                      : !(o->top_p > 0 && o->top_p <= 1)              ? "--top-p must be in (0, 1]"
                      : o->top_k < 0                                  ? "--top-k must be >= 0"
                      : o->seed > (1ull << 53)                        ? "--seed must be at most 2^53 (the manifest is JSON)"
                      : o->shard_tokens < 1                           ? "--shard-tokens must be >= 1"
                      : o->threads < 1                                ? "--threads must be in 1 .. 4096"
                      : o->batch < 0                                  ? "--batch must be in 0 .. 4096"
                      : o->drafter && o->taps_arg                     ? "give -d or --tap-layers, not both"
                                                                      : NULL;
    if (bad) {
        fprintf(stderr, "dspark datagen: %s%s%s\n", bad, optind < argc ? " " : "", optind < argc ? argv[optind] : "");
        return 2;
    }
    if (!o->model) o->model = DS_DEFAULT_MODEL_DIR "/pico-qwen3";
    return 0;
}

/* "1,3,5" -> layers. */
static ds_error *parse_taps(const char *s, int *taps, int *n) {
    *n = 0;
    if (!*s) return NULL;
    for (const char *p = s;;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < -1 || v > 1 << 20) return ds_errorf("--tap-layers '%s': not a list of layers (-1 or more)", s);
        if (*n == DS_MAX_TAPS) return ds_errorf("--tap-layers '%s': at most %d layers", s, DS_MAX_TAPS);
        taps[(*n)++] = (int)v;
        if (!*end) return NULL;
        if (*end != ',') return ds_errorf("--tap-layers '%s': not a comma-separated list", s);
        p = end + 1;
    }
}

/* A drafter's target_layer_ids, checked against the target's depth (num_target_layers). */
static ds_error *drafter_taps(const char *dir, const ds_target *t, int *taps, int *n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *cfg;
    DS_TRY(ds_json_file_read(path, 16u << 20, &cfg));
    int64_t *ids = NULL, layers = t->n_layers;
    int k = 0;
    ds_error *e = ds_cfg_int_list(cfg, path, "target_layer_ids", &ids, &k);
    if (!e && cJSON_GetObjectItemCaseSensitive(cfg, "num_target_layers")) e = ds_cfg_int(cfg, path, "num_target_layers", &layers);
    if (!e && layers != t->n_layers)
        e = ds_errorf("%s: num_target_layers %lld, but the target has %d layers (a drafter for another target?)", path,
                      (long long)layers, t->n_layers);
    if (!e && k > DS_MAX_TAPS) e = ds_errorf("%s: target_layer_ids: %d layers (at most %d)", path, k, DS_MAX_TAPS);
    for (int i = 0; !e && i < k; i++) taps[i] = (int)ids[i];
    if (!e) *n = k;
    free(ids);
    cJSON_Delete(cfg);
    return e;
}

static ds_error *prompt_ids(const options *o, const ds_tokenizer *tok, const ds_prompt *p, int32_t **ids, size_t *n) {
    if (p->kind == DS_PROMPT_IDS) {
        *n = p->n_ids;
        if (!(*ids = malloc((*n ? *n : 1) * sizeof **ids))) return ds_errorf("out of memory");
        memcpy(*ids, p->ids, *n * sizeof **ids);
        return NULL;
    }
    if (!tok) return ds_errorf("a text or chat prompt needs a tokenizer: give --tokenizer PATH or input_ids");
    if (p->kind == DS_PROMPT_TEXT) return ds_tokenizer_encode(tok, p->text, strlen(p->text), false, ids, n);
    ds_chat_family fam;
    char *text;
    DS_TRY(ds_chat_detect(o->model, &fam));
    DS_TRY(ds_chat_render(fam, p->messages, p->n_messages, true, &text));
    ds_error *e = ds_tokenizer_encode(tok, text, strlen(text), false, ids, n);
    free(text);
    return e;
}

typedef struct {
    bool tty, printed_done;
    double last_line;
} progress_state;

static void fmt_time(double s, char *out, size_t cap) {
    if (!(s >= 0) || s > 1e8) {
        snprintf(out, cap, "--:--");
        return;
    }
    const long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(out, cap, "%ld:%02ld", t / 60, t % 60);
}

/* One status line on stderr: redrawn in place on a terminal, every 10 s otherwise. */
static void progress(void *user, const ds_datagen_stats *s) {
    progress_state *ps = user;
    const bool done = s->seqs_done == s->seqs_total;
    if (ps->printed_done || (!ps->tty && !done && s->elapsed_s - ps->last_line < 10)) return;
    ps->printed_done = done;
    ps->last_line = s->elapsed_s;
    const int64_t run_seqs = s->seqs_done - s->seqs_resumed, left = s->seqs_total - s->seqs_done;
    const double el = s->elapsed_s > 0 ? s->elapsed_s : 1e-9;
    char eta[32], elapsed[32];
    fmt_time(run_seqs > 0 ? el / (double)run_seqs * (double)left : -1, eta, sizeof eta);
    fmt_time(s->elapsed_s, elapsed, sizeof elapsed);
    char bar[21];
    const int fill = s->seqs_total ? (int)(20 * s->seqs_done / s->seqs_total) : 20;
    for (int i = 0; i < 20; i++) bar[i] = i < fill ? '#' : '.';
    bar[20] = 0;
    fprintf(stderr, "%sdatagen [%s] %lld/%lld seqs  %lld tok  %.0f tok/s (generated %.0f/s)  %s  ETA %s%s",
            ps->tty ? "\r\033[K" : "", bar, (long long)s->seqs_done, (long long)s->seqs_total, (long long)s->tokens,
            (double)s->tokens / el, (double)s->gen_tokens / el, elapsed, eta, ps->tty ? "" : "\n");
    fflush(stderr);
}

typedef struct {
    ds_prompt_list list, raw;
    ds_backend *be;
    ds_target *t;
    ds_tokenizer *tok;
    ds_datagen_prompt *prompts;
    int32_t **ids;
    ds_gen_batch gen;
} run_state;

static ds_error *run(const options *o, run_state *st) {
    DS_TRY(ds_prompt_file_read(o->prompt_file, &st->list));
    if (o->raw_file) DS_TRY(ds_prompt_file_read(o->raw_file, &st->raw));
    DS_TRY(o->cuda ? ds_backend_cuda_new(0, &st->be) : ds_backend_cpu_new(o->threads, &st->be));
    const ds_target_opts to = {0};
    DS_TRY(ds_target_open(st->be, o->model, &to, &st->t));
    char tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", o->model);
    const char *tp = o->tokenizer ? o->tokenizer : access(tok_path, R_OK) == 0 ? tok_path : NULL;
    if (tp) DS_TRY(ds_tokenizer_load(tp, &st->tok));
    int taps[DS_MAX_TAPS], n_taps = 0;
    if (o->taps_arg) DS_TRY(parse_taps(o->taps_arg, taps, &n_taps));
    else DS_TRY(drafter_taps(o->drafter ? o->drafter : DS_DEFAULT_MODEL_DIR "/pico-qwen3-dspark", st->t, taps, &n_taps));
    const size_t n_gen = st->list.n, n = n_gen + st->raw.n;
    st->prompts = calloc(n ? n : 1, sizeof *st->prompts);
    st->ids = calloc(n ? n : 1, sizeof *st->ids);
    if (!st->prompts || !st->ids) return ds_errorf("out of memory");
    for (size_t i = 0; i < n; i++) {
        const bool raw = i >= n_gen;
        const ds_prompt *p = raw ? &st->raw.items[i - n_gen] : &st->list.items[i];
        size_t k;
        DS_TRY(ds_error_wrap(prompt_ids(o, st->tok, p, &st->ids[i], &k), "%s:%d", raw ? o->raw_file : o->prompt_file,
                             p->line));
        st->prompts[i] = (ds_datagen_prompt){.ids = st->ids[i], .n = (int)k, .line = p->line, .raw = raw};
    }
    if (o->batch > 0) { /* a pool for the longest sequence asked for */
        int ctx = 0;
        for (size_t i = 0; i < n; i++)
            if (st->prompts[i].n + o->max_new + 1 > ctx) ctx = st->prompts[i].n + o->max_new + 1;
        DS_TRY(ds_gen_batch_open(st->be, o->model, o->batch, ctx, &st->gen));
    }
    progress_state ps = {.tty = isatty(2)};
    const ds_datagen_opts dg = {.out_dir = o->out, .target_dir = o->model, .prompt_file = o->prompt_file,
                                .max_new = o->max_new,
                                .sampling = {.temperature = o->temp, .top_k = o->top_k, .top_p = o->top_p},
                                .seed = o->seed, .ignore_eos = o->ignore_eos, .taps = taps, .n_taps = n_taps,
                                .shard_tokens = o->shard_tokens, .batch = o->batch > 0 ? &st->gen : NULL,
                                .progress = progress, .user = &ps};
    ds_datagen_stats s;
    ds_error *e = ds_datagen_run(st->t, st->prompts, n, &dg, &s);
    if (ps.tty) fputc('\n', stderr);
    DS_TRY(e);
    if (s.shards_dropped)
        fprintf(stderr, "dspark datagen: %d listed shard(s) were missing or failed their checks: made again\n",
                s.shards_dropped);
    const double el = s.elapsed_s > 0 ? s.elapsed_s : 1e-9;
    printf("datagen: %s: %lld sequences (%lld resumed), this run %lld tokens (%lld generated) in %.2f s: %.1f tok/s, "
           "%.1f generated tok/s (generation %.2f s, forward + write %.2f s); %lld bytes, %.1f bytes/token\n",
           o->out, (long long)s.seqs_total, (long long)s.seqs_resumed, (long long)s.tokens, (long long)s.gen_tokens,
           s.elapsed_s, (double)s.tokens / el, (double)s.gen_tokens / el, s.gen_s, s.forward_s, (long long)s.bytes,
           s.tokens ? (double)s.bytes / (double)s.tokens : 0.0);
    return NULL;
}

int cmd_datagen(int argc, char **argv) {
    options o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    run_state st = {0};
    ds_error *e = run(&o, &st);
    for (size_t i = 0; st.ids && i < st.list.n + st.raw.n; i++) free(st.ids[i]);
    free(st.ids);
    free(st.prompts);
    ds_tokenizer_free(st.tok);
    ds_gen_batch_close(&st.gen);
    ds_target_free(st.t);
    if (st.be) st.be->ops->destroy(st.be);
    ds_prompt_list_free(&st.list);
    ds_prompt_list_free(&st.raw);
    if (e) {
        fprintf(stderr, "dspark datagen: %s\n", ds_error_message(e));
        ds_error_free(e);
        return 1;
    }
    return 0;
}
