/* The OpenAI wire format: response bodies, streamed chunks, errors and the
 * model list, written straight into a buffer. Text is escaped here, not by
 * cJSON: model output may hold NUL bytes or (after a stop string cut
 * inside a character) a broken UTF-8 sequence, which becomes U+FFFD so the
 * JSON is always valid. */
#ifndef DS_SERVE_OPENAI_JSON_H
#define DS_SERVE_OPENAI_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve/api_error.h"
#include "serve/request.h"
#include "serve/sbuf.h"

/* Appends s[0..n) as a JSON string literal (quotes included). */
void ds_json_string(ds_sbuf *out, const char *s, size_t n);

/* {"error": {"message", "type", "param", "code"}} */
void ds_oai_error(ds_sbuf *out, const ds_api_error *e);

/* What one response (or one chunk) says. */
typedef struct {
    ds_req_kind kind;
    const char *id;           /* "cmpl-..." / "chatcmpl-..." */
    long long created;        /* Unix seconds */
    const char *model;
    const char *text;         /* the (new) text */
    size_t text_len;
    const int32_t *ids;       /* with return_token_ids (NULL: no "token_ids" field) */
    size_t n_ids;
    bool first;               /* a chat stream's first chunk carries the role */
    const char *finish_reason; /* NULL: null */
    bool usage;               /* add "usage" */
    int prompt_tokens, completion_tokens;
} ds_oai_out;

/* A whole response (stream false). */
void ds_oai_response(ds_sbuf *out, const ds_oai_out *o);
/* One streamed chunk's JSON (without the SSE framing). */
void ds_oai_chunk(ds_sbuf *out, const ds_oai_out *o);
/* stream_options.include_usage's last chunk: no choices, the usage. */
void ds_oai_usage_chunk(ds_sbuf *out, const ds_oai_out *o);
/* GET /v1/models */
void ds_oai_models(ds_sbuf *out, const char *model, long long created, int max_model_len);

#endif
