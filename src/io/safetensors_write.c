#include "io/safetensors_write.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t ds_st_spec_nbytes(const ds_st_spec *s) {
    if (s->ndim < 0 || s->ndim > DS_MAX_DIMS) return 0;
    size_t n = ds_dtype_size(s->dtype);
    for (int i = 0; i < s->ndim; i++) {
        if (s->shape[i] < 0) return 0;
        n *= (size_t)s->shape[i];
    }
    return n;
}

/* The header JSON, padded with spaces to a multiple of 8 bytes. */
static ds_error *build_header(const char *path, const ds_st_spec *specs, size_t n, char **out, size_t *len) {
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const ds_st_spec *s = &specs[i];
        if (s->ndim < 0 || s->ndim > DS_MAX_DIMS || !s->name || !*s->name) {
            cJSON_Delete(root);
            return ds_errorf("%s: tensor %zu has no name or %d dims (0..%d)", path, i, s->ndim, DS_MAX_DIMS);
        }
        if (cJSON_GetObjectItemCaseSensitive(root, s->name)) {
            cJSON_Delete(root);
            return ds_errorf("%s: tensor %s is listed twice", path, s->name);
        }
        size_t nb = ds_st_spec_nbytes(s);
        cJSON *t = cJSON_AddObjectToObject(root, s->name);
        cJSON_AddStringToObject(t, "dtype", ds_dtype_name(s->dtype));
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < s->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)s->shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + nb)));
        off += nb;
    }
    char *js = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!js) return ds_errorf("%s: out of memory building the header", path);
    size_t l = strlen(js), padded = (l + 7) / 8 * 8;
    char *h = malloc(padded + 1);
    if (!h) {
        free(js);
        return ds_errorf("%s: out of memory building the header", path);
    }
    memcpy(h, js, l);
    memset(h + l, ' ', padded - l);
    h[padded] = 0;
    free(js);
    *out = h;
    *len = padded;
    return NULL;
}

ds_error *ds_safetensors_write(const char *path, const ds_st_spec *specs, size_t n, size_t block_bytes,
                               ds_st_fill_fn fill, void *user) {
    if (!block_bytes) block_bytes = (size_t)64 << 20;
    block_bytes = block_bytes / 8 * 8;
    if (!block_bytes) block_bytes = 8;
    char *hdr = NULL;
    size_t hlen = 0;
    DS_TRY(build_header(path, specs, n, &hdr, &hlen));
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return ds_errorf("%s: cannot create: %s", path, strerror(errno));
    }
    ds_error *e = NULL;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    if (fwrite(len8, 1, 8, f) != 8 || fwrite(hdr, 1, hlen, f) != hlen)
        e = ds_errorf("%s: write failed: %s", path, strerror(errno));
    free(hdr);
    void *buf = e ? NULL : malloc(block_bytes);
    if (!e && !buf) e = ds_errorf("%s: out of memory for a %zu-byte write block", path, block_bytes);
    for (size_t i = 0; i < n && !e; i++) {
        size_t nb = ds_st_spec_nbytes(&specs[i]);
        for (size_t off = 0; off < nb && !e; off += block_bytes) {
            size_t m = nb - off < block_bytes ? nb - off : block_bytes;
            e = fill(user, i, off, buf, m);
            if (e) e = ds_error_wrap(e, "%s: tensor %s", path, specs[i].name);
            else if (fwrite(buf, 1, m, f) != m)
                e = ds_errorf("%s: write failed in tensor %s: %s", path, specs[i].name, strerror(errno));
        }
    }
    free(buf);
    if (fclose(f) && !e) e = ds_errorf("%s: close failed: %s", path, strerror(errno));
    if (e) remove(path);
    return e;
}
