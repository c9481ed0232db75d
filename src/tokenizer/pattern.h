/* An HF `pattern`: {"String": "..."} (a literal) or {"Regex": "..."}.
 * Used by the Split pre-tokenizer and the Replace normalizer/decoder. */
#ifndef DS_TOK_PATTERN_H
#define DS_TOK_PATTERN_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "dspark.h"
#include "tokenizer/regex.h"
#include "tokenizer/strbuf.h"

typedef struct {
    char *lit; /* literal pattern (NULL for a regex) */
    size_t lit_len;
    ds_regex *re;
} ds_pattern;

typedef struct {
    size_t start, end;
} ds_range;

typedef struct {
    ds_range *v;
    size_t n, cap;
} ds_ranges;

/* j is the value of the "pattern" field; where names it. */
ds_error *ds_pattern_parse(const cJSON *j, const char *where, ds_pattern *out);
/* Regex given directly (for built-in pre-tokenizers). */
ds_error *ds_pattern_regex(const char *re, const char *where, ds_pattern *out);
void ds_pattern_free(ds_pattern *p);

/* All non-overlapping leftmost matches in s[0..n), in order (empty
 * matches included, as Oniguruma's find_iter yields them). */
ds_error *ds_pattern_find_all(const ds_pattern *p, const char *s, size_t n, ds_regex_scratch **rs, ds_ranges *out);
/* Appends s with every match replaced by rep. */
ds_error *ds_pattern_replace_all(const ds_pattern *p, const char *s, size_t n, const char *rep, size_t rep_len,
                                 ds_regex_scratch **rs, ds_buf *out);
void ds_ranges_free(ds_ranges *r);

#endif
