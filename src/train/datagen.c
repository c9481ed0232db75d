#include "train/datagen.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "io/train_cache.h"
#include "speculate/generate.h"

typedef struct {
    ds_target *t;
    const ds_datagen_opts *o;
    ds_datagen_stats *st;
    ds_train_manifest m;
    double t0, last_report;
    float *taps, *final_hidden; /* host rows of one forward chunk */
    /* batched generation: prompts [0, submitted) were submitted ahead of the writer (req[i]: prompt i's
     * request, -1 for none: raw, or written before this run), so the engine stays full while the shards
     * are written in prompt order */
    const ds_datagen_prompt *prompts;
    int64_t n_prompts, submitted;
    int64_t *req;
    int lock_fd;      /* CACHE/.lock, held while this run writes (-1: none) */
} run_state;

static void report(run_state *r, bool force) {
    const double now = ds_now_s();
    r->st->elapsed_s = now - r->t0;
    if (!r->o->progress || (!force && now - r->last_report < 0.25)) return;
    r->last_report = now;
    r->o->progress(r->o->user, r->st);
}

static bool on_token(void *user, int32_t tok) {
    (void)tok;
    run_state *r = user;
    r->st->gen_tokens++;
    report(r, false);
    return true;
}

/* The manifest this run would write: the identity of what it makes. */
static ds_error *want_manifest(const ds_target *t, const ds_datagen_prompt *p, size_t n, const ds_datagen_opts *o,
                               ds_train_manifest *m) {
    memset(m, 0, sizeof *m);
    if (o->n_taps > DS_TRAIN_MAX_TAPS) return ds_errorf("%d tap layers (at most %d)", o->n_taps, DS_TRAIN_MAX_TAPS);
    if (o->seed > (1ull << 53)) return ds_errorf("--seed %llu: at most 2^53", (unsigned long long)o->seed);
    if (o->shard_tokens < 1) return ds_errorf("shard_tokens must be >= 1");
    DS_TRY(ds_model_identity_of(o->target_dir, &m->target));
    snprintf(m->model_type, sizeof m->model_type, "%s", t->model_type);
    snprintf(m->backend, sizeof m->backend, "%s", t->be->ops->name);
    snprintf(m->target_dir, sizeof m->target_dir, "%s", o->target_dir);
    snprintf(m->prompt_file, sizeof m->prompt_file, "%s", o->prompt_file ? o->prompt_file : "");
    m->vocab = t->vocab, m->hidden = t->hidden, m->n_layers = t->n_layers;
    m->n_taps = o->n_taps;
    memcpy(m->tap_layers, o->taps, (size_t)o->n_taps * sizeof *o->taps);
    m->temperature = o->sampling.temperature;
    m->top_p = o->sampling.top_p > 0 && o->sampling.top_p < 1 ? o->sampling.top_p : 1.0f;
    m->top_k = o->sampling.top_k;
    m->max_new = o->max_new;
    m->seed = o->seed;
    m->ignore_eos = o->ignore_eos;
    m->n_prompts = (int64_t)n;
    uint64_t h = DS_FNV64_INIT;
    for (size_t i = 0; i < n; i++) {
        const int64_t len = p[i].raw ? -(int64_t)p[i].n : p[i].n; /* a raw sequence hashes apart */
        m->n_raw += p[i].raw;
        h = ds_fnv64(h, &len, sizeof len);
        h = ds_fnv64(h, p[i].ids, (size_t)p[i].n * sizeof *p[i].ids);
    }
    m->prompts_hash = h;
    m->shard_tokens = o->shard_tokens;
    m->cache_id = ds_train_manifest_id(m);
    return NULL;
}

static bool dir_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return false;
    bool empty = true;
    for (struct dirent *de; empty && (de = readdir(d));)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && strcmp(de->d_name, ".lock")) empty = false;
    closedir(d);
    return empty;
}

