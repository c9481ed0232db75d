/* Loading a rank's shard of a tensor-parallel model (issue 43, Megatron's
 * split): a column-parallel projection (q/k/v, gate/up, the LM head) keeps
 * rows [rank * rows / world, ...) of its [rows, cols] weight — whole heads,
 * whole vocabulary slices — and a row-parallel one (o_proj, down_proj) keeps
 * columns [rank * cols / world, ...), whose partial products the ranks then
 * add up (comm.h's all-reduce). A row slice is a view into the checkpoint
 * (mapped in place on the CPU); a column slice is gathered into a buffer
 * the caller keeps until the weight is released (ds_shard_keep), since the
 * CPU backend maps that too. */
#ifndef DS_TP_SHARD_H
#define DS_TP_SHARD_H

#include "backend/backend.h"
#include "io/checkpoint.h"

typedef struct {
    int rank, world; /* world 1: the whole model on one rank */
} ds_tp;

static inline ds_tp ds_tp_single(void) { return (ds_tp){0, 1}; }

/* Host buffers that back shards (freed with the model). */
typedef struct {
    void **bufs;
    int n, cap;
} ds_shard_keep;
void ds_shard_keep_free(ds_shard_keep *k);

typedef enum { DS_SPLIT_ROWS, DS_SPLIT_COLS } ds_split;

/* Rank tp.rank's shard of checkpoint weight `name` (logical shape [rows, cols]): [rows / world, cols] or
 * [rows, cols / world]. The split dimension must divide by world (an error naming the tensor otherwise);
 * quantized weights are not split yet (an error naming it). world 1: the whole (dense) tensor; a model loads
 * its unsplit weights with ds_load_weight (quantized ones included) instead. */
ds_error *ds_load_weight_split(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                               ds_tp tp, ds_split split, ds_shard_keep *keep, ds_tensor *out);
/* Rows [r0, r0 + n) of checkpoint weight `name` ([rows, cols]) as a view into the mapping (dense only): a
 * KV head replicated across ranks (fewer KV heads than ranks) is its own rows, not the rank's slice. */
ds_error *ds_load_weight_rows(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                              int64_t r0, int64_t n, ds_tensor *out);
/* Values [i0, i0 + n) of vector `name` ([len]). */
ds_error *ds_load_vector_range(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t len, int64_t i0,
                               int64_t n, ds_tensor *out);
/* A vector's slice [rank * n / world, ...) (a column-parallel projection's bias). */
ds_error *ds_load_vector_split(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t n, ds_tp tp,
                               ds_tensor *out);

#endif
