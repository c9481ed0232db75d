/* A catalogue of broken inputs. Each case builds its damaged file or
 * directory at test time (a copy of testdata/fixtures/qwen3-tiny mutated
 * with cJSON, or a safetensors file written byte by byte) in a fresh
 * directory under /tmp, and expects a specific error message: never a
 * crash, hang, leak (the sanitizer build and valgrind run this too) or a
 * silent wrong answer. The last cases drive the dspark CLI. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <ftw.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "draft/drafter.h"
#include "io/checkpoint.h"
#include "io/prompt_file.h"
#include "io/safetensors.h"
#include "model/target.h"
#include "speculate/generate.h"
#include "testlib.h"

#define FIX DS_TESTDATA "/fixtures/qwen3-tiny"
#define PATH_LEN 1024

static ds_backend *be;
static ds_target *tiny; /* the pristine tiny target, for drafter and generate cases */
static char root[] = "/tmp/dspark-bad-input-XXXXXX";
static int n_dirs;

/* ---- helpers ------------------------------------------------------------ */

/* Like CHECK_ERR, and the message must also name `b` (the file, tensor or field at fault). */
static void check_err2(ds_error *e, const char *a, const char *b, const char *what, int line) {
    if (e && !strstr(ds_error_message(e), b)) {
        ds_test_failures++;
        fprintf(stderr, "%s:%d: %s: error \"%s\" does not contain \"%s\"\n", __FILE__, line, what,
                ds_error_message(e), b);
    }
    check_error_contains(e, a, what, __FILE__, line);
}
#define CHECK_ERR2(expr, a, b) check_err2((expr), (a), (b), #expr, __LINE__)

/* Opening must fail; whatever was opened by mistake is closed again. */
#define EXPECT_ST(path, ...)                                     \
    do {                                                         \
        ds_safetensors *st_ = NULL;                              \
        CHECK_ERR2(ds_safetensors_open(path, &st_), __VA_ARGS__); \
        ds_safetensors_close(st_);                               \
    } while (0)
#define EXPECT_TARGET(dir, ...)                                   \
    do {                                                          \
        ds_target *t_ = NULL;                                     \
        CHECK_ERR2(ds_target_open(be, dir, NULL, &t_), __VA_ARGS__); \
        ds_target_free(t_);                                       \
    } while (0)
#define EXPECT_DRAFTER(dir, ...)                                        \
    do {                                                                \
        ds_drafter *d_ = NULL;                                          \
        CHECK_ERR2(ds_drafter_open(be, dir, tiny, NULL, &d_), __VA_ARGS__); \
        ds_drafter_free(d_);                                            \
    } while (0)

static void join(char *out, const char *dir, const char *name) {
    int n = snprintf(out, PATH_LEN, "%s/%s", dir, name);
    CHECK(n > 0 && n < PATH_LEN, "path too long: %s/%s", dir, name);
}

/* A new empty directory under the temp root. */
static void fresh_dir(char *out, const char *tag) {
    int n = snprintf(out, PATH_LEN, "%s/%02d-%s", root, n_dirs++, tag);
    if (n <= 0 || n >= PATH_LEN || mkdir(out, 0755) != 0) {
        ds_test_failures++;
        fprintf(stderr, "cannot create %s\n", out);
    }
}

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len) {
        ds_test_failures++;
        fprintf(stderr, "cannot write %s\n", path);
    }
    if (f) fclose(f);
}

static void write_text(const char *path, const char *text) { write_file(path, text, strlen(text)); }

/* A fresh copy of a fixture directory (its regular files). */
static void copy_model(char *out, const char *src, const char *tag) {
    fresh_dir(out, tag);
    DIR *d = opendir(src);
    if (!d) {
        ds_test_failures++;
        fprintf(stderr, "cannot list %s\n", src);
        return;
    }
    for (struct dirent *ent; (ent = readdir(d));) {
        char from[PATH_LEN], to[PATH_LEN];
        struct stat sb;
        join(from, src, ent->d_name);
        if (stat(from, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        size_t len;
        char *data = read_text_file(from, &len);
        CHECK(data, "cannot read %s", from);
        join(to, out, ent->d_name);
        if (data) write_file(to, data, len);
        free(data);
    }
    closedir(d);
}

/* Sets config.json's `field` to `value` (taking it), or removes it when value is NULL. */
static void edit_config(const char *dir, const char *field, cJSON *value) {
    char path[PATH_LEN];
    join(path, dir, "config.json");
    char *text = read_text_file(path, NULL);
    cJSON *cfg = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(cJSON_IsObject(cfg), "cannot parse %s", path);
    if (!cfg) {
        cJSON_Delete(value);
        return;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, field);
    if (value) cJSON_AddItemToObject(cfg, field, value);
    char *out = cJSON_Print(cfg);
    write_text(path, out);
    free(out);
    cJSON_Delete(cfg);
}

/* JSON literal -> cJSON value, for edit_config. */
static cJSON *js(const char *literal) {
    cJSON *v = cJSON_Parse(literal);
    CHECK(v, "bad literal %s", literal);
    return v;
}

/* A safetensors file: 8-byte little-endian header length `hlen` (which may
 * lie), the header text, then data_size bytes of data. */
static void write_st_len(const char *path, uint64_t hlen, const char *header, size_t data_size) {
    size_t hl = strlen(header), n = 8 + hl + data_size;
    unsigned char *buf = calloc(n, 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_size; i++) buf[8 + hl + i] = (unsigned char)i;
    write_file(path, buf, n);
    free(buf);
}

static void write_st(const char *path, const char *header, size_t data_size) {
    write_st_len(path, strlen(header), header, data_size);
}

/* st = the path of a.safetensors in a new empty directory (the file cases' start). */
static void fresh_st(char *st, const char *tag) {
    char dir[PATH_LEN];
    fresh_dir(dir, tag);
    join(st, dir, "a.safetensors");
}

/* Rewrites a safetensors file's header, keeping its data: tensor `name`'s
 * `key` set to `value` (taken), or the whole entry removed when key is NULL. */
static void edit_st(const char *path, const char *name, const char *key, cJSON *value) {
    size_t len;
    unsigned char *buf = (unsigned char *)read_text_file(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; buf && len >= 8 && i >= 0; i--) hlen = (hlen << 8) | buf[i];
    cJSON *hdr = buf && len >= 8 && hlen <= len - 8 ? cJSON_ParseWithLength((char *)buf + 8, (size_t)hlen) : NULL;
    cJSON *entry = cJSON_GetObjectItemCaseSensitive(hdr, name);
    CHECK(entry, "%s has no tensor %s", path, name);
    if (entry && key) {
        cJSON_DeleteItemFromObjectCaseSensitive(entry, key);
        cJSON_AddItemToObject(entry, key, value);
        value = NULL;
    } else if (entry) {
        cJSON_DeleteItemFromObjectCaseSensitive(hdr, name);
    }
    cJSON_Delete(value);
    if (entry) {
        char *h = cJSON_PrintUnformatted(hdr);
        size_t hl = strlen(h), data = len - 8 - (size_t)hlen;
        unsigned char *out = malloc(8 + hl + data);
        for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)hl >> (8 * i));
        memcpy(out + 8, h, hl);
        memcpy(out + 8 + hl, buf + 8 + hlen, data);
        write_file(path, out, 8 + hl + data);
        free(out);
        free(h);
    }
    cJSON_Delete(hdr);
    free(buf);
}

static void truncate_to(const char *path, off_t size) { CHECK(truncate(path, size) == 0, "cannot truncate %s", path); }

/* ---- safetensors files ---------------------------------------------------- */

static void test_safetensors_truncated_mid_data(void) {
    char dir[PATH_LEN], st[PATH_LEN];
    copy_model(dir, FIX "/target", "cut-data");
    join(st, dir, "model.safetensors");
    truncate_to(st, 500000);
    /* The first tensor whose bytes are gone is named, with the file. */
    EXPECT_ST(st, "outside the", "model.safetensors");
    EXPECT_TARGET(dir, "data_offsets", "model.layers.");
}

