/* Encoding one word with the BPE model: HF's BPE::merge_word and
 * Word::merge_all, with the merge queue as a binary heap. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/utf8.h"

struct ds_bpe_sym {
    int32_t id;
    int32_t prev, next; /* neighbours in the word, -1 at the ends */
    uint32_t len;       /* bytes covered; 0 = merged into its left neighbour */
};

void ds_bpe_scratch_free(ds_bpe_scratch *s) {
    free(s->sym);
    free(s->heap);
    ds_buf_free(&s->tmp);
    memset(s, 0, sizeof *s);
}

/* ---- merging ------------------------------------------------------------ */

/* Queue entries are (rank << 32 | position of the left symbol): lowest rank
 * first, then leftmost, as HF's Merge ordering. */
static void heap_push(uint64_t *h, size_t *n, uint64_t x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= x) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], x = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (h[c] >= x) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = x;
    return top;
}

static inline const ds_pairmap_slot *pair(const ds_bpe *m, int32_t a, int32_t b) {
    return ds_pairmap_get(&m->merges, (uint64_t)(uint32_t)a << 32 | (uint32_t)b);
}

static void add_sym(struct ds_bpe_sym *sym, size_t *ns, int32_t id, uint32_t len) {
    size_t i = *ns;
    sym[i] = (struct ds_bpe_sym){id, i ? (int32_t)i - 1 : -1, -1, len};
    if (i) sym[i - 1].next = (int32_t)i;
    (*ns)++;
}

/* HF's Word::merge_all. An entry is stale when the pair at its position
 * changed since it was queued; a pair's rank identifies it (ranks are merge
 * line numbers), and since symbols only grow, "same rank" is exactly HF's
 * "same merged token" test. */
static void merge_all(const ds_bpe *m, struct ds_bpe_sym *sym, size_t ns, uint64_t *heap) {
    size_t hn = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const ds_pairmap_slot *p = pair(m, sym[i].id, sym[i + 1].id);
        if (p) heap_push(heap, &hn, (uint64_t)p->rank << 32 | i);
    }
    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        uint32_t rank = (uint32_t)(top >> 32), pos = (uint32_t)top;
        struct ds_bpe_sym *cur = &sym[pos];
        if (cur->len == 0 || cur->next < 0) continue;
        struct ds_bpe_sym right = sym[cur->next];
        const ds_pairmap_slot *p = pair(m, cur->id, right.id);
        if (!p || p->rank != rank) continue;
        sym[cur->next].len = 0;
        cur->id = p->id;
        cur->len += right.len;
        cur->next = right.next;
        if (right.next >= 0) sym[right.next].prev = (int32_t)pos;
        if (cur->prev >= 0 && (p = pair(m, sym[cur->prev].id, cur->id)))
            heap_push(heap, &hn, (uint64_t)p->rank << 32 | (uint32_t)cur->prev);
        if (cur->next >= 0 && (p = pair(m, cur->id, sym[cur->next].id)))
            heap_push(heap, &hn, (uint64_t)p->rank << 32 | pos);
    }
}

/* HF's BPE::merge_word: characters -> symbols (with unk / byte fallback),
 * then merge_all; appends the resulting ids. */
