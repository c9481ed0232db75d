#include "serve/plain_chat.h"

#include <string.h>

void ds_plain_chat_render(const ds_chat_message *msgs, size_t n, ds_sbuf *out) {
    for (size_t i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        if (!strcmp(role, "user")) ds_sbuf_puts(out, "User: ");
        else if (!strcmp(role, "assistant")) ds_sbuf_puts(out, "Assistant: ");
        ds_sbuf_puts(out, msgs[i].content);
        ds_sbuf_puts(out, "\n\n");
    }
    ds_sbuf_puts(out, "Assistant:");
}
