/* Byte-string views and the Python string operations the chat templates use
 * (str.strip and friends), below the renderers and their dispatch. */
#ifndef DS_TOK_CHAT_TEMPLATE_STR_H
#define DS_TOK_CHAT_TEMPLATE_STR_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "tokenizer/strbuf.h"

typedef struct {
    const char *p;
    size_t n;
} ds_chat_str;

static inline ds_chat_str ds_chat_cstr(const char *s) { return (ds_chat_str){s, strlen(s)}; }

static inline void ds_chat_put(ds_buf *b, ds_chat_str s) { ds_buf_append(b, s.p, s.n); }
static inline void ds_chat_puts(ds_buf *b, const char *s) { ds_buf_append(b, s, strlen(s)); }

/* Python str.strip() with no argument: drops leading and trailing
 * characters for which str.isspace() is true (ASCII whitespace, \x1c-\x1f,
 * U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
 * U+3000). Jinja's `trim` filter is exactly this. s must be valid UTF-8. */
ds_chat_str ds_chat_py_strip(ds_chat_str s);

/* str.lstrip(c) / str.rstrip(c) for one ASCII character c. */
ds_chat_str ds_chat_lstrip_char(ds_chat_str s, char c);
ds_chat_str ds_chat_rstrip_char(ds_chat_str s, char c);

/* First / last occurrence of needle in s, or NULL. */
const char *ds_chat_find(ds_chat_str s, const char *needle);
const char *ds_chat_find_last(ds_chat_str s, const char *needle);

static inline bool ds_chat_starts_with(ds_chat_str s, const char *pre) {
    size_t k = strlen(pre);
    return s.n >= k && !memcmp(s.p, pre, k);
}
static inline bool ds_chat_ends_with(ds_chat_str s, const char *suf) {
    size_t k = strlen(suf);
    return s.n >= k && !memcmp(s.p + s.n - k, suf, k);
}

#endif
