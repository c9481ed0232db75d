/* The public engine API: the internal target, drafter, tokenizer and loop
 * behind the few calls of include/dspark.h. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dspark.h"
#include <pthread.h>

#include "backend/comm.h"
#include "base/clock.h"
#include "batch/batch_tp.h"
#include "batch/kv_budget.h"
#include "draft/drafter.h"
#include "draft/sts_file.h"
#include "io/checkpoint.h"
#include "speculate/generate.h"
#include "speculate/metrics.h"
#include "tokenizer/chat_template.h"

struct ds_engine {
    ds_backend *be;
    ds_target *target;
    ds_drafter *drafter;
    ds_tokenizer *tok;
    char *model_dir;     /* where the chat template is looked up */
    ds_chat_family chat; /* detected on first use */
    bool calibrated;     /* STS temperatures applied to the drafter */
    bool batched;        /* the target's and drafter's caches are a pool of pages (ds_engine_opts.batch) */
    ds_batch_opts bo;    /* the batched engine's shape */
    int64_t kv_row[2];   /* bytes a position takes in the target's, the drafter's caches (batched) */
    ds_step_cost *sps;   /* Algorithm 1's step cost (confidence_schedule) */
    ds_batch_tp *live;   /* the batched engine: every request, submitted or generated in a batch (under
                            tensor parallelism one engine a rank, stepped together: batch_tp.h) */
    /* Tensor parallel (ds_engine_opts.tp > 1): this engine is rank 0; ranks[r] (r >= 1) hold the other
     * shards of the target and a copy of the drafter, each on its own backend, and every generation runs
     * on all of them at once, one thread a rank (SPMD: the same calls, meeting in the target's
     * collectives; every rank computes the same tokens). */
    int tp;
    ds_comm_group *comm_group;
    ds_comm *comms;
    struct ds_engine **ranks;
};

void ds_engine_free(ds_engine *e) {
    if (!e) return;
    ds_batch_tp_free(e->live); /* before the ranks' models it runs on */
    for (int r = 1; e->ranks && r < e->tp; r++) ds_engine_free(e->ranks[r]);
    free(e->ranks);
    ds_tokenizer_free(e->tok);
    ds_step_cost_free(e->sps);
    ds_drafter_free(e->drafter);
    ds_target_free(e->target);
    if (e->be) e->be->ops->destroy(e->be);
    free(e->model_dir);
    ds_comm_group_free(e->comm_group); /* after every rank's target */
    free(e->comms);
    free(e);
}

/* The given tokenizer, else the model directory's tokenizer.json if there
 * is one; none is fine (id prompts, id output). */
static ds_error *open_tokenizer(const ds_engine_opts *o, ds_tokenizer **out) {
    if (o->tokenizer) return ds_tokenizer_load(o->tokenizer, out);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/tokenizer.json", o->model_dir) >= (int)sizeof path)
        return ds_errorf("%s: model directory path too long", o->model_dir);
    return ds_path_exists(path) ? ds_tokenizer_load(path, out) : NULL;
}

/* The drafter's STS temperatures: opts.sts (it must be there), else
 * sts.json beside the drafter when it exists; none with no_sts. A file that
 * is there but broken, or for another block size, is an error: a threshold
 * would otherwise silently cut where nobody calibrated. */
static ds_error *open_sts(const ds_engine_opts *o, ds_engine *e) {
    if (o->no_sts) return NULL;
    char path[4096];
    if (o->sts) {
        if (!e->drafter) return ds_errorf("%s: STS temperatures given, but there is no drafter to apply them to", o->sts);
        if (!e->drafter->confidence)
            return ds_errorf("%s: STS temperatures given, but the drafter %s has no confidence head", o->sts,
                             o->drafter_dir);
        snprintf(path, sizeof path, "%s", o->sts);
    } else {
        if (!e->drafter || !e->drafter->confidence) return NULL;
        if (!ds_sts_path(o->drafter_dir, path, sizeof path) || !ds_path_exists(path)) return NULL;
    }
    ds_sts sts;
    DS_TRY(ds_sts_read(path, &sts));
    if (sts.n != e->drafter->gamma)
        return ds_errorf("%s: %d temperatures, but the drafter's block_size is %d (%s)", path, sts.n,
                         e->drafter->gamma, o->drafter_dir);
    DS_TRY(ds_error_wrap(ds_drafter_set_temperatures(e->drafter, sts.temp, sts.n), "%s", path));
    e->calibrated = true;
    return NULL;
}

/* The batched engine's pools: pages for batch x (ctx + a block) rows, or
 * what kv_mem buys; one step up to every request's verify block (or a
 * prefill chunk). The bytes a position takes come from the checkpoints'
 * configs before anything is allocated. */
