/* The Qwen3DSparkModel drafter (dspark_qwen3.c). */
#ifndef DS_DSPARK_QWEN3_H
#define DS_DSPARK_QWEN3_H

#include "draft/drafter.h"

/* A drafter constructor (drafter_archs.c): takes ownership of ck only on success. */
ds_error *ds_dspark_qwen3_open(ds_backend *be, ds_checkpoint *ck, const ds_target *target, const ds_drafter_opts *opts,
                               ds_drafter **out);

#endif
