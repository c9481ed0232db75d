/* What the CUDA op tests (tests/test_cuda_*.c, one program per op family of
 * src/backend/cuda/) share: the two backends, random inputs, tensors held
 * on both backends, and the comparison of the GPU's result with the CPU
 * backend's (the oracle): max |gpu - cpu| / max |cpu| over the output,
 * within a bound per op. Bounds: fp32 reductions in another order (linear,
 * attention, rmsnorm) 2e-5; transcendental element-wise ops and RoPE 2e-6;
 * data movement, add, scale, bf16 rounding exact.
 *
 * RUN_CUDA_TESTS(suite, tests...) is the main of such a program: it makes
 * the GPU backend with the config every op test runs under (below), skips
 * (exit 77) where no CUDA device can be used, and runs setup, the tests,
 * teardown. */
#ifndef DS_TEST_CUDA_VS_CPU_H
#define DS_TEST_CUDA_VS_CPU_H

#include "backend/backend.h"
#include "base/rng.h"
#include "testlib.h"

extern ds_backend *gpu, *cpu;
extern ds_rng urng; /* the host's uniforms (seeded by setup) */

float frand(void); /* uniform in [-1, 1), from a fixed seed */
float *rand_vec(size_t n, float scale);

/* One tensor on each backend holding the same values. */
typedef struct {
    ds_tensor g, c;
    void *host; /* weight bytes the CPU tensor may point into */
} pair;

pair act(int64_t rows, int64_t cols, const float *v); /* v NULL: zeros */
pair act_rand(int64_t rows, int64_t cols, float scale);
/* p->host (rows x cols of dt) as a weight on both backends. */
void weight_load(pair *p, ds_dtype dt, int64_t rows, int64_t cols);
/* A [rows, cols] weight of dtype dt. Values are multiples of 2^-10 in
 * (-1, 1): exact in fp32, bf16 (up to its 8 bits) and f16. */
pair weight(ds_dtype dt, int64_t rows, int64_t cols);
/* A weight on both backends from values exact in dt (bf16 or fp32). */
pair weight_of(ds_dtype dt, const float *v, int64_t rows, int64_t cols);
void release(pair *p);

float *fetch(ds_backend *be, ds_tensor t); /* malloc'd */
void check_gpu_ok(const char *what);       /* a failure if the GPU holds an error */
/* Normalized error of the GPU result against the CPU's; fails above tol. */
double compare(ds_tensor g, ds_tensor c, double tol, const char *what);

/* ---- sampling at T > 0 (test_cuda_sample, test_cuda_markov) ----------------
 * The GPU's sampling ops against the CPU's (which equal src/sample/'s probs, draw and
 * verify bit for bit: test_sample_ops). The GPU computes exp the
 * CPU's way and sums in double in another (fixed) order, so its
 * distributions are expected to match to the last bit or so: bound 1e-6
 * normalized (max |gpu - cpu| / max |cpu| per call; ~16 ulp of the
 * largest probability). Kept sets (top-k / top-p) must be identical, except
 * where the cut is borderline at that tolerance: the k-th and (k+1)-th
 * ranked probabilities within 1e-6 (relative) of each other, or the
 * rank-order cumulative mass within 1e-6 of top_p * kept mass, where
 * probabilities that differ in the last bits may decide either way (counted
 * and printed as "borderline"; with the exp and divisions matching the
 * CPU's bit for bit, expect none). Draws and
 * rejection decisions must be identical, except where a uniform lies within
 * DRAW_EPS (relative) of a CDF step or of an acceptance ratio, or where
 * the host rule applied to the GPU's and to the CPU's distributions
 * disagrees (rounding moved a boundary): counted and printed as "excluded",
 * and there must be few (< 2 %). */
#define SAMPLE_PROB_TOL 1e-6
#define DRAW_EPS 1e-9

typedef struct {
    float T;
    int k;
    float p;
} samp_setting;

extern const samp_setting SAMP[10];
#define N_SAMP (int)(sizeof SAMP / sizeof SAMP[0])

ds_sampling samp(const samp_setting *st);

/* Distance of u * total to the nearest CDF step of row p[V] (the host's
 * sequential sum), relative to the total. */
double draw_margin(const float *p, int64_t V, double u);

/* ---- the program -------------------------------------------------------- */

void cuda_ops_setup(void);    /* the CPU backend, the uniforms' seed */
void cuda_ops_teardown(void); /* no error left on the GPU; both backends destroyed */
/* Makes the GPU backend (exit 77 without one) and runs the tests. */
int cuda_ops_main(const char *suite, const test_fn *fns, const char *const *names, int n);

#define RUN_CUDA_TESTS(suite, ...)                                                      \
    int main(void) {                                                                    \
        test_fn fns_[] = {cuda_ops_setup, __VA_ARGS__, cuda_ops_teardown};              \
        const char *names_[] = {"setup", DS_STRINGS_(__VA_ARGS__), "teardown"};         \
        return cuda_ops_main(suite, fns_, names_, (int)(sizeof fns_ / sizeof fns_[0])); \
    }

#endif
