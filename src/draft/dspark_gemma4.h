/* The Gemma4DSparkModel drafter (dspark_gemma4.c). */
#ifndef DS_DSPARK_GEMMA4_H
#define DS_DSPARK_GEMMA4_H

#include "draft/drafter.h"

/* A drafter constructor (drafter_archs.c): takes ownership of ck only on success. */
ds_error *ds_dspark_gemma4_open(ds_backend *be, ds_checkpoint *ck, const ds_target *target,
                                const ds_drafter_opts *opts, ds_drafter **out);
/* Bytes a cached context position takes in its layers' K/V (config.json cfg; where: its directory). */
ds_error *ds_dspark_gemma4_kv_row_bytes(const cJSON *cfg, const char *where, int64_t *out);

#endif
