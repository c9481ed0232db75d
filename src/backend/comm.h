/* Collectives between the ranks of a tensor-parallel model (issue 43): one
 * process, one thread and one backend a rank, every rank running the same
 * code on its shard (SPMD). Model code calls these where a split layer's
 * partial results meet: the all-reduce after a row-parallel projection
 * (o_proj, down_proj), the gather of a vocab-parallel LM head's per-rank
 * argmaxes.
 *
 * Determinism: an all-reduce adds the ranks' values in rank order, element
 * by element, and every rank gets the same bits; so a run is reproducible,
 * every rank takes the same decisions, and row invariance (backend.h) holds
 * under TP. (Not the 1-rank bits: the split changes each projection's
 * summation order.)
 *
 * ds_comm_group_threads: the ranks' values meet in host memory (through each
 * rank's backend's download / upload), so it serves any backends: N CPU
 * ranks, or N CUDA backends on one GPU — TP emulated in one process, for the
 * tests of the split and gather logic. A multi-GPU group (NCCL) implements
 * the same table. */
#ifndef DS_COMM_H
#define DS_COMM_H

#include "backend/backend.h"

typedef struct ds_comm ds_comm;

typedef struct {
    /* x (fp32, [rows, cols] in this rank's backend) = the sum over ranks of each rank's x. */
    void (*all_reduce)(ds_comm *c, ds_backend *be, ds_tensor x);
    /* Host values: out[r * n + i] = rank r's in[i], on every rank (out holds world * n). */
    void (*all_gather_host)(ds_comm *c, const float *in, int64_t n, float *out);
    void (*barrier)(ds_comm *c);
} ds_comm_ops;

struct ds_comm {
    const ds_comm_ops *ops;
    int rank, world;
    void *group; /* the implementation's shared state */
};

/* Rank 0's v on every rank (a host all-gather of one value): for what rank 0 alone decides, such as a
 * decision resting on its clock, which the other ranks must take as theirs. */
static inline float ds_comm_from_rank0(ds_comm *c, float v) {
    float all[64]; /* world <= 64 (ds_comm_group_threads) */
    c->ops->all_gather_host(c, &v, 1, all);
    return all[0];
}

/* A rank that leaves a collective computation with an error (its step failed halfway: device memory, a
 * backend failure) calls this, so that the other ranks do not wait for it forever: every rank waiting in a
 * collective of the group returns at once, and so does every later collective, their results undefined
 * (gathers give zeros). The group stays stopped: its ranks' engine must be reopened. Any rank, any thread. */
void ds_comm_abort(ds_comm *c);
/* -1 while the group is whole, else the first rank that called ds_comm_abort. */
int ds_comm_failed_rank(const ds_comm *c);

typedef struct ds_comm_group ds_comm_group;

/* A group of world ranks in this process; ranks[r] is rank r's handle (for its thread). */
ds_error *ds_comm_group_threads(int world, ds_comm_group **out, ds_comm *ranks);
/* The same over one GPU a rank (CUDA backends on devices[0..world), all distinct): the all-reduce on NCCL
 * (ring all-reduce: every rank gets the same bits, run after run), in place on each rank's stream; host
 * gathers and barriers as the threads group's. An error (naming NCCL's) where the build has no CUDA or
 * NCCL cannot start. */
ds_error *ds_comm_group_nccl(int world, const int *devices, ds_comm_group **out, ds_comm *ranks);
void ds_comm_group_free(ds_comm_group *g);

/* For the NCCL group (backend/cuda/comm_nccl.cu): the threads group's table, and hooks to free what it
 * adds (called by ds_comm_group_free before the group's own state) and to stop its device collectives
 * (called once by the first ds_comm_abort, after the group is marked stopped; NULL: none). */
const ds_comm_ops *ds_comm_threads_ops(void);
void ds_comm_group_set_ext(ds_comm_group *g, void *ext, void (*ext_free)(void *ext), void (*ext_abort)(void *ext));
void *ds_comm_group_ext(const ds_comm_group *g);

#endif
