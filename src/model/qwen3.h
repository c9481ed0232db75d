/* The Qwen3ForCausalLM target (qwen3.c). */
#ifndef DS_QWEN3_H
#define DS_QWEN3_H

#include "model/target.h"

/* A target constructor (target.h): takes ownership of ck only on success. */
ds_error *ds_qwen3_open(ds_backend *be, ds_checkpoint *ck, const ds_target_opts *opts, ds_target **out);
/* Bytes a cached position takes in the caches ds_qwen3_open would allocate
 * for config.json cfg (where: its directory, for errors); nothing loaded. */
ds_error *ds_qwen3_kv_row_bytes_of(const cJSON *cfg, const char *where, int64_t *out, int *max_ctx);

#endif
