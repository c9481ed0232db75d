#include "train/train_checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/json_file.h"
#include "io/safetensors.h"
#include "io/safetensors_write.h"

/* Tensors are filled from a whole-tensor host copy, downloaded when the writer reaches its first byte. */
typedef struct {
    const ds_drafter_train *t;
    ds_dtype dtype;
    int n_trainable;
    int *which; /* per spec: the array (weights, m, v), -1 / -2 for embed / lm_head, -3 for steps */
    int *slot;
    float *buf;
    size_t cap;
    int64_t steps;
} fill_ctx;

static void ctx_free(fill_ctx *c) {
    if (!c) return;
    free(c->which);
    free(c->slot);
    free(c);
}

static fill_ctx *ctx_new(size_t n) {
    fill_ctx *c = calloc(1, sizeof *c);
    if (c) c->which = calloc(n, sizeof *c->which), c->slot = calloc(n, sizeof *c->slot);
    if (c && (!c->which || !c->slot)) {
        ctx_free(c);
        return NULL;
    }
    return c;
}

static ds_error *fill(void *user, size_t index, size_t offset, void *out, size_t nbytes) {
    fill_ctx *c = user;
    if (c->which[index] == -3) { /* steps */
        memcpy(out, (const char *)&c->steps + offset, nbytes);
        return NULL;
    }
    const size_t es = ds_dtype_size(c->dtype);
    if (offset == 0) {
        if (c->which[index] < 0) {
            ds_drafter_train_get_frozen(c->t, c->which[index] == -2, c->buf);
        } else {
            ds_drafter_train_get(c->t, c->slot[index], (ds_train_array)c->which[index], c->buf);
        }
    }
    const float *src = c->buf + offset / es;
    const size_t n = nbytes / es;
    if (c->dtype == DS_F32) {
        memcpy(out, src, nbytes);
    } else {
        uint16_t *o = out;
        for (size_t i = 0; i < n; i++) o[i] = ds_f32_to_bf16(src[i]);
    }
    return NULL;
}

static ds_error *make_dir(const char *dir) {
    if (mkdir(dir, 0755) && errno != EEXIST) return ds_errorf("%s: cannot create: %s", dir, strerror(errno));
    return NULL;
}

/* Writes specs to path via path.tmp and a rename. */
static ds_error *write_specs(const char *path, const ds_st_spec *specs, size_t n, fill_ctx *c) {
    size_t cap = 1;
    for (size_t i = 0; i < n; i++) {
        const size_t e = ds_st_spec_nbytes(&specs[i]) / ds_dtype_size(specs[i].dtype);
        cap = e > cap ? e : cap;
    }
    c->buf = malloc(cap * sizeof(float));
    if (!c->buf) return ds_errorf("%s: out of memory", path);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    ds_error *e = ds_safetensors_write(tmp, specs, n, 0, fill, c);
    free(c->buf);
    c->buf = NULL;
    if (!e && rename(tmp, path)) e = ds_errorf("%s: cannot rename into place: %s", path, strerror(errno));
    if (e) remove(tmp);
    return e;
}

static void spec_of(const ds_drafter_train *t, int i, const char *prefix, ds_dtype dt, ds_st_spec *s, char *name,
                    size_t cap) {
    int nd;
    int64_t shp[2];
    ds_drafter_train_tensor_shape(t, i, &nd, shp);
    snprintf(name, cap, "%s%s", prefix, ds_drafter_train_tensor_name(t, i));
    *s = (ds_st_spec){.name = name, .dtype = dt, .ndim = nd};
    s->shape[0] = shp[0], s->shape[1] = shp[1];
}