static ds_error *batch_shape(ds_engine *e, const ds_engine_opts *o, ds_target_opts *to, ds_drafter_opts *dopts) {
    if (o->ctx <= 0) return ds_errorf("ds_engine_opts.ctx: the batched engine sizes its KV pool by it (give > 0)");
    if (o->confidence_schedule && !o->drafter_dir)
        return ds_errorf("ds_engine_opts.confidence_schedule: Algorithm 1 schedules drafts, and there is no drafter");
    const int page = 16, block = DS_MAX_GAMMA + 1, pre = ds_backend_prefill_rows(e->be);
    ds_batch_opts *b = &e->bo;
    b->max_seqs = o->batch;
    b->page_rows = page;
    int model_ctx;
    DS_TRY(ds_target_kv_shape(o->model_dir, &e->kv_row[0], &model_ctx));
    if (o->drafter_dir) DS_TRY(ds_drafter_kv_row_bytes(o->drafter_dir, &e->kv_row[1]));
    /* A request holds at most the model's context, whatever ctx asks. */
    const int ctx = o->ctx < model_ctx ? o->ctx : model_ctx;
    const int64_t per_req = ((int64_t)ctx + block + page - 1) / page; /* one request of ctx tokens and a block */
    /* From kv_mem: what the budget buys at the bytes a position takes in both models, after the drafter's
     * block rows; at least one request (else nothing could run), at most what `batch` of them can use. */
    int64_t pages = per_req * o->batch;
    b->n_pages = 0;
    if (o->kv_mem > 0) {
        DS_TRY(ds_error_wrap(ds_kv_pool_fit(b, DS_MAX_GAMMA, o->kv_mem, e->kv_row[0], e->kv_row[1], per_req, pages),
                             "ds_engine_opts.kv_mem (a request: ctx %d tokens and a block)", ctx));
        pages = b->n_pages;
        b->n_pages = 0;
    }
    /* Cache rows are ints: the drafter's pool, the larger, must fit one. */
    const int64_t drafter_rows = pages * page + ds_batch_drafter_rows(b, DS_MAX_GAMMA);
    if (drafter_rows > INT_MAX)
        return ds_errorf("ds_engine_opts: a pool of %lld pages of %d rows (batch %d, ctx %d) is more rows than a "
                         "cache holds (%d)",
                         (long long)pages, page, o->batch, ctx, INT_MAX);
    b->n_pages = (int)pages;
    b->step_rows = o->batch * 8 > pre ? o->batch * 8 : pre; /* 8: a block of 7 drafts and its anchor */
    if (b->step_rows < block) b->step_rows = block;
    b->schedule = o->confidence_schedule ? DS_SCHEDULE_CONFIDENCE : DS_SCHEDULE_FIXED;
    to->max_rows = to->max_logit_rows = b->step_rows;
    to->cache_rows = b->n_pages * page;
    dopts->cache_rows = ds_batch_drafter_rows(b, DS_MAX_GAMMA);
    e->batched = true;
    return NULL;
}

/* Every rank's target and drafter (rank 0's: this engine's). */
static void rank_models(const ds_engine *e, ds_target **t, ds_drafter **d) {
    for (int r = 0; r < e->tp; r++) {
        const ds_engine *x = r ? e->ranks[r] : e;
        t[r] = x->target, d[r] = x->drafter;
    }
}

/* Algorithm 1's step cost, measured on this machine (cached at sps_cache); under tensor parallelism on all
 * ranks at once, by rank 0's clock, the one curve every rank schedules by. */
static ds_error *profile_steps(ds_engine *e, const ds_engine_opts *o) {
    if (!e->drafter->confidence)
        return ds_errorf("ds_engine_opts.confidence_schedule: the drafter %s has no confidence head", o->drafter_dir);
    char dev[160], model[4200];
    int n = ds_backend_label(e->be, dev, sizeof dev);
    if (e->tp > 1) snprintf(dev + n, sizeof dev - (size_t)n, " tp %d", e->tp);
    snprintf(model, sizeof model, "%s rows<=%d", o->model_dir, e->bo.step_rows);
    const ds_step_cost_key key = {.device = dev, .model = model, .build = DS_BATCH_PROFILE_BUILD};
    ds_batch_opts plain = e->bo; /* the profile times target forwards alone */
    plain.schedule = DS_SCHEDULE_FIXED;
    ds_target *t[64];
    ds_drafter *unused[64];
    rank_models(e, t, unused);
    ds_batch_tp *g;
    DS_TRY(ds_batch_tp_new(e->tp, t, NULL, &plain, &g));
    ds_error *err = ds_batch_tp_profile(g, &key, o->sps_cache, NULL, &e->sps);
    ds_batch_tp_free(g);
    e->bo.sps = e->sps;
    return err;
}

