#include "batch/pages.h"

#include <stdlib.h>

ds_error *ds_page_pool_init(ds_page_pool *p, int n_pages, int page_rows) {
    *p = (ds_page_pool){0};
    if (n_pages < 1 || page_rows < 1) return ds_errorf("KV pool of %d pages of %d rows", n_pages, page_rows);
    p->free = malloc((size_t)n_pages * sizeof *p->free);
    if (!p->free) return ds_errorf("out of memory for a KV pool of %d pages", n_pages);
    p->n_pages = p->n_free = n_pages;
    p->page_rows = page_rows;
    for (int i = 0; i < n_pages; i++) p->free[i] = n_pages - 1 - i; /* page 0 on top */
    return NULL;
}

void ds_page_pool_free(ds_page_pool *p) {
    free(p->free);
    *p = (ds_page_pool){0};
}

bool ds_page_list_reserve(ds_page_pool *p, ds_page_list *l, int rows) {
    const int need = ds_pages_for(p, rows) - l->n;
    if (need <= 0) return true;
    if (need > p->n_free) return false;
    if (l->n + need > l->cap) {
        int cap = l->cap ? l->cap : 8;
        while (cap < l->n + need) cap *= 2;
        int32_t *a = realloc(l->pages, (size_t)cap * sizeof *a);
        if (!a) return false;
        l->pages = a;
        l->cap = cap;
    }
    for (int i = 0; i < need; i++) l->pages[l->n++] = p->free[--p->n_free];
    return true;
}

void ds_page_list_trim(ds_page_pool *p, ds_page_list *l, int rows) {
    const int keep = ds_pages_for(p, rows > 0 ? rows : 0);
    while (l->n > keep) p->free[p->n_free++] = l->pages[--l->n];
}

void ds_page_list_release(ds_page_pool *p, ds_page_list *l) {
    ds_page_list_trim(p, l, 0);
    free(l->pages);
    *l = (ds_page_list){0};
}
