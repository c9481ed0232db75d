/* Narrow y = x W^T for bf16 weights and up to 8 rows of x (decode and
 * verify), persistent: one block per SM claims 16-row tiles from a counter
 * (its first is b) while one producer thread streams each tile's weights
 * (and, where x is not split once per block, the x slice and norm weight
 * they meet) through a ring of shared-memory stages with the copy engine
 * (TMA: one 2-D tensor copy per 16 x 256 box), and 16 consumer warps run
 * the tensor-core products from shared memory.
 *
 * Why: the one-block-per-tile kernel (matmul_mma.cu) holds its loads in
 * registers, so an SM has only what its resident warps keep in flight, and
 * every block pays a ramp (first loads) and a tail (reduction, stores) in
 * which HBM idles; Qwen3-8B's small projections are 1-3 waves of such
 * blocks. Here the ring keeps up to ~180 KB per SM in flight whatever the
 * consumers do, a tile's epilogue overlaps the next tile's loads, and the
 * weights are requested before the kernel waits for the previous one (they
 * do not depend on it). The norm weight is requested with them, or first
 * of all at M = 1: a load issued after the ring's worth of requests waits
 * behind them (~7 us at an SM's share of HBM), and the norm weight gates
 * every product of the kernel (ring_trace.cu found it).
 *
 * Where x is split once per block (XC), at most RING_FLIGHT stages are
 * requested and not yet landed: a block enters while the kernel before it
 * drains and requests its stages at once, and the x loads its consumers
 * issue after the wait come back behind what this SM has in flight, while
 * the split x gates every product. Two wide stages still cover an SM's
 * share of HBM's latency, and a block that enters early still fills the
 * whole ring.
 *
 * Where x rides in the stages (o_proj and down of a verify or a drafted
 * block: 5-8 rows), a tile is a pair of 16-row units sharing x's slice:
 * otherwise x is as many bytes as the weights in every stage, all of it
 * from L2.
 *
 * Wide stages (XC with one weight: QKV, o_proj, down, lm_head): a stage is
 * 1024 k, two chunks a consumer warp (w, then w + 16, as in the warp's
 * order: the same sums). A consumer warp pays a fixed cost a stage (the
 * full wait, the release, the loop around 4 products), and with 16 KB
 * stages at one row that set the pace.
 *
 * The constants below were chosen by measurement at the Qwen3-8B shape
 * (bench/journal/ has the runs; bench/ab_cuda.sh compares variants).
 *
 * Same sums in the same order as matmul_mma.cu (matmul_mma_frag.cuh): a
 * stage is 512 k, one 32-wide chunk per consumer warp, so warp w takes
 * chunks w, w + 16, ... in order; rows stay bit-identical across kernels
 * and row counts (test_cuda_matmul). */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/matmul_mma_frag.cuh"
#include "backend/cuda/ring_trace.h"

#define RING_KS (32 * MMA_WARPS)            /* k per stage: one chunk per consumer warp */
#define RING_BOX 256                        /* k per tensor copy (the largest box side) */
#define RING_BOXES (RING_KS / RING_BOX)     /* tensor copies per operand and stage */
#define RING_WBOX (MMA_ROWS * RING_BOX * 2) /* bytes of a weight box: 16 rows x 256 bf16 */
#define RING_XBOX (8 * RING_BOX * 4)        /* bytes of an x box: 8 rows x 256 fp32 (rows past M zero) */
#define RING_THREADS ((MMA_WARPS + 1) * 32) /* consumer warps, then the producer warp */
#define RING_SMEM (200 * 1024)              /* shared memory per block: the ring takes what x's split leaves */
#define RING_SMEM_XC (227 * 1024)           /* the most, for several rows of x split (K = 4096: 16 KB a row) */
#define RING_XC_MIN_RING (48 * 1024)        /* ring bytes that still keep an SM's share of HBM in flight */
#define RING_XC_MAX_K 16384                 /* the longest row split once per block (XC): 4 bytes a k, 2 with bf16 x */
/* o_proj and down (residual epilogue) split x once per block only up to 4
 * rows: at more, x in the stages (pairs) is faster, as the split prologue
 * grows with the rows (verify of 8 ~1 % faster); the other calls split x up
 * to 8 rows (gate/up gained nothing from a cap). */
#define RING_XC_RESIDUAL_ROWS 4
/* ... and at several rows only where the ring beside x's split holds three
 * wide stages: otherwise the pairs with x in the stages (three 48 KB stages)
 * stream faster (down, K = 12288, of 3 rows: verify of 3 rows ~3 % faster). */
#define RING_XC_RESIDUAL_MIN_RING (96 * 1024)
/* XC blocks of up to this many rows keep RING_SMEM, so that a small kernel (attention, q/k norm) still fits
 * beside them; more rows take RING_SMEM_XC (at 2 rows keeping RING_SMEM gained nothing). */
#define RING_SMEM_ROWS 1
#define RING_XB 4                           /* x groups a prologue thread has in flight */
/* The same where x is normed: only the 4 lanes of row g load x's row g, so
 * at K = 4096 a lane's 8 chunks were two round trips at RING_XB, each
 * queued behind the SM's weight stream (QKV's and gate/up's first product
 * came 3-5.4 us after their wait at one row, o_proj's and down's 1.5-1.9). */
#define RING_XB_NORM 8
#define RING_WIDE_SLOTS 2                   /* the fewest wide stages a ring must hold to take them */
/* XC: stages requested and not yet landed, at most (see above), at every row count: 32 KB wide stages at
 * M = 1, so 64 KB in flight (1 stage starved the SM, no cap was no faster). */
#define RING_FLIGHT 2
/* The tile epilogue's threads take the 128 outputs by lane (mma_store_rows' by_lane): a warp reads 32 banks
 * of the partial sums, not 8 four ways at 8 rows. The same bits; verify of 8 rows ~0.7 % faster. */
#define RING_BY_LANE true
#define RING_NWBAR (16 * 32)                /* the norm weight's barrier (XC), after the slots' (room for 32) */
/* DS_X_BF16, XC with a norm: the sums of squares' slots [SS_SLOTS][8 rows], then each row's 1 / rms */
#define RING_RS_OFF (SS_SLOTS * 8)

