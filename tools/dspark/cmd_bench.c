/* dspark bench: speed of one model (and drafter) on random token ids:
 * prefill tokens/s, autoregressive decode at batch 1 against its memory
 * floor (the weight bytes a token reads, as stored: for a quantized weight
 * its packed words + scales + biases, not the bf16 size it stands for; over
 * the backend's memory bandwidth,
 * measured in the same run before the model loads: CUDA a device-to-device
 * copy, the CPU a read by its thread pool; the datasheet figure, and on CUDA
 * the 4.3 TB/s earlier sessions assumed, beside it), one verify forward of n = 1..γ+1
 * rows, one drafter round (alone, and with the context append of the n
 * rows a verify committed, n = 1..γ+1), and a drafted run with its measured
 * acceptance length τ; --assume-tau X adds the projection τ·t_AR / t_round
 * for an acceptance length the random weights cannot show, where a round is
 * the drafter's with τ context rows and the verify of γ+1. Every timed span
 * ends with ds_backend_check(), which waits for the backend's queued work. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_choice.h"
#include "commands.h"
#include "draft/drafter.h"
#include "io/checkpoint.h"
#include "speculate/generate.h"
#include "speculate/metrics.h"
#include "speculate/round.h"

/* The bandwidth reports assumed before the floor was measured (one card's
 * practical figure, wrong for others): kept beside the measured floor so
 * that earlier percentages in bench/journal stay comparable. */
#define ASSUMED_HBM_BYTES_PER_S 4.3e12
#define MAX_TAUS 8

typedef struct {
    const char *model, *drafter;
    bool cuda, json;
    int threads, prompt_len, decode, reps;
    int bandwidth_mib; /* the bandwidth probe's buffer size (0: no probe) */
    uint64_t seed;
    int n_tau;
    double tau[MAX_TAUS];
} options;

