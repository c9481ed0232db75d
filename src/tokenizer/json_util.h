/* Typed access to tokenizer.json fields, with errors that name the field
 * path (e.g. `pre_tokenizer.pretokenizers[1].behavior`). */
#ifndef DS_TOK_JSON_UTIL_H
#define DS_TOK_JSON_UTIL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "dspark.h"

/* Field `key` of object o, or NULL if absent or JSON null. */
const cJSON *ds_json_get(const cJSON *o, const char *key);
/* String field (required, non-null). */
ds_error *ds_json_str(const cJSON *o, const char *key, const char *where, const char **out);
/* String field or NULL when absent/null. */
ds_error *ds_json_str_opt(const cJSON *o, const char *key, const char *where, const char **out);
/* Bool field; dflt when absent/null. */
ds_error *ds_json_bool(const cJSON *o, const char *key, const char *where, bool dflt, bool *out);
/* Non-negative integer field; dflt when absent/null. */
ds_error *ds_json_uint(const cJSON *o, const char *key, const char *where, long long dflt, long long *out);
/* Non-negative integral number (e.g. a token id) bounded by max. */
ds_error *ds_json_as_uint(const cJSON *v, const char *where, long long max, long long *out);
/* The JSON type of v in words, for messages. */
const char *ds_json_kind(const cJSON *v);

#endif
