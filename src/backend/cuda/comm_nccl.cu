/* ds_comm_group_nccl (backend/comm.h): the tensor-parallel all-reduce on
 * NCCL between one GPU a rank, each rank's call from its own thread on its
 * backend's stream; host gathers and barriers are the threads group's (the
 * ranks are threads of one process either way). */
#include <nccl.h>

#include <pthread.h>
#include <stdlib.h>

#include "backend/cuda/cuda_internal.h"
extern "C" {
#include "backend/comm.h"
}

/* lock: the ranks enqueue their all-reduces under its read side; ds_comm_abort's hook takes the write side to
 * abort every communicator (which frees it), so that no rank enqueues on a freed one: a rank that comes after
 * finds the group stopped and enqueues nothing. ncclCommAbort also ends the collectives already on the GPUs,
 * which free the ranks waiting for the failed one's share in a stream synchronization. */
typedef struct {
    int world;
    ncclComm_t *comms;
    pthread_rwlock_t lock;
} nccl_ext;

static void ext_free(void *p) {
    nccl_ext *x = (nccl_ext *)p;
    if (!x) return;
    for (int r = 0; r < x->world; r++)
        if (x->comms[r]) ncclCommDestroy(x->comms[r]);
    pthread_rwlock_destroy(&x->lock);
    free(x->comms);
    free(x);
}

static void ext_abort(void *p) {
    nccl_ext *x = (nccl_ext *)p;
    pthread_rwlock_wrlock(&x->lock);
    for (int r = 0; r < x->world; r++)
        if (x->comms[r]) ncclCommAbort(x->comms[r]), x->comms[r] = NULL;
    pthread_rwlock_unlock(&x->lock);
}

static void nccl_all_reduce(ds_comm *c, ds_backend *be, ds_tensor x) {
    ds_cuda_backend *cb = (ds_cuda_backend *)be;
    nccl_ext *ext = (nccl_ext *)ds_comm_group_ext((ds_comm_group *)c->group);
    pthread_rwlock_rdlock(&ext->lock);
    if (!ext->comms[c->rank]) { /* stopped (ds_comm_abort): the ranks' results are undefined */
        pthread_rwlock_unlock(&ext->lock);
        return;
    }
    ncclResult_t rc = ncclSuccess;
    if (x.stride == x.cols) { /* one call; every rank's tensor has the same shape (SPMD) */
        rc = ncclAllReduce(x.data, x.data, (size_t)(x.rows * x.cols), ncclFloat32, ncclSum, ext->comms[c->rank],
                           cb->stream);
    } else {
        rc = ncclGroupStart();
        for (int64_t r = 0; r < x.rows && rc == ncclSuccess; r++) {
            float *row = (float *)x.data + r * x.stride;
            rc = ncclAllReduce(row, row, (size_t)x.cols, ncclFloat32, ncclSum, ext->comms[c->rank], cb->stream);
        }
        const ncclResult_t end = ncclGroupEnd();
        if (rc == ncclSuccess) rc = end;
    }
    pthread_rwlock_unlock(&ext->lock);
    if (rc != ncclSuccess && !cb->err)
        cb->err = ds_errorf("tensor parallel rank %d: ncclAllReduce failed: %s", c->rank, ncclGetErrorString(rc));
}

static void nccl_gather_host(ds_comm *c, const float *in, int64_t n, float *out) {
    ds_comm_threads_ops()->all_gather_host(c, in, n, out);
}
static void nccl_barrier(ds_comm *c) { ds_comm_threads_ops()->barrier(c); }

static const ds_comm_ops nccl_ops = {nccl_all_reduce, nccl_gather_host, nccl_barrier};

extern "C" ds_error *ds_comm_group_nccl(int world, const int *devices, ds_comm_group **out, ds_comm *ranks) {
    *out = NULL;
    ds_comm_group *g = NULL;
    DS_TRY(ds_comm_group_threads(world, &g, ranks));
    nccl_ext *x = (nccl_ext *)calloc(1, sizeof *x);
    if (x) x->comms = (ncclComm_t *)calloc((size_t)world, sizeof *x->comms);
    if (!x || !x->comms) {
        free(x);
        ds_comm_group_free(g);
        return ds_errorf("out of memory");
    }
    x->world = world;
    if (pthread_rwlock_init(&x->lock, NULL)) {
        free(x->comms);
        free(x);
        ds_comm_group_free(g);
        return ds_errorf("tensor parallel on NCCL: cannot set up a lock");
    }
    for (int i = 0; i < world; i++)
        for (int j = 0; j < i; j++)
            if (devices[i] == devices[j]) {
                ext_free(x);
                ds_comm_group_free(g);
                return ds_errorf("tensor parallel on NCCL: ranks %d and %d are both on GPU %d (one GPU a rank)", j, i,
                                 devices[i]);
            }
    const ncclResult_t rc = ncclCommInitAll(x->comms, world, devices);
    if (rc != ncclSuccess) {
        pthread_rwlock_destroy(&x->lock);
        free(x->comms);
        free(x);
        ds_comm_group_free(g);
        return ds_errorf("tensor parallel: ncclCommInitAll over %d GPUs failed: %s", world, ncclGetErrorString(rc));
    }
    ds_comm_group_set_ext(g, x, ext_free, ext_abort);
    for (int r = 0; r < world; r++) ranks[r].ops = &nccl_ops;
    *out = g;
    return NULL;
}
