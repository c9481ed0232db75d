#include "tokenizer/decoder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_util.h"
#include "tokenizer/pattern.h"
#include "tokenizer/utf8.h"

#define FFFD "\xEF\xBF\xBD"

typedef enum { D_REPLACE, D_STRIP, D_METASPACE } dstep_kind;

typedef struct {
    dstep_kind kind;
    ds_pattern pat;   /* Replace */
    char *content;    /* Replace: replacement; Strip: the character */
    size_t content_len;
    size_t start, stop; /* Strip: how many to remove at each end */
    char repl[8];     /* Metaspace: replacement character */
    size_t repl_len;
    bool drop_first;  /* Metaspace: first token loses its replacement chars */
} dstep;

typedef struct {
    dstep *v;
    size_t n, cap;
} dsteps;

struct ds_decoder {
    dsteps pre;  /* per token, before the join */
    dsteps post; /* on the joined text */
    bool byte_level, byte_fallback;
    bool join_space; /* no decoder at all: HF joins tokens with " " */
};

static void dstep_free(dstep *st) {
    ds_pattern_free(&st->pat);
    free(st->content);
}

static ds_error *push_step(dsteps *l, dstep st) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        dstep *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            dstep_free(&st);
            return ds_errorf("out of memory");
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = st;
    return NULL;
}

static ds_error *parse_into(ds_decoder *d, const cJSON *j, const char *where, bool *joined, int depth) {
    if (depth > 16) return ds_errorf("%s: Sequence nested too deeply", where);
    if (!cJSON_IsObject(j)) return ds_errorf("%s should be an object, is %s", where, ds_json_kind(j));
    const char *type;
    char w[256];
    DS_TRY(ds_json_str(j, "type", where, &type));
    dstep st = {0};
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = ds_json_get(j, "decoders");
        if (!cJSON_IsArray(list)) return ds_errorf("%s.decoders should be an array, is %s", where, ds_json_kind(list));
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            snprintf(w, sizeof w, "%s.decoders[%d]", where, i);
            DS_TRY(parse_into(d, c, w, joined, depth + 1));
        }
        return NULL;
    }
    if (!strcmp(type, "ByteLevel")) {
        d->byte_level = *joined = true;
        return NULL;
    }
    if (!strcmp(type, "ByteFallback")) {
        d->byte_fallback = *joined = true;
        return NULL;
    }
    if (!strcmp(type, "Fuse")) {
        *joined = true;
        return NULL;
    }
    if (!strcmp(type, "Replace")) {
        st.kind = D_REPLACE;
        DS_TRY(ds_replace_parse(j, where, &st.pat, &st.content, &st.content_len));
        return push_step(*joined ? &d->post : &d->pre, st);
    }
    if (!strcmp(type, "Strip")) {
        const char *c;
        long long a, b;
        st.kind = D_STRIP;
        DS_TRY(ds_json_str(j, "content", where, &c));
        if (!*c || (size_t)ds_utf8_len((unsigned char)c[0]) != strlen(c))
            return ds_errorf("%s.content should be one character", where);
        DS_TRY(ds_json_uint(j, "start", where, 0, &a));
        DS_TRY(ds_json_uint(j, "stop", where, 0, &b));
        st.start = (size_t)a;
        st.stop = (size_t)b;
        DS_TRY(ds_step_content_copy(c, &st.content, &st.content_len));
        return push_step(*joined ? &d->post : &d->pre, st);
    }
    if (!strcmp(type, "Metaspace")) {
        const char *repl, *scheme;
        bool add_prefix;
        st.kind = D_METASPACE;
        DS_TRY(ds_json_str_opt(j, "replacement", where, &repl));
        if (!repl) repl = "\xE2\x96\x81";
        st.repl_len = strlen(repl);
        if (!st.repl_len || st.repl_len > 4 || (size_t)ds_utf8_len((unsigned char)repl[0]) != st.repl_len)
            return ds_errorf("%s.replacement should be one character", where);
        memcpy(st.repl, repl, st.repl_len);
        DS_TRY(ds_json_bool(j, "add_prefix_space", where, true, &add_prefix));
        DS_TRY(ds_json_str_opt(j, "prepend_scheme", where, &scheme));
        st.drop_first = scheme ? strcmp(scheme, "never") != 0 : add_prefix;
        return push_step(&d->pre, st);
    }
    return ds_errorf("%s.type \"%s\" is not supported (ByteLevel, ByteFallback, Fuse, Replace, Strip, "
                     "Metaspace, Sequence)", where, type);
}

