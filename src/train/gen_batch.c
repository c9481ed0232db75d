#include "train/gen_batch.h"

#include <string.h>

ds_error *ds_gen_batch_open(ds_backend *be, const char *dir, int max_seqs, int ctx, ds_gen_batch *out) {
    memset(out, 0, sizeof *out);
    if (max_seqs < 1) return ds_errorf("batch %d: at least 1", max_seqs);
    int64_t row_bytes;
    int model_ctx;
    DS_TRY(ds_target_kv_shape(dir, &row_bytes, &model_ctx));
    if (ctx <= 0 || ctx > model_ctx) ctx = model_ctx;
    /* As the engine's batch_shape (api/engine.c) sizes it for no drafter: every sequence's whole context in
     * pages of 16 rows (nothing is preempted), a step of every decode row or a prefill chunk. */
    const int page = 16, pre = ds_backend_prefill_rows(be);
    const int64_t pages = (int64_t)max_seqs * (((int64_t)ctx + page) / page + 1);
    if (pages * page > 1 << 30) return ds_errorf("batch %d x context %d: too large a KV pool", max_seqs, ctx);
    const ds_batch_opts bo = {.max_seqs = max_seqs, .step_rows = max_seqs > pre ? max_seqs : pre, .page_rows = page,
                              .n_pages = (int)pages, .schedule = DS_SCHEDULE_FIXED};
    const ds_target_opts to = {.max_rows = bo.step_rows, .max_logit_rows = bo.step_rows,
                               .cache_rows = bo.n_pages * page, .max_ctx = ctx};
    DS_TRY(ds_target_open(be, dir, &to, &out->t));
    ds_error *e = ds_batch_new(out->t, NULL, &bo, &out->b);
    if (e) {
        ds_gen_batch_close(out);
        return e;
    }
    out->max_seqs = max_seqs;
    return NULL;
}

void ds_gen_batch_close(ds_gen_batch *g) {
    ds_batch_free(g->b);
    ds_target_free(g->t);
    memset(g, 0, sizeof *g);
}
