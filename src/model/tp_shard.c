#include "model/tp_shard.h"

#include <stdlib.h>
#include <string.h>


void ds_shard_keep_free(ds_shard_keep *k) {
    for (int i = 0; i < k->n; i++) free(k->bufs[i]);
    free(k->bufs);
    *k = (ds_shard_keep){0};
}

static ds_error *keep_add(ds_shard_keep *k, void *p) {
    if (k->n == k->cap) {
        const int cap = k->cap ? 2 * k->cap : 64;
        void **b = realloc(k->bufs, (size_t)cap * sizeof *b);
        if (!b) return ds_errorf("out of memory");
        k->bufs = b, k->cap = cap;
    }
    k->bufs[k->n++] = p;
    return NULL;
}

/* A [rows, cols] checkpoint weight that is not quantized (quantized ones are not split yet). */
static ds_error *dense_tensor(const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                              const ds_st_tensor **t) {
    ds_quant_src q;
    DS_TRY(ds_checkpoint_quant(ck, name, rows, cols, &q));
    if (q.w) return ds_errorf("tensor %s: quantized weights are not split across ranks yet", name);
    const int64_t shape[2] = {rows, cols};
    return ds_checkpoint_tensor(ck, name, 2, shape, t);
}

ds_error *ds_load_weight_split(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                               ds_tp tp, ds_split split, ds_shard_keep *keep, ds_tensor *out) {
    const int64_t dim = split == DS_SPLIT_ROWS ? rows : cols;
    if (dim % tp.world)
        return ds_errorf("tensor %s: its %s (%lld) do not divide among %d ranks", name,
                         split == DS_SPLIT_ROWS ? "rows" : "columns", (long long)dim, tp.world);
    if (split == DS_SPLIT_ROWS) /* whole rows: a view into the mapping */
        return ds_load_weight_rows(be, ck, name, rows, cols, tp.rank * (rows / tp.world), rows / tp.world, out);
    const ds_st_tensor *t;
    DS_TRY(dense_tensor(ck, name, rows, cols, &t));
    const size_t es = ds_dtype_size(t->dtype);
    ds_st_tensor part = *t;
    const int64_t n = cols / tp.world;
    char *buf = malloc((size_t)(rows * n) * es);
    if (!buf) return ds_errorf("tensor %s: out of memory for rank %d's columns", name, tp.rank);
    for (int64_t r = 0; r < rows; r++)
        memcpy(buf + (size_t)(r * n) * es, (const char *)t->data + (size_t)(r * cols + tp.rank * n) * es, (size_t)n * es);
    part.data = buf;
    part.nbytes = (size_t)(rows * n) * es;
    part.shape[1] = n;
    ds_error *e = be->ops->weight(be, &part, rows, n, out);
    /* A backend that copied the shard (a GPU's) is done with the buffer; the CPU maps it: keep it. */
    if (e || out->data != buf) free(buf);
    else if ((e = keep_add(keep, buf))) {
        be->ops->release(be, out);
        free(buf);
    }
    return e;
}

ds_error *ds_load_weight_rows(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                              int64_t r0, int64_t n, ds_tensor *out) {
    if (r0 < 0 || n < 1 || r0 + n > rows) return ds_errorf("tensor %s: rows %lld..%lld of %lld", name, (long long)r0,
                                                          (long long)(r0 + n), (long long)rows);
    const ds_st_tensor *t;
    DS_TRY(dense_tensor(ck, name, rows, cols, &t));
    const size_t es = ds_dtype_size(t->dtype);
    ds_st_tensor part = *t;
    part.data = (const char *)t->data + (size_t)(r0 * cols) * es;
    part.nbytes = (size_t)(n * cols) * es;
    part.shape[0] = n;
    return be->ops->weight(be, &part, n, cols, out);
}

ds_error *ds_load_vector_range(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t len, int64_t i0,
                               int64_t n, ds_tensor *out) {
    if (i0 < 0 || n < 1 || i0 + n > len) return ds_errorf("tensor %s: values %lld..%lld of %lld", name, (long long)i0,
                                                         (long long)(i0 + n), (long long)len);
    const ds_st_tensor *t;
    DS_TRY(ds_checkpoint_tensor(ck, name, 1, &len, &t));
    ds_st_tensor part = *t;
    part.data = (const char *)t->data + (size_t)i0 * ds_dtype_size(t->dtype);
    part.nbytes = (size_t)n * ds_dtype_size(t->dtype);
    part.shape[0] = n;
    return be->ops->weight(be, &part, 1, n, out);
}

ds_error *ds_load_vector_split(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t n, ds_tp tp,
                               ds_tensor *out) {
    if (n % tp.world) return ds_errorf("tensor %s: its %lld values do not divide among %d ranks", name, (long long)n, tp.world);
    const ds_st_tensor *t;
    const int64_t shape[1] = {n};
    DS_TRY(ds_checkpoint_tensor(ck, name, 1, shape, &t));
    const int64_t m = n / tp.world;
    ds_st_tensor part = *t;
    part.data = (const char *)t->data + (size_t)(tp.rank * m) * ds_dtype_size(t->dtype);
    part.nbytes = (size_t)m * ds_dtype_size(t->dtype);
    part.shape[0] = m;
    return be->ops->weight(be, &part, 1, m, out);
}
