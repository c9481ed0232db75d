#include "tokenizer/hashmap.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* A multiply-rotate hash over 8-byte words: cheap for the short strings of
 * a vocab, and good enough spread for linear probing. */
uint64_t ds_hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xC2B2AE3D27D4EB4FULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ (w * 0x87C37B91114253D5ULL)) * 0x4CF5AD432745937FULL;
        h = (h << 31) | (h >> 33);
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ (w * 0x87C37B91114253D5ULL)) * 0x4CF5AD432745937FULL;
    return ds_pairmap_mix(h);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

ds_error *ds_strtab_init(ds_strtab *t, size_t n_ids, size_t max_strings, size_t arena_bytes) {
    memset(t, 0, sizeof *t);
    if (arena_bytes + max_strings >= UINT32_MAX || n_ids > INT32_MAX)
        return ds_errorf("vocab too large (%zu ids, %zu bytes of strings)", n_ids, arena_bytes);
    size_t cap = pow2_at_least(max_strings + max_strings / 2 + 1);
    t->n_ids = n_ids;
    t->arena_cap = arena_bytes + max_strings + 1;
    t->arena = malloc(t->arena_cap);
    t->off = malloc((n_ids ? n_ids : 1) * sizeof *t->off);
    t->len = calloc(n_ids ? n_ids : 1, sizeof *t->len);
    t->slots = malloc(cap * sizeof *t->slots);
    if (!t->arena || !t->off || !t->len || !t->slots) {
        ds_strtab_free(t);
        return ds_errorf("out of memory for a vocab of %zu tokens", n_ids);
    }
    memset(t->off, 0xFF, (n_ids ? n_ids : 1) * sizeof *t->off);
    for (size_t i = 0; i < cap; i++) t->slots[i].id = -1;
    t->mask = cap - 1;
    return NULL;
}

static inline bool same(const ds_strtab *t, const ds_strtab_slot *sl, const char *s, size_t n) {
    if (sl->len != n) return false;
    const char *a = t->arena + sl->off;
    if (n <= 8) { /* most tokens: skip the library call */
        for (size_t i = 0; i < n; i++)
            if (a[i] != s[i]) return false;
        return true;
    }
    return memcmp(a, s, n) == 0;
}

void ds_strtab_prefetch(const ds_strtab *t, const char *s, size_t n) {
    __builtin_prefetch(&t->slots[(size_t)ds_hash_bytes(s, n) & t->mask], 1);
}

void ds_strtab_set(ds_strtab *t, int32_t id, const char *s, size_t n) {
    /* Callers size the table from the same data they insert, so running out
     * of room here is a programming error; ignore rather than overflow. */
    if (id < 0 || (size_t)id >= t->n_ids || t->arena_len + n + 1 > t->arena_cap ||
        t->n_strings + 1 > (t->mask + 1) / 3 * 2)
        return;
    uint64_t h = ds_hash_bytes(s, n);
    t->off[id] = (uint32_t)t->arena_len;
    t->len[id] = (uint32_t)n;
    memcpy(t->arena + t->arena_len, s, n);
    t->arena[t->arena_len + n] = 0;
    t->arena_len += n + 1;
    size_t i = (size_t)h & t->mask;
    for (;;) {
        ds_strtab_slot *sl = &t->slots[i];
        if (sl->id < 0) {
            *sl = (ds_strtab_slot){(uint32_t)h, id, t->off[id], (uint32_t)n};
            t->n_strings++;
            return;
        }
        /* The same string under another id: the later one wins (JSON
         * objects with duplicate keys behave so in HF). */
        if (sl->hash == (uint32_t)h && same(t, sl, s, n)) {
            *sl = (ds_strtab_slot){(uint32_t)h, id, t->off[id], (uint32_t)n};
            return;
        }
        i = (i + 1) & t->mask;
    }
}

int32_t ds_strtab_find(const ds_strtab *t, const char *s, size_t n) {
    if (!t->slots) return -1;
    uint64_t h = ds_hash_bytes(s, n);
    size_t i = (size_t)h & t->mask;
    for (;;) {
        const ds_strtab_slot *sl = &t->slots[i];
        if (sl->id < 0) return -1;
        /* (an id given two strings answers to both, like HF's vocab map) */
        if (sl->hash == (uint32_t)h && same(t, sl, s, n)) return sl->id;
        i = (i + 1) & t->mask;
    }
}

void ds_strtab_find_many(const ds_strtab *t, const char *const *keys, const uint32_t *lens, size_t n, int32_t *ids) {
    enum { GROUP = 64 };
    uint64_t h[GROUP];
    for (size_t base = 0; base < n; base += GROUP) {
        size_t m = n - base < GROUP ? n - base : GROUP;
        for (size_t k = 0; k < m; k++) {
            h[k] = ds_hash_bytes(keys[base + k], lens[base + k]);
            __builtin_prefetch(&t->slots[(size_t)h[k] & t->mask]);
        }
        for (size_t k = 0; k < m; k++) {
            const ds_strtab_slot *sl = &t->slots[(size_t)h[k] & t->mask];
            if (sl->id >= 0 && sl->hash == (uint32_t)h[k]) __builtin_prefetch(t->arena + sl->off);
        }
        for (size_t k = 0; k < m; k++) {
            const char *s = keys[base + k];
            size_t len = lens[base + k], i = (size_t)h[k] & t->mask;
            int32_t id = -1;
            for (;;) {
                const ds_strtab_slot *sl = &t->slots[i];
                if (sl->id < 0) break;
                if (sl->hash == (uint32_t)h[k] && same(t, sl, s, len)) {
                    id = sl->id;
                    break;
                }
                i = (i + 1) & t->mask;
            }
            ids[base + k] = id;
        }
    }
}

const char *ds_strtab_get(const ds_strtab *t, int32_t id, size_t *n) {
    if (id < 0 || (size_t)id >= t->n_ids || t->off[id] == UINT32_MAX) return NULL;
    if (n) *n = t->len[id];
    return t->arena + t->off[id];
}

void ds_strtab_free(ds_strtab *t) {
    free(t->arena);
    free(t->off);
    free(t->len);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

ds_error *ds_pairmap_init(ds_pairmap *m, size_t max_entries) {
    memset(m, 0, sizeof *m);
    size_t cap = pow2_at_least(max_entries + max_entries / 2 + 1);
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return ds_errorf("out of memory for a table of %zu entries", max_entries);
    for (size_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
    m->max_n = max_entries;
    return NULL;
}

bool ds_pairmap_put(ds_pairmap *m, uint64_t key, uint32_t rank, int32_t id) {
    size_t i = (size_t)ds_pairmap_mix(key) & m->mask;
    for (;;) {
        ds_pairmap_slot *s = &m->slots[i];
        if (s->key == key) {
            s->rank = rank;
            s->id = id;
            return true;
        }
        if (s->key == UINT64_MAX) {
            if (m->n >= m->max_n) return false;
            s->key = key;
            s->rank = rank;
            s->id = id;
            m->n++;
            return true;
        }
        i = (i + 1) & m->mask;
    }
}

void ds_pairmap_free(ds_pairmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}
