/* The CUDA backend's matmuls (matmul.cu, matmul_mma.cu, matmul_ring.cu,
 * weight_boxes.cu) and fused linear ops (linear_fused.cu) against the CPU
 * backend on random inputs: normalized error within 2e-5 (fp32 sums in
 * another order), for bf16, fp32 and f16 weights, the row tiers, aligned
 * and unaligned inputs. Row invariance, bit for bit on the GPU: a row of a
 * linear computed in an M-row call equals the same row computed alone
 * (decode vs verify), across the kernels (ring, per-tile, cuBLAS). A fused
 * norm's rounded x is the same bits on every path. Skips (exit 77) where no
 * CUDA device can be used. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_config.h"
#include "cuda_vs_cpu.h"

/* ---- linear ------------------------------------------------------------- */

static void linear_case(ds_dtype dt, int64_t M, int64_t N, int64_t K, bool bias, bool odd_stride) {
    pair w = weight(dt, N, K), b = {0};
    if (bias) b = weight(DS_F32, 1, N);
    /* odd_stride: x is a column window of a wider buffer (no 16-byte loads). */
    pair xb = act_rand(M, K + (odd_stride ? 3 : 0), 1.0f);
    ds_tensor xg = ds_cols(xb.g, odd_stride ? 1 : 0, K), xc = ds_cols(xb.c, odd_stride ? 1 : 0, K);
    pair out = act(M, N, NULL);
    gpu->ops->linear(gpu, out.g, xg, w.g, bias ? b.g : ds_no_tensor());
    cpu->ops->linear(cpu, out.c, xc, w.c, bias ? b.c : ds_no_tensor());
    char what[96];
    snprintf(what, sizeof what, "linear %s M=%lld N=%lld K=%lld%s%s", ds_dtype_name(dt), (long long)M, (long long)N,
             (long long)K, bias ? " +bias" : "", odd_stride ? " unaligned" : "");
    compare(out.g, out.c, 2e-5, what);
    release(&w);
    if (bias) release(&b);
    release(&xb);
    release(&out);
}

static void test_linear_vs_cpu(void) {
    const ds_dtype dts[] = {DS_BF16, DS_F32, DS_F16};
    const int64_t Ms[] = {1, 2, 3, 5, 8, 13, 32, 33, 100};
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) linear_case(dts[t], Ms[i], 300, 1024, i % 2, false);
    linear_case(DS_BF16, 4, 257, 300, true, false);   /* K not a multiple of 8 */
    linear_case(DS_BF16, 5, 130, 1000, false, true);  /* unaligned x */
    linear_case(DS_F32, 7, 64, 4096, true, true);
    linear_case(DS_BF16, 64, 1500, 4096, true, false); /* cuBLAS with widened tiles */
    linear_case(DS_F32, 40, 96, 33, false, true);      /* cuBLAS, odd shapes */
}

/* Row i of an M-row call == row i computed alone, bit for bit, for every
 * narrow row count and for aligned and unaligned inputs. */
