/* Index of the largest of n floats, at vector speed. */
#ifndef DS_ARGMAX_H
#define DS_ARGMAX_H

#include <stdint.h>

/* The same index as one left-to-right pass that moves to a strictly larger
 * value: ties go to the lowest index (as torch.argmax), a NaN never wins,
 * and a NaN in x[0] gives 0. n <= 0 gives 0. */
int64_t ds_argmax_f32(const float *x, int64_t n);

#endif
