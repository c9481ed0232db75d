/* The two lookups the tokenizer does in its hot loops, as small
 * open-addressing tables (linear probing, power-of-two capacity, sized once
 * at load so they never rehash):
 *   ds_strtab  - id <-> string table (a vocab): strings live in one arena,
 *                the hash index stores (hash, id) and compares via the arena.
 *   ds_pairmap - 64-bit key -> (rank, id): BPE merges keyed by the pair of
 *                ids, also the edges of the added-token trie. */
#ifndef DS_TOK_HASHMAP_H
#define DS_TOK_HASHMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dspark.h"

uint64_t ds_hash_bytes(const void *p, size_t n);

typedef struct {
    uint32_t hash; /* low 32 bits of the string hash */
    int32_t id;    /* -1: empty slot */
    uint32_t off, len; /* the string, copied here so a probe touches one line */
} ds_strtab_slot;

typedef struct {
    char *arena; /* all strings, each NUL-terminated */
    size_t arena_len, arena_cap;
    uint32_t *off;   /* per id: offset in arena, UINT32_MAX = no string */
    uint32_t *len;   /* per id: byte length */
    size_t n_ids;    /* ids are 0..n_ids-1 */
    ds_strtab_slot *slots;
    size_t mask;     /* capacity - 1 */
    size_t n_strings;
} ds_strtab;

/* Room for ids [0, n_ids), up to max_strings set() calls and arena_bytes
 * bytes of string data (NULs excluded). */
ds_error *ds_strtab_init(ds_strtab *t, size_t n_ids, size_t max_strings, size_t arena_bytes);
/* Gives id the string s[0..n); a later set of the same string wins lookups. */
void ds_strtab_set(ds_strtab *t, int32_t id, const char *s, size_t n);
/* Hint that s is about to be set or looked up (hides a cache miss). */
void ds_strtab_prefetch(const ds_strtab *t, const char *s, size_t n);
/* Id of the string, or -1. */
int32_t ds_strtab_find(const ds_strtab *t, const char *s, size_t n);
/* find() for many keys at once: overlaps the cache misses of independent
 * lookups (prefetching slot, then string), which is what loading a
 * 500k-merge file is bound by. */
void ds_strtab_find_many(const ds_strtab *t, const char *const *keys, const uint32_t *lens, size_t n, int32_t *ids);
/* String of id (NUL-terminated), or NULL if id has none. */
const char *ds_strtab_get(const ds_strtab *t, int32_t id, size_t *n);
void ds_strtab_free(ds_strtab *t);

typedef struct {
    uint64_t key; /* UINT64_MAX: empty slot */
    uint32_t rank;
    int32_t id;
} ds_pairmap_slot;

typedef struct {
    ds_pairmap_slot *slots;
    size_t mask, n, max_n;
} ds_pairmap;

ds_error *ds_pairmap_init(ds_pairmap *m, size_t max_entries);
/* Inserts or overwrites; false if the map is full (more than max_entries). */
bool ds_pairmap_put(ds_pairmap *m, uint64_t key, uint32_t rank, int32_t id);
static inline uint64_t ds_pairmap_mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}
static inline const ds_pairmap_slot *ds_pairmap_get(const ds_pairmap *m, uint64_t key) {
    if (!m->slots) return NULL;
    size_t i = (size_t)ds_pairmap_mix(key) & m->mask;
    for (;;) {
        const ds_pairmap_slot *s = &m->slots[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
        i = (i + 1) & m->mask;
    }
}
void ds_pairmap_free(ds_pairmap *m);

#endif