static void usage(FILE *f) {
    fprintf(f, "usage: dspark bench -m MODEL_DIR [-d DRAFTER_DIR] [--backend cpu|cuda] [--prompt-len P]\n"
               "                    [--decode N] [--reps R] [--assume-tau X]... [--seed S] [--threads N]\n"
               "                    [--bandwidth-mib M] [--json]\n"
               "\n"
               "  --prompt-len P   random prompt tokens (default 64)\n"
               "  --decode N       tokens per decoding run (default 64)\n"
               "  --reps R         repetitions of each single-forward timing, median kept (default 5)\n"
               "  --assume-tau X   project the drafted speedup for acceptance length X (repeatable)\n"
               "  --bandwidth-mib M  buffer of the memory bandwidth probe the decode floor divides by\n"
               "                   (default 1024; 0: no probe, the floor at the datasheet figure)\n"
               "  --json           one JSON object instead of the readable report\n");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int parse_args(int argc, char **argv, options *o) {
    enum { O_BACKEND = 256, O_PROMPT_LEN, O_DECODE, O_REPS, O_TAU, O_SEED, O_THREADS, O_JSON, O_BANDWIDTH };
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'}, {"drafter", required_argument, 0, 'd'},
        {"backend", required_argument, 0, O_BACKEND}, {"prompt-len", required_argument, 0, O_PROMPT_LEN},
        {"decode", required_argument, 0, O_DECODE}, {"reps", required_argument, 0, O_REPS},
        {"assume-tau", required_argument, 0, O_TAU}, {"seed", required_argument, 0, O_SEED},
        {"threads", required_argument, 0, O_THREADS}, {"json", no_argument, 0, O_JSON},
        {"bandwidth-mib", required_argument, 0, O_BANDWIDTH}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    o->prompt_len = 64;
    o->decode = 64;
    o->reps = 5;
    o->bandwidth_mib = 1024;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = cpus > 0 ? (int)cpus : 1;
    optind = 1;
    int c;
    char *end;
    long v;
    while ((c = getopt_long(argc, argv, "m:d:h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'd': o->drafter = optarg; break;
        case O_BACKEND: {
            const int b = cli_choice("bench", "--backend", optarg, CLI_BACKENDS);
            if (b < 0) return 2;
            o->cuda = b == 1;
            break;
        }
        case O_PROMPT_LEN:
        case O_DECODE:
        case O_REPS:
        case O_THREADS:
            v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 1 || v > 1000000) {
                fprintf(stderr, "dspark bench: expected a number 1..1000000, got '%s'\n", optarg);
                return 2;
            }
            if (c == O_PROMPT_LEN) o->prompt_len = (int)v;
            else if (c == O_DECODE) o->decode = (int)v;
            else if (c == O_REPS) o->reps = (int)v;
            else o->threads = (int)v;
            break;
        case O_TAU: {
            double x = strtod(optarg, &end);
            if (*end || end == optarg || !(x >= 1 && x <= DS_MAX_GAMMA + 1) || o->n_tau >= MAX_TAUS) {
                fprintf(stderr, "dspark bench: --assume-tau expects 1..%d (at most %d times), got '%s'\n",
                        DS_MAX_GAMMA + 1, MAX_TAUS, optarg);
                return 2;
            }
            o->tau[o->n_tau++] = x;
            break;
        }
        case O_SEED:
            o->seed = strtoull(optarg, &end, 10);
            if (*end || end == optarg) {
                fprintf(stderr, "dspark bench: --seed expects a number, got '%s'\n", optarg);
                return 2;
            }
            break;
        case O_BANDWIDTH:
            v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 0 || v > 1 << 20) {
                fprintf(stderr, "dspark bench: --bandwidth-mib expects 0..%d, got '%s'\n", 1 << 20, optarg);
                return 2;
            }
            o->bandwidth_mib = (int)v;
            break;
        case O_JSON: o->json = true; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc || !o->model) {
        if (optind < argc) fprintf(stderr, "dspark bench: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    return 0;
}

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* The bytes a checkpoint's weights take, as stored and as loaded: a
 * quantized weight's packed words, scales and biases (the CUDA and CPU
 * backends keep those three as stored: their nbytes are what a step reads,
 * not the bf16 size of the weight they stand for), the plain tensors as
 * they are. */
typedef struct {
    double total, per_token;     /* all; what a decode step reads (less an untied input embedding) */
    double words, scales_biases; /* of the quantized weights: packed codes; their groups' scales + biases */
    double plain;                /* every tensor that is not a quantized weight's part */
    double embed;                /* the input embedding's (all of its parts) */
    int n_quant;                 /* quantized weights */
} weight_bytes_t;

/* Bytes a decode step reads: every stored tensor, less an untied input
 * embedding table (one row of it is read per token), with a quantized
 * embedding's scales and biases left out too. */
static weight_bytes_t weight_bytes(const ds_checkpoint *ck) {
    weight_bytes_t w = {0};
    bool head = false;
    for (size_t s = 0; s < ck->n_shards; s++)
        for (size_t i = 0; i < ck->shards[s]->n_tensors; i++) {
            const ds_st_tensor *t = &ck->shards[s]->tensors[i];
            const double nb = (double)t->nbytes;
            w.total += nb;
            if (ends_with(t->name, "embed_tokens.weight") || ends_with(t->name, "embed_tokens.scales") ||
                ends_with(t->name, "embed_tokens.biases"))
                w.embed += nb;
            if (ends_with(t->name, "lm_head.weight")) head = true;
            if (t->dtype == DS_U32 && ends_with(t->name, ".weight")) {
                w.words += nb;
                w.n_quant++;
            } else if (ends_with(t->name, ".scales") || ends_with(t->name, ".biases")) {
                w.scales_biases += nb;
            } else {
                w.plain += nb;
            }
        }
    w.per_token = head ? w.total - w.embed : w.total;
    return w;
}

/* The checkpoint's quantization block ({"bits", "group_size"}) into o, or
 * "quantization": null for a plain checkpoint. */
static void add_quantization(cJSON *o, const ds_checkpoint *ck, const weight_bytes_t *w) {
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(ck->config, "quantization");
    if (!q) q = cJSON_GetObjectItemCaseSensitive(ck->config, "quantization_config");
    if (!cJSON_IsObject(q) || !w->n_quant) {
        cJSON_AddNullToObject(o, "quantization");
        return;
    }
    cJSON *j = cJSON_AddObjectToObject(o, "quantization");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(q, "bits"), *g = cJSON_GetObjectItemCaseSensitive(q, "group_size");
    if (cJSON_IsNumber(b)) cJSON_AddNumberToObject(j, "bits", b->valuedouble);
    if (cJSON_IsNumber(g)) cJSON_AddNumberToObject(j, "group_size", g->valuedouble);
    cJSON_AddNumberToObject(j, "weights", w->n_quant);
    cJSON_AddNumberToObject(j, "packed_bytes", w->words);
    cJSON_AddNumberToObject(j, "scales_biases_bytes", w->scales_biases);
    cJSON_AddNumberToObject(j, "plain_bytes", w->plain);
}

typedef struct {
    ds_backend *be;
    ds_target *t;
    ds_drafter *d;
    int32_t *prompt;
    ds_bandwidth bw;     /* the probe's result (bytes_per_s 0: no probe, or it failed) */
    char bw_error[512];  /* why the probe failed, or "" */
} bench_state;

/* One timed forward of n rows at pos0 (logits for the last n_logits), synchronized. */
static double last_enqueue_s; /* host time of the last timed forward's calls, before the wait */

static ds_error *timed_forward(bench_state *b, const int32_t *ids, int n, int pos0, int n_logits, double *secs) {
    double t0 = ds_now_s();
    DS_TRY(ds_target_forward(b->t, ids, n, pos0, n_logits));
    last_enqueue_s = ds_now_s() - t0;
    DS_TRY(ds_backend_check(b->be));
    *secs = ds_now_s() - t0;
    return NULL;
}

/* One timed drafter round with n context rows (the taps of n rows after
 * the prompt, left by a forward), synchronized: the drafter's round alone,
 * or (loop) the greedy round as the generation loop runs it (ds_round): the
 * drafted tokens kept on the backend, then the verify of γ+1 rows with the
 * acceptance there, one wait and one copy for both. */
static ds_error *context_round(bench_state *b, int P, int n, bool loop, ds_rng *rng, double *secs) {
    ds_drafter *d = b->d;
    ds_target *t = b->t;
    const int32_t anchor = b->prompt[P + n];
    const ds_sampling greedy = {.top_p = 1.0f};
    const double t0 = ds_now_s();
    ds_error *e;
    if (loop) {
        const ds_round_params rp = {.sampling = greedy, .ignore_stop = true};
        ds_round_state st = {.anchor = anchor, .start = P + n, .ctx_pos0 = P, .ctx_n = n};
        ds_round_result rr;
        e = ds_round(t, d, &rp, true, rng, &st, &rr);
    } else {
        ds_proposal prop;
        e = ds_drafter_round(d, t->taps, P, n, anchor, P + n, &greedy, 0, false, rng, &prop);
    }
    if (!e) e = ds_backend_check(b->be);
    *secs = ds_now_s() - t0;
    return e;
}

static ds_error *run_bench(const options *o, bench_state *b, cJSON *root) {
    ds_target *t = b->t;
    const int P = o->prompt_len, R = o->reps;
    ds_rng rng;
    ds_rng_seed(&rng, o->seed);
    /* the prompt, then the rows verified after it (at most γ+1) and the anchor after them */
    const int n_ids = P + DS_MAX_GAMMA + 2;
    b->prompt = malloc((size_t)n_ids * sizeof *b->prompt);
    double *tm = malloc((size_t)R * sizeof *tm);
    ds_gen_result ar = {0}; /* plain decoding's run, its tokens kept for the drafted run's check */
    if (!b->prompt || !tm) {
        free(tm);
        return ds_errorf("out of memory");
    }
    for (int i = 0; i < n_ids; i++) b->prompt[i] = (int32_t)(ds_rng_next(&rng) % (uint64_t)t->vocab);
    ds_error *e = NULL;

    const weight_bytes_t wb = weight_bytes(t->ck);
    const double wb_all = wb.total, wb_tok = wb.per_token;
    cJSON *m = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(m, "dir", o->model);
    cJSON_AddStringToObject(m, "type", t->model_type);
    cJSON_AddNumberToObject(m, "layers", t->n_layers);
    cJSON_AddNumberToObject(m, "hidden", t->hidden);
    cJSON_AddNumberToObject(m, "vocab", t->vocab);
    cJSON_AddNumberToObject(m, "weight_bytes", wb_all);
    cJSON_AddNumberToObject(m, "bytes_read_per_token", wb_tok);
    add_quantization(m, t->ck, &wb);
    if (b->d) { /* the drafter's weights as stored (quantized: words + scales + biases) */
        const weight_bytes_t dw = weight_bytes(b->d->ck);
        cJSON *dj = cJSON_AddObjectToObject(root, "drafter_model");
        cJSON_AddStringToObject(dj, "dir", o->drafter);
        cJSON_AddNumberToObject(dj, "weight_bytes", dw.total);
        add_quantization(dj, b->d->ck, &dw);
    }
    cJSON_AddStringToObject(root, "backend", t->be->ops->name);
    cJSON_AddNumberToObject(root, "prompt_len", P);
    cJSON_AddNumberToObject(root, "decode_tokens", o->decode);
    cJSON_AddNumberToObject(root, "reps", R);
    cJSON *bw = cJSON_AddObjectToObject(root, "memory_bandwidth");
    if (b->bw.bytes_per_s > 0) {
        cJSON_AddNumberToObject(bw, "measured_bytes_per_s", b->bw.bytes_per_s);
        cJSON_AddStringToObject(bw, "method", b->bw.method);
        cJSON_AddNumberToObject(bw, "buffer_bytes", b->bw.buffer_bytes);
        cJSON_AddNumberToObject(bw, "reps", R < 3 ? 3 : R);
    } else {
        cJSON_AddNullToObject(bw, "measured_bytes_per_s");
        cJSON_AddStringToObject(bw, "probe", b->bw_error[0] ? b->bw_error : "not run: --bandwidth-mib 0");
    }
    if (b->bw.device[0]) cJSON_AddStringToObject(bw, "device", b->bw.device);
    if (b->bw.peak_bytes_per_s > 0) {
        cJSON_AddNumberToObject(bw, "datasheet_bytes_per_s", b->bw.peak_bytes_per_s);
        cJSON_AddStringToObject(bw, "datasheet_source", "memory clock x bus width x 2, from the device's attributes");
    } else {
        cJSON_AddNullToObject(bw, "datasheet_bytes_per_s");
    }
    if (!strcmp(t->be->ops->name, "cuda")) cJSON_AddNumberToObject(bw, "assumed_bytes_per_s", ASSUMED_HBM_BYTES_PER_S);

    /* Prefill: one forward over the whole prompt (a warm-up first). */
    double s;
    if (!e) e = timed_forward(b, b->prompt, P, 0, 1, &s);
    for (int r = 0; r < R && !e; r++) e = timed_forward(b, b->prompt, P, 0, 1, &tm[r]);
    if (e) goto done;
    double pre = median(tm, R);
    cJSON *pf = cJSON_AddObjectToObject(root, "prefill");
    cJSON_AddNumberToObject(pf, "seconds", pre);
    cJSON_AddNumberToObject(pf, "tokens_per_s", P / pre);

    /* Plain decoding at batch 1 (greedy, past stop tokens). */
    ds_gen_params gp = {.max_new = o->decode, .sampling = {.top_p = 1.0f}, .seed = o->seed, .ignore_stop = true};
    /* One untimed pass first, as llama-bench warms up: the first decode
     * steps after loading run slower (clocks and caches settling), which is
     * not the steady state a user sees. */
    e = ds_generate(t, NULL, b->prompt, P, &gp, NULL, NULL, &ar);
    ds_gen_result_free(&ar);
    memset(&ar, 0, sizeof ar);
    if (!e) e = ds_generate(t, NULL, b->prompt, P, &gp, NULL, NULL, &ar);
    if (!e) e = ds_backend_check(b->be);
    double ar_tok = ar.n_tokens > 1 ? (ar.total_s - ar.prefill_s) / (ar.n_tokens - 1) : 0;
    if (e) goto done;
    if (!(ar_tok > 0)) {
        e = ds_errorf("decoding produced fewer than 2 tokens (--decode %d)", o->decode);
        goto done;
    }
    /* The same steps by hand (forward + argmax, nothing else): what the
     * generation loop adds on top of the model shows as the difference. */
    double bare_tok = 0;
    {
        if (!e) e = ds_target_forward(t, b->prompt, P, 0, 1);
        if (!e) e = ds_backend_check(b->be); /* the prompt's forward done before the clock starts */
        int32_t tok = b->prompt[P - 1];
        const int n = o->decode > 1 ? o->decode : 2;
        double t0 = ds_now_s();
        for (int i = 0; i < n && !e; i++) {
            e = ds_target_forward_argmax(t, &tok, 1, P + i, 1, &tok); /* one step region (graph) on the GPU */
            if (!e) e = ds_backend_check(b->be);
        }
        bare_tok = (ds_now_s() - t0) / n;
        if (e) goto done;
        if (getenv("DS_BENCH_DIAG")) { /* where a decode step's time goes (diagnostics) */
            double ta = ds_now_s();
            for (int i = 0; i < n && !e; i++) {
                e = ds_target_forward(t, &tok, 1, P + i, 1);
                if (!e) e = ds_backend_check(b->be);
            }
            double tb = ds_now_s();
            for (int i = 0; i < n && !e; i++) {
                e = ds_target_forward(t, &tok, 1, P, 1);
                if (!e) e = ds_backend_check(b->be);
            }
            double tc = ds_now_s();
            for (int i = 0; i < n && !e; i++) {
                e = ds_target_forward(t, &tok, 1, P, 1);
                if (!e) t->be->ops->argmax(t->be, ds_rows(t->logits, 0, 1), &tok);
            }
            double td = ds_now_s();
            for (int i = 0; i < n && !e; i++) e = ds_target_forward(t, &tok, 1, P + i, 1);
            if (!e) e = ds_backend_check(b->be);
            double te = ds_now_s();
            fprintf(stderr, "diag: forward+check at growing positions %.3f ms; at a fixed position %.3f ms; "
                            "fixed position + argmax %.3f ms; growing, no waits at all %.3f ms\n",
                    (tb - ta) / n * 1e3, (tc - tb) / n * 1e3, (td - tc) / n * 1e3, (te - td) / n * 1e3);
            if (e) goto done;
        }
    }
    /* The floor: every weight byte a step reads, at the bandwidth measured
     * above; the datasheet's where there is no measurement. */
    const bool cuda = !strcmp(t->be->ops->name, "cuda");
    const double peak = b->bw.peak_bytes_per_s, measured = b->bw.bytes_per_s;
    const char *basis = measured > 0 ? "measured" : peak > 0 ? "datasheet" : cuda ? "assumed" : NULL;
    const double floor_bw = measured > 0 ? measured : peak > 0 ? peak : cuda ? ASSUMED_HBM_BYTES_PER_S : 0;
    cJSON *a = cJSON_AddObjectToObject(root, "ar_decode");
    cJSON_AddNumberToObject(a, "ms_per_token", ar_tok * 1e3);
    cJSON_AddNumberToObject(a, "tokens_per_s", 1 / ar_tok);
    if (basis) {
        const double floor_s = wb_tok / floor_bw;
        cJSON_AddStringToObject(a, "floor_basis", basis);
        cJSON_AddNumberToObject(a, "floor_bytes_per_s", floor_bw);
        cJSON_AddNumberToObject(a, "floor_ms_per_token", floor_s * 1e3);
        cJSON_AddNumberToObject(a, "pct_of_floor", 100 * floor_s / ar_tok);
    }
    if (peak > 0) {
        cJSON_AddNumberToObject(a, "datasheet_floor_ms_per_token", wb_tok / peak * 1e3);
        cJSON_AddNumberToObject(a, "pct_of_datasheet_floor", 100 * wb_tok / peak / ar_tok);
    }
    if (cuda) { /* the floor reports divided by before it was measured */
        cJSON_AddNumberToObject(a, "assumed_floor_ms_per_token", wb_tok / ASSUMED_HBM_BYTES_PER_S * 1e3);
        cJSON_AddNumberToObject(a, "pct_of_assumed_floor", 100 * wb_tok / ASSUMED_HBM_BYTES_PER_S / ar_tok);
    }
    cJSON_AddNumberToObject(a, "bare_step_ms", bare_tok * 1e3);

    /* Verify: a forward of n rows after the prompt, n = 1..γ+1 (the target's
     * taps set as for drafting when a drafter is given). */
    const int G = b->d ? b->d->gamma : 7;
    if (b->d && (e = ds_target_set_taps(t, b->d->tap_layers, b->d->n_taps))) goto done;
    if ((e = timed_forward(b, b->prompt, P, 0, 1, &s))) goto done;
    cJSON *vf = cJSON_AddArrayToObject(root, "verify");
    double verify_full = 0;
    for (int n = 1; n <= G + 1 && n <= t->max_logit_rows && !e; n++) {
        e = timed_forward(b, b->prompt + P, n, P, n, &s);
        for (int r = 0; r < R && !e; r++) e = timed_forward(b, b->prompt + P, n, P, n, &tm[r]);
        if (e) break;
        double v = median(tm, R);
        cJSON *it = cJSON_CreateObject();
        cJSON_AddNumberToObject(it, "rows", n);
        cJSON_AddNumberToObject(it, "ms", v * 1e3);
        cJSON_AddNumberToObject(it, "vs_ar_step", v / ar_tok);
        /* When this is close to ms, the host's launches, not the GPU, set the pace. */
        cJSON_AddNumberToObject(it, "host_enqueue_ms", last_enqueue_s * 1e3);
        cJSON_AddItemToArray(vf, it);
        verify_full = v;
    }
    if (e || !b->d) goto done;

    /* One drafter round: propose a block after the prompt's context. */
    ds_drafter *d = b->d;
    e = ds_target_forward(t, b->prompt, P, 0, 1);
    if (!e) e = ds_drafter_append(d, t->taps, 0, P);
    ds_sampling greedy = {.top_p = 1.0f};
    ds_proposal prop;
    if (!e) e = ds_drafter_propose(d, b->prompt[P], P, &greedy, 0, &rng, &prop);
    for (int r = 0; r < R && !e; r++) {
        double t0 = ds_now_s();
        e = ds_drafter_propose(d, b->prompt[P], P, &greedy, 0, &rng, &prop);
        if (!e) e = ds_backend_check(b->be);
        tm[r] = ds_now_s() - t0;
    }
    if (e) goto done;
    const double draft = median(tm, R), round_s = draft + verify_full;
    cJSON *dr = cJSON_AddObjectToObject(root, "drafter");
    cJSON_AddStringToObject(dr, "dir", o->drafter);
    cJSON_AddNumberToObject(dr, "gamma", G);
    cJSON_AddNumberToObject(dr, "draft_round_ms", draft * 1e3);
    cJSON_AddNumberToObject(dr, "verify_gamma_plus_1_ms", verify_full * 1e3);
    cJSON_AddNumberToObject(dr, "round_ms", round_s * 1e3);

    /* A round of the generation loop also appends to the drafter's context
     * the rows its verify committed (the target's taps of those n rows: fc,
     * hidden_norm and every layer's K/V), in the same region as the block:
     * the drafter's round with n context rows, after a verify of n rows at
     * the prompt's end (which leaves their taps), n = 1..γ+1; and the round
     * as the greedy loop runs it (loop_round_ms). */
    const int n_ctx_max = G + 1 < t->max_logit_rows ? G + 1 : t->max_logit_rows;
    double with_ctx[DS_MAX_GAMMA + 2] = {0}, loop_round[DS_MAX_GAMMA + 2] = {0};
    cJSON *wc = cJSON_AddArrayToObject(dr, "draft_with_context_ms"), *lr = cJSON_AddArrayToObject(dr, "loop_round_ms");
    for (int n = 1; n <= n_ctx_max && !e; n++) {
        e = ds_target_forward(t, b->prompt + P, n, P, n);
        for (int loop = 0; loop < 2 && !e; loop++) {
            for (int r = -1; r < R && !e; r++) /* r = -1: untimed (records the regions on the GPU) */
                e = context_round(b, P, n, loop, &rng, r >= 0 ? &tm[r] : &s);
            if (e) break;
            double *v = loop ? loop_round : with_ctx;
            v[n] = median(tm, R);
            cJSON *it = cJSON_CreateObject();
            cJSON_AddNumberToObject(it, "context_rows", n);
            cJSON_AddNumberToObject(it, "ms", v[n] * 1e3);
            cJSON_AddNumberToObject(it, "vs_ar_step", v[n] / ar_tok);
            cJSON_AddItemToArray(loop ? lr : wc, it);
        }
    }
    if (e) goto done;

    /* A drafted run, measured (τ is whatever these weights give). */
    ds_gen_result sp = {0};
    double run_round_s = 0;
    /* An untimed pass first, as for plain decoding; with CUDA graphs it also
     * records the verify lengths and drafter context sizes the run meets,
     * which a short timed run would otherwise pay for. */
    e = ds_generate(t, d, b->prompt, P, &gp, NULL, NULL, &sp);
    ds_gen_result_free(&sp);
    memset(&sp, 0, sizeof sp);
    if (!e) e = ds_generate(t, d, b->prompt, P, &gp, NULL, NULL, &sp);
    if (!e) {
        ds_metrics mt = {0};
        ds_metrics_add(&mt, &sp);
        double dec = sp.total_s - sp.prefill_s;
        cJSON *run = cJSON_AddObjectToObject(root, "drafted_run");
        cJSON_AddNumberToObject(run, "tokens", sp.n_tokens);
        cJSON_AddNumberToObject(run, "rounds", sp.rounds);
        cJSON_AddNumberToObject(run, "tau_measured", ds_metrics_tau(&mt));
        cJSON_AddNumberToObject(run, "decode_tokens_per_s", dec > 0 && sp.n_tokens > 1 ? (sp.n_tokens - 1) / dec : 0);
        run_round_s = sp.rounds ? dec / sp.rounds : 0;
        cJSON_AddNumberToObject(run, "ms_per_round", run_round_s * 1e3);
        cJSON_AddNumberToObject(run, "draft_s", sp.draft_s);
        cJSON_AddNumberToObject(run, "verify_s", sp.verify_s);
        cJSON_AddNumberToObject(run, "speedup_vs_ar", dec > 0 && sp.n_tokens > 1 ? ar_tok * (sp.n_tokens - 1) / dec : 0);
        /* Lossless: the drafted run's greedy tokens against plain decoding's, at this model's shapes (the small
         * models of the tests take other kernels on the GPU). */
        int same = 0;
        while (same < ar.n_tokens && same < sp.n_tokens && sp.tokens[same] == ar.tokens[same]) same++;
        cJSON_AddBoolToObject(run, "tokens_equal_ar", same == ar.n_tokens && sp.n_tokens == ar.n_tokens);
        cJSON_AddNumberToObject(run, "tokens_equal_ar_prefix", same);
    }
    ds_gen_result_free(&sp);
    if (e) goto done;
    cJSON *pj = cJSON_AddArrayToObject(root, "projection");
    for (int i = 0; i < o->n_tau; i++) {
        cJSON *it = cJSON_CreateObject();
        cJSON_AddStringToObject(it, "kind", "projection: tau assumed, not measured");
        cJSON_AddNumberToObject(it, "tau", o->tau[i]);
        /* The round that commits tau tokens a round: the drafter's with tau context rows (interpolated between
         * the whole row counts around it), then the verify of γ+1. */
        const double x = o->tau[i] < 1 ? 1 : o->tau[i] > n_ctx_max ? n_ctx_max : o->tau[i];
        const int lo = (int)x, hi = lo < n_ctx_max ? lo + 1 : lo;
        const double tr = with_ctx[lo] + (x - lo) * (with_ctx[hi] - with_ctx[lo]) + verify_full;
        cJSON_AddNumberToObject(it, "round_ms", tr * 1e3);
        cJSON_AddNumberToObject(it, "tokens_per_s", o->tau[i] / tr);
        cJSON_AddNumberToObject(it, "speedup_vs_ar", o->tau[i] * ar_tok / tr);
        /* The same with the round as the loop runs it (one wait for the drafter's round and the verify). */
        const double tl = loop_round[lo] + (x - lo) * (loop_round[hi] - loop_round[lo]);
        cJSON_AddNumberToObject(it, "loop_round_ms", tl * 1e3);
        cJSON_AddNumberToObject(it, "speedup_vs_ar_loop_round", o->tau[i] * ar_tok / tl);
        /* The same with the drafter's round alone (no context rows). */
        cJSON_AddNumberToObject(it, "speedup_vs_ar_no_context", o->tau[i] * ar_tok / round_s);
        /* The same with the drafted run's whole round (drafter context append and host work included). */
        if (run_round_s > 0) {
            cJSON_AddNumberToObject(it, "tokens_per_s_run_round", o->tau[i] / run_round_s);
            cJSON_AddNumberToObject(it, "speedup_vs_ar_run_round", o->tau[i] * ar_tok / run_round_s);
        }
        cJSON_AddItemToArray(pj, it);
    }
done:
    ds_gen_result_free(&ar);
    if (!e) { /* whether the steps ran as recorded CUDA graphs (DS_CUDA_GRAPHS=0: op by op) */
        ds_region_stats rs = ds_backend_region_stats(b->be);
        cJSON *g = cJSON_AddObjectToObject(root, "graphs");
        cJSON_AddBoolToObject(g, "enabled", rs.enabled);
        cJSON_AddBoolToObject(g, "used", rs.replays > 0);
        cJSON_AddNumberToObject(g, "captures", (double)rs.captures);
        cJSON_AddNumberToObject(g, "replays", (double)rs.replays);
        cJSON_AddNumberToObject(g, "regions_op_by_op", (double)rs.eager);
        cJSON_AddNumberToObject(g, "graphs_held", (double)rs.graphs);
        cJSON *wc = cJSON_AddObjectToObject(root, "weight_copies"); /* CUDA: the ring's boxes, the draft head's int8 */
        cJSON_AddNumberToObject(wc, "tensors", (double)rs.weight_copies);
        cJSON_AddNumberToObject(wc, "bytes", (double)rs.weight_copy_bytes);
    }
    free(tm);
    return e;
}

/* A bandwidth in the unit that reads well: TB/s for a GPU, GB/s for a CPU. */
static const char *rate(double bytes_per_s, char *buf, size_t cap) {
    if (bytes_per_s >= 1e12) snprintf(buf, cap, "%.3f TB/s", bytes_per_s / 1e12);
    else snprintf(buf, cap, "%.1f GB/s", bytes_per_s / 1e9);
    return buf;
}

static void print_report(const cJSON *r) {
#define NUM(o, k) cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k))
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(r, "model"), *pf = cJSON_GetObjectItemCaseSensitive(r, "prefill"),
                *a = cJSON_GetObjectItemCaseSensitive(r, "ar_decode"), *dr = cJSON_GetObjectItemCaseSensitive(r, "drafter"),
                *run = cJSON_GetObjectItemCaseSensitive(r, "drafted_run"), *it;
    printf("model      %s (%s, %.0f layers, hidden %.0f), %.3f GB of weights, %.3f GB read per token\n",
           cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "dir")),
           cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "type")), NUM(m, "layers"), NUM(m, "hidden"),
           NUM(m, "weight_bytes") / 1e9, NUM(m, "bytes_read_per_token") / 1e9);
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(m, "quantization");
    if (cJSON_IsObject(q))
        printf("quantized  %.0f weights, %.0f-bit, group %.0f: %.3f GB of codes, %.3f GB of scales + biases, %.3f GB "
               "plain\n",
               NUM(q, "weights"), NUM(q, "bits"), NUM(q, "group_size"), NUM(q, "packed_bytes") / 1e9,
               NUM(q, "scales_biases_bytes") / 1e9, NUM(q, "plain_bytes") / 1e9);
    const cJSON *dm = cJSON_GetObjectItemCaseSensitive(r, "drafter_model");
    if (dm) {
        const cJSON *dq = cJSON_GetObjectItemCaseSensitive(dm, "quantization");
        printf("drafter    %s, %.3f GB of weights", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(dm, "dir")),
               NUM(dm, "weight_bytes") / 1e9);
        if (cJSON_IsObject(dq)) printf(" (%.0f-bit, group %.0f)", NUM(dq, "bits"), NUM(dq, "group_size"));
        printf("\n");
    }
    printf("backend    %s\n", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "backend")));
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(r, "graphs");
    if (g) {
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(g, "enabled")))
            printf("graphs     %s: %.0f captured, %.0f steps replayed, %.0f regions op by op\n",
                   cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(g, "used")) ? "used" : "on but unused",
                   NUM(g, "captures"), NUM(g, "replays"), NUM(g, "regions_op_by_op"));
        else
            printf("graphs     not used (%s)\n", strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "backend")), "cuda")
                                                      ? "this backend has none"
                                                      : "DS_CUDA_GRAPHS=0, DS_CUDA_PROFILE or DS_CUDA_RING_TRACE");
    }
    const cJSON *wc = cJSON_GetObjectItemCaseSensitive(r, "weight_copies");
    if (wc && NUM(wc, "tensors") > 0)
        printf("layout     %.0f weight copies in the backend's own layouts (CUDA: the ring's 16 x 256 boxes, the draft "
               "head's int8 bounds): %.3f GB more device memory\n",
               NUM(wc, "tensors"), NUM(wc, "bytes") / 1e9);
    printf("prefill    %.0f tokens: %.2f ms, %.1f tokens/s\n", NUM(r, "prompt_len"), NUM(pf, "seconds") * 1e3,
           NUM(pf, "tokens_per_s"));
    const cJSON *bw = cJSON_GetObjectItemCaseSensitive(r, "memory_bandwidth");
    const bool measured = cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(bw, "measured_bytes_per_s")),
               datasheet = cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(bw, "datasheet_bytes_per_s"));
    const char *device = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(bw, "device"));
    char r1[32], r2[32];
    if (measured)
        printf("memory     %s measured (%s, buffers of %.2f GB, best of %.0f)%s%s",
               rate(NUM(bw, "measured_bytes_per_s"), r1, sizeof r1),
               cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(bw, "method")), NUM(bw, "buffer_bytes") / 1e9,
               NUM(bw, "reps"), device ? " on " : "", device ? device : "");
    else
        printf("memory     not measured: %s", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(bw, "probe")));
    if (datasheet) printf("; datasheet %s", rate(NUM(bw, "datasheet_bytes_per_s"), r1, sizeof r1));
    printf("\n");
    printf("AR decode  %.3f ms/token, %.2f tokens/s", NUM(a, "ms_per_token"), NUM(a, "tokens_per_s"));
    const char *basis = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(a, "floor_basis"));
    if (basis)
        printf("; floor %.3f ms/token at the %s %s (%.0f%% of it reached)", NUM(a, "floor_ms_per_token"), basis,
               rate(NUM(a, "floor_bytes_per_s"), r2, sizeof r2), NUM(a, "pct_of_floor"));
    if (datasheet && measured)
        printf("; %.0f%% of the datasheet's floor", NUM(a, "pct_of_datasheet_floor"));
    if (cJSON_GetObjectItemCaseSensitive(a, "pct_of_assumed_floor") && strcmp(basis ? basis : "", "assumed"))
        printf("; %.0f%% of the %.1f TB/s floor assumed before", NUM(a, "pct_of_assumed_floor"),
               ASSUMED_HBM_BYTES_PER_S / 1e12);
    printf("\n");
    printf("bare step  %.3f ms (one forward + argmax, outside the generation loop)\n", NUM(a, "bare_step_ms"));
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(r, "verify"))
        printf("verify     n=%-2.0f %.3f ms (%.2fx an AR step)\n", NUM(it, "rows"), NUM(it, "ms"), NUM(it, "vs_ar_step"));
    if (dr) {
        printf("draft      round %.3f ms (gamma %.0f, no context rows); with verify of gamma+1: %.3f ms = %.3f AR "
               "steps\n",
               NUM(dr, "draft_round_ms"), NUM(dr, "gamma"), NUM(dr, "round_ms"),
               NUM(dr, "round_ms") / NUM(a, "ms_per_token"));
        printf("draft      with the context append of n rows:");
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(dr, "draft_with_context_ms"))
            printf(" n=%.0f %.3f", NUM(it, "context_rows"), NUM(it, "ms"));
        printf(" ms\n");
        printf("round      as the loop runs it (draft with n context rows + verify of gamma+1, one wait):");
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(dr, "loop_round_ms"))
            printf(" n=%.0f %.3f", NUM(it, "context_rows"), NUM(it, "ms"));
        printf(" ms\n");
    }
    if (run) printf("drafted    measured tau %.3f: %.2f tokens/s, %.2fx AR; its whole round %.3f ms = %.3f AR steps\n",
                    NUM(run, "tau_measured"), NUM(run, "decode_tokens_per_s"), NUM(run, "speedup_vs_ar"),
                    NUM(run, "ms_per_round"), NUM(run, "ms_per_round") / NUM(a, "ms_per_token"));
    if (run)
        printf("lossless   drafted tokens %s plain decoding's (first %.0f equal)\n",
               cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(run, "tokens_equal_ar")) ? "==" : "DIFFER FROM",
               NUM(run, "tokens_equal_ar_prefix"));
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(r, "projection"))
        printf("projection tau %.2f (assumed): round %.3f ms = %.3f AR steps (drafter with tau context rows + verify of "
               "gamma+1), %.1f tokens/s, %.2fx AR (as the loop runs it: %.3f AR steps, %.2fx; no context rows: %.2fx; "
               "the drafted run's whole round: %.2fx)\n",
               NUM(it, "tau"), NUM(it, "round_ms"), NUM(it, "round_ms") / NUM(a, "ms_per_token"), NUM(it, "tokens_per_s"),
               NUM(it, "speedup_vs_ar"), NUM(it, "loop_round_ms") / NUM(a, "ms_per_token"),
               NUM(it, "speedup_vs_ar_loop_round"), NUM(it, "speedup_vs_ar_no_context"),
               NUM(it, "speedup_vs_ar_run_round"));
