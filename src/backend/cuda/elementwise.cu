/* Element-wise ops and the embedding gather on the GPU. Each element is
 * computed on its own with the CPU backend's formula (same operation order;
 * libm-accurate expf/tanhf, no fast-math), so rows never interact. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/quant_load.cuh"

enum { EW_ADD, EW_SCALE, EW_SWIGLU, EW_GEGLU_TANH, EW_SOFTCAP, EW_ROUND_BF16, EW_COPY };

/* out = f(a, b) over a rows x cols view; b may be absent. blockIdx.y walks
 * rows (strided by gridDim.y), x blocks walk columns. */
__global__ void ew_kernel(int op, float *__restrict__ o, int64_t os, const float *a, int64_t as, const float *b,
                          int64_t bs, int64_t rows, int64_t cols, float s) {
    ds_cu_grid_wait();
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        float x = a[r * as + c], y;
        switch (op) {
        case EW_ADD: y = x + b[r * bs + c]; break;
        case EW_SCALE: y = x * s; break;
        case EW_SWIGLU: y = x / (1.0f + expf(-x)) * b[r * bs + c]; break;
        case EW_GEGLU_TANH: y = ds_cu_gelu_tanh_mul(x, b[r * bs + c]); break;
        case EW_SOFTCAP: y = tanhf(x / s) * s; break;
        case EW_COPY: y = x; break;
        default: y = ds_cu_rbf16(x); break;
        }
        o[r * os + c] = y;
    }
}

static void ew(ds_backend *be, const char *name, int op, ds_tensor out, ds_tensor a, ds_tensor b, float s) {
    ds_cuda_backend *cb = ds_cu(be);
    if (out.rows <= 0 || out.cols <= 0) return;
    const int threads = 256;
    dim3 grid((unsigned)((out.cols + threads - 1) / threads), ds_cu_rows_grid(out.rows));
    ds_cu_launch(ew_kernel, grid, threads, cb->stream, op, (float *)out.data, out.stride, (const float *)a.data,
                 a.stride, (const float *)b.data, b.stride, out.rows, out.cols, s);
    ds_cu_launched(cb, name);
}

void ds_cu_add(ds_backend *be, ds_tensor out, ds_tensor a, ds_tensor b) { ew(be, "add", EW_ADD, out, a, b, 0); }
void ds_cu_scale(ds_backend *be, ds_tensor x, float s) { ew(be, "scale", EW_SCALE, x, x, ds_no_tensor(), s); }
void ds_cu_swiglu(ds_backend *be, ds_tensor out, ds_tensor gate, ds_tensor up) {
    ew(be, "swiglu", EW_SWIGLU, out, gate, up, 0);
}
void ds_cu_geglu_tanh(ds_backend *be, ds_tensor out, ds_tensor gate, ds_tensor up) {
    ew(be, "geglu_tanh", EW_GEGLU_TANH, out, gate, up, 0);
}
void ds_cu_softcap(ds_backend *be, ds_tensor x, float cap) { ew(be, "softcap", EW_SOFTCAP, x, x, ds_no_tensor(), cap); }
void ds_cu_round_bf16(ds_backend *be, ds_tensor x) {
    ew(be, "round_bf16", EW_ROUND_BF16, x, x, ds_no_tensor(), 0);
}
/* A copy as a kernel, not a copy-engine node: a memcpy node in a captured
 * step cannot take part in programmatic dependent launch, so the kernel
 * after it waited for the whole chain to drain (the target's tap layers and
 * the drafter's Markov steps copy a row each). */
/* A copy between dtypes (a K/V cache in the model's dtype, model/kv_cache.h):
 * each element read as fp32 (exact) and stored rounded to dst's dtype
 * (ds_cu_to16: the CPU's rounding), so fp32 -> bf16 / f16 rounds, the way
 * back widens and equal 16-bit dtypes keep their bits. */
__global__ void copy_cast_kernel(void *o, int odt, int64_t os, const void *a, int adt, int64_t as, int64_t rows,
                                 int64_t cols) {
    ds_cu_grid_wait();
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float x = ds_cu_load(a, adt, r * as + c);
        if (odt == DS_F32) ((float *)o)[r * os + c] = x;
        else ((uint16_t *)o)[r * os + c] = ds_cu_to16(x, odt == DS_F16);
    }
}

