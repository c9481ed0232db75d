#include "io/checkpoint.h"
#include "io/config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

ds_error *ds_read_file(const char *path, char **out, size_t *len) { return ds_read_file_max(path, SIZE_MAX - 1, out, len); }

ds_error *ds_read_file_max(const char *path, size_t max_bytes, char **out, size_t *len) {
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
     * writer forever; the fstat below then refuses it. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return ds_errorf("%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ds_errorf("%s: not a readable regular file", path);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return ds_errorf("%s: cannot open: %s", path, strerror(errno));
    }
    if ((unsigned long long)sb.st_size > max_bytes) {
        fclose(f);
        return ds_errorf("%s: %lld bytes, more than the %zu this file may have", path, (long long)sb.st_size,
                         max_bytes);
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return ds_errorf("%s: out of memory (%zu bytes)", path, n);
    }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        free(buf);
        return ds_errorf("%s: short read (%zu of %zu bytes)", path, got, n);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return NULL;
}

ds_error *ds_read_stream(FILE *f, const char *name, char **out, size_t *len) {
    *out = NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) return ds_errorf("%s: out of memory (%zu bytes read)", name, n);
        if (n + 1 >= cap) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown) free(buf);
            buf = grown;
            continue;
        }
        size_t k = fread(buf + n, 1, cap - 1 - n, f);
        n += k;
        if (k == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return ds_errorf("%s: read error", name);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return NULL;
}

ds_error *ds_read_json(const char *path, cJSON **out) {
    char *text;
    size_t len = 0;
    DS_TRY(ds_read_file(path, &text, &len));
    *out = cJSON_ParseWithLength(text, len);
    ds_error *e = NULL;
    if (!*out) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= text && at <= text + len ? (long)(at - text) : -1;
        e = ds_errorf("%s: invalid JSON near byte %ld", path, off);
    }
    free(text);
    return e;
}

char *ds_path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

bool ds_path_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static ds_error *add_shard(ds_checkpoint *ck, const char *file) {
    for (size_t i = 0; i < ck->n_shards; i++) {
        const char *p = ck->shards[i]->path;
        size_t lp = strlen(p), lf = strlen(file);
        if (lp >= lf && !strcmp(p + lp - lf, file) && (lp == lf || p[lp - lf - 1] == '/')) return NULL;
    }
    if (strchr(file, '/') || !strcmp(file, "..")) return ds_errorf("shard name \"%s\" is not a plain file name", file);
    char *path = ds_path_join(ck->dir, file);
    if (!path) return ds_errorf("out of memory");
    ds_safetensors **grown = realloc(ck->shards, (ck->n_shards + 1) * sizeof *grown);
    if (!grown) {
        free(path);
        return ds_errorf("out of memory");
    }
    ck->shards = grown;
    ds_error *e = ds_safetensors_open(path, &ck->shards[ck->n_shards]);
    free(path);
    if (!e) ck->n_shards++;
    return e;
}

static ds_error *open_index(ds_checkpoint *ck, const char *index_path) {
    cJSON *idx;
    DS_TRY(ds_read_json(index_path, &idx));
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    ds_error *e = NULL;
    if (!map) e = ds_errorf("%s: missing weight_map", index_path);
    else if (!cJSON_IsObject(map)) e = ds_errorf("%s: weight_map is not an object of tensor: file name", index_path);
    for (const cJSON *it = map ? map->child : NULL; it && !e; it = it->next) {
        if (!cJSON_IsString(it)) e = ds_errorf("%s: weight_map[%s] is not a file name", index_path, it->string);
        else e = add_shard(ck, it->valuestring);
    }
    cJSON_Delete(idx);
    return e;
}

void ds_checkpoint_close(ds_checkpoint *ck) {
    if (!ck) return;
    for (size_t i = 0; i < ck->n_shards; i++) ds_safetensors_close(ck->shards[i]);
    free(ck->shards);
    cJSON_Delete(ck->config);
    cJSON_Delete(ck->generation);
    free(ck->dir);
    free(ck);
}

ds_error *ds_checkpoint_open(const char *dir, ds_checkpoint **out) {
    *out = NULL;
    ds_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck) return ds_errorf("out of memory");
    ck->dir = strdup(dir);
    ck->name_prefix = "";
    ds_error *e = NULL;
    char *cfg = ds_path_join(dir, "config.json"), *gen = ds_path_join(dir, "generation_config.json"),
         *idx = ds_path_join(dir, "model.safetensors.index.json"), *single = ds_path_join(dir, "model.safetensors");
    struct stat sb;
    if (!ck->dir || !cfg || !gen || !idx || !single) e = ds_errorf("out of memory");
    else if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) e = ds_errorf("%s: not a model directory", dir);
    if (!e) e = ds_read_json(cfg, &ck->config);
    if (!e && !cJSON_IsObject(ck->config)) e = ds_errorf("%s: not a JSON object", cfg);
    if (!e) e = ds_cfg_check_sizes(ck->config, cfg);
    if (!e && ds_path_exists(gen)) e = ds_read_json(gen, &ck->generation);
    if (!e) {
        if (ds_path_exists(idx)) e = open_index(ck, idx);
        else if (ds_path_exists(single)) e = add_shard(ck, "model.safetensors");
        else e = ds_errorf("%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    free(cfg);
    free(gen);
    free(idx);
    free(single);
    if (e) {
        ds_checkpoint_close(ck);
        return e;
    }
    *out = ck;
    return NULL;
}

const ds_st_tensor *ds_checkpoint_find(const ds_checkpoint *ck, const char *name) {
    char full[512];
    snprintf(full, sizeof full, "%s%s", ck->name_prefix, name);
    for (size_t i = 0; i < ck->n_shards; i++) {
        const ds_st_tensor *t = ds_safetensors_find(ck->shards[i], full);
        if (t) return t;
    }
    return NULL;
}

static void format_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

ds_error *ds_checkpoint_tensor(const ds_checkpoint *ck, const char *name, int ndim, const int64_t *shape,
                               const ds_st_tensor **out) {
    const ds_st_tensor *t = ds_checkpoint_find(ck, name);
    *out = NULL;
    if (!t) return ds_errorf("%s: missing tensor %s%s", ck->dir, ck->name_prefix, name);
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char want[128], got[128];
        format_shape(want, sizeof want, ndim, shape);
        format_shape(got, sizeof got, t->ndim, t->shape);
        return ds_errorf("%s: tensor %s has shape %s, expected %s", ck->dir, t->name, got, want);
    }
    if (t->dtype != DS_F32 && t->dtype != DS_BF16 && t->dtype != DS_F16)
        return ds_errorf("%s: tensor %s has dtype %s (need F32, BF16 or F16)", ck->dir, t->name,
                         ds_dtype_name(t->dtype));
    *out = t;
    return NULL;
}