static void test_linear_row_invariance(void) {
    /* bf16 with K % 32 == 0 takes the tensor-core kernel, the rest the CUDA-core one. */
    /* bf16 rows of at most 8 take the persistent ring kernel, more rows the
     * one-block-per-tile one: the same sums in the same order. K = 1120 ends
     * on a partial ring stage, and 4000 rows make more tiles than SMs. */
    const ds_dtype dts[] = {DS_BF16, DS_BF16, DS_BF16, DS_F32, DS_F16};
    const int64_t Ks[] = {2048, 1120, 2056, 2056, 2056}, Ns[] = {515, 4000, 515, 515, 515};
    const int64_t MAXM = 32;
    for (int t = 0; t < 5; t++) {
        const int64_t K = Ks[t], N = Ns[t];
        pair w = weight(dts[t], N, K), b = weight(DS_BF16, 1, N);
        pair x = act_rand(MAXM, K, 1.0f);
        pair xu = act(MAXM, K + 1, NULL); /* the same rows at an odd stride */
        gpu->ops->copy(gpu, ds_cols(xu.g, 0, K), x.g);
        pair ref = act(MAXM, N, NULL), out = act(MAXM, N, NULL);
        for (int64_t i = 0; i < MAXM; i++)
            gpu->ops->linear(gpu, ds_rows(ref.g, i, 1), ds_rows(x.g, i, 1), w.g, b.g);
        float *want = fetch(gpu, ref.g);
        const int64_t Ms[] = {2, 3, 4, 5, 8, 9, 17, 32};
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
            for (int u = 0; u < 2; u++) {
                const int64_t M = Ms[mi];
                ds_tensor xin = u ? ds_cols(ds_rows(xu.g, 0, M), 0, K) : ds_rows(x.g, 0, M);
                gpu->ops->linear(gpu, ds_rows(out.g, 0, M), xin, w.g, b.g);
                float *got = fetch(gpu, ds_rows(out.g, 0, M));
                int bad = -1;
                for (int64_t i = 0; i < M && bad < 0; i++)
                    if (memcmp(got + i * N, want + i * N, (size_t)N * 4)) bad = (int)i;
                CHECK(bad < 0, "linear %s: row %d of an M=%lld%s call differs from the 1-row call",
                      ds_dtype_name(dts[t]), bad, (long long)M, u ? " unaligned" : "");
                free(got);
            }
        printf("  linear %s N=%lld K=%lld: rows of M=2..32 calls (aligned and not) == 1-row calls, bitwise\n",
               ds_dtype_name(dts[t]), (long long)N, (long long)K);
        check_gpu_ok("linear row invariance");
        free(want);
        release(&w);
        release(&b);
        release(&x);
        release(&xu);
        release(&ref);
        release(&out);
    }
}

/* ---- fused linear ops ----------------------------------------------------- */

/* The GPU's fused ops against the CPU's unfused sequence (the CPU backend
 * has no fused ops, so the ds_* helpers run linear + add / swiglu there). */
static void fused_case(ds_dtype dt, int64_t M, int64_t K) {
    const int64_t N = 300, NK = 64;
    pair wq = weight(dt, N, K), wk = weight(dt, NK, K), wv = weight(dt, NK, K), bq = weight(DS_F32, 1, N);
    pair wo = weight(dt, K, N), wg = weight(dt, N, K), wu = weight(dt, N, K);
    pair x = act_rand(M, K, 1.0f), att = act_rand(M, N, 1.0f), res = act_rand(M, K, 1.0f);
    pair q = act(M, N, NULL), k = act(M, NK, NULL), v = act(M, NK, NULL), h = act(M, N, NULL), tmp = act(M, N, NULL);
    pair tmpk = act(M, K, NULL);
    char what[96];
    const ds_tensor og[3] = {q.g, k.g, v.g}, wgs[3] = {wq.g, wk.g, wv.g}, bg[3] = {bq.g, ds_no_tensor(), ds_no_tensor()};
    const ds_tensor oc[3] = {q.c, k.c, v.c}, wcs[3] = {wq.c, wk.c, wv.c}, bc[3] = {bq.c, ds_no_tensor(), ds_no_tensor()};
    ds_linear_multi(gpu, 3, og, x.g, wgs, bg);
    ds_linear_multi(cpu, 3, oc, x.c, wcs, bc);
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "linear_multi %s M=%lld K=%lld, output %d", ds_dtype_name(dt), (long long)M,
                 (long long)K, i);
        compare(og[i], oc[i], 2e-5, what);
    }
    /* Residual in place, as the model uses it. */
    ds_linear_residual(gpu, res.g, att.g, wo.g, ds_no_tensor(), res.g, tmpk.g);
    ds_linear_residual(cpu, res.c, att.c, wo.c, ds_no_tensor(), res.c, tmpk.c);
    snprintf(what, sizeof what, "linear_residual %s M=%lld", ds_dtype_name(dt), (long long)M);
    compare(res.g, res.c, 2e-5, what);
    ds_linear_swiglu(gpu, h.g, x.g, wg.g, wu.g, tmp.g);
    ds_linear_swiglu(cpu, h.c, x.c, wg.c, wu.c, tmp.c);
    snprintf(what, sizeof what, "linear_swiglu %s M=%lld", ds_dtype_name(dt), (long long)M);
    compare(h.g, h.c, 2e-5, what);
    /* The input RMSNorm fused in front (the GPU recomputes each row's rms in the matmul). */
    pair nw = weight(M % 2 ? DS_F32 : DS_BF16, 1, K), xn = act(M, K, NULL); /* both norm dtypes */
    ds_rmsnorm_linear_multi(gpu, 3, og, x.g, nw.g, 1e-6f, wgs, bg, xn.g);
    ds_rmsnorm_linear_multi(cpu, 3, oc, x.c, nw.c, 1e-6f, wcs, bc, xn.c);
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "rmsnorm_linear_multi %s M=%lld, output %d", ds_dtype_name(dt), (long long)M, i);
        compare(og[i], oc[i], 2e-5, what);
    }
    ds_rmsnorm_linear_swiglu(gpu, h.g, x.g, nw.g, 1e-6f, wg.g, wu.g, xn.g, tmp.g);
    ds_rmsnorm_linear_swiglu(cpu, h.c, x.c, nw.c, 1e-6f, wg.c, wu.c, xn.c, tmp.c);
    snprintf(what, sizeof what, "rmsnorm_linear_swiglu %s M=%lld", ds_dtype_name(dt), (long long)M);
    compare(h.g, h.c, 2e-5, what);
    /* Gemma's MLP: the GELU-tanh epilogue (the CPU: rmsnorm, two linears, geglu_tanh) */
    ds_rmsnorm_linear_geglu(gpu, h.g, x.g, nw.g, 1e-6f, wg.g, wu.g, xn.g, tmp.g);
    ds_rmsnorm_linear_geglu(cpu, h.c, x.c, nw.c, 1e-6f, wg.c, wu.c, xn.c, tmp.c);
    snprintf(what, sizeof what, "rmsnorm_linear_geglu %s M=%lld", ds_dtype_name(dt), (long long)M);
    compare(h.g, h.c, 2e-5, what);
    pair *all[] = {&wq, &wk, &wv, &bq, &wo, &wg, &wu, &x, &att, &res, &q, &k, &v, &h, &tmp, &tmpk, &nw, &xn};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(all[i]);
}