static void steps_free(dsteps *l) {
    for (size_t i = 0; i < l->n; i++) dstep_free(&l->v[i]);
    free(l->v);
}

void ds_decoder_free(ds_decoder *d) {
    if (!d) return;
    steps_free(&d->pre);
    steps_free(&d->post);
    free(d);
}

ds_error *ds_decoder_parse(const cJSON *j, ds_decoder **out) {
    *out = NULL;
    ds_decoder *d = calloc(1, sizeof *d);
    if (!d) return ds_errorf("out of memory");
    if (!j || cJSON_IsNull(j)) {
        d->join_space = true;
    } else {
        bool joined = false;
        ds_error *e = parse_into(d, j, "decoder", &joined, 0);
        if (e) {
            ds_decoder_free(d);
            return e;
        }
    }
    *out = d;
    return NULL;
}

/* ---- per-token steps ------------------------------------------------------ */

/* Strip: up to `start` leading and `stop` trailing copies of the character. */
static void strip_token(const dstep *st, const char *s, size_t n, ds_buf *out) {
    size_t a = 0, b = n, c = st->content_len;
    for (size_t k = 0; k < st->start && a + c <= b && !memcmp(s + a, st->content, c); k++) a += c;
    for (size_t k = 0; k < st->stop && b >= a + c && !memcmp(s + b - c, st->content, c); k++) b -= c;
    ds_buf_append(out, s + a, b - a);
}

static void metaspace_token(const dstep *st, const char *s, size_t n, bool first, ds_buf *out) {
    size_t r = st->repl_len;
    for (size_t i = 0; i < n;) {
        if (i + r <= n && !memcmp(s + i, st->repl, r)) {
            if (!(first && st->drop_first)) ds_buf_putc(out, ' ');
            i += r;
        } else {
            ds_buf_putc(out, s[i++]);
        }
    }
}

static ds_error *apply_step(ds_decode_stream *s, const dstep *st, const char *in, size_t n, bool first, ds_buf *out) {
    ds_buf_clear(out);
    switch (st->kind) {
    case D_REPLACE:
        return ds_pattern_replace_all(&st->pat, in, n, st->content, st->content_len, &s->rs, out);
    case D_STRIP:
        strip_token(st, in, n, out);
        break;
    case D_METASPACE:
        metaspace_token(st, in, n, first, out);
        break;
    }
    return out->failed ? ds_errorf("out of memory") : NULL;
}

/* ---- post-join steps (streamable) ----------------------------------------- */

/* Strip on the joined text, fed in chunks: leading characters are removed
 * as they arrive; trailing candidates are held until something else
 * follows or the stream ends. */
static void strip_joined(const dstep *st, ds_strip_state *ss, const char *s, size_t n, bool final, ds_buf *out) {
    size_t c = st->content_len, i = 0;
    while (ss->start_left && i + c <= n && !memcmp(s + i, st->content, c)) {
        i += c;
        ss->start_left--;
    }
    if (i < n) ss->start_left = 0;
    s += i;
    n -= i;
    if (!st->stop) {
        ds_buf_append(out, s, n);
        return;
    }
    ds_buf_append(&ss->held, s, n);
    if (ss->held.failed) {
        out->failed = true;
        return;
    }
    const char *h = ss->held.data; /* NULL only while empty */
    size_t len = ss->held.len, e = len, k = 0;
    while (e >= c && !memcmp(h + e - c, st->content, c)) {
        e -= c;
        k++;
    }
    if (!final) { /* emit up to the trailing run of the character, keep the run */
        ds_buf_append(out, h, e);
        if (e) {
            memmove(ss->held.data, h + e, len - e);
            ss->held.len = len - e;
        }
        return;
    }
    size_t drop = k < st->stop ? k : st->stop;
    ds_buf_append(out, h, len - drop * c);
    ds_buf_clear(&ss->held);
}

