#include "tokenizer/pretokenize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_util.h"
#include "tokenizer/pattern.h"
#include "tokenizer/utf8.h"

typedef enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS } behavior;
typedef enum { P_SPLIT, P_BYTE_LEVEL, P_METASPACE } pt_kind;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_scheme;

/* The GPT-2 regex ByteLevel uses when use_regex is true. */
static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Rust's is_ascii_punctuation() || is_punctuation() (general category P). */
static const char PUNCT_RE[] = "[\\p{P}!-/:-@\\[-`{-~]";

typedef struct {
    pt_kind kind;
    ds_pattern pat; /* Split; ByteLevel with use_regex */
    behavior beh;
    bool invert;
    bool add_prefix_space; /* ByteLevel */
    char repl[8];          /* Metaspace replacement character */
    size_t repl_len;
    prepend_scheme prepend;
    bool split;
} pt_step;

struct ds_pretok {
    pt_step *steps;
    size_t n, cap;
};

static ds_error *add_step(ds_pretok *pt, pt_step st) {
    if (pt->n == pt->cap) {
        size_t cap = pt->cap ? pt->cap * 2 : 4;
        pt_step *v = realloc(pt->steps, cap * sizeof *v);
        if (!v) {
            ds_pattern_free(&st.pat);
            return ds_errorf("out of memory");
        }
        pt->steps = v;
        pt->cap = cap;
    }
    pt->steps[pt->n++] = st;
    return NULL;
}

static ds_error *add_regex_split(ds_pretok *pt, const char *re, behavior beh, bool invert, const char *where) {
    pt_step st = {.kind = P_SPLIT, .beh = beh, .invert = invert};
    DS_TRY(ds_pattern_regex(re, where, &st.pat));
    return add_step(pt, st);
}

static ds_error *parse_behavior(const cJSON *j, const char *where, behavior dflt, behavior *out) {
    const char *b;
    DS_TRY(ds_json_str_opt(j, "behavior", where, &b));
    *out = dflt;
    if (!b) return NULL;
    if (!strcmp(b, "Removed")) *out = B_REMOVED;
    else if (!strcmp(b, "Isolated")) *out = B_ISOLATED;
    else if (!strcmp(b, "MergedWithPrevious")) *out = B_MERGED_PREV;
    else if (!strcmp(b, "MergedWithNext")) *out = B_MERGED_NEXT;
    else if (!strcmp(b, "Contiguous")) *out = B_CONTIGUOUS;
    else
        return ds_errorf("%s.behavior \"%s\" is not one of Removed, Isolated, MergedWithPrevious, "
                         "MergedWithNext, Contiguous", where, b);
    return NULL;
}

static ds_error *parse_metaspace(const cJSON *j, const char *where, pt_step *st) {
    const char *repl, *scheme;
    bool add_prefix;
    st->kind = P_METASPACE;
    DS_TRY(ds_json_str_opt(j, "replacement", where, &repl));
    if (!repl) repl = "\xE2\x96\x81"; /* U+2581 */
    st->repl_len = strlen(repl);
    if (st->repl_len == 0 || st->repl_len > 4 || (size_t)ds_utf8_len((unsigned char)repl[0]) != st->repl_len)
        return ds_errorf("%s.replacement should be one character", where);
    memcpy(st->repl, repl, st->repl_len);
    DS_TRY(ds_json_bool(j, "add_prefix_space", where, true, &add_prefix));
    DS_TRY(ds_json_bool(j, "split", where, true, &st->split));
    DS_TRY(ds_json_str_opt(j, "prepend_scheme", where, &scheme));
    st->prepend = add_prefix ? PREPEND_ALWAYS : PREPEND_NEVER;
    if (scheme) {
        if (!strcmp(scheme, "always")) st->prepend = PREPEND_ALWAYS;
        else if (!strcmp(scheme, "first")) st->prepend = PREPEND_FIRST;
        else if (!strcmp(scheme, "never")) st->prepend = PREPEND_NEVER;
        else return ds_errorf("%s.prepend_scheme \"%s\" is not always, first or never", where, scheme);
    }
    return NULL;
}