static void test_safetensors_truncated_in_header(void) {
    char dir[PATH_LEN], st[PATH_LEN];
    copy_model(dir, FIX "/target", "cut-header");
    join(st, dir, "model.safetensors");
    truncate_to(st, 100);
    EXPECT_ST(st, "header length 4808 runs past the end of the 100-byte file", st);
    truncate_to(st, 5);
    EXPECT_ST(st, "truncated (5 bytes, no header length)", st);
    truncate_to(st, 0);
    EXPECT_ST(st, "truncated (0 bytes", st);
    EXPECT_TARGET(dir, "truncated", "model.safetensors");
}

static void test_safetensors_header_length_past_end(void) {
    char st[PATH_LEN];
    fresh_st(st, "hlen");
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    write_st_len(st, 1000, h, 4);
    EXPECT_ST(st, "header length 1000 runs past the end", "a.safetensors");
    write_st_len(st, UINT64_MAX, h, 4); /* no wrap-around in the bound check */
    EXPECT_ST(st, "runs past the end", "a.safetensors");
    write_st_len(st, 3, h, 4); /* too short: cuts the JSON */
    EXPECT_ST(st, "header is not a JSON object", "a.safetensors");
}

static void test_safetensors_bad_header_json(void) {
    char st[PATH_LEN];
    fresh_st(st, "hjson");
    write_st(st, "not json at all", 0);
    EXPECT_ST(st, "header is not a JSON object", st);
    write_st(st, "[1, 2, 3]", 0);
    EXPECT_ST(st, "header is not a JSON object", st);
    write_st(st, "{\"a\": 5}", 0);
    EXPECT_ST(st, "tensor a: header entry is not an object", st);
    write_st(st, "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    EXPECT_ST(st, "tensor a: missing dtype", st);
    write_st(st, "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4);
    EXPECT_ST(st, "tensor a: missing shape", st);
    write_st(st, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4);
    EXPECT_ST(st, "tensor a: data_offsets must be [begin, end]", st);
    write_st(st, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4);
    EXPECT_ST(st, "tensor a: data_offsets must be [begin, end]", st);
    write_st(st, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",\"4\"]}}", 4);
    EXPECT_ST(st, "tensor a: data_offsets must be [begin, end]", st);
}

static void test_safetensors_overlapping_offsets(void) {
    char st[PATH_LEN];
    fresh_st(st, "overlap");
    write_st(st,
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"y\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[12,28]}}",
             28);
    EXPECT_ST(st, "tensors x and y overlap in the data section", st);
    write_st(st, /* one inside the other, listed out of order */
             "{\"big\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},"
             "\"small\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]}}",
             32);
    EXPECT_ST(st, "overlap", "big");
}

/* [15.5, 31.5] would truncate to [15, 31]: 16 bytes, as F32[4] needs, that
 * overlap x; the fraction itself is the fault and is named as such. */
static void test_safetensors_fractional_offsets(void) {
    char st[PATH_LEN];
    fresh_st(st, "frac-offsets");
    write_st(st,
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"y\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[15.5,31.5]}}",
             32);
    EXPECT_ST(st, "tensor y: data_offsets [15.5, 31.5] are not integer byte offsets", st);
    write_st(st, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16.25]}}", 32);
    EXPECT_ST(st, "tensor x: data_offsets [0, 16.25] are not integer byte offsets", st);
}

/* A FIFO (or any non-regular file) where a file is expected is refused at
 * once; opening it for reading would otherwise wait for a writer forever.
 * alarm() turns a regression into a failed test rather than a hung one. */
static void test_fifo_instead_of_file(void) {
    char dir[PATH_LEN], st[PATH_LEN], cfg[PATH_LEN];
    fresh_dir(dir, "fifo");
    join(st, dir, "model.safetensors");
    join(cfg, dir, "config.json");
    CHECK(mkfifo(st, 0644) == 0, "mkfifo %s", st);
    alarm(60);
    EXPECT_ST(st, "not a regular file", st);
    char *text = read_text_file(FIX "/target/config.json", NULL);
    CHECK(text, "cannot read the fixture's config.json");
    if (text) write_text(cfg, text);
    free(text);
    EXPECT_TARGET(dir, "not a regular file", "model.safetensors");
    remove(cfg);
    CHECK(mkfifo(cfg, 0644) == 0, "mkfifo %s", cfg);
    EXPECT_TARGET(dir, "not a readable regular file", "config.json");
    char *buf = NULL;
    CHECK_ERR2(ds_read_file(cfg, &buf, NULL), "not a readable regular file", cfg);
    free(buf);
    alarm(0);
}

static void test_safetensors_offsets_outside_file(void) {
    char st[PATH_LEN];
    fresh_st(st, "outside");
    write_st(st, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}", 16);
    EXPECT_ST(st, "tensor x: data_offsets [16, 32] outside the 16-byte data section", st);
    write_st(st, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 16);
    EXPECT_ST(st, "tensor x: data_offsets [-4, 0] outside", st);
    write_st(st, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 16);
    EXPECT_ST(st, "tensor x: data_offsets [8, 4] outside", st);
    write_st(st, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1e300,1e300]}}", 16);
    EXPECT_ST(st, "tensor x: data_offsets", "outside");
}

