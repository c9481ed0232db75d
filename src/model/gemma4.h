/* The Gemma 4 text target (gemma4.c): Gemma4ForCausalLM and the text model
 * of the multimodal wrappers (gemma4_layout.h). */
#ifndef DS_GEMMA4_H
#define DS_GEMMA4_H

#include "model/target.h"

/* A target constructor (target.h): takes ownership of ck only on success. */
ds_error *ds_gemma4_open(ds_backend *be, ds_checkpoint *ck, const ds_target_opts *opts, ds_target **out);
/* Bytes a cached position takes in the caches ds_gemma4_open would allocate
 * as a pool of pages (no rings; KV-shared layers hold none) for config.json
 * cfg in any of the layouts (where: its directory, for errors); nothing loaded. */
ds_error *ds_gemma4_kv_row_bytes_of(const cJSON *cfg, const char *where, int64_t *out, int *max_ctx);

#endif
