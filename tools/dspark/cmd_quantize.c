/* dspark quantize: a checkpoint's weights affine-quantized as MLX does
 * (base/affine_quant.h; mx.quantize's CPU kernel, bit for bit), written as
 * mlx-lm saves one: <name>.weight packed U32, <name>.scales and
 * <name>.biases in the weight's dtype, config.json with
 * "quantization": {"group_size", "bits"} (and the same as
 * "quantization_config"), the other files of the directory (tokenizer,
 * generation config, sts.json) copied.
 *
 * Which weights: those mlx.nn.quantize takes with mlx-lm's predicate (Linear
 * and Embedding weights whose input dimension the group size divides), seen
 * from the safetensors side as 2-D float tensors named *.weight with
 * cols % group == 0; norms (1-D) stay as they are, and so does any tensor
 * whose name contains a --skip pattern. Output tensors go sorted by name
 * into one model.safetensors (scripts/mlx_quant_ref.py writes the same
 * bytes). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/affine_quant.h"
#include "commands.h"
#include "io/checkpoint.h"
#include "io/safetensors_write.h"

#define MAX_SKIP 16

typedef enum { PLAIN, QWORDS, QSCALES, QBIASES } part_kind;

typedef struct {
    char *name;              /* output name */
    const ds_st_tensor *src; /* the source tensor (for Q*: the weight) */
    part_kind kind;
} out_part;

typedef struct {
    out_part *parts;
    ds_st_spec *specs;
    size_t n;
    int bits, group;
    /* The weight quantized last (its three parts are written one after the other). */
    const ds_st_tensor *cached;
    uint32_t *words;
    void *scales, *biases;
    /* Progress: bytes written of all. */
    size_t done, total;
    bool tty;
} qjob;

static void usage(FILE *f) {
    fprintf(f, "usage: dspark quantize -m DIR --bits 4|8 [--group 64] [--skip PATTERN]... --out DIR\n"
               "  affine group quantization as MLX's (mx.quantize, mlx-lm's layout): every 2-D *.weight whose\n"
               "  input dimension the group size (32, 64, 128) divides, unless its name contains a --skip\n"
               "  pattern; norms and other tensors are copied as they are, and so are the directory's other files.\n");
}

static int cmp_parts(const void *a, const void *b) {
    return strcmp(((const out_part *)a)->name, ((const out_part *)b)->name);
}

static bool quantizable(const ds_st_tensor *t, int group, char **skip, int n_skip) {
    const size_t n = strlen(t->name);
    if (n < 7 || strcmp(t->name + n - 7, ".weight") || t->ndim != 2) return false;
    if (t->dtype != DS_F32 && t->dtype != DS_BF16 && t->dtype != DS_F16) return false;
    if (t->shape[1] % group || t->shape[0] < 1) return false;
    for (int i = 0; i < n_skip; i++)
        if (strstr(t->name, skip[i])) return false;
    return true;
}

static void store_sb(ds_dtype t, void *dst, size_t i, float v) {
    if (t == DS_F32) ((float *)dst)[i] = v;
    else if (t == DS_BF16) ((uint16_t *)dst)[i] = ds_f32_to_bf16(v);
    else ((uint16_t *)dst)[i] = ds_f32_to_f16(v);
}

/* The whole weight t quantized into j's cache. */
static ds_error *quantize_tensor(qjob *j, const ds_st_tensor *t) {
    const int64_t N = t->shape[0], K = t->shape[1], G = K / j->group, W = K * j->bits / 32;
    const size_t es = ds_dtype_size(t->dtype);
    free(j->words);
    free(j->scales);
    free(j->biases);
    j->cached = NULL;
    j->words = malloc((size_t)(N * W) * 4);
    j->scales = malloc((size_t)(N * G) * es);
    j->biases = malloc((size_t)(N * G) * es);
    float *row = malloc((size_t)K * sizeof *row);
    if (!j->words || !j->scales || !j->biases || !row) {
        free(row);
        return ds_errorf("out of memory quantizing %s", t->name);
    }
    for (int64_t n = 0; n < N; n++) {
        ds_to_f32(t->dtype, (const char *)t->data + (size_t)(n * K) * es, row, (size_t)K);
        for (int64_t g = 0; g < G; g++) {
            float s, b;
            ds_quant_group(row + g * j->group, j->group, j->bits, j->words + n * W + g * j->group * j->bits / 32, &s,
                           &b);
            store_sb(t->dtype, j->scales, (size_t)(n * G + g), s);
            store_sb(t->dtype, j->biases, (size_t)(n * G + g), b);
        }
    }
    free(row);
    j->cached = t;
    return NULL;
}

