#include "tokenizer/added_tokens.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/json_util.h"
#include "tokenizer/utf8.h"

static ds_error *trie_build(ds_trie *t, const ds_added_vocab *av, bool normalized, char *const *contents,
                            const size_t *lens) {
    size_t bytes = 0;
    for (size_t i = 0; i < av->n; i++)
        if (av->tok[i].normalized == normalized) bytes += lens[i];
    DS_TRY(ds_pairmap_init(&t->edges, bytes));
    t->term = malloc((bytes + 1) * sizeof *t->term);
    if (!t->term) return ds_errorf("out of memory for added tokens");
    t->term[0] = -1;
    t->n_nodes = 1;
    for (size_t i = 0; i < av->n; i++) {
        if (av->tok[i].normalized != normalized || !lens[i]) continue;
        const unsigned char *s = (const unsigned char *)contents[i];
        size_t node = 0;
        t->first[s[0]] = true;
        for (size_t k = 0; k < lens[i]; k++) {
            uint64_t key = (uint64_t)node << 8 | s[k];
            const ds_pairmap_slot *e = ds_pairmap_get(&t->edges, key);
            if (e) {
                node = (size_t)e->id;
            } else {
                size_t nn = t->n_nodes++;
                t->term[nn] = -1;
                ds_pairmap_put(&t->edges, key, 0, (int32_t)nn);
                node = nn;
            }
        }
        if (t->term[node] < 0) t->term[node] = (int32_t)i; /* contents equal after normalizing: first wins */
    }
    return NULL;
}

static void trie_free(ds_trie *t) {
    ds_pairmap_free(&t->edges);
    free(t->term);
    memset(t, 0, sizeof *t);
}

static ds_error *parse_token(const cJSON *c, size_t i, ds_added_token *t) {
    char w[64];
    snprintf(w, sizeof w, "added_tokens[%zu]", i);
    const char *content;
    long long id;
    if (!cJSON_IsObject(c)) return ds_errorf("%s should be an object, is %s", w, ds_json_kind(c));
    DS_TRY(ds_json_str(c, "content", w, &content));
    /* HF requires the id but then assigns its own (see ds_added_load). */
    const cJSON *idv = ds_json_get(c, "id");
    char wid[80];
    snprintf(wid, sizeof wid, "%s.id", w);
    if (!idv) return ds_errorf("%s is missing", wid);
    DS_TRY(ds_json_as_uint(idv, wid, UINT32_MAX, &id));
    DS_TRY(ds_json_bool(c, "special", w, false, &t->special));
    DS_TRY(ds_json_bool(c, "single_word", w, false, &t->single_word));
    DS_TRY(ds_json_bool(c, "lstrip", w, false, &t->lstrip));
    DS_TRY(ds_json_bool(c, "rstrip", w, false, &t->rstrip));
    DS_TRY(ds_json_bool(c, "normalized", w, !t->special, &t->normalized));
    t->len = strlen(content);
    t->content = malloc(t->len + 1);
    if (!t->content) return ds_errorf("out of memory");
    memcpy(t->content, content, t->len + 1);
    return NULL;
}

/* HF's AddedVocabulary::add_tokens, in file order: empty contents are
 * ignored; a content seen before keeps its id and takes the later flags
 * (special sticks once set: HF keeps a set of special contents); a
 * content in the model vocab gets the vocab's id; anything else gets the
 * next id after the model vocab and the added ids so far. The "id" written
 * in the file is not used: for consistent files it is the same number. */
static ds_error *assign(ds_added_vocab *av, ds_added_token *t, const ds_strtab *vocab, int64_t *max_id) {
    int32_t k = ds_strtab_find(&av->by_content, t->content, t->len);
    if (k >= 0) {
        ds_added_token *old = &av->tok[k];
        bool special = old->special || t->special;
        free(old->content);
        t->id = old->id;
        *old = *t;
        old->special = special;
        return NULL;
    }
    int64_t v = (int64_t)vocab->n_strings;
    int32_t id = ds_strtab_find(vocab, t->content, t->len);
    if (id < 0) {
        int64_t next = *max_id < 0 ? v : (*max_id >= v || v == 0) ? *max_id + 1 : v;
        if (next > DS_MAX_TOKEN_ID) return ds_errorf("added token \"%s\" would get id %lld, too large", t->content,
                                                     (long long)next);
        id = (int32_t)next;
    }
    if (id > *max_id) *max_id = id;
    t->id = id;
    av->tok[av->n] = *t;
    ds_strtab_set(&av->by_content, (int32_t)av->n, t->content, t->len);
    av->n++;
    return NULL;
}

/* HF matches normalized=true tokens against normalized text, so it
 * normalizes their content the same way first. */
static ds_error *normalized_content(const ds_added_token *t, const ds_normalizer *nm, char **out, size_t *len) {
    ds_buf res = {0}, tmp = {0};
    ds_regex_scratch *rs = NULL;
    ds_error *e = ds_normalizer_apply(nm, t->content, t->len, &res, &tmp, &rs);
    ds_regex_scratch_free(rs);
    ds_buf_free(&tmp);
    if (e) {
        ds_buf_free(&res);
        return ds_error_wrap(e, "added token \"%s\"", t->content);
    }
    if (!(*out = ds_buf_take(&res, len))) return ds_errorf("out of memory");
    return NULL;
}

