/* Seeded, reproducible random numbers (xoshiro256** seeded by splitmix64).
 * Each generation owns its generator: no global state. */
#ifndef DS_RNG_H
#define DS_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
} ds_rng;

void ds_rng_seed(ds_rng *r, uint64_t seed);
uint64_t ds_rng_next(ds_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double ds_rng_uniform(ds_rng *r);

#endif
