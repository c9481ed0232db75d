/* ds_batch_tp (batch_tp.h): every rank's batched engine, stepped together. */
#include "batch/batch_tp.h"

#include <pthread.h>
#include <stdlib.h>

#include "backend/comm.h"

typedef struct job job;

/* Ranks 1.. each keep one thread for the engine's life (world > 1), bound
 * to their backend once, woken for each collective call: a call hands them
 * jobs under mu and counts them back, where a thread was made, bound and
 * joined per rank per step before. */
typedef struct {
    pthread_t th;
    int rank;
    struct ds_batch_tp *g;
    long seen; /* the last call this rank ran */
    bool started;
} crew_member;

struct ds_batch_tp {
    int world;
    ds_batch **b;
    ds_backend **be; /* rank r's backend: its thread binds it (its GPU) */
    ds_comm **comm;  /* rank r's handle of the group (world > 1) */
    crew_member *crew;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    bool sync_made;
    long call;    /* calls posted */
    int finished; /* ranks 1.. done with the current call */
    bool quit;
    job *jobs;    /* the current call's, one a rank */
};

ds_batch *ds_batch_tp_lead(const ds_batch_tp *g) { return g->b[0]; }

/* This thread on rank r's device (CUDA: what a rank's buffers are made and freed on). */
static void bind(ds_backend *be) {
    if (be && be->ops->bind_thread) be->ops->bind_thread(be);
}

/* What one rank runs in a collective call: a step, or the profile. */
struct job {
    ds_batch *b;
    ds_backend *be;
    ds_comm *comm; /* world > 1 */
    bool bind;     /* rank 0 (the caller's thread): bind first */
    bool profile;
    const ds_step_cost_key *key;
    const char *cache;
    FILE *log;
    ds_step_cost *sps;
    int active;
    ds_error *err;
};

static void run_job(job *j) {
    if (j->bind) bind(j->be); /* its GPU, in this thread */
    j->err = j->profile ? ds_batch_profile(j->b, j->key, j->cache, j->log, &j->sps) : ds_batch_step(j->b, &j->active);
    if (j->err && j->comm) ds_comm_abort(j->comm); /* the others may wait for this rank in a collective */
}

/* Rank m->rank's thread: bound once, then each posted call's job, until quit. */
static void *crew_main(void *p) {
    crew_member *m = p;
    ds_batch_tp *g = m->g;
    bind(g->be[m->rank]);
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (!g->quit && g->call == m->seen) pthread_cond_wait(&g->go, &g->mu);
        if (g->quit) {
            pthread_mutex_unlock(&g->mu);
            return NULL;
        }
        m->seen = g->call;
        job *j = &g->jobs[m->rank];
        pthread_mutex_unlock(&g->mu);
        run_job(j);
        pthread_mutex_lock(&g->mu);
        if (++g->finished == g->world - 1) pthread_cond_signal(&g->done);
        pthread_mutex_unlock(&g->mu);
    }
}

static ds_error *crew_start(ds_batch_tp *g) {
    if (pthread_mutex_init(&g->mu, NULL)) return ds_errorf("tensor parallel: no mutex for the rank threads");
    if (pthread_cond_init(&g->go, NULL)) {
        pthread_mutex_destroy(&g->mu);
        return ds_errorf("tensor parallel: no condition variable for the rank threads");
    }
    if (pthread_cond_init(&g->done, NULL)) {
        pthread_cond_destroy(&g->go);
        pthread_mutex_destroy(&g->mu);
        return ds_errorf("tensor parallel: no condition variable for the rank threads");
    }
    g->sync_made = true;
    if (!(g->crew = calloc((size_t)g->world, sizeof *g->crew))) return ds_errorf("out of memory");
    for (int r = 1; r < g->world; r++) {
        g->crew[r] = (crew_member){.rank = r, .g = g};
        if (pthread_create(&g->crew[r].th, NULL, crew_main, &g->crew[r]))
            return ds_errorf("tensor parallel: could not start rank %d's thread", r);
        g->crew[r].started = true;
    }
    return NULL;
}

