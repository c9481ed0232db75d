/* A streamed response (stream: true) as Server-Sent Events: one
 * `data: {chunk}\n\n` per batch of new text, the last chunk with the
 * finish reason and `usage`, then `data: [DONE]\n\n`. The HTTP layer pulls
 * bytes with ds_sse_read from its connection's thread, which blocks until
 * the engine thread publishes more; a peer that has gone away ends the
 * stream at once, and the caller then cancels the job. */
#ifndef DS_SERVE_SSE_H
#define DS_SERVE_SSE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "serve/engine_loop.h"

#define DS_SSE_END ((ssize_t)-1)   /* all sent (MHD_CONTENT_READER_END_OF_STREAM) */
#define DS_SSE_ERROR ((ssize_t)-2) /* the peer is gone or the server stops (..._END_WITH_ERROR) */

typedef struct ds_sse ds_sse;

/* Takes a reference on job (admitted: phase RUNNING or later). fd: the
 * connection's socket, polled for a hang-up while waiting (-1: never). */
ds_sse *ds_sse_new(ds_job *job, const char *id, const char *model, long long created, int fd);
/* Fills buf[0..max) with the next bytes; blocks until there are some. */
ssize_t ds_sse_read(ds_sse *s, char *buf, size_t max);
/* Cancels the job if it has not finished (the client left early), drops
 * the reference, frees s. */
void ds_sse_free(ds_sse *s);

/* Whether the peer of socket fd has closed its end or the socket failed. */
bool ds_peer_gone(int fd);

#endif
