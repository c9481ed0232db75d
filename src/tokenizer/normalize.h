/* tokenizer.json "normalizer": NFC/NFD/NFKC/NFKD (utf8proc), Lowercase,
 * Strip, Replace, Prepend, and Sequence of those. Applied to each stretch
 * of text between added tokens, as HF does. */
#ifndef DS_TOK_NORMALIZE_H
#define DS_TOK_NORMALIZE_H

#include <cjson/cJSON.h>

#include "dspark.h"
#include "tokenizer/regex.h"
#include "tokenizer/strbuf.h"

typedef struct ds_normalizer ds_normalizer;

/* j: the "normalizer" value (NULL/null gives *out = NULL: no normalizer). */
ds_error *ds_normalizer_parse(const cJSON *j, ds_normalizer **out);
void ds_normalizer_free(ds_normalizer *nm);
/* Replaces out's contents with the normalized s[0..n) (valid UTF-8, not
 * aliasing out or tmp); tmp is scratch. nm may be NULL (copy). */
ds_error *ds_normalizer_apply(const ds_normalizer *nm, const char *s, size_t n, ds_buf *out, ds_buf *tmp,
                              ds_regex_scratch **rs);

#endif
