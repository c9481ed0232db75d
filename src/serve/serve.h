/* dspark serve: an OpenAI-compatible HTTP server on a batched engine.
 *
 *   POST /v1/completions, POST /v1/chat/completions (stream or not)
 *   GET /v1/models, GET /health, GET /metrics (Prometheus), GET / (chat page)
 *
 * The engine is stepped by one engine thread (engine_loop.h); HTTP is
 * libmicrohttpd (http.c). The CLI (tools/dspark/cmd_serve.c) opens the
 * engine, starts the server, waits for SIGTERM / SIGINT and shuts down. */
#ifndef DS_SERVE_SERVE_H
#define DS_SERVE_SERVE_H

#include <stdbool.h>
#include <stddef.h>

#include "dspark.h"
#include "serve/engine_loop.h"

typedef struct {
    const char *host;        /* address to bind: a numeric IPv4/IPv6 address or a host name */
    int port;                /* 0: an ephemeral port (ds_server_port says which) */
    const char *api_key;     /* non-NULL: /v1/ needs "Authorization: Bearer KEY" */
    const char *model_name;  /* what /v1/models lists and requests may name */
    int max_connections;     /* concurrent connections (one thread each) */
    size_t max_body;         /* request body bytes; more is a 413 */
    int max_headers;         /* request header lines; more is a 431 */
    ds_loop_opts loop;
} ds_server_opts;

typedef struct ds_server ds_server;

/* Starts the engine thread and the HTTP daemon; requests are served from
 * the return on. The engine must outlive the server. */
ds_error *ds_server_start(ds_engine *e, const ds_server_opts *o, ds_server **out);
int ds_server_port(const ds_server *s);
/* The model has no chat template: chat renders a plain transcript (plain_chat.h). */
bool ds_server_plain_chat(const ds_server *s);
/* Stops accepting work (503 from now on), lets the requests in flight
 * finish for up to grace_s seconds, cancels the rest (finish reason
 * "abort"), then closes every connection. */
void ds_server_shutdown(ds_server *s, double grace_s);
void ds_server_free(ds_server *s);

#endif
