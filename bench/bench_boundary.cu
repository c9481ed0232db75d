/* What a kernel boundary costs on the GPU, and whether a completion counter
 * can hand over faster than griddepcontrol.wait.
 *
 * dspark's decode step is a chain of ~250 launches (Qwen3-8B: 7 a layer),
 * each a programmatic dependent launch whose blocks wait in
 * griddepcontrol.wait for the kernel before it to finish. Traced on the
 * H200 (bench/RESULTS.md, session 13), that wait returns 0.8-1.9 us after
 * the previous kernel's last block ended, in a step whose kernels are 2-50
 * us long. This program times chains of K launches of one kernel that
 * streams B bytes of a buffer (one block an SM, as the ring matmul) and
 * hands one value a block to the next launch, in four ways, side by side:
 *   serial   plain launches: each starts after the previous one ends;
 *   pdl      programmatic launches, griddepcontrol.wait at entry (dspark);
 *   flag     programmatic launches that never call griddepcontrol.wait:
 *            each block counts itself done (fence, then an atomic add) and
 *            the next launch's blocks spin on that count with acquire
 *            loads; the last block through resets it for a later launch;
 *   stream   one launch streaming all K x B bytes (the chain's floor).
 * Then the question a persistent kernel asks (K phases in one launch, a
 * grid barrier between them): can a ring keep HBM busy across the barrier?
 *   ring     one launch, one block an SM as dspark's ring matmul: a producer
 *            thread streams every phase's slice through a shared-memory
 *            ring (1-D bulk copies of 8 KB, at most F stages of 32 KB in
 *            flight) without waiting for any barrier; 16 consumer warps
 *            read each stage, and at a phase's end the block arrives on a
 *            grid counter (red.release) and polls it (ld.acquire) before it
 *            consumes the next phase: what the phases' consumers wait is
 *            covered only while the producer still has ring to fill;
 *   ring-free the same stream with no barrier (the ring's own floor);
 *   ring-hint the same with the L2 evict_first hint dspark's weights carry;
 *   ring-2d  the same with dspark's access pattern: each block's slice a
 *            [rows, 4096] bf16 matrix read in tiles of 16 rows, each stage
 *            four 2-D tensor copies of 16 rows x 256 k (16 runs of 512 B),
 *            as dspark's ring reads a weight: is it slower than 8 KB runs?
 * Each launch's (phase's) blocks read every block output of the launch
 * (phase) before and write their max + 1, so a handover that let a block
 * read too early ends the chain below K: the program checks it and says so.
 *
 *   ./build/bench/bench_boundary [--kernels K] [--mb B] [--reps R] [--smem-kb S]
 *                                [--ring-kb R] [--flight F] [--poll-ns N]
 * Without a GPU it says so and exits 0. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 512
#define COUNTERS 8 /* launches in flight never share a counter pair */

#define CHECK(call)                                                                                             \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "bench_boundary: %s failed: %s (line %d)\n", #call, cudaGetErrorString(e_), __LINE__); \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

enum { MODE_SERIAL, MODE_PDL, MODE_FLAG };

struct link {
    const int *prev_out; /* the previous launch's block outputs (NULL: the first launch) */
    int *out;            /* this launch's */
    int *prev_done;      /* flag: the previous launch's done / passed counters */
    int *done;           /* flag: this launch's done counter */
};

