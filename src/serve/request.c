/* OpenAI request bodies -> ds_serve_request. The rules, field by field:
 *
 * - null is "not given" for every optional field (LangChain and others send
 *   explicit nulls).
 * - numbers: cJSON holds them as doubles; an integer field must be integral
 *   and in range, NaN never passes (every check is written so that a NaN
 *   comparison fails it).
 * - honoured: model, prompt | messages, max_tokens (max_completion_tokens
 *   for chat, which wins), temperature, top_p, top_k (vLLM; -1 or 0 off),
 *   seed, stop, n (1 only), stream, stream_options.include_usage,
 *   ignore_eos and return_token_ids (vLLM's extensions).
 * - refused when set to anything but their no-op value, since silently
 *   ignoring them would change what the client asked for: best_of,
 *   logprobs, top_logprobs, echo, suffix, presence/frequency/repetition
 *   penalties, logit_bias, min_tokens, tools, response_format other than
 *   text.
 * - anything else is ignored (user, metadata, store, ...), as vLLM does. */
#include "serve/request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* The field, or NULL when absent or null. */
static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static bool oom(ds_api_error *err) {
    ds_api_errorf(err, 500, NULL, "out of memory while reading the request");
    return false;
}

/* An integral number in [lo, hi]. */
static bool get_int(const cJSON *v, const char *name, double lo, double hi, long long *out, ds_api_error *err) {
    if (!cJSON_IsNumber(v)) {
        ds_api_errorf(err, 400, name, "'%s' must be an integer", name);
        return false;
    }
    double d = v->valuedouble;
    if (!(d >= lo && d <= hi) || d != floor(d)) {
        ds_api_errorf(err, 400, name, "'%s' must be an integer in [%.0f, %.0f], got %g", name, lo, hi, d);
        return false;
    }
    *out = (long long)d;
    return true;
}

static bool get_float(const cJSON *v, const char *name, float *out, ds_api_error *err) {
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || fabs(v->valuedouble) > 1e30) {
        ds_api_errorf(err, 400, name, "'%s' must be a finite number", name);
        return false;
    }
    *out = (float)v->valuedouble;
    return true;
}

static bool get_bool(const cJSON *v, const char *name, bool *out, ds_api_error *err) {
    if (!cJSON_IsBool(v)) {
        ds_api_errorf(err, 400, name, "'%s' must be true or false", name);
        return false;
    }
    *out = cJSON_IsTrue(v);
    return true;
}

/* A field the server cannot honour: fine when absent, null, or its no-op. */
static bool refuse_unless_noop(const cJSON *root, const char *name, ds_api_error *err) {
    const cJSON *v = field(root, name);
    if (!v) return true;
    bool noop = false;
    if (!strcmp(name, "best_of")) noop = cJSON_IsNumber(v) && v->valuedouble == 1;
    else if (!strcmp(name, "repetition_penalty")) noop = cJSON_IsNumber(v) && v->valuedouble == 1;
    else if (!strcmp(name, "logprobs")) noop = cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0);
    else if (!strcmp(name, "echo")) noop = cJSON_IsFalse(v);
    else if (!strcmp(name, "suffix")) noop = cJSON_IsString(v) && !*v->valuestring;
    else if (!strcmp(name, "logit_bias")) noop = cJSON_IsObject(v) && !v->child;
    else if (!strcmp(name, "tools")) noop = cJSON_IsArray(v) && !v->child;
    else if (!strcmp(name, "response_format")) {
        const cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
        noop = t && cJSON_IsString(t) && !strcmp(t->valuestring, "text");
    } else noop = cJSON_IsNumber(v) && v->valuedouble == 0; /* penalties, top_logprobs, min_tokens */
    if (noop) return true;
    ds_api_errorf(err, 400, name, "'%s' is not supported by this server (leave it out)", name);
    return false;
}

