#include "io/quant_checkpoint.h"

#include <stdlib.h>
#include <string.h>

#include "base/affine_quant.h"
#include "io/config.h"

/* mlx-lm writes the block as "quantization" (and a copy as
 * "quantization_config" for transformers); either will do. */
static const cJSON *quant_block(const cJSON *config) {
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(config, "quantization");
    if (!q) q = cJSON_GetObjectItemCaseSensitive(config, "quantization_config");
    return q && !cJSON_IsNull(q) ? q : NULL;
}

static ds_error *read_layout(const cJSON *obj, const char *where, const char *what, int *bits, int *group) {
    int64_t b, g;
    DS_TRY(ds_cfg_int(obj, where, "bits", &b));
    DS_TRY(ds_cfg_int(obj, where, "group_size", &g));
    const char *mode = ds_cfg_str(obj, "mode");
    if (mode && strcmp(mode, "affine"))
        return ds_errorf("%s: %s.mode \"%s\" is not supported (affine)", where, what, mode);
    if (!ds_quant_bits_ok((int)b) || b != (int)b)
        return ds_errorf("%s: %s.bits %lld is not supported (4 or 8)", where, what, (long long)b);
    if (!ds_quant_group_ok((int)g) || g != (int)g)
        return ds_errorf("%s: %s.group_size %lld is not supported (32, 64 or 128)", where, what, (long long)g);
    *bits = (int)b;
    *group = (int)g;
    return NULL;
}

ds_error *ds_quant_config_for(const cJSON *config, const char *where, const char *path, bool *quantized, int *bits,
                              int *group) {
    *quantized = false;
    const cJSON *q = quant_block(config);
    if (!q) return NULL;
    if (!cJSON_IsObject(q)) return ds_errorf("%s: quantization is not an object", where);
    const cJSON *ov = cJSON_GetObjectItemCaseSensitive(q, path);
    if (ov) {
        if (cJSON_IsFalse(ov)) return NULL;
        if (!cJSON_IsObject(ov))
            return ds_errorf("%s: quantization.\"%s\" is neither an object nor false", where, path);
        char what[300];
        snprintf(what, sizeof what, "quantization.\"%s\"", path);
        DS_TRY(read_layout(ov, where, what, bits, group));
    } else {
        DS_TRY(read_layout(q, where, "quantization", bits, group));
    }
    *quantized = true;
    return NULL;
}

static bool is_float(ds_dtype t) { return t == DS_F32 || t == DS_BF16 || t == DS_F16; }

static ds_error *check_2d(const ds_checkpoint *ck, const ds_st_tensor *t, int64_t r, int64_t c) {
    if (t->ndim != 2 || t->shape[0] != r || t->shape[1] != c) {
        if (t->ndim == 2)
            return ds_errorf("%s: tensor %s has shape [%lld, %lld], expected [%lld, %lld]", ck->dir, t->name,
                             (long long)t->shape[0], (long long)t->shape[1], (long long)r, (long long)c);
        return ds_errorf("%s: tensor %s has %d dimensions, expected [%lld, %lld]", ck->dir, t->name, t->ndim,
                         (long long)r, (long long)c);
    }
    return NULL;
}

ds_error *ds_checkpoint_quant(const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                              ds_quant_src *out) {
    *out = (ds_quant_src){0};
    const size_t n = strlen(name), sfx = strlen(".weight");
    if (n <= sfx || strcmp(name + n - sfx, ".weight")) return NULL; /* only weights are quantized */
    char base[480], sname[512], bname[512], path[512];
    if (n - sfx >= sizeof base) return ds_errorf("%s: tensor name %s is too long", ck->dir, name);
    memcpy(base, name, n - sfx);
    base[n - sfx] = 0;
    snprintf(sname, sizeof sname, "%s.scales", base);
    snprintf(bname, sizeof bname, "%s.biases", base);
    snprintf(path, sizeof path, "%s%s", ck->name_prefix, base);
    const ds_st_tensor *w = ds_checkpoint_find(ck, name), *s = ds_checkpoint_find(ck, sname),
                       *b = ds_checkpoint_find(ck, bname);
    if (!s && !b) {
        if (w && w->dtype == DS_U32)
            return ds_errorf("%s: tensor %s is packed (U32) but %s%s.scales and .biases are missing", ck->dir,
                             w->name, ck->name_prefix, base);
        return NULL;
    }
    if (!w) return ds_errorf("%s: missing tensor %s%s (its .scales / .biases are present)", ck->dir, ck->name_prefix, name);
    if (!s) return ds_errorf("%s: missing tensor %s%s.scales (beside %s)", ck->dir, ck->name_prefix, base, w->name);
    if (!b) return ds_errorf("%s: missing tensor %s%s.biases (beside %s)", ck->dir, ck->name_prefix, base, w->name);
    char cfg_where[600];
    snprintf(cfg_where, sizeof cfg_where, "%s/config.json", ck->dir);
    bool quantized;
    int bits = 0, group = 0;
    DS_TRY(ds_quant_config_for(ck->config, cfg_where, path, &quantized, &bits, &group));
    if (!quantized)
        return ds_errorf("%s: tensor %s has scales and biases but config.json's quantization %s", ck->dir, w->name,
                         cJSON_GetObjectItemCaseSensitive(ck->config, "quantization") ||
                                 cJSON_GetObjectItemCaseSensitive(ck->config, "quantization_config")
                             ? "leaves it unquantized"
                             : "block is missing");
    if (w->dtype != DS_U32)
        return ds_errorf("%s: tensor %s has dtype %s, a quantized weight is U32", ck->dir, w->name,
                         ds_dtype_name(w->dtype));
    if (cols % group)
        return ds_errorf("%s: tensor %s: group_size %d does not divide the input dimension %lld", ck->dir, w->name,
                         group, (long long)cols);
    DS_TRY(check_2d(ck, w, rows, cols * bits / 32));
    if (!is_float(s->dtype))
        return ds_errorf("%s: tensor %s has dtype %s (need F32, BF16 or F16)", ck->dir, s->name, ds_dtype_name(s->dtype));
    if (b->dtype != s->dtype)
        return ds_errorf("%s: tensor %s has dtype %s, its scales %s", ck->dir, b->name, ds_dtype_name(b->dtype),
                         ds_dtype_name(s->dtype));
    DS_TRY(check_2d(ck, s, rows, cols / group));
    DS_TRY(check_2d(ck, b, rows, cols / group));
    *out = (ds_quant_src){.w = w, .scales = s, .biases = b, .bits = bits, .group = group};
    return NULL;
}

ds_error *ds_quant_dequantize(const ds_quant_src *q, int64_t rows, int64_t cols, float **out) {
    float *w = malloc((size_t)(rows * cols) * sizeof *w);
    if (!w) return ds_errorf("tensor %s: out of memory dequantizing %lld x %lld", q->w->name, (long long)rows,
                             (long long)cols);
    const int64_t words = cols * q->bits / 32, groups = cols / q->group;
    const size_t es = ds_dtype_size(q->scales->dtype);
    for (int64_t r = 0; r < rows; r++)
        ds_dequant_row((const uint32_t *)q->w->data + r * words, (const char *)q->scales->data + (size_t)(r * groups) * es,
                       (const char *)q->biases->data + (size_t)(r * groups) * es, q->scales->dtype, q->bits, q->group,
                       cols, w + r * cols);
    *out = w;
    return NULL;
}
