#include "tokenizer/pattern.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/utf8.h"

ds_error *ds_pattern_parse(const cJSON *j, const char *where, ds_pattern *out) {
    memset(out, 0, sizeof *out);
    const char *lit = NULL, *re = NULL;
    if (!cJSON_IsObject(j))
        return ds_errorf("%s should be {\"String\": ...} or {\"Regex\": ...}, is %s", where, ds_json_kind(j));
    DS_TRY(ds_json_str_opt(j, "String", where, &lit));
    DS_TRY(ds_json_str_opt(j, "Regex", where, &re));
    if (lit) {
        size_t n = strlen(lit);
        out->lit = malloc(n + 1);
        if (!out->lit) return ds_errorf("%s: out of memory", where);
        memcpy(out->lit, lit, n + 1);
        out->lit_len = n;
        return NULL;
    }
    if (re) {
        char w[256];
        snprintf(w, sizeof w, "%s.Regex", where);
        return ds_regex_compile(re, strlen(re), w, &out->re);
    }
    return ds_errorf("%s should have a \"String\" or \"Regex\" field", where);
}

ds_error *ds_pattern_regex(const char *re, const char *where, ds_pattern *out) {
    memset(out, 0, sizeof *out);
    return ds_regex_compile(re, strlen(re), where, &out->re);
}

void ds_pattern_free(ds_pattern *p) {
    free(p->lit);
    ds_regex_free(p->re);
    memset(p, 0, sizeof *p);
}

static bool push_range(ds_ranges *r, size_t a, size_t b) {
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        ds_range *v = realloc(r->v, cap * sizeof *v);
        if (!v) return false;
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n++] = (ds_range){a, b};
    return true;
}

void ds_ranges_free(ds_ranges *r) {
    free(r->v);
    memset(r, 0, sizeof *r);
}

ds_error *ds_pattern_find_all(const ds_pattern *p, const char *s, size_t n, ds_regex_scratch **rs, ds_ranges *out) {
    out->n = 0;
    if (!p->re) {
        /* An empty literal matches nowhere useful; treat it as no match
         * rather than looping. */
        if (!p->lit_len) return NULL;
        size_t i = 0;
        while (i + p->lit_len <= n) {
            const char *hit = memmem(s + i, n - i, p->lit, p->lit_len);
            if (!hit) break;
            size_t a = (size_t)(hit - s);
            if (!push_range(out, a, a + p->lit_len)) return ds_errorf("out of memory");
            i = a + p->lit_len;
        }
        return NULL;
    }
    size_t i = 0;
    while (i <= n) {
        bool found;
        size_t a, b;
        DS_TRY(ds_regex_find(p->re, rs, s, n, i, &found, &a, &b));
        if (!found) break;
        if (!push_range(out, a, b)) return ds_errorf("out of memory");
        if (b > a) {
            i = b;
        } else { /* empty match: resume one character further */
            if (a >= n) break;
            i = a + (size_t)ds_utf8_len((unsigned char)s[a]);
        }
    }
    return NULL;
}

ds_error *ds_pattern_replace_all(const ds_pattern *p, const char *s, size_t n, const char *rep, size_t rep_len,
                                 ds_regex_scratch **rs, ds_buf *out) {
    ds_ranges r = {0};
    ds_error *e = ds_pattern_find_all(p, s, n, rs, &r);
    if (e) {
        ds_ranges_free(&r);
        return e;
    }
    size_t prev = 0;
    for (size_t k = 0; k < r.n; k++) {
        ds_buf_append(out, s + prev, r.v[k].start - prev);
        ds_buf_append(out, rep, rep_len);
        prev = r.v[k].end;
    }
    ds_buf_append(out, s + prev, n - prev);
    ds_ranges_free(&r);
    return out->failed ? ds_errorf("out of memory") : NULL;
}