/* An existing cache: the same identity, then the listed shards that still check out, in order. */
static ds_error *resume(run_state *r) {
    ds_train_manifest have;
    DS_TRY(ds_train_manifest_read(r->o->out_dir, &have));
    ds_error *e = ds_train_manifest_compare(&have, &r->m);
    if (e) {
        ds_train_manifest_free(&have);
        return ds_error_wrap(e, "%s was made by another datagen run (resume needs the same target, taps, sampling, "
                                "prompts and --shard-tokens; use another --out)", r->o->out_dir);
    }
    for (int i = 0; i < have.n_shards && !e; i++) {
        const ds_train_shard_info *s = &have.shards[i];
        const ds_shard_expect x = {.n_taps = (uint32_t)r->m.n_taps, .hidden = (uint32_t)r->m.hidden,
                                   .vocab = r->m.vocab, .cache_id = r->m.cache_id, .first_seq = (uint64_t)s->first_seq,
                                   .n_seqs = s->n_seqs, .n_tokens = s->n_tokens};
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", r->o->out_dir, s->file);
        ds_shard *sh = NULL;
        ds_error *bad = ds_shard_open(path, &x, &sh);
        ds_shard_close(sh);
        if (bad) { /* this shard and the ones after it are made again */
            r->st->shards_dropped = have.n_shards - i;
            ds_error_free(bad);
            break;
        }
        e = ds_train_manifest_add_shard(&r->m, s);
        r->st->seqs_resumed += s->n_seqs;
    }
    ds_train_manifest_free(&have);
    return e;
}

static ds_error *open_out(run_state *r) {
    const char *dir = r->o->out_dir;
    if (mkdir(dir, 0755) && errno != EEXIST) return ds_errorf("%s: cannot create: %s", dir, strerror(errno));
    char path[4096];
    /* Two runs writing one cache would interleave shards and manifests: the second is refused. */
    if (snprintf(path, sizeof path, "%s/.lock", dir) >= (int)sizeof path) return ds_errorf("%s: path too long", dir);
    r->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (r->lock_fd < 0) return ds_errorf("%s: %s", path, strerror(errno));
    if (flock(r->lock_fd, LOCK_EX | LOCK_NB))
        return ds_errorf("%s: another dspark datagen is writing this cache (%s is locked)", dir, path);
    if (snprintf(path, sizeof path, "%s/%s", dir, DS_TRAIN_MANIFEST) >= (int)sizeof path)
        return ds_errorf("%s: path too long", dir);
    struct stat st;
    if (!stat(path, &st)) return resume(r);
    if (!dir_is_empty(dir))
        return ds_errorf("%s: not empty and holds no %s: not a cache to resume (give a new or empty directory)", dir,
                         DS_TRAIN_MANIFEST);
    return NULL;
}

/* One forward over the whole sequence, chunk by chunk: every row's taps and final hidden state to the shard. */
static ds_error *collect(run_state *r, ds_shard_writer *w, const int32_t *ids, int len) {
    ds_target *t = r->t;
    const int64_t tw = (int64_t)t->n_taps * t->hidden;
    for (int p0 = 0; p0 < len; p0 += t->max_rows) {
        const int m = len - p0 < t->max_rows ? len - p0 : t->max_rows;
        DS_TRY(ds_target_forward(t, ids + p0, m, p0, 0));
        if (tw) t->be->ops->download(t->be, ds_rows(t->taps, 0, m), r->taps);
        t->be->ops->download(t->be, ds_rows(t->final_hidden, 0, m), r->final_hidden);
        DS_TRY(ds_backend_check(t->be));
        DS_TRY(ds_shard_writer_rows(w, p0, m, r->taps, r->final_hidden));
    }
    return NULL;
}

/* ds_generate's parameters for prompt i (seed + i): the forward over prompt + continuation must fit the
 * context, so a continuation ends there. */
static ds_error *gen_params(const run_state *r, const ds_datagen_prompt *p, int64_t i, ds_gen_params *gp) {
    const ds_target *t = r->t;
    if (p->n < 1) return ds_errorf("empty prompt");
    if (p->raw && p->n > t->max_ctx)
        return ds_errorf("raw sequence of %d tokens is longer than the target's context of %d", p->n, t->max_ctx);
    if (p->raw) return NULL;
    if (p->n >= t->max_ctx)
        return ds_errorf("prompt of %d tokens leaves no room in the target's context of %d", p->n, t->max_ctx);
    const int room = t->max_ctx - p->n;
    *gp = (ds_gen_params){.max_new = r->o->max_new < room ? r->o->max_new : room, .sampling = r->o->sampling,
                          .seed = r->o->seed + (uint64_t)i, .ignore_stop = r->o->ignore_eos};
    return NULL;
}