ds_error *ds_train_save_drafter(const ds_drafter_train *t, const char *dir, ds_dtype dtype) {
    if (dtype != DS_F32 && dtype != DS_BF16) return ds_errorf("%s: drafters are saved in fp32 or bf16", dir);
    DS_TRY(make_dir(dir));
    const int n = ds_drafter_train_n_tensors(t);
    const ds_drafter_train_shape *sh = ds_drafter_train_shape_of(t);
    ds_st_spec *specs = calloc((size_t)n + 2, sizeof *specs);
    char(*names)[96] = calloc((size_t)n + 2, sizeof *names);
    fill_ctx *c = ctx_new((size_t)n + 2);
    if (!specs || !names || !c) {
        free(specs), free(names), ctx_free(c);
        return ds_errorf("%s: out of memory", dir);
    }
    c->t = t, c->dtype = dtype;
    for (int i = 0; i < n; i++) {
        spec_of(t, i, "", dtype, &specs[i], names[i], sizeof names[i]);
        c->which[i] = DS_TRAIN_WEIGHTS, c->slot[i] = i;
    }
    const char *frozen[2] = {"embed_tokens.weight", "lm_head.weight"};
    for (int k = 0; k < 2; k++) {
        specs[n + k] = (ds_st_spec){.name = frozen[k], .dtype = dtype, .ndim = 2, .shape = {sh->vocab, sh->hidden}};
        c->which[n + k] = -1 - k;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ds_error *e = write_specs(path, specs, (size_t)n + 2, c);
    free(specs), free(names), ctx_free(c);
    if (e) return e;
    cJSON *cfg = cJSON_Duplicate(ds_drafter_train_config(t), true);
    if (!cfg) return ds_errorf("%s: out of memory", dir);
    const char *dn = dtype == DS_BF16 ? "bfloat16" : "float32";
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "dtype");
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "torch_dtype");
    cJSON_AddStringToObject(cfg, "dtype", dn);
    snprintf(path, sizeof path, "%s/config.json", dir);
    e = ds_json_file_write(path, cfg);
    cJSON_Delete(cfg);
    return e;
}

static const char *const state_prefix[3] = {"weights.", "adam_m.", "adam_v."};
static const ds_train_array state_array[3] = {DS_TRAIN_WEIGHTS, DS_TRAIN_ADAM_M, DS_TRAIN_ADAM_V};

ds_error *ds_train_save_state(const ds_drafter_train *t, const char *path) {
    const int n = ds_drafter_train_n_tensors(t);
    ds_st_spec *specs = calloc((size_t)3 * n + 1, sizeof *specs);
    char(*names)[96] = calloc((size_t)3 * n + 1, sizeof *names);
    fill_ctx *c = ctx_new((size_t)3 * n + 1);
    if (!specs || !names || !c) {
        free(specs), free(names), ctx_free(c);
        return ds_errorf("%s: out of memory", path);
    }
    c->t = t, c->dtype = DS_F32, c->steps = ds_drafter_train_steps_taken(t);
    for (int a = 0; a < 3; a++)
        for (int i = 0; i < n; i++) {
            spec_of(t, i, state_prefix[a], DS_F32, &specs[a * n + i], names[a * n + i], sizeof names[0]);
            c->which[a * n + i] = (int)state_array[a], c->slot[a * n + i] = i;
        }
    specs[3 * n] = (ds_st_spec){.name = "steps", .dtype = DS_I64, .ndim = 1, .shape = {1}};
    c->which[3 * n] = -3;
    ds_error *e = write_specs(path, specs, (size_t)3 * n + 1, c);
    free(specs), free(names), ctx_free(c);
    return e;
}

ds_error *ds_train_load_state(ds_drafter_train *t, const char *path) {
    ds_safetensors *st = NULL;
    DS_TRY(ds_safetensors_open(path, &st));
    ds_error *e = NULL;
    const int n = ds_drafter_train_n_tensors(t);
    for (int a = 0; a < 3 && !e; a++)
        for (int i = 0; i < n && !e; i++) {
            char name[96];
            snprintf(name, sizeof name, "%s%s", state_prefix[a], ds_drafter_train_tensor_name(t, i));
            int nd;
            int64_t shp[2];
            const int64_t cnt = ds_drafter_train_tensor_shape(t, i, &nd, shp);
            const ds_st_tensor *x = ds_safetensors_find(st, name);
            if (!x) e = ds_errorf("%s: no tensor %s (a state of another drafter?)", path, name);
            else if (x->dtype != DS_F32 || x->nbytes != (size_t)cnt * sizeof(float) || x->ndim != nd)
                e = ds_errorf("%s: tensor %s is not fp32 of the drafter's shape", path, name);
            else ds_drafter_train_set(t, i, state_array[a], x->data);
        }
    const ds_st_tensor *s = e ? NULL : ds_safetensors_find(st, "steps");
    if (!e && (!s || s->dtype != DS_I64 || s->nbytes != 8)) e = ds_errorf("%s: no int64 tensor \"steps\"", path);
    if (!e) {
        int64_t steps;
        memcpy(&steps, s->data, 8);
        if (steps < 0) e = ds_errorf("%s: steps %lld is negative", path, (long long)steps);
        else ds_drafter_train_set_steps(t, steps);
    }
    ds_safetensors_close(st);
    return e;
}
