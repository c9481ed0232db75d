/* Qwen3's ChatML template (tokenizer_config.json of Qwen/Qwen3-*), text
 * messages only, rendered with enable_thinking=False. Contents are written
 * verbatim: this template trims nothing. */
#include "base/error.h"
#include "tokenizer/chat_template_internal.h"

/* The template's "last query": the last user message, except that a user
 * message that is only a wrapped tool result (it starts with
 * <tool_response> and ends with </tool_response>) does not count. With
 * none, it is the last message. */
static size_t last_query_index(const ds_chat_message *m, size_t n) {
    for (size_t i = n; i-- > 0;) {
        if (!ds_chat_is(&m[i], "user")) continue;
        ds_chat_str c = ds_chat_cstr(m[i].content);
        if (!(ds_chat_starts_with(c, "<tool_response>") && ds_chat_ends_with(c, "</tool_response>"))) return i;
    }
    return n - 1;
}

/* An assistant turn. The template splits "<think>reasoning</think>answer"
 * in the content: the answer is what follows the LAST </think> (leading
 * newlines dropped), the reasoning what lies between the last <think> and
 * the FIRST </think> (newlines trimmed around it). Turns after the last
 * query keep their reasoning in a <think> block -- the final message always
 * gets one, even empty -- earlier turns keep only the answer. */
static void put_assistant(ds_buf *b, ds_chat_str content, bool after_query, bool is_last) {
    ds_chat_str answer = content, reasoning = {"", 0};
    const char *first_close = ds_chat_find(content, "</think>");
    if (first_close) {
        const char *last_close = ds_chat_find_last(content, "</think>");
        size_t skip = (size_t)(last_close - content.p) + strlen("</think>");
        answer = ds_chat_lstrip_char((ds_chat_str){content.p + skip, content.n - skip}, '\n');
        ds_chat_str before = ds_chat_rstrip_char((ds_chat_str){content.p, (size_t)(first_close - content.p)}, '\n');
        const char *open = ds_chat_find_last(before, "<think>");
        if (open) {
            size_t k = (size_t)(open - before.p) + strlen("<think>");
            before = (ds_chat_str){before.p + k, before.n - k};
        }
        reasoning = ds_chat_lstrip_char(before, '\n');
    }
    ds_chat_puts(b, "<|im_start|>assistant\n");
    if (after_query && (is_last || reasoning.n > 0)) {
        ds_chat_puts(b, "<think>\n");
        ds_chat_put(b, ds_chat_rstrip_char(ds_chat_lstrip_char(reasoning, '\n'), '\n'));
        ds_chat_puts(b, "\n</think>\n\n");
        ds_chat_put(b, ds_chat_lstrip_char(answer, '\n'));
    } else {
        ds_chat_put(b, answer);
    }
    ds_chat_puts(b, "<|im_end|>\n");
}

ds_error *ds_chat_render_qwen3(const ds_chat_message *m, size_t n, bool add_generation_prompt, ds_buf *b) {
    /* Without tools the template opens with the system message, if first. */
    if (ds_chat_is(&m[0], "system")) {
        ds_chat_puts(b, "<|im_start|>system\n");
        ds_chat_puts(b, m[0].content);
        ds_chat_puts(b, "<|im_end|>\n");
    }
    size_t last_query = last_query_index(m, n);
    for (size_t i = 0; i < n; i++) {
        if (ds_chat_is(&m[i], "assistant")) {
            put_assistant(b, ds_chat_cstr(m[i].content), i > last_query, i + 1 == n);
        } else if (i > 0 || ds_chat_is(&m[i], "user")) { /* a later system message is a turn of its own */
            ds_chat_puts(b, "<|im_start|>");
            ds_chat_puts(b, m[i].role);
            ds_chat_puts(b, "\n");
            ds_chat_puts(b, m[i].content);
            ds_chat_puts(b, "<|im_end|>\n");
        }
    }
    /* enable_thinking=False: the template pre-closes an empty think block. */
    if (add_generation_prompt) ds_chat_puts(b, "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    return NULL;
}