static void test_fused_linear(void) {
    const int64_t Ms[] = {1, 3, 8, 9, 32, 40};
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
        fused_case(DS_BF16, Ms[i], 1024); /* tensor cores up to M = 32 */
        fused_case(DS_F32, Ms[i], 520);   /* the unfused fallback */
    }
    fused_case(DS_BF16, 4, 1000); /* K % 32 != 0: fallback for bf16 too */
}

/* Fused ops keep rows invariant too: rows of an MAXM-row call == 1-row calls. */
static void fused_row_invariance(int64_t MAXM) {
    /* N = 288: as o_proj's K, at least one ring box (256) and a partial ring stage (288 of 512). */
    const int64_t N = 288, K = 4096;
    pair wg = weight(DS_BF16, N, K), wu = weight(DS_BF16, N, K), wo = weight(DS_BF16, K, N);
    pair x = act_rand(MAXM, K, 1.0f), att = act_rand(MAXM, N, 1.0f);
    pair h1 = act(MAXM, N, NULL), hm = act(MAXM, N, NULL), r1 = act_rand(MAXM, K, 1.0f), rm = act(MAXM, K, NULL);
    gpu->ops->copy(gpu, rm.g, r1.g);
    pair r8 = act(MAXM, K, NULL); /* rows 0-7 as one ring call, 8-12 as another (o_proj's 32-row tiles) */
    gpu->ops->copy(gpu, r8.g, r1.g);
    for (int64_t i = 0; i < MAXM; i++) {
        gpu->ops->linear_swiglu(gpu, ds_rows(h1.g, i, 1), ds_rows(x.g, i, 1), wg.g, wu.g);
        gpu->ops->linear_residual(gpu, ds_rows(r1.g, i, 1), ds_rows(att.g, i, 1), wo.g, ds_no_tensor(),
                                  ds_rows(r1.g, i, 1));
    }
    gpu->ops->linear_swiglu(gpu, hm.g, x.g, wg.g, wu.g);
    gpu->ops->linear_residual(gpu, rm.g, att.g, wo.g, ds_no_tensor(), rm.g);
    gpu->ops->linear_residual(gpu, ds_rows(r8.g, 0, 8), ds_rows(att.g, 0, 8), wo.g, ds_no_tensor(), ds_rows(r8.g, 0, 8));
    gpu->ops->linear_residual(gpu, ds_rows(r8.g, 8, 5), ds_rows(att.g, 8, 5), wo.g, ds_no_tensor(), ds_rows(r8.g, 8, 5));
    /* The fused-norm variant too: each row's rms must not depend on the others. */
    pair nw = weight(DS_BF16, 1, K), n1 = act(MAXM, N, NULL), nm = act(MAXM, N, NULL);
    for (int64_t i = 0; i < MAXM; i++)
        gpu->ops->rmsnorm_linear_swiglu(gpu, ds_rows(n1.g, i, 1), ds_rows(x.g, i, 1), nw.g, 1e-6f, wg.g, wu.g);
    gpu->ops->rmsnorm_linear_swiglu(gpu, nm.g, x.g, nw.g, 1e-6f, wg.g, wu.g);
    float *e1 = fetch(gpu, n1.g), *em = fetch(gpu, nm.g);
    CHECK(!memcmp(e1, em, (size_t)(MAXM * N) * 4), "rmsnorm_linear_swiglu: rows of a %lld-row call differ from 1-row calls",
          (long long)MAXM);
    free(e1), free(em);
    for (int64_t i = 0; i < MAXM; i++)
        gpu->ops->rmsnorm_linear_geglu(gpu, ds_rows(n1.g, i, 1), ds_rows(x.g, i, 1), nw.g, 1e-6f, wg.g, wu.g);
    gpu->ops->rmsnorm_linear_geglu(gpu, nm.g, x.g, nw.g, 1e-6f, wg.g, wu.g);
    e1 = fetch(gpu, n1.g), em = fetch(gpu, nm.g);
    CHECK(!memcmp(e1, em, (size_t)(MAXM * N) * 4),
          "rmsnorm_linear_geglu: rows of a %lld-row call differ from 1-row calls", (long long)MAXM);
    free(e1), free(em);
    float *a = fetch(gpu, h1.g), *b = fetch(gpu, hm.g), *c = fetch(gpu, r1.g), *d = fetch(gpu, rm.g);
    CHECK(!memcmp(a, b, (size_t)(MAXM * N) * 4), "linear_swiglu: rows of a %lld-row call differ from 1-row calls",
          (long long)MAXM);
    CHECK(!memcmp(c, d, (size_t)(MAXM * K) * 4), "linear_residual: rows of a %lld-row call differ from 1-row calls",
          (long long)MAXM);
    float *e8 = fetch(gpu, r8.g);
    CHECK(!memcmp(c, e8, (size_t)(13 * K) * 4), "linear_residual: rows of 8- and 5-row calls differ from 1-row calls");
    free(e8);
    release(&r8);
    /* rmsnorm_linear_multi (QKV) the same way: two projections of one normed x (into n1 / h1, nm / hm). */
    const ds_tensor w2[2] = {wg.g, wu.g}, b2[2] = {ds_no_tensor(), ds_no_tensor()}, om[2] = {nm.g, hm.g};
    for (int64_t i = 0; i < MAXM; i++) {
        const ds_tensor o1[2] = {ds_rows(n1.g, i, 1), ds_rows(h1.g, i, 1)};
        gpu->ops->rmsnorm_linear_multi(gpu, 2, o1, ds_rows(x.g, i, 1), nw.g, 1e-6f, w2, b2);
    }
    gpu->ops->rmsnorm_linear_multi(gpu, 2, om, x.g, nw.g, 1e-6f, w2, b2);
    float *q1[2] = {fetch(gpu, n1.g), fetch(gpu, h1.g)}, *qm[2] = {fetch(gpu, nm.g), fetch(gpu, hm.g)};
    for (int o = 0; o < 2; o++) {
        CHECK(!memcmp(q1[o], qm[o], (size_t)(MAXM * N) * 4),
              "rmsnorm_linear_multi output %d: rows of a %lld-row call differ from 1-row calls", o, (long long)MAXM);
        free(q1[o]), free(qm[o]);
    }
    release(&nw), release(&n1), release(&nm);
    printf("  linear_swiglu, linear_residual, rmsnorm_linear_swiglu / _geglu, rmsnorm_linear_multi bf16: rows of a "
           "%lld-row call == 1-row calls, bitwise (linear_residual: of 8- and 5-row calls too)\n",
           (long long)MAXM);
    free(a), free(b), free(c), free(d);
    check_gpu_ok("fused row invariance");
    pair *all[] = {&wg, &wu, &wo, &x, &att, &h1, &hm, &r1, &rm};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(all[i]);
}

