/* Which chat template family a model directory uses: find the template
 * text where transformers finds it, then recognise it by signature
 * strings. Anything not recognised is an error naming the model, never a
 * guess: a prompt in the wrong format still "works" and silently degrades
 * both the output and the drafter's acceptance. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "tokenizer/chat_template.h"

#define SUPPORTED                                                                                          \
    "supported: Qwen3 ChatML (<|im_start|> with enable_thinking), Gemma 3 (<start_of_turn>), Gemma 4 (<|turn>" \
    " with an empty thought channel in the generation prompt)"

ds_error *ds_chat_detect_template(const char *t, const char *where, ds_chat_family *out) {
    *out = DS_CHAT_UNKNOWN;
    if (strstr(t, "<|turn>")) {
        /* The 12B/26B/31B templates close an empty thought channel when
         * thinking is off; E2B/E4B's open the model turn bare. The literal
         * is a Jinja string, so its newline is written as backslash-n. */
        if (!strstr(t, "<|channel>thought\\n<channel|>") && !strstr(t, "<|channel>thought\n<channel|>"))
            return ds_errorf("%s: a Gemma 4 template whose generation prompt has no empty thought channel "
                             "(like gemma-4-E2B-it/E4B-it) is not rendered by dspark; " SUPPORTED,
                             where);
        *out = DS_CHAT_GEMMA4;
    } else if (strstr(t, "<start_of_turn>")) {
        *out = DS_CHAT_GEMMA3;
    } else if (strstr(t, "<|im_start|>")) {
        /* Plain ChatML (Qwen2.5, Qwen3-*-Instruct-2507) has no thinking
         * switch: rendering it with Qwen3's empty think block would be a
         * prompt the model never saw. */
        if (!strstr(t, "enable_thinking") || !strstr(t, "<think>"))
            return ds_errorf("%s: a ChatML template without Qwen3's enable_thinking switch is not rendered by "
                             "dspark; " SUPPORTED,
                             where);
        *out = DS_CHAT_CHATML_QWEN3;
    } else {
        return ds_errorf("%s: chat template not recognised; " SUPPORTED, where);
    }
    return NULL;
}

/* The template text of a JSON file's "chat_template" field: a string, or
 * (tokenizer_config.json of multi-template models) a list of
 * {"name", "template"} of which transformers uses "default" when no tools
 * are passed. *text stays NULL when the field is absent or null. */
static ds_error *template_from_json(const char *path, char **text) {
    cJSON *root;
    DS_TRY(ds_read_json(path, &root));
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    ds_error *e = NULL;
    const char *s = NULL;
    if (cJSON_IsString(ct)) {
        s = ct->valuestring;
    } else if (cJSON_IsArray(ct)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, ct) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(it, "template");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") && cJSON_IsString(tmpl))
                s = tmpl->valuestring;
        }
        if (!s) e = ds_errorf("%s: chat_template lists named templates but none is \"default\" with a string template",
                              path);
    } else if (ct && !cJSON_IsNull(ct)) {
        e = ds_errorf("%s: chat_template is neither a string nor a list of named templates", path);
    }
    if (!e && s && !(*text = strdup(s))) e = ds_errorf("%s: out of memory", path);
    cJSON_Delete(root);
    return e;
}

/* Finds the template as transformers does: chat_template.jinja overrides
 * tokenizer_config.json's copy (the two can differ in one download); the
 * processor's chat_template.json is the legacy last resort. */
static ds_error *load_template(const char *dir, char **text, char **source) {
    static const char *const files[] = {"chat_template.jinja", "tokenizer_config.json", "chat_template.json"};
    *text = *source = NULL;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *path = ds_path_join(dir, files[i]);
        if (!path) return ds_errorf("%s: out of memory", dir);
        ds_error *e = NULL;
        if (ds_path_exists(path)) {
            size_t len;
            e = i == 0 ? ds_read_file(path, text, &len) : template_from_json(path, text);
        }
        if (e || *text) {
            if (e) free(path);
            else *source = path;
            return e;
        }
        free(path);
    }
    return NULL;
}

/* config.json's model_type, to name the model in errors; "(no
 * config.json)" etc. when there is none to read. */
static void model_type(const char *dir, char *out, size_t cap) {
    snprintf(out, cap, "(no config.json)");
    char *path = ds_path_join(dir, "config.json");
    cJSON *cfg = NULL;
    ds_error *e = path && ds_path_exists(path) ? ds_read_json(path, &cfg) : NULL;
    if (e) {
        snprintf(out, cap, "(unreadable config.json)");
        ds_error_free(e);
    } else if (cfg) {
        const char *mt = ds_cfg_str(cfg, "model_type");
        if (mt) snprintf(out, cap, "\"%s\"", mt);
        else snprintf(out, cap, "(none)");
        cJSON_Delete(cfg);
    }
    free(path);
}

ds_error *ds_chat_detect(const char *model_dir, ds_chat_family *out) {
    *out = DS_CHAT_UNKNOWN;
    char mt[128];
    char *text, *source;
    ds_error *e = load_template(model_dir, &text, &source);
    if (e) return ds_error_wrap(e, "chat template of %s", model_dir);
    if (!text) {
        model_type(model_dir, mt, sizeof mt);
        return ds_errorf("%s (model_type %s): no chat template (no chat_template.jinja, no chat_template in "
                         "tokenizer_config.json or chat_template.json); " SUPPORTED,
                         model_dir, mt);
    }
    e = ds_chat_detect_template(text, source, out);
    if (e) {
        model_type(model_dir, mt, sizeof mt);
        e = ds_error_wrap(e, "%s (model_type %s)", model_dir, mt);
    }
    free(text);
    free(source);
    return e;
}
