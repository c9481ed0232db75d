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
 * Each launch's blocks read every block output of the launch before and
 * write their max + 1, so a handover that let a block read too early ends
 * the chain below K: the program checks it and says so.
 *
 *   ./build/bench/bench_boundary [--kernels K] [--mb B] [--reps R] [--smem-kb S]
 * Without a GPU it says so and exits 0. */
#include <cuda_runtime.h>
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

int main(int argc, char **argv) {
    int kernels = 200, reps = 5, smem_kb = 160;
    double mb = 32.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kernels") && i + 1 < argc) kernels = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--smem-kb") && i + 1 < argc) smem_kb = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_boundary [--kernels K] [--mb B] [--reps R] [--smem-kb S]\n");
            return 2;
        }
    }
    if (kernels < 2 || reps < 1 || mb < 0 || smem_kb < 0 || smem_kb > 227) {
        fprintf(stderr, "bench_boundary: --kernels >= 2, --reps >= 1, --mb >= 0, --smem-kb 0..227\n");
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
            CHECK(cudaEventRecord(e1, s));
            CHECK(cudaStreamSynchronize(s));
            float ms;
            CHECK(cudaEventElapsedTime(&ms, e0, e1));
            int last = 0;
            CHECK(cudaMemcpy(&last, outs + (size_t)(kernels - 1) * grid, sizeof last, cudaMemcpyDeviceToHost));
            if (last != kernels) {
                printf("%s: the chain ended at %d, not %d: a launch read the one before too early\n", names[mode], last,
                       kernels);
                return 1;
            }
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
    const double bytes = (double)per_launch * 16 * kernels;
    printf("%-8s %10s %12s %12s %10s\n", "mode", "ms", "us/launch", "over stream", "TB/s");
    for (int mode = 0; mode < 3; mode++)
        printf("%-8s %10.3f %12.2f %12.2f %10.2f\n", names[mode], best[mode], 1e3 * best[mode] / kernels,
               1e3 * (best[mode] - one) / kernels, bytes / (best[mode] * 1e-3) / 1e12);
    printf("%-8s %10.3f %12.2f %12s %10.2f\n", "stream", (double)one, 1e3 * one / kernels, "-",
           bytes / (one * 1e-3) / 1e12);
    cudaFree(buf);
    cudaFree(outs);
    cudaFree(ctr);
    return 0;
}