/* The batched engine over every rank's models. */
static ds_error *open_live(ds_engine *e) {
    ds_target *t[64];
    ds_drafter *d[64];
    rank_models(e, t, d);
    return ds_batch_tp_new(e->tp, t, d, &e->bo, &e->live);
}

/* Ranks 1..tp-1: a backend, the target's shard and a drafter each, shaped as rank 0's (to, dopts: the
 * batched engine's pools too). Opened concurrently: a shard's open makes no collective call, but they load
 * at once. */
typedef struct {
    ds_engine *e;
    const ds_engine_opts *o;
    const ds_target_opts *to;
    const ds_drafter_opts *dopts;
    int rank, threads;
    ds_error *err;
} rank_open;

static void *open_rank_main(void *p) {
    rank_open *a = p;
    const ds_engine_opts *o = a->o;
    ds_engine *r = calloc(1, sizeof *r);
    if (!r) {
        a->err = ds_errorf("out of memory");
        return NULL;
    }
    r->tp = 1;
    a->e->ranks[a->rank] = r;
    if (!o->backend || !strcmp(o->backend, "cpu")) a->err = ds_backend_cpu_new(a->threads, &r->be);
    else a->err = ds_backend_cuda_new(o->device + a->rank, &r->be);
    ds_target_opts to = *a->to;
    to.comm = &a->e->comms[a->rank];
    if (!a->err) a->err = ds_target_open(r->be, o->model_dir, &to, &r->target);
    if (!a->err && o->drafter_dir) a->err = ds_drafter_open(r->be, o->drafter_dir, r->target, a->dopts, &r->drafter);
    if (!a->err) a->err = open_sts(o, r);
    if (a->err) a->err = ds_error_wrap(a->err, "tensor-parallel rank %d", a->rank);
    return NULL;
}

static ds_error *open_ranks(ds_engine *e, const ds_engine_opts *o, int threads, const ds_target_opts *to,
                            const ds_drafter_opts *dopts) {
    rank_open args[64];
    pthread_t th[64];
    ds_error *err = NULL;
    int started = 0;
    for (int r = 1; r < e->tp; r++, started++) {
        args[r] = (rank_open){.e = e, .o = o, .to = to, .dopts = dopts, .rank = r, .threads = threads};
        if (pthread_create(&th[r], NULL, open_rank_main, &args[r])) {
            err = ds_errorf("tensor parallel: cannot start rank %d's thread", r);
            break;
        }
    }
    for (int r = 1; r <= started; r++) {
        pthread_join(th[r], NULL);
        if (args[r].err && !err) err = args[r].err;
        else if (args[r].err) ds_error_free(args[r].err);
    }
    return err;
}

