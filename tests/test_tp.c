/* Tensor parallelism (issue 43), emulated by N ranks in one process: the collectives. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/comm.h"
#include "io/checkpoint.h"
#include "model/qwen3_layer.h"
#include "model/tp_shard.h"
#include "testlib.h"

#define WORLD 4

typedef struct {
    ds_comm *comm;
    int failures;
} rank_arg;

/* Each rank: a [3, 5] view with a stride (columns 2..6 of a [3, 9] tensor) of values that depend on the
 * rank; after the all-reduce every rank holds the sum over ranks in rank order, bit for bit, and the
 * columns outside the view are untouched. */
static void *rank_main(void *p) {
    rank_arg *a = p;
    const int r = a->comm->rank;
    ds_backend *be;
    if (ds_backend_cpu_new(1, &be)) {
        a->failures++;
        return NULL;
    }
    ds_tensor wide;
    ds_error *e = be->ops->alloc(be, DS_F32, 3, 9, &wide);
    if (e) {
        ds_error_free(e);
        a->failures++;
        return NULL;
    }
    float host[27];
    for (int i = 0; i < 27; i++) host[i] = 0.1f * (float)(i + 1) * (float)(r + 1) + 1e-3f * (float)(r * r);
    be->ops->upload(be, wide, host);
    const ds_tensor x = ds_cols(wide, 2, 5);
    a->comm->ops->all_reduce(a->comm, be, x);
    float got[27];
    be->ops->download(be, wide, got);
    for (int i = 0; i < 27; i++) {
        const int c = i % 9;
        float want = host[i];
        if (c >= 2 && c < 7) {
            want = 0;
            for (int k = 0; k < WORLD; k++) {
                const float v = 0.1f * (float)(i + 1) * (float)(k + 1) + 1e-3f * (float)(k * k);
                want = k ? want + v : v;
            }
        }
        if (memcmp(&got[i], &want, sizeof want)) a->failures++;
    }
    const float mine[2] = {(float)r, (float)(10 * r)};
    float all[2 * WORLD];
    a->comm->ops->all_gather_host(a->comm, mine, 2, all);
    for (int k = 0; k < WORLD; k++)
        if (all[2 * k] != (float)k || all[2 * k + 1] != (float)(10 * k)) a->failures++;
    be->ops->release(be, &wide);
    be->ops->destroy(be);
    return NULL;
}

static void test_collectives(void) {
    ds_comm ranks[WORLD];
    ds_comm_group *g;
    CHECK_OK(ds_comm_group_threads(WORLD, &g, ranks));
    pthread_t th[WORLD];
    rank_arg args[WORLD];
    for (int r = 0; r < WORLD; r++) {
        args[r] = (rank_arg){.comm = &ranks[r]};
        CHECK(pthread_create(&th[r], NULL, rank_main, &args[r]) == 0, "thread %d", r);
    }
    for (int r = 0; r < WORLD; r++) {
        pthread_join(th[r], NULL);
        CHECK(args[r].failures == 0, "rank %d: %d wrong values", r, args[r].failures);
    }
    ds_comm_group_free(g);
    CHECK_ERR(ds_comm_group_threads(0, &g, ranks), "0 ranks");
}

/* A rank's shard is its slice of the whole weight: rows for a column-parallel projection (q_proj: whole
 * heads), columns for a row-parallel one (o_proj), a bias's slice; a split that does not divide is an
 * error naming the tensor. */
static void test_shards(void) {
    ds_backend *be;
    CHECK_OK(ds_backend_cpu_new(1, &be));
    ds_checkpoint *ck;
    CHECK_OK(ds_checkpoint_open(DS_TESTDATA "/fixtures/qwen3-tiny/target", &ck));
    const char *q = "model.layers.1.self_attn.q_proj.weight", *o = "model.layers.1.self_attn.o_proj.weight";
    ds_tensor qf, of;
    CHECK_OK(ds_load_weight(be, ck, q, 64, 64, &qf));
    CHECK_OK(ds_load_weight(be, ck, o, 64, 64, &of));
    float full_q[64 * 64], full_o[64 * 64], part[64 * 64];
    be->ops->download(be, qf, full_q);
    be->ops->download(be, of, full_o);
    ds_shard_keep keep = {0};
    for (int world = 2; world <= 4; world *= 2)
        for (int r = 0; r < world; r++) {
            const ds_tp tp = {r, world};
            ds_tensor qs, os;
            CHECK_OK(ds_load_weight_split(be, ck, q, 64, 64, tp, DS_SPLIT_ROWS, &keep, &qs));
            CHECK(qs.rows == 64 / world && qs.cols == 64, "q shard shape");
            be->ops->download(be, qs, part);
            CHECK(!memcmp(part, full_q + (size_t)r * (64 / world) * 64, sizeof(float) * 64 * 64 / world),
                  "q_proj rank %d of %d: its rows", r, world);
            CHECK_OK(ds_load_weight_split(be, ck, o, 64, 64, tp, DS_SPLIT_COLS, &keep, &os));
            CHECK(os.rows == 64 && os.cols == 64 / world, "o shard shape");
            be->ops->download(be, os, part);
            int bad = 0;
            for (int i = 0; i < 64; i++)
                for (int j = 0; j < 64 / world; j++) bad += part[i * (64 / world) + j] != full_o[i * 64 + r * (64 / world) + j];
            CHECK(bad == 0, "o_proj rank %d of %d: its columns (%d wrong)", r, world, bad);
            be->ops->release(be, &qs);
            be->ops->release(be, &os);
        }
    ds_tensor bad;
    CHECK_ERR(ds_load_weight_split(be, ck, q, 64, 64, (ds_tp){0, 3}, DS_SPLIT_ROWS, &keep, &bad),
              "q_proj.weight: its rows (64) do not divide among 3 ranks");
    ds_shard_keep_free(&keep);
    be->ops->release(be, &qf);
    be->ops->release(be, &of);
    ds_checkpoint_close(ck);
    be->ops->destroy(be);
}

RUN_TESTS("tp", test_collectives, test_shards)
