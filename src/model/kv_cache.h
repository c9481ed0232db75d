/* The element type of every K/V cache the target and the drafter hold.
 * The caches' allocations (qwen3_layer.c, gemma4_layer.c) and the KV pool's
 * budget (ds_target_kv_row_bytes, ds_drafter_kv_row_bytes: bytes a cached
 * position takes, computed from config.json before anything is allocated)
 * both read it here, so a --kv-mem budget stays true when the caches change
 * dtype (fp32 today; the backends' attention reads fp32 caches). */
#ifndef DS_KV_CACHE_H
#define DS_KV_CACHE_H

#include <stdint.h>

#include "base/dtype.h"

#define DS_KV_DTYPE DS_F32
/* More bytes a position than any real model's (Qwen3-8B: 288 KiB in fp32):
 * a bogus config, refused before the pool's arithmetic (pages x rows x
 * bytes, in int64) could overflow. The row-bytes functions stop counting
 * past it. */
#define DS_KV_ROW_BYTES_MAX (INT64_C(1) << 30)

#endif
