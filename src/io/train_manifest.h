/* A training cache's manifest (CACHE/manifest.json): what made the cache
 * (the target's identity, the tap layers, the sampling, the prompts) and its
 * shards in order. The identity fields hash to cache_id, which every shard
 * carries: a shard from another run cannot pass for one of this cache, and a
 * rerun of datagen with other options is refused rather than resumed. */
#ifndef DS_TRAIN_MANIFEST_H
#define DS_TRAIN_MANIFEST_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "io/model_identity.h"

#define DS_TRAIN_MANIFEST "manifest.json"
#define DS_TRAIN_FORMAT "dspark-train-cache"
#define DS_TRAIN_FORMAT_VERSION 1
#define DS_TRAIN_MAX_TAPS 16

typedef struct {
    char file[32];      /* "shard-00000.bin", in the cache directory */
    int64_t first_seq, n_seqs, n_tokens, bytes;
} ds_train_shard_info;

typedef struct {
    /* identity (hashed into cache_id) */
    char model_type[32];
    char backend[16];          /* "cpu", "cuda": where the tokens were drawn (the CPU's are the same on every host;
                                  a GPU's differ from them at near-ties), so a resume does not mix the two */
    ds_model_identity target;  /* config.json and weights fingerprints */
    int vocab, hidden, n_layers;
    int n_taps, tap_layers[DS_TRAIN_MAX_TAPS]; /* SPEC §3: -1 = the embedding output */
    float temperature, top_p;  /* top_p 1: off */
    int top_k, max_new;
    uint64_t seed;             /* prompt i is generated with seed + i */
    bool ignore_eos;
    int64_t n_prompts;         /* sequences: the prompts to continue, then any raw sequences */
    int64_t n_raw;             /* sequences stored as given, loss mask 1 everywhere (datagen.h) */
    uint64_t prompts_hash;     /* every prompt's ids, in order (and which are raw) */
    int64_t shard_tokens;      /* a shard closes once it holds at least this many tokens */
    /* not identity */
    char target_dir[1024], prompt_file[1024];
    uint64_t cache_id;         /* ds_train_manifest_id */
    bool complete;             /* every prompt has its sequence in a shard */
    int n_shards;
    ds_train_shard_info *shards;
} ds_train_manifest;

uint64_t ds_train_manifest_id(const ds_train_manifest *m);
/* NULL when a and b describe the same cache; else an error naming the first field that differs, both values. */
ds_error *ds_train_manifest_compare(const ds_train_manifest *have, const ds_train_manifest *want);
/* dir/manifest.json, through a temporary file and a rename. */
ds_error *ds_train_manifest_write(const char *dir, const ds_train_manifest *m);
/* Reads and checks dir/manifest.json (every field present and in range, the shards in order and
 * contiguous, cache_id = the identity's hash); errors name the file and the field. */
ds_error *ds_train_manifest_read(const char *dir, ds_train_manifest *out);
ds_error *ds_train_manifest_add_shard(ds_train_manifest *m, const ds_train_shard_info *s);
void ds_train_manifest_free(ds_train_manifest *m);

#endif
