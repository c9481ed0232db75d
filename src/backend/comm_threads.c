/* ds_comm_group_threads (comm.h): the ranks are threads of one process and
 * meet in host memory. An all-reduce: every rank downloads its x into its
 * own staging buffer; barrier; every rank adds all the buffers in rank order
 * into its own result (so every rank computes the same bits) and uploads
 * it; barrier, so no buffer is overwritten while another rank reads it.
 * The barrier is a mutex and a condition rather than a pthread barrier so
 * that ds_comm_abort can wake the ranks waiting in it. */
#include "backend/comm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct ds_comm_group {
    int world;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;      /* ranks in the current barrier */
    unsigned gen;     /* barriers completed */
    int failed_rank;  /* -1, or the first rank that aborted (under mu) */
    float **stage, **sum; /* per rank, grown by their owner (between barriers) */
    int64_t *cap;
    void *ext; /* what a group built on this one adds (NCCL's communicators) */
    void (*ext_free)(void *ext);
    void (*ext_abort)(void *ext);
};

void ds_comm_group_set_ext(ds_comm_group *g, void *ext, void (*ext_free)(void *ext), void (*ext_abort)(void *ext)) {
    g->ext = ext, g->ext_free = ext_free, g->ext_abort = ext_abort;
}
void *ds_comm_group_ext(const ds_comm_group *g) { return g->ext; }

static ds_comm_group *G(const ds_comm *c) { return c->group; }

int ds_comm_failed_rank(const ds_comm *c) {
    ds_comm_group *g = G(c);
    pthread_mutex_lock(&g->mu);
    const int r = g->failed_rank;
    pthread_mutex_unlock(&g->mu);
    return r;
}

void ds_comm_abort(ds_comm *c) {
    ds_comm_group *g = G(c);
    pthread_mutex_lock(&g->mu);
    const bool first = g->failed_rank < 0;
    if (first) g->failed_rank = c->rank;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (first && g->ext_abort) g->ext_abort(g->ext);
}

/* False (at once) once the group is stopped. */
static bool barrier_ok(ds_comm *c) {
    ds_comm_group *g = G(c);
    pthread_mutex_lock(&g->mu);
    bool ok = g->failed_rank < 0;
    if (ok && ++g->arrived == g->world) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else if (ok) {
        const unsigned gen = g->gen;
        while (g->gen == gen && g->failed_rank < 0) pthread_cond_wait(&g->cv, &g->mu);
        ok = g->gen != gen; /* (the barrier completed before the group stopped) */
    }
    pthread_mutex_unlock(&g->mu);
    return ok;
}

static void barrier(ds_comm *c) { (void)barrier_ok(c); }

/* Rank r's buffers hold n floats. Only rank r grows them, and only where no other rank reads them. */
static void reserve(ds_comm_group *g, int r, int64_t n) {
    if (n <= g->cap[r]) return;
    float *s = realloc(g->stage[r], (size_t)n * sizeof *s), *m = s ? realloc(g->sum[r], (size_t)n * sizeof *m) : NULL;
    if (!s || !m) abort(); /* a collective cannot fail halfway on one rank: the others would wait forever */
    g->stage[r] = s, g->sum[r] = m, g->cap[r] = n;
}

static void all_reduce(ds_comm *c, ds_backend *be, ds_tensor x) {
    ds_comm_group *g = G(c);
    const int64_t n = x.rows * x.cols;
    reserve(g, c->rank, n);
    be->ops->download(be, x, g->stage[c->rank]);
    if (!barrier_ok(c)) return; /* stopped: the others' buffers may be anything */
    float *s = g->sum[c->rank];
    memcpy(s, g->stage[0], (size_t)n * sizeof *s);
    for (int r = 1; r < g->world; r++) {
        const float *o = g->stage[r];
        for (int64_t i = 0; i < n; i++) s[i] += o[i];
    }
    barrier(c);
    be->ops->upload(be, x, s);
}

static void all_gather_host(ds_comm *c, const float *in, int64_t n, float *out) {
    ds_comm_group *g = G(c);
    reserve(g, c->rank, n);
    memcpy(g->stage[c->rank], in, (size_t)n * sizeof *in);
    if (!barrier_ok(c)) {
        memset(out, 0, (size_t)g->world * (size_t)n * sizeof *out);
        return;
    }
    for (int r = 0; r < g->world; r++) memcpy(out + (size_t)r * n, g->stage[r], (size_t)n * sizeof *out);
    barrier(c);
}

static const ds_comm_ops threads_ops = {.all_reduce = all_reduce, .all_gather_host = all_gather_host, .barrier = barrier};
const ds_comm_ops *ds_comm_threads_ops(void) { return &threads_ops; }

void ds_comm_group_free(ds_comm_group *g) {
    if (!g) return;
    if (g->ext_free) g->ext_free(g->ext);
    for (int r = 0; r < g->world; r++) free(g->stage[r]), free(g->sum[r]);
    free(g->stage), free(g->sum), free(g->cap);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

ds_error *ds_comm_group_threads(int world, ds_comm_group **out, ds_comm *ranks) {
    *out = NULL;
    if (world < 1 || world > 64) return ds_errorf("tensor parallel: %d ranks (1..64)", world);
    ds_comm_group *g = calloc(1, sizeof *g);
    if (!g) return ds_errorf("out of memory");
    g->world = world;
    g->failed_rank = -1;
    g->stage = calloc((size_t)world, sizeof *g->stage);
    g->sum = calloc((size_t)world, sizeof *g->sum);
    g->cap = calloc((size_t)world, sizeof *g->cap);
    if (!g->stage || !g->sum || !g->cap || pthread_mutex_init(&g->mu, NULL)) {
        free(g->stage), free(g->sum), free(g->cap), free(g);
        return ds_errorf("tensor parallel: cannot set up %d ranks", world);
    }
    if (pthread_cond_init(&g->cv, NULL)) {
        pthread_mutex_destroy(&g->mu);
        free(g->stage), free(g->sum), free(g->cap), free(g);
        return ds_errorf("tensor parallel: cannot set up %d ranks", world);
    }
    for (int r = 0; r < world; r++) ranks[r] = (ds_comm){.ops = &threads_ops, .rank = r, .world = world, .group = g};
    *out = g;
    return NULL;
}