/* Shared memory of a block: the slots' full / empty barriers, the warps'
 * partial sums and sums of squares, the ring of stages (each: NW weight
 * boxes x RING_BOXES, then for M > 1 x's boxes and the norm weight's slice),
 * then (XC) the split x and (XC with a norm) the norm weight. */
typedef struct {
    int tiles;       /* 16-row tiles over all segments */
    int slots;       /* stages in the ring */
    int stage_bytes; /* one stage */
    int x_off;       /* x rows within a stage */
    int nw_off;      /* norm weight within a stage */
    int nw_size;     /* bytes per norm weight element (0: no norm) */
    int red_off;     /* partial sums [MMA_WARPS][NW][4][32] */
    int ss_off;      /* sums of squares [MMA_WARPS][8] (DS_X_BF16, XC: slots [SS_SLOTS][8], 1 / rms [8]) */
    int tile_off;    /* the tile of each slot's stage [32] (-1: no more tiles) */
    int ring_off;    /* stage 0 */
    int xc_off;      /* XC: x split once per block, [M rows][K / 32 chunks][4 lanes t][hi 4, lo 4] */
    int x_stride;    /* XC: x's row stride (elements) */
    int xc_row;      /* XC: a split row's stride in 4-byte words, K + 4: the 4 lanes of row g read 16 bytes
                      * further along the banks than row g - 1's, so the rows' fragment loads do not collide */
    int nws_off;     /* XC with a norm: the norm weight, [K] */
    int flight;      /* XC: most stages requested and not yet landed, below slots (0: the ring's depth) */
    bool pair;       /* tiles of two 16-row units (residual, x in the stages): see ds_cu_ring_launch */
    bool red2;       /* alternate tiles' partial sums in two places, one sync a tile (see ds_cu_ring_launch) */
    int red_floats;  /* one place's partial sums */
    bool wide;       /* stages of 1024 k, two chunks a consumer warp (XC, one weight): see ds_cu_ring_launch */
} ring_plan;
/* The operands as 2-D tensors for the copy engine (TMA): w and w2 of each
 * segment, then x. One tensor copy moves a 16 x 256 weight box (8 KB): bulk
 * copies of single rows (0.5-1 KB) ran at 1-2.6 TB/s, bound by the copies
 * issued per SM. */
struct ring_maps {
    CUtensorMap w[DS_MMA_MAX_SEG];
    CUtensorMap up; /* SwiGLU's second weight (one segment) */
    CUtensorMap x;
    /* The weights' box-contiguous copies (weight_boxes.cu), a box one 1-D copy; NULL: by map */
    const uint16_t *bx[DS_MMA_MAX_SEG], *bx_up;
};

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void bar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
/* Consumer warps only (the producer never joins): named barrier 1. */
__device__ __forceinline__ void consumers_sync(void) {
    asm volatile("bar.sync 1, %0;" ::"r"(MMA_WARPS * 32) : "memory");
}

/* bytes from global src into shared dst, counted on barrier bar (the norm
 * weight's slice of a stage). */
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
/* The same with an L2 cache policy. */
__device__ __forceinline__ void bulk_load_hint(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar,
                                               uint64_t policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
                 "%4;" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar), "l"(policy)
                 : "memory");
}
/* A box of a 2-D tensor at (k, row) into shared dst; out-of-range
 * elements are zeros and still counted. */
__device__ __forceinline__ void tensor_load(uint32_t dst, const CUtensorMap *map, int k, int row, uint32_t bar,
                                            uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
        "%3}], [%4], %5;" ::"r"(dst),
        "l"((uint64_t)map), "r"(k), "r"(row), "r"(bar), "l"(policy)
        : "memory");
}
/* A block's place in its stream of stages: k within the tile, the ring
 * slot and its phase. Kept incrementally (no divisions in the loop: a
 * consumer warp has little else to hide them behind). Which tile a stage
 * belongs to is the producer's choice, written beside the slot. */
struct ring_cursor {
    int k0, kn, slot, phase;
};
template <int KS> __device__ __forceinline__ void cursor_start(ring_cursor &c, int K) {
    c.k0 = 0;
    c.kn = min(KS, K);
    c.slot = 0;
    c.phase = 0;
}
template <int KS> __device__ __forceinline__ void cursor_next(ring_cursor &c, int K, int slots) {
    if (++c.slot == slots) {
        c.slot = 0;
        c.phase ^= 1;
    }
    c.k0 += KS;
    if (c.k0 >= K) c.k0 = 0;
    c.kn = min(KS, K - c.k0);
}

/* The block's next tile after the one it starts now. Static: b, b + grid,
 * ... Dynamic (ctr): the next unclaimed one, so that SMs which get more of
 * HBM take more tiles and the kernel ends when the work does, not when its
 * slowest SM's share does (the static grid's blocks ended up to 15 us
 * apart in a 56 us kernel). A tile is still summed whole by one block in
 * the same order, so its bits do not depend on who takes it. */
__device__ __forceinline__ int ring_claim(int *ctr, int tile) {
    return ctr ? (int)gridDim.x + atomicAdd(ctr, 1) : tile + (int)gridDim.x;
}

/* A stage's x boxes (x may come from the previous kernel). */
__device__ __forceinline__ void issue_x(const ring_plan &p, const ring_maps &maps, int k0, uint32_t full, uint32_t st,
                                        uint64_t keep) {
#pragma unroll
    for (int b = 0; b < RING_BOXES; b++)
        tensor_load(st + p.x_off + b * RING_XBOX, &maps.x, k0 + b * RING_BOX, 0, full, keep);
}

/* 8 values of the norm weight (bf16 or fp32, nw_size bytes each) from shared memory, as fp32. */
__device__ __forceinline__ void unpack_norm8(const unsigned char *q, int nw_size, float f[8]) {
    if (nw_size == 2)
        ds_cu_unpack_bf16x8(*(const uint4 *)q, f);
    else
        ds_cu_unpack_f32x8(((const float4 *)q)[0], ((const float4 *)q)[1], f);
}

/* The group's hi / lo fragments into dst[0..7] (NORM: scaled by nw8; the fp32-x build adds its squares to *ss).
 * DS_X_BF16: the hi half only into dst[0..3] (a split row of K / 2 words). */
