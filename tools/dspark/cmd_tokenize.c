/* `dspark tokenize`: text -> ids as a JSON array, or --decode ids -> text.
 * Exit codes: 0 ok, 1 error (bad file, bad text, bad id), 2 usage. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "dspark.h"
#include "io/checkpoint.h"

#ifndef DS_DEFAULT_MODEL_DIR
#define DS_DEFAULT_MODEL_DIR "models"
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspark tokenize [--tokenizer PATH] [--add-special] TEXT\n"
            "       dspark tokenize [--tokenizer PATH] [--skip-special] --decode '[ID, ...]'\n"
            "\n"
            "  --tokenizer PATH  a tokenizer.json, or a model directory containing one\n"
            "                    (default: %s/pico-qwen3/tokenizer.json)\n"
            "  --add-special     also add what the post-processor adds (e.g. BOS)\n"
            "  --decode IDS      decode a JSON array of ids instead of encoding\n"
            "  --skip-special    with --decode: drop special tokens\n"
            "\n"
            "TEXT '-' reads the text from standard input. Ids are printed as a JSON array.\n",
            DS_DEFAULT_MODEL_DIR);
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "dspark tokenize: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    usage(stderr);
    return 2;
}

static int fail(ds_error *e) {
    fprintf(stderr, "dspark tokenize: %s\n", ds_error_message(e));
    ds_error_free(e);
    return 1;
}

/* Parses "[1, 2, 3]"; returns false (with a message) if it is not an array of ids. */
static bool parse_ids(const char *s, int32_t **ids, size_t *n) {
    cJSON *a = cJSON_Parse(s);
    *ids = NULL;
    *n = 0;
    if (!cJSON_IsArray(a)) {
        cJSON_Delete(a);
        fprintf(stderr, "dspark tokenize: --decode expects a JSON array of ids, got '%s'\n", s);
        return false;
    }
    size_t cnt = (size_t)cJSON_GetArraySize(a), i = 0;
    *ids = malloc((cnt ? cnt : 1) * sizeof **ids);
    for (const cJSON *c = a->child; c && *ids; c = c->next, i++) {
        double d = c->valuedouble;
        if (!cJSON_IsNumber(c) || d != floor(d) || d < -2147483648.0 || d > 2147483647.0) {
            fprintf(stderr, "dspark tokenize: --decode: element %zu is not an integer id\n", i);
            free(*ids);
            *ids = NULL;
            cJSON_Delete(a);
            return false;
        }
        (*ids)[i] = (int32_t)d;
    }
    cJSON_Delete(a);
    if (!*ids) {
        fprintf(stderr, "dspark tokenize: out of memory\n");
        return false;
    }
    *n = cnt;
    return true;
}

int cmd_tokenize(int argc, char **argv) {
    const char *path = DS_DEFAULT_MODEL_DIR "/pico-qwen3/tokenizer.json";
    const char *decode = NULL, *text = NULL;
    bool add_special = false, skip_special = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tokenizer") || !strcmp(a, "--decode")) {
            if (i + 1 >= argc) return usage_error("%s needs a value", a);
            if (!strcmp(a, "--tokenizer")) path = argv[++i];
            else decode = argv[++i];
        } else if (!strncmp(a, "--tokenizer=", 12)) {
            path = a + 12;
        } else if (!strncmp(a, "--decode=", 9)) {
            decode = a + 9;
        } else if (!strcmp(a, "--add-special")) {
            add_special = true;
        } else if (!strcmp(a, "--skip-special")) {
            skip_special = true;
        } else if (!strcmp(a, "--")) {
            if (i + 2 != argc) return usage_error("%s", "expected exactly one TEXT after --");
            text = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            return usage_error("unknown option '%s'", a);
        } else if (text) {
            return usage_error("unexpected extra argument '%s' (quote TEXT)", a);
        } else {
            text = a;
        }
    }
    if (decode && text) return usage_error("%s", "give either TEXT or --decode, not both");
    if (!decode && !text) return usage_error("%s", "missing TEXT (or --decode IDS)");

    int32_t *ids = NULL;
    size_t n = 0;
    if (decode && !parse_ids(decode, &ids, &n)) return 2;

    ds_tokenizer *tok = NULL;
    ds_error *e = ds_tokenizer_load(path, &tok);
    if (e) {
        free(ids);
        return fail(e);
    }
    int rc = 0;
    if (decode) {
        char *out = NULL;
        size_t len = 0;
        e = ds_tokenizer_decode(tok, ids, n, skip_special, &out, &len);
        if (e) {
            rc = fail(e);
        } else {
            fwrite(out, 1, len, stdout);
            fputc('\n', stdout);
        }
        free(out);
    } else {
        char *owned = NULL;
        size_t len = strlen(text);
        if (!strcmp(text, "-")) {
            if ((e = ds_read_stream(stdin, "<stdin>", &owned, &len))) {
                ds_tokenizer_free(tok);
                return fail(e);
            }
            text = owned;
        }
        e = ds_tokenizer_encode(tok, text, len, add_special, &ids, &n);
        if (e) {
            rc = fail(e);
        } else {
            fputc('[', stdout);
            for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
            fputs("]\n", stdout);
        }
        free(owned);
    }
    free(ids);
    ds_tokenizer_free(tok);
    if (!rc && fflush(stdout) != 0) {
        fprintf(stderr, "dspark tokenize: cannot write output\n");
        rc = 1;
    }
    return rc;
}