static ds_error *parse_into(ds_pretok *pt, const cJSON *j, const char *where, int depth) {
    if (depth > 16) return ds_errorf("%s: Sequence nested too deeply", where);
    if (!cJSON_IsObject(j)) return ds_errorf("%s should be an object, is %s", where, ds_json_kind(j));
    const char *type;
    char w[256];
    DS_TRY(ds_json_str(j, "type", where, &type));
    pt_step st = {0};
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = ds_json_get(j, "pretokenizers");
        if (!cJSON_IsArray(list))
            return ds_errorf("%s.pretokenizers should be an array, is %s", where, ds_json_kind(list));
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            snprintf(w, sizeof w, "%s.pretokenizers[%d]", where, i);
            DS_TRY(parse_into(pt, c, w, depth + 1));
        }
        return NULL;
    }
    if (!strcmp(type, "Split")) {
        st.kind = P_SPLIT;
        DS_TRY(parse_behavior(j, where, B_ISOLATED, &st.beh));
        DS_TRY(ds_json_bool(j, "invert", where, false, &st.invert));
        snprintf(w, sizeof w, "%s.pattern", where);
        DS_TRY(ds_pattern_parse(ds_json_get(j, "pattern"), w, &st.pat));
        return add_step(pt, st);
    }
    if (!strcmp(type, "ByteLevel")) {
        bool use_regex;
        st.kind = P_BYTE_LEVEL;
        DS_TRY(ds_json_bool(j, "add_prefix_space", where, true, &st.add_prefix_space));
        DS_TRY(ds_json_bool(j, "use_regex", where, true, &use_regex));
        if (use_regex) DS_TRY(ds_pattern_regex(GPT2_RE, where, &st.pat));
        return add_step(pt, st);
    }
    if (!strcmp(type, "Metaspace")) {
        DS_TRY(parse_metaspace(j, where, &st));
        return add_step(pt, st);
    }
    if (!strcmp(type, "Whitespace")) /* keep \w+ and [^\w\s]+ runs, drop the rest */
        return add_regex_split(pt, "\\w+|[^\\w\\s]+", B_REMOVED, true, where);
    if (!strcmp(type, "WhitespaceSplit")) return add_regex_split(pt, "\\s+", B_REMOVED, false, where);
    if (!strcmp(type, "Digits")) {
        bool individual;
        DS_TRY(ds_json_bool(j, "individual_digits", where, false, &individual));
        return add_regex_split(pt, "\\p{N}", individual ? B_ISOLATED : B_CONTIGUOUS, false, where);
    }
    if (!strcmp(type, "Punctuation")) {
        behavior beh;
        DS_TRY(parse_behavior(j, where, B_ISOLATED, &beh));
        return add_regex_split(pt, PUNCT_RE, beh, false, where);
    }
    if (!strcmp(type, "BertPreTokenizer")) {
        DS_TRY(add_regex_split(pt, "\\s+", B_REMOVED, false, where));
        return add_regex_split(pt, PUNCT_RE, B_ISOLATED, false, where);
    }
    return ds_errorf("%s.type \"%s\" is not supported (Split, ByteLevel, Metaspace, Whitespace, "
                     "WhitespaceSplit, Digits, Punctuation, BertPreTokenizer, Sequence)", where, type);
}

ds_error *ds_pretok_parse(const cJSON *j, ds_pretok **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return NULL;
    ds_pretok *pt = calloc(1, sizeof *pt);
    if (!pt) return ds_errorf("out of memory");
    ds_error *e = parse_into(pt, j, "pre_tokenizer", 0);
    if (e) {
        ds_pretok_free(pt);
        return e;
    }
    *out = pt;
    return NULL;
}

void ds_pretok_free(ds_pretok *pt) {
    if (!pt) return;
    for (size_t i = 0; i < pt->n; i++) ds_pattern_free(&pt->steps[i].pat);
    free(pt->steps);
    free(pt);
}

