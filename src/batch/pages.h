/* The batched engine's KV memory: a pool of fixed-size pages shared by
 * every sequence, and each sequence's list of pages (its block table).
 * Position p of a sequence lives in row p % page_rows of its page p /
 * page_rows (backend.h ds_kv_pages). Host bookkeeping only: the caches
 * themselves are the models' K/V tensors, sized pages x page_rows. */
#ifndef DS_PAGES_H
#define DS_PAGES_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

typedef struct {
    int n_pages, page_rows;
    int32_t *free; /* a stack of free page ids: the lowest ids are handed out first */
    int n_free;
} ds_page_pool;

typedef struct {
    int32_t *pages;
    int n, cap;
} ds_page_list;

ds_error *ds_page_pool_init(ds_page_pool *p, int n_pages, int page_rows);
void ds_page_pool_free(ds_page_pool *p);
/* Pages needed to hold positions 0..rows-1. */
static inline int ds_pages_for(const ds_page_pool *p, int rows) { return (rows + p->page_rows - 1) / p->page_rows; }
/* Grows l to hold positions 0..rows-1: true, or false with l unchanged when
 * the pool has too few free pages (the caller preempts or waits). */
bool ds_page_list_reserve(ds_page_pool *p, ds_page_list *l, int rows);
/* Returns the pages past those holding positions 0..rows-1 to the pool. */
void ds_page_list_trim(ds_page_pool *p, ds_page_list *l, int rows);
/* Returns every page and the list's memory. */
void ds_page_list_release(ds_page_pool *p, ds_page_list *l);

#endif
