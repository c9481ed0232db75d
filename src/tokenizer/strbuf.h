/* Growable byte and id buffers for the tokenizer. Appends never fail
 * loudly: on out-of-memory the buffer sets `failed` and ignores further
 * appends, so a pipeline stage checks once at its end instead of after
 * every byte. */
#ifndef DS_TOK_STRBUF_H
#define DS_TOK_STRBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *data; /* always NUL-terminated once anything was appended */
    size_t len, cap;
    bool failed;
} ds_buf;

bool ds_buf_reserve(ds_buf *b, size_t extra);
bool ds_buf_append(ds_buf *b, const void *p, size_t n);
bool ds_buf_putc(ds_buf *b, char c);
/* Appends the UTF-8 encoding of code point cp (assumed valid). */
bool ds_buf_put_cp(ds_buf *b, uint32_t cp);
static inline void ds_buf_clear(ds_buf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}
void ds_buf_free(ds_buf *b);
/* Hands the bytes to the caller (malloc'd, NUL-terminated, never NULL
 * unless out of memory) and resets b. */
char *ds_buf_take(ds_buf *b, size_t *len);

typedef struct {
    int32_t *v;
    size_t n, cap;
    bool failed;
} ds_ids;

bool ds_ids_push(ds_ids *a, int32_t id);
bool ds_ids_append(ds_ids *a, const int32_t *ids, size_t n);
void ds_ids_free(ds_ids *a);

#endif
