/* Top-k / top-p truncation of a distribution, in place. */
#ifndef DS_TOP_KP_H
#define DS_TOP_KP_H

#include "sample/sampling.h"

/* Keeps the top_k most probable ids (top_k in (0, V): else all), then the
 * smallest prefix of them in rank order (descending probability, the lower
 * id first among equals) whose mass reaches top_p of what is kept (top_p in
 * (0, 1): else all; always at least one id), and renormalises what is left.
 * Does nothing when both are off. */
void ds_top_kp(float *probs, int V, const ds_sampling *s);

#endif