template <bool NORM>
__device__ __forceinline__ void split_group(float xf[8], const float nw8[8], float *ss, uint32_t *dst) {
    uint32_t h[4], l[4];
    split_x8<NORM>(xf, 0, 1, nw8, ss, h, l);
    *(uint4 *)dst = make_uint4(h[0], h[1], h[2], h[3]);
    if (!DS_X_BF16_ON) *(uint4 *)(dst + 4) = make_uint4(l[0], l[1], l[2], l[3]);
}

/* DS_X_BF16: a word offset in a split row (k: the group's first k; hi and lo, or hi only). */
__device__ __forceinline__ int xc_word(int k) { return DS_X_BF16_ON ? k / 2 : k; }

/* XC (x's rows fit beside the ring): the consumers split x (normed) into bf16 hi / lo
 * fragments once per block, in a prologue that overlaps the first weight
 * stages, and every tile reads them from shared memory: stages then carry
 * weights only, and a consumer's work per stage is two loads and the
 * products. Otherwise x's slice rides in each stage and is split per tile. */
template <int MODE, bool NORM, bool XC, bool PAIR, int CH>
__global__ void __launch_bounds__(RING_THREADS, 1)
    linear_ring_kernel(const __grid_constant__ ds_mma_args s, ring_plan p, const __grid_constant__ ring_maps maps,
                       const float *__restrict__ x, int M, int K, int *ctr, unsigned long long *trace) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* Hopper's copy engine; the launcher checks the device */
    constexpr int NW = MODE == DS_MMA_SWIGLU || PAIR ? 2 : 1; /* weight boxes a stage: gate / up, or a pair */
    constexpr int UNITS = PAIR ? 2 : 1;                       /* 16-row units a tile */
    /* CH chunks a consumer warp a stage (WIDE: 2, XC with one weight only): chunks w and w + 16 of a
     * 1024-k stage, in that order, as they follow each other in the warp's order. */
    constexpr int KS = RING_KS * CH, BOXES = RING_BOXES * CH;
    static_assert(CH == 1 || (XC && NW == 1), "wide stages carry one weight and no x");
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int stages = (K + KS - 1) / KS;
    int *slot_tile = (int *)(smem + p.tile_off);
    const uint32_t full0 = smem_addr(smem), empty0 = full0 + 8 * p.slots;
    const uint32_t ring0 = smem_addr(smem + p.ring_off);
    unsigned long long *tr = trace ? trace + RING_TRACE_FIELDS * blockIdx.x : NULL; /* DS_CUDA_RING_TRACE */
    if (tr && threadIdx.x == 0) tr[RT_ENTRY] = ds_cu_gtimer();
    if (threadIdx.x == 0) {
        for (int i = 0; i < p.slots; i++) {
            bar_init(full0 + 8 * i, 1);
            bar_init(empty0 + 8 * i, MMA_WARPS);
        }
        bar_init(smem_addr(smem + RING_NWBAR), 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    ring_cursor c;
    cursor_start<KS>(c, K);

    if (warp == MMA_WARPS) { /* the producer: one thread */
        if (lane) return;
        uint64_t stream, keep;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(stream));
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
        const uint32_t stage_tx = NW * BOXES * RING_WBOX + (XC ? 0 : RING_BOXES * RING_XBOX);
        if (XC && NORM) { /* the whole norm weight, first in line: the prologue needs it as soon as x is there */
            const uint32_t nb = smem_addr(smem + RING_NWBAR);
            bar_expect(nb, K * p.nw_size);
            bulk_load(smem_addr(smem + p.nws_off), s.norm_w, K * p.nw_size, nb);
        }
        /* x may come from the previous kernel: the first slots' weights (never written by kernels, only by
         * uploads) are requested before waiting for it, then x for those stages, then x with each stage. */
        bool waited = XC; /* XC: the consumers read x themselves, after their wait */
        int tile = (int)blockIdx.x, next = ring_claim(ctr, tile), it = 0, n0 = 0, seg = 0;
        for (;; it++, cursor_next<KS>(c, K, p.slots)) {
            if (c.k0 == 0) {
                if (it) {
                    tile = next;
                    if (tile < p.tiles) next = ring_claim(ctr, tile); /* asked a tile ahead: its answer has time */
                }
                if (tile >= p.tiles) break;
                seg = (int)(&mma_tile_seg(s, UNITS * tile, &n0) - s.seg);
            }
            const uint32_t full = full0 + 8 * c.slot, st = ring0 + c.slot * p.stage_bytes;
            if (it >= p.slots) bar_wait(empty0 + 8 * c.slot, c.phase ^ 1); /* the slot's previous use is read */
            /* At most `flight` stages in flight: stage it - flight has landed. */
            if (XC && p.flight && it >= p.flight) {
                const int j = it - p.flight;
                bar_wait(full0 + 8 * (j % p.slots), (j / p.slots) & 1);
            }
            slot_tile[c.slot] = tile; /* published by the arrive below */
            bar_expect(full, stage_tx + (XC || !NORM ? 0 : c.kn * p.nw_size));
#pragma unroll
            for (int v = 0; v < NW; v++) {
                const uint16_t *bx = v && !PAIR ? maps.bx_up : maps.bx[seg];
                const int row = n0 + (PAIR ? v * MMA_ROWS : 0);
#pragma unroll
                for (int b = 0; b < BOXES; b++)
                    if (bx) /* box (row / 16, k / 256) of the copy: 8 KB at element (row / 16 * K / 256 + k / 256) * 4096 */
                        bulk_load_hint(st + (v * BOXES + b) * RING_WBOX,
                                       bx + ((int64_t)(row / MMA_ROWS) * (K / RING_BOX) + (c.k0 + b * RING_BOX) / RING_BOX) *
                                                (RING_WBOX / 2),
                                       RING_WBOX, full, stream);
                    else
                        tensor_load(st + (v * BOXES + b) * RING_WBOX, v && !PAIR ? &maps.up : &maps.w[seg],
                                    c.k0 + b * RING_BOX, row, full, stream);
            }
            /* The norm weight is a weight too: requested with them, not queued behind them after the wait. */
            if (NORM && !XC)
                bulk_load(st + p.nw_off, (const char *)s.norm_w + (int64_t)c.k0 * p.nw_size, c.kn * p.nw_size, full);
            if (tr && it == p.slots - 1) { /* the ring requested once through: when did it land? */
                tr[RT_ISSUED] = ds_cu_gtimer();
                if (waited) {
                    bar_wait(full, c.phase);
                    tr[RT_LANDED] = ds_cu_gtimer();
                }
            }
            if (waited) {
                if (!XC) issue_x(p, maps, c.k0, full, st, keep);
            } else if (it == p.slots - 1) {
                ds_cu_grid_wait();
                for (int j = 0; j <= it; j++)
                    issue_x(p, maps, (j % stages) * KS, full0 + 8 * j, ring0 + j * p.stage_bytes, keep);
                waited = true;
            }
        }
        if (!waited) { /* fewer stages than slots */
            ds_cu_grid_wait();
            for (int j = 0; j < it; j++)
                issue_x(p, maps, (j % stages) * KS, full0 + 8 * j, ring0 + j * p.stage_bytes, keep);
        }
        /* The end, as a stage of its own: the consumers find tile -1 where the next tile would begin. */
        if (it >= p.slots) bar_wait(empty0 + 8 * c.slot, c.phase ^ 1);
        slot_tile[c.slot] = -1;
        bar_arrive(full0 + 8 * c.slot);
        /* The last block to stop claiming leaves the counter at zero for the launch that uses it next. */
        if (ctr && atomicAdd(ctr + 1, 1) == (int)gridDim.x - 1) {
            atomicExch(ctr, 0);
            atomicExch(ctr + 1, 0);
        }
        if (tr) tr[RT_PRODUCED] = ds_cu_gtimer();
        return;
    }

    /* The consumers. */
    ds_cu_grid_wait(); /* the residual comes from the previous kernel */
    if (tr && threadIdx.x == 0) tr[RT_WAIT] = ds_cu_gtimer();
    int tiles_done = 0;
    unsigned long long waited = 0; /* trace: kept here, written once (a global add a stage stalled warp 0) */
    const int g = lane >> 2, t = lane & 3;
    float *red = (float *)(smem + p.red_off), *ss_part = (float *)(smem + p.ss_off);
    float acc[NW][1][4], ss = 0.0f;
#pragma unroll
    for (int v = 0; v < NW; v++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[v][0][i] = 0.0f;
    /* Chunk `warp` of a stage: box warp / 8, bytes (warp % 8) * 64 of each weight row, * 128 of each x row. */
    const int box = warp / (RING_BOX / 32), in_box = warp % (RING_BOX / 32);
    const int wofs = box * RING_WBOX + g * RING_BOX * 2 + in_box * 64 + t * 16, wofs8 = wofs + 8 * RING_BOX * 2;
    const int xofs = p.x_off + box * RING_XBOX + g * RING_BOX * 4 + in_box * 128 + t * 32;
    const int nofs = p.nw_off + (warp * 32 + 8 * t) * p.nw_size;
    uint32_t *xc = (uint32_t *)(smem + p.xc_off);
    if (XC) { /* the prologue: x's groups of 8 (group q: chunk q / 4, lane t = q % 4, k = 8q), split once */
        if (NORM) {
            /* Lane t of warp w sums the squares of its chunks w, w + 16, ... in order, as the other kernel's
             * lane does: RING_XB_NORM chunks' loads in flight at a time. */
            bar_wait(smem_addr(smem + RING_NWBAR), 0);
            if (tr && threadIdx.x == 0) tr[RT_NW] = ds_cu_gtimer();
#if DS_X_BF16_ON
            /* DS_X_BF16: bf16(x * w) in one pass, the 1 / rms applied to the sums after the products; the
             * squares in the tile order (matmul_mma_frag.cuh): this warp's slots 2 warp + t / 2 take its chunks'
             * tiles in order, every lane in the shuffles (rows past M as zeros). */
            const int chunks = K >> 5;
            const float *xg = x + (int64_t)g * p.x_stride;
            uint32_t *xcg = xc + g * p.xc_row;
            float slot = 0.0f;
            for (int c0 = warp; c0 < chunks; c0 += MMA_WARPS * RING_XB_NORM) {
                float xf[RING_XB_NORM][8];
#pragma unroll
                for (int i = 0; i < RING_XB_NORM; i++) /* RING_XB_NORM chunks' loads in flight */
                    if (c0 + i * MMA_WARPS < chunks) {
                        const int k = ((c0 + i * MMA_WARPS) * 4 + t) * 8;
                        if (g >= M)
#pragma unroll
                            for (int j = 0; j < 8; j++) xf[i][j] = 0.0f;
                        else ds_cu_load8<DS_F32>(xg, k, xf[i]);
                    }
#pragma unroll
                for (int i = 0; i < RING_XB_NORM; i++)
                    if (c0 + i * MMA_WARPS < chunks) {
                        ss_tile_add(xf[i], &slot);
                        if (g < M) {
                            const int k = ((c0 + i * MMA_WARPS) * 4 + t) * 8;
                            float nw8[8];
                            unpack_norm8(smem + p.nws_off + k * p.nw_size, p.nw_size, nw8);
                            split_group<true>(xf[i], nw8, &ss, xcg + xc_word(k));
                        }
                    }
            }
            if (!(t & 1)) ss_part[(2 * warp + (t >> 1)) * 8 + g] = slot;
            if (tr && threadIdx.x == 0) tr[RT_XDONE] = ds_cu_gtimer();
#else
            if (g < M) { /* lanes 4g .. 4g+3 take row g, as x's row g meets the products' column g */
                const float *xg = x + (int64_t)g * p.x_stride;
                uint32_t *xcg = xc + g * p.xc_row;
                for (int c0 = warp; c0 < (K >> 5); c0 += MMA_WARPS * RING_XB_NORM) {
                    float xf[RING_XB_NORM][8];
#pragma unroll
                    for (int i = 0; i < RING_XB_NORM; i++)
                        if (c0 + i * MMA_WARPS < (K >> 5))
                            ds_cu_load8<DS_F32>(xg, ((c0 + i * MMA_WARPS) * 4 + t) * 8, xf[i]);
#pragma unroll
                    for (int i = 0; i < RING_XB_NORM; i++)
                        if (c0 + i * MMA_WARPS < (K >> 5)) {
                            const int k = ((c0 + i * MMA_WARPS) * 4 + t) * 8;
                            float nw8[8]; /* from shared memory: no round trip to wait for */
                            unpack_norm8(smem + p.nws_off + k * p.nw_size, p.nw_size, nw8);
                            split_group<true>(xf[i], nw8, &ss, xcg + k);
                        }
                }
            }
            if (tr && threadIdx.x == 0) tr[RT_XDONE] = ds_cu_gtimer();
            mma_store_ss(ss, ss_part + 8 * warp, g); /* kept for every tile */
#endif
        } else {
            const int groups = K >> 3; /* of 8 k in a row */
            for (int q0 = threadIdx.x; q0 < M * groups; q0 += MMA_WARPS * 32 * RING_XB) {
                float xf[RING_XB][8], nw8[RING_XB][8];
#pragma unroll
                for (int i = 0; i < RING_XB; i++) {
                    const int q = q0 + i * MMA_WARPS * 32, row = q / groups;
                    if (q < M * groups)
                        ds_cu_load8<DS_F32>(x + (int64_t)row * p.x_stride, (q - row * groups) * 8, xf[i]);
                }
#pragma unroll
                for (int i = 0; i < RING_XB; i++) {
                    const int q = q0 + i * MMA_WARPS * 32, row = q / groups;
                    if (q < M * groups)
                        split_group<false>(xf[i], nw8[i], &ss, xc + row * p.xc_row + xc_word((q - row * groups) * 8));
                }
            }
            if (tr && threadIdx.x == 0) tr[RT_XDONE] = ds_cu_gtimer();
        }
        consumers_sync();
        if (tr && threadIdx.x == 0) tr[RT_SYNCED] = ds_cu_gtimer();
        if (NORM && DS_X_BF16_ON && warp < M) { /* warp m: row m's 1 / rms (the first epilogue's sync orders it) */
            const float rs = slots_rs(ss_part, 8, warp, K, s.eps);
            if (lane == 0) ss_part[RING_RS_OFF + warp] = rs;
        }
    }
    const ds_mma_seg *S = s.seg;
    int n0 = 0;
    /* A stage as one warp holds it: its weights (and, unless XC, x's slice and the norm weight's), read from
     * the slot before the slot is released, and where XC the split x's fragments for its k. */
    struct held {
        uint4 wa[CH][NW], wb[CH][NW];
        float f[8], nf[8];
        uint32_t xh[CH][1][4], xl[CH][1][4];
        bool mine[CH]; /* a last, partial stage may not reach this warp's chunk */
    };
    /* Waits for stage cc, reads the tile it begins (k0 = 0: false where that is the end), takes the stage
     * into h and releases the slot. */
    int it = 0;
    auto fetch = [&](const ring_cursor &cc, held &h, int &tile) -> bool {
        if (tr && threadIdx.x == 0 && it < RING_TRACE_STAGES) {
            const unsigned long long t0 = ds_cu_gtimer();
            bar_wait(full0 + 8 * cc.slot, cc.phase);
            const unsigned long long t1 = ds_cu_gtimer();
            waited += t1 - t0;
            tr[RT_SEEN0 + it] = t1;
        } else {
            bar_wait(full0 + 8 * cc.slot, cc.phase);
        }
        if (cc.k0 == 0) { /* read before this warp releases the slot (the producer rewrites it) */
            tile = slot_tile[cc.slot];
            if (tile < 0) return false;
        }
        if (tr && it == 0 && threadIdx.x == 0) tr[RT_FIRST] = ds_cu_gtimer();
        it++;
        const unsigned char *st = smem + p.ring_off + cc.slot * p.stage_bytes;
#pragma unroll
        for (int j = 0; j < CH; j++) h.mine[j] = (warp + MMA_WARPS * j) * 32 < cc.kn;
#pragma unroll
        for (int j = 0; j < CH; j++)
            if (h.mine[j])
#pragma unroll
                for (int v = 0; v < NW; v++) { /* chunk warp + 16 j: two boxes further on */
                    h.wa[j][v] = *(const uint4 *)(st + (v * BOXES + 2 * j) * RING_WBOX + wofs);
                    h.wb[j][v] = *(const uint4 *)(st + (v * BOXES + 2 * j) * RING_WBOX + wofs8);
                }
        if (!XC && h.mine[0] && g < M) {
            const float4 *xp = (const float4 *)(st + xofs);
            ds_cu_unpack_f32x8(xp[0], xp[1], h.f);
        } else if (!XC) {
#pragma unroll
            for (int i = 0; i < 8; i++) h.f[i] = 0.0f;
        }
        if (NORM && !XC && h.mine[0]) unpack_norm8(st + nofs, p.nw_size, h.nf);
        __syncwarp();
        if (lane == 0) bar_arrive(empty0 + 8 * cc.slot); /* the slot's data is in registers */
        if (XC)
#pragma unroll
            for (int j = 0; j < CH; j++) {
                if (!h.mine[j]) continue;
                uint4 hi = make_uint4(0, 0, 0, 0), lo = hi;
                const int chunk = (cc.k0 >> 5) + warp + MMA_WARPS * j;
                if (g < M) {
                    const uint32_t *q = xc + g * p.xc_row + xc_word((chunk * 4 + t) * 8);
                    hi = *(const uint4 *)q;
                    if (!DS_X_BF16_ON) lo = *(const uint4 *)(q + 4);
                }
                h.xh[j][0][0] = hi.x, h.xh[j][0][1] = hi.y, h.xh[j][0][2] = hi.z, h.xh[j][0][3] = hi.w;
                h.xl[j][0][0] = lo.x, h.xl[j][0][1] = lo.y, h.xl[j][0][2] = lo.z, h.xl[j][0][3] = lo.w;
            }
        return true;
    };
    held cur, nxt;
    int tile = -1;
    bool have = fetch(c, cur, tile);
    if (have) S = &mma_tile_seg(s, UNITS * tile, &n0);
    while (have) {
        ring_cursor n = c;
        cursor_next<KS>(n, K, p.slots);
        int tile_n = tile;
#pragma unroll
        for (int j = 0; j < CH; j++) {
            if (!cur.mine[j]) continue;
            if (!XC) split_x8<NORM>(cur.f, g, M, cur.nf, &ss, cur.xh[0][0], cur.xl[0][0]);
#pragma unroll
            for (int v = 0; v < NW; v++) mma_chunk<1>(acc[v], cur.wa[j][v], cur.wb[j][v], cur.xh[j], cur.xl[j]);
        }
        if (c.k0 + c.kn >= K) { /* the tile's last stage: the warps' sums, added in warp order */
            if (tr && threadIdx.x == 0) {
                if (tiles_done < RING_TRACE_TILES) tr[RT_TILE0 + tiles_done] = ds_cu_gtimer();
                tr[RT_TILES] = (unsigned long long)(tiles_done + 1);
            }
            /* RED2: the partial sums of alternate tiles in two places, so that one sync orders them. */
            const int half = p.red2 ? tiles_done & 1 : 0;
            float *rd = red + half * p.red_floats,
                  *ssp = ss_part + (NORM && !XC ? half * MMA_WARPS * 8 : NORM && DS_X_BF16_ON ? RING_RS_OFF : 0);
            tiles_done++;
            if (NORM && !XC) mma_store_ss(ss, ssp + 8 * warp, g);
#pragma unroll
            for (int v = 0; v < NW; v++)
#pragma unroll
                for (int i = 0; i < 4; i++) rd[((warp * NW + v) * 4 + i) * 32 + lane] = acc[v][0][i];
            consumers_sync();
            if constexpr (PAIR) { /* each half of the consumers stores a unit, as a tile of its own */
                const int u = threadIdx.x >= MMA_WARPS * 16;
                mma_store_rows<1, MODE, NORM, 2>(*S, rd + u * 4 * 32, ssp, 8, n0 + u * MMA_ROWS, 0, M, K, s.eps,
                                                 threadIdx.x - u * MMA_WARPS * 16, MMA_WARPS * 16, RING_BY_LANE);
            } else {
                mma_store_rows<NW, MODE, NORM>(*S, rd, ssp, 8, n0, 0, M, K, s.eps, threadIdx.x, MMA_WARPS * 32,
                                               RING_BY_LANE);
            }
            if (!p.red2) consumers_sync(); /* red and ss_part are read before the next tile writes them */
            ss = 0.0f;
#pragma unroll
            for (int v = 0; v < NW; v++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[v][0][i] = 0.0f;
        }
        const bool have_n = fetch(n, nxt, tile_n);
        c = n;
        cur = nxt;
        tile = tile_n;
        if (have_n && n.k0 == 0) S = &mma_tile_seg(s, UNITS * tile, &n0);
        have = have_n;
    }
    if (tr && threadIdx.x == 0) {
        tr[RT_WAITED] = waited;
        tr[RT_END] = ds_cu_gtimer();
    }
#endif
}

static int round_up(int v, int to) { return (v + to - 1) / to * to; }

/* The partial sums' places for nw weight boxes a stage, and the ring after them. */
static void plan_sums(ring_plan *p, int nw) {
    const int two = p->red2 ? 2 : 1;
    p->red_floats = MMA_WARPS * nw * 4 * 32;
    p->red_off = round_up(p->tile_off + 32 * 4, 128);
    p->ss_off = p->red_off + two * p->red_floats * 4;
    const int ss_floats = two * MMA_WARPS * 8 > RING_RS_OFF + 8 ? two * MMA_WARPS * 8 : RING_RS_OFF + 8;
    p->ring_off = round_up(p->ss_off + ss_floats * 4, 128);
}

/* Tensor maps are encoded by the driver (reached through the runtime, so
 * nothing links libcuda) and kept per backend: weights and activation
 * buffers are few and long-lived. Keyed by everything the map encodes. */
#define TMAP_CACHE 1024
typedef struct {
    const void *ptr;
    int64_t rows, cols, stride;
    int dtype;
    CUtensorMap map;
} tmap_entry;
struct ds_cu_tmaps {
    PFN_cuTensorMapEncodeTiled_v12000 encode;
    tmap_entry e[TMAP_CACHE];
};

void ds_cu_tmaps_free(ds_cuda_backend *cb) {
    free(cb->tmaps);
    cb->tmaps = NULL;
}

/* A [rows, cols] tensor (row stride `stride` elements) in boxes of
 * 16 (bf16) or 8 (fp32) rows x RING_BOX. False (failure recorded) if the driver refuses. */
static bool tensor_map(ds_cuda_backend *cb, const char *op, const void *ptr, int64_t rows, int64_t cols,
                       int64_t stride, int dtype, CUtensorMap *out) {
    if (!cb->tmaps) {
        cb->tmaps = (ds_cu_tmaps *)calloc(1, sizeof *cb->tmaps);
        if (!cb->tmaps) {
            ds_cu_fail(cb, op, "out of memory (tensor map cache)");
            return false;
        }
        cudaDriverEntryPointQueryResult q;
        void *fn = NULL;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !fn) {
            ds_cu_fail(cb, op, "the driver offers no cuTensorMapEncodeTiled");
            return false;
        }
        cb->tmaps->encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    }
    if (!cb->tmaps->encode) return false;
    const size_t h = ((uintptr_t)ptr >> 8 ^ (uintptr_t)rows * 31 ^ (uintptr_t)cols * 17) % TMAP_CACHE;
    tmap_entry *e = &cb->tmaps->e[h];
    if (e->ptr == ptr && e->rows == rows && e->cols == cols && e->stride == stride && e->dtype == dtype) {
        *out = e->map;
        return true;
    }
    const bool bf16 = dtype == DS_BF16;
    const size_t es = bf16 ? 2 : 4;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)stride * es};
    const cuuint32_t box[2] = {RING_BOX, (cuuint32_t)(bf16 ? MMA_ROWS : 8)}, estr[2] = {1, 1};
    CUresult r = cb->tmaps->encode(out, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
                                   (void *)ptr, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                   CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        ds_cu_fail(cb, op, "cannot describe a %lld x %lld %s tensor for the copy engine (driver error %d)",
                   (long long)rows, (long long)cols, bf16 ? "bf16" : "fp32", (int)r);
        return false;
    }
    *e = tmap_entry{ptr, rows, cols, stride, dtype, *out};
    return true;
}

