/* GPT-2 byte-level alphabet: every byte is shown as a printable code point
 * (printable Latin-1 bytes as themselves, the other 68 as U+0100..U+0143 in
 * byte order), so BPE works on bytes while the vocab stays valid UTF-8. */
#ifndef DS_TOK_BYTE_LEVEL_H
#define DS_TOK_BYTE_LEVEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/strbuf.h"

static inline uint32_t ds_byte_to_cp(uint8_t b) {
    if (b <= 32) return 256u + b;                /* 0..32   -> U+0100..U+0120 */
    if (b <= 126) return b;                      /* '!'..'~' */
    if (b <= 160) return b + 162u;               /* 127..160 -> U+0121..U+0142 */
    if (b == 173) return 323;                    /* soft hyphen -> U+0143 */
    return b;                                    /* 161..255 except 173 */
}

/* The byte a code point stands for, or -1 if it is not in the alphabet. */
static inline int ds_cp_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 255 && cp != 173)) return (int)cp;
    if (cp >= 256 && cp <= 288) return (int)(cp - 256);
    if (cp >= 289 && cp <= 322) return (int)(cp - 162);
    if (cp == 323) return 173;
    return -1;
}

/* Appends s[0..n) with every byte replaced by its alphabet character. */
void ds_byte_level_encode(ds_buf *out, const char *s, size_t n);
/* Appends the bytes a token stands for. A token with any character outside
 * the alphabet (an added token like "<|im_start|> x") is taken as its own
 * UTF-8 bytes, as HF's ByteLevel decoder does. */
void ds_byte_level_decode_token(ds_buf *out, const char *tok, size_t n);

#endif
