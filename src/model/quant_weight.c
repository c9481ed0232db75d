/* Quantized weights into backend tensors: kept quantized where the backend
 * multiplies them so (weight_quant), dequantized to fp32 for the few
 * weights whose ops read values directly (ds_load_weight_dense). */
#include <stdlib.h>

#include "io/quant_checkpoint.h"
#include "model/qwen3_layer.h"

ds_error *ds_load_quant_weight(ds_backend *be, const ds_checkpoint *ck, const ds_quant_src *q, int64_t rows,
                               int64_t cols, ds_tensor *out) {
    if (!be->ops->weight_quant)
        return ds_errorf("%s: tensor %s is quantized (%d-bit, group %d) and backend %s has no quantized weights", ck->dir,
                         q->w->name, q->bits, q->group, be->ops->name);
    ds_error *e = be->ops->weight_quant(be, q, rows, cols, out);
    return e ? ds_error_wrap(e, "%s", ck->dir) : NULL;
}

ds_error *ds_load_weight_dense(ds_backend *be, const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                               ds_tensor *out) {
    ds_quant_src q;
    DS_TRY(ds_checkpoint_quant(ck, name, rows, cols, &q));
    if (!q.w) return ds_load_weight(be, ck, name, rows, cols, out);
    float *host;
    DS_TRY(ds_quant_dequantize(&q, rows, cols, &host));
    ds_error *e = be->ops->alloc(be, DS_F32, rows, cols, out);
    if (!e) be->ops->upload(be, *out, host);
    free(host);
    return e;
}
