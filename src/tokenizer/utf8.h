/* UTF-8 helpers: strict validation, decoding of already-validated text,
 * Rust-compatible lossy decoding (one U+FFFD per maximal ill-formed
 * subpart, like String::from_utf8_lossy, which HF decoders use), and the
 * Unicode character classes the HF pipeline asks about. */
#ifndef DS_TOK_UTF8_H
#define DS_TOK_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/strbuf.h"

/* Offset of the first byte that does not start a valid UTF-8 sequence
 * (overlongs, surrogates and > U+10FFFF rejected), or n if s is valid. */
size_t ds_utf8_invalid_at(const char *s, size_t n);

/* Length of the well-formed sequence at s[0..n) (1..4), 0 if what is
 * there is a valid but incomplete prefix, or -k if the first k bytes are an
 * ill-formed subpart to replace by one U+FFFD. */
int ds_utf8_scan(const unsigned char *s, size_t n);

/* Decodes one character of valid UTF-8; returns its byte length. */
static inline int ds_utf8_next(const char *s, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xE0) {
        *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (u[0] < 0xF0) {
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
          ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    return 4;
}

/* Byte length of the character starting with lead byte c (1 for stray bytes). */
static inline int ds_utf8_len(unsigned char c) {
    return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* Appends s[0..n) to out, replacing ill-formed subparts by U+FFFD. If
 * `final` is false an incomplete sequence at the end is left unconsumed;
 * returns the number of bytes consumed. */
size_t ds_utf8_append_lossy(ds_buf *out, const char *s, size_t n, bool final);

/* Rust char::is_whitespace (Unicode White_Space). */
bool ds_is_white_space(uint32_t cp);
/* Regex \w as Rust's regex crate has it: letters, marks, decimal digits,
 * connector punctuation, Nl, ZWJ/ZWNJ. */
bool ds_is_word_char(uint32_t cp);

#endif