static void test_fused_row_invariance(void) { fused_row_invariance(17); }

/* cfg.invariant: rows past the narrow kernels (DS_CU_NARROW_M) take the row-invariant wide product
 * (matmul_invariant.cu) in one call; every row equals the same row computed alone (the narrow kernels), bit for
 * bit, whatever the tile shape the row count picks. K = 96 leaves 13 of the 16 chunk classes empty, K = 1120 ends
 * the classes unevenly, 4000 weight rows fill the big tiles' grid. The fused ops through it at 100 rows. */
static void test_wide_row_invariance(void) {
    if (!DS_X_BF16_ON) {
        printf("  (the fp32-x build: wide rows run as slabs through the narrow kernels, test_batch checks them)\n");
        return;
    }
    ds_cuda_config *cfg = ds_cuda_config_of(gpu);
    const bool was = cfg->invariant;
    cfg->invariant = true;
    const int64_t Ks[] = {2048, 96, 1120, 4096}, Ns[] = {515, 300, 4000, 130};
    const int64_t MAXM = 300;
    for (int t = 0; t < 4; t++) {
        const int64_t K = Ks[t], N = Ns[t];
        pair w = weight(DS_BF16, N, K), b = weight(DS_BF16, 1, N);
        pair x = act_rand(MAXM, K, 1.0f), ref = act(MAXM, N, NULL), out = act(MAXM, N, NULL);
        for (int64_t i = 0; i < MAXM; i++)
            gpu->ops->linear(gpu, ds_rows(ref.g, i, 1), ds_rows(x.g, i, 1), w.g, b.g);
        float *want = fetch(gpu, ref.g);
        const int64_t Ms[] = {33, 64, 100, 257, 300};
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int64_t M = Ms[mi], r0 = MAXM - M; /* the last M rows: tiles start at another row */
            gpu->ops->linear(gpu, ds_rows(out.g, r0, M), ds_rows(x.g, r0, M), w.g, b.g);
            float *got = fetch(gpu, ds_rows(out.g, r0, M));
            int64_t bad = -1, nbad = 0;
            for (int64_t i = 0; i < M * N; i++)
                if (memcmp(&got[i], &want[r0 * N + i], 4)) bad = bad < 0 ? i : bad, nbad++;
            CHECK(nbad == 0, "invariant linear N=%lld K=%lld: %lld values of an M=%lld call differ from 1-row calls "
                  "(first: row %lld, col %lld: %.9g vs %.9g)", (long long)N, (long long)K, (long long)nbad,
                  (long long)M, (long long)(bad / N), (long long)(bad % N), bad < 0 ? 0.0 : got[bad],
                  bad < 0 ? 0.0 : want[r0 * N + bad]);
            free(got);
        }
        printf("  invariant linear bf16 N=%lld K=%lld: rows of M=33..300 calls == 1-row calls, bitwise\n", (long long)N,
               (long long)K);
        check_gpu_ok("invariant linear");
        free(want);
        release(&w), release(&b), release(&x), release(&ref), release(&out);
    }
    fused_row_invariance(100);
    cfg->invariant = was;
}

