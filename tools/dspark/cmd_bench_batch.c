/* dspark bench --concurrency: output tokens/s of the batched engine with C
 * requests at once, for plain decoding (AR), fixed-gamma drafting and
 * Algorithm 1, every arm on the same models, prompts and pool. Each
 * request: a random prompt of --prompt-len ids and --decode new tokens (stop
 * tokens ignored, so every arm emits the same count). Algorithm 1 weighs
 * drafts against the target's step cost, profiled first on this machine
 * (cached with --sps-cache). --sim-acceptance FILE replaces the drafter's
 * confidences and the verifier's verdicts by draws from a profile (for
 * synthetic weights, whose drafts the target never accepts): every kernel
 * still runs, and the report says "simulated". --tp N splits the target
 * across N ranks (batch_tp.h: every step on all of them). */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/comm.h"
#include "batch/batch_tp.h"
#include "batch/kv_budget.h"
#include "cli_choice.h"
#include "commands.h"
#include "io/checkpoint.h"
#include "size_arg.h"
#include "speculate/ceiling.h"

#define MAX_LEVELS 16
#define DEFAULT_MODEL DS_DEFAULT_MODEL_DIR "/pico-qwen3"
#define DEFAULT_DRAFTER DS_DEFAULT_MODEL_DIR "/pico-qwen3-dspark"

typedef struct {
    const char *model, *drafter, *sim_path, *sps_cache, *trace_path;
    FILE *trace; /* --trace: opened by the command */
    bool cuda, json, arm[3];
    int threads, prompt_len, decode, page_rows, step_rows, n_levels;
    int tp; /* --tp N: the target split across N ranks (1: none) */
    int levels[MAX_LEVELS];
    float temperature;
    uint64_t seed;
    int64_t kv_mem; /* --kv-mem SIZE: the pool from a byte budget (0: every level's requests whole) */
} options;

enum { ARM_AR, ARM_FIXED, ARM_ALG1 };
static const char *const arm_names[] = {"AR", "fixed", "Algorithm 1"};

static void usage(FILE *f) {
    fprintf(f, "usage: dspark bench --concurrency C1,C2,... [-m MODEL_DIR] [-d DRAFTER_DIR] [--backend cpu|cuda]\n"
               "                    [--prompt-len P] [--decode N] [--arms ar,fixed,confidence] [--temp T]\n"
               "                    [--sim-acceptance FILE] [--sps-cache FILE] [--page-rows R] [--step-rows R]\n"
               "                    [--kv-mem SIZE] [--seed S] [--threads N] [--tp N] [--trace FILE] [--json]\n"
               "\n"
               "  --concurrency    requests in flight, one run per level (e.g. 1,8,32,64,128,256)\n"
               "  --prompt-len P   random prompt ids per request (default 128)\n"
               "  --decode N       new tokens per request (default 128; stop tokens ignored)\n"
               "  --arms LIST      which of ar, fixed, confidence to run (default all three)\n"
               "  --sim-acceptance FILE  per-position acceptance and confidences drawn from FILE\n"
               "                   (bench/profiles/*.json), for synthetic weights; reported as simulated\n"
               "  --sps-cache FILE the target's step-cost profile, reused while its key matches\n"
               "  --trace FILE     one JSON line a step (after one naming the run: arm, concurrency): rows,\n"
               "                   whether it drafted and why, Algorithm 1's predictions, measured times\n"
               "  --page-rows R    rows a KV page holds (default 16)\n"
               "  --step-rows R    most target rows a step (default: the largest level x (gamma + 1), at least 256)\n"
               "  --kv-mem SIZE    the KV pool (target and drafter) from a byte budget, e.g. 8G, 1.5GiB (powers\n"
               "                   of 1024), at most what the largest level uses; a smaller pool preempts\n"
               "                   (default: room for every request of the largest level)\n"
               "  --tp N           tensor parallel: the target split across N ranks, one thread each (CUDA: GPUs\n"
               "                   0..N-1; CPU: the threads shared out), the drafter on every rank\n");
}

static int parse_list(const char *s, int *out, int cap) {
    int n = 0;
    while (*s && n < cap) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1 << 20) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return *s ? -1 : n;
}

