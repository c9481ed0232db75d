/* JSON Lines prompts: each line's shape is checked here, once, so the
 * generation loop only ever sees ids that are integers, messages that have
 * roles and contents, and errors that point at file:line and the field. */
#include "io/prompt_file.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"

static ds_error *parse_ids(const cJSON *arr, ds_prompt *p) {
    if (!cJSON_IsArray(arr)) return ds_errorf("input_ids is not a list");
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n == 0) return ds_errorf("input_ids is empty");
    if (!(p->ids = malloc(n * sizeof *p->ids))) return ds_errorf("input_ids: out of memory (%zu ids)", n);
    size_t i = 0;
    for (const cJSON *v = arr->child; v; v = v->next, i++) {
        if (!cJSON_IsNumber(v)) return ds_errorf("input_ids[%zu] is not a number", i);
        double d = v->valuedouble;
        /* A fraction or a float past int32 would be truncated into some other
         * token: refuse it rather than generate from the wrong prompt. */
        if (!isfinite(d) || d != floor(d) || d < 0 || d > 2147483647.0)
            return ds_errorf("input_ids[%zu] = %.17g is not an integer token id >= 0", i, d);
        p->ids[i] = (int32_t)d;
    }
    p->n_ids = n;
    p->kind = DS_PROMPT_IDS;
    return NULL;
}


static ds_error *parse_messages(const cJSON *arr, ds_prompt *p) {
    if (!cJSON_IsArray(arr)) return ds_errorf("messages is not a list");
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n == 0) return ds_errorf("messages is empty");
    if (!(p->messages = calloc(n, sizeof *p->messages))) return ds_errorf("messages: out of memory");
    p->kind = DS_PROMPT_MESSAGES;
    for (const cJSON *m = arr->child; m; m = m->next, p->n_messages++) {
        size_t i = p->n_messages;
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content))
            return ds_errorf("messages[%zu] needs \"role\" and \"content\" strings", i);
        p->messages[i].role = strdup(role->valuestring);
        p->messages[i].content = strdup(content->valuestring);
        if (!p->messages[i].role || !p->messages[i].content) {
            p->n_messages++; /* so ds_prompt_free releases the one that was made */
            return ds_errorf("messages[%zu]: out of memory", i);
        }
    }
    return NULL;
}

static ds_error *parse_object(const cJSON *obj, ds_prompt *p) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(obj, "id");
    if (id && !(p->id = cJSON_Duplicate(id, 1))) return ds_errorf("id: out of memory");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(obj, "input_ids");
    if (ids) return parse_ids(ids, p);
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(obj, "messages");
    if (msgs) return parse_messages(msgs, p);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(obj, "prompt");
    if (!text) return ds_errorf("line has no \"prompt\" string, \"messages\" or \"input_ids\"");
    if (!cJSON_IsString(text)) return ds_errorf("prompt is not a string");
    if (!(p->text = strdup(text->valuestring))) return ds_errorf("prompt: out of memory");
    p->kind = DS_PROMPT_TEXT;
    return NULL;
}

static bool blank(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (!strchr(" \t\r\n", s[i]) || !s[i]) return false;
    return true;
}

ds_error *ds_prompt_parse_line(const char *line, size_t len, ds_prompt *out) {
    *out = (ds_prompt){0};
    const char *end = NULL;
    cJSON *obj = cJSON_ParseWithLengthOpts(line, len, &end, false);
    ds_error *e = NULL;
    if (!obj) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= line && at <= line + len ? (long)(at - line) : -1;
        e = ds_errorf("not a JSON object (invalid JSON near byte %ld)", off);
    } else if (!cJSON_IsObject(obj)) {
        e = ds_errorf("not a JSON object");
    } else if (end && end < line + len && !blank(end, (size_t)(line + len - end))) {
        e = ds_errorf("text after the JSON object (at byte %ld)", (long)(end - line));
    } else {
        e = parse_object(obj, out);
    }
    cJSON_Delete(obj);
    if (e) ds_prompt_free(out);
    return e;
}

ds_error *ds_prompt_file_parse(const char *name, const char *buf, size_t len, ds_prompt_list *out) {
    *out = (ds_prompt_list){0};
    size_t cap = 0;
    int lineno = 0;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(buf + at, '\n', len - at);
        size_t n = nl ? (size_t)(nl - (buf + at)) : len - at;
        const char *line = buf + at;
        at += n + (nl != NULL);
        lineno++;
        if (blank(line, n)) continue;
        if (out->n == cap) {
            cap = cap ? 2 * cap : 16;
            ds_prompt *grown = realloc(out->items, cap * sizeof *grown);
            if (!grown) {
                ds_prompt_list_free(out);
                return ds_errorf("%s:%d: out of memory", name, lineno);
            }
            out->items = grown;
        }
        ds_error *e = ds_prompt_parse_line(line, n, &out->items[out->n]);
        if (e) {
            ds_prompt_list_free(out);
            return ds_error_wrap(e, "%s:%d", name, lineno);
        }
        out->items[out->n++].line = lineno;
    }
    if (out->n == 0) return ds_errorf("%s: no prompts (every line is blank)", name);
    return NULL;
}

ds_error *ds_prompt_file_read(const char *path, ds_prompt_list *out) {
    *out = (ds_prompt_list){0};
    bool from_stdin = !strcmp(path, "-");
    const char *name = from_stdin ? "<stdin>" : path;
    char *buf;
    size_t len = 0;
    DS_TRY(from_stdin ? ds_read_stream(stdin, name, &buf, &len) : ds_read_file(path, &buf, &len));
    ds_error *e = ds_prompt_file_parse(name, buf, len, out);
    free(buf);
    return e;
}

void ds_prompt_free(ds_prompt *p) {
    if (!p) return;
    free(p->text);
    free(p->ids);
    for (size_t i = 0; i < p->n_messages; i++) {
        free((char *)p->messages[i].role);
        free((char *)p->messages[i].content);
    }
    free(p->messages);
    cJSON_Delete(p->id);
    *p = (ds_prompt){0};
}

void ds_prompt_list_free(ds_prompt_list *l) {
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) ds_prompt_free(&l->items[i]);
    free(l->items);
    *l = (ds_prompt_list){0};
}