ds_error *ds_engine_open(const ds_engine_opts *o, ds_engine **out) {
    if (!out) return ds_errorf("ds_engine_open: out is NULL");
    *out = NULL;
    if (!o || !o->model_dir) return ds_errorf("ds_engine_open: no model directory given");
    if (o->threads < 0) return ds_errorf("ds_engine_open: threads must be >= 0 (0: all CPUs), got %d", o->threads);
    if (o->device < 0) return ds_errorf("ds_engine_open: device must be >= 0, got %d", o->device);
    ds_engine *e = calloc(1, sizeof *e);
    if (!e || !(e->model_dir = strdup(o->model_dir))) {
        free(e);
        return ds_errorf("out of memory");
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = o->threads > 0 ? o->threads : cpus > 0 ? (int)cpus : 1;
    ds_error *err = NULL;
    e->tp = o->tp > 1 ? o->tp : 1;
    if (o->tp < 0 || o->tp > 64) err = ds_errorf("ds_engine_open: tp must be in 0..64, got %d", o->tp);
    if (!err && e->tp > 1) { /* rank 0 opens first, in this thread; open_rank the others */
        e->comms = calloc((size_t)e->tp, sizeof *e->comms);
        e->ranks = calloc((size_t)e->tp, sizeof *e->ranks);
        const bool cuda = o->backend && !strcmp(o->backend, "cuda");
        int devices[64];
        for (int r = 0; r < e->tp; r++) devices[r] = o->device + r;
        /* GPUs: NCCL between them; the CPU: rank threads meeting in memory */
        err = !e->comms || !e->ranks ? ds_errorf("out of memory")
              : cuda                 ? ds_comm_group_nccl(e->tp, devices, &e->comm_group, e->comms)
                                     : ds_comm_group_threads(e->tp, &e->comm_group, e->comms);
    }
    /* Under TP on the CPU the ranks share the cores; on CUDA rank r takes GPU device + r. */
    const int rank_threads = threads / e->tp > 0 ? threads / e->tp : 1;
    if (err) {
    } else if (!o->backend || !strcmp(o->backend, "cpu")) {
        err = ds_backend_cpu_new(rank_threads, &e->be);
    } else if (!strcmp(o->backend, "cuda")) {
        err = ds_backend_cuda_new(o->device, &e->be);
    } else {
        err = ds_errorf("ds_engine_open: unknown backend \"%s\" (cpu or cuda)", o->backend);
    }
    ds_target_opts to = {.max_logit_rows = DS_MAX_GAMMA + 1, .max_ctx = o->ctx, /* prefill: the backend's rows */
                         .comm = e->comms ? &e->comms[0] : NULL};
    ds_drafter_opts dopts = {0};
    if (!err && (o->batch < 0 || o->ctx < 0)) err = ds_errorf("ds_engine_open: batch and ctx must be >= 0");
    if (!err && o->kv_mem < 0)
        err = ds_errorf("ds_engine_opts.kv_mem must be >= 0 (0: batch x ctx), got %lld", (long long)o->kv_mem);
    if (!err && o->kv_mem > 0 && o->batch <= 0)
        err = ds_errorf("ds_engine_opts.kv_mem sizes the batched engine's KV pool: give batch > 0");
    if (!err && o->batch > 0) err = batch_shape(e, o, &to, &dopts);
    if (!err) err = ds_target_open(e->be, o->model_dir, &to, &e->target);
    if (!err && o->drafter_dir) err = ds_drafter_open(e->be, o->drafter_dir, e->target, &dopts, &e->drafter);
    if (!err) err = open_sts(o, e);
    if (!err && e->tp > 1) err = open_ranks(e, o, rank_threads, &to, &dopts);
    if (!err && o->batch > 0 && o->confidence_schedule) err = profile_steps(e, o);
    if (!err && o->batch > 0) err = open_live(e);
    if (!err) err = open_tokenizer(o, &e->tok);
    if (err) {
        ds_engine_free(e);
        return err;
    }
    *out = e;
    return NULL;
}

const ds_tokenizer *ds_engine_tokenizer(const ds_engine *e) { return e->tok; }

void ds_engine_get_info(const ds_engine *e, ds_engine_info *info) {
    *info = (ds_engine_info){.context = e->target->max_ctx,
                             .vocab_size = e->target->vocab,
                             .block_size = e->drafter ? e->drafter->gamma : 0,
                             .has_drafter = e->drafter != NULL,
                             .has_tokenizer = e->tok != NULL,
                             .has_confidence = e->drafter && e->drafter->confidence,
                             .calibrated = e->calibrated};
    if (!e->batched) return;
    info->kv_pages = e->bo.n_pages;
    info->kv_page_rows = e->bo.page_rows;
    info->kv_tokens = (int64_t)e->bo.n_pages * e->bo.page_rows;
    info->kv_target_row_bytes = e->kv_row[0];
    info->kv_drafter_row_bytes = e->drafter ? e->kv_row[1] : 0;
    /* As allocated: the drafter's pool was sized for the largest block (DS_MAX_GAMMA) before it opened. */
    info->kv_bytes = ds_kv_pool_bytes(&e->bo, DS_MAX_GAMMA, e->kv_row[0], info->kv_drafter_row_bytes);
    if (e->drafter)
        info->held_bytes =
            ds_batch_held_bytes(&e->bo, e->drafter->gamma, (int64_t)e->drafter->n_taps * e->drafter->hidden);
}

ds_error *ds_engine_chat_render(ds_engine *e, const ds_chat_message *msgs, size_t n, char **text) {
    *text = NULL;
    if (e->chat == DS_CHAT_UNKNOWN) DS_TRY(ds_chat_detect(e->model_dir, &e->chat));
    return ds_chat_render(e->chat, msgs, n, true, text);
}

ds_error *ds_engine_chat_encode(ds_engine *e, const ds_chat_message *msgs, size_t n, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!e->tok)
        return ds_errorf("a chat prompt needs a tokenizer, and %s has no tokenizer.json: open the engine with "
                         "ds_engine_opts.tokenizer (a tokenizer.json or a directory holding one)",
                         e->model_dir);
    char *text;
    DS_TRY(ds_engine_chat_render(e, msgs, n, &text));
    /* The templates write any BOS themselves: nothing special is added. */
    ds_error *err = ds_tokenizer_encode(e->tok, text, strlen(text), false, ids, n_ids);
    free(text);
    return err;
}