static void progress(qjob *j, const char *name) {
    const int width = 30, fill = j->total ? (int)((double)j->done / (double)j->total * width) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "%s[%s] %5.1f%% %.2f / %.2f GiB  %-48.48s%s", j->tty ? "\r" : "", bar,
            j->total ? 100.0 * (double)j->done / (double)j->total : 100.0, (double)j->done / (1 << 30),
            (double)j->total / (1 << 30), name, j->tty ? "" : "\n");
}

static ds_error *fill(void *user, size_t index, size_t offset, void *buf, size_t nbytes) {
    qjob *j = user;
    const out_part *p = &j->parts[index];
    const void *from;
    if (p->kind == PLAIN) {
        from = p->src->data;
    } else {
        if (j->cached != p->src) DS_TRY(quantize_tensor(j, p->src));
        from = p->kind == QWORDS ? (const void *)j->words : p->kind == QSCALES ? j->scales : j->biases;
    }
    memcpy(buf, (const char *)from + offset, nbytes);
    j->done += nbytes;
    const size_t whole = ds_st_spec_nbytes(&j->specs[index]);
    if (offset + nbytes == whole && (j->tty || index + 1 == j->n || index % 64 == 0)) progress(j, p->name);
    return NULL;
}

static ds_error *copy_file(const char *from, const char *to) {
    char *data;
    size_t len;
    DS_TRY(ds_read_file(from, &data, &len));
    FILE *f = fopen(to, "wb");
    ds_error *e = NULL;
    if (!f) e = ds_errorf("%s: cannot create: %s", to, strerror(errno));
    else if (fwrite(data, 1, len, f) != len) e = ds_errorf("%s: write failed: %s", to, strerror(errno));
    if (f && fclose(f) && !e) e = ds_errorf("%s: close failed: %s", to, strerror(errno));
    free(data);
    return e;
}

/* The source directory's other files: tokenizer, generation config, chat template, sts.json. */
static ds_error *copy_side_files(const char *src, const char *dst) {
    DIR *d = opendir(src);
    if (!d) return ds_errorf("%s: cannot list: %s", src, strerror(errno));
    ds_error *e = NULL;
    struct dirent *de;
    while (!e && (de = readdir(d))) {
        const char *f = de->d_name;
        const size_t n = strlen(f);
        if (f[0] == '.' || !strcmp(f, "config.json") || !strcmp(f, "model.safetensors.index.json") ||
            (n > 12 && !strcmp(f + n - 12, ".safetensors")))
            continue;
        char *from = ds_path_join(src, f), *to = ds_path_join(dst, f);
        struct stat sb;
        if (!from || !to) e = ds_errorf("out of memory");
        else if (stat(from, &sb) == 0 && S_ISREG(sb.st_mode)) e = copy_file(from, to);
        free(from);
        free(to);
    }
    closedir(d);
    return e;
}

static ds_error *write_config(const ds_checkpoint *ck, const char *out, int bits, int group) {
    cJSON *cfg = cJSON_Duplicate(ck->config, 1);
    if (!cfg) return ds_errorf("out of memory");
    for (int i = 0; i < 2; i++) {
        const char *key = i ? "quantization_config" : "quantization";
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, key);
        cJSON *q = cJSON_AddObjectToObject(cfg, key);
        cJSON_AddNumberToObject(q, "group_size", group);
        cJSON_AddNumberToObject(q, "bits", bits);
    }
    char *js = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    char *path = ds_path_join(out, "config.json");
    ds_error *e = NULL;
    FILE *f = path && js ? fopen(path, "wb") : NULL;
    if (!path || !js) e = ds_errorf("out of memory");
    else if (!f) e = ds_errorf("%s: cannot create: %s", path, strerror(errno));
    else if (fprintf(f, "%s\n", js) < 0) e = ds_errorf("%s: write failed", path);
    if (f && fclose(f) && !e) e = ds_errorf("%s: close failed: %s", path, strerror(errno));
    free(js);
    free(path);
    return e;
}

