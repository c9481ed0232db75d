#include "tokenizer/postprocess.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/json_util.h"

/* Every supported processor reduces, for a single sequence, to
 * "prefix ids + the sequence + suffix ids"; a Sequence of processors
 * composes by nesting. */
typedef struct {
    ds_ids prefix, suffix;
} pp_step;

struct ds_postproc {
    pp_step *steps;
    size_t n, cap;
};

static ds_error *add_step(ds_postproc *pp, pp_step st) {
    if (pp->n == pp->cap) {
        size_t cap = pp->cap ? pp->cap * 2 : 2;
        pp_step *v = realloc(pp->steps, cap * sizeof *v);
        if (!v) {
            ds_ids_free(&st.prefix);
            ds_ids_free(&st.suffix);
            return ds_errorf("out of memory");
        }
        pp->steps = v;
        pp->cap = cap;
    }
    pp->steps[pp->n++] = st;
    return NULL;
}

/* TemplateProcessing "single": [{"SpecialToken": {"id": name}}, {"Sequence": {"id": "A"}}, ...];
 * each special token's ids come from "special_tokens"[name].ids. */
static ds_error *parse_template(const cJSON *j, const char *where, long long max_id, pp_step *st) {
    const cJSON *single = ds_json_get(j, "single"), *specials = ds_json_get(j, "special_tokens");
    char w[256];
    if (!cJSON_IsArray(single)) return ds_errorf("%s.single should be an array, is %s", where, ds_json_kind(single));
    bool seen_seq = false;
    int i = 0;
    for (const cJSON *item = single->child; item; item = item->next, i++) {
        snprintf(w, sizeof w, "%s.single[%d]", where, i);
        const cJSON *sp = ds_json_get(item, "SpecialToken");
        if (ds_json_get(item, "Sequence")) {
            if (seen_seq) return ds_errorf("%s: a single template has one Sequence", w);
            seen_seq = true;
            continue;
        }
        if (!sp) return ds_errorf("%s should be {\"SpecialToken\": ...} or {\"Sequence\": ...}", w);
        const char *name;
        DS_TRY(ds_json_str(sp, "id", w, &name));
        const cJSON *def = ds_json_get(specials, name);
        const cJSON *ids = ds_json_get(def, "ids");
        if (!cJSON_IsArray(ids))
            return ds_errorf("%s: special token \"%s\" has no ids in %s.special_tokens", w, name, where);
        int k = 0;
        for (const cJSON *v = ids->child; v; v = v->next, k++) {
            long long id;
            char wid[300];
            snprintf(wid, sizeof wid, "%s.special_tokens[\"%.60s\"].ids[%d]", where, name, k);
            DS_TRY(ds_json_as_uint(v, wid, max_id, &id));
            if (!ds_ids_push(seen_seq ? &st->suffix : &st->prefix, (int32_t)id)) return ds_errorf("out of memory");
        }
    }
    if (!seen_seq) return ds_errorf("%s.single has no {\"Sequence\": ...} item", where);
    return NULL;
}

/* BertProcessing / RobertaProcessing: "cls": [token, id], "sep": [token, id] -> cls A sep. */
static ds_error *parse_cls_sep(const cJSON *j, const char *where, long long max_id, pp_step *st) {
    const char *keys[2] = {"cls", "sep"};
    for (int k = 0; k < 2; k++) {
        const cJSON *pair = ds_json_get(j, keys[k]);
        char w[256];
        snprintf(w, sizeof w, "%s.%s", where, keys[k]);
        if (cJSON_GetArraySize(pair) != 2) return ds_errorf("%s should be [token, id]", w);
        long long id;
        DS_TRY(ds_json_as_uint(pair->child->next, w, max_id, &id));
        if (!ds_ids_push(k == 0 ? &st->prefix : &st->suffix, (int32_t)id)) return ds_errorf("out of memory");
    }
    return NULL;
}

static ds_error *parse_into(ds_postproc *pp, const cJSON *j, const char *where, long long max_id, int depth) {
    if (depth > 16) return ds_errorf("%s: Sequence nested too deeply", where);
    if (!cJSON_IsObject(j)) return ds_errorf("%s should be an object, is %s", where, ds_json_kind(j));
    const char *type;
    DS_TRY(ds_json_str(j, "type", where, &type));
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = ds_json_get(j, "processors");
        if (!cJSON_IsArray(list))
            return ds_errorf("%s.processors should be an array, is %s", where, ds_json_kind(list));
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            char w[256];
            snprintf(w, sizeof w, "%s.processors[%d]", where, i);
            DS_TRY(parse_into(pp, c, w, max_id, depth + 1));
        }
        return NULL;
    }
    if (!strcmp(type, "ByteLevel")) return NULL; /* only trims offsets */
    pp_step st = {0};
    ds_error *e;
    if (!strcmp(type, "TemplateProcessing"))
        e = parse_template(j, where, max_id, &st);
    else if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing"))
        e = parse_cls_sep(j, where, max_id, &st);
    else
        e = ds_errorf("%s.type \"%s\" is not supported (TemplateProcessing, BertProcessing, RobertaProcessing, "
                      "ByteLevel, Sequence)", where, type);
    if (e) {
        ds_ids_free(&st.prefix);
        ds_ids_free(&st.suffix);
        return e;
    }
    return add_step(pp, st);
}

ds_error *ds_postproc_parse(const cJSON *j, long long max_id, ds_postproc **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return NULL;
    ds_postproc *pp = calloc(1, sizeof *pp);
    if (!pp) return ds_errorf("out of memory");
    ds_error *e = parse_into(pp, j, "post_processor", max_id, 0);
    if (e) {
        ds_postproc_free(pp);
        return e;
    }
    *out = pp;
    return NULL;
}

void ds_postproc_free(ds_postproc *pp) {
    if (!pp) return;
    for (size_t i = 0; i < pp->n; i++) {
        ds_ids_free(&pp->steps[i].prefix);
        ds_ids_free(&pp->steps[i].suffix);
    }
    free(pp->steps);
    free(pp);
}

ds_error *ds_postproc_apply(const ds_postproc *pp, ds_ids *ids) {
    if (!pp) return NULL;
    for (size_t k = 0; k < pp->n; k++) {
        const pp_step *st = &pp->steps[k];
        if (!st->prefix.n && !st->suffix.n) continue;
        ds_ids r = {0};
        ds_ids_append(&r, st->prefix.v, st->prefix.n);
        ds_ids_append(&r, ids->v, ids->n);
        ds_ids_append(&r, st->suffix.v, st->suffix.n);
        if (r.failed) {
            ds_ids_free(&r);
            return ds_errorf("out of memory");
        }
        ds_ids_free(ids);
        *ids = r;
    }
    return NULL;
}
