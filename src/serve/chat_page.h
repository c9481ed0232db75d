/* The chat page served at GET /: src/serve/chat_page.html, turned into
 * bytes at build time (embed_file.cmake), so the binary needs no files. */
#ifndef DS_SERVE_CHAT_PAGE_H
#define DS_SERVE_CHAT_PAGE_H

#include <stddef.h>

extern const unsigned char ds_chat_page[];
extern const size_t ds_chat_page_size;

#endif
