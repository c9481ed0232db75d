/* libFuzzer harness: affine-quantized checkpoints (issue 42) through the
 * real openers and a forward. Input: a config.json (first byte '{') written
 * beside the quantized tiny fixtures' weights
 * (testdata/fixtures/{qwen3,gemma4}-tiny-quant: int4 group-32 targets, an int8
 * drafter), or else a whole model.safetensors opened under the qwen3 int4
 * fixture's config. Either way: opened as a target (qwen3 or gemma4 by the
 * config's model_type) and, for configs, as a drafter against the plain tiny
 * target; an opened target runs a 3-token forward and its logits are finite
 * or not, but read. A checkpoint either loads or is refused with a named
 * error: packed words, scales and biases of any shape, dtype or value, a
 * quantization block of any content (per-module overrides included). */
#include <math.h>
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
static char dir_qwen3[512], dir_gemma4[512], dir_drafter_q[512], dir_drafter_g[512], dir_weights[512];

static void must(ds_error *e, const char *what) {
    if (!e) return;
    fprintf(stderr, "fuzz_quant: %s: %s\n", what, ds_error_message(e));
    abort();
}

/* dir = tmp/name; with `weights`, a link to them as its model.safetensors. */
static void make_dir(char *dir, const char *name, const char *weights) {
    snprintf(dir, 512, "%s/%s", ds_fuzz_tmpdir(), name);
    char link[600];
    snprintf(link, sizeof link, "%s/model.safetensors", dir);
    if (mkdir(dir, 0700) != 0 || (weights && symlink(weights, link) != 0)) {
        perror(dir);
        abort();
    }
}

static void copy_config(const char *dir, const char *from) {
    char *data;
    size_t len;
    must(ds_read_file(from, &data, &len), from);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ds_fuzz_write(path, (const uint8_t *)data, len);
    free(data);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    must(ds_backend_cpu_new(1, &be), "cpu backend");
    must(ds_target_open(be, FIXTURES "/qwen3-tiny/target", NULL, &qwen3_target), "qwen3-tiny target");
    must(ds_target_open(be, FIXTURES "/gemma4-tiny/target", NULL, &gemma4_target), "gemma4-tiny target");
    make_dir(dir_qwen3, "qwen3", FIXTURES "/qwen3-tiny-quant/target-q4g32/model.safetensors");
    make_dir(dir_gemma4, "gemma4", FIXTURES "/gemma4-tiny-quant/target-q4g32/model.safetensors");
    make_dir(dir_drafter_q, "qwen3-drafter", FIXTURES "/qwen3-tiny-quant/drafter-q8g32/model.safetensors");
    make_dir(dir_drafter_g, "gemma4-drafter", FIXTURES "/gemma4-tiny-quant/drafter-q8g32/model.safetensors");
    make_dir(dir_weights, "weights", NULL);
    copy_config(dir_weights, FIXTURES "/qwen3-tiny-quant/target-q4g32/config.json");
    return 0;
}

static int mentions_gemma(const uint8_t *data, size_t size) {
    cJSON *root = cJSON_ParseWithLength((const char *)data, size);
    const char *mt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "model_type"));
    const char *an = cJSON_GetStringValue(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "architectures"), 0));
    int gemma = (mt && strstr(mt, "gemma")) || (an && strstr(an, "Gemma"));
    cJSON_Delete(root);
    return gemma;
}

/* Opens dir as a target and runs 3 tokens through it. */
static void open_and_run(const char *dir) {
    ds_target *t = NULL;
    ds_error *e = ds_target_open(be, dir, NULL, &t);
    if (!e) {
        const int32_t ids[3] = {0, 1, t->vocab - 1};
        e = ds_target_forward(t, ids, 3, 0, 1);
        if (!e) {
            float *l = malloc((size_t)t->vocab * sizeof *l);
            be->ops->download(be, ds_rows(t->logits, 0, 1), l);
            int nonfinite = 0; /* any value may come out of fuzzed scales; every one is read */
            for (int i = 0; i < t->vocab; i++) nonfinite += !isfinite(l[i]);
            if (nonfinite > t->vocab) abort();
            free(l);
        }
    }
    ds_fuzz_consume(e);
    ds_target_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[600];
    if (size > 0 && data[0] != '{') { /* a model.safetensors */
        snprintf(path, sizeof path, "%s/model.safetensors", dir_weights);
        ds_fuzz_write(path, data, size);
        open_and_run(dir_weights);
        return 0;
    }
    const int gemma = mentions_gemma(data, size);
    const char *tdir = gemma ? dir_gemma4 : dir_qwen3;
    snprintf(path, sizeof path, "%s/config.json", tdir);
    ds_fuzz_write(path, data, size);
    open_and_run(tdir);

    const char *ddir = gemma ? dir_drafter_g : dir_drafter_q;
    snprintf(path, sizeof path, "%s/config.json", ddir);
    ds_fuzz_write(path, data, size);
    ds_drafter *d = NULL;
    ds_error *e = ds_drafter_open(be, ddir, gemma ? gemma4_target : qwen3_target, NULL, &d);
    ds_fuzz_consume(e);
    ds_drafter_free(d);
    return 0;
}