void ds_pieces_clear(ds_pieces *p) {
    ds_buf_clear(&p->text);
    p->n = 0;
}

bool ds_pieces_add(ds_pieces *p, const char *s, size_t n, bool first) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        ds_piece *v = realloc(p->v, cap * sizeof *v);
        if (!v) {
            p->failed = true;
            return false;
        }
        p->v = v;
        p->cap = cap;
    }
    size_t off = p->text.len;
    if (!ds_buf_append(&p->text, s, n)) {
        p->failed = true;
        return false;
    }
    p->v[p->n++] = (ds_piece){off, n, first};
    return true;
}

void ds_pieces_free(ds_pieces *p) {
    ds_buf_free(&p->text);
    free(p->v);
    memset(p, 0, sizeof *p);
}

/* ---- applying ------------------------------------------------------------ */

typedef struct {
    size_t a, b;
    bool match;
} span;

/* HF's NormalizedString::split: the matches and the gaps between them
 * cover s; the behaviour decides which become pieces. Empty pieces are
 * dropped (PreTokenizedString::split filters them). */
static ds_error *split_piece(const pt_step *st, const char *s, size_t n, bool first, ds_pieces *out, ds_ranges *m,
                             ds_regex_scratch **rs) {
    DS_TRY(ds_pattern_find_all(&st->pat, s, n, rs, m));
    /* spans: gaps and matches, in order (at most 2m+1) */
    span *sp = malloc((2 * m->n + 1) * sizeof *sp);
    if (!sp) return ds_errorf("out of memory");
    size_t ns = 0, prev = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (m->v[i].start > prev) sp[ns++] = (span){prev, m->v[i].start, false};
        sp[ns++] = (span){m->v[i].start, m->v[i].end, true};
        prev = m->v[i].end;
    }
    if (prev < n || ns == 0) sp[ns++] = (span){prev, n, false};
    if (st->invert)
        for (size_t i = 0; i < ns; i++) sp[i].match = !sp[i].match;
    /* Fold into output spans (in place, w <= i). */
    size_t w = 0;
    bool prev_match = false;
    switch (st->beh) {
    case B_REMOVED:
        for (size_t i = 0; i < ns; i++)
            if (!sp[i].match) sp[w++] = sp[i];
        break;
    case B_ISOLATED:
        w = ns;
        break;
    case B_MERGED_PREV:
        for (size_t i = 0; i < ns; i++) {
            if (sp[i].match && !prev_match && w > 0) sp[w - 1].b = sp[i].b;
            else sp[w++] = sp[i];
            prev_match = sp[i].match;
        }
        break;
    case B_MERGED_NEXT: /* the mirror image: fold from the right */
        for (size_t i = ns; i-- > 0;) {
            span cur = sp[i];
            if (cur.match && !prev_match && w > 0) sp[ns - w].a = cur.a;
            else sp[ns - 1 - w++] = cur;
            prev_match = cur.match;
        }
        memmove(sp, sp + ns - w, w * sizeof *sp);
        break;
    case B_CONTIGUOUS:
        for (size_t i = 0; i < ns; i++) {
            if (sp[i].match == prev_match && w > 0) sp[w - 1].b = sp[i].b;
            else sp[w++] = sp[i];
            prev_match = sp[i].match;
        }
        break;
    }
    for (size_t i = 0; i < w; i++)
        if (sp[i].b > sp[i].a) ds_pieces_add(out, s + sp[i].a, sp[i].b - sp[i].a, first && sp[i].a == 0);
    free(sp);
    return out->failed ? ds_errorf("out of memory") : NULL;
}

static void add_byte_level(ds_pieces *out, const char *s, size_t n, bool first) {
    if (!n) return;
    if (!ds_buf_reserve(&out->text, 2 * n)) {
        out->failed = true;
        return;
    }
    size_t off = out->text.len;
    ds_byte_level_encode(&out->text, s, n);
    /* the text is in place: register the piece without copying it again */
    if (!ds_pieces_add(out, NULL, 0, first)) return;
    out->v[out->n - 1] = (ds_piece){off, out->text.len - off, first};
}