/* DS_X_BF16: a fused norm computes the same bits on every path (the ring at 1 and 8 rows, the per-tile kernel at
 * 20, the wide path at 64, the CPU): x * w rounds to the same bf16 values, and each row's 1 / rms, taken in the
 * tile order everywhere, scales the products' sums. Through an identity weight the output is 1 / rms times x * w's
 * rounded value (one exact product a sum), so the rows must agree bit for bit; an rms one ulp apart moves them. */
static void test_normed_x_paths(void) {
    if (!DS_X_BF16_ON) {
        printf("  (the fp32-x build: x is not rounded, nothing to check)\n");
        return;
    }
    const int64_t K = 2048, MAXM = 64;
    pair eye = {0};
    eye.host = calloc((size_t)(K * K), 2);
    for (int64_t i = 0; i < K; i++) ((uint16_t *)eye.host)[i * K + i] = ds_f32_to_bf16(1.0f);
    weight_load(&eye, DS_BF16, K, K);
    pair nw = weight(DS_BF16, 1, K), x = act_rand(MAXM, K, 3.0f), out = act(MAXM, K, NULL), xn = act(MAXM, K, NULL);
    const ds_tensor b1[1] = {ds_no_tensor()};
    ds_rmsnorm_linear_multi(cpu, 1, &out.c, x.c, nw.c, 1e-6f, &eye.c, b1, xn.c); /* (the CPU: norm, then linear) */
    float *want = fetch(cpu, out.c);
    const int64_t Ms[] = {1, 8, 20, MAXM};
    for (size_t c = 0; c < sizeof Ms / sizeof Ms[0]; c++) {
        for (int64_t r0 = 0; r0 + Ms[c] <= MAXM; r0 += Ms[c] == 1 ? 21 : Ms[c]) {
            const ds_tensor o = ds_rows(out.g, r0, Ms[c]);
            gpu->ops->rmsnorm_linear_multi(gpu, 1, &o, ds_rows(x.g, r0, Ms[c]), nw.g, 1e-6f, &eye.g, b1);
        }
        check_gpu_ok("rmsnorm_linear_multi through the identity");
        float *got = fetch(gpu, out.g);
        int64_t bad = -1, nbad = 0;
        for (int64_t r = 0; r < MAXM; r++) {
            if (Ms[c] == 1 && r % 21) continue;
            for (int64_t k = 0; k < K; k++)
                if (memcmp(&got[r * K + k], &want[r * K + k], 4)) bad = bad < 0 ? r * K + k : bad, nbad++;
        }
        printf("  rmsnorm_linear_multi bf16 through the identity, %2lld-row calls: %lld values differ from the CPU's\n",
               (long long)Ms[c], (long long)nbad);
        CHECK(nbad == 0, "%lld-row calls: %lld rounded values differ from the CPU's (first: row %lld, k %lld: %.9g vs %.9g)",
              (long long)Ms[c], (long long)nbad, (long long)(bad / K), (long long)(bad % K), got[bad], want[bad]);
        free(got);
    }
    free(want);
    release(&eye), release(&nw), release(&x), release(&out), release(&xn);
}

