#include "testlib.h"

#include "backend/backend.h"
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int ds_test_failures = 0;

void check_error_contains(ds_error *e, const char *needle, const char *what, const char *file, int line) {
    if (!e) {
        ds_test_failures++;
        fprintf(stderr, "%s:%d: %s succeeded, expected an error containing \"%s\"\n", file, line, what, needle);
        return;
    }
    if (!strstr(ds_error_message(e), needle)) {
        ds_test_failures++;
        fprintf(stderr, "%s:%d: %s: error \"%s\" does not contain \"%s\"\n", file, line, what,
                ds_error_message(e), needle);
    }
    ds_error_free(e);
}

double rel_err_max(const float *a, const float *b, size_t n) {
    double scale = 1e-30, err = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)b[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= err)) err = d; /* NaN propagates as a failure */
    }
    return err / scale;
}

char *read_text_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

void *read_json_file(const char *path) {
    char *txt = read_text_file(path, NULL);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    CHECK(j, "%s: missing or not JSON", path);
    return j;
}

void write_json_file(const char *path, const void *json) {
    char *text = cJSON_Print((const cJSON *)json);
    FILE *f = text ? fopen(path, "w") : NULL;
    CHECK(f != NULL, "cannot write %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    free(text);
}

ds_tokenizer *load_test_tokenizer(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", DS_TOKDATA, name);
    ds_tokenizer *tok = NULL;
    ds_error *e = ds_tokenizer_load(path, &tok);
    CHECK(e == NULL, "loading %s: %s", path, ds_error_message(e));
    ds_error_free(e);
    return tok;
}

void remove_model_dir(char *dir) {
    char path[512];
    if (!dir) return;
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
    free(dir);
}

int run_tests(const char *suite, const test_fn *fns, const char *const *names, int n) {
    int total_failed = 0;
    /* DS_TEST_ONLY=a,b runs only the named tests (plus setup/teardown). */
    const char *only = getenv("DS_TEST_ONLY");
    for (int i = 0; i < n; i++) {
        if (only && *only && strcmp(names[i], "setup") && strcmp(names[i], "teardown") && !strstr(only, names[i]))
            continue;
        int before = ds_test_failures;
        fns[i]();
        int failed = ds_test_failures - before;
        printf("%s %s.%s\n", failed ? "FAIL" : "ok  ", suite, names[i]);
        fflush(stdout);
        total_failed += failed ? 1 : 0;
    }
    printf("%s: %d/%d passed\n", suite, n - total_failed, n);
    return total_failed ? 1 : 0;
}

ds_safetensors *golden_open(const char *path) {
    ds_safetensors *g = NULL;
    ds_error *e = ds_safetensors_open(path, &g);
    if (e) {
        ds_test_failures++;
        fprintf(stderr, "cannot open golden file: %s\n", ds_error_message(e));
        ds_error_free(e);
    }
    return g;
}

static const ds_st_tensor *golden_find(ds_safetensors *g, const char *name, size_t *n) {
    const ds_st_tensor *t = g ? ds_safetensors_find(g, name) : NULL;
    if (!t) {
        ds_test_failures++;
        fprintf(stderr, "golden tensor %s missing\n", name);
        return NULL;
    }
    size_t count = 1;
    for (int i = 0; i < t->ndim; i++) count *= (size_t)t->shape[i];
    if (n) *n = count;
    return t;
}

float *golden_f32(ds_safetensors *g, const char *name, size_t *n) {
    size_t count;
    const ds_st_tensor *t = golden_find(g, name, &count);
    if (!t) return NULL;
    float *out = malloc((count ? count : 1) * sizeof *out);
    /* The data may be unaligned inside the file: copy through bytes first. */
    void *tmp = malloc(t->nbytes ? t->nbytes : 1);
    memcpy(tmp, t->data, t->nbytes);
    ds_to_f32(t->dtype, tmp, out, count);
    free(tmp);
    if (n) *n = count;
    return out;
}

int32_t *golden_i32(ds_safetensors *g, const char *name, size_t *n) {
    size_t count;
    float *f = golden_f32(g, name, &count);
    if (!f) return NULL;
    int32_t *out = malloc((count ? count : 1) * sizeof *out);
    for (size_t i = 0; i < count; i++) out[i] = (int32_t)f[i];
    free(f);
    if (n) *n = count;
    return out;
}

void golden_close(ds_safetensors *g) { ds_safetensors_close(g); }

ds_error *test_backend_new(ds_backend **out) {
    const char *name = getenv("DS_BACKEND");
    if (!name || !*name || !strcmp(name, "cpu")) return ds_backend_cpu_new(2, out);
    if (strcmp(name, "cuda")) return ds_errorf("DS_BACKEND=%s: expected cpu or cuda", name);
    const char *dev = getenv("DS_CUDA_DEVICE");
    ds_error *e = ds_backend_cuda_new(dev ? atoi(dev) : 0, out);
    if (e) {
        printf("SKIP: no CUDA device [%s]\n", ds_error_message(e));
        fflush(stdout);
        ds_error_free(e);
        exit(77);
    }
    printf("  backend: cuda\n");
    return NULL;
}
