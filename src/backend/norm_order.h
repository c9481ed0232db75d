/* The order of a standalone RMSNorm's sum of squares, shared by the
 * backends so that both norm a row to the same bits: T threads, thread i
 * chaining elements i, i + T, ..., each warp's 32 sums butterflied, the
 * warps' totals added in order. T depends on the row's width alone (a
 * wide row, a whole hidden state, gets more threads: on the GPU a decode
 * step's norm is one block, bound by its own latency), so a row's bits
 * never depend on the rows beside it. The GPU launches T threads
 * (cuda/norm_rope.cu); the CPU's DS_X_BF16 norm emulates them
 * (cpu/cpu_norm.c). */
#ifndef DS_BACKEND_NORM_ORDER_H
#define DS_BACKEND_NORM_ORDER_H

#define DS_NORM_THREADS 128      /* rows narrower than DS_NORM_WIDE_DIM */
#define DS_NORM_WIDE_THREADS 512 /* rows of DS_NORM_WIDE_DIM and wider */
#define DS_NORM_WIDE_DIM 2048

static inline int ds_norm_threads(int dim) { return dim >= DS_NORM_WIDE_DIM ? DS_NORM_WIDE_THREADS : DS_NORM_THREADS; }

#endif
