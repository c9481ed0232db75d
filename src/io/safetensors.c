#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A header larger than this is certainly corrupt (real ones are < 10 MB). */
#define MAX_HEADER_BYTES ((uint64_t)100 << 20)

static int cmp_by_name(const void *a, const void *b) {
    return strcmp(((const ds_st_tensor *)a)->name, ((const ds_st_tensor *)b)->name);
}

static int cmp_by_offset(const void *a, const void *b) {
    const ds_st_tensor *x = a, *y = b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    return px < py ? -1 : px > py;
}

void ds_safetensors_close(ds_safetensors *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    if (st->map && st->map != MAP_FAILED) munmap(st->map, st->map_size);
    free(st->path);
    free(st);
}

static ds_error *parse_tensor(const ds_safetensors *st, const cJSON *item, const uint8_t *data,
                              uint64_t data_size, ds_st_tensor *t) {
    const char *nm = item->string;
    if (!cJSON_IsObject(item)) return ds_errorf("tensor %s: header entry is not an object", nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt)) return ds_errorf("tensor %s: missing dtype", nm);
    int dtype = ds_dtype_parse(dt->valuestring);
    if (dtype < 0) return ds_errorf("tensor %s: unknown dtype \"%s\"", nm, dt->valuestring);
    if (!cJSON_IsArray(shape)) return ds_errorf("tensor %s: missing shape", nm);
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !cJSON_IsNumber(cJSON_GetArrayItem(offs, 0)) ||
        !cJSON_IsNumber(cJSON_GetArrayItem(offs, 1)))
        return ds_errorf("tensor %s: data_offsets must be [begin, end]", nm);
    int nd = cJSON_GetArraySize(shape);
    if (nd > DS_MAX_DIMS) return ds_errorf("tensor %s: %d dimensions (max %d)", nm, nd, DS_MAX_DIMS);
    t->dtype = (ds_dtype)dtype;
    t->ndim = nd;
    uint64_t count = 1;
    for (int i = 0; i < nd; i++) {
        const cJSON *d = cJSON_GetArrayItem(shape, i);
        if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 9.0e15 ||
            d->valuedouble != (double)(int64_t)d->valuedouble)
            return ds_errorf("tensor %s: shape[%d] is not a non-negative integer", nm, i);
        t->shape[i] = (int64_t)d->valuedouble;
        if (t->shape[i] && count > UINT64_MAX / (uint64_t)t->shape[i])
            return ds_errorf("tensor %s: shape overflows", nm);
        count *= (uint64_t)t->shape[i];
    }
    if (count > UINT64_MAX / ds_dtype_size(t->dtype)) return ds_errorf("tensor %s: shape overflows", nm);
    double b = cJSON_GetArrayItem(offs, 0)->valuedouble, e = cJSON_GetArrayItem(offs, 1)->valuedouble;
    if (b != floor(b) || e != floor(e)) /* before the range check, which would call it an overlap */
        return ds_errorf("tensor %s: data_offsets [%.17g, %.17g] are not integer byte offsets", nm, b, e);
    if (!(b >= 0 && e >= b && e <= (double)data_size))
        return ds_errorf("tensor %s: data_offsets [%.0f, %.0f] outside the %llu-byte data section of %s", nm, b,
                         e, (unsigned long long)data_size, st->path);
    uint64_t begin = (uint64_t)b, end = (uint64_t)e;
    uint64_t want = count * ds_dtype_size(t->dtype);
    if (end - begin != want)
        return ds_errorf("tensor %s: %llu bytes stored but shape and dtype %s need %llu", nm,
                         (unsigned long long)(end - begin), ds_dtype_name(t->dtype), (unsigned long long)want);
    t->data = data + begin;
    t->nbytes = (size_t)want;
    t->name = strdup(nm);
    return t->name ? NULL : ds_errorf("out of memory");
}

static ds_error *parse_header(ds_safetensors *st) {
    const uint8_t *base = st->map;
    if (st->map_size < 8) return ds_errorf("%s: truncated (%zu bytes, no header length)", st->path, st->map_size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
    if (hlen > MAX_HEADER_BYTES || hlen > st->map_size - 8)
        return ds_errorf("%s: header length %llu runs past the end of the %zu-byte file", st->path,
                         (unsigned long long)hlen, st->map_size);
    cJSON *root = cJSON_ParseWithLength((const char *)base + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ds_errorf("%s: header is not a JSON object", st->path);
    }
    const uint8_t *data = base + 8 + hlen;
    uint64_t data_size = st->map_size - 8 - hlen;
    size_t n = 0;
    for (const cJSON *it = root->child; it; it = it->next)
        if (strcmp(it->string, "__metadata__")) n++;
    st->tensors = calloc(n ? n : 1, sizeof *st->tensors);
    ds_error *err = st->tensors ? NULL : ds_errorf("out of memory");
    for (const cJSON *it = root->child; it && !err; it = it->next) {
        if (!strcmp(it->string, "__metadata__")) continue;
        err = parse_tensor(st, it, data, data_size, &st->tensors[st->n_tensors]);
        if (!err) st->n_tensors++;
    }
    cJSON_Delete(root);
    if (err) return ds_error_wrap(err, "%s", st->path);
    /* Names must be unique (JSON lets a key repeat; lookups would see only
     * the first) and two tensors must never share bytes: sort by name, then
     * by start, and compare neighbours. */
    ds_st_tensor *sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (!sorted) return ds_errorf("out of memory");
    memcpy(sorted, st->tensors, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_by_name);
    for (size_t i = 1; i < n && !err; i++)
        if (!strcmp(sorted[i].name, sorted[i - 1].name))
            err = ds_errorf("%s: tensor %s is listed twice in the header", st->path, sorted[i].name);
    qsort(sorted, n, sizeof *sorted, cmp_by_offset);
    for (size_t i = 1; i < n && !err; i++) {
        const uint8_t *prev_end = (const uint8_t *)sorted[i - 1].data + sorted[i - 1].nbytes;
        if (sorted[i].nbytes && sorted[i - 1].nbytes && (const uint8_t *)sorted[i].data < prev_end)
            err = ds_errorf("%s: tensors %s and %s overlap in the data section", st->path, sorted[i - 1].name,
                            sorted[i].name);
    }
    free(sorted);
    return err;
}

ds_error *ds_safetensors_open(const char *path, ds_safetensors **out) {
    *out = NULL;
    ds_safetensors *st = calloc(1, sizeof *st);
    if (!st) return ds_errorf("out of memory");
    st->path = strdup(path);
    /* O_NONBLOCK: a FIFO would otherwise block open() until a writer came;
     * the fstat below refuses anything but a regular file. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        ds_error *e = ds_errorf("%s: cannot open: %s", path, strerror(errno));
        ds_safetensors_close(st);
        return e;
    }
    struct stat sb;
    ds_error *err = NULL;
    if (fstat(fd, &sb) != 0) err = ds_errorf("%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode)) err = ds_errorf("%s: not a regular file", path);
    if (!err && sb.st_size > 0) {
        st->map_size = (size_t)sb.st_size;
        st->map = mmap(NULL, st->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (st->map == MAP_FAILED) {
            st->map = NULL;
            err = ds_errorf("%s: cannot mmap: %s", path, strerror(errno));
        }
    }
    close(fd);
    if (!err) err = parse_header(st);
    if (err) {
        ds_safetensors_close(st);
        return err;
    }
    *out = st;
    return NULL;
}

const ds_st_tensor *ds_safetensors_find(const ds_safetensors *st, const char *name) {
    for (size_t i = 0; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, name)) return &st->tensors[i];
    return NULL;
}
