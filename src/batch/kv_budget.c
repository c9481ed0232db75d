/* KV pool bytes and the pages a budget buys (kv_budget.h). */
#include "batch/kv_budget.h"

/* The drafter's rows that do not grow with the pages: every sequence's block. */
static int64_t block_rows(const ds_batch_opts *o, int gamma) {
    ds_batch_opts none = *o;
    none.n_pages = 0;
    return ds_batch_drafter_rows(&none, gamma);
}

int64_t ds_kv_pool_bytes(const ds_batch_opts *o, int gamma, int64_t target_row, int64_t drafter_row) {
    const int64_t page_bytes = (int64_t)o->page_rows * (target_row + drafter_row);
    return o->n_pages * page_bytes + (drafter_row ? block_rows(o, gamma) * drafter_row : 0);
}

int64_t ds_kv_pool_pages(const ds_batch_opts *o, int gamma, int64_t budget, int64_t target_row, int64_t drafter_row) {
    const int64_t fixed = drafter_row ? block_rows(o, gamma) * drafter_row : 0;
    const int64_t page_bytes = (int64_t)o->page_rows * (target_row + drafter_row);
    return budget > fixed && page_bytes > 0 ? (budget - fixed) / page_bytes : 0;
}

ds_error *ds_kv_pool_fit(ds_batch_opts *o, int gamma, int64_t budget, int64_t target_row, int64_t drafter_row,
                         int64_t min_pages, int64_t max_pages) {
    const int64_t got = ds_kv_pool_pages(o, gamma, budget, target_row, drafter_row);
    if (got < min_pages) {
        ds_batch_opts one = *o;
        one.n_pages = (int)min_pages;
        return ds_errorf("%lld bytes cannot hold one request (%lld pages of %d rows), which needs %lld bytes (%lld a "
                         "position: target %lld + drafter %lld, and the drafter's block rows for %d sequences)",
                         (long long)budget, (long long)min_pages, o->page_rows,
                         (long long)ds_kv_pool_bytes(&one, gamma, target_row, drafter_row),
                         (long long)(target_row + drafter_row), (long long)target_row, (long long)drafter_row,
                         o->max_seqs);
    }
    o->n_pages = (int)(got < max_pages ? got : max_pages);
    return NULL;
}