static int parse_args(int argc, char **argv, options *o) {
    enum { O_BACKEND = 256, O_PROMPT_LEN, O_DECODE, O_ARMS, O_TEMP, O_SIM, O_SPS, O_PAGE, O_STEP, O_SEED, O_THREADS,
           O_JSON, O_CONC, O_KV_MEM, O_TP, O_TRACE };
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'}, {"drafter", required_argument, 0, 'd'},
        {"backend", required_argument, 0, O_BACKEND}, {"prompt-len", required_argument, 0, O_PROMPT_LEN},
        {"decode", required_argument, 0, O_DECODE}, {"arms", required_argument, 0, O_ARMS},
        {"temp", required_argument, 0, O_TEMP}, {"sim-acceptance", required_argument, 0, O_SIM},
        {"sps-cache", required_argument, 0, O_SPS}, {"trace", required_argument, 0, O_TRACE},
        {"page-rows", required_argument, 0, O_PAGE},
        {"step-rows", required_argument, 0, O_STEP}, {"seed", required_argument, 0, O_SEED},
        {"threads", required_argument, 0, O_THREADS}, {"json", no_argument, 0, O_JSON},
        {"concurrency", required_argument, 0, O_CONC}, {"kv-mem", required_argument, 0, O_KV_MEM},
        {"tp", required_argument, 0, O_TP},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *o = (options){.prompt_len = 128, .decode = 128, .page_rows = 16, .tp = 1, .arm = {true, true, true}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:d:h", longs, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'd': o->drafter = optarg; break;
        case O_BACKEND: {
            const int b = cli_choice("bench", "--backend", optarg, CLI_BACKENDS);
            if (b < 0) return 2;
            o->cuda = b == 1;
            break;
        }
        case O_PROMPT_LEN: o->prompt_len = (int)strtol(optarg, &end, 10); break;
        case O_DECODE: o->decode = (int)strtol(optarg, &end, 10); break;
        case O_PAGE: o->page_rows = (int)strtol(optarg, &end, 10); break;
        case O_STEP: o->step_rows = (int)strtol(optarg, &end, 10); break;
        case O_THREADS: o->threads = (int)strtol(optarg, &end, 10); break;
        case O_TP: o->tp = (int)strtol(optarg, &end, 10); break;
        case O_SEED: o->seed = strtoull(optarg, &end, 10); break;
        case O_TEMP: o->temperature = strtof(optarg, &end); break;
        case O_SIM: o->sim_path = optarg; break;
        case O_SPS: o->sps_cache = optarg; break;
        case O_TRACE: o->trace_path = optarg; break;
        case O_JSON: o->json = true; break;
        case O_KV_MEM: {
            ds_error *e = ds_size_arg("--kv-mem", optarg, &o->kv_mem);
            if (e) {
                fprintf(stderr, "dspark bench: %s\n", ds_error_message(e));
                ds_error_free(e);
                return 2;
            }
            break;
        }
        case O_ARMS:
            o->arm[0] = strstr(optarg, "ar") != NULL;
            o->arm[1] = strstr(optarg, "fixed") != NULL;
            o->arm[2] = strstr(optarg, "confidence") != NULL;
            if (!o->arm[0] && !o->arm[1] && !o->arm[2]) {
                fprintf(stderr, "dspark bench: --arms takes ar, fixed and/or confidence, not \"%s\"\n", optarg);
                return 2;
            }
            break;
        case O_CONC:
            if ((o->n_levels = parse_list(optarg, o->levels, MAX_LEVELS)) < 1) {
                fprintf(stderr, "dspark bench: --concurrency wants up to %d positive counts, e.g. 1,8,32\n",
                        MAX_LEVELS);
                return 2;
            }
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
        if (end && *end) {
            fprintf(stderr, "dspark bench: bad number \"%s\"\n", optarg);
            return 2;
        }
    }
    if (o->prompt_len < 1 || o->decode < 1 || o->page_rows < 1 || o->threads < 0 || o->n_levels < 1 ||
        !(o->temperature >= 0) || o->tp < 1 || o->tp > 64) {
        fprintf(stderr, "dspark bench: --concurrency, a positive --prompt-len, --decode, --page-rows, a "
                        "temperature >= 0 and --tp in 1..64 are needed\n");
        return 2;
    }
    if (!o->model) {
        o->model = DEFAULT_MODEL;
        if (!o->drafter) o->drafter = DEFAULT_DRAFTER;
    }
    return 0;
}

