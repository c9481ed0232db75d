/* Datagen's batched generator: continuations for many prompts at once on the
 * batched engine (batch/batch.h) without a drafter, one target forward a step
 * over every running sequence. The batched engine's outputs are each request's
 * solo run token for token (row-invariant ops, one random stream a request),
 * so a cache made with it is byte for byte the one ds_generate makes, just
 * sooner where a step of many rows costs about what a step of one does (a GPU;
 * a CPU whose cores idle on one row).
 *
 * The engine needs a target whose caches are a pool of pages, which only
 * batched forwards use; datagen's tap forward runs on a second, plain target
 * over the same backend (the weights are held twice). */
#ifndef DS_GEN_BATCH_H
#define DS_GEN_BATCH_H

#include "batch/batch.h"

typedef struct {
    ds_target *t; /* the paged target the engine runs on */
    ds_batch *b;
    int max_seqs;
} ds_gen_batch;

/* Opens dir's target on be with a pool for max_seqs sequences of up to ctx tokens (at most the model's
 * context), and the engine over it. */
ds_error *ds_gen_batch_open(ds_backend *be, const char *dir, int max_seqs, int ctx, ds_gen_batch *out);
void ds_gen_batch_close(ds_gen_batch *g);

#endif
