/* The processed distribution of a row of logits: softmax(logits / T), then
 * top-k / top-p (top_kp.h); greedy (T < 1e-5) is the one-hot argmax. The
 * backends' probs ops follow it bit for bit. */
#ifndef DS_PROBS_H
#define DS_PROBS_H

#include <stdint.h>

#include "sample/sampling.h"

/* Index of the largest value; ties go to the lowest index. */
int32_t ds_argmax(const float *x, int n);
/* probs[V] = processed distribution of logits[V]. */
void ds_probs_from_logits(const float *logits, int V, const ds_sampling *s, float *probs);

#endif
