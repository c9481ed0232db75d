/* Quantized weights on the CPU (ds_quant, MLX's affine layout): used in
 * place from the mapping like the other weights. The panel matmul keeps a
 * quantized weight's codes in its panels (cpu_panel.c, 1 or 1/2 byte a
 * weight) and its kernel dequantizes each weight with one fused
 * multiply-add, fma(code, scale, bias): the fp32 value of the dequantized
 * weight, so every product is the chain an fp32 weight holding those values
 * gives (fp32 panels, which a call packs where the cache has none): the
 * same row invariance and the same bits. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "base/affine_quant.h"

static bool aligned(const void *p, size_t a) { return (uintptr_t)p % a == 0; }

ds_error *ds_cpu_weight_quant(ds_backend *be, const ds_quant_src *src, int64_t rows, int64_t cols, ds_tensor *out) {
    const int64_t words = cols * src->bits / 32, groups = cols / src->group;
    const size_t es = ds_dtype_size(src->scales->dtype), wb = (size_t)(rows * words) * 4,
                 sb = (size_t)(rows * groups) * es;
    if (src->w->nbytes != wb || src->scales->nbytes != sb || src->biases->nbytes != sb)
        return ds_errorf("tensor %s: %zu / %zu / %zu bytes of words / scales / biases, expected %zu / %zu / %zu",
                         src->w->name, src->w->nbytes, src->scales->nbytes, src->biases->nbytes, wb, sb, sb);
    *out = (ds_tensor){.dtype = src->scales->dtype, .data = (void *)src->w->data, .rows = rows, .cols = cols,
                       .stride = words,
                       .q = {.bits = src->bits, .group = src->group, .scales = src->scales->data,
                             .biases = src->biases->data}};
    /* safetensors promises byte alignment only: an unaligned part gets the
     * three copied into one owned, aligned block (freed with the words). */
    if (!aligned(src->w->data, 4) || !aligned(src->scales->data, es) || !aligned(src->biases->data, es)) {
        char *p = NULL;
        if (posix_memalign((void **)&p, 64, wb + 2 * sb + 64) != 0)
            return ds_errorf("tensor %s: cannot allocate %zu bytes", src->w->name, wb + 2 * sb);
        memcpy(p, src->w->data, wb);
        memcpy(p + wb, src->scales->data, sb);
        memcpy(p + wb + sb, src->biases->data, sb);
        out->data = p;
        out->q.scales = p + wb;
        out->q.biases = p + wb + sb;
        out->owned = true;
    }
    ds_cpu_pack_register(&((ds_cpu_backend *)be)->packs, *out);
    return NULL;
}

void ds_cpu_dequant_row(ds_tensor w, int64_t n, float *out) {
    const int64_t groups = w.cols / w.q.group;
    const size_t es = ds_dtype_size(w.dtype);
    ds_dequant_row((const uint32_t *)w.data + n * w.stride, (const char *)w.q.scales + (size_t)(n * groups) * es,
                   (const char *)w.q.biases + (size_t)(n * groups) * es, w.dtype, w.q.bits, w.q.group, w.cols, out);
}
