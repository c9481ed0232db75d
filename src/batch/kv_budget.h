/* The batched engine's KV pool in bytes, and the pages a byte budget buys
 * (--kv-mem). The pool is the target's caches, n_pages x page_rows rows,
 * and the drafter's, ds_batch_drafter_rows (as many pages, plus room for
 * every sequence's block); a row costs the bytes one position takes in
 * that model's K/V over all its layers (ds_target_kv_row_bytes,
 * ds_drafter_kv_row_bytes). Arithmetic only: nothing is allocated. */
#ifndef DS_KV_BUDGET_H
#define DS_KV_BUDGET_H

#include <stdint.h>

#include "batch/batch.h"

/* Bytes of both pools for o (o->n_pages pages; gamma: the block the
 * drafter's pool is sized for; drafter_row 0: no drafter). */
int64_t ds_kv_pool_bytes(const ds_batch_opts *o, int gamma, int64_t target_row, int64_t drafter_row);
/* The most pages whose pools (ds_kv_pool_bytes) fit in budget bytes: 0
 * when not even the drafter's block rows do. */
int64_t ds_kv_pool_pages(const ds_batch_opts *o, int gamma, int64_t budget, int64_t target_row, int64_t drafter_row);
/* Sets o->n_pages to what budget buys (ds_kv_pool_pages), at most
 * max_pages (more than the requests in flight can ever use). Fewer than
 * min_pages (one request's) is an error naming the budget and the bytes
 * one request needs; o is then unchanged. */
ds_error *ds_kv_pool_fit(ds_batch_opts *o, int gamma, int64_t budget, int64_t target_row, int64_t drafter_row,
                         int64_t min_pages, int64_t max_pages);

#endif
