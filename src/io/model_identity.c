#include "io/model_identity.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

uint64_t ds_fnv64(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

void ds_model_identity_hex(uint64_t v, char out[17]) { snprintf(out, 17, "%016llx", (unsigned long long)v); }

#define SAMPLE_BYTES (1u << 20)

/* Hashes up to SAMPLE_BYTES of f at off into *h. */
static ds_error *hash_range(FILE *f, const char *path, long long off, unsigned char *buf, uint64_t *h) {
    if (fseeko(f, (off_t)off, SEEK_SET)) return ds_errorf("%s: cannot seek: %s", path, strerror(errno));
    size_t got = fread(buf, 1, SAMPLE_BYTES, f);
    if (ferror(f)) return ds_errorf("%s: read error", path);
    *h = ds_fnv64(*h, buf, got);
    return NULL;
}

static ds_error *hash_file(const char *dir, const char *name, unsigned char *buf, uint64_t *h) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return ds_errorf("%s: path too long", dir);
    struct stat st;
    if (stat(path, &st)) return ds_errorf("%s: %s", path, strerror(errno));
    FILE *f = fopen(path, "rb");
    if (!f) return ds_errorf("%s: %s", path, strerror(errno));
    const long long size = (long long)st.st_size;
    *h = ds_fnv64(*h, name, strlen(name) + 1);
    *h = ds_fnv64(*h, &size, sizeof size);
    ds_error *e = hash_range(f, path, 0, buf, h);
    if (!e && size > 2LL * SAMPLE_BYTES) e = hash_range(f, path, size / 2, buf, h);
    if (!e && size > SAMPLE_BYTES) e = hash_range(f, path, size - SAMPLE_BYTES, buf, h);
    fclose(f);
    return e;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

ds_error *ds_model_identity_of(const char *dir, ds_model_identity *out) {
    *out = (ds_model_identity){DS_FNV64_INIT, DS_FNV64_INIT};
    DIR *d = opendir(dir);
    if (!d) return ds_errorf("%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    ds_error *e = NULL;
    for (struct dirent *de; !e && (de = readdir(d));) {
        if (!ends_with(de->d_name, ".safetensors")) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown) e = ds_errorf("out of memory");
            else names = grown;
        }
        if (!e && !(names[n++] = strdup(de->d_name))) e = ds_errorf("out of memory");
    }
    closedir(d);
    unsigned char *buf = e ? NULL : malloc(SAMPLE_BYTES);
    if (!e && !buf) e = ds_errorf("out of memory");
    if (!e && n == 0) e = ds_errorf("%s: no *.safetensors file", dir);
    if (!e) qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n && !e; i++) e = hash_file(dir, names[i], buf, &out->weights);
    /* config.json whole: small, and any change of it changes the model */
    if (!e) {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", dir);
        FILE *f = fopen(path, "rb");
        if (!f) {
            e = ds_errorf("%s: %s", path, strerror(errno));
        } else {
            size_t got;
            while ((got = fread(buf, 1, SAMPLE_BYTES, f)) > 0) out->config = ds_fnv64(out->config, buf, got);
            if (ferror(f)) e = ds_errorf("%s: read error", path);
            fclose(f);
        }
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    free(buf);
    return e;
}
