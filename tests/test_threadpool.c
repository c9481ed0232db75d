/* The fork-join pool: every item of every job runs exactly once, on a
 * valid thread id, whatever the job size, grain and number of threads
 * (including more threads than cores, where workers often arrive late). */
#include <stdatomic.h>
#include <stdlib.h>

#include "base/threadpool.h"
#include "testlib.h"

typedef struct {
    _Atomic int *hits;
    int n_threads;
    _Atomic int bad_tid;
} job;

static void touch(void *ctx, int64_t b, int64_t e, int tid) {
    job *j = ctx;
    if (tid < 0 || tid >= j->n_threads) atomic_store(&j->bad_tid, 1);
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&j->hits[i], 1);
}

static void check_pool(int threads) {
    ds_pool *p = ds_pool_new(threads);
    CHECK(p != NULL, "pool of %d threads", threads);
    if (!p) return;
    enum { MAX_N = 5000 };
    _Atomic int *hits = calloc(MAX_N, sizeof *hits);
    uint64_t x = 88172645463325252ull;
    int wrong = 0;
    for (int round = 0; round < 3000 && !wrong; round++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift: job shapes */
        int64_t n = (int64_t)(x % MAX_N), grain = (int64_t)(x >> 32) % 300;
        for (int64_t i = 0; i < n; i++) atomic_store(&hits[i], 0);
        job j = {.hits = hits, .n_threads = ds_pool_threads(p)};
        ds_pool_run(p, n, grain, touch, &j);
        for (int64_t i = 0; i < n; i++)
            if (atomic_load(&hits[i]) != 1) wrong++;
        CHECK(!atomic_load(&j.bad_tid), "a chunk ran with a thread id outside 0..%d", j.n_threads - 1);
    }
    CHECK(wrong == 0, "%d items did not run exactly once (%d threads)", wrong, threads);
    free(hits);
    ds_pool_free(p);
}

static void test_one_thread(void) { check_pool(1); }
static void test_two_threads(void) { check_pool(2); }
static void test_oversubscribed(void) { check_pool(6); }

RUN_TESTS("threadpool", test_one_thread, test_two_threads, test_oversubscribed)
