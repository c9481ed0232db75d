/* An OpenAI request body (POST /v1/completions, /v1/chat/completions)
 * parsed and checked into a plain struct. Every field the server honours is
 * range-checked here and every field it cannot honour with a non-default
 * value (n > 1, logprobs, penalties, ...) is refused, each error naming the
 * field as `param`; unknown fields are ignored, as vLLM does. Nothing here
 * touches the engine, so this is the fuzz target (fuzz/fuzz_request.c). */
#ifndef DS_SERVE_REQUEST_H
#define DS_SERVE_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dspark.h"
#include "serve/api_error.h"

/* Caps on what one request may hold (the body size cap bounds the rest). */
#define DS_REQ_MAX_MESSAGES 1024
#define DS_REQ_MAX_STOP 16       /* OpenAI allows 4; vLLM more */
#define DS_REQ_MAX_STOP_BYTES 256
#define DS_REQ_MAX_MODEL_BYTES 256
/* max_tokens above this is refused outright (the engine's context, far
 * smaller, is checked once the prompt is tokenized). */
#define DS_REQ_MAX_TOKENS_CAP (1 << 24)

typedef enum { DS_REQ_COMPLETION, DS_REQ_CHAT } ds_req_kind;

typedef struct {
    ds_req_kind kind;
    char *model;                 /* NULL: not given */
    /* completions: a text prompt, or token ids as given (no BOS added) */
    char *prompt;                /* NUL-terminated; NULL when ids */
    int32_t *prompt_ids;
    size_t n_prompt_ids;
    /* chat: the messages (role and content strings owned) */
    ds_chat_message *messages;
    size_t n_messages;
    int max_tokens;              /* valid when max_tokens_given */
    bool max_tokens_given;
    float temperature;           /* >= 0; default 0 (greedy), as dspark generate */
    float top_p;                 /* (0, 1], 1: off */
    int top_k;                   /* 0: off */
    uint64_t seed;
    bool ignore_eos;
    char **stop;                 /* n_stop non-empty strings */
    size_t n_stop;
    bool stream;
    bool include_usage;          /* stream_options.include_usage */
    bool return_token_ids;       /* vLLM's extension: the ids of the output beside its text */
} ds_serve_request;

/* Parses body[0..len) (need not be NUL-terminated). false: *err is a 400
 * naming the field, *out holds nothing to free. true: free *out with
 * ds_serve_request_free. */
bool ds_serve_request_parse(ds_req_kind kind, const char *body, size_t len, ds_serve_request *out,
                            ds_api_error *err);
void ds_serve_request_free(ds_serve_request *r);

#endif
