/* The Python string operations the chat templates use, on byte views. */
#include "tokenizer/chat_template_str.h"

#include <stdint.h>

#include "tokenizer/utf8.h"

/* Python's str.isspace(), which is what str.strip() strips: not Unicode
 * White_Space (it adds the \x1c-\x1f separators) and not Rust's
 * char::is_whitespace, so ds_is_white_space would be wrong here. */
static bool py_is_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
    if (cp < 0x85) return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

ds_chat_str ds_chat_py_strip(ds_chat_str s) {
    size_t a = 0, z = s.n;
    while (a < z) {
        uint32_t cp;
        int k = ds_utf8_next(s.p + a, &cp);
        if (!py_is_space(cp)) break;
        a += (size_t)k;
    }
    while (z > a) {
        size_t start = z - 1; /* back up to the lead byte of the last character */
        while (start > a && ((unsigned char)s.p[start] & 0xC0) == 0x80) start--;
        uint32_t cp;
        ds_utf8_next(s.p + start, &cp);
        if (!py_is_space(cp)) break;
        z = start;
    }
    return (ds_chat_str){s.p + a, z - a};
}

ds_chat_str ds_chat_lstrip_char(ds_chat_str s, char c) {
    while (s.n && s.p[0] == c) s.p++, s.n--;
    return s;
}

ds_chat_str ds_chat_rstrip_char(ds_chat_str s, char c) {
    while (s.n && s.p[s.n - 1] == c) s.n--;
    return s;
}

const char *ds_chat_find(ds_chat_str s, const char *needle) { return memmem(s.p, s.n, needle, strlen(needle)); }

const char *ds_chat_find_last(ds_chat_str s, const char *needle) {
    size_t k = strlen(needle);
    const char *last = NULL;
    for (const char *at = s.p; (at = memmem(at, s.n - (size_t)(at - s.p), needle, k)); at++) last = at;
    return last;
}
