/* The CUDA op tests' shared part (cuda_vs_cpu.h). */
#include "cuda_vs_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_config.h"

ds_backend *gpu, *cpu;
ds_rng urng;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

float *rand_vec(size_t n, float scale) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
    return v;
}

pair act(int64_t rows, int64_t cols, const float *v) {
    pair p = {0};
    ds_error *e = gpu->ops->alloc(gpu, DS_F32, rows, cols, &p.g);
    if (!e) e = cpu->ops->alloc(cpu, DS_F32, rows, cols, &p.c);
    if (e) {
        CHECK(0, "alloc: %s", ds_error_message(e));
        ds_error_free(e);
        return p;
    }
    if (v) {
        gpu->ops->upload(gpu, p.g, v);
        cpu->ops->upload(cpu, p.c, v);
    }
    return p;
}

pair act_rand(int64_t rows, int64_t cols, float scale) {
    float *v = rand_vec((size_t)(rows * cols), scale);
    pair p = act(rows, cols, v);
    free(v);
    return p;
}

/* f16 bits of a value exactly representable as a normal f16 (or zero). */
static uint16_t f16_exact(float f) {
    if (f == 0) return 0;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    return (uint16_t)(sign | ((exp - 112) << 10) | (man >> 13));
}

/* p->host (rows x cols of dt) as a weight on both backends. */
void weight_load(pair *p, ds_dtype dt, int64_t rows, int64_t cols) {
    const size_t nbytes = (size_t)(rows * cols) * ds_dtype_size(dt);
    ds_st_tensor st = {.name = "w", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .data = p->host, .nbytes = nbytes};
    ds_error *e = gpu->ops->weight(gpu, &st, rows, cols, &p->g);
    if (!e) e = cpu->ops->weight(cpu, &st, rows, cols, &p->c);
    if (e) {
        CHECK(0, "weight: %s", ds_error_message(e));
        ds_error_free(e);
    }
}

/* A [rows, cols] weight of dtype dt. Values are multiples of 2^-10 in
 * (-1, 1): exact in fp32, bf16 (up to its 8 bits) and f16. */
pair weight(ds_dtype dt, int64_t rows, int64_t cols) {
    pair p = {0};
    size_t n = (size_t)(rows * cols), es = ds_dtype_size(dt);
    p.host = malloc(n * es + 16);
    for (size_t i = 0; i < n; i++) {
        float f = (float)((int)(frand() * 1023.0f)) / 1024.0f;
        if (dt == DS_BF16) {
            uint16_t b = ds_f32_to_bf16(f);
            memcpy((char *)p.host + i * 2, &b, 2);
        } else if (dt == DS_F16) {
            uint16_t h = f16_exact(f);
            memcpy((char *)p.host + i * 2, &h, 2);
        } else {
            memcpy((char *)p.host + i * 4, &f, 4);
        }
    }
    weight_load(&p, dt, rows, cols);
    return p;
}

void release(pair *p) {
    gpu->ops->release(gpu, &p->g);
    cpu->ops->release(cpu, &p->c);
    free(p->host);
    p->host = NULL;
}

float *fetch(ds_backend *be, ds_tensor t) {
    size_t n = (size_t)(t.rows * t.cols);
    float *v = malloc((n ? n : 1) * sizeof *v);
    be->ops->download(be, t, v);
    return v;
}

void check_gpu_ok(const char *what) {
    ds_error *e = ds_backend_check(gpu);
    if (e) {
        CHECK(0, "%s: %s", what, ds_error_message(e));
        ds_error_free(e);
    }
}

/* Normalized error of the GPU result against the CPU's; fails above tol. */
double compare(ds_tensor g, ds_tensor c, double tol, const char *what) {
    check_gpu_ok(what);
    float *a = fetch(gpu, g), *b = fetch(cpu, c);
    double err = rel_err_max(a, b, (size_t)(g.rows * g.cols));
    printf("  %-44s err %.2e (bound %.0e)\n", what, err, tol);
    CHECK(err <= tol, "%s: normalized error %.3g over %.3g", what, err, tol);
    free(a);
    free(b);
    return err;
}

/* A weight on both backends from values exact in dt. */
pair weight_of(ds_dtype dt, const float *v, int64_t rows, int64_t cols) {
    pair p = {0};
    const size_t n = (size_t)(rows * cols), es = ds_dtype_size(dt);
    p.host = malloc(n * es);
    for (size_t i = 0; i < n; i++) {
        if (dt == DS_BF16) ((uint16_t *)p.host)[i] = ds_f32_to_bf16(v[i]);
        else ((float *)p.host)[i] = v[i];
    }
    weight_load(&p, dt, rows, cols);
    return p;
}

/* ---- sampling at T > 0 ---------------------------------------------------- */

const samp_setting SAMP[10] = {{1.0f, 0, 1.0f},   {0.7f, 20, 1.0f},   {1.0f, 0, 0.8f},  {0.8f, 50, 0.9f},
                                {1.3f, 1, 1.0f},   {0.6f, 0, 0.05f},   {1.0f, 5000, 1.0f}, {0.9f, 0, 0.97f},
                                {1.5f, 100, 0.5f}, {1.0f, 6000, 0.99f}};

ds_sampling samp(const samp_setting *st) {
    ds_sampling s = {.temperature = st->T, .top_k = st->k, .top_p = st->p};
    return s;
}

/* Distance of u * total to the nearest CDF step of row p[V] (the host's
 * sequential sum), relative to the total. */
double draw_margin(const float *p, int64_t V, double u) {
    double total = 0, cum = 0, m = INFINITY;
    for (int64_t i = 0; i < V; i++) total += p[i];
    const double t = u * total;
    for (int64_t i = 0; i < V; i++) {
        if (p[i] <= 0) continue;
        cum += p[i];
        m = fmin(m, fabs(cum - t));
    }
    return total > 0 ? m / total : INFINITY;
}

/* ---- the program -------------------------------------------------------- */

void cuda_ops_setup(void) {
    CHECK_OK(ds_backend_cpu_new(2, &cpu));
    ds_rng_seed(&urng, 31337);
}
void cuda_ops_teardown(void) {
    check_gpu_ok("teardown");
    gpu->ops->destroy(gpu);
    cpu->ops->destroy(cpu);
}

int cuda_ops_main(const char *suite, const test_fn *fns, const char *const *names, int n) {
    ds_cuda_config cfg;
    ds_error *e = ds_cuda_config_from_env(&cfg);
    if (e) {
        printf("FAIL: %s\n", ds_error_message(e));
        ds_error_free(e);
        return 1;
    }
    /* Every shape of these tests through the ring matmul where it applies (M <= 8), however few its tiles:
     * the engine sends small projections to the per-tile kernel, which the M > 8 calls check against it. */
    cfg.ring_min_tiles = 1;
    /* The fused norm + attention launch from one row on (the engine keeps decode's one row on the two ops). */
    cfg.fused_attn_min_rows = 1;
    /* Attention packs a kv head's query heads into one block however small the grid (the engine only packs
     * grids of DS_CU_ATT_PACK_MIN_BLOCKS blocks on), so the packed path is what every attention case here
     * checks. */
    cfg.att_pack_min_blocks = 1;
    const char *dev = getenv("DS_CUDA_DEVICE");
    e = ds_backend_cuda_new_with(dev ? atoi(dev) : 0, &cfg, &gpu);
    if (e) {
        printf("SKIP: no CUDA device [%s]\n", ds_error_message(e));
        ds_error_free(e);
        return 77;
    }
    return run_tests(suite, fns, names, n);
}