__device__ __forceinline__ int load_acquire(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__global__ void __launch_bounds__(THREADS) chain_kernel(const uint4 *buf, long long words_per_block, link l, int mode) {
    __shared__ int s_max;
    if (mode == MODE_PDL) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;");
    } else if (mode == MODE_FLAG) {
        if (l.prev_done && threadIdx.x == 0) {
            while (load_acquire(l.prev_done) < (int)gridDim.x) {
            }
            /* The last block through resets the pair for the launch that uses it COUNTERS launches later. */
            if (atomicAdd(l.prev_done + 1, 1) == (int)gridDim.x - 1) {
                atomicExch(l.prev_done, 0);
                atomicExch(l.prev_done + 1, 0);
            }
        }
        __syncthreads();
        asm volatile("griddepcontrol.launch_dependents;");
    }
    /* The stream: this block's slice, 4 loads in flight a thread. */
    const uint4 *w = buf + (long long)blockIdx.x * words_per_block;
    unsigned acc = 0;
    for (long long i = threadIdx.x; i < words_per_block; i += 4 * THREADS) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const long long j = i + (long long)u * THREADS;
            v[u] = j < words_per_block ? __ldcs(w + j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    /* The handover: every block output of the launch before, read through L2. */
    if (threadIdx.x == 0) s_max = 0;
    __syncthreads();
    if (l.prev_out)
        for (int b = threadIdx.x; b < (int)gridDim.x; b += THREADS) atomicMax(&s_max, __ldcg(l.prev_out + b));
    __syncthreads();
    if (threadIdx.x == 0) {
        l.out[blockIdx.x] = s_max + 1 + (acc == 0x9e3779b9u); /* acc keeps the stream; it is never that value */
        if (mode == MODE_FLAG) {
            __threadfence();
            atomicAdd(l.done, 1);
        }
    }
}

/* ---- ring: K phases in one persistent launch ----------------------------- */

#define RING_CONSUMERS 16
#define RING_STAGE (32 * 1024) /* bytes a stage: 4 copies of 8 KB */
#define RING_COPY (8 * 1024)
#define RING_MAX_SLOTS 32
#define RING_BARS 1024 /* bytes of the ring's barriers, before its slots */

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

/* How the producer requests a stage: 8 KB contiguous runs, the same with an L2 hint, or 2-D boxes. */
enum { COPY_1D, COPY_1D_HINT, COPY_2D };
#define TILE_K 4096 /* ring-2d: the matrix's row (8 KB of bf16) */
#define BOX_K 256   /* ... a box: 16 rows x 256 k, as dspark's weight boxes */

struct ring_args {
    const uint4 *buf;
    long long wpb, per_launch; /* 16-byte words a block and a phase; a phase's words */
    int n_parts, phases, slots, flight, barrier, poll_ns, copy;
    int rows_b;                /* ring-2d: a block's rows a phase (a multiple of 16; wpb = rows_b * 512) */
    int *outs, *ctr;
};

__global__ void __launch_bounds__((RING_CONSUMERS + 1) * 32)
    ring_kernel(ring_args a, const __grid_constant__ CUtensorMap map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* Hopper's bulk copies; main checks the device */
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int s_max;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t full0 = smem_u32(smem), empty0 = full0 + 8 * RING_MAX_SLOTS;
    unsigned char *ring = smem + RING_BARS;
    if (threadIdx.x == 0) {
        for (int i = 0; i < a.slots; i++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(full0 + 8 * i) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(empty0 + 8 * i), "r"(RING_CONSUMERS) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const long long bytes = a.wpb * 16;
    const int per_phase = (int)((bytes + RING_STAGE - 1) / RING_STAGE), total = per_phase * a.phases;
    if (warp == RING_CONSUMERS) { /* the producer: one thread, never waits for a phase */
        if (lane) return;
        uint64_t evict_first;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(evict_first));
        for (int it = 0; it < total; it++) {
            const int slot = it % a.slots, p = it / per_phase, j = it % per_phase;
            if (it >= a.slots) mbar_wait(empty0 + 8 * slot, ((it / a.slots) - 1) & 1);
            if (a.flight && it >= a.flight) {
                const int q = it - a.flight;
                mbar_wait(full0 + 8 * (q % a.slots), (q / a.slots) & 1);
            }
            const long long off = (long long)j * RING_STAGE;
            const int n = (int)(bytes - off < RING_STAGE ? bytes - off : RING_STAGE);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(full0 + 8 * slot), "r"(n)
                         : "memory");
            const uint32_t dst = smem_u32(ring + (size_t)slot * RING_STAGE), full = full0 + 8 * slot;
            if (a.copy == COPY_2D) { /* tile j / 4 of the block's rows, k (j % 4) * 1024 .. + 1023 */
                const int row = (p % a.n_parts) * (int)gridDim.x * a.rows_b + (int)blockIdx.x * a.rows_b + (j / 4) * 16;
                for (int b = 0; b < 4; b++)
                    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::"
                                 "cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst + b * RING_COPY),
                                 "l"((uint64_t)&map), "r"((j % 4) * 4 * BOX_K + b * BOX_K), "r"(row), "r"(full),
                                 "l"(evict_first)
                                 : "memory");
                continue;
            }
            const char *src = (const char *)(a.buf + (p % a.n_parts) * a.per_launch + blockIdx.x * a.wpb) + off;
            for (int c = 0; c < n; c += RING_COPY) {
                const int len = n - c < RING_COPY ? n - c : RING_COPY;
                if (a.copy == COPY_1D_HINT)
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
                                 "[%1], %2, [%3], %4;" ::"r"(dst + c),
                                 "l"(src + c), "r"(len), "r"(full), "l"(evict_first)
                                 : "memory");
                else
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                                     dst + c),
                                 "l"(src + c), "r"(len), "r"(full)
                                 : "memory");
            }
        }
        return;
    }
    unsigned acc = 0;
    int prev_max = 0;
    for (int it = 0; it < total; it++) {
        const int slot = it % a.slots, p = it / per_phase, j = it % per_phase;
        mbar_wait(full0 + 8 * slot, (it / a.slots) & 1);
        const long long off = (long long)j * RING_STAGE;
        const int words = (int)((bytes - off < RING_STAGE ? bytes - off : RING_STAGE) / 16);
        const uint4 *st = (const uint4 *)(ring + (size_t)slot * RING_STAGE);
        for (int i = threadIdx.x; i < words; i += RING_CONSUMERS * 32) {
            const uint4 v = st[i];
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
        __syncwarp();
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(empty0 + 8 * slot) : "memory");
        if (j < per_phase - 1) continue;
        /* The phase's end: this block's output, the grid barrier, then every block's output of this phase. */
        asm volatile("bar.sync 1, %0;" ::"r"(RING_CONSUMERS * 32) : "memory");
        if (threadIdx.x == 0) {
            int *out = a.outs + (size_t)p * gridDim.x;
            out[blockIdx.x] = prev_max + 1 + (acc == 0x9e3779b9u);
            if (a.barrier) {
                asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(a.ctr) : "memory");
                const int want = (int)gridDim.x * (p + 1);
                while (load_acquire(a.ctr) < want)
                    if (a.poll_ns) __nanosleep(a.poll_ns);
                int m = 0;
                for (int b = 0; b < (int)gridDim.x; b++) m = max(m, __ldcg(out + b));
                s_max = m;
            } else {
                s_max = prev_max + 1;
            }
        }
        asm volatile("bar.sync 1, %0;" ::"r"(RING_CONSUMERS * 32) : "memory");
        prev_max = s_max;
    }