/* Each option's range, written so that NaN fails it too. */
static ds_error *check_opts(const ds_engine *e, const ds_generate_opts *o) {
    if (!(o->max_new >= 0)) return ds_errorf("ds_generate_opts.max_new must be >= 0, got %d", o->max_new);
    if (!(o->temperature >= 0 && isfinite(o->temperature)))
        return ds_errorf("ds_generate_opts.temperature must be a finite number >= 0, got %g", o->temperature);
    if (!(o->top_k >= 0)) return ds_errorf("ds_generate_opts.top_k must be >= 0 (0: off), got %d", o->top_k);
    if (!(o->top_p >= 0)) return ds_errorf("ds_generate_opts.top_p must be >= 0 (0 or >= 1: off), got %g", o->top_p);
    if (!(o->threshold >= 0 && o->threshold <= 1))
        return ds_errorf("ds_generate_opts.threshold must be in [0, 1], got %g", o->threshold);
    if (!(o->gamma >= 0)) return ds_errorf("ds_generate_opts.gamma must be >= 0 (0: the block size), got %d", o->gamma);
    if (e->drafter && !o->no_draft && o->gamma > e->drafter->gamma)
        return ds_errorf("ds_generate_opts.gamma %d is above the drafter's block size %d", o->gamma,
                         e->drafter->gamma);
    return NULL;
}

static ds_finish_reason finish_reason(ds_stop_reason r) {
    switch (r) {
    case DS_STOP_TOKEN: return DS_FINISH_STOP;
    case DS_STOP_CONTEXT: return DS_FINISH_CONTEXT;
    case DS_STOP_CALLER: return DS_FINISH_CALLER;
    case DS_STOP_LENGTH: break;
    }
    return DS_FINISH_LENGTH;
}

const char *ds_finish_reason_name(ds_finish_reason r) {
    switch (r) {
    case DS_FINISH_LENGTH: return ds_stop_reason_name(DS_STOP_LENGTH);
    case DS_FINISH_STOP: return ds_stop_reason_name(DS_STOP_TOKEN);
    case DS_FINISH_CONTEXT: return ds_stop_reason_name(DS_STOP_CONTEXT);
    case DS_FINISH_CALLER: return ds_stop_reason_name(DS_STOP_CALLER);
    }
    return "unknown";
}

static ds_gen_params gen_params(const ds_generate_opts *o) {
    return (ds_gen_params){.max_new = o->max_new,
                           .sampling = {.temperature = o->temperature, .top_k = o->top_k,
                                        .top_p = o->top_p > 0 && o->top_p < 1 ? o->top_p : 1.0f},
                           .seed = o->seed,
                           .threshold = o->threshold,
                           .gamma = o->gamma,
                           .ignore_stop = o->ignore_eos,
                           .record_conf = o->record_confidence};
}

/* A copy of the batched engine's result (which it owns) as an output. */
static ds_error *output_of(const ds_gen_result *r, ds_output *out) {
    memset(out, 0, sizeof *out);
    const size_t nt = (size_t)r->n_tokens, nr = (size_t)r->rounds;
    out->tokens = malloc((nt ? nt : 1) * sizeof *out->tokens);
    if (nr) {
        out->accepted = malloc(nr * sizeof *out->accepted);
        out->proposed = malloc(nr * sizeof *out->proposed);
        out->accept_len = malloc(nr * sizeof *out->accept_len);
    }
    if (!out->tokens || (nr && (!out->accepted || !out->proposed || !out->accept_len))) {
        ds_output_free(out);
        return ds_errorf("out of memory");
    }
    memcpy(out->tokens, r->tokens, nt * sizeof *out->tokens);
    if (nr) {
        memcpy(out->accepted, r->accepted, nr * sizeof *out->accepted);
        memcpy(out->proposed, r->proposed, nr * sizeof *out->proposed);
        memcpy(out->accept_len, r->accept_len, nr * sizeof *out->accept_len);
    }
    out->n_tokens = r->n_tokens;
    out->stopped = r->stopped;
    out->finish_reason = finish_reason(r->stop_reason);
    out->rounds = r->rounds;
    ds_metrics m = {0};
    ds_metrics_add(&m, r);
    out->acceptance_length = ds_metrics_tau(&m);
    return NULL;
}

/* What a request on the batched engine may not ask for, beyond check_opts. */
static ds_error *check_batched(const ds_engine *e, const ds_generate_opts *o, size_t n_prompt) {
    DS_TRY(check_opts(e, o));
    if (o->no_draft && e->drafter)
        return ds_errorf("no_draft: the batched engine drafts for every request (open it without a drafter to "
                         "decode autoregressively)");
    if (o->record_confidence) return ds_errorf("record_confidence is a single-request option (dspark calibrate)");
    if (n_prompt > (size_t)e->target->max_ctx)
        return ds_errorf("prompt of %zu tokens does not fit the context of %d tokens", n_prompt, e->target->max_ctx);
    return NULL;
}

