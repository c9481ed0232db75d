/* The CUDA backend's memory and element-wise ops (cuda_backend.cu,
 * elementwise.cu) against the CPU backend on random inputs, within each
 * op's bound (cuda_vs_cpu.h): upload / download / strided copy, embed,
 * add, swiglu, geglu_tanh, scale, softcap, round_bf16; and errors as
 * values (ds_backend_check). Skips (exit 77) where no CUDA device can be
 * used. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_vs_cpu.h"

/* ---- data movement ------------------------------------------------------ */

static void test_memory(void) {
    const int64_t R = 37, C = 129;
    float *v = rand_vec((size_t)(R * C), 3.0f);
    pair a = act(R, C, v);
    float *back = fetch(gpu, a.g);
    CHECK(!memcmp(back, v, (size_t)(R * C) * 4), "upload/download round trip differs");
    /* Strided views: copy a column window between two row ranges. */
    pair b = act(R, 2 * C, NULL);
    ds_tensor src = ds_cols(ds_rows(a.g, 3, 20), 5, 100), dst = ds_cols(ds_rows(b.g, 10, 20), 77, 100);
    gpu->ops->copy(gpu, dst, src);
    cpu->ops->copy(cpu, ds_cols(ds_rows(b.c, 10, 20), 77, 100), ds_cols(ds_rows(a.c, 3, 20), 5, 100));
    compare(b.g, b.c, 0, "copy (strided views)");
    /* alloc zero-fills. */
    float *z = fetch(gpu, b.g);
    CHECK(z[0] == 0 && z[2 * C * R - 1] == 0, "alloc did not zero-fill");
    free(z);
    free(back);
    free(v);
    release(&a);
    release(&b);
}

static void test_embed(void) {
    const ds_dtype dts[] = {DS_F32, DS_BF16, DS_F16};
    for (int t = 0; t < 3; t++) {
        pair table = weight(dts[t], 1000, 200);
        int32_t ids[70];
        for (int i = 0; i < 70; i++) ids[i] = (int32_t)((frand() + 1.0f) * 499.0f);
        pair out = act(70, 200, NULL);
        const float scale = t == 1 ? 7.5f : 1.0f;
        gpu->ops->embed(gpu, out.g, table.g, ids, scale);
        cpu->ops->embed(cpu, out.c, table.c, ids, scale);
        char what[64];
        snprintf(what, sizeof what, "embed %s x%.1f (70 rows)", ds_dtype_name(dts[t]), scale);
        compare(out.g, out.c, 0, what);
        release(&table);
        release(&out);
    }
}

static void test_elementwise(void) {
    const int64_t R = 9, C = 1537;
    pair a = act_rand(R, C, 6.0f), b = act_rand(R, C, 3.0f), out = act(R, C, NULL);
    gpu->ops->add(gpu, out.g, a.g, b.g);
    cpu->ops->add(cpu, out.c, a.c, b.c);
    compare(out.g, out.c, 0, "add");
    gpu->ops->swiglu(gpu, out.g, a.g, b.g);
    cpu->ops->swiglu(cpu, out.c, a.c, b.c);
    compare(out.g, out.c, 2e-6, "swiglu");
    gpu->ops->geglu_tanh(gpu, out.g, a.g, b.g);
    cpu->ops->geglu_tanh(cpu, out.c, a.c, b.c);
    compare(out.g, out.c, 2e-6, "geglu_tanh");
    /* In place on column views (the model's gemma PLE path). */
    gpu->ops->swiglu(gpu, ds_cols(a.g, 7, 600), ds_cols(a.g, 7, 600), ds_cols(b.g, 100, 600));
    cpu->ops->swiglu(cpu, ds_cols(a.c, 7, 600), ds_cols(a.c, 7, 600), ds_cols(b.c, 100, 600));
    compare(a.g, a.c, 2e-6, "swiglu in place on column views");
    gpu->ops->scale(gpu, b.g, 0.7071f);
    cpu->ops->scale(cpu, b.c, 0.7071f);
    compare(b.g, b.c, 0, "scale");
    gpu->ops->softcap(gpu, b.g, 1.5f);
    cpu->ops->softcap(cpu, b.c, 1.5f);
    compare(b.g, b.c, 2e-6, "softcap");
    pair l = act_rand(R, C, 30.0f);
    gpu->ops->round_bf16(gpu, l.g);
    cpu->ops->round_bf16(cpu, l.c);
    compare(l.g, l.c, 0, "round_bf16");
    release(&a);
    release(&b);
    release(&out);
    release(&l);
}

/* ---- errors are values -------------------------------------------------- */

static void test_errors(void) {
    pair x = act_rand(2, 64, 1.0f);
    int32_t pos[2] = {0, 1};
    ds_attn_params p = {.n_heads = 1, .n_kv_heads = 1, .head_dim = 1024, .v_head_dim = 1024, .n_keys = 2,
                        .causal = true, .scale = 1, .q_pos = pos};
    pair big = act(2, 1024, NULL);
    gpu->ops->attention(gpu, big.g, big.g, big.g, big.g, &p);
    CHECK_ERR(ds_backend_check(gpu), "cuda attention");
    CHECK(ds_backend_check(gpu) == NULL, "check() did not clear the error");
    pair w = weight(DS_BF16, 8, 32);
    gpu->ops->linear(gpu, ds_rows(x.g, 0, 1), x.g, w.g, ds_no_tensor()); /* shapes disagree */
    CHECK_ERR(ds_backend_check(gpu), "cuda linear");
    release(&x);
    release(&big);
    release(&w);
}

RUN_CUDA_TESTS("cuda_elementwise", test_memory, test_embed, test_elementwise, test_errors)
