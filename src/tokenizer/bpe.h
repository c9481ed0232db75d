/* The BPE model of tokenizer.json ("model": {"type": "BPE", ...}): vocab,
 * merges by rank, unk / byte_fallback / ignore_merges, subword affixes.
 * A word is split into characters and merged lowest-rank-first with a
 * binary heap, exactly as HF's Word::merge_all does (same tie-break:
 * leftmost position), so long words cost O(n log n), not O(n^2); very
 * long ones are first cut where no merge can reach across. */
#ifndef DS_TOK_BPE_H
#define DS_TOK_BPE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "dspark.h"
#include "tokenizer/hashmap.h"
#include "tokenizer/strbuf.h"

/* At most this many characters may precede the cut marker inside a vocab
 * token; with more, long words are simply not cut. */
#define DS_BPE_MAX_GLUE 64

typedef struct {
    ds_strtab vocab;     /* model vocab: id <-> token string */
    ds_pairmap merges;   /* (left id << 32 | right id) -> (rank, merged id) */
    char *unk_token;     /* NULL: unknown characters are dropped */
    int32_t unk_id;      /* -1 if unk_token is not in the vocab */
    char *cont_prefix;   /* continuing_subword_prefix, NULL if none */
    char *end_suffix;    /* end_of_word_suffix, NULL if none */
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_id[256]; /* id of "<0xNN>", -1 if missing */
    /* Safe cut points for long words (see find_split_marker, bpe_load.c):
     * before split_cp (0 = none) unless the previous character is one of
     * split_after_not. */
    uint32_t split_cp;
    uint32_t split_after_not[DS_BPE_MAX_GLUE];
    size_t n_split_after_not;
} ds_bpe;

/* Per-call working memory for ds_bpe_encode_word. */
typedef struct {
    struct ds_bpe_sym *sym;
    size_t sym_cap; /* heap has 3 * sym_cap entries */
    uint64_t *heap;
    ds_buf tmp;
} ds_bpe_scratch;

/* model.vocab and model.merges as flat lists of strings (not necessarily
 * NUL-terminated), either read from the cJSON tree or scanned straight
 * from the file text by the fast path (vocab_scan.h). */
typedef struct {
    const char *s;
    uint32_t n;
    int32_t id;
} ds_vocab_entry;

typedef struct {
    const char *a, *b;
    uint32_t na, nb;
} ds_merge_entry;

typedef struct {
    ds_vocab_entry *vocab;
    size_t n_vocab;
    ds_merge_entry *merges;
    size_t n_merges;
} ds_bpe_lists;

/* Ids beyond this are surely a broken file; refusing them keeps a bad id
 * from turning into a multi-gigabyte allocation. */
#define DS_MAX_TOKEN_ID (1 << 26)

/* model is the "model" object of tokenizer.json. pre, if not NULL, holds
 * its vocab and merges already scanned (the tree's own are then ignored). */
ds_error *ds_bpe_load(ds_bpe *m, const cJSON *model, const ds_bpe_lists *pre);
void ds_bpe_free(ds_bpe *m);
/* Appends the ids of one pre-tokenized word w[0..n) to out. */
ds_error *ds_bpe_encode_word(const ds_bpe *m, const char *w, size_t n, ds_bpe_scratch *s, ds_ids *out);
void ds_bpe_scratch_free(ds_bpe_scratch *s);

#endif