ds_error *ds_engine_generate_batch(ds_engine *e, size_t n, const int32_t *const *prompts, const size_t *n_prompts,
                                   const ds_generate_opts *opts, ds_output *outs, ds_batch_summary *summary) {
    for (size_t i = 0; i < n; i++) memset(&outs[i], 0, sizeof outs[i]);
    if (!e->batched) return ds_errorf("ds_engine_generate_batch: open the engine with ds_engine_opts.batch > 0");
    for (size_t i = 0; i < n; i++) DS_TRY(ds_error_wrap(check_batched(e, &opts[i], n_prompts[i]), "request %zu", i));
    ds_batch_tp *g = e->live;
    const ds_batch *b = ds_batch_tp_lead(g);
    const ds_batch_stats st0 = ds_batch_get_stats(b);
    ds_error *err = NULL;
    int64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return ds_errorf("out of memory");
    size_t submitted = 0;
    for (; submitted < n && !err; submitted++) {
        const ds_batch_request rq = {.prompt = prompts[submitted], .n_prompt = (int)n_prompts[submitted],
                                     .params = gen_params(&opts[submitted])};
        err = ds_error_wrap(ds_batch_tp_submit(g, &rq, &ids[submitted]), "request %zu", submitted);
        if (err) break;
    }
    /* Steps until all of these are done (other requests the engine holds run along). */
    const double t0 = ds_now_s();
    int max_running = 0;
    for (size_t left = n; !err && left > 0;) {
        int active;
        err = ds_batch_tp_step(g, &active);
        const ds_batch_stats st = ds_batch_get_stats(b);
        if (st.running > max_running) max_running = st.running;
        left = 0; /* they end in any order */
        for (size_t k = 0; k < n; k++) left += !ds_batch_result(b, ids[k]);
        if (!err && active == 0 && left > 0) err = ds_errorf("batched engine: idle with %zu requests unfinished", left);
    }
    const double t1 = ds_now_s();
    for (size_t i = 0; i < n && !err; i++) {
        err = output_of(ds_batch_result(b, ids[i]), &outs[i]);
        outs[i].total_s = (t1 - t0) / (double)n; /* its share: pooled over the batch, the wall time */
    }
    if (summary) {
        const ds_batch_stats st = ds_batch_get_stats(b);
        *summary = (ds_batch_summary){.total_s = t1 - t0, .steps = (long)(st.steps - st0.steps),
                                      .preemptions = (long)(st.preemptions - st0.preemptions),
                                      .max_running = max_running};
    }
    if (err)
        for (size_t i = 0; i < n; i++) ds_output_free(&outs[i]);
    for (size_t i = 0; i < submitted; i++) ds_error_free(ds_batch_tp_release(g, ids[i]));
    free(ids);
    return err;
}

ds_error *ds_engine_submit(ds_engine *e, const int32_t *prompt, size_t n_prompt, const ds_generate_opts *opts,
                           ds_request_id *id) {
    *id = -1;
    if (!e->batched) return ds_errorf("ds_engine_submit: open the engine with ds_engine_opts.batch > 0");
    if (!opts) return ds_errorf("ds_engine_submit: no options");
    DS_TRY(check_batched(e, opts, n_prompt));
    const ds_batch_request rq = {.prompt = prompt, .n_prompt = (int)n_prompt, .params = gen_params(opts)};
    return ds_batch_tp_submit(e->live, &rq, id);
}

ds_error *ds_engine_step(ds_engine *e, int *active) {
    *active = 0;
    if (!e->batched) return ds_errorf("ds_engine_step: open the engine with ds_engine_opts.batch > 0");
    return ds_batch_tp_step(e->live, active);
}

ds_error *ds_engine_request(const ds_engine *e, ds_request_id id, ds_request_state *st) {
    memset(st, 0, sizeof *st);
    if (!e->batched) return ds_errorf("ds_engine_request: open the engine with ds_engine_opts.batch > 0");
    ds_batch_state_info in;
    DS_TRY(ds_batch_state(ds_batch_tp_lead(e->live), id, &in));
    const ds_gen_result *r = in.res;
    long acc = 0, prop = 0;
    for (int i = 0; i < r->rounds; i++) acc += r->accepted[i], prop += r->proposed[i];
    *st = (ds_request_state){.tokens = r->tokens, .n_tokens = (size_t)r->n_tokens, .n_prompt = (size_t)in.n_prompt,
                             .running = in.running, .finished = in.finished,
                             .finish_reason = finish_reason(r->stop_reason), .rounds = r->rounds, .accepted = acc,
                             .proposed = prop};
    return NULL;
}

ds_error *ds_engine_cancel(ds_engine *e, ds_request_id id) {
    if (!e->batched) return ds_errorf("ds_engine_cancel: open the engine with ds_engine_opts.batch > 0");
    return ds_batch_tp_cancel(e->live, id);
}

