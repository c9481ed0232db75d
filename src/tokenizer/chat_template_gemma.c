/* Gemma 3 and Gemma 4 chat templates, text messages only. Both write the
 * "<bos>" token into the prompt themselves and trim contents with Jinja's
 * `trim` (Python str.strip()); they differ in turn markers and in what
 * happens to a system message. */
#include "base/error.h"
#include "tokenizer/chat_template_internal.h"

static const char *gemma_role(const ds_chat_message *m) { return ds_chat_is(m, "assistant") ? "model" : m->role; }

ds_error *ds_chat_render_gemma3(const ds_chat_message *m, size_t n, bool add_generation_prompt, ds_buf *b) {
    ds_chat_puts(b, "<bos>");
    /* Gemma 3 has no system turn: a leading system message is prepended to
     * the first turn after it -- not trimmed, and followed by a blank line
     * even when empty. */
    size_t start = 0;
    const char *system = NULL;
    if (ds_chat_is(&m[0], "system")) {
        system = m[0].content;
        start = 1;
    }
    for (size_t i = start; i < n; i++) {
        size_t k = i - start;
        /* The template's check: user exactly at even positions. It only
         * looks at "is this user", so a system message at an odd position
         * passes and becomes a turn named "system". */
        if (ds_chat_is(&m[i], "user") != (k % 2 == 0))
            return ds_errorf("chat message %zu (%s): Gemma 3's template requires roles to alternate "
                             "user/assistant/user/... after the optional first system message",
                             i, m[i].role);
        ds_chat_puts(b, "<start_of_turn>");
        ds_chat_puts(b, gemma_role(&m[i]));
        ds_chat_puts(b, "\n");
        if (k == 0 && system) {
            ds_chat_puts(b, system);
            ds_chat_puts(b, "\n\n");
        }
        ds_chat_put(b, ds_chat_py_strip(ds_chat_cstr(m[i].content)));
        ds_chat_puts(b, "<end_of_turn>\n");
    }
    if (add_generation_prompt) ds_chat_puts(b, "<start_of_turn>model\n");
    return NULL;
}

/* The template's strip_thinking macro for model turns: every
 * "<|channel>...<channel|>" thought part goes (the text is cut at each
 * <channel|>, and inside each piece everything from the first <|channel>
 * on is dropped -- so an unclosed <|channel> drops the rest of its piece
 * and a stray <channel|> just disappears), then the result is trimmed. */
static void put_stripped_thinking(ds_buf *b, ds_chat_str s, ds_buf *tmp) {
    ds_buf_clear(tmp);
    const size_t close_len = strlen("<channel|>");
    for (;;) {
        const char *close = ds_chat_find(s, "<channel|>");
        ds_chat_str piece = {s.p, close ? (size_t)(close - s.p) : s.n};
        const char *open = ds_chat_find(piece, "<|channel>");
        if (open) piece.n = (size_t)(open - piece.p);
        ds_chat_put(tmp, piece);
        if (!close) break;
        size_t skip = (size_t)(close - s.p) + close_len;
        s = (ds_chat_str){s.p + skip, s.n - skip};
    }
    if (tmp->failed) {
        b->failed = true;
        return;
    }
    ds_chat_put(b, ds_chat_py_strip((ds_chat_str){tmp->data ? tmp->data : "", tmp->len}));
}

ds_error *ds_chat_render_gemma4(const ds_chat_message *m, size_t n, bool add_generation_prompt, ds_buf *b) {
    ds_chat_puts(b, "<bos>");
    /* With thinking off and no tools, the system turn exists only for a
     * leading system message -- written even when it trims to nothing. */
    size_t start = 0;
    if (ds_chat_is(&m[0], "system")) {
        ds_chat_puts(b, "<|turn>system\n");
        ds_chat_put(b, ds_chat_py_strip(ds_chat_cstr(m[0].content)));
        ds_chat_puts(b, "<turn|>\n");
        start = 1;
    }
    ds_buf tmp = {0};
    for (size_t i = start; i < n; i++) {
        bool model = ds_chat_is(&m[i], "assistant");
        /* An assistant message straight after another continues the same
         * model turn: no new header, though the previous one was already
         * closed with <turn|>. (The template's look-back skips tool
         * messages, which this renderer never gets.) */
        bool continues = model && i > start && ds_chat_is(&m[i - 1], "assistant");
        if (!continues) {
            ds_chat_puts(b, "<|turn>");
            ds_chat_puts(b, gemma_role(&m[i]));
            ds_chat_puts(b, "\n");
        }
        if (model) put_stripped_thinking(b, ds_chat_cstr(m[i].content), &tmp);
        else ds_chat_put(b, ds_chat_py_strip(ds_chat_cstr(m[i].content)));
        ds_chat_puts(b, "<turn|>\n");
    }
    ds_buf_free(&tmp);
    /* enable_thinking=False: the model turn opens with an empty, closed
     * thought channel, so the model answers without thinking. */
    if (add_generation_prompt) ds_chat_puts(b, "<|turn>model\n<|channel>thought\n<channel|>");
    return NULL;
}
