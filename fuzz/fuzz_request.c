/* libFuzzer harness: an OpenAI request body through ds_serve_request_parse,
 * what `dspark serve` runs on every POST /v1/completions and
 * /v1/chat/completions body before anything else touches it. Input: one
 * byte choosing the endpoint (even: completions, odd: chat), then the body.
 *
 * A refusal must be a 400 (or a 500 for memory) with a message and a short
 * param. An accepted request must be what the parser promises (ranges,
 * caps, exactly one prompt form, non-empty stop strings), its strings must
 * survive the server's JSON escaping (ds_json_string, read back by cJSON),
 * and its text through the pico tokenizer and the stop-string stream
 * (stream.c) must never show a stop string and must be a prefix of the
 * same stream's text without stop strings (all of it when none matched). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_file.h"
#include "serve/openai_json.h"
#include "serve/request.h"
#include "serve/stream.h"

static void broken(const char *why) {
    fprintf(stderr, "fuzz_request: %s\n", why);
    abort();
}

static ds_tokenizer *tok;

/* The JSON escaping of s reads back (with cJSON) as s, where s is text
 * cJSON would keep whole (no NUL: a C string here). Valid UTF-8 comes back
 * byte for byte; anything else at least parses. */
static void check_escape(const char *s) {
    ds_sbuf b = {0};
    ds_json_string(&b, s, strlen(s));
    if (b.oom) return;
    cJSON *j = cJSON_Parse(ds_sbuf_str(&b));
    if (!j || !cJSON_IsString(j)) broken("ds_json_string wrote invalid JSON");
    cJSON_Delete(j);
    ds_sbuf_free(&b);
}

/* Text -> ids -> the stop-string stream: nothing shown holds a stop
 * string, and what is shown is exactly the text before the first one
 * generated. */
static void check_stream(const ds_serve_request *r, const char *text) {
    if (!tok) return;
    int32_t *ids = NULL;
    size_t n = 0;
    ds_error *e = ds_tokenizer_encode(tok, text, strlen(text), false, &ids, &n);
    if (e) { /* invalid UTF-8 and the like */
        ds_fuzz_consume(e);
        return;
    }
    if (n > 256) n = 256; /* ends[] below */
    /* The reference: the same stream without stop strings (the streaming
     * detokenizer may differ from decode() on ill-formed bytes, by design),
     * with the text's length after each token (ends[n]: after the finish). */
    ds_text_stream *ref = ds_text_stream_new(tok, NULL, 0);
    if (!ref) broken("ds_text_stream_new failed");
    ds_sbuf all = {0};
    size_t ends[257];
    for (size_t i = 0; i < n; i++) {
        if (ds_text_stream_push(ref, ids[i], &all)) broken("a stream without stop strings stopped");
        ends[i] = all.len;
    }
    if (ds_text_stream_finish(ref, &all)) broken("a stream without stop strings stopped at its end");
    ends[n] = all.len;
    ds_text_stream_free(ref);
    const char *plain = ds_sbuf_str(&all);
    ds_text_stream *s = ds_text_stream_new(tok, r->stop, r->n_stop);
    if (!s) broken("ds_text_stream_new failed");
    ds_sbuf out = {0};
    bool stopped = false;
    for (size_t i = 0; i < n && !stopped; i++) stopped = ds_text_stream_push(s, ids[i], &out);
    if (!stopped) stopped = ds_text_stream_finish(s, &out);
    /* A stop string ends the output as soon as one has been generated: at
     * the first token after which the text holds one, the output is that
     * text cut before its earliest match (a longer stop string starting
     * earlier but not yet complete does not count); none: all of it. */
    size_t first = all.len;
    bool want_stop = false;
    for (size_t i = 0; i <= n && !want_stop; i++) {
        for (size_t k = 0; k < r->n_stop; k++) {
            const char *m = memmem(plain, ends[i], r->stop[k], strlen(r->stop[k]));
            if (m && (!want_stop || (size_t)(m - plain) < first)) first = (size_t)(m - plain), want_stop = true;
        }
    }
    if (stopped != want_stop) broken("stopped where no stop string occurs, or missed one");
    if (out.len != first || memcmp(ds_sbuf_str(&out), plain, first))
        broken("the text shown is not the text before the first stop string generated");
    ds_sbuf_free(&out);
    ds_text_stream_free(s);
    ds_sbuf_free(&all);
    free(ids);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    ds_error *e = ds_tokenizer_load(DS_ROOT "/models/pico-qwen3/tokenizer.json", &tok);
    if (e) {
        fprintf(stderr, "fuzz_request: no pico tokenizer (%s): the stream checks are off\n", ds_error_message(e));
        ds_error_free(e);
        tok = NULL;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    const ds_req_kind kind = data[0] & 1 ? DS_REQ_CHAT : DS_REQ_COMPLETION;
    ds_serve_request r;
    ds_api_error err;
    if (!ds_serve_request_parse(kind, (const char *)data + 1, size - 1, &r, &err)) {
        if (err.status != 400 && err.status != 500) broken("a refusal that is not a 400");
        if (!*err.message) broken("a refusal without a message");
        if (strlen(err.param) >= sizeof err.param - 1) broken("a param filling its buffer");
        ds_sbuf b = {0};
        ds_oai_error(&b, &err);
        cJSON *j = cJSON_Parse(ds_sbuf_str(&b));
        if (!j) broken("an error body that is not JSON");
        cJSON_Delete(j);
        ds_sbuf_free(&b);
        return 0;
    }
    if (r.kind != kind) broken("the wrong kind");
    if (kind == DS_REQ_COMPLETION) {
        if (!r.prompt == !r.prompt_ids) broken("not exactly one of prompt text and prompt ids");
        if (r.prompt_ids && !r.n_prompt_ids) broken("an empty id prompt");
        for (size_t i = 0; i < r.n_prompt_ids; i++)
            if (r.prompt_ids[i] < 0) broken("a negative id");
        if (r.messages) broken("messages on a completion");
    } else {
        if (!r.n_messages || r.n_messages > DS_REQ_MAX_MESSAGES) broken("a message count out of range");
        for (size_t i = 0; i < r.n_messages; i++) {
            const char *role = r.messages[i].role;
            if (!role || !r.messages[i].content) broken("a message without role or content");
            if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) broken("a bad role");
        }
        if (r.prompt || r.prompt_ids) broken("a prompt on a chat request");
    }
    if (r.max_tokens_given && !(r.max_tokens >= 1 && r.max_tokens <= DS_REQ_MAX_TOKENS_CAP))
        broken("max_tokens out of range");
    if (!(r.temperature >= 0 && isfinite(r.temperature))) broken("a bad temperature");
    if (!(r.top_p > 0 && r.top_p <= 1)) broken("a bad top_p");
    if (r.top_k < 0) broken("a negative top_k");
    if (r.n_stop > DS_REQ_MAX_STOP) broken("too many stop strings");
    for (size_t i = 0; i < r.n_stop; i++)
        if (!*r.stop[i] || strlen(r.stop[i]) > DS_REQ_MAX_STOP_BYTES) broken("a stop string out of range");
    if (r.model) check_escape(r.model);
    if (r.prompt) {
        check_escape(r.prompt);
        check_stream(&r, r.prompt);
    }
    for (size_t i = 0; i < r.n_messages; i++) {
        check_escape(r.messages[i].content);
        if (i == 0) check_stream(&r, r.messages[i].content);
    }
    ds_serve_request_free(&r);
    return 0;
}