static bool parse_stop(const cJSON *root, ds_serve_request *r, ds_api_error *err) {
    const cJSON *v = field(root, "stop");
    if (!v) return true;
    if (cJSON_IsString(v)) {
        if (!*v->valuestring) return true; /* "" stops nothing */
    } else if (!cJSON_IsArray(v)) {
        ds_api_errorf(err, 400, "stop", "'stop' must be a string or an array of strings");
        return false;
    }
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 1;
    if (n > DS_REQ_MAX_STOP) {
        ds_api_errorf(err, 400, "stop", "'stop' holds %d strings; at most %d are allowed", n, DS_REQ_MAX_STOP);
        return false;
    }
    if (!n) return true;
    if (!(r->stop = calloc((size_t)n, sizeof *r->stop))) return oom(err);
    int i = 0;
    for (const cJSON *s = cJSON_IsArray(v) ? v->child : v; s && i < n; s = cJSON_IsArray(v) ? s->next : NULL, i++) {
        char param[32];
        snprintf(param, sizeof param, cJSON_IsArray(v) ? "stop[%d]" : "stop", i);
        if (!cJSON_IsString(s)) {
            ds_api_errorf(err, 400, param, "'%s' must be a string", param);
            return false;
        }
        size_t len = strlen(s->valuestring);
        if (len > DS_REQ_MAX_STOP_BYTES) {
            ds_api_errorf(err, 400, param, "'%s' is %zu bytes; at most %d are allowed", param, len,
                          DS_REQ_MAX_STOP_BYTES);
            return false;
        }
        if (!len) continue; /* an empty stop string would match everywhere: dropped */
        if (!(r->stop[r->n_stop++] = dup_str(s->valuestring))) return oom(err);
    }
    return true;
}

/* Token ids: integers in [0, 2^31). The vocabulary bound is the engine's. */
static bool parse_ids(const cJSON *a, const char *param, ds_serve_request *r, ds_api_error *err) {
    int n = cJSON_GetArraySize(a);
    if (!(r->prompt_ids = malloc((size_t)(n ? n : 1) * sizeof *r->prompt_ids))) return oom(err);
    int i = 0;
    for (const cJSON *t = a->child; t; t = t->next, i++) {
        long long id;
        char name[48];
        snprintf(name, sizeof name, "%s[%d]", param, i);
        if (!get_int(t, name, 0, 2147483647.0, &id, err)) return false;
        r->prompt_ids[i] = (int32_t)id;
    }
    r->n_prompt_ids = (size_t)i;
    return true;
}

static bool parse_prompt(const cJSON *root, ds_serve_request *r, ds_api_error *err) {
    const cJSON *p = field(root, "prompt");
    if (!p) {
        ds_api_errorf(err, 400, "prompt", "'prompt' is required");
        return false;
    }
    if (cJSON_IsString(p)) {
        if (!(r->prompt = dup_str(p->valuestring))) return oom(err);
        return true;
    }
    if (!cJSON_IsArray(p) || !p->child) {
        ds_api_errorf(err, 400, "prompt", "'prompt' must be a string, an array of token ids, or an array holding "
                                          "one of those");
        return false;
    }
    const cJSON *first = p->child;
    if (cJSON_IsNumber(first)) return parse_ids(p, "prompt", r, err);
    if (first->next) {
        ds_api_errorf(err, 400, "prompt", "'prompt' holds %d prompts; this server takes one prompt a request",
                      cJSON_GetArraySize(p));
        return false;
    }
    if (cJSON_IsString(first)) {
        if (!(r->prompt = dup_str(first->valuestring))) return oom(err);
        return true;
    }
    if (cJSON_IsArray(first) && first->child) return parse_ids(first, "prompt[0]", r, err);
    ds_api_errorf(err, 400, "prompt[0]", "'prompt[0]' must be a string or a non-empty array of token ids");
    return false;
}

/* A message's content: a string, or an array of {"type": "text", "text"}
 * parts, joined (OpenAI's content parts; images etc. are refused). */