/* The target's matrix-product parameters a row multiplies through (every
 * 2-D weight but an untied input embedding), for the TFLOP/s the forwards
 * reach (2 x this x rows / forward seconds; the goal is a share of the
 * card's bf16 tensor-core peak, which bench_cublas_shapes measures). 0 for a
 * quantized checkpoint (its packed words do not count elements). */
static double matmul_params(const ds_checkpoint *ck) {
    double n = 0, embed = 0;
    bool head = false;
    for (size_t s = 0; s < ck->n_shards; s++)
        for (size_t i = 0; i < ck->shards[s]->n_tensors; i++) {
            const ds_st_tensor *t = &ck->shards[s]->tensors[i];
            const size_t len = strlen(t->name);
            if (t->ndim != 2 || len < 7 || strcmp(t->name + len - 7, ".weight")) continue;
            if (t->dtype == DS_U32) return 0;
            const double e = (double)t->shape[0] * (double)t->shape[1];
            if (strstr(t->name, "embed_tokens")) embed += e;
            else n += e;
            if (strstr(t->name, "lm_head")) head = true;
        }
    return head ? n : n + embed;
}

/* The TFLOP/s of a run's target forwards (every row, prefill included); 0 where unknown. */
static double target_tflops(double params, const ds_batch_stats *st) {
    return params > 0 && st->forward_s > 0 ? 2 * params * (double)st->rows / st->forward_s / 1e12 : 0;
}

/* The same over the steps with no prefill rows, whole steps timed (drafting, bookkeeping included): what a
 * step of decoding rows alone reaches, against the card's peak. */
static double decode_tflops(double params, const ds_batch_stats *st) {
    return params > 0 && st->decode_step_s > 0 ? 2 * params * (double)st->decode_rows / st->decode_step_s / 1e12 : 0;
}

typedef struct {
    double seconds, tokens_per_s, tau;
    long tokens;
    ds_batch_stats st;
} arm_result;

/* One run: c requests at once through a fresh engine on the open models (every rank's: t[r], d[r]). */
static ds_error *run_arm(ds_target *const *t, ds_drafter *const *d, const ds_batch_opts *base, int arm, int c,
                         const options *o, const int32_t *prompts, arm_result *out) {
    ds_batch_opts bo = *base;
    bo.max_seqs = c;
    bo.trace = o->trace;
    if (o->trace) fprintf(o->trace, "{\"run\":{\"arm\":\"%s\",\"concurrency\":%d}}\n", arm_names[arm], c);
    bo.schedule = arm == ARM_ALG1 ? DS_SCHEDULE_CONFIDENCE : DS_SCHEDULE_FIXED;
    if (arm == ARM_AR) bo.sim = NULL;
    ds_batch_tp *g;
    DS_TRY(ds_batch_tp_new(o->tp, t, arm == ARM_AR || !d[0] ? NULL : d, &bo, &g));
    const ds_batch *b = ds_batch_tp_lead(g);
    ds_error *e = NULL;
    for (int i = 0; i < c && !e; i++) {
        int64_t id;
        const ds_batch_request rq = {
            .prompt = prompts + (size_t)i * o->prompt_len, .n_prompt = o->prompt_len,
            .params = {.max_new = o->decode, .seed = o->seed + (uint64_t)i, .ignore_stop = true,
                       .sampling = {.temperature = o->temperature, .top_k = 0, .top_p = 1.0f}}};
        e = ds_batch_tp_submit(g, &rq, &id);
    }
    const double t0 = ds_now_s();
    if (!e) e = ds_batch_tp_run(g);
    out->seconds = ds_now_s() - t0;
    long tokens = 0, rounds = 0, committed = 0;
    for (int i = 0; i < c && !e; i++) {
        const ds_gen_result *r = ds_batch_result(b, i);
        tokens += r->n_tokens;
        for (int k = 0; k < r->rounds; k++) committed += r->accept_len[k];
        rounds += r->rounds;
    }
    out->tokens = tokens;
    out->tokens_per_s = tokens / out->seconds;
    out->tau = rounds ? (double)committed / (double)rounds : 0;
    out->st = ds_batch_get_stats(b);
    ds_batch_tp_free(g);
    return e;
}

