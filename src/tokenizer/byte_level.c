#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

void ds_byte_level_encode(ds_buf *out, const char *s, size_t n) {
    if (!ds_buf_reserve(out, 2 * n)) return;
    char *w = out->data + out->len;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = ds_byte_to_cp((uint8_t)s[i]);
        if (cp < 0x80) {
            *w++ = (char)cp;
        } else {
            *w++ = (char)(0xC0 | (cp >> 6));
            *w++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    out->len = (size_t)(w - out->data);
    out->data[out->len] = 0;
}

void ds_byte_level_decode_token(ds_buf *out, const char *tok, size_t n) {
    if (!ds_buf_reserve(out, n)) return;
    size_t start = out->len;
    size_t i = 0;
    while (i < n) {
        int k = ds_utf8_scan((const unsigned char *)tok + i, n - i);
        uint32_t cp = 0;
        int b = -1;
        if (k > 0) {
            ds_utf8_next(tok + i, &cp);
            b = ds_cp_to_byte(cp);
        }
        if (b < 0) { /* not a byte-level token: its raw bytes */
            out->len = start;
            ds_buf_append(out, tok, n);
            return;
        }
        out->data[out->len++] = (char)b;
        i += (size_t)k;
    }
    out->data[out->len] = 0;
}
