/* Streaming safetensors writer: the header (dtype, shape, data offsets of
 * every tensor, 8-byte aligned) goes first, then each tensor's bytes in
 * order, produced block by block by a caller's fill function, so a file of
 * many gigabytes never has to sit in memory. */
#ifndef DS_SAFETENSORS_WRITE_H
#define DS_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/error.h"
#include "io/safetensors.h"

typedef struct {
    const char *name;
    ds_dtype dtype;
    int ndim;
    int64_t shape[DS_MAX_DIMS];
} ds_st_spec;

/* Bytes of the tensor's data (0 for a bad shape). */
size_t ds_st_spec_nbytes(const ds_st_spec *s);

/* Fills buf with bytes [offset, offset + nbytes) of tensor `index`; offset and
 * nbytes are multiples of the element size. */
typedef ds_error *(*ds_st_fill_fn)(void *user, size_t index, size_t offset, void *buf, size_t nbytes);

/* Writes path with the n tensors of specs, calling fill in blocks of at most
 * block_bytes (0: 64 MiB). Errors name the file (and tensor). */
ds_error *ds_safetensors_write(const char *path, const ds_st_spec *specs, size_t n, size_t block_bytes,
                               ds_st_fill_fn fill, void *user);

#endif