template <int MODE, bool NORM, bool XC, bool PAIR = false, int CH = 1>
static void ring_start(ds_cuda_backend *cb, const char *op, const ds_mma_args *a, const ring_plan &p,
                       const ring_maps &maps, ds_tensor x, int grid, int bytes, int *ctr) {
    static ds_cu_smem_allowed allowed;
    auto kernel = linear_ring_kernel<MODE, NORM, XC, PAIR, CH>;
    if (!ds_cu_allow_smem(cb, op, kernel, &allowed, (size_t)bytes)) return;
    ds_cu_launch_smem(kernel, (unsigned)grid, RING_THREADS, (size_t)bytes, cb->stream, *a, p, maps,
                      (const float *)x.data, (int)x.rows, (int)x.cols, ctr,
                      ds_cu_ring_trace_slot(cb, (int)x.rows, (int)x.cols, p.tiles, grid));
    ds_cu_launched(cb, op);
}

template <int MODE, bool NORM>
static void ring_start_xc(ds_cuda_backend *cb, const char *op, const ds_mma_args *a, const ring_plan &p,
                          const ring_maps &maps, ds_tensor x, int grid, int bytes, bool xc, int *ctr) {
    if (MODE == DS_MMA_RESIDUAL && !NORM && !xc && p.pair)
        ring_start<DS_MMA_RESIDUAL, false, false, true>(cb, op, a, p, maps, x, grid, bytes, ctr);
    else if (MODE != DS_MMA_SWIGLU && xc && p.wide) /* (the ternary: SwiGLU's CH = 2 kernel is never built) */
        ring_start<MODE, NORM, true, false, MODE != DS_MMA_SWIGLU ? 2 : 1>(cb, op, a, p, maps, x, grid, bytes, ctr);
    else if (xc)
        ring_start<MODE, NORM, true>(cb, op, a, p, maps, x, grid, bytes, ctr);
    else
        ring_start<MODE, NORM, false>(cb, op, a, p, maps, x, grid, bytes, ctr);
}