/* Submits prompts up to 2 x max_seqs ahead of prompt i: a full engine, and a queue to refill it from. */
static ds_error *top_up(run_state *r, int64_t i) {
    ds_gen_batch *g = r->o->batch;
    for (; r->submitted < r->n_prompts && r->submitted <= i + 2 * (int64_t)g->max_seqs; r->submitted++) {
        const int64_t k = r->submitted;
        const ds_datagen_prompt *p = &r->prompts[k];
        ds_batch_request rq = {.prompt = p->ids, .n_prompt = p->n};
        ds_error *e = gen_params(r, p, k, &rq.params);
        if (!e && !p->raw) e = ds_batch_submit(g->b, &rq, &r->req[k]);
        if (e) return ds_error_wrap(e, "prompt %lld (%s:%d)", (long long)k,
                                    r->o->prompt_file ? r->o->prompt_file : "prompts", p->line);
    }
    return NULL;
}

/* Prompt i's continuation from the batched engine: steps until it is finished (the others keep going). */
static ds_error *batched_continuation(run_state *r, int64_t i, int32_t **gen, int *n_gen) {
    ds_gen_batch *g = r->o->batch;
    const double t0 = ds_now_s();
    ds_error *e = top_up(r, i);
    ds_batch_state_info st = {0};
    while (!e && !(e = ds_batch_state(g->b, r->req[i], &st)) && !st.finished) {
        const int64_t before = ds_batch_get_stats(g->b).generation_tokens;
        int active;
        e = ds_batch_step(g->b, &active);
        r->st->gen_tokens += ds_batch_get_stats(g->b).generation_tokens - before;
        if (!e) e = top_up(r, i);
        if (!e && active == 0 && !ds_batch_result(g->b, r->req[i]))
            e = ds_errorf("batched engine: idle before prompt %lld finished", (long long)i);
        report(r, false);
    }
    if (!e) {
        const ds_gen_result *res = ds_batch_result(g->b, r->req[i]);
        *n_gen = res ? res->n_tokens : 0;
        *gen = malloc((size_t)(*n_gen ? *n_gen : 1) * sizeof **gen);
        if (!res || !*gen) e = ds_errorf("batched engine: no result for prompt %lld", (long long)i);
        else memcpy(*gen, res->tokens, (size_t)*n_gen * sizeof **gen);
        ds_error_free(ds_batch_release(g->b, r->req[i]));
        r->req[i] = -1;
    }
    r->st->gen_s += ds_now_s() - t0;
    return e;
}

/* Prompt i's continuation: from the batched engine, or ds_generate now. *gen is malloc'd. */
static ds_error *continuation(run_state *r, const ds_datagen_prompt *p, int64_t i, int32_t **gen, int *n_gen) {
    if (p->raw) {
        ds_gen_params unused;
        *gen = NULL;
        *n_gen = 0;
        return gen_params(r, p, i, &unused); /* its checks */
    }
    if (r->o->batch) return batched_continuation(r, i, gen, n_gen);
    ds_gen_params gp;
    DS_TRY(gen_params(r, p, i, &gp));
    const double t0 = ds_now_s();
    ds_gen_result g;
    DS_TRY(ds_generate(r->t, NULL, p->ids, p->n, &gp, on_token, r, &g));
    r->st->gen_s += ds_now_s() - t0;
    *gen = g.tokens;
    *n_gen = g.n_tokens;
    g.tokens = NULL;
    ds_gen_result_free(&g);
    return NULL;
}

static ds_error *one_sequence(run_state *r, ds_shard_writer *w, const ds_datagen_prompt *p, int64_t i) {
    int32_t *gen = NULL;
    int n_gen = 0;
    DS_TRY(continuation(r, p, i, &gen, &n_gen));
    const int len = p->n + n_gen;
    int32_t *ids = malloc((size_t)len * sizeof *ids);
    ds_error *e = ids ? NULL : ds_errorf("out of memory");
    if (!e) {
        memcpy(ids, p->ids, (size_t)p->n * sizeof *ids);
        if (n_gen) memcpy(ids + p->n, gen, (size_t)n_gen * sizeof *ids); /* a raw sequence has none (gen NULL) */
    }
    free(gen);
    const double t1 = ds_now_s();
    if (!e) e = ds_shard_writer_begin(w, ids, len, p->raw ? 0 : p->n);
    if (!e) e = collect(r, w, ids, len);
    r->st->forward_s += ds_now_s() - t1;
    r->st->tokens += len;
    free(ids);
    return e;
}

