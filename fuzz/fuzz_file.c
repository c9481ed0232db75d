#include "fuzz_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void die(const char *what) {
    perror(what);
    abort();
}

static void write_all(int fd, const uint8_t *data, size_t size) {
    if (ftruncate(fd, 0) != 0) die("fuzz: ftruncate");
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(fd, data + done, size - done, (off_t)done);
        if (n <= 0) die("fuzz: pwrite");
        done += (size_t)n;
    }
}

const char *ds_fuzz_file(const char *name, const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create(name, MFD_CLOEXEC);
        if (fd < 0) die("fuzz: memfd_create");
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    write_all(fd, data, size);
    return path;
}

void ds_fuzz_write(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) die(path);
    if (size && fwrite(data, 1, size, f) != size) die(path);
    if (fclose(f) != 0) die(path);
}

static char tmpdir[256];

static void remove_tmpdir(void) {
    char cmd[300];
    if (!tmpdir[0]) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", tmpdir);
}

const char *ds_fuzz_tmpdir(void) {
    if (tmpdir[0]) return tmpdir;
    const char *base = getenv("TMPDIR");
    if (!base || access(base, W_OK) != 0) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(tmpdir, sizeof tmpdir, "%s/dspark-fuzz-XXXXXX", base);
    if (!mkdtemp(tmpdir)) die("fuzz: mkdtemp");
    atexit(remove_tmpdir);
    return tmpdir;
}

void ds_fuzz_consume(ds_error *e) {
    if (!e) return;
    const char *m = ds_error_message(e);
    if (!m || !*m) {
        fprintf(stderr, "fuzz: an error with an empty message\n");
        abort();
    }
    ds_error_free(e);
}