static void test_safetensors_unknown_dtype(void) {
    char st[PATH_LEN];
    fresh_st(st, "dtype");
    write_st(st, "{\"x\":{\"dtype\":\"Q4_K\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16);
    EXPECT_ST(st, "tensor x: unknown dtype \"Q4_K\"", st);
    write_st(st, "{\"x\":{\"dtype\":7,\"shape\":[4],\"data_offsets\":[0,16]}}", 16);
    EXPECT_ST(st, "tensor x: missing dtype", st);
}

static void test_safetensors_shape_byte_mismatch(void) {
    char st[PATH_LEN];
    fresh_st(st, "bytes");
    write_st(st, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", 16);
    EXPECT_ST(st, "tensor x: 16 bytes stored but shape and dtype F32 need 24", st);
    write_st(st, "{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4);
    EXPECT_ST(st, "tensor x: shape[0] is not a non-negative integer", st);
    write_st(st, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4);
    EXPECT_ST(st, "shape[0] is not a non-negative integer", st);
    write_st(st, "{\"x\":{\"dtype\":\"F32\",\"shape\":[\"4\"],\"data_offsets\":[0,16]}}", 16);
    EXPECT_ST(st, "shape[0] is not a non-negative integer", st);
    write_st(st, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4);
    EXPECT_ST(st, "tensor x: 9 dimensions (max 8)", st);
    write_st(st, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4000000000000,4000000000000],\"data_offsets\":[0,0]}}", 0);
    EXPECT_ST(st, "tensor x: shape overflows", st);
    /* 2^62 elements of 4 bytes is 2^64 bytes: must not wrap to the 0 bytes stored. */
    write_st(st, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4503599627370496,1024],\"data_offsets\":[0,0]}}", 0);
    EXPECT_ST(st, "tensor x: shape overflows", st);
}

static void test_safetensors_duplicate_name(void) {
    char st[PATH_LEN];
    fresh_st(st, "dup");
    write_st(st,
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             12);
    EXPECT_ST(st, "tensor x is listed twice", st);
}

static void test_safetensors_unreadable(void) {
    char dir[PATH_LEN], st[PATH_LEN];
    fresh_dir(dir, "unreadable");
    join(st, dir, "missing.safetensors");
    EXPECT_ST(st, "cannot open: No such file or directory", st);
    EXPECT_ST(dir, "not a regular file", dir);
}

/* ---- checkpoints: files, shards, tensors ------------------------------- */

static void test_pristine_copies_load(void) {
    /* The mutations below start from these copies: they must load as they are. */
    char tdir[PATH_LEN], ddir[PATH_LEN];
    copy_model(tdir, FIX "/target", "pristine-target");
    copy_model(ddir, FIX "/drafter", "pristine-drafter");
    ds_target *t = NULL;
    ds_drafter *d = NULL;
    CHECK_OK(ds_target_open(be, tdir, NULL, &t));
    ds_error *e = ds_drafter_open(be, ddir, t, NULL, &d);
    CHECK(!e, "drafter copy: %s", ds_error_message(e));
    ds_error_free(e);
    ds_drafter_free(d);
    ds_target_free(t);
}

static void test_missing_directory_and_files(void) {
    char dir[PATH_LEN], path[PATH_LEN];
    join(path, root, "no-such-model");
    EXPECT_TARGET(path, "not a model directory", "no-such-model");
    EXPECT_TARGET("", "not a model directory", "");
    fresh_dir(dir, "no-config");
    EXPECT_TARGET(dir, "config.json: cannot open: No such file or directory", dir);
    join(path, dir, "config.json");
    write_text(path, "{\"model_type\": \"qwen3\"}");
    EXPECT_TARGET(dir, "no model.safetensors or model.safetensors.index.json", dir);
    EXPECT_TARGET(path, "not a model directory", "config.json"); /* a file, not a directory */
}

static void test_unreadable_files(void) {
    /* Running as root ignores permission bits: unreadable files are directories here. */
    char dir[PATH_LEN], path[PATH_LEN];
    copy_model(dir, FIX "/target", "cfg-is-dir");
    join(path, dir, "config.json");
    CHECK(remove(path) == 0 && mkdir(path, 0755) == 0, "cannot replace %s", path);
    EXPECT_TARGET(dir, "config.json: not a readable regular file", dir);

    copy_model(dir, FIX "/target", "st-is-dir");
    join(path, dir, "model.safetensors");
    CHECK(remove(path) == 0 && mkdir(path, 0755) == 0, "cannot replace %s", path);
    EXPECT_TARGET(dir, "model.safetensors: not a regular file", dir);

    if (geteuid() != 0) {
        copy_model(dir, FIX "/target", "cfg-mode-000");
        join(path, dir, "config.json");
        CHECK(chmod(path, 0) == 0, "chmod %s", path);
        EXPECT_TARGET(dir, "config.json: cannot open: Permission denied", dir);
    }
}

/* A sharded copy of the tiny target: every tensor in shard 1 except
 * model.norm.weight, which the index places in `second` (shard 2). */
static void sharded_copy(char *dir, const char *tag, const char *second, bool write_second) {
    char from[PATH_LEN], to[PATH_LEN], index[PATH_LEN];
    copy_model(dir, FIX "/target", tag);
    join(from, dir, "model.safetensors");
    join(to, dir, "model-00001-of-00002.safetensors");
    CHECK(rename(from, to) == 0, "rename %s", from);
    if (write_second) {
        join(from, dir, second);
        write_st(from, "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":[0,256]}}", 256);
        edit_st(to, "model.norm.weight", NULL, NULL);
    }
    snprintf(index, sizeof index,
             "{\"metadata\": {}, \"weight_map\": {\"lm_head.weight\": \"model-00001-of-00002.safetensors\", "
             "\"model.norm.weight\": \"%s\", \"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\"}}",
             second);
    join(from, dir, "model.safetensors.index.json");
    write_text(from, index);
}

static void test_sharded_index_missing_shard(void) {
    char dir[PATH_LEN];
    sharded_copy(dir, "shards-ok", "model-00002-of-00002.safetensors", true);
    ds_target *t = NULL;
    CHECK_OK(ds_target_open(be, dir, NULL, &t)); /* the split itself is fine */
    ds_target_free(t);

    sharded_copy(dir, "shard-missing", "model-00002-of-00002.safetensors", false);
    EXPECT_TARGET(dir, "model-00002-of-00002.safetensors: cannot open: No such file or directory", dir);
    sharded_copy(dir, "shard-escapes", "../model.safetensors", false);
    EXPECT_TARGET(dir, "shard name \"../model.safetensors\" is not a plain file name", "../model.safetensors");
}

static void test_sharded_index_bad_weight_map(void) {
    char dir[PATH_LEN], index[PATH_LEN];
    sharded_copy(dir, "weight-map", "model-00002-of-00002.safetensors", true);
    join(index, dir, "model.safetensors.index.json");
    write_text(index, "{\"weight_map\": [\"model-00001-of-00002.safetensors\"]}");
    EXPECT_TARGET(dir, "weight_map is not an object", "model.safetensors.index.json");
    write_text(index, "{\"metadata\": {}}");
    EXPECT_TARGET(dir, "missing weight_map", "model.safetensors.index.json");
    write_text(index, "[]");
    EXPECT_TARGET(dir, "missing weight_map", "model.safetensors.index.json");
    write_text(index, "{\"weight_map\": {\"lm_head.weight\": 3}}");
    EXPECT_TARGET(dir, "weight_map[lm_head.weight] is not a file name", "model.safetensors.index.json");
    write_text(index, "{\"weight_map\": {\"lm_head.weight\": ");
    EXPECT_TARGET(dir, "model.safetensors.index.json: invalid JSON near byte", dir);
    write_text(index, "{\"weight_map\": {}}"); /* no shards at all: the first tensor is missing */
    EXPECT_TARGET(dir, "missing tensor model.embed_tokens.weight", dir);
}

static void test_missing_tensor(void) {
    char dir[PATH_LEN], st[PATH_LEN];
    copy_model(dir, FIX "/target", "missing-tensor");
    join(st, dir, "model.safetensors");
    edit_st(st, "model.norm.weight", NULL, NULL);
    EXPECT_TARGET(dir, "missing tensor model.norm.weight", dir);
    copy_model(dir, FIX "/target", "missing-layer-tensor");
    join(st, dir, "model.safetensors");
    edit_st(st, "model.layers.3.mlp.up_proj.weight", NULL, NULL);
    EXPECT_TARGET(dir, "missing tensor model.layers.3.mlp.up_proj.weight", dir);
}

static void test_wrong_tensor_shape(void) {
    char dir[PATH_LEN], st[PATH_LEN];
    copy_model(dir, FIX "/target", "wrong-shape");
    join(st, dir, "model.safetensors");
    edit_st(st, "model.layers.1.self_attn.k_proj.weight", "shape", js("[64, 32]")); /* same bytes, transposed */
    EXPECT_TARGET(dir, "tensor model.layers.1.self_attn.k_proj.weight has shape [64, 32], expected [32, 64]", dir);

    copy_model(dir, FIX "/target", "wrong-rank");
    join(st, dir, "model.safetensors");
    edit_st(st, "model.norm.weight", "shape", js("[8, 8]"));
    EXPECT_TARGET(dir, "tensor model.norm.weight has shape [8, 8], expected [64]", dir);

    copy_model(dir, FIX "/target", "wrong-dtype");
    join(st, dir, "model.safetensors");
    edit_st(st, "model.norm.weight", "dtype", js("\"I32\""));
    EXPECT_TARGET(dir, "tensor model.norm.weight has dtype I32 (need F32, BF16 or F16)", dir);

    /* The config promises another vocabulary than the weights have. */
    copy_model(dir, FIX "/target", "config-vs-weights");
    edit_config(dir, "vocab_size", js("1000"));
    EXPECT_TARGET(dir, "has shape [512, 64], expected [1000, 64]", "embed_tokens");
}

/* ---- config.json ------------------------------------------------------- */

static void test_config_missing_field(void) {
    char dir[PATH_LEN];
    copy_model(dir, FIX "/target", "no-hidden-size");
    edit_config(dir, "hidden_size", NULL);
    EXPECT_TARGET(dir, "config is missing field hidden_size", dir);
    copy_model(dir, FIX "/target", "null-layers");
    edit_config(dir, "num_hidden_layers", js("null"));
    EXPECT_TARGET(dir, "config is missing field num_hidden_layers", dir);
}