/* --kv-mem: the pool's pages from the budget at the bytes a position takes
 * in the target and drafter (their configs, before either is loaded), as
 * the engine sizes it (ds_engine_opts.kv_mem); the pool printed. */
static ds_error *pool_from_budget(const options *o, ds_batch_opts *bo, int gamma, int per_seq) {
    int64_t trow, drow = 0;
    DS_TRY(ds_target_kv_row_bytes(o->model, &trow));
    if (o->drafter) DS_TRY(ds_drafter_kv_row_bytes(o->drafter, &drow));
    const int64_t per_req = (per_seq + bo->page_rows - 1) / bo->page_rows;
    DS_TRY(ds_error_wrap(ds_kv_pool_fit(bo, gamma, o->kv_mem, trow, drow, per_req, bo->n_pages),
                         "--kv-mem (a request: --prompt-len %d + --decode %d + a block)", o->prompt_len, o->decode));
    const ds_engine_info in = {.kv_pages = bo->n_pages, .kv_page_rows = bo->page_rows,
                               .kv_tokens = (int64_t)bo->n_pages * bo->page_rows,
                               .kv_bytes = ds_kv_pool_bytes(bo, gamma, trow, drow), .kv_target_row_bytes = trow,
                               .kv_drafter_row_bytes = drow};
    char line[256];
    ds_kv_pool_line(&in, line, sizeof line);
    fprintf(stderr, "%s\n", line);
    return NULL;
}

/* Every rank's backend, target (its shard under --tp) and drafter, and their group. */
typedef struct {
    ds_comm_group *group;
    ds_comm comm[64];
    ds_backend *be[64];
    ds_target *t[64];
    ds_drafter *d[64];
} ranks;

static ds_error *open_ranks(const options *o, const ds_batch_opts *bo, int G, ranks *k) {
    if (o->tp > 1) {
        int dev[64];
        for (int r = 0; r < o->tp; r++) dev[r] = r;
        DS_TRY(o->cuda ? ds_comm_group_nccl(o->tp, dev, &k->group, k->comm)
                       : ds_comm_group_threads(o->tp, &k->group, k->comm));
    }
    const int threads = (o->threads ? o->threads : 2) / o->tp; /* the CPU's threads shared out */
    for (int r = 0; r < o->tp; r++) {
        DS_TRY(o->cuda ? ds_backend_cuda_new(r, &k->be[r]) : ds_backend_cpu_new(threads > 0 ? threads : 1, &k->be[r]));
        const ds_target_opts to = {.max_rows = bo->step_rows, .max_logit_rows = bo->step_rows,
                                   .cache_rows = bo->n_pages * bo->page_rows, .comm = o->tp > 1 ? &k->comm[r] : NULL};
        DS_TRY(ds_target_open(k->be[r], o->model, &to, &k->t[r]));
        const ds_drafter_opts dopts = {.cache_rows = ds_batch_drafter_rows(bo, G)};
        if (o->drafter) DS_TRY(ds_drafter_open(k->be[r], o->drafter, k->t[r], &dopts, &k->d[r]));
    }
    return NULL;
}

static void close_ranks(ranks *k, int world) {
    for (int r = 0; r < world; r++) {
        if (k->d[r]) ds_drafter_free(k->d[r]);
        if (k->t[r]) ds_target_free(k->t[r]);
        if (k->be[r]) k->be[r]->ops->destroy(k->be[r]);
    }
    ds_comm_group_free(k->group); /* after every rank's target */
}

static int fail(ds_error *e) {
    fprintf(stderr, "dspark bench: %s\n", ds_error_message(e));
    ds_error_free(e);
    return 1;
}

