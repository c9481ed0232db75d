#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/strbuf.h"

struct ds_regex {
    pcre2_code *code;
};

struct ds_regex_scratch {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
};

static bool is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Oniguruma (as HF's onig crate uses it, UTF-8) vs PCRE2 with UTF+UCP:
 *  - \s is 0009-000D, 0085 and \p{Z} in Oniguruma; PCRE2 adds U+180E;
 *  - \w is L, M, Nd, Pc in Oniguruma; PCRE2 10.42 takes L, N and '_';
 *  - \h / \H are hex-digit classes in Oniguruma, horizontal space in PCRE2;
 *  - \uHHHH is an escape in Oniguruma, an error in PCRE2 -> \x{HHHH}.
 * These are rewritten as explicit classes; everything else that real
 * tokenizer.json files use (\p{L}, \p{N}, (?i:...), lookahead, {m,n})
 * means the same in both. (\S, \W, \H inside a [...] class have no PCRE2
 * spelling and keep PCRE2's meaning.) */
static const char SPACE_SET[] = "\\t-\\r\\x{85}\\p{Z}";
static const char WORD_SET[] = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
static const char HEX_SET[] = "0-9a-fA-F";

static void put_set(ds_buf *out, const char *set, bool in_class, bool negate) {
    if (in_class) {
        ds_buf_append(out, set, strlen(set));
        return;
    }
    ds_buf_append(out, negate ? "[^" : "[", negate ? 2 : 1);
    ds_buf_append(out, set, strlen(set));
    ds_buf_putc(out, ']');
}

static bool translate(const char *p, size_t n, ds_buf *out) {
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            const char *set = d == 's' || d == 'S' ? SPACE_SET : d == 'w' || d == 'W' ? WORD_SET
                            : d == 'h' || d == 'H' ? HEX_SET : NULL;
            bool negate = d == 'S' || d == 'W' || d == 'H';
            if (set && !(in_class && negate)) {
                put_set(out, set, in_class, negate);
            } else if (d == 'u' && i + 5 < n && is_hex(p[i + 2]) && is_hex(p[i + 3]) && is_hex(p[i + 4]) &&
                       is_hex(p[i + 5])) {
                ds_buf_append(out, "\\x{", 3);
                ds_buf_append(out, p + i + 2, 4);
                ds_buf_putc(out, '}');
                i += 4;
            } else {
                ds_buf_append(out, p + i, 2);
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            ds_buf_putc(out, c);
            /* a ']' right after '[' or '[^' is a literal in both dialects */
            if (i + 1 < n && p[i + 1] == '^') ds_buf_putc(out, p[++i]);
            if (i + 1 < n && p[i + 1] == ']') ds_buf_putc(out, p[++i]);
            continue;
        }
        if (in_class && c == ']') in_class = false;
        ds_buf_putc(out, c);
    }
    return !out->failed;
}

ds_error *ds_regex_compile(const char *pattern, size_t len, const char *where, ds_regex **out) {
    *out = NULL;
    ds_buf t = {0};
    if (!translate(pattern, len, &t) || !ds_buf_reserve(&t, 0)) {
        ds_buf_free(&t);
        return ds_errorf("%s: out of memory", where);
    }
    int err = 0;
    PCRE2_SIZE erroff = 0;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)t.data, t.len, PCRE2_UTF | PCRE2_UCP, &err, &erroff, NULL);
    ds_buf_free(&t);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ds_errorf("%s: regex /%.*s/ does not compile: %s (near offset %zu)", where, (int)len, pattern,
                         (const char *)msg, (size_t)erroff);
    }
    /* JIT is a speed-up only; the interpreter is used where it is missing. */
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    ds_regex *re = malloc(sizeof *re);
    if (!re) {
        pcre2_code_free(code);
        return ds_errorf("%s: out of memory", where);
    }
    re->code = code;
    *out = re;
    return NULL;
}

void ds_regex_free(ds_regex *re) {
    if (!re) return;
    pcre2_code_free(re->code);
    free(re);
}

ds_regex_scratch *ds_regex_scratch_new(void) {
    ds_regex_scratch *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->md = pcre2_match_data_create(1, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    /* The default 32 KiB JIT stack overflows on long whitespace runs with
     * patterns like \s+(?!\S); give it room to grow. */
    s->jit = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, NULL);
    if (!s->md || !s->mctx) {
        ds_regex_scratch_free(s);
        return NULL;
    }
    if (s->jit) pcre2_jit_stack_assign(s->mctx, NULL, s->jit);
    /* The default limits (10M steps, 20 MiB of backtracking heap) stop the
     * tokenizer regexes on long but harmless inputs, e.g. 10 MB of spaces
     * against \s+(?!\S); those patterns are linear, so allow what input
     * of any size needs. */
    pcre2_set_match_limit(s->mctx, UINT32_MAX);
    pcre2_set_heap_limit(s->mctx, 4u * 1024 * 1024); /* KiB: 4 GiB */
    return s;
}

void ds_regex_scratch_free(ds_regex_scratch *s) {
    if (!s) return;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    pcre2_jit_stack_free(s->jit);
    free(s);
}

ds_error *ds_regex_find(const ds_regex *re, ds_regex_scratch **scratch, const char *s, size_t n,
                        size_t start, bool *found, size_t *mstart, size_t *mend) {
    *found = false;
    if (!*scratch && !(*scratch = ds_regex_scratch_new())) return ds_errorf("out of memory for regex matching");
    ds_regex_scratch *sc = *scratch;
    /* NO_UTF_CHECK: the subject was validated once; re-checking it on every
     * call would make splitting quadratic. */
    int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, sc->md, sc->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return NULL;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return ds_errorf("regex match failed at byte %zu: %s", start, (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
    *found = true;
    *mstart = ov[0];
    *mend = ov[1] < ov[0] ? ov[0] : ov[1]; /* \K can make end < start */
    return NULL;
}
