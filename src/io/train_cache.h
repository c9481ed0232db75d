/* Reading a training cache (`dspark datagen`'s output, what the trainer
 * reads): a directory holding manifest.json (train_manifest.h) and the shard
 * files it lists (train_shard.h), every shard mapped and checked at open.
 * Sequence i is prompt i's: its ids, loss mask (prompt 0, generated 1), and
 * bf16 views of the target's tapped hidden states [len, n_taps*hidden] (SPEC
 * §3 order) and final-normed hidden state [len, hidden] (what the LM head
 * reads), straight from the mapping. */
#ifndef DS_TRAIN_CACHE_H
#define DS_TRAIN_CACHE_H

#include "io/train_manifest.h"
#include "io/train_shard.h"

typedef struct ds_train_cache ds_train_cache;

/* Errors name the manifest's field or the shard at fault: a missing shard, bad magic, a truncated
 * shard, a shard whose header disagrees with the manifest (another cache's, other taps or size). */
ds_error *ds_train_cache_open(const char *dir, ds_train_cache **out);
void ds_train_cache_close(ds_train_cache *c);
const ds_train_manifest *ds_train_cache_manifest(const ds_train_cache *c);
int64_t ds_train_cache_n_seqs(const ds_train_cache *c);
int64_t ds_train_cache_n_tokens(const ds_train_cache *c);
/* Sequence i in [0, n_seqs): an error (naming i) outside. */
ds_error *ds_train_cache_seq(const ds_train_cache *c, int64_t i, ds_train_seq *out);
/* Whether the cache was made for the target in target_dir (its identity now) with these taps:
 * an error naming what differs, for a trainer handed another target or a drafter tapping other layers. */
ds_error *ds_train_cache_check(const ds_train_cache *c, const char *target_dir, const int *taps, int n_taps);

#endif
