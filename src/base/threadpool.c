#include "base/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* The claim word packs the job generation (high 24 bits) with the next
 * index (low 40 bits): a late worker that still holds an old generation can
 * never claim work of a newer job. */
#define IDX_BITS 40
#define IDX_MASK ((UINT64_C(1) << IDX_BITS) - 1)
/* An idle worker spins this long before it sleeps. Decoding leaves gaps of
 * tens to hundreds of microseconds between parallel ops (host-side sampling,
 * the drafter's Markov walk, single-threaded small ops); a worker that fell
 * asleep in such a gap takes a futex wake-up, often longer than the op
 * itself on a VM, and the op then runs at one thread's speed or worse.
 * With more threads than CPUs a spinner takes the CPU from the thread that
 * holds a claimed chunk, and every op waits out scheduler slices (8
 * threads on 2 cores: minutes for what takes seconds): then workers sleep
 * at once. */
#define SPIN_NS 2000000

typedef struct {
    ds_pool *pool;
    int tid;
} worker_arg;

struct ds_pool {
    int n_threads;
    int64_t spin_ns; /* SPIN_NS, or 0 when oversubscribed */
    pthread_t *threads;
    worker_arg *args;
    /* current job, valid while generation == gen */
    ds_pool_fn fn;
    void *ctx;
    int64_t n, grain;
    _Atomic uint64_t claim;   /* (gen << IDX_BITS) | next index */
    _Atomic int64_t done;     /* items finished in the current job */
    _Atomic uint32_t gen;     /* bumped for every job */
    _Atomic bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int sleepers;
};

/* Claims and runs chunks of generation g until none are left. */
static void work(ds_pool *p, uint32_t g, ds_pool_fn fn, void *ctx, int64_t n, int64_t grain, int tid) {
    for (;;) {
        uint64_t cur = atomic_load_explicit(&p->claim, memory_order_acquire);
        if ((uint32_t)(cur >> IDX_BITS) != (g & 0xffffff)) return;
        int64_t i = (int64_t)(cur & IDX_MASK);
        if (i >= n) return;
        int64_t end = i + grain < n ? i + grain : n;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &cur, cur + (uint64_t)(end - i), memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        fn(ctx, i, end, tid);
        atomic_fetch_add_explicit(&p->done, end - i, memory_order_acq_rel);
    }
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    ds_pool *p = wa->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        unsigned spins = 0;
        int64_t since = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->stop, memory_order_acquire)) {
            cpu_relax();
            if (++spins % 1024) continue; /* the clock only now and then */
            if (!since) since = now_ns();
            if (now_ns() - since < p->spin_ns) continue;
            pthread_mutex_lock(&p->mu);
            p->sleepers++;
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
            p->sleepers--;
            pthread_mutex_unlock(&p->mu);
            spins = 0;
            since = 0;
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        seen = g;
        /* Read the job after the generation; work() re-checks the generation
         * before every claim, so fields of a newer job are never used. */
        pthread_mutex_lock(&p->mu);
        ds_pool_fn fn = p->fn;
        void *ctx = p->ctx;
        int64_t n = p->n, grain = p->grain;
        bool current = atomic_load(&p->gen) == g;
        pthread_mutex_unlock(&p->mu);
        if (current) work(p, g, fn, ctx, n, grain, wa->tid);
    }
}

ds_pool *ds_pool_new(int n_threads) {
    ds_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads > 0 ? n_threads : 1;
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    p->spin_ns = cpus > 0 && p->n_threads > cpus ? 0 : SPIN_NS;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)p->n_threads, sizeof *p->threads);
    p->args = calloc((size_t)p->n_threads, sizeof *p->args);
    if (!p->threads || !p->args) {
        ds_pool_free(p);
        return NULL;
    }
    for (int i = 1; i < p->n_threads; i++) {
        p->args[i] = (worker_arg){p, i};
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) {
            p->n_threads = i; /* run with the workers we got */
            break;
        }
    }
    return p;
}

void ds_pool_free(ds_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; p->threads && i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p->args);
    free(p);
}

int ds_pool_threads(const ds_pool *p) { return p->n_threads; }

void ds_pool_run(ds_pool *p, int64_t n, int64_t grain, ds_pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (p->n_threads == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    uint32_t g = atomic_load(&p->gen) + 1;
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->grain = grain;
    atomic_store(&p->done, 0);
    atomic_store(&p->claim, (uint64_t)(g & 0xffffff) << IDX_BITS);
    atomic_store(&p->gen, g);
    if (p->sleepers) pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    work(p, g, fn, ctx, n, grain, 0);
    /* Only chunks already claimed by running workers are left. */
    while (atomic_load_explicit(&p->done, memory_order_acquire) < n) sched_yield();
}