void ds_cu_copy_kernel(ds_backend *be, ds_tensor dst, ds_tensor src) {
    if (dst.dtype == DS_F32 && src.dtype == DS_F32) {
        ew(be, "copy", EW_COPY, dst, src, ds_no_tensor(), 0);
        return;
    }
    ds_cuda_backend *cb = ds_cu(be);
    if (!ds_cu_kv_dtype_ok(dst.dtype) || !ds_cu_kv_dtype_ok(src.dtype)) {
        ds_cu_fail(cb, "copy", "from %s to %s (fp32, bf16 or f16)", ds_dtype_name(src.dtype),
                   ds_dtype_name(dst.dtype));
        return;
    }
    if (dst.rows <= 0 || dst.cols <= 0) return;
    const int threads = 256;
    dim3 grid((unsigned)((dst.cols + threads - 1) / threads), ds_cu_rows_grid(dst.rows));
    ds_cu_launch(copy_cast_kernel, grid, threads, cb->stream, dst.data, (int)dst.dtype, dst.stride,
                 (const void *)src.data, (int)src.dtype, src.stride, dst.rows, dst.cols);
    ds_cu_launched(cb, "copy");
}

/* Token ids of one launch, by value. */
typedef struct {
    int32_t v[DS_CU_ROWS];
} ids_arg;

/* out[i] = table[ids[i]] * scale; blockIdx.y = row of the launch. The ids
 * by value, or from the device (dids, a step region's: checked on the host
 * before the region; one outside the table gives a row of zeros). */
__global__ void embed_kernel(float *__restrict__ out, int64_t os, const void *table, int dtype, int64_t ts,
                             int64_t cols, ids_arg ids, const int32_t *dids, int64_t vocab, float scale) {
    ds_cu_grid_wait();
    const int i = blockIdx.y;
    const int64_t id = dids ? dids[i] : ids.v[i];
    const bool ok = id >= 0 && id < vocab;
    const int64_t base = ok ? id * ts : 0;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += (int64_t)gridDim.x * blockDim.x) {
        float v = ok ? ds_cu_load(table, dtype, base + c) : 0.0f;
        out[i * os + c] = scale != 1.0f ? v * scale : v;
    }
}

/* embed_kernel over a quantized table (quant_load.cuh): each element fma(code, scale, bias). */
__global__ void embed_quant_kernel(float *__restrict__ out, int64_t os, ds_cu_qw q, int64_t cols, ids_arg ids,
                                   const int32_t *dids, int64_t vocab, float scale) {
    ds_cu_grid_wait();
    const int i = blockIdx.y;
    const int64_t id = dids ? dids[i] : ids.v[i];
    const bool ok = id >= 0 && id < vocab;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += (int64_t)gridDim.x * blockDim.x) {
        float v = ok ? ds_cu_load1_q(q, id, c) : 0.0f;
        out[i * os + c] = scale != 1.0f ? v * scale : v;
    }
}

void ds_cu_embed(ds_backend *be, ds_tensor out, ds_tensor table, const int32_t *ids, float scale) {
    ds_cuda_backend *cb = ds_cu(be);
    if (out.rows <= 0 || out.cols <= 0 || !ds_cu_float_dtype(cb, "embed", table.dtype)) return;
    for (int64_t i = 0; i < out.rows; i++)
        if (ids[i] < 0 || ids[i] >= table.rows) {
            ds_cu_fail(cb, "embed", "token id %d is outside the table's %lld rows", ids[i], (long long)table.rows);
            return;
        }
    const int threads = 256;
    unsigned gx = (unsigned)((out.cols + threads - 1) / threads);
    if (gx > 64) gx = 64;
    const int32_t *dids = NULL;
    if (cb->reg.active && !(dids = ds_cu_step_ptr(cb, "embed", ids, out.rows))) return;
    for (int64_t r0 = 0; r0 < out.rows; r0 += DS_CU_ROWS) {
        int n = (int)(out.rows - r0 < DS_CU_ROWS ? out.rows - r0 : DS_CU_ROWS);
        ids_arg a;
        for (int i = 0; i < n; i++) a.v[i] = dids ? 0 : ids[r0 + i];
        if (table.q.bits)
            ds_cu_launch(embed_quant_kernel, dim3(gx, (unsigned)n), threads, cb->stream,
                         (float *)out.data + r0 * out.stride, out.stride, ds_cu_qw_of(table), out.cols, a,
                         dids ? dids + r0 : NULL, table.rows, scale);
        else
            ds_cu_launch(embed_kernel, dim3(gx, (unsigned)n), threads, cb->stream, (float *)out.data + r0 * out.stride,
                         out.stride, table.data, table.dtype, table.stride, out.cols, a, dids ? dids + r0 : NULL,
                         table.rows, scale);
        if (!ds_cu_launched(cb, "embed")) return;
    }
}
