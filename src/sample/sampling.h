/* The sampling parameters. The same processing (temperature, top-k, top-p)
 * is applied to the target's and the drafter's logits, so that speculative
 * sampling reproduces exactly the target's processed distribution; the
 * backends' sampling ops, the drafters and the loop all take this struct,
 * so it sits at the bottom, below the backend. Temperatures below 1e-5 mean
 * greedy (one-hot argmax), as in the reference. */
#ifndef DS_SAMPLING_H
#define DS_SAMPLING_H

#include <stdbool.h>

typedef struct {
    float temperature; /* < 1e-5: greedy */
    int top_k;         /* 0: off */
    float top_p;       /* >= 1: off */
} ds_sampling;

static inline bool ds_sampling_greedy(const ds_sampling *s) { return s->temperature < 1e-5f; }

#endif
