/* A model directory's identity, cheap enough to take at every open of a
 * training cache: which target a cache was made with. A cache keeps the
 * identity of its target so that a trainer handed another model (or the same
 * architecture with other weights) is told so instead of learning from
 * hidden states that model never produces. */
#ifndef DS_MODEL_IDENTITY_H
#define DS_MODEL_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

/* FNV-1a, 64 bits, continued from h (start with DS_FNV64_INIT). */
#define DS_FNV64_INIT 0xcbf29ce484222325ull
uint64_t ds_fnv64(uint64_t h, const void *p, size_t n);

typedef struct {
    uint64_t config;  /* config.json's bytes */
    uint64_t weights; /* every *.safetensors file (sorted by name): its name, its size, and up to 1 MiB read at
                         its start, middle and end. Different training runs of one architecture differ there
                         (the header alone would not tell them apart); reading 3 MiB a file keeps it cheap
                         for a multi-GB checkpoint */
} ds_model_identity;

/* Errors name the directory or file (missing config.json, unreadable weights). */
ds_error *ds_model_identity_of(const char *dir, ds_model_identity *out);
/* "%016llx" forms, for manifests. */
void ds_model_identity_hex(uint64_t v, char out[17]);

#endif