/* XC with a norm: the norm weight's bytes beside the split x. */
static int xc_norm_bytes(const ds_mma_args *a, int K, const ring_plan &p) {
    return a->norm_w ? round_up(K * p.nw_size, 128) : 0;
}

/* The launch's layout for x of M rows: x split once per block (XC) or in the stages, pairs, the stages'
 * width, the slots; red2: two places for the partial sums. False where the ring does not take the call. */
static bool ring_layout(const ds_cuda_backend *cb, int mode, const ds_mma_args *a,
                        ds_tensor x, int tiles, bool red2, ring_plan *out, bool *xc_out, int *nw_out) {
    ring_plan p = {};
    const int M = (int)x.rows, K = (int)x.cols;
    if (a->norm_w) {
        if ((uintptr_t)a->norm_w % 16) return false;
        p.nw_size = a->norm_dtype == DS_BF16 ? 2 : a->norm_dtype == DS_F32 ? 4 : 0;
        if (!p.nw_size) return false;
    }
    int &nw = *nw_out;
    nw = mode == DS_MMA_SWIGLU ? 2 : 1;
    /* The barriers (room for 32 slots), the slots' tiles, the partial sums, then the ring. */
    p.tile_off = round_up(RING_NWBAR + 8, 128);
    p.red2 = red2;
    plan_sums(&p, nw);
    /* x split once per block (XC) when its rows leave the ring room for RING_XC_MIN_RING and two stages: then
     * stages carry weights only and nothing is split per tile (a verify of 8 rows at K = 4096 splits 128 KB).
     * Otherwise x's slice rides in every stage. The same sums either way. Several rows may use the most shared
     * memory a block can have; up to RING_SMEM_ROWS keep RING_SMEM (a small kernel's block still fits beside it).
     * o_proj and down (residual) split x up to RING_XC_RESIDUAL_ROWS only, and at several rows only where the
     * ring keeps RING_XC_RESIDUAL_MIN_RING beside the split. */
    const int nw_bytes = xc_norm_bytes(a, K, p);
    const int smem_cap = M <= RING_SMEM_ROWS ? RING_SMEM : RING_SMEM_XC;
    p.xc_row = (DS_X_BF16_ON ? K / 2 : K) + 4; /* DS_X_BF16: hi halves only */
    const int xc_room = smem_cap - p.ring_off - (M * p.xc_row * 4 + nw_bytes);
    const int xc_cap = mode == DS_MMA_RESIDUAL ? RING_XC_RESIDUAL_ROWS : 8;
    const bool xc = M <= xc_cap && K <= RING_XC_MAX_K && (uintptr_t)x.data % 16 == 0 &&
                    x.stride % 4 == 0 && xc_room >= RING_XC_MIN_RING && xc_room >= 2 * nw * RING_BOXES * RING_WBOX &&
                    (mode != DS_MMA_RESIDUAL || a->norm_w || M == 1 || xc_room >= RING_XC_RESIDUAL_MIN_RING);
    *xc_out = xc;
    /* Pairs: where x rides in every stage (o_proj and down of a verify or a drafted block), a tile of 32 weight
     * rows carries x's slice once for both halves, so a stage is 2/3 weights instead of 1/2 and half as many
     * bytes of x come from L2. Each half is summed as a 16-row tile would be (the same bits). Only where the
     * makespan in units stays (Qwen3-8B's 256 units: 2 a block over 128 blocks, or 2 over 124 and 1 over 8);
     * 128 units would take 64 blocks twice as long. cfg.ring_min_tiles (tests) takes pairs at any count. */
    const int waves = (tiles + cb->sms - 1) / cb->sms, pair_waves = (tiles / 2 + cb->sms - 1) / cb->sms;
    p.pair = mode == DS_MMA_RESIDUAL && !a->norm_w && !xc && a->nseg == 1 && a->seg[0].n % (2 * MMA_ROWS) == 0 &&
             (cb->cfg.ring_min_tiles >= 0 || 2 * pair_waves <= waves);
    if (p.pair) {
        nw = 2; /* the two halves' boxes: the partial sums of two 16-row tiles */
        plan_sums(&p, nw);
        tiles /= 2;
    }
    p.tiles = tiles;
    /* WIDE: a stage of one weight (XC: no x in it) takes 1024 k, so that a consumer warp's fixed work a stage
     * (the barrier waits, the release, the loop) is paid per 32 KB instead of per 16 KB; only where the ring
     * still holds RING_WIDE_SLOTS such stages. */
    const int xc_bytes = xc ? M * p.xc_row * 4 + nw_bytes : 0; /* split x, the norm weight */
    const int room = (xc ? smem_cap : RING_SMEM) - p.ring_off - xc_bytes;
    p.wide = xc && nw == 1 && !p.pair && room >= RING_WIDE_SLOTS * 2 * RING_BOXES * RING_WBOX;
    const int boxes = RING_BOXES * (p.wide ? 2 : 1);
    p.x_off = nw * boxes * RING_WBOX;
    p.nw_off = p.x_off + (xc ? 0 : RING_BOXES * RING_XBOX);
    p.stage_bytes = round_up(p.nw_off + (xc ? 0 : RING_KS * p.nw_size), 128);
    /* As many stages as fit (without XC, a SwiGLU stage at M = 8 is 50 KB: both weights' boxes and x's). */
    p.x_stride = (int)x.stride;
    p.slots = room / p.stage_bytes;
    p.slots = p.slots < 2 ? 2 : p.slots > 32 ? 32 : p.slots;
    /* The cap only below the ring's depth: the producer's empty wait limits the rest, and the barrier of a
     * stage a ring's depth back may already be rearmed for a later one. */
    p.flight = xc && RING_FLIGHT < p.slots ? RING_FLIGHT : 0;
    p.xc_off = p.ring_off + p.slots * p.stage_bytes;
    p.nws_off = p.xc_off + (xc ? M * p.xc_row * 4 : 0);
    *out = p;
    return true;
}

