#include "tokenizer/vocab_scan.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/utf8.h"

typedef struct {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

static bool eat(cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

static int hex4(const char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char h = p[i];
        int d = h >= '0' && h <= '9'   ? h - '0'
                : h >= 'a' && h <= 'f' ? h - 'a' + 10
                : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Decodes the string at c->p (the opening quote) into out (if not NULL),
 * returning its length; -1 if it is not a string this scanner handles. */
static long scan_string(cursor *c, char *out) {
    skip_ws(c);
    if (c->p >= c->end || *c->p != '"') return -1;
    const char *p = c->p + 1, *end = c->end;
    size_t n = 0;
    while (p < end && *p != '"') {
        unsigned char ch = (unsigned char)*p;
        if (ch < 0x20) return -1;
        if (ch != '\\') {
            /* copy a run of plain bytes at once */
            const char *q = p;
            while (q < end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
            if (out) memcpy(out + n, p, (size_t)(q - p));
            n += (size_t)(q - p);
            p = q;
            continue;
        }
        if (p + 1 >= end) return -1;
        char e = p[1];
        p += 2;
        char one;
        switch (e) {
        case '"': one = '"'; break;
        case '\\': one = '\\'; break;
        case '/': one = '/'; break;
        case 'b': one = '\b'; break;
        case 'f': one = '\f'; break;
        case 'n': one = '\n'; break;
        case 'r': one = '\r'; break;
        case 't': one = '\t'; break;
        case 'u': {
            if (end - p < 4) return -1;
            int cp = hex4(p);
            p += 4;
            if (cp < 0 || (cp >= 0xDC00 && cp <= 0xDFFF)) return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u') return -1;
                int lo = hex4(p + 2);
                if (lo < 0xDC00 || lo > 0xDFFF) return -1;
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            /* NUL would end the string for cJSON; leave such files to it */
            if (cp == 0) return -1;
            char buf[4];
            size_t k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
            if (k == 1) buf[0] = (char)cp;
            else if (k == 2) buf[0] = (char)(0xC0 | (cp >> 6)), buf[1] = (char)(0x80 | (cp & 0x3F));
            else if (k == 3)
                buf[0] = (char)(0xE0 | (cp >> 12)), buf[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
                buf[2] = (char)(0x80 | (cp & 0x3F));
            else
                buf[0] = (char)(0xF0 | (cp >> 18)), buf[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
                buf[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), buf[3] = (char)(0x80 | (cp & 0x3F));
            if (out) memcpy(out + n, buf, k);
            n += k;
            continue;
        }
        default:
            return -1;
        }
        if (out) out[n] = one;
        n++;
    }
    if (p >= end) return -1;
    c->p = p + 1;
    return (long)n;
}

/* Skips any JSON value; false if malformed (the caller then falls back). */
static bool skip_value(cursor *c, int depth) {
    skip_ws(c);
    if (c->p >= c->end || depth > 64) return false;
    char ch = *c->p;
    if (ch == '"') return scan_string(c, NULL) >= 0;
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        c->p++;
        if (eat(c, close)) return true;
        do {
            if (ch == '{') {
                if (scan_string(c, NULL) < 0 || !eat(c, ':')) return false;
            }
            if (!skip_value(c, depth + 1)) return false;
        } while (eat(c, ','));
        return eat(c, close);
    }
    /* number or literal: a run of these characters */
    const char *s = c->p;
    while (c->p < c->end && ((*c->p >= '0' && *c->p <= '9') || (*c->p >= 'a' && *c->p <= 'z') || *c->p == '+' ||
                             *c->p == '-' || *c->p == '.' || *c->p == 'E'))
        c->p++;
    return c->p > s;
}

/* An object member's key as spelled in the text (escapes not decoded). */
typedef struct {
    const char *s;
    size_t n;
} member_name;

/* Reads a member's key and its ':', leaving c at the value. */
static bool member_key(cursor *c, member_name *k) {
    skip_ws(c);
    k->s = c->p + 1;
    if (scan_string(c, NULL) < 0) return false;
    k->n = (size_t)(c->p - 1 - k->s);
    if (!eat(c, ':')) return false;
    skip_ws(c);
    return true;
}

static bool member_is(member_name k, const char *name) {
    size_t n = strlen(name);
    return k.n == n && !memcmp(k.s, name, n);
}

/* Finds member `key` of the object at c (spelled without escapes); leaves
 * c at its value. */
static bool find_member(cursor c, const char *key, cursor *val) {
    if (!eat(&c, '{')) return false;
    if (eat(&c, '}')) return false;
    do {
        member_name k;
        if (!member_key(&c, &k)) return false;
        if (member_is(k, key)) {
            *val = c;
            return true;
        }
        if (!skip_value(&c, 1)) return false;
    } while (eat(&c, ','));
    return false;
}

/* Appends the decoded string at c to the arena. */
static bool take_string(cursor *c, char **arena, const char **s, uint32_t *n) {
    long k = scan_string(c, *arena);
    if (k < 0 || (unsigned long)k > UINT32_MAX / 4) return false;
    *s = *arena;
    *n = (uint32_t)k;
    *arena += k;
    return true;
}

/* Makes room for one more entry in *v (n used, *cap allocated). */
static bool grow(void **v, size_t n, size_t *cap, size_t size) {
    if (n < *cap) return true;
    size_t c = *cap ? *cap * 2 : 1024;
    void *p = realloc(*v, c * size);
    if (!p) return false;
    *v = p;
    *cap = c;
    return true;
}

/* Scans the object ('{') or array ('[') at c into the growing array *items
 * (*n used, entries of `size` bytes), one entry per member or element, each
 * read by `entry`: the loop scan_vocab and scan_merges share. */
static bool scan_entries(cursor *c, char open, void **items, size_t *n, size_t size, char **arena,
                         bool (*entry)(cursor *c, void *item, char **arena)) {
    const char close = open == '{' ? '}' : ']';
    size_t cap = 0;
    if (!eat(c, open)) return false;
    if (eat(c, close)) return true;
    do {
        if (!grow(items, *n, &cap, size)) return false;
        if (!entry(c, (char *)*items + *n * size, arena)) return false;
        (*n)++;
    } while (eat(c, ','));
    return eat(c, close);
}

/* One vocab member, "token": id. */
static bool scan_vocab_entry(cursor *c, void *item, char **arena) {
    ds_vocab_entry *v = item;
    if (!take_string(c, arena, &v->s, &v->n) || !eat(c, ':')) return false;
    skip_ws(c);
    long long id = 0;
    const char *d = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9' && id <= DS_MAX_TOKEN_ID) id = id * 10 + (*c->p++ - '0');
    /* fractions and exponents: leave them to cJSON */
    bool more = c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E');
    if (c->p == d || id > DS_MAX_TOKEN_ID || more) return false;
    v->id = (int32_t)id;
    return true;
}

/* One merges element, "left right" or [left, right]. */
static bool scan_merge_entry(cursor *c, void *item, char **arena) {
    ds_merge_entry *m = item;
    skip_ws(c);
    if (c->p < c->end && *c->p == '"') { /* "left right" */
        const char *s;
        uint32_t n;
        if (!take_string(c, arena, &s, &n)) return false;
        const char *sp = memchr(s, ' ', n);
        if (!sp) return false;
        *m = (ds_merge_entry){s, sp + 1, (uint32_t)(sp - s), (uint32_t)(n - (uint32_t)(sp - s) - 1)};
    } else { /* [left, right] */
        if (!eat(c, '[') || !take_string(c, arena, &m->a, &m->na) || !eat(c, ',') ||
            !take_string(c, arena, &m->b, &m->nb) || !eat(c, ']'))
            return false;
    }
    return true;
}

static bool scan_vocab(cursor *c, ds_vocab_scan *out, char **arena) {
    ds_bpe_lists *l = &out->lists;
    return scan_entries(c, '{', (void **)&l->vocab, &l->n_vocab, sizeof *l->vocab, arena, scan_vocab_entry);
}

static bool scan_merges(cursor *c, ds_vocab_scan *out, char **arena) {
    ds_bpe_lists *l = &out->lists;
    return scan_entries(c, '[', (void **)&l->merges, &l->n_merges, sizeof *l->merges, arena, scan_merge_entry);
}

/* Cuts text[from, to) out, leaving `empty` ("{}" or "[]") in its place;
 * returns the new length (the NUL at text[len] moves along). */
static size_t cut(ds_vocab_scan *out, char *text, size_t len, size_t from, size_t to, const char *empty) {
    out->cut_at[out->n_cuts] = from;
    out->cut_len[out->n_cuts++] = to - from - 2;
    text[from] = empty[0];
    text[from + 1] = empty[1];
    memmove(text + from + 2, text + to, len - to + 1);
    return len - (to - from) + 2;
}

size_t ds_vocab_scan_orig_offset(const ds_vocab_scan *s, size_t off) {
    for (size_t i = s->n_cuts; i-- > 0;)
        if (off >= s->cut_at[i] + 2) off += s->cut_len[i];
    return off;
}

void ds_vocab_scan_free(ds_vocab_scan *s) {
    free(s->lists.vocab);
    free(s->lists.merges);
    free(s->strings);
    memset(s, 0, sizeof *s);
}

/* Reads model's members once: vocab and merges are decoded as they are
 * met (the first of each, as cJSON's lookup would take), the rest skipped. */
static bool scan_model(cursor c, char *arena, ds_vocab_scan *out, const char **vs, const char **ve,
                       const char **ms, const char **me) {
    bool seen_vocab = false, seen_merges = false;
    if (!eat(&c, '{')) return false;
    if (eat(&c, '}')) return false;
    do {
        member_name k;
        if (!member_key(&c, &k)) return false;
        const char *start = c.p;
        bool ok;
        if (!seen_vocab && member_is(k, "vocab")) {
            seen_vocab = true;
            ok = *start == '{' && scan_vocab(&c, out, &arena);
            *vs = start;
            *ve = c.p;
        } else if (!seen_merges && member_is(k, "merges")) {
            seen_merges = true;
            ok = *start == '[' && scan_merges(&c, out, &arena);
            *ms = start;
            *me = c.p;
        } else {
            ok = skip_value(&c, 1);
        }
        if (!ok) return false;
    } while (eat(&c, ','));
    return eat(&c, '}') && seen_vocab;
}

bool ds_vocab_scan_run(char *text, size_t *len_io, ds_vocab_scan *out) {
    size_t len = *len_io;
    memset(out, 0, sizeof *out);
    cursor root = {text, text + len}, model;
    if (!find_member(root, "model", &model)) return false;
    /* decoded strings are never longer than their JSON spelling, so the
     * text's length bounds them all (untouched pages cost nothing) */
    out->strings = malloc(len + 1);
    const char *vs = NULL, *ve = NULL, *ms = NULL, *me = NULL;
    if (!out->strings || !scan_model(model, out->strings, out, &vs, &ve, &ms, &me)) {
        ds_vocab_scan_free(out);
        return false;
    }
    /* the later value first, so the earlier one's offsets stay valid */
    size_t v0 = (size_t)(vs - text), v1 = (size_t)(ve - text);
    size_t m0 = ms ? (size_t)(ms - text) : 0, m1 = ms ? (size_t)(me - text) : 0;
    if (ms && m0 > v0) len = cut(out, text, len, m0, m1, "[]");
    len = cut(out, text, len, v0, v1, "{}");
    if (ms && m0 < v0) len = cut(out, text, len, m0, m1, "[]");
    *len_io = len;
    return true;
}