#endif
}

/* pdl: a programmatic launch (never the chain's first: the memset before it must not be overlapped). */
static void launch(const uint4 *buf, long long wpb, int grid, size_t smem, link l, int mode, bool pdl,
                   cudaStream_t s) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1] = {};
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&cfg, chain_kernel, buf, wpb, l, mode));
}

/* Ends a timed run begun with e0 on s: its milliseconds, after checking that the chain of K launches or phases
 * counted to K (a handover that let a block read too early ends it lower: says so and exits). */
static float timed_end(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, const int *outs, int kernels, int grid,
                       const char *what) {
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaStreamSynchronize(s));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    int last = 0;
    CHECK(cudaMemcpy(&last, outs + (size_t)(kernels - 1) * grid, sizeof last, cudaMemcpyDeviceToHost));
    if (last != kernels) {
        printf("%s: the chain ended at %d, not %d: a launch or phase read the one before too early\n", what, last,
               kernels);
        exit(1);
    }
    return ms;
}

int main(int argc, char **argv) {
    int kernels = 200, reps = 5, smem_kb = 160, ring_kb = 192, flight = 2, poll_ns = 0;
    double mb = 32.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kernels") && i + 1 < argc) kernels = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ring-kb") && i + 1 < argc) ring_kb = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--flight") && i + 1 < argc) flight = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--poll-ns") && i + 1 < argc) poll_ns = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--smem-kb") && i + 1 < argc) smem_kb = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_boundary [--kernels K] [--mb B] [--reps R] [--smem-kb S] [--ring-kb R] "
                            "[--flight F] [--poll-ns N]\n");
            return 2;
        }
    }
    const int slots = ring_kb * 1024 / RING_STAGE;
    if (kernels < 2 || reps < 1 || mb < 0 || smem_kb < 0 || smem_kb > 227 || slots < 2 || slots > RING_MAX_SLOTS ||
        RING_BARS + slots * RING_STAGE > 227 * 1024 || flight < 0 || poll_ns < 0) {
        fprintf(stderr, "bench_boundary: --kernels >= 2, --reps >= 1, --mb >= 0, --smem-kb 0..227, --ring-kb 64..224 "
                        "(32 KB stages), --flight >= 0 (0: the ring's depth), --poll-ns >= 0\n");
        return 2;
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("bench_boundary: no CUDA device, nothing to time\n");
        return 0;
    }
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    const int grid = prop.multiProcessorCount;
    /* Shared memory a block holds (unused): at 160 KB one block fits an SM, so a launch's blocks enter only as
     * the previous launch's leave, as dspark's ring matmul's do; 0 lets them wait beside. */
    const size_t smem = (size_t)smem_kb * 1024;
    CHECK(cudaFuncSetAttribute(chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    /* Each launch streams its own part of a buffer larger than L2 (as consecutive layers' weights do). */
    const long long wpb = (long long)(mb * 1e6 / 16.0 / grid), per_launch = wpb * grid;
    const int parts = per_launch > 0 ? (int)(((long long)1 << 30) / 16 / per_launch) : 1; /* ~1 GB in all */
    const int n_parts = parts < 1 ? 1 : parts > kernels ? kernels : parts;
    uint4 *buf;
    CHECK(cudaMalloc(&buf, (size_t)(per_launch * n_parts + 1) * 16));
    CHECK(cudaMemset(buf, 1, (size_t)(per_launch * n_parts + 1) * 16));
    int *outs, *ctr;
    CHECK(cudaMalloc(&outs, (size_t)kernels * grid * sizeof(int)));
    CHECK(cudaMalloc(&ctr, COUNTERS * 2 * sizeof(int)));
    CHECK(cudaMemset(ctr, 0, COUNTERS * 2 * sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));

    printf("%s, %d SMs; %d launches of %d blocks x %d threads (%d KB of shared memory each), each streaming %.1f MB "
           "(%d distinct parts), best of %d\n",
           prop.name, grid, kernels, grid, THREADS, smem_kb, per_launch * 16 / 1e6, n_parts, reps);
    const char *names[] = {"serial", "pdl", "flag"};
    double best[3] = {1e30, 1e30, 1e30};
    for (int r = 0; r < reps; r++)
        for (int mode = 0; mode < 3; mode++) {
            CHECK(cudaMemsetAsync(outs, 0, (size_t)kernels * grid * sizeof(int), s));
            CHECK(cudaEventRecord(e0, s));
            for (int k = 0; k < kernels; k++) {
                link l;
                l.prev_out = k ? outs + (size_t)(k - 1) * grid : NULL;
                l.out = outs + (size_t)k * grid;
                l.prev_done = k ? ctr + 2 * ((k - 1) % COUNTERS) : NULL;
                l.done = ctr + 2 * (k % COUNTERS);
                launch(buf + (k % n_parts) * per_launch, wpb, grid, smem, l, mode, mode != MODE_SERIAL && k > 0, s);
            }
            const float ms = timed_end(s, e0, e1, outs, kernels, grid, names[mode]);
            if (ms < best[mode]) best[mode] = ms;
            /* The last launch's pair is never passed through: clear the counters for the next pass. */
            if (mode == MODE_FLAG) CHECK(cudaMemset(ctr, 0, COUNTERS * 2 * sizeof(int)));
        }
    /* The floor: the same bytes in one launch. */
    float one = 1e30f;
    for (int r = 0; r < reps; r++) {
        link l = {NULL, outs, NULL, ctr};
        CHECK(cudaEventRecord(e0, s));
        for (int k = 0; k < kernels; k += n_parts) {
            const int n = kernels - k < n_parts ? kernels - k : n_parts;
            chain_kernel<<<grid, THREADS, smem, s>>>(buf, wpb * n, l, MODE_SERIAL);
        }
        CHECK(cudaEventRecord(e1, s));
        CHECK(cudaStreamSynchronize(s));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms < one) one = ms;
    }
    /* The ring (Hopper on): the same K slices as K phases of one launch, with and without the barrier between
     * them, then the barrier-free stream with the L2 hint and with dspark's 2-D boxes. */
    const bool ring_on = prop.major >= 9;
    const size_t ring_smem = RING_BARS + (size_t)slots * RING_STAGE;
    CHECK(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ring_smem));
    /* ring-2d: each block's rows a phase, whole 16-row tiles of 8 KB rows within its slice. */
    const int rows_b = (int)(wpb * 16 / (TILE_K * 2)) / 16 * 16;
    CUtensorMap map;
    memset(&map, 0, sizeof map);
    bool map_ok = false;
    if (ring_on && rows_b > 0) {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess && fn) {
            const cuuint64_t dims[2] = {TILE_K, (cuuint64_t)(per_launch * n_parts * 16 / (TILE_K * 2))},
                             strides[1] = {TILE_K * 2};
            const cuuint32_t box[2] = {BOX_K, 16}, estr[2] = {1, 1};
            map_ok = ((PFN_cuTensorMapEncodeTiled_v12000)fn)(
                         &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, buf, dims, strides, box, estr,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
        }
    }
    const char *ring_names[] = {"ring", "ring-free", "ring-hint", "ring-2d"};
    /* Best ms of one variant (0 where it cannot run). */
    auto run_ring = [&](int copy, int barrier) -> double {
        if (!ring_on || (copy == COPY_2D && !map_ok)) return 0;
        const long long w = copy == COPY_2D ? (long long)rows_b * TILE_K * 2 / 16 : wpb;
        ring_args ra = {buf, w, per_launch, n_parts, kernels, slots, flight < slots ? flight : 0, barrier,
                        poll_ns, copy, rows_b, outs, ctr};
        double best_ms = 1e30;
        for (int r = 0; r < reps; r++) {
            CHECK(cudaMemsetAsync(outs, 0, (size_t)kernels * grid * sizeof(int), s));
            CHECK(cudaMemsetAsync(ctr, 0, sizeof(int), s));
            CHECK(cudaEventRecord(e0, s));
            ring_kernel<<<grid, (RING_CONSUMERS + 1) * 32, ring_smem, s>>>(ra, map);
            CHECK(cudaGetLastError());
            const int name = copy == COPY_1D ? (barrier ? 0 : 1) : copy + 1; /* (ring_names' order) */
            const float ms = timed_end(s, e0, e1, outs, kernels, grid, ring_names[name]);
            if (ms < best_ms) best_ms = ms;
        }
        return best_ms;
    };
    const double ring_ms[4] = {run_ring(COPY_1D, 1), run_ring(COPY_1D, 0), run_ring(COPY_1D_HINT, 0),
                               run_ring(COPY_2D, 0)};
    const double ring_bytes[4] = {(double)wpb * 16 * grid * kernels, (double)wpb * 16 * grid * kernels,
                                  (double)wpb * 16 * grid * kernels, (double)rows_b * TILE_K * 2 * grid * kernels};
    const double bytes = (double)per_launch * 16 * kernels;
    printf("ring: %d slots of %d KB, at most %d in flight, poll sleep %d ns; ring-2d: %d rows a block a phase\n", slots,
           RING_STAGE / 1024, flight && flight < slots ? flight : slots, poll_ns, rows_b);
    printf("%-9s %10s %12s %12s %10s\n", "mode", "ms", "us/launch", "over stream", "TB/s");
    for (int mode = 0; mode < 3; mode++)
        printf("%-9s %10.3f %12.2f %12.2f %10.2f\n", names[mode], best[mode], 1e3 * best[mode] / kernels,
               1e3 * (best[mode] - one) / kernels, bytes / (best[mode] * 1e-3) / 1e12);
    printf("%-9s %10.3f %12.2f %12s %10.2f\n", "stream", (double)one, 1e3 * one / kernels, "-",
           bytes / (one * 1e-3) / 1e12);
    for (int m = 0; m < 4; m++)
        if (ring_ms[m] > 0) /* (ring-2d streams its own bytes: compare its TB/s) */
            printf("%-9s %10.3f %12.2f %12.2f %10.2f\n", ring_names[m], ring_ms[m], 1e3 * ring_ms[m] / kernels,
                   m < 3 ? 1e3 * (ring_ms[m] - one) / kernels : 0.0, ring_bytes[m] / (ring_ms[m] * 1e-3) / 1e12);
    cudaFree(buf);
    cudaFree(outs);
    cudaFree(ctr);
    return 0;
}