static bool content_text(const cJSON *c, const char *param, char **out, ds_api_error *err) {
    if (cJSON_IsString(c)) return (*out = dup_str(c->valuestring)) ? true : oom(err);
    if (!cJSON_IsArray(c)) {
        ds_api_errorf(err, 400, param, "'%s' must be a string or an array of text parts", param);
        return false;
    }
    size_t total = 0;
    int i = 0;
    for (const cJSON *part = c->child; part; part = part->next, i++) {
        const cJSON *type = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "type") : NULL;
        const cJSON *text = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "text") : NULL;
        if (!type || !cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            ds_api_errorf(err, 400, param, "'%s[%d]' must be {\"type\": \"text\", \"text\": STRING} (only text "
                          "content is supported)", param, i);
            return false;
        }
        total += strlen(text->valuestring);
    }
    if (!(*out = malloc(total + 1))) return oom(err);
    size_t at = 0;
    for (const cJSON *part = c->child; part; part = part->next) {
        const char *s = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t n = strlen(s);
        memcpy(*out + at, s, n);
        at += n;
    }
    (*out)[at] = 0;
    return true;
}

static bool parse_messages(const cJSON *root, ds_serve_request *r, ds_api_error *err) {
    const cJSON *m = field(root, "messages");
    if (!m || !cJSON_IsArray(m) || !m->child) {
        ds_api_errorf(err, 400, "messages", "'messages' must be a non-empty array of {\"role\", \"content\"}");
        return false;
    }
    int n = cJSON_GetArraySize(m);
    if (n > DS_REQ_MAX_MESSAGES) {
        ds_api_errorf(err, 400, "messages", "'messages' holds %d messages; at most %d are allowed", n,
                      DS_REQ_MAX_MESSAGES);
        return false;
    }
    if (!(r->messages = calloc((size_t)n, sizeof *r->messages))) return oom(err);
    int i = 0;
    for (const cJSON *msg = m->child; msg; msg = msg->next, i++) {
        char param[48];
        if (!cJSON_IsObject(msg)) {
            snprintf(param, sizeof param, "messages[%d]", i);
            ds_api_errorf(err, 400, param, "'%s' must be an object {\"role\", \"content\"}", param);
            return false;
        }
        snprintf(param, sizeof param, "messages[%d].role", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsString(role)) {
            ds_api_errorf(err, 400, param, "'%s' must be a string", param);
            return false;
        }
        const char *rs = role->valuestring;
        /* OpenAI's "developer" role is the system role of older models. */
        if (!strcmp(rs, "developer")) rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant")) {
            ds_api_errorf(err, 400, param, "'%s' must be system, developer, user or assistant, got '%.40s'", param,
                          role->valuestring);
            return false;
        }
        r->n_messages = (size_t)i + 1; /* from here on, message i's strings are ours to free */
        if (!(r->messages[i].role = dup_str(rs))) return oom(err);
        snprintf(param, sizeof param, "messages[%d].content", i);
        const cJSON *content = field(msg, "content");
        if (!content) {
            ds_api_errorf(err, 400, param, "'%s' is required", param);
            return false;
        }
        char *text;
        if (!content_text(content, param, &text, err)) return false;
        r->messages[i].content = text;
    }
    return true;
}