bool ds_cu_ring_launch(ds_cuda_backend *cb, const char *op, int mode, const ds_mma_args *a, ds_tensor x, int tiles) {
    const int M = (int)x.rows, K = (int)x.cols;
    /* Fewer tiles than SMs (small models' projections): the per-tile kernel starts faster, and the ring has
     * nothing to keep streaming. */
    if (!cb->cfg.ring || cb->cc_major < 9 || M < 1 || M > 8 || K < RING_BOX || (uintptr_t)x.data % 16 ||
        x.stride % 4 || tiles < (cb->cfg.ring_min_tiles >= 0 ? cb->cfg.ring_min_tiles : cb->sms) || tiles < 1)
        return false;
    if (mode == DS_MMA_SWIGLU && a->nseg != 1) return false; /* one map for the up weight */
    /* Two places for the partial sums (one sync a tile) at one row only: at several rows they took x's split its
     * room from gate/up (verify of 8 ~7 % slower), and where they cost nothing they gained nothing. */
    ring_plan p;
    bool xc;
    int nw;
    if (!ring_layout(cb, mode, a, x, tiles, M == 1, &p, &xc, &nw)) return false;
    /* DS_X_BF16: a norm needs its 1 / rms before the split, which only XC's prologue (a whole row) has here;
     * otherwise the per-tile kernel, which makes a pass over x first. */
    if (DS_X_BF16_ON && a->norm_w && !xc) return false;
    ring_maps maps;
    memset(&maps, 0, sizeof maps);
    for (int i = 0; i < a->nseg; i++)
        for (int v = 0; v < (p.pair ? 1 : nw); v++)
            if (!tensor_map(cb, op, v ? a->seg[i].w2 : a->seg[i].w, a->seg[i].n, K, a->seg[i].ws, DS_BF16,
                            v ? &maps.up : &maps.w[i]))
                return true;
    if (!xc && !tensor_map(cb, op, x.data, M, K, x.stride, DS_F32, &maps.x)) return true;
    /* Weights with a box copy (weight_boxes.cu) stream it, where every stage's boxes lie inside K. */
    if (ds_cu_boxes_on(cb) && K % (RING_KS * (p.wide ? 2 : 1)) == 0) {
        for (int i = 0; i < a->nseg; i++) maps.bx[i] = ds_cu_boxes_of(cb, a->seg[i].w, a->seg[i].n, K, a->seg[i].ws);
        if (nw == 2 && !p.pair) maps.bx_up = ds_cu_boxes_of(cb, a->seg[0].w2, a->seg[0].n, K, a->seg[0].ws);
    }
    const int bytes = xc ? p.nws_off + xc_norm_bytes(a, K, p) : p.xc_off;
    const int grid = p.tiles < cb->sms ? p.tiles : cb->sms;
    const bool norm = a->norm_w != NULL;
    /* A counter pair per launch, in turn: kernels that overlap (programmatic launches) never share one, and each
     * pair is back at zero long before its turn comes again. */
    int *ctr = NULL;
    if (cb->ring_ctr) ctr = cb->ring_ctr + 2 * (int)(cb->ring_seq++ % DS_CU_RING_CTRS);
    switch (mode) {
    case DS_MMA_PLAIN:
        norm ? ring_start_xc<DS_MMA_PLAIN, true>(cb, op, a, p, maps, x, grid, bytes, xc, ctr)
             : ring_start_xc<DS_MMA_PLAIN, false>(cb, op, a, p, maps, x, grid, bytes, xc, ctr);
        break;
    case DS_MMA_RESIDUAL:
        norm ? ring_start_xc<DS_MMA_RESIDUAL, true>(cb, op, a, p, maps, x, grid, bytes, xc, ctr)
             : ring_start_xc<DS_MMA_RESIDUAL, false>(cb, op, a, p, maps, x, grid, bytes, xc, ctr);
        break;
    default:
        norm ? ring_start_xc<DS_MMA_SWIGLU, true>(cb, op, a, p, maps, x, grid, bytes, xc, ctr)
             : ring_start_xc<DS_MMA_SWIGLU, false>(cb, op, a, p, maps, x, grid, bytes, xc, ctr);
        break;
    }
    return true;
}
