/* An exact bound of the LM head for greedy drafting (head_bound.cu), and
 * the exact logits of the rows it leaves in contention (used by the Markov
 * walk, markov.cu).
 *
 * A greedy draft needs, at each block position, only the argmax of the
 * corrected logits, yet the LM head streams the whole [V, H] weight (1.24
 * GB at the Qwen3-8B shape, a quarter of a draft round). So the backend
 * keeps an int8 copy of the head (one scale a row: w[n] = s[n] q[n] + e[n])
 * and, per drafted row x, computes a[n] = s[n] q[n] . x~ from half the
 * bytes, with an interval that provably holds the exact logit:
 *     |raw[n] - a[n]| <= |e[n]| |x~| + (|w[n]| + |e[n]|) (|x~ - x16| +
 *                        g (|x~| + |x~ - x16|)) + g |w[n]| |x~| + |a| 2^-22
 * (Cauchy-Schwarz on the quantization error; x~ the x the exact product
 * uses, bf16(x) or its hi + lo split; x16 the fp16 copy the tensor cores
 * take, scaled by a power of two; g = (K + 64) 2^-22 covers the fp32
 * accumulation of either product, the tensor cores' included). The walk
 * then computes exactly (the bits of the full LM head: the same mma
 * fragments and order as matmul_mma_frag.cuh) only the rows whose upper
 * bound reaches a lower bound of the best, so its tokens are the full
 * head's. */
#ifndef DS_CUDA_HEAD_BOUND_H
#define DS_CUDA_HEAD_BOUND_H

#include "backend/cuda/cuda_internal.h"

/* The quantized head (one per backend: the drafter's), made at first use
 * outside a recording; q: q + 128, [V, K] bytes in the bounds kernel's
 * tiles (head_q_offset), the last tile padded with q = 0. */
struct ds_cu_head {
    const void *w; /* the bf16 head it copies (row-major, stride ws) */
    int64_t V, K, ws;
    uint8_t *q;
    float *scale, *err, *norm; /* [V] each: s[n], >= |e[n]|, >= |w[n]| (inf where w[n] is not finite) */
    bool declined;             /* no memory for it: the walk takes the full head */
};

/* The per-drafted-row bounds the walk reads: lo / hi [G, V] of the raw
 * (fp32, before any bf16 rounding) logits, and each bounds block's row with
 * the best lower bound per position (pv / pi [blocks][8]; pi -1: none). */
typedef struct {
    const float *lo, *hi;
    int64_t stride;
    const float *pv;
    const int *pi;
    int blocks;
} ds_cu_head_bounds;

/* The head's shape fits the bound (bf16, K a multiple of 512, at most 8192, 16-byte rows). */
bool ds_cu_head_fits(ds_tensor w);
/* The quantized copy of w, made now if need be (NULL: declined, or inside a recording before it exists). */
const struct ds_cu_head *ds_cu_head_of(ds_cuda_backend *cb, ds_tensor w);
void ds_cu_head_drop(ds_cuda_backend *cb, const void *w);
void ds_cu_head_free(ds_cuda_backend *cb);
/* Queues the bounds of x's rows (G <= 8) against head h into scratch memory at ws (ds_cu_head_bounds_bytes). */
bool ds_cu_head_bounds_run(ds_cuda_backend *cb, const struct ds_cu_head *h, ds_tensor x, void *ws,
                           ds_cu_head_bounds *out);
size_t ds_cu_head_bounds_bytes(const ds_cuda_backend *cb, int64_t V, int64_t K);

#endif
