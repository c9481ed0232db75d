/* A Hugging Face model directory: config.json plus one safetensors file or
 * a sharded set listed by model.safetensors.index.json. Tensors are looked
 * up by name with their expected shape checked. */
#ifndef DS_CHECKPOINT_H
#define DS_CHECKPOINT_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>

#include "io/safetensors.h"

typedef struct {
    char *dir;
    cJSON *config;         /* parsed config.json */
    cJSON *generation;     /* generation_config.json, or NULL */
    ds_safetensors **shards;
    size_t n_shards;
    const char *name_prefix; /* prepended to every lookup, e.g. "model.language_model." */
} ds_checkpoint;

ds_error *ds_checkpoint_open(const char *dir, ds_checkpoint **out);
void ds_checkpoint_close(ds_checkpoint *ck);

/* Looks up name (with the checkpoint's prefix) and checks its shape:
 * `ndim` dims given in `shape`. Error names the tensor and both shapes. */
ds_error *ds_checkpoint_tensor(const ds_checkpoint *ck, const char *name, int ndim, const int64_t *shape,
                               const ds_st_tensor **out);
/* NULL when absent (for optional tensors). */
const ds_st_tensor *ds_checkpoint_find(const ds_checkpoint *ck, const char *name);

/* "dir/name", malloc'd (NULL when out of memory). */
char *ds_path_join(const char *dir, const char *name);
bool ds_path_exists(const char *path);
/* Reads a whole file into a NUL-terminated buffer. */
ds_error *ds_read_file(const char *path, char **out, size_t *len);
/* The same, refusing a file of more than max_bytes (before reading it). */
ds_error *ds_read_file_max(const char *path, size_t max_bytes, char **out, size_t *len);
/* Reads f to its end (standard input for "-" arguments) into a
 * NUL-terminated buffer; name is what errors call it. */
ds_error *ds_read_stream(FILE *f, const char *name, char **out, size_t *len);
/* Parses a JSON file. */
ds_error *ds_read_json(const char *path, cJSON **out);

#endif
