/* The CUDA backend's switches: kill switches and diagnostics, read from the
 * environment once, when a backend is made (README.md lists them), or set
 * by a test on the struct instead. Everything else the kernels choose is a
 * named constant beside its kernel, chosen by measurement; A/B tooling for
 * new choices lives in bench/ (ab_cuda.sh). Plain C: tests include it. */
#ifndef DS_BACKEND_CUDA_CONFIG_H
#define DS_BACKEND_CUDA_CONFIG_H

#include <stdbool.h>

#include "backend/backend.h"
#include "base/error.h"

/* DS_CUDA_RING_BOXES: which weights get a box-contiguous copy (weight_boxes.cu). */
enum { DS_CU_BOXES_NEVER = 0, DS_CU_BOXES_ALWAYS = 1, DS_CU_BOXES_AUTO = 2 };

/* The defaults of the fields tests lower (attention.cu says why these). */
#define DS_CU_ATT_FUSED_MIN_ROWS 2    /* rows from which norm + attention is one launch */
#define DS_CU_ATT_PACK_MIN_BLOCKS 128 /* packed attention grids smaller than this run a head a block */

typedef struct {
    /* Read at creation. */
    bool graphs;          /* DS_CUDA_GRAPHS=0: step regions run op by op, not as recorded CUDA graphs */
    bool profile;         /* DS_CUDA_PROFILE=1: per-op GPU time at exit (cuda_profile.cu); graphs off */
    char ring_trace[512]; /* DS_CUDA_RING_TRACE=file: the ring / attention blocks' timeline (ring_trace.cu); graphs
                           * off; "" none */
    /* Read at each call (a test may change them on a live backend: ds_cuda_config_of). */
    bool ring;            /* DS_CUDA_RING=0: every narrow bf16 matmul on the per-tile kernel (matmul_mma.cu) */
    int ring_boxes;       /* DS_CUDA_RING_BOXES=auto|1|0: DS_CU_BOXES_* (read at each upload) */
    bool head_bound;      /* DS_CUDA_HEAD_BOUND=0: a greedy draft computes its full LM head */
    int markov_fused;     /* DS_CUDA_MARKOV_FUSED=1|0: the pruned walk in one launch / a launch a step (-1: by size) */
    bool invariant;       /* DS_CUDA_INVARIANT=1: every row's bits independent of the call's other rows at any row
                           * count (the batched engine's batch invariance): projections of more than
                           * DS_CU_NARROW_M rows run as slabs of that many on the narrow kernels instead of cuBLAS,
                           * paged attention rows never on the prefill kernel. Slower at many rows (bench it). */
    bool quant;           /* DS_CUDA_QUANT=0: quantized weights are refused at load (matmul_quant.cu; a kill switch,
                           * read at each weight_quant) */
    /* Not in the environment: tests lower them so that their small shapes reach the paths they check. */
    int ring_min_tiles;      /* the ring takes calls from this many tiles on (-1: one per SM), and pairs at any count */
    int fused_attn_min_rows; /* the fused norm + attention launch from this many rows (<= 0 or > 8: never) */
    int att_pack_min_blocks; /* attention packs a kv head's query heads where the packed grid keeps this many
                              * blocks (<= 0: never) */
    int narrow_rows;         /* bf16 products of at most this many rows (1..32; else 32) take the narrow tensor-core
                              * kernels, more the wide path (cuBLAS; under invariant matmul_invariant.cu): 32
                              * for the single-request engine's verify == decode, 8 around the batched engine's
                              * steps without invariance (ops->exact_rows); a bench compares the two at 9..32
                              * rows (bench_cuda_ops --batched) */
} ds_cuda_config;

/* What an unset environment gives. */
ds_cuda_config ds_cuda_config_default(void);
/* The defaults with the environment's switches applied; an error names a malformed value. */
ds_error *ds_cuda_config_from_env(ds_cuda_config *out);
/* ds_backend_cuda_new with a config instead of the environment's. */
ds_error *ds_backend_cuda_new_with(int device, const ds_cuda_config *cfg, ds_backend **out);
/* A live CUDA backend's config, which the per-call fields are read from; NULL for another backend. */
ds_cuda_config *ds_cuda_config_of(ds_backend *be);

#endif
