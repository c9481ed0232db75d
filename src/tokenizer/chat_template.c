/* ds_chat_render: checks the messages once for every family, then hands
 * them to the family's renderer; plus the Python string helpers the
 * renderers share. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/chat_template_internal.h"
#include "tokenizer/utf8.h"

const char *ds_chat_family_name(ds_chat_family f) {
    switch (f) {
    case DS_CHAT_CHATML_QWEN3: return "qwen3-chatml";
    case DS_CHAT_GEMMA3: return "gemma3";
    case DS_CHAT_GEMMA4: return "gemma4";
    case DS_CHAT_UNKNOWN: break;
    }
    return "unknown";
}

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

static ds_error *check_messages(const ds_chat_message *msgs, size_t n) {
    if (n == 0 || !msgs) return ds_errorf("chat: the conversation has no messages");
    for (size_t i = 0; i < n; i++) {
        const ds_chat_message *m = &msgs[i];
        if (!m->role) return ds_errorf("chat message %zu: no role", i);
        if (!ds_chat_is(m, "system") && !ds_chat_is(m, "user") && !ds_chat_is(m, "assistant"))
            return ds_errorf("chat message %zu: role \"%s\" is not system, user or assistant", i, m->role);
        if (!m->content) return ds_errorf("chat message %zu (%s): no content", i, m->role);
        size_t len = strlen(m->content);
        size_t bad = ds_utf8_invalid_at(m->content, len);
        if (bad != len)
            return ds_errorf("chat message %zu (%s): content is not valid UTF-8 (byte %zu)", i, m->role, bad);
    }
    return NULL;
}

ds_error *ds_chat_render(ds_chat_family f, const ds_chat_message *msgs, size_t n, bool add_generation_prompt,
                         char **out) {
    *out = NULL;
    ds_error *(*render)(const ds_chat_message *, size_t, bool, ds_buf *) = NULL;
    switch (f) {
    case DS_CHAT_CHATML_QWEN3: render = ds_chat_render_qwen3; break;
    case DS_CHAT_GEMMA3: render = ds_chat_render_gemma3; break;
    case DS_CHAT_GEMMA4: render = ds_chat_render_gemma4; break;
    case DS_CHAT_UNKNOWN: break;
    }
    if (!render) return ds_errorf("chat: no renderer for template family %s (%d)", ds_chat_family_name(f), (int)f);
    DS_TRY(check_messages(msgs, n));
    ds_buf b = {0};
    ds_error *e = render(msgs, n, add_generation_prompt, &b);
    if (!e && b.failed) e = ds_errorf("chat: out of memory rendering %zu messages", n);
    if (e) {
        ds_buf_free(&b);
        return ds_error_wrap(e, "rendering the %s chat template", ds_chat_family_name(f));
    }
    *out = ds_buf_take(&b, NULL);
    if (!*out) return ds_errorf("chat: out of memory rendering %zu messages", n);
    return NULL;
}
