/* What the harnesses share: an in-memory file for the parsers that take a
 * path (a memfd, reached as /proc/self/fd/N, so no disk is touched and no
 * production API is added for fuzzing), and the repository's root. */
#ifndef DS_FUZZ_FILE_H
#define DS_FUZZ_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "dspark.h"

/* Replaces the contents of the process's one memfd (created on the first
 * call, named `name`) with data[0..size) and returns its path. Aborts when the kernel refuses:
 * that is the harness failing, not the code under test. */
const char *ds_fuzz_file(const char *name, const uint8_t *data, size_t size);

/* Writes data[0..size) to path (a real file: for APIs that look for a
 * file by name inside a directory). Aborts on failure. */
void ds_fuzz_write(const char *path, const uint8_t *data, size_t size);

/* A fresh private directory under /dev/shm (or TMPDIR), removed at exit. */
const char *ds_fuzz_tmpdir(void);

/* Frees e; aborts when its message is empty: every error must say what is
 * at fault. */
void ds_fuzz_consume(ds_error *e);

#endif