/* weights_join: QKV and gate/up as rows of one allocation each, which the wide path multiplies in one GEMM.
 * Under cfg.invariant the outputs are the same bits as from the weights apart (every output's sums keep their
 * order whatever the GEMM's width); without, cuBLAS's, within 2e-5 of the CPU. At 1 and 8 rows (the narrow
 * kernels, which take each weight as a segment anyway) the same bits as apart too. Then each weight released
 * on its own: the allocation goes with the last, no error. */
static void test_joined_weights(void) {
    const int64_t K = 1024, NQ = 384, NKV = 128, F = 320, MAXM = 64;
    pair q = weight(DS_BF16, NQ, K), k = weight(DS_BF16, NKV, K), v = weight(DS_BF16, NKV, K);
    pair g = weight(DS_BF16, F, K), u = weight(DS_BF16, F, K), nw = weight(DS_BF16, 1, K);
    pair bq = weight(DS_F32, 1, NQ), x = act_rand(MAXM, K, 1.0f);
    pair oq = act(MAXM, NQ, NULL), ok = act(MAXM, NKV, NULL), ov = act(MAXM, NKV, NULL), oh = act(MAXM, F, NULL);
    const ds_tensor no = ds_no_tensor();
    ds_cuda_config *cfg = ds_cuda_config_of(gpu);
    const bool was = cfg->invariant;
    const int64_t Ms[] = {1, 8, MAXM};
    float *apart[2][3][4] = {{{0}}}; /* [invariant][M][q k v h] */
    for (int pass = 0; pass < 2; pass++) { /* 0: apart, 1: joined */
        if (pass == 1) {
            ds_tensor *const qkv[3] = {&q.g, &k.g, &v.g}, *const gu[2] = {&g.g, &u.g};
            check_gpu_ok("before weights_join");
            CHECK(gpu->ops->weights_join && !gpu->ops->weights_join(gpu, 3, qkv) &&
                      !gpu->ops->weights_join(gpu, 2, gu),
                  "weights_join failed");
            CHECK(ds_weights_adjacent(q.g, k.g) && ds_weights_adjacent(k.g, v.g) && ds_weights_adjacent(g.g, u.g),
                  "weights_join left the weights apart");
        }
        for (int inv = 0; inv < 2; inv++) {
            if (inv && !DS_X_BF16_ON) continue; /* (the fp32-x build: slabs through the narrow kernels) */
            cfg->invariant = inv;
            for (int mi = 0; mi < 3; mi++) {
                const int64_t M = Ms[mi];
                const ds_tensor outs[3] = {ds_rows(oq.g, 0, M), ds_rows(ok.g, 0, M), ds_rows(ov.g, 0, M)};
                const ds_tensor ws[3] = {q.g, k.g, v.g}, bs[3] = {bq.g, no, no};
                gpu->ops->rmsnorm_linear_multi(gpu, 3, outs, ds_rows(x.g, 0, M), nw.g, 1e-6f, ws, bs);
                gpu->ops->rmsnorm_linear_swiglu(gpu, ds_rows(oh.g, 0, M), ds_rows(x.g, 0, M), nw.g, 1e-6f, g.g, u.g);
                check_gpu_ok("projections");
                const pair *o[4] = {&oq, &ok, &ov, &oh};
                for (int j = 0; j < 4; j++) {
                    float *got = fetch(gpu, ds_rows(o[j]->g, 0, M));
                    if (pass == 0) {
                        apart[inv][mi][j] = got;
                        continue;
                    }
                    const size_t bytes = (size_t)(M * o[j]->g.cols) * 4;
                    if (inv || M <= 8) {
                        CHECK(!memcmp(got, apart[inv][mi][j], bytes),
                              "joined weights, output %d at M=%lld (invariant %d): not the bits of the weights apart",
                              j, (long long)M, inv);
                    }
                    free(got);
                }
                if (pass == 1 && !inv && M == MAXM) { /* cuBLAS over the joined weights, against the CPU */
                    const ds_tensor co[3] = {oq.c, ok.c, ov.c}, cw[3] = {q.c, k.c, v.c}, cbs[3] = {bq.c, no, no};
                    cpu->ops->rmsnorm_linear_multi(cpu, 3, co, x.c, nw.c, 1e-6f, cw, cbs);
                    cpu->ops->rmsnorm_linear_swiglu(cpu, oh.c, x.c, nw.c, 1e-6f, g.c, u.c);
                    compare(oq.g, oq.c, 2e-5, "joined q (+bias), 64 rows, cuBLAS");
                    compare(ok.g, ok.c, 2e-5, "joined k, 64 rows, cuBLAS");
                    compare(ov.g, ov.c, 2e-5, "joined v, 64 rows, cuBLAS");
                    compare(oh.g, oh.c, 2e-5, "joined gate/up + SwiGLU, 64 rows, cuBLAS");
                }
            }
        }
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int o = 0; o < 4; o++) free(apart[i][j][o]);
    cfg->invariant = was;
    printf("  weights_join: QKV (+bias) and gate/up joined == apart, bitwise at 1 / 8 rows and invariant at 64; "
           "cuBLAS at 64 within 2e-5 of the CPU\n");
    release(&k), release(&q), release(&u), release(&v), release(&g); /* any order: the allocation goes last */
    check_gpu_ok("releasing joined weights");
    release(&nw), release(&bq), release(&x), release(&oq), release(&ok), release(&ov), release(&oh);
}

