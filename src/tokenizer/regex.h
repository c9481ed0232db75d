/* PCRE2 behind the HF "Regex" patterns. tokenizer.json regexes are written
 * for Oniguruma; the few constructs whose meaning differs in PCRE2 are
 * rewritten before compiling (see translate() in regex.c). Compiled
 * patterns are immutable and shared; the per-call match state lives in a
 * ds_regex_scratch that each encode/decode call owns. */
#ifndef DS_TOK_REGEX_H
#define DS_TOK_REGEX_H

#include <stdbool.h>
#include <stddef.h>

#include "dspark.h"

typedef struct ds_regex ds_regex;
typedef struct ds_regex_scratch ds_regex_scratch;

/* `where` names the JSON field for error messages. */
ds_error *ds_regex_compile(const char *pattern, size_t len, const char *where, ds_regex **out);
void ds_regex_free(ds_regex *re);

ds_regex_scratch *ds_regex_scratch_new(void);
void ds_regex_scratch_free(ds_regex_scratch *s);

/* Finds the first match at or after byte `start` of subject s[0..n) (valid
 * UTF-8, start on a character boundary). Returns 1 and the match bounds, 0
 * if there is none, or an error (e.g. match limit). *scratch is created on
 * first use. */
ds_error *ds_regex_find(const ds_regex *re, ds_regex_scratch **scratch, const char *s, size_t n,
                        size_t start, bool *found, size_t *mstart, size_t *mend);

#endif
