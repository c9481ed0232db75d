/* Shared by the chat template renderers: one renderer per family, and the
 * byte-string views with the Python string operations the templates use
 * (chat_template_str.h). Renderers get messages already checked by
 * ds_chat_render (known roles, non-NULL valid UTF-8 contents, n >= 1) and
 * append to a ds_buf whose `failed` flag the caller checks once. */
#ifndef DS_TOK_CHAT_TEMPLATE_INTERNAL_H
#define DS_TOK_CHAT_TEMPLATE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "tokenizer/chat_template.h"
#include "tokenizer/chat_template_str.h"
#include "tokenizer/strbuf.h"

static inline bool ds_chat_is(const ds_chat_message *m, const char *role) { return !strcmp(m->role, role); }

ds_error *ds_chat_render_qwen3(const ds_chat_message *m, size_t n, bool add_generation_prompt, ds_buf *out);
ds_error *ds_chat_render_gemma3(const ds_chat_message *m, size_t n, bool add_generation_prompt, ds_buf *out);
ds_error *ds_chat_render_gemma4(const ds_chat_message *m, size_t n, bool add_generation_prompt, ds_buf *out);

#endif
