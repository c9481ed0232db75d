/* Chat for a model without a chat template (the bundled pico-qwen3 is a
 * base model: its tokenizer_config.json has none, so ds_engine_chat_encode
 * refuses). Rather than refuse every chat request, the server renders the
 * conversation as a plain transcript a base model can continue:
 *
 *     SYSTEM TEXT\n\nUser: TEXT\n\nAssistant: TEXT\n\n ... User: TEXT\n\nAssistant:
 *
 * and stops the answer at DS_PLAIN_CHAT_STOP, where the model would start
 * writing the user's next turn. The server says so at start-up. A model
 * with a template always uses its template. */
#ifndef DS_SERVE_PLAIN_CHAT_H
#define DS_SERVE_PLAIN_CHAT_H

#include <stddef.h>

#include "dspark.h"
#include "serve/sbuf.h"

#define DS_PLAIN_CHAT_STOP "\nUser:"

/* Appends the transcript of msgs[0..n) (roles system, user, assistant). */
void ds_plain_chat_render(const ds_chat_message *msgs, size_t n, ds_sbuf *out);

#endif