static bool parse_root(ds_req_kind kind, const cJSON *root, ds_serve_request *r, ds_api_error *err) {
    r->kind = kind;
    r->top_p = 1.0f;
    const cJSON *v;
    if ((v = field(root, "model"))) {
        if (!cJSON_IsString(v) || strlen(v->valuestring) > DS_REQ_MAX_MODEL_BYTES) {
            ds_api_errorf(err, 400, "model", "'model' must be a string of at most %d bytes", DS_REQ_MAX_MODEL_BYTES);
            return false;
        }
        if (!(r->model = dup_str(v->valuestring))) return oom(err);
    }
    if (kind == DS_REQ_COMPLETION ? !parse_prompt(root, r, err) : !parse_messages(root, r, err)) return false;
    long long i;
    const char *max_name = "max_tokens";
    v = field(root, max_name);
    if (kind == DS_REQ_CHAT && field(root, "max_completion_tokens")) v = field(root, max_name = "max_completion_tokens");
    if (v) {
        if (!get_int(v, max_name, 1, DS_REQ_MAX_TOKENS_CAP, &i, err)) return false;
        r->max_tokens = (int)i;
        r->max_tokens_given = true;
    }
    if ((v = field(root, "temperature"))) {
        if (!get_float(v, "temperature", &r->temperature, err)) return false;
        if (!(r->temperature >= 0)) {
            ds_api_errorf(err, 400, "temperature", "'temperature' must be >= 0, got %g", v->valuedouble);
            return false;
        }
    }
    if ((v = field(root, "top_p"))) {
        if (!get_float(v, "top_p", &r->top_p, err)) return false;
        if (!(r->top_p > 0 && r->top_p <= 1)) {
            ds_api_errorf(err, 400, "top_p", "'top_p' must be in (0, 1], got %g", v->valuedouble);
            return false;
        }
    }
    if ((v = field(root, "top_k"))) {
        if (!get_int(v, "top_k", -1, 2147483647.0, &i, err)) return false;
        r->top_k = i < 0 ? 0 : (int)i; /* vLLM's -1: off, which 0 is here */
    }
    if ((v = field(root, "seed"))) {
        /* OpenAI's seed is a signed 64-bit integer: negative ones wrap. */
        /* 2^63 - 1024: the largest double below 2^63, so the cast is defined. */
        if (!get_int(v, "seed", -9223372036854775808.0, 9223372036854774784.0, &i, err)) return false;
        r->seed = (uint64_t)i;
    }
    if ((v = field(root, "n"))) {
        if (!get_int(v, "n", 1, 1, &i, err)) {
            ds_api_errorf(err, 400, "n", "'n' must be 1: one choice a request");
            return false;
        }
    }
    if ((v = field(root, "stream")) && !get_bool(v, "stream", &r->stream, err)) return false;
    if ((v = field(root, "stream_options"))) {
        if (!cJSON_IsObject(v)) {
            ds_api_errorf(err, 400, "stream_options", "'stream_options' must be an object");
            return false;
        }
        const cJSON *u = field(v, "include_usage");
        if (u && !get_bool(u, "stream_options.include_usage", &r->include_usage, err)) return false;
    }
    if ((v = field(root, "ignore_eos")) && !get_bool(v, "ignore_eos", &r->ignore_eos, err)) return false;
    if ((v = field(root, "return_token_ids")) && !get_bool(v, "return_token_ids", &r->return_token_ids, err))
        return false;
    static const char *const refused[] = {"best_of", "logprobs", "top_logprobs", "echo", "suffix",
                                          "presence_penalty", "frequency_penalty", "repetition_penalty",
                                          "logit_bias", "min_tokens", "tools", "response_format"};
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++)
        if (!refuse_unless_noop(root, refused[k], err)) return false;
    return parse_stop(root, r, err);
}

bool ds_serve_request_parse(ds_req_kind kind, const char *body, size_t len, ds_serve_request *out,
                            ds_api_error *err) {
    *out = (ds_serve_request){0};
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        ds_api_errorf(err, 400, NULL, "the body is not valid JSON (error near byte %zu of %zu)", at, len);
        return false;
    }
    /* Only whitespace may follow the object. */
    for (const char *p = end; p && p < body + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
            ds_api_errorf(err, 400, NULL, "the body holds more than one JSON value (extra data at byte %zu)",
                          (size_t)(p - body));
            cJSON_Delete(root);
            return false;
        }
    }
    bool ok;
    if (!cJSON_IsObject(root)) {
        ds_api_errorf(err, 400, NULL, "the body must be a JSON object");
        ok = false;
    } else {
        ok = parse_root(kind, root, out, err);
    }
    cJSON_Delete(root);
    if (!ok) ds_serve_request_free(out);
    return ok;
}

void ds_serve_request_free(ds_serve_request *r) {
    free(r->model);
    free(r->prompt);
    free(r->prompt_ids);
    for (size_t i = 0; i < r->n_messages; i++) {
        free((char *)r->messages[i].role);
        free((char *)r->messages[i].content);
    }
    free(r->messages);
    for (size_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    *r = (ds_serve_request){0};
}