static ds_error *post_feed(ds_decode_stream *s, const char *text, size_t n, bool final) {
    const ds_decoder *d = s->dec;
    const char *cur = text;
    size_t cur_n = n;
    for (size_t i = 0; i < d->post.n; i++) {
        const dstep *st = &d->post.v[i];
        ds_buf *dst = (i % 2 == 0) ? &s->p1 : &s->p2;
        ds_buf_clear(dst);
        if (st->kind == D_STRIP) strip_joined(st, &s->strip[i], cur, cur_n, final, dst);
        else DS_TRY(apply_step(s, st, cur, cur_n, false, dst));
        if (!ds_buf_reserve(dst, 0)) return ds_errorf("out of memory");
        cur = dst->data;
        cur_n = dst->len;
    }
    ds_buf_append(&s->out, cur, cur_n);
    return s->out.failed ? ds_errorf("out of memory") : NULL;
}

/* Newly joined (complete) text: held whole in exact mode, else passed on. */
static ds_error *emit(ds_decode_stream *s, const char *text, size_t n) {
    if (!n) return NULL;
    if (s->exact || s->dec->post.n == 0) {
        ds_buf *dst = s->exact && s->dec->post.n ? &s->joined : &s->out;
        ds_buf_append(dst, text, n);
        return dst->failed ? ds_errorf("out of memory") : NULL;
    }
    return post_feed(s, text, n, false);
}

/* Appends bytes to the pending buffer and emits every complete character
 * (final: the incomplete tail too, as U+FFFD). */
static ds_error *emit_bytes(ds_decode_stream *s, const char *bytes, size_t n, bool final) {
    if (!s->pend.len && ds_utf8_invalid_at(bytes, n) == n) return emit(s, bytes, n); /* common case */
    ds_buf_append(&s->pend, bytes, n);
    ds_buf_clear(&s->chunk);
    size_t used = ds_utf8_append_lossy(&s->chunk, s->pend.data ? s->pend.data : "", s->pend.len, final);
    memmove(s->pend.data, s->pend.data + used, s->pend.len - used);
    s->pend.len -= used;
    if (s->pend.failed || s->chunk.failed) return ds_errorf("out of memory");
    return emit(s, s->chunk.data, s->chunk.len);
}

/* ---- byte-fallback runs ----------------------------------------------------- */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* HF ByteFallback: a token of exactly 6 bytes "<0x" hh ">" (u8::from_str_radix,
 * which also takes a '+' sign). */
static int byte_token(const char *t, size_t n) {
    if (n != 6 || memcmp(t, "<0x", 3) || t[5] != '>') return -1;
    int hi = hexval(t[3]), lo = hexval(t[4]);
    if (t[3] == '+' && lo >= 0) return lo;
    return hi >= 0 && lo >= 0 ? hi * 16 + lo : -1;
}

static ds_error *run_flush(ds_decode_stream *s) {
    if (!s->run.len) return NULL;
    ds_error *e = NULL;
    if (s->exact) {
        if (ds_utf8_invalid_at(s->run.data, s->run.len) == s->run.len) {
            e = emit(s, s->run.data, s->run.len);
        } else {
            for (size_t i = 0; i < s->run.len && !e; i++) e = emit(s, FFFD, 3);
        }
    } else {
        for (size_t i = s->run_done; i < s->run.len && !e; i++) e = emit(s, FFFD, 3);
    }
    ds_buf_clear(&s->run);
    s->run_done = 0;
    s->run_bad = false;
    return e;
}