static void crew_stop(ds_batch_tp *g) {
    if (!g->crew) return;
    pthread_mutex_lock(&g->mu);
    g->quit = true;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    for (int r = 1; r < g->world; r++)
        if (g->crew[r].started) pthread_join(g->crew[r].th, NULL);
    free(g->crew);
    g->crew = NULL;
}

void ds_batch_tp_free(ds_batch_tp *g) {
    if (!g) return;
    crew_stop(g);
    if (g->sync_made) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->go);
        pthread_cond_destroy(&g->done);
    }
    for (int r = g->world - 1; r >= 0 && g->b; r--) { /* rank 0's device last: the caller's */
        if (g->world > 1 && g->be) bind(g->be[r]);
        ds_batch_free(g->b[r]);
    }
    free(g->b);
    free(g->be);
    free(g->comm);
    free(g);
}

ds_error *ds_batch_tp_new(int world, ds_target *const *t, ds_drafter *const *d, const ds_batch_opts *opts,
                          ds_batch_tp **out) {
    *out = NULL;
    if (world < 1 || world > 64) return ds_errorf("batched engine: %d tensor-parallel ranks (1..64)", world);
    for (int r = 0; r < world; r++) {
        const ds_comm *c = t[r]->comm;
        if ((c ? c->world : 1) != world || (c && c->rank != r))
            return ds_errorf("batched engine over %d ranks: target %d is rank %d of %d", world, r, c ? c->rank : 0,
                             c ? c->world : 1);
    }
    ds_batch_tp *g = calloc(1, sizeof *g);
    if (!g) return ds_errorf("out of memory");
    g->world = world;
    g->b = calloc((size_t)world, sizeof *g->b);
    g->be = calloc((size_t)world, sizeof *g->be);
    g->comm = calloc((size_t)world, sizeof *g->comm);
    ds_error *e = !g->b || !g->be || !g->comm ? ds_errorf("out of memory") : NULL;
    for (int r = world - 1; r >= 0 && !e; r--) { /* rank 0's device last: the caller's */
        g->be[r] = t[r]->be;
        g->comm[r] = t[r]->comm;
        if (world > 1) bind(g->be[r]);
        ds_batch_opts ro = *opts;
        if (r > 0) ro.trace = NULL; /* rank 0's steps alone are traced (every rank takes the same decisions) */
        e = ds_batch_new(t[r], d ? d[r] : NULL, &ro, &g->b[r]);
        if (e && world > 1) e = ds_error_wrap(e, "tensor-parallel rank %d", r);
    }
    if (!e && world > 1) e = crew_start(g);
    if (e) {
        ds_batch_tp_free(g);
        return e;
    }
    *out = g;
    return NULL;
}

ds_error *ds_batch_tp_submit(ds_batch_tp *g, const ds_batch_request *req, int64_t *id) {
    DS_TRY(ds_batch_submit(g->b[0], req, id));
    for (int r = 1; r < g->world; r++) {
        int64_t mine;
        ds_error *e = ds_batch_submit(g->b[r], req, &mine);
        if (e || mine != *id) { /* cannot happen but for memory: the same checks on the same state */
            for (int q = 0; q < r; q++) ds_error_free(ds_batch_release(g->b[q], *id));
            if (!e) ds_error_free(ds_batch_release(g->b[r], mine));
            return e ? ds_error_wrap(e, "tensor-parallel rank %d", r)
                     : ds_errorf("tensor parallel: rank %d numbered a request %lld, rank 0 %lld", r, (long long)mine,
                                 (long long)*id);
        }
    }
    return NULL;
}

/* Rank 0 first: an unknown id is its error, and then no rank has changed. */
ds_error *ds_batch_tp_cancel(ds_batch_tp *g, int64_t id) {
    DS_TRY(ds_batch_cancel(g->b[0], id));
    for (int r = 1; r < g->world; r++) DS_TRY(ds_error_wrap(ds_batch_cancel(g->b[r], id), "tensor-parallel rank %d", r));
    return NULL;
}

