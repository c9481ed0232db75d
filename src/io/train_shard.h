/* One shard of a training cache (train_cache.h): the sequences of a run of
 * prompts with their target hidden states, in one file laid out for mmap.
 *
 *   [0, 128)      header (little-endian, ds_shard_header below)
 *   data          per sequence, in order: taps bf16 [len, n_taps*hidden], then
 *                 final hidden bf16 [len, hidden]; each block 64-byte aligned
 *   ids_off       int32 [n_tokens]: every sequence's ids, back to back
 *   mask_off      uint8 [n_tokens]: loss mask (prompt 0, generated 1)
 *   index_off     ds_shard_entry [n_seqs]
 *   file_bytes    end of file
 *
 * Data first, tables last: a writer streams each sequence's states as the
 * target's forward chunks produce them and keeps only the small tables in
 * memory. The header is written last, through a temporary file that is
 * renamed into place once complete: a shard that exists is whole. */
#ifndef DS_TRAIN_SHARD_H
#define DS_TRAIN_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define DS_SHARD_MAGIC "DSTRAIN1" /* 8 bytes, no NUL */
#define DS_SHARD_VERSION 1
#define DS_SHARD_HEADER_BYTES 128
#define DS_SHARD_ALIGN 64
#define DS_SHARD_DTYPE_BF16 1

typedef struct {
    char magic[8];
    uint32_t version, header_bytes;
    uint32_t n_seqs, n_taps, hidden, dtype;
    uint64_t first_seq; /* the cache-wide index of this shard's first sequence (= its prompt's index) */
    uint64_t n_tokens;
    uint64_t ids_off, mask_off, index_off, file_bytes;
    uint64_t cache_id;  /* the manifest's identity hash: a shard cannot be mixed into another cache */
    uint8_t reserved[128 - 88];
} ds_shard_header;
_Static_assert(sizeof(ds_shard_header) == DS_SHARD_HEADER_BYTES, "the header is 128 bytes");

typedef struct {
    uint64_t taps_off, final_off; /* byte offsets of the sequence's two blocks */
    uint64_t tok_start;           /* its first token in the ids and mask arrays */
    uint32_t len, n_prompt;       /* tokens, of which the first n_prompt are the prompt */
} ds_shard_entry;
_Static_assert(sizeof(ds_shard_entry) == 32, "an index entry is 32 bytes");

/* What a shard must agree with (its manifest): a mismatch is an error naming the field. */
typedef struct {
    uint32_t n_taps, hidden;
    int32_t vocab;      /* ids must lie in [0, vocab) */
    uint64_t cache_id;
    uint64_t first_seq; /* where the manifest says the shard starts */
    int64_t n_seqs, n_tokens; /* < 0: not checked (a writer resuming reads them from the file) */
} ds_shard_expect;

/* ---- writing ---- */
typedef struct ds_shard_writer ds_shard_writer;

/* Creates path + ".tmp" for a shard of sequences from first_seq on. */
ds_error *ds_shard_writer_open(const char *path, uint32_t n_taps, uint32_t hidden, uint64_t cache_id,
                               uint64_t first_seq, ds_shard_writer **out);
/* Starts the next sequence: its ids (len of them, the first n_prompt the prompt). */
ds_error *ds_shard_writer_begin(ds_shard_writer *w, const int32_t *ids, int len, int n_prompt);
/* Rows [row0, row0 + n) of the current sequence, fp32 (rounded to bf16 here, to nearest even):
 * taps [n, n_taps*hidden], final hidden [n, hidden]. Every row once, in any order. */
ds_error *ds_shard_writer_rows(ds_shard_writer *w, int row0, int n, const float *taps, const float *final_hidden);
int64_t ds_shard_writer_tokens(const ds_shard_writer *w);
int64_t ds_shard_writer_seqs(const ds_shard_writer *w);
/* Writes the tables and the header, syncs, renames the temporary file to path. *bytes: the shard's size. */
ds_error *ds_shard_writer_finish(ds_shard_writer *w, int64_t *bytes);
/* Frees w; a shard not finished leaves no file behind (its temporary file is removed). */
void ds_shard_writer_free(ds_shard_writer *w);

/* ---- reading ---- */
typedef struct ds_shard ds_shard;

/* One sequence's views into the mapped shard (valid while it is open). */
typedef struct {
    int len, n_prompt;
    const int32_t *ids;
    const uint8_t *mask;
    const uint16_t *taps;         /* bf16 [len, n_taps*hidden] */
    const uint16_t *final_hidden; /* bf16 [len, hidden] */
} ds_train_seq;

/* Maps path and checks it: magic, version, the header's sizes and offsets against the file's length
 * ("truncated"), the expectations, every index entry's bounds, ids in the vocabulary, mask bytes 0/1.
 * Errors start with the path. */
ds_error *ds_shard_open(const char *path, const ds_shard_expect *expect, ds_shard **out);
const ds_shard_header *ds_shard_get_header(const ds_shard *s);
/* i in [0, n_seqs). */
void ds_shard_seq(const ds_shard *s, int64_t i, ds_train_seq *out);
void ds_shard_close(ds_shard *s);

#endif