static ds_error *run_push(ds_decode_stream *s, unsigned char byte) {
    if (!ds_buf_putc(&s->run, (char)byte)) return ds_errorf("out of memory");
    if (s->exact) return NULL;
    if (s->run_bad) {
        s->run_done = s->run.len;
        return emit(s, FFFD, 3);
    }
    /* Show the characters completed so far. */
    const unsigned char *u = (const unsigned char *)s->run.data;
    size_t i = s->run_done;
    while (i < s->run.len) {
        int k = ds_utf8_scan(u + i, s->run.len - i);
        if (k == 0) break;
        if (k < 0) { /* ill-formed: HF would replace the whole run byte by byte */
            s->run_bad = true;
            DS_TRY(emit(s, s->run.data + s->run_done, i - s->run_done));
            for (size_t j = i; j < s->run.len; j++) DS_TRY(emit(s, FFFD, 3));
            s->run_done = s->run.len;
            return NULL;
        }
        i += (size_t)k;
    }
    DS_TRY(emit(s, s->run.data + s->run_done, i - s->run_done));
    s->run_done = i;
    return NULL;
}

/* ---- the stream ------------------------------------------------------------ */

ds_error *ds_decode_stream_init(ds_decode_stream *s, const ds_decoder *d, bool exact) {
    memset(s, 0, sizeof *s);
    s->dec = d;
    s->exact = exact;
    if (d->post.n) {
        s->strip = calloc(d->post.n, sizeof *s->strip);
        if (!s->strip) return ds_errorf("out of memory");
        for (size_t i = 0; i < d->post.n; i++) s->strip[i].start_left = d->post.v[i].start;
    }
    return NULL;
}

void ds_decode_stream_free(ds_decode_stream *s) {
    ds_buf_free(&s->pend);
    ds_buf_free(&s->run);
    ds_buf_free(&s->a);
    ds_buf_free(&s->b);
    ds_buf_free(&s->chunk);
    ds_buf_free(&s->tokbytes);
    ds_buf_free(&s->joined);
    ds_buf_free(&s->p1);
    ds_buf_free(&s->p2);
    if (s->strip)
        for (size_t i = 0; i < s->dec->post.n; i++) ds_buf_free(&s->strip[i].held);
    free(s->strip);
    ds_regex_scratch_free(s->rs);
    ds_buf_free(&s->out);
    memset(s, 0, sizeof *s);
}

ds_error *ds_decode_stream_push(ds_decode_stream *s, const char *tok, size_t n) {
    const ds_decoder *d = s->dec;
    bool first = s->n_tokens++ == 0;
    for (size_t i = 0; i < d->pre.n; i++) {
        ds_buf *dst = (i % 2 == 0) ? &s->a : &s->b;
        DS_TRY(apply_step(s, &d->pre.v[i], tok, n, first, dst));
        if (!ds_buf_reserve(dst, 0)) return ds_errorf("out of memory");
        tok = dst->data;
        n = dst->len;
    }
    if (d->join_space && !first) DS_TRY(emit_bytes(s, " ", 1, false));
    int byte = d->byte_fallback ? byte_token(tok, n) : -1;
    if (byte >= 0) {
        /* a run starts: what came before it is complete text */
        if (!s->run.len && s->pend.len) DS_TRY(emit_bytes(s, "", 0, true));
        return run_push(s, (unsigned char)byte);
    }
    DS_TRY(run_flush(s));
    if (d->byte_level) {
        ds_buf_clear(&s->tokbytes);
        ds_byte_level_decode_token(&s->tokbytes, tok, n);
        if (s->tokbytes.failed) return ds_errorf("out of memory");
        return emit_bytes(s, s->tokbytes.data, s->tokbytes.len, false);
    }
    /* A token string stands alone (HF tokens are whole Rust Strings). */
    return emit_bytes(s, tok, n, true);
}

ds_error *ds_decode_stream_finish(ds_decode_stream *s) {
    DS_TRY(run_flush(s));
    DS_TRY(emit_bytes(s, "", 0, true));
    if (!s->dec->post.n) return NULL;
    if (s->exact) return post_feed(s, s->joined.data ? s->joined.data : "", s->joined.len, true);
    return post_feed(s, "", 0, true);
}