#undef NUM
}

int cmd_bench_batch(int argc, char **argv); /* cmd_bench_batch.c */

int cmd_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++) /* many requests at once: the batched engine's bench */
        if (!strncmp(argv[i], "--concurrency", 13)) return cmd_bench_batch(argc, argv);
    options o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    bench_state b = {0};
    cJSON *root = cJSON_CreateObject();
    ds_error *e = o.cuda ? ds_backend_cuda_new(0, &b.be) : ds_backend_cpu_new(o.threads, &b.be);
    /* The bandwidth first, while no model holds the memory or the caches. A
     * failed probe (no memory for its buffers) is reported, not fatal: the
     * floor falls back to the datasheet figure. */
    if (!e && o.bandwidth_mib > 0) {
        ds_error *pe = ds_backend_bandwidth(b.be, (size_t)o.bandwidth_mib << 20, o.reps < 3 ? 3 : o.reps, &b.bw);
        if (pe) {
            snprintf(b.bw_error, sizeof b.bw_error, "%s", ds_error_message(pe));
            fprintf(stderr, "dspark bench: memory bandwidth not measured: %s\n", b.bw_error);
            ds_error_free(pe);
        }
    }
    int rows = o.prompt_len > DS_MAX_GAMMA + 1 ? o.prompt_len : DS_MAX_GAMMA + 1;
    ds_target_opts topts = {.max_rows = rows, .max_logit_rows = DS_MAX_GAMMA + 1};
    if (!e) e = ds_target_open(b.be, o.model, &topts, &b.t);
    ds_drafter_opts dopts = {.max_rows = rows};
    if (!e && o.drafter) e = ds_drafter_open(b.be, o.drafter, b.t, &dopts, &b.d);
    if (!e && o.prompt_len + o.decode + DS_MAX_GAMMA + 1 >= b.t->max_ctx)
        e = ds_errorf("--prompt-len %d + --decode %d does not fit the model's context of %d", o.prompt_len, o.decode,
                      b.t->max_ctx);
    if (!e) e = run_bench(&o, &b, root);
    if (e) {
        fprintf(stderr, "dspark bench: %s\n", ds_error_message(e));
        ds_error_free(e);
        rc = 1;
    } else if (o.json) {
        char *s = cJSON_PrintUnformatted(root);
        puts(s);
        free(s);
    } else {
        print_report(root);
    }
    cJSON_Delete(root);
    free(b.prompt);
    ds_drafter_free(b.d);
    ds_target_free(b.t);
    if (b.be) b.be->ops->destroy(b.be);
    return rc;
}
