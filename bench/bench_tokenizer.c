/* A tokenizer.json's load time and encode throughput (moved out of
 * test_tokenizer: tests assert numbers, benches time).
 *
 *   bench_tokenizer TOKENIZER_JSON [TEXT_FILE] [--reps N]
 *
 * TEXT_FILE is encoded whole, N times (default 20); without it only the
 * load is timed. What test_tokenizer printed: the gemma3 load (33 MB) and
 * qwen3 encoding testdata/tokenizers/cases.jsonl, e.g. with the build
 * tree's unpacked tokenizers:
 *   bench_tokenizer build/tokdata/gemma3/tokenizer.json
 *   bench_tokenizer build/tokdata/qwen3/tokenizer.json testdata/tokenizers/cases.jsonl */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dspark.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap + 1);
    for (size_t got; s && (got = fread(s + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) s = realloc(s, (cap *= 2) + 1);
    }
    fclose(f);
    if (s) s[n] = 0, *len = n;
    return s;
}

static int fail(ds_error *e, const char *what) {
    fprintf(stderr, "%s: %s\n", what, ds_error_message(e));
    ds_error_free(e);
    return 1;
}

int main(int argc, char **argv) {
    const char *tok_path = NULL, *text_path = NULL;
    int reps = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!tok_path) tok_path = argv[i];
        else if (!text_path) text_path = argv[i];
        else tok_path = NULL, i = argc;
    }
    if (!tok_path || reps < 1) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON [TEXT_FILE] [--reps N]\n", argv[0]);
        return 2;
    }
    ds_tokenizer *t = NULL;
    double t0 = now_s();
    ds_error *e = ds_tokenizer_load(tok_path, &t);
    if (e) return fail(e, tok_path);
    printf("%s: load %.3f s\n", tok_path, now_s() - t0);
    if (text_path) {
        size_t len = 0, total = 0;
        char *text = read_all(text_path, &len);
        if (!text) {
            fprintf(stderr, "cannot read %s\n", text_path);
            return 1;
        }
        t0 = now_s();
        for (int r = 0; r < reps; r++) {
            int32_t *ids;
            size_t n;
            if ((e = ds_tokenizer_encode(t, text, len, false, &ids, &n))) return fail(e, "encode");
            total += n;
            free(ids);
        }
        const double s = now_s() - t0;
        printf("%s (%zu bytes) x %d: encode %.1f MB/s (%.0f tokens/s)\n", text_path, len, reps,
               (double)len * reps / s / 1e6, (double)total / s);
        free(text);
    }
    ds_tokenizer_free(t);
    return 0;
}