/* ops->exact_rows (the batched engine around its steps): 1 sends bf16 products of 9..32 rows to cuBLAS
 * (cfg.narrow_rows 8; still within the CPU's bound), nothing under cfg.invariant; the previous setting comes back
 * and restores the single-request engine's 32. */
static void test_exact_rows(void) {
    ds_cuda_config *cfg = ds_cuda_config_of(gpu);
    const bool inv = cfg->invariant;
    cfg->invariant = false;
    const int was = gpu->ops->exact_rows(gpu, 1);
    CHECK(was == 32 && cfg->narrow_rows == 8, "exact_rows(1): previous %d (want 32), narrow_rows %d (want 8)", was,
          cfg->narrow_rows);
    linear_case(DS_BF16, 16, 515, 2048, true, false);
    linear_case(DS_BF16, 31, 300, 1024, false, false);
    CHECK(gpu->ops->exact_rows(gpu, was) == 8 && cfg->narrow_rows == 32, "exact_rows(32) puts 32 back");
    cfg->invariant = true;
    CHECK(gpu->ops->exact_rows(gpu, 1) == 32 && cfg->narrow_rows == 32, "under invariant, exact_rows changes nothing");
    cfg->invariant = inv;
    check_gpu_ok("exact_rows");
}

RUN_CUDA_TESTS("cuda_matmul", test_linear_vs_cpu, test_linear_row_invariance, test_fused_linear,
               test_fused_row_invariance, test_wide_row_invariance, test_normed_x_paths, test_joined_weights,
               test_exact_rows)