static ds_error *merge_word(const ds_bpe *m, const char *w, size_t n, ds_bpe_scratch *s, ds_ids *out) {
    /* At most one symbol per byte (+ affix bytes under byte fallback). */
    size_t extra = (m->cont_prefix ? strlen(m->cont_prefix) : 0) + (m->end_suffix ? strlen(m->end_suffix) : 0);
    size_t need = n * (1 + extra) + 1;
    if (need > s->sym_cap) {
        free(s->sym);
        free(s->heap);
        s->sym = malloc(need * sizeof *s->sym);
        s->heap = malloc(3 * need * sizeof *s->heap);
        s->sym_cap = 0;
        if (!s->sym || !s->heap) return ds_errorf("out of memory tokenizing a word of %zu bytes", n);
        s->sym_cap = need;
    }
    struct ds_bpe_sym *sym = s->sym;
    size_t ns = 0;
    bool unk_pending = false;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        size_t cl = (size_t)ds_utf8_len((unsigned char)w[i]);
        if (cl > n - i) cl = n - i;
        const char *key = w + i;
        size_t kl = cl;
        if ((i > 0 && m->cont_prefix) || (i + cl == n && m->end_suffix)) {
            ds_buf_clear(&s->tmp);
            if (i > 0 && m->cont_prefix) ds_buf_append(&s->tmp, m->cont_prefix, strlen(m->cont_prefix));
            ds_buf_append(&s->tmp, w + i, cl);
            if (i + cl == n && m->end_suffix) ds_buf_append(&s->tmp, m->end_suffix, strlen(m->end_suffix));
            if (s->tmp.failed) return ds_errorf("out of memory");
            key = s->tmp.data;
            kl = s->tmp.len;
        }
        i += cl;
        int32_t id = ds_strtab_find(&m->vocab, key, kl);
        if (id >= 0) {
            if (unk_pending) add_sym(sym, &ns, m->unk_id, unk_len);
            unk_pending = false;
            add_sym(sym, &ns, id, (uint32_t)cl);
            continue;
        }
        if (m->byte_fallback) {
            bool all = true;
            for (size_t k = 0; k < kl && all; k++) all = m->byte_id[(unsigned char)key[k]] >= 0;
            if (all) {
                /* Like HF, a pending unk is not flushed before the bytes. */
                for (size_t k = 0; k < kl; k++) add_sym(sym, &ns, m->byte_id[(unsigned char)key[k]], 1);
                continue;
            }
        }
        if (!m->unk_token) continue; /* HF drops characters it cannot represent */
        if (m->unk_id < 0) return ds_errorf("model.unk_token \"%s\" is not in model.vocab", m->unk_token);
        if (unk_pending && m->fuse_unk) {
            unk_len += (uint32_t)cl;
        } else {
            if (unk_pending) add_sym(sym, &ns, m->unk_id, unk_len);
            unk_pending = true;
            unk_len = (uint32_t)cl;
        }
    }
    if (unk_pending) add_sym(sym, &ns, m->unk_id, unk_len);
    if (ns > 1) merge_all(m, sym, ns, s->heap);
    for (size_t i = 0; i < ns; i++)
        if (sym[i].len && !ds_ids_push(out, sym[i].id)) return ds_errorf("out of memory");
    return NULL;
}

/* Whether a cut before byte i of w (a split marker) is safe; see find_split_marker. */
static bool cut_ok(const ds_bpe *m, const char *w, size_t i) {
    size_t p = i - 1;
    while (p > 0 && ((unsigned char)w[p] & 0xC0) == 0x80) p--;
    uint32_t x;
    ds_utf8_next(w + p, &x);
    if (x == m->split_cp) return false;
    for (size_t j = 0; j < m->n_split_after_not; j++)
        if (m->split_after_not[j] == x) return false;
    return ds_strtab_find(&m->vocab, w + p, i - p) >= 0; /* x is an ordinary vocab character */
}

ds_error *ds_bpe_encode_word(const ds_bpe *m, const char *w, size_t n, ds_bpe_scratch *s, ds_ids *out) {
    if (n == 0) return NULL;
    if (n > UINT32_MAX / 4) return ds_errorf("word of %zu bytes is too long to tokenize", n);
    if (m->ignore_merges) {
        int32_t id = ds_strtab_find(&m->vocab, w, n);
        if (id >= 0) return ds_ids_push(out, id) ? NULL : ds_errorf("out of memory");
    }
    enum { CUT_ABOVE = 64 }; /* short words: not worth looking for cuts */
    if (n <= CUT_ABOVE || !m->split_cp) return merge_word(m, w, n, s, out);
    char mk[4];
    size_t mk_len = 0;
    {
        uint32_t c = m->split_cp; /* U+0120 or U+2581: 2 or 3 bytes */
        mk_len = c < 0x800 ? 2 : 3;
        if (mk_len == 2) {
            mk[0] = (char)(0xC0 | (c >> 6));
            mk[1] = (char)(0x80 | (c & 0x3F));
        } else {
            mk[0] = (char)(0xE0 | (c >> 12));
            mk[1] = (char)(0x80 | ((c >> 6) & 0x3F));
            mk[2] = (char)(0x80 | (c & 0x3F));
        }
    }
    size_t start = 0;
    for (const char *p = w; (p = memmem(p + 1, (size_t)(w + n - p - 1), mk, mk_len));) {
        size_t i = (size_t)(p - w);
        if (i - start < CUT_ABOVE / 2 || !cut_ok(m, w, i)) continue;
        DS_TRY(merge_word(m, w + start, i - start, s, out));
        start = i;
    }
    return merge_word(m, w + start, n - start, s, out);
}
