/* libFuzzer harness: config.json through the real openers, target and
 * drafter. Input: the bytes of one config.json. It is written into model
 * directories whose model.safetensors are the tiny fixtures' weights
 * (testdata/fixtures/{qwen3,gemma4}-tiny), then opened both ways:
 *   - as a target with ds_target_open (architecture dispatch, the Qwen3 or
 *     Gemma 4 config reader, stop ids, weights checked against the config);
 *     the directory is the qwen3 or gemma4 one by the config's model_type;
 *   - as a drafter with ds_drafter_open against the matching tiny target,
 *     loaded once (DeepSpec fields, compatibility checks, Gemma 4 drafter
 *     config).
 * A config either loads or is refused with a named error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "draft/drafter.h"
#include "fuzz_file.h"
#include "model/target.h"

#define FIXTURES DS_ROOT "/testdata/fixtures"

static ds_backend *be;
static ds_target *qwen3_target, *gemma4_target;
static char dir_qwen3[512], dir_gemma4[512], dir_qwen3_drafter[512], dir_gemma4_drafter[512];

static void must(ds_error *e, const char *what) {
    if (!e) return;
    fprintf(stderr, "fuzz_config: %s: %s\n", what, ds_error_message(e));
    abort();
}

/* dir = tmp/name, holding a link to the fixture's weights. */
static void make_dir(char *dir, const char *name, const char *weights) {
    snprintf(dir, 512, "%s/%s", ds_fuzz_tmpdir(), name);
    char link[600];
    snprintf(link, sizeof link, "%s/model.safetensors", dir);
    if (mkdir(dir, 0700) != 0 || symlink(weights, link) != 0) {
        perror(dir);
        abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    must(ds_backend_cpu_new(1, &be), "cpu backend");
    must(ds_target_open(be, FIXTURES "/qwen3-tiny/target", NULL, &qwen3_target), "qwen3-tiny target");
    must(ds_target_open(be, FIXTURES "/gemma4-tiny/target", NULL, &gemma4_target), "gemma4-tiny target");
    make_dir(dir_qwen3, "qwen3", FIXTURES "/qwen3-tiny/target/model.safetensors");
    make_dir(dir_gemma4, "gemma4", FIXTURES "/gemma4-tiny/target/model.safetensors");
    make_dir(dir_qwen3_drafter, "qwen3-drafter", FIXTURES "/qwen3-tiny/drafter/model.safetensors");
    make_dir(dir_gemma4_drafter, "gemma4-drafter", FIXTURES "/gemma4-tiny/drafter/model.safetensors");
    return 0;
}

/* Whether the config names Gemma (model_type or architectures[0]), so the
 * Gemma 4 fixture's weights sit under it. */
static int mentions_gemma(const uint8_t *data, size_t size) {
    cJSON *root = cJSON_ParseWithLength((const char *)data, size);
    const char *mt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "model_type"));
    const char *an = cJSON_GetStringValue(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "architectures"), 0));
    int gemma = (mt && strstr(mt, "gemma")) || (an && strstr(an, "Gemma"));
    cJSON_Delete(root);
    return gemma;
}

static void write_config(const char *dir, const uint8_t *data, size_t size) {
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ds_fuzz_write(path, data, size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int gemma = mentions_gemma(data, size);

    const char *tdir = gemma ? dir_gemma4 : dir_qwen3;
    write_config(tdir, data, size);
    ds_target *t = NULL;
    ds_error *e = ds_target_open(be, tdir, NULL, &t);
    if (!e && (t->vocab <= 0 || t->hidden <= 0 || t->n_layers <= 0 || t->max_ctx <= 0)) {
        fprintf(stderr, "fuzz_config: a target opened with vocab %d hidden %d layers %d context %d\n", t->vocab,
                t->hidden, t->n_layers, t->max_ctx);
        abort();
    }
    ds_fuzz_consume(e);
    ds_target_free(t);

    const char *ddir = gemma ? dir_gemma4_drafter : dir_qwen3_drafter;
    write_config(ddir, data, size);
    ds_drafter *d = NULL;
    e = ds_drafter_open(be, ddir, gemma ? gemma4_target : qwen3_target, NULL, &d);
    if (!e && (d->gamma < 1 || d->gamma > DS_MAX_GAMMA || d->n_taps < 1 || d->n_taps > DS_MAX_TAPS)) {
        fprintf(stderr, "fuzz_config: a drafter opened with block_size %d and %d taps\n", d->gamma, d->n_taps);
        abort();
    }
    ds_fuzz_consume(e);
    ds_drafter_free(d);
    return 0;
}