ds_error *ds_engine_release(ds_engine *e, ds_request_id id) {
    if (!e->batched) return ds_errorf("ds_engine_release: open the engine with ds_engine_opts.batch > 0");
    return ds_batch_tp_release(e->live, id);
}

void ds_engine_get_metrics(const ds_engine *e, ds_engine_metrics *m) {
    memset(m, 0, sizeof *m);
    if (!e->batched) return;
    const ds_batch_stats st = ds_batch_get_stats(ds_batch_tp_lead(e->live));
    *m = (ds_engine_metrics){.running = st.running, .waiting = st.waiting, .kv_pages_used = st.pages_used,
                             .kv_pages_total = st.pages_total, .kv_page_rows = e->bo.page_rows, .steps = st.steps,
                             .prompt_tokens = st.prefill_rows, .generation_tokens = st.generation_tokens,
                             .preemptions = st.preemptions, .requests_finished = st.finished, .drafts = st.drafts,
                             .draft_tokens = st.draft_tokens, .accepted_tokens = st.accepted_tokens};
    for (int k = 0; k < DS_METRICS_POSITIONS && k < DS_MAX_GAMMA; k++) m->accepted_per_pos[k] = st.accepted_pos[k];
}

/* An output's rounds as the loop's result, for the metrics code (a view: it owns nothing). */
static ds_gen_result result_view(const ds_output *o) {
    return (ds_gen_result){.n_tokens = o->n_tokens, .rounds = o->rounds, .accepted = o->accepted,
                           .proposed = o->proposed, .accept_len = o->accept_len, .prefill_s = o->prefill_s,
                           .draft_s = o->draft_s, .verify_s = o->verify_s, .total_s = o->total_s};
}

/* Tensor parallel: the same generation on every rank at once. A caller's stop (on_token false) cannot end
 * rank 0's loop alone (the others would wait in a collective): its tokens stop reaching the caller and the
 * output is cut there, while every rank runs to the common end. */
typedef struct {
    ds_engine *e;
    const ds_gen_params *p;
    const int32_t *prompt;
    int n_prompt;
    bool no_draft;
    ds_gen_result r;
    ds_error *err;
} rank_gen;

static void *rank_gen_main(void *arg) {
    rank_gen *g = arg;
    if (g->e->be->ops->bind_thread) g->e->be->ops->bind_thread(g->e->be); /* its GPU, in this thread */
    g->err = ds_generate(g->e->target, g->no_draft ? NULL : g->e->drafter, g->prompt, g->n_prompt, g->p, NULL, NULL,
                         &g->r);
    if (g->err) ds_comm_abort(g->e->target->comm); /* the others may wait for this rank in a collective */
    return NULL;
}

typedef struct {
    ds_on_token fn;
    void *user;
    int delivered;
    bool stopped;
} tp_tokens;

static bool tp_on_token(void *user, int32_t token) {
    tp_tokens *t = user;
    if (t->stopped || !t->fn) return true;
    if (!t->fn(t->user, token)) t->stopped = true;
    t->delivered++;
    return true;
}

static ds_error *generate_tp(ds_engine *e, const ds_generate_opts *o, const ds_gen_params *p, const int32_t *prompt,
                             int n_prompt, ds_on_token on_token, void *user, ds_gen_result *out) {
    rank_gen g[64];
    pthread_t th[64];
    int started = 1;
    if (ds_comm_failed_rank(e->target->comm) >= 0)
        return ds_errorf("tensor parallel: the ranks stopped after rank %d failed; reopen the engine",
                         ds_comm_failed_rank(e->target->comm));
    for (int r = 1; r < e->tp; r++, started++) {
        g[r] = (rank_gen){.e = e->ranks[r], .p = p, .prompt = prompt, .n_prompt = n_prompt, .no_draft = o->no_draft};
        if (pthread_create(&th[r], NULL, rank_gen_main, &g[r])) abort(); /* the started ranks would wait forever */
    }
    tp_tokens tt = {.fn = on_token, .user = user};
    if (e->be->ops->bind_thread) e->be->ops->bind_thread(e->be);
    ds_error *const e0 = ds_generate(e->target, o->no_draft ? NULL : e->drafter, prompt, n_prompt, p, tp_on_token, &tt, out);
    if (e0) ds_comm_abort(e->target->comm);
    for (int r = 1; r < started; r++) pthread_join(th[r], NULL);
    /* The error of the rank that stopped the group first: the others' are what its absence did to them. */
    const int failed = ds_comm_failed_rank(e->target->comm);
    ds_error *err = e0;
    if (failed > 0 && g[failed].err) {
        ds_error_free(e0);
        err = ds_error_wrap(g[failed].err, "tensor-parallel rank %d", failed);
        g[failed].err = NULL;
        if (!e0) ds_gen_result_free(out);
        for (int r = 1; r < e->tp; r++) {
            if (g[r].err) ds_error_free(g[r].err);
            else if (r != failed) ds_gen_result_free(&g[r].r);
        }
        return err;
    }
    for (int r = 1; r < e->tp; r++) {
        if (!err && g[r].err) err = ds_error_wrap(g[r].err, "tensor-parallel rank %d", r);
        else if (g[r].err) ds_error_free(g[r].err);
        else if (!e0 && (g[r].r.n_tokens != out->n_tokens ||
                          memcmp(g[r].r.tokens, out->tokens, (size_t)out->n_tokens * sizeof *out->tokens)))
            err = ds_errorf("tensor parallel: rank %d generated other tokens than rank 0 (the ranks must compute the "
                            "same logits bit for bit)", r);
        if (!g[r].err) ds_gen_result_free(&g[r].r);
    }
    if (err) {
        if (!e0) ds_gen_result_free(out); /* rank 0's, when it has one */
        return err;
    }
    if (tt.stopped && tt.delivered < out->n_tokens) { /* the caller stopped here */
        out->n_tokens = tt.delivered;
        out->stop_reason = DS_STOP_CALLER;
    }
    return NULL;
}