static void test_config_wrong_type(void) {
    static const struct {
        const char *field, *value, *message;
    } cases[] = {
        {"hidden_size", "\"64\"", "config field hidden_size is not an integer"},
        {"hidden_size", "64.5", "config field hidden_size is not an integer"},
        {"vocab_size", "[512]", "config field vocab_size is not an integer"},
        {"num_hidden_layers", "0", "config field num_hidden_layers = 0 is out of range"},
        {"num_hidden_layers", "1024", /* found by fuzz/fuzz_config at 1e9 (an allocator abort; now past the cap) */
         "config field num_hidden_layers = 1024, but the checkpoint has no model.layers.1023."},
        {"num_attention_heads", "-4", "config field num_attention_heads = -4 is out of range"},
        {"intermediate_size", "1e300", "config field intermediate_size = 1.0000000000000001e+300 is out of range"},
        {"num_key_value_heads", "3", "num_attention_heads 4 is not a multiple of num_key_value_heads 3"},
        {"num_key_value_heads", "4294967298",
         "config field num_key_value_heads = 4294967298 is out of range (at most 4096)"},
        {"head_dim", "15", "head_dim 15 must be even"},
        {"head_dim", "4294967312", "config field head_dim = 4294967312 is out of range"},
        {"head_dim", "1073741824", "config field head_dim = 1073741824 is out of range (at most 4096)"},
        {"intermediate_size", "1048576",
         "tensor model.layers.0.mlp.gate_proj.weight has shape [160, 64], expected [1048576, 64]"},
        {"max_position_embeddings", "0", "config field max_position_embeddings = 0 is out of range"},
        {"max_position_embeddings", "4294968320", "config field max_position_embeddings = 4294968320 is out of range"},
        {"rms_norm_eps", "\"small\"", "config field rms_norm_eps is not a number"},
        {"tie_word_embeddings", "\"yes\"", "config field tie_word_embeddings is not true/false"},
        {"attention_bias", "1", "config field attention_bias is not true/false"},
        {"hidden_act", "\"gelu\"", "hidden_act \"gelu\" is not supported"},
        {"rope_parameters", "{\"rope_theta\": 10000, \"rope_type\": \"yarn\"}",
         "rope_parameters.rope_type \"yarn\" is not supported"},
        {"rope_parameters", "{\"rope_theta\": \"big\"}", "config field rope_theta is not a number"},
        {"rope_parameters", "{\"rope_theta\": 0}", "rope_theta 0 is not positive"},
        {"eos_token_id", "\"</s>\"", "config field eos_token_id is not an integer"},
        {"eos_token_id", "[1, \"x\"]", "config field eos_token_id is not an integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[PATH_LEN];
        copy_model(dir, FIX "/target", cases[i].field);
        edit_config(dir, cases[i].field, js(cases[i].value));
        EXPECT_TARGET(dir, cases[i].message, dir);
    }
}

/* Sizes no model has are refused when the config is read, naming the field,
 * before anything is sized from them (num_hidden_layers 1e9 used to reach a
 * billion-entry calloc: a bare "out of memory", an abort under ASan). */
static void test_config_absurd_sizes(void) {
    static const struct {
        const char *field, *value, *message;
    } cases[] = {
        {"num_hidden_layers", "1e9", "config field num_hidden_layers = 1000000000 is out of range (at most 1024)"},
        {"num_hidden_layers", "1025", "config field num_hidden_layers = 1025 is out of range (at most 1024)"},
        {"max_position_embeddings", "1e9",
         "config field max_position_embeddings = 1000000000 is out of range (at most 16777216)"},
        {"vocab_size", "1e9", "config field vocab_size = 1000000000 is out of range (at most 16777216)"},
        {"hidden_size", "1e9", "config field hidden_size = 1000000000 is out of range (at most 131072)"},
        {"num_attention_heads", "-1e9", "config field num_attention_heads = -1000000000 is out of range"},
        /* Gemma-style nesting is looked into too. */
        {"text_config", "{\"num_hidden_layers\": 1e12}",
         "config field num_hidden_layers = 1000000000000 is out of range (at most 1024)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[PATH_LEN];
        copy_model(dir, FIX "/target", "absurd");
        edit_config(dir, cases[i].field, js(cases[i].value));
        EXPECT_TARGET(dir, cases[i].message, dir);
    }
}

static void test_config_unsupported_architecture(void) {
    char dir[PATH_LEN];
    copy_model(dir, FIX "/target", "llama");
    edit_config(dir, "model_type", js("\"llama\""));
    edit_config(dir, "architectures", js("[\"LlamaForCausalLM\"]"));
    EXPECT_TARGET(dir, "unsupported architecture (model_type \"llama\", architectures[0] \"LlamaForCausalLM\")", dir);
    copy_model(dir, FIX "/target", "no-model-type");
    edit_config(dir, "model_type", NULL);
    EXPECT_TARGET(dir, "unsupported architecture (model_type \"(none)\"", dir);
    copy_model(dir, FIX "/target", "arch-mismatch");
    edit_config(dir, "architectures", js("[\"Qwen3ForSequenceClassification\"]"));
    EXPECT_TARGET(dir, "architectures[0] \"Qwen3ForSequenceClassification\"", "supported: Qwen3ForCausalLM");
    copy_model(dir, FIX "/target", "model-type-number");
    edit_config(dir, "model_type", js("3"));
    EXPECT_TARGET(dir, "unsupported architecture (model_type \"(none)\"", dir);
}

static void test_config_not_json(void) {
    char dir[PATH_LEN], path[PATH_LEN];
    copy_model(dir, FIX "/target", "cfg-not-json");
    join(path, dir, "config.json");
    write_text(path, "{\"hidden_size\": 64,");
    EXPECT_TARGET(dir, "config.json: invalid JSON near byte", path);
    write_text(path, "");
    EXPECT_TARGET(dir, "config.json: invalid JSON", path);
    write_text(path, "[\"qwen3\"]");
    EXPECT_TARGET(dir, "config.json: not a JSON object", path);
    write_file(path, "{\"a\":\0}", 7);
    EXPECT_TARGET(dir, "config.json: invalid JSON", path);

    copy_model(dir, FIX "/target", "gen-not-json");
    join(path, dir, "generation_config.json");
    write_text(path, "eos_token_id = 2");
    EXPECT_TARGET(dir, "generation_config.json: invalid JSON near byte 0", path);
}

/* ---- drafters ---------------------------------------------------------- */

static void drafter_with(const char *tag, const char *field, const char *value, const char *message) {
    char dir[PATH_LEN];
    copy_model(dir, FIX "/drafter", tag);
    edit_config(dir, field, value ? js(value) : NULL);
    EXPECT_DRAFTER(dir, message, dir);
}

static void test_drafter_for_another_target(void) {
    drafter_with("d-vocab", "vocab_size", "600",
                 "drafter vocab_size 600 does not match the target's 512 (a drafter for another target?)");
    drafter_with("d-hidden", "hidden_size", "32",
                 "drafter hidden_size 32 does not match the target's 64 (a drafter for another target?)");
    drafter_with("d-target-layers", "num_target_layers", "28",
                 "drafter num_target_layers 28 does not match the target's 4 layers");
    drafter_with("d-target-layers-huge", "num_target_layers", "4294967300",
                 "config field num_target_layers = 4294967300 is out of range");
    drafter_with("d-vocab-wrap", "vocab_size", "4294967808", "config field vocab_size = 4294967808 is out of range");
    drafter_with("d-arch", "architectures", "[\"LlamaForCausalLM\"]",
                 "unsupported drafter architecture \"LlamaForCausalLM\" (supported: Qwen3DSparkModel");
    /* A target directory given as the drafter. */
    EXPECT_DRAFTER(FIX "/target", "unsupported drafter architecture \"Qwen3ForCausalLM\"", "target");
}

static void test_drafter_taps_out_of_range(void) {
    const char *msg = "is out of range: taps must be -1..2 (the target has 4 layers and its last layer cannot be tapped)";
    drafter_with("taps-last", "target_layer_ids", "[0, 3]", msg);
    drafter_with("taps-past", "target_layer_ids", "[0, 4]", msg);
    drafter_with("taps-far", "target_layer_ids", "[9, 1]", "target_layer_ids[0] = 9 is out of range");
    drafter_with("taps-neg", "target_layer_ids", "[-2, 1]", "target_layer_ids[0] = -2 is out of range");
    drafter_with("taps-wrap", "target_layer_ids", "[0, 4294967297]", "config field target_layer_ids = 4294967297 is out of range");
    drafter_with("taps-none", "target_layer_ids", "[]", "target_layer_ids must list 1..16 layers");
    drafter_with("taps-absent", "target_layer_ids", NULL, "target_layer_ids must list 1..16 layers");
    drafter_with("taps-type", "target_layer_ids", "[0, \"2\"]", "config field target_layer_ids is not an integer");
}

static void test_drafter_mask_outside_vocab(void) {
    drafter_with("mask-vocab", "mask_token_id", "512", "mask_token_id 512 is outside the vocabulary (0..511)");
    drafter_with("mask-neg", "mask_token_id", "-1", "mask_token_id -1 is outside the vocabulary (0..511)");
    drafter_with("mask-wrap", "mask_token_id", "4294967301", "config field mask_token_id = 4294967301 is out of range");
    drafter_with("mask-absent", "mask_token_id", NULL, "config is missing field mask_token_id");
}

static void test_drafter_markov_tensors_missing(void) {
    char dir[PATH_LEN], st[PATH_LEN];
    copy_model(dir, FIX "/drafter", "no-markov-tensors");
    join(st, dir, "model.safetensors");
    edit_st(st, "markov_head.markov_w1.weight", NULL, NULL);
    edit_st(st, "markov_head.markov_w2.weight", NULL, NULL);
    EXPECT_DRAFTER(dir, "missing tensor markov_head.markov_w1.weight", dir);

    drafter_with("markov-rank-8", "markov_rank", "8",
                 "tensor markov_head.markov_w1.weight has shape [512, 16], expected [512, 8]");
    drafter_with("markov-gated", "markov_head_type", "\"gated\"", "missing tensor markov_head.gate_proj.weight");
    drafter_with("markov-rnn", "markov_head_type", "\"rnn\"", "missing tensor markov_head.joint_proj.weight");
}

static void test_drafter_markov_config(void) {
    drafter_with("markov-no-type", "markov_head_type", NULL, "markov_rank 16 but no markov_head_type");
    drafter_with("markov-type-num", "markov_head_type", "1", "markov_rank 16 but no markov_head_type");
    drafter_with("markov-unknown", "markov_head_type", "\"lstm\"",
                 "markov_head_type \"lstm\" is not one of vanilla, gated, rnn");
    drafter_with("markov-neg", "markov_rank", "-1", "markov_rank -1 is negative");
    drafter_with("markov-huge", "markov_rank", "4294967312", "config field markov_rank = 4294967312 is out of range");
    drafter_with("conf-no-markov", "markov_rank", "0",
                 "confidence_head_with_markov needs a Markov head (markov_rank > 0)");
    /* Checked against the weights before any buffer is sized by it (16 GB here). */
    drafter_with("inter-huge", "intermediate_size", "1048576",
                 "tensor layers.0.mlp.gate_proj.weight has shape [160, 64], expected [1048576, 64]");
    drafter_with("block-0", "block_size", "0", "block_size 0 is outside 1..32");
    drafter_with("block-33", "block_size", "33", "block_size 33 is outside 1..32");
}

/* ---- requests ---------------------------------------------------------- */

static void test_prompt_longer_than_context(void) {
    const int n = tiny->max_ctx;
    int32_t *ids = calloc((size_t)n, sizeof *ids);
    ds_gen_params p = {.max_new = 4, .sampling = {.top_p = 1.0f}};
    ds_gen_result r;
    CHECK_ERR(ds_generate(tiny, NULL, ids, n, &p, NULL, NULL, &r),
              "prompt of 1024 tokens does not fit the model's context of 1024 tokens");
    CHECK(!r.tokens && !r.n_tokens, "result left filled in after an error");
    CHECK_ERR(ds_generate(tiny, NULL, ids, 0, &p, NULL, NULL, &r), "empty prompt");
    p.max_new = -1;
    CHECK_ERR(ds_generate(tiny, NULL, ids, 4, &p, NULL, NULL, &r), "max_new -1 is negative");
    CHECK_ERR(ds_target_forward(tiny, ids, 65, 0, 1), "forward of 65 tokens (1..64 per call)");
    CHECK_ERR(ds_target_forward(tiny, ids, 4, 1000, 1), "forward at position 1000 but the KV cache holds only");
    free(ids);
}

static void test_prompt_token_outside_vocab(void) {
    int32_t ids[] = {1, 512, 3};
    ds_gen_params p = {.max_new = 4, .sampling = {.top_p = 1.0f}};
    ds_gen_result r;
    CHECK_ERR(ds_generate(tiny, NULL, ids, 3, &p, NULL, NULL, &r),
              "prompt token 512 at index 1 is outside the vocabulary (0..511)");
    ids[1] = -7;
    CHECK_ERR(ds_generate(tiny, NULL, ids, 3, &p, NULL, NULL, &r),
              "prompt token -7 at index 1 is outside the vocabulary (0..511)");
    ids[1] = INT32_MAX;
    CHECK_ERR(ds_target_forward(tiny, ids, 3, 0, 1), "token id 2147483647 is outside the vocabulary (0..511)");
}

/* max_new far past the context: generation ends at the context (speculative
 * or not) without sizing anything by max_new. */
static void test_max_new_past_context(void) {
    char tdir[PATH_LEN];
    copy_model(tdir, FIX "/target", "short-context");
    edit_config(tdir, "max_position_embeddings", js("24"));
    ds_target *t = NULL;
    ds_drafter *d = NULL;
    CHECK_OK(ds_target_open(be, tdir, NULL, &t));
    ds_error *e = ds_drafter_open(be, FIX "/drafter", t, NULL, &d);
    CHECK(!e, "drafter: %s", ds_error_message(e));
    ds_error_free(e);
    int32_t ids[] = {5, 6, 7, 8, 9};
    ds_gen_params p = {.max_new = INT_MAX, .sampling = {.top_p = 1.0f}, .ignore_stop = true};
    for (int spec = 0; spec < 2 && d; spec++) {
        ds_gen_result r;
        e = ds_generate(t, spec ? d : NULL, ids, 5, &p, NULL, NULL, &r);
        CHECK(!e, "%s: %s", spec ? "speculative" : "autoregressive", ds_error_message(e));
        ds_error_free(e);
        CHECK(e || r.n_tokens == 24 - 5 + 1, "%d tokens (expected 20: the rest of the context, plus one)",
              r.n_tokens);
        CHECK(e || (r.stop_reason == DS_STOP_CONTEXT && !r.stopped), "stop reason %s, expected context",
              ds_stop_reason_name(r.stop_reason));
        if (!e) ds_gen_result_free(&r);
    }
    ds_drafter_free(d);
    ds_target_free(t);
}

/* ---- tokenizer --------------------------------------------------------- */

static void test_tokenizer_unsupported_model(void) {
    char dir[PATH_LEN], path[PATH_LEN];
    fresh_dir(dir, "wordpiece");
    join(path, dir, "tokenizer.json");
    write_text(path, "{\"version\": \"1.0\", \"added_tokens\": [], \"normalizer\": null, \"pre_tokenizer\": null,"
                     " \"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\","
                     " \"continuing_subword_prefix\": \"##\", \"max_input_chars_per_word\": 100,"
                     " \"vocab\": {\"[UNK]\": 0, \"a\": 1, \"##b\": 2}}}");
    ds_tokenizer *tok = NULL;
    CHECK_ERR2(ds_tokenizer_load(path, &tok), "model.type \"WordPiece\" is not supported (BPE only)", "tokenizer.json");
    ds_tokenizer_free(tok);
    tok = NULL;
    write_text(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []");
    CHECK_ERR2(ds_tokenizer_load(path, &tok), "tokenizer.json", "JSON");
    ds_tokenizer_free(tok);
    tok = NULL;
    join(path, dir, "missing.json");
    CHECK_ERR2(ds_tokenizer_load(path, &tok), "cannot open", "missing.json");
    ds_tokenizer_free(tok);
}

static void test_prompt_invalid_utf8(void) {
    ds_tokenizer *tok = NULL;
    CHECK_OK(ds_tokenizer_load(DS_TOKDATA "/pico-qwen3/tokenizer.json", &tok));
    static const struct {
        const char *text, *message;
    } cases[] = {
        {"ab\xff", "text is not valid UTF-8 at byte 2"},
        {"\xc0\x80", "text is not valid UTF-8 at byte 0"},      /* overlong NUL */
        {"x\xed\xa0\x80", "text is not valid UTF-8 at byte 1"}, /* a UTF-16 surrogate */
        {"hi \xe2\x82", "text is not valid UTF-8 at byte 3"},   /* cut mid-character */
        {"\xf4\x90\x80\x80", "text is not valid UTF-8 at byte 0"}, /* past U+10FFFF */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_ERR(ds_tokenizer_encode(tok, cases[i].text, strlen(cases[i].text), false, &ids, &n), cases[i].message);
        free(ids);
    }
    int32_t bad[] = {1, 1 << 30};
    char *text = NULL;
    CHECK_ERR(ds_tokenizer_decode(tok, bad, 2, false, &text, NULL), "token id 1073741824 at position 1 is out of range");
    free(text);
    ds_tokenizer_free(tok);
}

/* ---- the CLI ----------------------------------------------------------- */

/* Runs `dspark ARGS` (a shell line: it may redirect stdin); returns the exit
 * code (-1 if it did not exit normally), stderr (malloc'd) in *err and, when
 * out is not NULL, stdout in *out (else stdout is discarded). */
static int run_cli_out(const char *args, char **out, char **err) {
    char errf[PATH_LEN], outf[PATH_LEN], cmd[4 * PATH_LEN];
    join(errf, root, "cli.stderr");
    join(outf, root, "cli.stdout");
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s'", DS_CLI, args, out ? outf : "/dev/null", errf);
    int st = system(cmd);
    *err = read_text_file(errf, NULL);
    if (!*err) *err = calloc(1, 1);
    if (out && !(*out = read_text_file(outf, NULL))) *out = calloc(1, 1);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int run_cli(const char *args, char **err) { return run_cli_out(args, NULL, err); }

#define CHECK_CLI(args, want_rc, needle)                                                              \
    do {                                                                                              \
        char *err_;                                                                                   \
        int rc_ = run_cli(args, &err_);                                                               \
        CHECK(rc_ == (want_rc), "dspark %s: exit %d, expected %d; stderr: %s", args, rc_, want_rc, err_); \
        CHECK(strstr(err_, needle), "dspark %s: stderr lacks \"%s\": %s", args, needle, err_);        \
        free(err_);                                                                                   \
    } while (0)

static void test_cli_missing_model_dir(void) {
    char args[2 * PATH_LEN], path[PATH_LEN];
    join(path, root, "no-such-model");
    snprintf(args, sizeof args, "generate -m '%s' -p x", path);
    CHECK_CLI(args, 1, path);
    CHECK_CLI(args, 1, "not a model directory");
    /* A model directory without its tokenizer. */
    char dir[PATH_LEN];
    copy_model(dir, FIX "/target", "cli-no-tokenizer");
    snprintf(args, sizeof args, "generate -m '%s' --no-draft -p x", dir);
    CHECK_CLI(args, 1, "tokenizer.json");
}

static void test_cli_bad_flags(void) {
    CHECK_CLI("generate --no-such-flag -p x", 2, "no-such-flag");
    CHECK_CLI("generate -p x -n many", 2, "-n expects a number, got 'many'");
    CHECK_CLI("generate -p x --top-p 0", 2, "--top-p must be in (0, 1], got 0");
    /* strtof takes nan and inf: every range is written so NaN fails it. */
    CHECK_CLI("generate -p x --temp nan", 2, "--temp must be a finite number >= 0, got nan");
    CHECK_CLI("generate -p x --temp -0.5", 2, "--temp must be a finite number >= 0, got -0.5");
    CHECK_CLI("generate -p x --temp inf", 2, "--temp must be a finite number >= 0, got inf");
    CHECK_CLI("generate -p x --top-p nan", 2, "--top-p must be in (0, 1], got nan");
    CHECK_CLI("generate -p x --top-p 1.5", 2, "--top-p must be in (0, 1], got 1.5");
    CHECK_CLI("generate -p x --top-k -1", 2, "--top-k must be >= 0, got -1");
    CHECK_CLI("generate -p x --threshold nan", 2, "--threshold must be in [0, 1], got nan");
    CHECK_CLI("generate -p x --threshold -0.5", 2, "--threshold must be in [0, 1], got -0.5");
    CHECK_CLI("generate -p x --threshold 1.5", 2, "--threshold must be in [0, 1], got 1.5");
    CHECK_CLI("generate -p x --gamma 0", 2, "--gamma must be >= 1, got 0");
    CHECK_CLI("generate -p x --threads 0", 2, "--threads must be >= 1, got 0");
    /* Above the block size it used to be cut silently; the bundled drafter's is 7. */
    CHECK_CLI("generate -p x --gamma 8 --threads 1", 1, "--gamma 8 is above the drafter's block size 7");
    CHECK_CLI("generate -p x --prompt-file y", 2, "give exactly one of -p TEXT or --prompt-file F");
    CHECK_CLI("generate -p x stray", 2, "unexpected argument 'stray'");
    CHECK_CLI("generate -m", 2, "requires an argument");
    CHECK_CLI("frobnicate", 2, "unknown command 'frobnicate'");
    CHECK_CLI("", 2, "usage");
}

/* -n INT_MAX: generation ends at the (here short) context, speculative or not. */
static void test_cli_max_new_past_context(void) {
    char dir[PATH_LEN], args[3 * PATH_LEN];
    copy_model(dir, DS_MODELS "/pico-qwen3", "cli-short-context");
    edit_config(dir, "max_position_embeddings", js("16"));
    snprintf(args, sizeof args, "generate -m '%s' -d '%s' -n 2147483647 --ignore-eos --threads 1 -p hi", dir,
             DS_MODELS "/pico-qwen3-dspark");
    CHECK_CLI(args, 0, " tokens, ");
    snprintf(args, sizeof args, "generate -m '%s' --no-draft -n 2147483647 --ignore-eos --threads 1 -p hi", dir);
    CHECK_CLI(args, 0, " tokens, ");
}

static void test_cli_bad_prompt_file(void) {
    char dir[PATH_LEN], path[PATH_LEN], args[3 * PATH_LEN];
    fresh_dir(dir, "cli-prompts");
    join(path, dir, "prompts.jsonl");
    static const struct {
        const char *line, *message;
    } cases[] = {
        {"{\"input_ids\": [1, 99999]}\n", "prompts.jsonl:1: prompt token 99999 at index 1 is outside the vocabulary"},
        {"\n{\"input_ids\": []}\n", "prompts.jsonl:2: input_ids is empty"},
        {"{\"input_ids\": [1, -3]}\n", "prompts.jsonl:1: input_ids[1] = -3 is not an integer token id"},
        /* Truncating 3.5 to 3 would generate from another prompt. */
        {"{\"input_ids\": [1, 3.5]}\n", "prompts.jsonl:1: input_ids[1] = 3.5 is not an integer token id"},
        {"{\"input_ids\": [1, 1e300]}\n", "prompts.jsonl:1: input_ids[1] = 1.0000000000000001e+300 is not an integer"},
        {"{\"input_ids\": [1]} trailing\n", "prompts.jsonl:1: text after the JSON object"},
        {"{\"messages\": [{\"role\": \"user\"}]}\n", "prompts.jsonl:1: messages[0] needs \"role\" and \"content\""},
        {"{\"input_ids\": 5}\n", "prompts.jsonl:1: input_ids is not a list"},
        {"{\"text\": \"hi\"}\n", "prompts.jsonl:1: line has no \"prompt\" string"},
        {"not json\n", "prompts.jsonl:1: not a JSON object"},
        {"{\"prompt\": \"caf\xc3\"}\n", "prompts.jsonl:1: text is not valid UTF-8 at byte 3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(path, cases[i].line);
        snprintf(args, sizeof args, "generate -m '%s' --no-draft -n 2 --threads 1 --prompt-file '%s'",
                 DS_MODELS "/pico-qwen3", path);
        CHECK_CLI(args, 1, cases[i].message);
    }
    snprintf(args, sizeof args, "generate -m '%s' --no-draft --prompt-file '%s/none.jsonl'", DS_MODELS "/pico-qwen3",
             dir);
    CHECK_CLI(args, 1, "none.jsonl: cannot open: No such file or directory");
}

/* The qwen3-tiny fixture's prompt and its reference greedy continuation
 * (golden.json: prompt_ids, ar_output_ids == spec_output_ids). */
static const char *const tiny_prompt =
    "[401,486,458,307,274,357,222,314,270,349,135,218,25,272,295,92,17,261,169,180,244,400,145,246]";
static const char *const tiny_ar48 =
    "\"tokens\":[291,17,511,276,198,224,454,40,223,61,46,454,446,446,461,336,471,158,113,454,449,322,471,158,113,"
    "454,471,158,255,242,430,398,386,336,473,26,39,431,17,471,471,471,471,471,471,275,337,471]";

/* Runs ARGS, expecting exit 0 and stdout containing every needle and none of `absent`. */
static void check_cli_out(const char *args, const char *const *needles, int n, const char *absent) {
    char *out, *err;
    int rc = run_cli_out(args, &out, &err);
    CHECK(rc == 0, "dspark %s: exit %d; stderr: %s", args, rc, err);
    for (int i = 0; i < n; i++) CHECK(strstr(out, needles[i]), "dspark %s: stdout lacks %s: %s", args, needles[i], out);
    CHECK(!absent || !strstr(out, absent), "dspark %s: stdout has %s: %s", args, absent, out);
    free(out);
    free(err);
}

/* The fixture has no tokenizer.json: id prompts generate (the reference's
 * tokens, no "text"); a text prompt names what is missing and the fix. */
static void test_cli_ids_without_tokenizer(void) {
    char dir[PATH_LEN], path[PATH_LEN], line[512], args[4 * PATH_LEN];
    fresh_dir(dir, "cli-ids");
    join(path, dir, "ids.jsonl");
    snprintf(line, sizeof line, "{\"id\": \"tiny\", \"input_ids\": %s}\n", tiny_prompt);
    write_text(path, line);
    const char *want[] = {"\"id\":\"tiny\",\"prompt_tokens\":24,", tiny_ar48, "\"stop_reason\":\"length\""};
    snprintf(args, sizeof args, "generate -m '%s' --no-draft -n 48 --threads 1 --json --prompt-file '%s'",
             FIX "/target", path);
    check_cli_out(args, want, 3, "\"text\"");
    snprintf(args, sizeof args, "generate -m '%s' -d '%s' -n 48 --threads 1 --json --prompt-file - < '%s'",
             FIX "/target", FIX "/drafter", path);
    check_cli_out(args, want, 3, "\"text\"");
    /* Without --json the ids are streamed. */
    const char *plain[] = {"291 17 511 276 "};
    snprintf(args, sizeof args, "generate -m '%s' --no-draft -n 4 --threads 1 --prompt-file '%s'", FIX "/target", path);
    check_cli_out(args, plain, 1, NULL);
    snprintf(args, sizeof args, "generate -m '%s' --no-draft -n 4 --threads 1 -p hello", FIX "/target");
    CHECK_CLI(args, 1, "a text prompt needs a tokenizer, and " FIX "/target has no tokenizer.json: give --tokenizer PATH");
    write_text(path, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
    snprintf(args, sizeof args, "generate -m '%s' --no-draft -n 4 --threads 1 --prompt-file '%s'", FIX "/target", path);
    CHECK_CLI(args, 1, "ids.jsonl:1: a chat prompt needs a tokenizer");
    snprintf(args, sizeof args, "generate -m '%s' --no-draft -n 4 --threads 1 --tokenizer '%s/none.json' -p hi",
             FIX "/target", dir);
    CHECK_CLI(args, 1, "none.json");
    /* --tokenizer given a directory or its file; a pico copy without its own. */
    char pico[PATH_LEN], tok[PATH_LEN];
    copy_model(pico, DS_MODELS "/pico-qwen3", "cli-pico-no-tokenizer");
    join(tok, pico, "tokenizer.json");
    remove(tok);
    snprintf(args, sizeof args, "generate -m '%s' --no-draft -n 3 --threads 1 --json -p 'It is'", pico);
    CHECK_CLI(args, 1, "give --tokenizer PATH");
    const char *text[] = {"\"text\":\"", "\"prompt_tokens\":2,"};
    snprintf(args, sizeof args, "generate -m '%s' --no-draft -n 3 --threads 1 --json --tokenizer '%s' -p 'It is'",
             pico, DS_MODELS "/pico-qwen3");
    check_cli_out(args, text, 2, NULL);
    snprintf(args, sizeof args,
             "generate -m '%s' --no-draft -n 3 --threads 1 --json --tokenizer '%s/tokenizer.json' -p 'It is'", pico,
             DS_MODELS "/pico-qwen3");
    check_cli_out(args, text, 2, NULL);
}

/* stop_reason: "stop" at a stop token, "length" at -n, "context" when the
 * context ends first (with a warning naming it); "stopped" is kept. */
static void test_cli_stop_reason(void) {
    char dir[PATH_LEN], path[PATH_LEN], line[512], args[4 * PATH_LEN];
    copy_model(dir, FIX "/target", "cli-stop-reason");
    join(path, dir, "ids.jsonl");
    snprintf(line, sizeof line, "{\"input_ids\": %s}\n", tiny_prompt);
    write_text(path, line);
    edit_config(dir, "eos_token_id", js("17")); /* the reference's second token */
    const char *stop[] = {"\"tokens\":[291,17],\"stopped\":true,\"stop_reason\":\"stop\""};
    snprintf(args, sizeof args, "generate -m '%s' --no-draft -n 48 --threads 1 --json --prompt-file '%s'", dir, path);
    check_cli_out(args, stop, 1, NULL);
    snprintf(args, sizeof args, "generate -m '%s' -d '%s' -n 48 --threads 1 --json --prompt-file '%s'", dir,
             FIX "/drafter", path);
    check_cli_out(args, stop, 1, NULL);
    const char *length[] = {"\"tokens\":[291],\"stopped\":false,\"stop_reason\":\"length\""};
    snprintf(args, sizeof args, "generate -m '%s' --no-draft -n 1 --threads 1 --json --prompt-file '%s'", dir, path);
    check_cli_out(args, length, 1, NULL);
    /* 30 positions, 24 in the prompt: 7 tokens (the last needs no position). */
    edit_config(dir, "max_position_embeddings", js("30"));
    const char *context[] = {"\"tokens\":[291,17,511,276,198,224,454],\"stopped\":false,\"stop_reason\":\"context\""};
    for (int spec = 0; spec < 2; spec++) {
        snprintf(args, sizeof args,
                 "generate -m '%s' %s%s%s -n 5000 --ignore-eos --threads 1 --json --prompt-file '%s'", dir,
                 spec ? "-d '" : "--no-draft", spec ? FIX "/drafter" : "", spec ? "'" : "", path);
        check_cli_out(args, context, 1, NULL);
        CHECK_CLI(args, 0, "warning: stopped after 7 of 5000 new tokens: the model's context of 30 tokens is full");
    }
}

/* "-" reads standard input: -p - the prompt text (as is), --prompt-file - the lines. */
static void test_cli_stdin(void) {
    char dir[PATH_LEN], txt[PATH_LEN], jsonl[PATH_LEN], args[4 * PATH_LEN];
    fresh_dir(dir, "cli-stdin");
    join(txt, dir, "prompt.txt");
    join(jsonl, dir, "prompts.jsonl");
    write_text(txt, "It is a truth universally");
    write_text(jsonl, "{\"prompt\": \"It is a truth universally\"}\n");
    char *outs[3], *err;
    const char *forms[3] = {"-p 'It is a truth universally'", "-p - < '%s'", "--prompt-file - < '%s'"};
    for (int i = 0; i < 3; i++) {
        char form[2 * PATH_LEN];
        snprintf(form, sizeof form, forms[i], i == 1 ? txt : jsonl);
        snprintf(args, sizeof args, "generate --no-draft -n 6 --threads 1 --json %s", form);
        int rc = run_cli_out(args, &outs[i], &err);
        CHECK(rc == 0 && strstr(outs[i], "\"prompt_tokens\":6,"), "dspark %s: exit %d, %s %s", args, rc, outs[i], err);
        free(err);
    }
    /* Same prompt, same tokens: compare the "tokens" arrays. */
    for (int i = 1; i < 3; i++) {
        const char *a = strstr(outs[0], "\"tokens\":"), *b = strstr(outs[i], "\"tokens\":");
        CHECK(a && b && !strncmp(a, b, (size_t)(strchr(a, ']') - a)), "%s: tokens differ: %s vs %s", forms[i], outs[0],
              outs[i]);
    }
    for (int i = 0; i < 3; i++) free(outs[i]);
    snprintf(args, sizeof args, "generate --no-draft -n 2 --threads 1 --prompt-file - < /dev/null");
    CHECK_CLI(args, 1, "<stdin>: no prompts");
    /* tokenize - : the same ids as the text given as an argument. */
    const char *ids[] = {"[3327, 331, 261, 2879, 5128, 656]\n"};
    snprintf(args, sizeof args, "tokenize - < '%s'", txt);
    check_cli_out(args, ids, 1, NULL);
    check_cli_out("tokenize 'It is a truth universally'", ids, 1, NULL);
}

/* The prompt-file reader as a library call (what fuzz/ drives): kinds,
 * values and line numbers of a good buffer; file:line and field of bad ones. */
static void test_prompt_file_parse(void) {
    const char good[] = "{\"id\": 3, \"prompt\": \"hi\", \"input_ids\": [7, 0]}\n"
                        "\r\n  \n"
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"yo\"}]}\r\n"
                        "{\"prompt\": \"last\"}"; /* no final newline */
    ds_prompt_list l;
    CHECK_OK(ds_prompt_file_parse("g.jsonl", good, sizeof good - 1, &l));
    CHECK(l.n == 3, "%zu prompts, expected 3", l.n);
    if (l.n == 3) {
        const ds_prompt *a = &l.items[0], *b = &l.items[1], *c = &l.items[2];
        CHECK(a->line == 1 && a->kind == DS_PROMPT_IDS && a->n_ids == 2 && a->ids[0] == 7 && a->ids[1] == 0 &&
                  cJSON_IsNumber(a->id) && a->id->valueint == 3,
              "line 1: ids [7, 0] with id 3 (input_ids win over prompt)");
        CHECK(b->line == 4 && b->kind == DS_PROMPT_MESSAGES && b->n_messages == 1 &&
                  !strcmp(b->messages[0].role, "user") && !strcmp(b->messages[0].content, "yo") && !b->id,
              "line 4: one user message");
        CHECK(c->line == 5 && c->kind == DS_PROMPT_TEXT && !strcmp(c->text, "last"), "line 5: text \"last\"");
    }
    ds_prompt_list_free(&l);
    static const struct {
        const char *buf, *message;
    } bad[] = {
        {"{\"prompt\": \"a\"}\n{\"input_ids\": [1, 2.5]}\n", "b.jsonl:2: input_ids[1] = 2.5 is not an integer"},
        {"{\"input_ids\": [1, \"2\"]}", "b.jsonl:1: input_ids[1] is not a number"},
        {"{\"input_ids\": [2147483648]}", "b.jsonl:1: input_ids[0] = 2147483648 is not an integer token id"},
        {"{\"prompt\": [\"a\"]}", "b.jsonl:1: prompt is not a string"},
        {"{\"messages\": {}}", "b.jsonl:1: messages is not a list"},
        {"{\"messages\": []}", "b.jsonl:1: messages is empty"},
        {"[1, 2]", "b.jsonl:1: not a JSON object"},
        {"{\"prompt\": \"a\"", "b.jsonl:1: not a JSON object (invalid JSON"},
        {"{\"prompt\": \"a\"} {}", "b.jsonl:1: text after the JSON object (at byte 15)"},
        {"\n \n\t", "b.jsonl: no prompts (every line is blank)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_ERR(ds_prompt_file_parse("b.jsonl", bad[i].buf, strlen(bad[i].buf), &l), bad[i].message);
        CHECK(!l.items && !l.n, "case %zu: list left filled in after an error", i);
    }
    /* A NUL inside a line is not blank, and the parser never reads past len. */
    const char nul[] = {'{', '}', '\0', '\n'};
    CHECK_ERR(ds_prompt_file_parse("n.jsonl", nul, sizeof nul, &l), "n.jsonl:1: text after the JSON object");
    ds_prompt one;
    CHECK_ERR(ds_prompt_parse_line("{\"prompt\": 1}", 12, &one), "not a JSON object"); /* cut before its '}' */
}

/* ---- driver ------------------------------------------------------------ */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

#define T(fn) {fn, #fn}
static const struct {
    test_fn fn;
    const char *name;
} tests[] = {
    T(test_safetensors_truncated_mid_data),  T(test_safetensors_truncated_in_header),
    T(test_safetensors_header_length_past_end), T(test_safetensors_bad_header_json),
    T(test_safetensors_overlapping_offsets), T(test_safetensors_offsets_outside_file),
    T(test_safetensors_fractional_offsets),  T(test_fifo_instead_of_file),
    T(test_config_absurd_sizes),
    T(test_safetensors_unknown_dtype),       T(test_safetensors_shape_byte_mismatch),
    T(test_safetensors_duplicate_name),      T(test_safetensors_unreadable),
    T(test_pristine_copies_load),            T(test_missing_directory_and_files),
    T(test_unreadable_files),                T(test_sharded_index_missing_shard),
    T(test_sharded_index_bad_weight_map),    T(test_missing_tensor),
    T(test_wrong_tensor_shape),              T(test_config_missing_field),
    T(test_config_wrong_type),               T(test_config_unsupported_architecture),
    T(test_config_not_json),                 T(test_drafter_for_another_target),
    T(test_drafter_taps_out_of_range),       T(test_drafter_mask_outside_vocab),
    T(test_drafter_markov_tensors_missing),  T(test_drafter_markov_config),
    T(test_prompt_longer_than_context),      T(test_prompt_token_outside_vocab),
    T(test_max_new_past_context),            T(test_prompt_invalid_utf8),
    T(test_cli_missing_model_dir),           T(test_cli_bad_flags),
    T(test_cli_bad_prompt_file),             T(test_cli_max_new_past_context),
    T(test_tokenizer_unsupported_model),     T(test_cli_ids_without_tokenizer),
    T(test_cli_stop_reason),                 T(test_cli_stdin),
    T(test_prompt_file_parse),
};

int main(void) {
    enum { N = sizeof tests / sizeof tests[0] };
    test_fn fns[N];
    const char *names[N];
    for (int i = 0; i < N; i++) {
        fns[i] = tests[i].fn;
        names[i] = tests[i].name;
    }
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    ds_error *e = ds_backend_cpu_new(1, &be);
    if (!e) e = ds_target_open(be, FIX "/target", NULL, &tiny);
    int rc = 1;
    if (e) fprintf(stderr, "setup: %s\n", ds_error_message(e));
    else rc = run_tests("bad_input", fns, names, N);
    ds_error_free(e);
    ds_target_free(tiny);
    if (be) be->ops->destroy(be);
    if (nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) perror(root);
    return rc;
}
