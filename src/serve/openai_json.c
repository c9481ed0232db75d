#include "serve/openai_json.h"

#include <stdio.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if it is not one
 * (overlongs, surrogates and code points past U+10FFFF included). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07;
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return len;
}

void ds_json_string(ds_sbuf *out, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    ds_sbuf_append(out, "\"", 1);
    size_t run = 0; /* bytes copied as they are, written in one go */
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        const char *esc = NULL;
        char hex[8];
        size_t len = 1;
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20 || c == 0x7F) snprintf(hex, sizeof hex, "\\u%04x", c), esc = hex;
        else if (c >= 0x80 && !(len = utf8_seq(u + i, n - i))) esc = "\\ufffd", len = 1;
        if (esc) {
            ds_sbuf_append(out, s + i - run, run);
            run = 0;
            ds_sbuf_puts(out, esc);
        } else {
            run += len;
        }
        i += len;
    }
    ds_sbuf_append(out, s + n - run, run);
    ds_sbuf_append(out, "\"", 1);
}

static void str_or_null(ds_sbuf *out, const char *s) {
    if (s && *s) ds_json_string(out, s, strlen(s));
    else ds_sbuf_puts(out, "null");
}

void ds_oai_error(ds_sbuf *out, const ds_api_error *e) {
    ds_sbuf_puts(out, "{\"error\":{\"message\":");
    ds_json_string(out, e->message, strlen(e->message));
    ds_sbuf_puts(out, ",\"type\":");
    str_or_null(out, e->type);
    ds_sbuf_puts(out, ",\"param\":");
    str_or_null(out, e->param);
    ds_sbuf_puts(out, ",\"code\":");
    if (e->code) str_or_null(out, e->code);
    else ds_sbuf_printf(out, "%d", e->status); /* vLLM writes the status here */
    ds_sbuf_puts(out, "}}");
}

static void head(ds_sbuf *out, const ds_oai_out *o, const char *object) {
    ds_sbuf_puts(out, "{\"id\":");
    ds_json_string(out, o->id, strlen(o->id));
    ds_sbuf_printf(out, ",\"object\":\"%s\",\"created\":%lld,\"model\":", object, o->created);
    ds_json_string(out, o->model, strlen(o->model));
}

static void usage(ds_sbuf *out, const ds_oai_out *o) {
    ds_sbuf_printf(out, ",\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}",
                   o->prompt_tokens, o->completion_tokens, o->prompt_tokens + o->completion_tokens);
}

static void ids(ds_sbuf *out, const ds_oai_out *o) {
    if (!o->ids) return;
    ds_sbuf_puts(out, ",\"token_ids\":[");
    for (size_t i = 0; i < o->n_ids; i++) ds_sbuf_printf(out, i ? ",%d" : "%d", (int)o->ids[i]);
    ds_sbuf_puts(out, "]");
}

static void finish(ds_sbuf *out, const ds_oai_out *o) {
    ds_sbuf_puts(out, ",\"finish_reason\":");
    str_or_null(out, o->finish_reason);
}

void ds_oai_response(ds_sbuf *out, const ds_oai_out *o) {
    const bool chat = o->kind == DS_REQ_CHAT;
    head(out, o, chat ? "chat.completion" : "text_completion");
    ds_sbuf_puts(out, ",\"choices\":[{\"index\":0,");
    if (chat) {
        ds_sbuf_puts(out, "\"message\":{\"role\":\"assistant\",\"content\":");
        ds_json_string(out, o->text, o->text_len);
        ds_sbuf_puts(out, "}");
    } else {
        ds_sbuf_puts(out, "\"text\":");
        ds_json_string(out, o->text, o->text_len);
    }
    ds_sbuf_puts(out, ",\"logprobs\":null");
    finish(out, o);
    ids(out, o);
    ds_sbuf_puts(out, "}]");
    usage(out, o);
    ds_sbuf_puts(out, "}");
}

void ds_oai_chunk(ds_sbuf *out, const ds_oai_out *o) {
    const bool chat = o->kind == DS_REQ_CHAT;
    head(out, o, chat ? "chat.completion.chunk" : "text_completion");
    ds_sbuf_puts(out, ",\"choices\":[{\"index\":0,");
    if (chat) {
        ds_sbuf_puts(out, "\"delta\":{");
        if (o->first) ds_sbuf_puts(out, "\"role\":\"assistant\",\"content\":\"\"");
        else if (o->text_len || !o->finish_reason) {
            ds_sbuf_puts(out, "\"content\":");
            ds_json_string(out, o->text, o->text_len);
        }
        ds_sbuf_puts(out, "}");
    } else {
        ds_sbuf_puts(out, "\"text\":");
        ds_json_string(out, o->text, o->text_len);
    }
    ds_sbuf_puts(out, ",\"logprobs\":null");
    finish(out, o);
    ids(out, o);
    ds_sbuf_puts(out, "}]");
    if (o->usage) usage(out, o);
    ds_sbuf_puts(out, "}");
}

void ds_oai_usage_chunk(ds_sbuf *out, const ds_oai_out *o) {
    head(out, o, o->kind == DS_REQ_CHAT ? "chat.completion.chunk" : "text_completion");
    ds_sbuf_puts(out, ",\"choices\":[]");
    usage(out, o);
    ds_sbuf_puts(out, "}");
}

void ds_oai_models(ds_sbuf *out, const char *model, long long created, int max_model_len) {
    ds_sbuf_puts(out, "{\"object\":\"list\",\"data\":[{\"id\":");
    ds_json_string(out, model, strlen(model));
    ds_sbuf_printf(out, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"dspark\",\"root\":", created);
    ds_json_string(out, model, strlen(model));
    ds_sbuf_printf(out, ",\"max_model_len\":%d}]}", max_model_len);
}