static ds_error *close_shard(run_state *r, ds_shard_writer *w, int64_t first_seq, bool complete) {
    ds_train_shard_info s = {.first_seq = first_seq, .n_seqs = ds_shard_writer_seqs(w),
                             .n_tokens = ds_shard_writer_tokens(w)};
    snprintf(s.file, sizeof s.file, "shard-%05d.bin", r->m.n_shards);
    DS_TRY(ds_shard_writer_finish(w, &s.bytes));
    r->st->bytes += s.bytes;
    DS_TRY(ds_train_manifest_add_shard(&r->m, &s));
    r->m.complete = complete;
    return ds_train_manifest_write(r->o->out_dir, &r->m);
}

static ds_error *run(run_state *r, const ds_datagen_prompt *prompts, size_t n) {
    ds_target *t = r->t;
    const ds_datagen_opts *o = r->o;
    DS_TRY(ds_target_set_taps(t, o->taps, o->n_taps)); /* checked before anything is written */
    DS_TRY(open_out(r));
    int64_t next = r->st->seqs_resumed;
    r->submitted = next; /* batched: the prompts already in shards are not generated again */
    r->st->seqs_done = next;
    r->m.complete = (size_t)next == n;
    DS_TRY(ds_train_manifest_write(o->out_dir, &r->m)); /* a dropped shard leaves the list now */
    if ((size_t)next == n) return NULL;
    r->taps = malloc((size_t)t->max_rows * (size_t)(o->n_taps ? o->n_taps : 1) * (size_t)t->hidden * sizeof(float));
    r->final_hidden = malloc((size_t)t->max_rows * (size_t)t->hidden * sizeof(float));
    if (!r->taps || !r->final_hidden) return ds_errorf("out of memory");
    ds_shard_writer *w = NULL;
    int64_t first = next, this_run = 0;
    ds_error *e = NULL;
    for (int64_t i = next; (size_t)i < n && !e; i++) {
        if (!w) {
            char path[4096];
            snprintf(path, sizeof path, "%s/shard-%05d.bin", o->out_dir, r->m.n_shards);
            e = ds_shard_writer_open(path, (uint32_t)o->n_taps, (uint32_t)t->hidden, r->m.cache_id, (uint64_t)i, &w);
            first = i;
            if (e) break;
        }
        e = ds_error_wrap(one_sequence(r, w, &prompts[i], i), "prompt %lld (%s:%d)", (long long)i,
                          o->prompt_file ? o->prompt_file : "prompts", prompts[i].line);
        if (e) break;
        r->st->seqs_done = i + 1;
        if (o->stop_after > 0 && ++this_run >= o->stop_after && (size_t)i + 1 < n) break; /* the open shard is lost */
        const bool last = (size_t)i + 1 == n;
        if (last || ds_shard_writer_tokens(w) >= o->shard_tokens) {
            e = close_shard(r, w, first, last);
            ds_shard_writer_free(w);
            w = NULL;
        }
        report(r, true);
    }
    ds_shard_writer_free(w); /* an unfinished shard's temporary file goes with it */
    return e;
}

ds_error *ds_datagen_run(ds_target *t, const ds_datagen_prompt *prompts, size_t n, const ds_datagen_opts *o,
                         ds_datagen_stats *stats) {
    memset(stats, 0, sizeof *stats);
    stats->seqs_total = (int64_t)n;
    run_state r = {.t = t, .o = o, .st = stats, .t0 = ds_now_s(), .prompts = prompts, .n_prompts = (int64_t)n,
                   .lock_fd = -1};
    ds_error *e = want_manifest(t, prompts, n, o, &r.m);
    if (!e && o->batch) {
        if (!(r.req = malloc((n ? n : 1) * sizeof *r.req))) e = ds_errorf("out of memory");
        for (size_t i = 0; r.req && i < n; i++) r.req[i] = -1;
    }
    if (!e) e = run(&r, prompts, n);
    report(&r, true);
    free(r.taps);
    free(r.final_hidden);
    for (size_t i = 0; r.req && i < n; i++) /* an interrupted run's requests in flight */
        if (r.req[i] >= 0) ds_error_free(ds_batch_release(o->batch->b, r.req[i]));
    free(r.req);
    if (r.lock_fd >= 0) close(r.lock_fd); /* releases the lock */
    ds_train_manifest_free(&r.m);
    return e;
}
