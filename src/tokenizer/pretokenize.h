/* tokenizer.json "pre_tokenizer": cuts normalized text into the words BPE
 * sees. Supported: Split (String/Regex pattern, all five behaviours,
 * invert), ByteLevel (add_prefix_space, use_regex, byte->alphabet map),
 * Metaspace, Whitespace, WhitespaceSplit, Digits, Punctuation,
 * BertPreTokenizer, and Sequence of those. */
#ifndef DS_TOK_PRETOKENIZE_H
#define DS_TOK_PRETOKENIZE_H

#include <cjson/cJSON.h>
#include <stdbool.h>

#include "dspark.h"
#include "tokenizer/regex.h"
#include "tokenizer/strbuf.h"

/* A word: text[off, off+len). `first` marks the piece that starts the
 * whole input (HF's offsets_original().0 == 0, used by Metaspace "first"). */
typedef struct {
    size_t off, len;
    bool first;
} ds_piece;

typedef struct {
    ds_buf text;
    ds_piece *v;
    size_t n, cap;
    bool failed;
} ds_pieces;

typedef struct ds_pretok ds_pretok;

/* j: the "pre_tokenizer" value (NULL/null gives *out = NULL: none). */
ds_error *ds_pretok_parse(const cJSON *j, ds_pretok **out);
void ds_pretok_free(ds_pretok *pt);
/* Runs every step over io's pieces; the result replaces io. tmp is scratch. */
ds_error *ds_pretok_apply(const ds_pretok *pt, ds_pieces *io, ds_pieces *tmp, ds_regex_scratch **rs);

void ds_pieces_clear(ds_pieces *p);
bool ds_pieces_add(ds_pieces *p, const char *s, size_t n, bool first);
void ds_pieces_free(ds_pieces *p);

#endif