ds_error *ds_batch_tp_release(ds_batch_tp *g, int64_t id) {
    DS_TRY(ds_batch_release(g->b[0], id));
    for (int r = 1; r < g->world; r++) DS_TRY(ds_error_wrap(ds_batch_release(g->b[r], id), "tensor-parallel rank %d", r));
    return NULL;
}

/* jobs[r] on rank r's thread (rank 0's in this one), all at once, all waited for; the error of the rank that
 * stopped the group (the others' are what its absence did to them), else the first (rank 0's first); the others
 * freed. A stopped group stays stopped. */
static ds_error *on_every_rank(ds_batch_tp *g, job *jobs) {
    if (g->world > 1 && ds_comm_failed_rank(g->comm[0]) >= 0)
        return ds_errorf("tensor parallel: the ranks stopped after rank %d failed; reopen the engine",
                         ds_comm_failed_rank(g->comm[0]));
    for (int r = 0; r < g->world; r++)
        jobs[r].b = g->b[r], jobs[r].be = g->be[r], jobs[r].bind = r == 0 && g->world > 1,
        jobs[r].comm = g->world > 1 ? g->comm[r] : NULL;
    if (g->world > 1) {
        pthread_mutex_lock(&g->mu);
        g->jobs = jobs;
        g->finished = 0;
        g->call++;
        pthread_cond_broadcast(&g->go);
        pthread_mutex_unlock(&g->mu);
    }
    run_job(&jobs[0]);
    if (g->world > 1) {
        pthread_mutex_lock(&g->mu);
        while (g->finished < g->world - 1) pthread_cond_wait(&g->done, &g->mu);
        g->jobs = NULL;
        pthread_mutex_unlock(&g->mu);
    }
    const int failed = g->world > 1 ? ds_comm_failed_rank(g->comm[0]) : -1;
    ds_error *err = NULL;
    for (int r = 0; r < g->world; r++) {
        const bool take = !err && jobs[r].err && (failed < 0 || r == failed);
        if (take) err = r ? ds_error_wrap(jobs[r].err, "tensor-parallel rank %d", r) : jobs[r].err;
        else ds_error_free(jobs[r].err);
    }
    return err;
}

ds_error *ds_batch_tp_step(ds_batch_tp *g, int *active) {
    *active = 0;
    if (g->world == 1) return ds_batch_step(g->b[0], active);
    job jobs[64] = {0};
    DS_TRY(on_every_rank(g, jobs));
    *active = jobs[0].active;
    /* The same tokens on every rank, checked cheaply: a hash of all committed so far. */
    const ds_batch_stats s0 = ds_batch_get_stats(g->b[0]);
    for (int r = 1; r < g->world; r++) {
        const ds_batch_stats s = ds_batch_get_stats(g->b[r]);
        if (s.token_hash != s0.token_hash || s.generation_tokens != s0.generation_tokens || jobs[r].active != *active)
            return ds_errorf("tensor parallel: rank %d committed other tokens than rank 0 by step %lld (the ranks must "
                             "compute the same logits bit for bit)",
                             r, (long long)s0.steps);
    }
    return NULL;
}

ds_error *ds_batch_tp_run(ds_batch_tp *g) {
    int active = 1;
    while (active > 0) DS_TRY(ds_batch_tp_step(g, &active));
    return NULL;
}

ds_error *ds_batch_tp_profile(ds_batch_tp *g, const ds_step_cost_key *key, const char *cache_path, FILE *log,
                              ds_step_cost **out) {
    *out = NULL;
    job jobs[64] = {0};
    for (int r = 0; r < g->world; r++)
        jobs[r] = (job){.profile = true, .key = key, .cache = cache_path, .log = r == 0 ? log : NULL};
    ds_error *err = on_every_rank(g, jobs);
    for (int r = 1; r < g->world; r++) ds_step_cost_free(jobs[r].sps); /* NULL: only rank 0 makes one */
    if (err) ds_step_cost_free(jobs[0].sps);
    else *out = jobs[0].sps;
    return err;
}
