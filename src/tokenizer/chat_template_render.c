/* ds_chat_render: checks the messages once for every family, then hands
 * them to the family's renderer. Apart from the helpers the renderers share
 * (chat_template_str.c), which it would otherwise both call and serve. */
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
