/* libFuzzer harness: a safetensors file (8-byte header length, JSON header,
 * data section) through ds_safetensors_open, the loader every checkpoint
 * shard goes through. Input: the whole file. A file it accepts must keep
 * its promises: every tensor findable by its name, its bytes inside the
 * mapping and as many as shape and dtype say. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_file.h"
#include "io/safetensors.h"

static void check_accepted(const ds_safetensors *st) {
    const uint8_t *lo = st->map, *hi = lo + st->map_size;
    for (size_t i = 0; i < st->n_tensors; i++) {
        const ds_st_tensor *t = &st->tensors[i];
        uint64_t count = 1;
        for (int d = 0; d < t->ndim; d++) count *= (uint64_t)t->shape[d];
        const uint8_t *p = t->data;
        if (ds_safetensors_find(st, t->name) != t || t->ndim < 0 || t->ndim > DS_MAX_DIMS ||
            count * ds_dtype_size(t->dtype) != t->nbytes || (t->nbytes && (p < lo || p + t->nbytes > hi))) {
            fprintf(stderr, "fuzz_safetensors: accepted tensor %s breaks its promises\n", t->name);
            abort();
        }
        /* Touch the first and last byte: a range the checks let through
         * outside the mapping faults here. */
        volatile uint8_t sink = 0;
        if (t->nbytes) sink ^= p[0] ^ p[t->nbytes - 1];
        (void)sink;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = ds_fuzz_file("model.safetensors", data, size);
    ds_safetensors *st = NULL;
    ds_error *e = ds_safetensors_open(path, &st);
    if (e) {
        if (st) abort(); /* an error leaves no half-open file behind */
        ds_fuzz_consume(e);
        return 0;
    }
    check_accepted(st);
    ds_safetensors_close(st);
    return 0;
}