static ds_error *run(const char *in, const char *out, int bits, int group, char **skip, int n_skip) {
    ds_checkpoint *ck;
    DS_TRY(ds_checkpoint_open(in, &ck));
    ds_error *e = NULL;
    if (cJSON_GetObjectItemCaseSensitive(ck->config, "quantization") ||
        cJSON_GetObjectItemCaseSensitive(ck->config, "quantization_config"))
        e = ds_errorf("%s: config.json has a quantization block already (the checkpoint is quantized)", in);
    qjob j = {.bits = bits, .group = group, .tty = isatty(2)};
    size_t cap = 0, n_q = 0;
    for (size_t s = 0; s < ck->n_shards; s++) cap += 3 * ck->shards[s]->n_tensors; /* a weight becomes 3 tensors */
    j.parts = calloc(cap ? cap : 1, sizeof *j.parts);
    if (!e && !j.parts) e = ds_errorf("out of memory");
    for (size_t s = 0; s < ck->n_shards && !e; s++)
        for (size_t i = 0; i < ck->shards[s]->n_tensors && !e; i++) {
            const ds_st_tensor *t = &ck->shards[s]->tensors[i];
            if (!quantizable(t, group, skip, n_skip)) {
                j.parts[j.n++] = (out_part){.name = strdup(t->name), .src = t, .kind = PLAIN};
                continue;
            }
            n_q++;
            const size_t base = strlen(t->name) - 7;
            for (int k = 0; k < 3; k++) {
                static const char *sfx[] = {".weight", ".scales", ".biases"};
                char *nm = malloc(base + 8);
                if (nm) snprintf(nm, base + 8, "%.*s%s", (int)base, t->name, sfx[k]);
                j.parts[j.n++] = (out_part){.name = nm, .src = t, .kind = (part_kind)(QWORDS + k)};
            }
        }
    for (size_t i = 0; i < j.n && !e; i++)
        if (!j.parts[i].name) e = ds_errorf("out of memory");
    if (!e) {
        qsort(j.parts, j.n, sizeof *j.parts, cmp_parts);
        for (size_t i = 1; i < j.n && !e; i++)
            if (!strcmp(j.parts[i].name, j.parts[i - 1].name))
                e = ds_errorf("%s: tensor %s would be written twice (the source has it, or its .scales / .biases)",
                              in, j.parts[i].name);
    }
    if (!e && !(j.specs = calloc(j.n ? j.n : 1, sizeof *j.specs))) e = ds_errorf("out of memory");
    for (size_t i = 0; i < j.n && !e; i++) {
        const out_part *p = &j.parts[i];
        ds_st_spec *sp = &j.specs[i];
        sp->name = p->name;
        if (p->kind == PLAIN) {
            sp->dtype = p->src->dtype;
            sp->ndim = p->src->ndim;
            memcpy(sp->shape, p->src->shape, sizeof sp->shape);
        } else {
            sp->dtype = p->kind == QWORDS ? DS_U32 : p->src->dtype;
            sp->ndim = 2;
            sp->shape[0] = p->src->shape[0];
            sp->shape[1] = p->kind == QWORDS ? p->src->shape[1] * bits / 32 : p->src->shape[1] / group;
        }
        j.total += ds_st_spec_nbytes(sp);
    }
    if (!e && mkdir(out, 0777) != 0 && errno != EEXIST) e = ds_errorf("%s: cannot create: %s", out, strerror(errno));
    if (!e) {
        fprintf(stderr, "quantize: %s -> %s: %zu weights to %d-bit, group %d; %zu tensors out\n", in, out, n_q, bits,
                group, j.n);
        char *path = ds_path_join(out, "model.safetensors");
        e = path ? ds_safetensors_write(path, j.specs, j.n, 0, fill, &j) : ds_errorf("out of memory");
        if (j.tty) fputc('\n', stderr);
        free(path);
    }
    if (!e) e = write_config(ck, out, bits, group);
    if (!e) e = copy_side_files(in, out);
    for (size_t i = 0; i < j.n; i++) free(j.parts[i].name);
    free(j.parts);
    free(j.specs);
    free(j.words);
    free(j.scales);
    free(j.biases);
    ds_checkpoint_close(ck);
    return e;
}

int cmd_quantize(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"bits", required_argument, 0, 'b'},
                                         {"group", required_argument, 0, 'g'}, {"skip", required_argument, 0, 's'},
                                         {"out", required_argument, 0, 'o'},   {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *in = NULL, *out = NULL;
    int bits = 0, group = 64, n_skip = 0;
    char *skip[MAX_SKIP];
    char *end;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': in = optarg; break;
        case 'o': out = optarg; break;
        case 'b':
            bits = (int)strtol(optarg, &end, 10);
            if (*end || !ds_quant_bits_ok(bits)) {
                fprintf(stderr, "dspark quantize: --bits %s: must be 4 or 8\n", optarg);
                return 2;
            }
            break;
        case 'g':
            group = (int)strtol(optarg, &end, 10);
            if (*end || !ds_quant_group_ok(group)) {
                fprintf(stderr, "dspark quantize: --group %s: must be 32, 64 or 128\n", optarg);
                return 2;
            }
            break;
        case 's':
            if (n_skip == MAX_SKIP) {
                fprintf(stderr, "dspark quantize: at most %d --skip patterns\n", MAX_SKIP);
                return 2;
            }
            skip[n_skip++] = optarg;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!in || !out || !bits || optind != argc) {
        usage(stderr);
        return 2;
    }
    ds_error *e = run(in, out, bits, group, skip, n_skip);
    if (e) {
        fprintf(stderr, "dspark quantize: %s\n", ds_error_message(e));
        ds_error_free(e);
        return 1;
    }
    return 0;
}
