/* Which checkpoint weights are affine-quantized (MLX's format,
 * base/affine_quant.h) and with what: the `quantization` block of
 * config.json ({"group_size", "bits"} and, as mlx-lm writes for mixed
 * recipes, per-module entries keyed by the weight's path without
 * ".weight": an object overriding both, or false for a module left
 * unquantized), and a weight's `.scales` / `.biases` siblings. Every
 * inconsistency is an error naming the directory, tensor and field. */
#ifndef DS_QUANT_CHECKPOINT_H
#define DS_QUANT_CHECKPOINT_H

#include <stdbool.h>

#include "io/checkpoint.h"

typedef struct {
    const ds_st_tensor *w, *scales, *biases; /* w NULL: the weight is stored plain */
    int bits, group;
} ds_quant_src;

/* The layout (bits, group size) config.json gives module `path` (the
 * weight's full name without ".weight"): *quantized false when there is no
 * quantization block or the module is excluded. */
ds_error *ds_quant_config_for(const cJSON *config, const char *where, const char *path, bool *quantized, int *bits,
                              int *group);

/* The quantization of weight `name` (looked up with the checkpoint's
 * prefix) of logical shape [rows, cols]: out->w NULL when it is stored
 * plain (then ds_checkpoint_tensor checks it), else its packed words,
 * scales and biases, validated against each other and config.json. */
ds_error *ds_checkpoint_quant(const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                              ds_quant_src *out);

/* The whole weight dequantized to fp32 on the host ([rows, cols], malloc'd). */
ds_error *ds_quant_dequantize(const ds_quant_src *q, int64_t rows, int64_t cols, float **out);

#endif
