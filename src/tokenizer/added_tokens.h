/* Added tokens ("added_tokens" of tokenizer.json): matched in the text
 * before anything else, leftmost-longest like HF's Aho-Corasick pass, with
 * the single_word / lstrip / rstrip / normalized flags. Tokens with
 * normalized=false are looked for in the raw text, the others in each
 * normalized stretch (their content normalized the same way). */
#ifndef DS_TOK_ADDED_TOKENS_H
#define DS_TOK_ADDED_TOKENS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "dspark.h"
#include "tokenizer/hashmap.h"
#include "tokenizer/normalize.h"

typedef struct {
    char *content;
    size_t len;
    int32_t id;
    bool special, single_word, lstrip, rstrip, normalized;
} ds_added_token;

/* A byte trie over token contents: edges in a pairmap keyed
 * (node << 8 | byte), term[node] = index of the token ending there. */
typedef struct {
    ds_pairmap edges;
    int32_t *term;
    size_t n_nodes;
    bool first[256]; /* bytes some content starts with: fast skip */
} ds_trie;

typedef struct {
    ds_added_token *tok;
    size_t n;
    ds_trie raw;  /* normalized=false tokens, on the input text */
    ds_trie norm; /* normalized=true tokens, on normalized text */
    ds_strtab by_content; /* content -> index into tok (contents are unique) */
} ds_added_vocab;

/* A piece of text [start, end): an added token (id >= 0) or plain text (-1). */
typedef struct {
    size_t start, end;
    int32_t id;
} ds_seg;

typedef struct {
    ds_seg *v;
    size_t n, cap;
} ds_segs;

/* arr: the "added_tokens" value (may be NULL). nm normalizes the contents
 * of normalized=true tokens; vocab (the model's) decides ids as in HF. */
ds_error *ds_added_load(ds_added_vocab *av, const cJSON *arr, const ds_normalizer *nm, const ds_strtab *vocab);
void ds_added_free(ds_added_vocab *av);
/* Splits s[0..n) at the matches of trie t (av->raw or av->norm); appends
 * segments (offsets relative to s) to out. */
ds_error *ds_added_split(const ds_added_vocab *av, const ds_trie *t, const char *s, size_t n, ds_segs *out);
void ds_segs_free(ds_segs *s);

#endif