/* The ceiling at c requests (speculate/ceiling.h) from the step-cost curve and the simulated acceptance, with
 * the draft pass the fixed arm measured at this level (else Algorithm 1's; 0 where neither drafted). */
static ds_error *level_ceiling(const ds_step_cost *sps, const ds_sim_profile *sim, int gamma, int c,
                               const arm_result *r, const options *o, double *draft_s, ds_spec_ceiling *out) {
    const ds_batch_stats *f = &r[ARM_FIXED].st, *a = &r[ARM_ALG1].st;
    *draft_s = o->arm[ARM_FIXED] && f->draft_passes > 0   ? f->draft_pass_s / (double)f->draft_passes
               : o->arm[ARM_ALG1] && a->draft_passes > 0 ? a->draft_pass_s / (double)a->draft_passes
                                                          : 0;
    return ds_spec_ceiling_estimate(sps, sim, c, gamma, *draft_s, 64, o->seed, out);
}

int cmd_bench_batch(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    int cmax = 0;
    for (int i = 0; i < o.n_levels; i++) cmax = o.levels[i] > cmax ? o.levels[i] : cmax;
    static ranks k; /* static: 64 ranks' handles */
    ds_sim_profile *sim = NULL;
    ds_step_cost *sps = NULL;
    ds_batch_tp *probe = NULL;
    int32_t *prompts = NULL;
    ds_error *e = o.sim_path ? ds_sim_profile_load(o.sim_path, &sim) : NULL;
    if (!e && o.trace_path && !(o.trace = fopen(o.trace_path, "w")))
        e = ds_errorf("--trace %s: cannot open it for writing", o.trace_path);
    const int G = 32; /* pools are sized before the drafter says its block: the largest block */
    const int per_seq = o.prompt_len + o.decode + G + 1;
    ds_batch_opts bo = {.page_rows = o.page_rows, .sim = sim, .sim_seed = o.seed};
    bo.n_pages = cmax * ((per_seq + o.page_rows - 1) / o.page_rows);
    bo.step_rows = o.step_rows > 0 ? o.step_rows : cmax * 9 > 256 ? cmax * 9 : 256;
    bo.max_seqs = cmax;
    if (!e && o.kv_mem) e = pool_from_budget(&o, &bo, G, per_seq);
    if (!e) e = open_ranks(&o, &bo, G, &k);
    ds_backend *const be = k.be[0]; /* rank 0's */
    ds_target *const t = k.t[0];
    ds_drafter *const d = k.d[0];
    if (!e && !d) o.arm[ARM_FIXED] = o.arm[ARM_ALG1] = false;
    if (!e && d && !d->confidence && !sim) o.arm[ARM_ALG1] = false;
    if (!e && o.prompt_len + o.decode + 1 > t->max_ctx)
        e = ds_errorf("--prompt-len %d + --decode %d exceed the model's context of %d", o.prompt_len, o.decode,
                      t->max_ctx);
    if (!e && !(prompts = malloc((size_t)cmax * o.prompt_len * sizeof *prompts))) e = ds_errorf("out of memory");
    if (!e) {
        ds_rng rng;
        ds_rng_seed(&rng, o.seed ^ 0x9e3779b97f4a7c15ull);
        for (size_t i = 0; i < (size_t)cmax * o.prompt_len; i++)
            prompts[i] = (int32_t)(ds_rng_uniform(&rng) * t->vocab) % t->vocab;
    }
    /* The step cost Algorithm 1 weighs drafts against, measured here. */
    if (!e && o.arm[ARM_ALG1]) {
        char dev[160], model[160];
        const int n = ds_backend_label(be, dev, sizeof dev);
        if (o.tp > 1) snprintf(dev + n, sizeof dev - (size_t)n, " tp %d", o.tp);
        bo.profile_context = o.prompt_len + o.decode / 2; /* a request's keys halfway through its decoding */
        snprintf(model, sizeof model, "%s V%d H%d L%d rows<=%d keys %d", o.model, t->vocab, t->hidden, t->n_layers,
                 bo.step_rows, bo.profile_context);
        const ds_step_cost_key key = {.device = dev, .model = model, .build = DS_BATCH_PROFILE_BUILD};
        ds_batch_opts po = bo; /* the probe runs the target alone: no drafter, so no simulated acceptance */
        po.sim = NULL;
        e = ds_batch_tp_new(o.tp, k.t, NULL, &po, &probe);
        if (!e) e = ds_batch_tp_profile(probe, &key, o.sps_cache, o.json ? NULL : stderr, &sps);
        bo.sps = sps;
    }
    /* warm-up: one small run of each arm */
    for (int arm = 0; arm < 3 && !e; arm++) {
        arm_result w;
        options ow = o;
        ow.decode = 8;
        if (o.arm[arm]) e = run_arm(k.t, k.d, &bo, arm, 1, &ow, prompts, &w);
    }
    cJSON *json = o.json ? cJSON_CreateObject() : NULL, *levels = NULL;
    if (!e && json) {
        cJSON_AddStringToObject(json, "model", o.model);
        cJSON_AddStringToObject(json, "drafter", o.drafter ? o.drafter : "");
        cJSON_AddStringToObject(json, "backend", be->ops->name);
        cJSON_AddNumberToObject(json, "tp", o.tp);
        cJSON_AddStringToObject(json, "acceptance", sim ? ds_sim_profile_name(sim) : "measured");
        cJSON_AddBoolToObject(json, "simulated", sim != NULL);
        cJSON_AddNumberToObject(json, "prompt_len", o.prompt_len);
        cJSON_AddNumberToObject(json, "decode", o.decode);
        cJSON_AddNumberToObject(json, "temperature", o.temperature);
        levels = cJSON_AddArrayToObject(json, "levels");
    }
    if (!e && !json) {
        char tp[32] = "";
        if (o.tp > 1) snprintf(tp, sizeof tp, " (tp %d)", o.tp);
        printf("batched engine: %s%s%s on %s%s, prompts of %d, %d new tokens each, T=%g; acceptance %s\n", o.model,
               d ? " + " : "", d ? o.drafter : "", be->ops->name, tp, o.prompt_len, o.decode, o.temperature,
               sim ? "SIMULATED from the profile" : "measured");
        if (sim) printf("  (simulated profile %s: tau %.2f at gamma %d)\n", ds_sim_profile_name(sim),
                        ds_sim_profile_tau(sim, d->gamma), d->gamma);
        printf("%11s", "concurrency");
        for (int arm = 0; arm < 3; arm++)
            if (o.arm[arm]) printf(" | %-11s tok/s  x AR   tau ", arm_names[arm]);
        printf("\n");
    }
    const double params = e ? 0 : matmul_params(t->ck);
    if (!e && json) cJSON_AddNumberToObject(json, "target_matmul_params", params);
    for (int li = 0; li < o.n_levels && !e; li++) {
        const int c = o.levels[li];
        arm_result r[3] = {0};
        for (int arm = 0; arm < 3 && !e; arm++)
            if (o.arm[arm]) e = run_arm(k.t, k.d, &bo, arm, c, &o, prompts, &r[arm]);
        if (e) break;
        const double ar = o.arm[ARM_AR] ? r[ARM_AR].tokens_per_s : 0;
        ds_spec_ceiling ceil = {0};
        double ceil_draft_s = 0;
        const bool has_ceiling = sps && sim && d;
        if (has_ceiling && (e = level_ceiling(sps, sim, d->gamma, c, r, &o, &ceil_draft_s, &ceil))) break;
        if (json) {
            cJSON *lv = cJSON_CreateObject();
            cJSON_AddNumberToObject(lv, "concurrency", c);
            for (int arm = 0; arm < 3; arm++) {
                if (!o.arm[arm]) continue;
                cJSON *a = cJSON_AddObjectToObject(lv, arm == ARM_AR ? "ar" : arm == ARM_FIXED ? "fixed" : "confidence");
                cJSON_AddNumberToObject(a, "tokens_per_s", r[arm].tokens_per_s);
                cJSON_AddNumberToObject(a, "per_request_tokens_per_s", r[arm].tokens_per_s / c);
                cJSON_AddNumberToObject(a, "seconds", r[arm].seconds);
                cJSON_AddNumberToObject(a, "tau", r[arm].tau);
                cJSON_AddNumberToObject(a, "steps", (double)r[arm].st.steps);
                cJSON_AddNumberToObject(a, "rows", (double)r[arm].st.rows);
                cJSON_AddNumberToObject(a, "drafted", (double)r[arm].st.drafted);
                cJSON_AddNumberToObject(a, "verified_drafts", (double)r[arm].st.verified_drafts);
                cJSON_AddNumberToObject(a, "draft_s", r[arm].st.draft_s);
                cJSON_AddNumberToObject(a, "draft_passes", (double)r[arm].st.draft_passes);
                if (r[arm].st.draft_passes > 0)
                    cJSON_AddNumberToObject(a, "draft_pass_s", r[arm].st.draft_pass_s / (double)r[arm].st.draft_passes);
                cJSON_AddNumberToObject(a, "draft_skips", (double)r[arm].st.draft_skips);
                cJSON_AddNumberToObject(a, "draft_probes", (double)r[arm].st.draft_probes);
                cJSON_AddNumberToObject(a, "draft_unmeasured", (double)r[arm].st.draft_unmeasured);
                cJSON_AddNumberToObject(a, "forward_s", r[arm].st.forward_s);
                if (r[arm].st.decode_steps > 0)
                    cJSON_AddNumberToObject(a, "decode_step_s", r[arm].st.decode_step_s / (double)r[arm].st.decode_steps);
                if (decode_tflops(params, &r[arm].st) > 0)
                    cJSON_AddNumberToObject(a, "decode_tflops", decode_tflops(params, &r[arm].st));
                if (target_tflops(params, &r[arm].st) > 0)
                    cJSON_AddNumberToObject(a, "target_tflops", target_tflops(params, &r[arm].st));
            }
            if (has_ceiling) {
                cJSON *cj = cJSON_AddObjectToObject(lv, "ceiling");
                cJSON_AddNumberToObject(cj, "free_drafter_x_ar", ceil.free_x_ar);
                cJSON_AddNumberToObject(cj, "free_drafter_verify_tokens", ceil.free_verify_tokens);
                cJSON_AddNumberToObject(cj, "draft_pass_s", ceil_draft_s);
                cJSON_AddNumberToObject(cj, "with_draft_pass_x_ar", ceil.cost_x_ar);
                cJSON_AddNumberToObject(cj, "with_draft_pass_verify_tokens", ceil.cost_verify_tokens);
            }
            cJSON_AddItemToArray(levels, lv);
        } else {
            printf("%11d", c);
            for (int arm = 0; arm < 3; arm++)
                if (o.arm[arm])
                    printf(" | %11.1f  %5.2f  %4.2f", r[arm].tokens_per_s, ar > 0 ? r[arm].tokens_per_s / ar : 0,
                           r[arm].tau);
            if (o.arm[ARM_AR] && target_tflops(params, &r[ARM_AR].st) > 0)
                printf(" | AR forwards %.3g TFLOP/s, decode steps %.3g", target_tflops(params, &r[ARM_AR].st),
                       decode_tflops(params, &r[ARM_AR].st));
            printf("\n");
            if (has_ceiling)
                printf("%11s   ceiling (step-cost curve, simulated acceptance): %.2fx AR with a free drafter (%.0f verify "
                       "tokens), %.2fx with a %.2f ms draft pass\n",
                       "", ceil.free_x_ar, ceil.free_verify_tokens, ceil.cost_x_ar, ceil_draft_s * 1e3);
        }
        fflush(stdout);
    }
    if (!e && json) {
        char *s = cJSON_Print(json);
        if (s) puts(s);
        free(s);
    }
    cJSON_Delete(json);
    ds_batch_tp_free(probe);
    ds_step_cost_free(sps);
    ds_sim_profile_free(sim);
    free(prompts);
    close_ranks(&k, o.tp);
    if (o.trace && fclose(o.trace) && !e) e = ds_errorf("--trace %s: writing failed", o.trace_path);
    return e ? fail(e) : 0;
}