ds_error *ds_added_load(ds_added_vocab *av, const cJSON *arr, const ds_normalizer *nm, const ds_strtab *vocab) {
    memset(av, 0, sizeof *av);
    if (arr && !cJSON_IsArray(arr)) return ds_errorf("added_tokens should be an array, is %s", ds_json_kind(arr));
    size_t n = arr ? (size_t)cJSON_GetArraySize(arr) : 0, bytes = 0;
    for (const cJSON *c = arr ? arr->child : NULL; c; c = c->next) {
        const cJSON *content = ds_json_get(c, "content");
        if (cJSON_IsString(content)) bytes += strlen(content->valuestring);
    }
    av->tok = calloc(n ? n : 1, sizeof *av->tok);
    ds_error *e = av->tok ? ds_strtab_init(&av->by_content, n, n, bytes) : ds_errorf("out of memory");
    int64_t max_id = -1;
    size_t i = 0;
    for (const cJSON *c = arr ? arr->child : NULL; c && !e; c = c->next, i++) {
        ds_added_token t = {0};
        e = parse_token(c, i, &t);
        if (!e && t.len) {
            e = assign(av, &t, vocab, &max_id); /* owns t.content unless it fails */
            if (e) free(t.content);
        } else {
            free(t.content);
        }
    }
    /* the two tries: raw contents, and normalized ones for normalized=true */
    char **pat = calloc(av->n ? av->n : 1, sizeof *pat), **norm = calloc(av->n ? av->n : 1, sizeof *norm);
    size_t *pat_len = calloc(av->n ? av->n : 1, sizeof *pat_len);
    size_t *norm_len = calloc(av->n ? av->n : 1, sizeof *norm_len);
    if (!e && (!pat || !norm || !pat_len || !norm_len)) e = ds_errorf("out of memory");
    for (size_t k = 0; k < av->n && !e; k++) {
        pat[k] = av->tok[k].content;
        pat_len[k] = av->tok[k].len;
        if (av->tok[k].normalized) e = normalized_content(&av->tok[k], nm, &norm[k], &norm_len[k]);
    }
    if (!e) e = trie_build(&av->raw, av, false, pat, pat_len);
    if (!e) e = trie_build(&av->norm, av, true, norm, norm_len);
    for (size_t k = 0; k < av->n && norm; k++) free(norm[k]);
    free(norm);
    free(norm_len);
    free(pat);
    free(pat_len);
    if (e) ds_added_free(av);
    return e;
}

void ds_added_free(ds_added_vocab *av) {
    for (size_t i = 0; i < av->n; i++) free(av->tok[i].content);
    free(av->tok);
    trie_free(&av->raw);
    trie_free(&av->norm);
    ds_strtab_free(&av->by_content);
    memset(av, 0, sizeof *av);
}

void ds_segs_free(ds_segs *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

static bool push_seg(ds_segs *s, size_t a, size_t b, int32_t id) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        ds_seg *v = realloc(s->v, cap * sizeof *v);
        if (!v) return false;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (ds_seg){a, b, id};
    return true;
}

/* Leftmost start, then longest content: the first match at or after `from`. */
static bool trie_find(const ds_trie *t, const char *s, size_t n, size_t from, size_t *ms, size_t *me, int32_t *ti) {
    if (t->n_nodes <= 1) return false;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = from; i < n; i++) {
        if (!t->first[u[i]]) continue;
        size_t node = 0;
        int32_t best = -1;
        size_t best_end = 0;
        for (size_t j = i; j < n; j++) {
            const ds_pairmap_slot *e = ds_pairmap_get(&t->edges, (uint64_t)node << 8 | u[j]);
            if (!e) break;
            node = (size_t)e->id;
            if (t->term[node] >= 0) {
                best = t->term[node];
                best_end = j + 1;
            }
        }
        if (best >= 0) {
            *ms = i;
            *me = best_end;
            *ti = best;
            return true;
        }
    }
    return false;
}

/* The character before byte `at` (at > 0). */
static uint32_t cp_before(const char *s, size_t at, size_t *start) {
    size_t p = at - 1;
    while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
    uint32_t cp;
    ds_utf8_next(s + p, &cp);
    if (start) *start = p;
    return cp;
}

ds_error *ds_added_split(const ds_added_vocab *av, const ds_trie *t, const char *s, size_t n, ds_segs *out) {
    size_t done = 0, from = 0, ms, me;
    int32_t ti;
    while (from < n && trie_find(t, s, n, from, &ms, &me, &ti)) {
        from = me; /* like Aho-Corasick's iterator: resume after the match, kept or not */
        const ds_added_token *tok = &av->tok[ti];
        if (ms < done) continue; /* inside text an earlier rstrip swallowed */
        if (tok->single_word) {
            uint32_t cp;
            bool word_before = ms > 0 && ds_is_word_char(cp_before(s, ms, NULL));
            bool word_after = me < n && (ds_utf8_next(s + me, &cp), ds_is_word_char(cp));
            if (word_before || word_after) continue;
        }
        size_t start = ms, stop = me;
        if (tok->lstrip) {
            size_t p;
            while (start > done && ds_is_white_space(cp_before(s, start, &p))) start = p;
        }
        if (tok->rstrip) {
            while (stop < n) {
                uint32_t cp;
                int k = ds_utf8_next(s + stop, &cp);
                if (!ds_is_white_space(cp)) break;
                stop += (size_t)k;
            }
        }
        if ((done < start && !push_seg(out, done, start, -1)) || !push_seg(out, start, stop, tok->id))
            return ds_errorf("out of memory");
        done = stop;
        if (from < stop) from = stop;
    }
    if (done < n && !push_seg(out, done, n, -1)) return ds_errorf("out of memory");
    return NULL;
}
