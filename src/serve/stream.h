/* One request's output text as the client sees it: tokens in, text out.
 * Streaming detokenization (never half a UTF-8 character) and stop strings
 * matched across token boundaries: text that could still be the start of a
 * stop string is held back until it cannot be, so a stop string never
 * reaches the client, streamed or not. */
#ifndef DS_SERVE_STREAM_H
#define DS_SERVE_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dspark.h"
#include "serve/sbuf.h"

typedef struct ds_text_stream ds_text_stream;

/* stop[0..n_stop) non-empty strings (copied). NULL when out of memory. */
ds_text_stream *ds_text_stream_new(const ds_tokenizer *tok, char *const *stop, size_t n_stop);
void ds_text_stream_free(ds_text_stream *s);
/* Feeds one committed token; appends to out the text now safe to show.
 * Returns true when a stop string has matched: out then ends right before
 * it, and the stream takes no more tokens. */
bool ds_text_stream_push(ds_text_stream *s, int32_t id, ds_sbuf *out);
/* The output has ended: appends the held-back text and the detokenizer's
 * tail, up to a stop string if one matches there (returns true then). */
bool ds_text_stream_finish(ds_text_stream *s, ds_sbuf *out);

#endif
