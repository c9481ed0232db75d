#include "tokenizer/normalize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/pattern.h"
#include "tokenizer/utf8.h"

typedef enum { N_NFC, N_NFD, N_NFKC, N_NFKD, N_LOWERCASE, N_STRIP, N_REPLACE, N_PREPEND } norm_kind;

typedef struct {
    norm_kind kind;
    ds_pattern pat;   /* Replace */
    char *content;    /* Replace: replacement; Prepend: prefix */
    size_t content_len;
    bool left, right; /* Strip */
} norm_step;

struct ds_normalizer {
    norm_step *steps;
    size_t n, cap;
};

static ds_error *add_step(ds_normalizer *nm, norm_step st) {
    if (nm->n == nm->cap) {
        size_t cap = nm->cap ? nm->cap * 2 : 4;
        norm_step *v = realloc(nm->steps, cap * sizeof *v);
        if (!v) return ds_errorf("out of memory");
        nm->steps = v;
        nm->cap = cap;
    }
    nm->steps[nm->n++] = st;
    return NULL;
}

static ds_error *parse_into(ds_normalizer *nm, const cJSON *j, const char *where, int depth) {
    if (depth > 16) return ds_errorf("%s: Sequence nested too deeply", where);
    const char *type;
    if (!cJSON_IsObject(j)) return ds_errorf("%s should be an object, is %s", where, ds_json_kind(j));
    DS_TRY(ds_json_str(j, "type", where, &type));
    norm_step st = {0};
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = ds_json_get(j, "normalizers");
        if (!cJSON_IsArray(list))
            return ds_errorf("%s.normalizers should be an array, is %s", where, ds_json_kind(list));
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            char w[256];
            snprintf(w, sizeof w, "%s.normalizers[%d]", where, i);
            DS_TRY(parse_into(nm, c, w, depth + 1));
        }
        return NULL;
    }
    if (!strcmp(type, "NFC")) st.kind = N_NFC;
    else if (!strcmp(type, "NFD")) st.kind = N_NFD;
    else if (!strcmp(type, "NFKC")) st.kind = N_NFKC;
    else if (!strcmp(type, "NFKD")) st.kind = N_NFKD;
    else if (!strcmp(type, "Lowercase")) st.kind = N_LOWERCASE;
    else if (!strcmp(type, "Strip")) {
        st.kind = N_STRIP;
        DS_TRY(ds_json_bool(j, "strip_left", where, true, &st.left));
        DS_TRY(ds_json_bool(j, "strip_right", where, true, &st.right));
    } else if (!strcmp(type, "Prepend")) {
        const char *p;
        st.kind = N_PREPEND;
        DS_TRY(ds_json_str(j, "prepend", where, &p));
        DS_TRY(ds_step_content_copy(p, &st.content, &st.content_len));
    } else if (!strcmp(type, "Replace")) {
        st.kind = N_REPLACE;
        DS_TRY(ds_replace_parse(j, where, &st.pat, &st.content, &st.content_len));
    } else {
        return ds_errorf("%s.type \"%s\" is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, "
                         "Prepend, Sequence)", where, type);
    }
    ds_error *e = add_step(nm, st);
    if (e) {
        free(st.content);
        ds_pattern_free(&st.pat);
    }
    return e;
}

ds_error *ds_normalizer_parse(const cJSON *j, ds_normalizer **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return NULL;
    ds_normalizer *nm = calloc(1, sizeof *nm);
    if (!nm) return ds_errorf("out of memory");
    ds_error *e = parse_into(nm, j, "normalizer", 0);
    if (e) {
        ds_normalizer_free(nm);
        return e;
    }
    *out = nm;
    return NULL;
}

void ds_normalizer_free(ds_normalizer *nm) {
    if (!nm) return;
    for (size_t i = 0; i < nm->n; i++) {
        free(nm->steps[i].content);
        ds_pattern_free(&nm->steps[i].pat);
    }
    free(nm->steps);
    free(nm);
}

static bool all_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

static ds_error *unicode_form(norm_kind k, const char *s, size_t n, ds_buf *out) {
    /* ASCII is invariant under every normalization form. */
    if (all_ascii(s, n)) {
        ds_buf_append(out, s, n);
        return NULL;
    }
    int opt = UTF8PROC_STABLE;
    opt |= k == N_NFC ? UTF8PROC_COMPOSE
         : k == N_NFD ? UTF8PROC_DECOMPOSE
         : k == N_NFKC ? (UTF8PROC_COMPOSE | UTF8PROC_COMPAT)
                       : (UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &res, (utf8proc_option_t)opt);
    if (r < 0) return ds_errorf("Unicode normalization failed: %s", utf8proc_errmsg(r));
    ds_buf_append(out, res, (size_t)r);
    free(res);
    return NULL;
}

static void lowercase(const char *s, size_t n, ds_buf *out) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)ds_utf8_next(s + i, &cp);
        /* Rust's char::to_lowercase: U+0130 is the one unconditional
         * one-to-many mapping; the rest are simple mappings. */
        if (cp == 0x130) {
            ds_buf_append(out, "i\xCC\x87", 3);
        } else {
            ds_buf_put_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
        }
    }
}

static void strip(const char *s, size_t n, bool left, bool right, ds_buf *out) {
    size_t a = 0, b = n;
    while (left && a < b) {
        uint32_t cp;
        int k = ds_utf8_next(s + a, &cp);
        if (!ds_is_white_space(cp)) break;
        a += (size_t)k;
    }
    while (right && b > a) {
        size_t p = b - 1;
        while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
        uint32_t cp;
        ds_utf8_next(s + p, &cp);
        if (!ds_is_white_space(cp)) break;
        b = p;
    }
    ds_buf_append(out, s + a, b - a);
}

ds_error *ds_normalizer_apply(const ds_normalizer *nm, const char *s, size_t n, ds_buf *out, ds_buf *tmp,
                              ds_regex_scratch **rs) {
    ds_buf_clear(out);
    size_t steps = nm ? nm->n : 0;
    if (!steps) {
        ds_buf_append(out, s, n);
        return out->failed ? ds_errorf("out of memory") : NULL;
    }
    /* Ping-pong between the two buffers so that the last step lands in out. */
    const char *cur = s;
    size_t cur_n = n;
    for (size_t i = 0; i < steps; i++) {
        ds_buf *dst = ((steps - 1 - i) % 2 == 0) ? out : tmp;
        ds_buf_clear(dst);
        const norm_step *st = &nm->steps[i];
        switch (st->kind) {
        case N_NFC: case N_NFD: case N_NFKC: case N_NFKD:
            DS_TRY(unicode_form(st->kind, cur, cur_n, dst));
            break;
        case N_LOWERCASE:
            lowercase(cur, cur_n, dst);
            break;
        case N_STRIP:
            strip(cur, cur_n, st->left, st->right, dst);
            break;
        case N_REPLACE:
            DS_TRY(ds_pattern_replace_all(&st->pat, cur, cur_n, st->content, st->content_len, rs, dst));
            break;
        case N_PREPEND:
            if (cur_n) ds_buf_append(dst, st->content, st->content_len);
            ds_buf_append(dst, cur, cur_n);
            break;
        }
        if (!ds_buf_reserve(dst, 0)) return ds_errorf("out of memory while normalizing");
        cur = dst->data;
        cur_n = dst->len;
    }
    return NULL;
}
