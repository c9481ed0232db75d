/* The element type of every K/V cache the target and the drafter hold.
 * The caches' allocations (qwen3_layer.c, gemma4_layer.c) and the KV pool's
 * budget (ds_target_kv_row_bytes, ds_drafter_kv_row_bytes: bytes a cached
 * position takes, computed from config.json before anything is allocated)
 * both take it from the model's config struct (kv_dtype), which the config
 * readers fill through ds_kv_dtype_read, so a --kv-mem budget stays true
 * whatever the dtype.
 *
 * The rule: the cache holds K and V in the model's dtype, the one its
 * config.json names ("dtype", transformers >= 4.56, or "torch_dtype"; a
 * wrapper's top level first, then its text_config; none named: float32,
 * transformers' default). That is the dtype the reference runs the model
 * in, so its K/V are rounded there too; the config is read rather than the
 * weights so that the budget is known before the checkpoint is opened. A
 * quantized checkpoint's config names its scales' dtype (dspark quantize
 * writes the scales in the source's dtype and keeps its config; MLX does
 * the same): ds_quant's dtype, the dtype its weights stand for. bfloat16 ->
 * bf16 caches (half of fp32's bytes), float16 -> f16, float32 -> fp32 (the
 * test fixtures: their goldens are fp32 caches' values).
 *
 * Writers round each fp32 element to the cache dtype (round to nearest
 * even, base/dtype.h), readers widen it back to fp32 (exact); both per
 * element, so row invariance (backend.h) holds as with fp32 caches. */
#ifndef DS_KV_CACHE_H
#define DS_KV_CACHE_H

#include <stdint.h>

#include "base/error.h"
#include "base/dtype.h"
#include "io/config.h"

/* The cache dtype for a model whose dtype is model_dtype: bf16, f16 and
 * fp32 stay themselves; anything else (never a config's: ds_kv_dtype_read
 * refuses it) is fp32. */
static inline ds_dtype ds_kv_dtype(ds_dtype model_dtype) {
    return model_dtype == DS_BF16 || model_dtype == DS_F16 ? model_dtype : DS_F32;
}

/* *out = ds_kv_dtype(the model dtype cfg names), by the rule above; inner
 * (a wrapper's text_config, or NULL) is read where cfg names none. A dtype
 * other than float32, bfloat16 or float16 is an error naming the field. */
ds_error *ds_kv_dtype_read(const cJSON *cfg, const cJSON *inner, const char *where, ds_dtype *out);

/* More bytes a position than any real model's (Qwen3-8B: 144 KiB in bf16,
 * 288 KiB in fp32): a bogus config, refused before the pool's arithmetic
 * (pages x rows x bytes, in int64) could overflow. The row-bytes functions
 * stop counting past it. */
#define DS_KV_ROW_BYTES_MAX (INT64_C(1) << 30)

#endif
