/* safetensors files, read by mmap and validated before any tensor is used:
 * header length within the file, JSON well formed, known dtypes, byte counts
 * that match the shapes, data ranges inside the file and not overlapping. */
#ifndef DS_SAFETENSORS_H
#define DS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/dtype.h"

#define DS_MAX_DIMS 8

typedef struct {
    char *name;
    ds_dtype dtype;
    int ndim;
    int64_t shape[DS_MAX_DIMS];
    const void *data; /* points into the mapping */
    size_t nbytes;
} ds_st_tensor;

typedef struct ds_safetensors {
    char *path;
    void *map;
    size_t map_size;
    ds_st_tensor *tensors;
    size_t n_tensors;
} ds_safetensors;

ds_error *ds_safetensors_open(const char *path, ds_safetensors **out);
void ds_safetensors_close(ds_safetensors *st);
/* NULL when absent. */
const ds_st_tensor *ds_safetensors_find(const ds_safetensors *st, const char *name);

#endif