ds_error *ds_engine_generate(ds_engine *e, const int32_t *prompt, size_t n_prompt, const ds_generate_opts *o,
                             ds_on_token on_token, void *user, ds_output *out) {
    memset(out, 0, sizeof *out);
    if (!o) return ds_errorf("ds_engine_generate: no options");
    DS_TRY(check_opts(e, o));
    if (n_prompt > (size_t)e->target->max_ctx)
        return ds_errorf("prompt of %zu tokens does not fit the model's context of %d tokens", n_prompt,
                         e->target->max_ctx);
    if (e->batched) { /* a batch of one; the tokens go to on_token once it has ended */
        DS_TRY(ds_engine_generate_batch(e, 1, &prompt, &n_prompt, o, out, NULL));
        for (int i = 0; i < out->n_tokens && on_token; i++)
            if (!on_token(user, out->tokens[i])) break;
        return NULL;
    }
    ds_gen_params p = gen_params(o);
    ds_gen_result r;
    if (e->tp > 1) DS_TRY(generate_tp(e, o, &p, prompt, (int)n_prompt, on_token, user, &r));
    else DS_TRY(ds_generate(e->target, o->no_draft ? NULL : e->drafter, prompt, (int)n_prompt, &p, on_token, user, &r));
    *out = (ds_output){.tokens = r.tokens, .n_tokens = r.n_tokens, .stopped = r.stopped,
                       .finish_reason = finish_reason(r.stop_reason), .rounds = r.rounds, .accepted = r.accepted,
                       .proposed = r.proposed, .accept_len = r.accept_len, .prefill_s = r.prefill_s,
                       .draft_s = r.draft_s, .verify_s = r.verify_s, .total_s = r.total_s, .confidence = r.conf};
    ds_metrics m = {0};
    ds_metrics_add(&m, &r);
    out->acceptance_length = ds_metrics_tau(&m);
    return NULL; /* r's arrays are *out's now */
}

void ds_output_free(ds_output *o) {
    free(o->tokens);
    free(o->accepted);
    free(o->proposed);
    free(o->accept_len);
    free(o->confidence);
    memset(o, 0, sizeof *o);
}

struct ds_stats {
    ds_metrics m;
};

ds_error *ds_stats_new(ds_stats **out) {
    if (!(*out = calloc(1, sizeof **out))) return ds_errorf("out of memory");
    return NULL;
}

void ds_stats_free(ds_stats *s) { free(s); }

void ds_stats_add(ds_stats *s, const ds_output *o) {
    ds_gen_result r = result_view(o);
    ds_metrics_add(&s->m, &r);
}

void ds_stats_summarize(const ds_stats *s, ds_stats_summary *out) {
    const ds_metrics *m = &s->m;
    *out = (ds_stats_summary){.outputs = m->samples,
                              .tokens = m->tokens,
                              .rounds = m->rounds,
                              .acceptance_length = ds_metrics_tau(m),
                              .verify_rate = ds_metrics_verify_rate(m),
                              .proposed_per_round = m->rounds ? (double)m->proposal_sum / m->rounds : 0,
                              .total_s = m->total_s,
                              .prefill_s = m->prefill_s,
                              .draft_s = m->draft_s,
                              .verify_s = m->verify_s};
}

double ds_stats_accept_rate_at(const ds_stats *s, int k) { return ds_metrics_accept_rate_at(&s->m, k); }
