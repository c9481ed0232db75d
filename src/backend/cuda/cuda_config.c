/* The CUDA backend's switches from the environment (cuda_config.h). Plain C
 * and in every build, so that a CPU-only build parses them the same way. */
#include "backend/cuda/cuda_config.h"

#include <stdlib.h>
#include <string.h>

ds_cuda_config ds_cuda_config_default(void) {
    return (ds_cuda_config){
        .graphs = true,
        .profile = false,
        .ring_trace = "",
        .ring = true,
        .ring_min_tiles = -1,
        .ring_boxes = DS_CU_BOXES_AUTO,
        .head_bound = true,
        .quant = true,
        .markov_fused = -1,
        .fused_attn_min_rows = DS_CU_ATT_FUSED_MIN_ROWS,
        .att_pack_min_blocks = DS_CU_ATT_PACK_MIN_BLOCKS,
        .narrow_rows = 32,
    };
}

/* Set and not "0". */
static bool env_true(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0");
}

/* Unset or anything but "0". */
static bool env_not_zero(const char *name) {
    const char *v = getenv(name);
    return !(v && !strcmp(v, "0"));
}

ds_error *ds_cuda_config_from_env(ds_cuda_config *out) {
    ds_cuda_config c = ds_cuda_config_default();
    const char *v;
    c.graphs = env_not_zero("DS_CUDA_GRAPHS");
    c.profile = env_true("DS_CUDA_PROFILE");
    if ((v = getenv("DS_CUDA_RING_TRACE")) && *v) {
        if (strlen(v) >= sizeof c.ring_trace)
            return ds_errorf("DS_CUDA_RING_TRACE: the path is longer than %zu bytes", sizeof c.ring_trace - 1);
        strcpy(c.ring_trace, v);
    }
    c.ring = env_not_zero("DS_CUDA_RING");
    if ((v = getenv("DS_CUDA_RING_BOXES")) && *v && strcmp(v, "auto")) {
        if (!strcmp(v, "1")) c.ring_boxes = DS_CU_BOXES_ALWAYS;
        else if (!strcmp(v, "0")) c.ring_boxes = DS_CU_BOXES_NEVER;
        else return ds_errorf("cuda backend: DS_CUDA_RING_BOXES must be auto, 0 or 1, not '%s'", v);
    }
    c.head_bound = env_not_zero("DS_CUDA_HEAD_BOUND");
    if ((v = getenv("DS_CUDA_MARKOV_FUSED"))) c.markov_fused = strcmp(v, "0") != 0;
    c.invariant = env_true("DS_CUDA_INVARIANT");
    c.quant = env_not_zero("DS_CUDA_QUANT");
    *out = c;
    return NULL;
}