static ds_error *byte_level_piece(const pt_step *st, const char *s, size_t n, bool first, ds_pieces *out,
                                  ds_ranges *m, ds_buf *tmp, ds_regex_scratch **rs) {
    if (st->add_prefix_space && n && s[0] != ' ') {
        ds_buf_clear(tmp);
        ds_buf_putc(tmp, ' ');
        ds_buf_append(tmp, s, n);
        if (tmp->failed) return ds_errorf("out of memory");
        s = tmp->data;
        n = tmp->len;
    }
    if (!st->pat.re) {
        add_byte_level(out, s, n, first);
    } else {
        DS_TRY(ds_pattern_find_all(&st->pat, s, n, rs, m));
        size_t prev = 0;
        for (size_t i = 0; i < m->n; i++) {
            add_byte_level(out, s + prev, m->v[i].start - prev, first && prev == 0);
            add_byte_level(out, s + m->v[i].start, m->v[i].end - m->v[i].start, first && m->v[i].start == 0);
            prev = m->v[i].end;
        }
        add_byte_level(out, s + prev, n - prev, first && prev == 0);
    }
    return out->failed ? ds_errorf("out of memory") : NULL;
}

static ds_error *metaspace_piece(const pt_step *st, const char *s, size_t n, bool first, ds_pieces *out,
                                 ds_buf *tmp) {
    ds_buf_clear(tmp);
    bool starts = n >= st->repl_len && !memcmp(s, st->repl, st->repl_len);
    if (n && ((st->prepend == PREPEND_ALWAYS && !starts && s[0] != ' ') ||
              (st->prepend == PREPEND_FIRST && first && !starts && s[0] != ' ')))
        ds_buf_append(tmp, st->repl, st->repl_len);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') ds_buf_append(tmp, st->repl, st->repl_len);
        else ds_buf_putc(tmp, s[i]);
    }
    if (tmp->failed) return ds_errorf("out of memory");
    if (!st->split) {
        if (tmp->len) ds_pieces_add(out, tmp->data, tmp->len, first);
    } else {
        /* MergedWithNext on the replacement: each piece starts at one */
        size_t a = 0;
        for (size_t i = 1; i + st->repl_len <= tmp->len; i++) {
            if (!memcmp(tmp->data + i, st->repl, st->repl_len)) {
                if (i > a) ds_pieces_add(out, tmp->data + a, i - a, first && a == 0);
                a = i;
                i += st->repl_len - 1;
            }
        }
        if (tmp->len > a) ds_pieces_add(out, tmp->data + a, tmp->len - a, first && a == 0);
    }
    return out->failed ? ds_errorf("out of memory") : NULL;
}

ds_error *ds_pretok_apply(const ds_pretok *pt, ds_pieces *io, ds_pieces *tmp, ds_regex_scratch **rs) {
    if (!pt) return NULL;
    ds_ranges m = {0};
    ds_buf scratch = {0};
    ds_error *e = NULL;
    for (size_t k = 0; k < pt->n && !e; k++) {
        const pt_step *st = &pt->steps[k];
        ds_pieces_clear(tmp);
        for (size_t i = 0; i < io->n && !e; i++) {
            const char *s = io->text.data + io->v[i].off;
            size_t n = io->v[i].len;
            bool first = io->v[i].first;
            switch (st->kind) {
            case P_SPLIT: e = split_piece(st, s, n, first, tmp, &m, rs); break;
            case P_BYTE_LEVEL: e = byte_level_piece(st, s, n, first, tmp, &m, &scratch, rs); break;
            case P_METASPACE: e = metaspace_piece(st, s, n, first, tmp, &scratch); break;
            }
        }
        ds_pieces t = *io;
        *io = *tmp;
        *tmp = t;
    }
    ds_ranges_free(&m);
    ds_buf_free(&scratch);
    return e;
}
