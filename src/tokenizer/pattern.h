/* An HF `pattern`: {"String": "..."} (a literal) or {"Regex": "..."}.
 * Used by the Split pre-tokenizer and the Replace normalizer/decoder. */
#ifndef DS_TOK_PATTERN_H
#define DS_TOK_PATTERN_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "dspark.h"
#include "tokenizer/json_util.h"
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

/* A malloc'd, NUL-terminated copy of s in *out (*len: strlen(s)): the
 * `content` a normalizer or decoder step keeps. */
static inline ds_error *ds_step_content_copy(const char *s, char **out, size_t *len) {
    *len = strlen(s);
    if (!(*out = malloc(*len + 1))) return ds_errorf("out of memory");
    memcpy(*out, s, *len + 1);
    return NULL;
}

/* The fields of a Replace normalizer or decoder (the same in both), where
 * naming it: "pattern" into *pat and a copy of "content" into *content.
 * On error nothing is left allocated. */
static inline ds_error *ds_replace_parse(const cJSON *j, const char *where, ds_pattern *pat, char **content,
                                         size_t *content_len) {
    const char *c;
    char w[256];
    DS_TRY(ds_json_str(j, "content", where, &c));
    snprintf(w, sizeof w, "%s.pattern", where);
    DS_TRY(ds_pattern_parse(ds_json_get(j, "pattern"), w, pat));
    ds_error *e = ds_step_content_copy(c, content, content_len);
    if (e) ds_pattern_free(pat);
    return e;
}

#endif
