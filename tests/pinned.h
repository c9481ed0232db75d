/* The engine's own pinned values (testdata/pinned/pico.json): results that
 * hold bit for bit on every host (the CPU's reductions run in orders the
 * code fixes), kept per build variant (DS_X_BF16 on: "x_bf16", off:
 * "x_fp32"). With DS_PIN_WRITE=1 a test records what it computed instead
 * of checking it (scripts/pin_goldens.sh; only after a deliberate change
 * of numerics, said in the commit). */
#ifndef DS_TEST_PINNED_H
#define DS_TEST_PINNED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PINNED_FILE DS_TESTDATA "/pinned/pico.json"

/* Loads the file (setup); a missing file is a failure unless writing. */
void pinned_open(void);
/* Writes the file back when writing, and frees it (teardown). */
void pinned_close(void);
bool pinned_writing(void);
/* Checks (or records) value under key in this variant's object. */
void pinned_check(const char *key, const char *value);
/* FNV-1a, 64 bits, over raw bytes (the hashes name bit patterns). */
#define PINNED_FNV_START 0xcbf29ce484222325ull
uint64_t pinned_fnv(uint64_t h, const void *p, size_t n);
/* pinned_check of a hash as 16 hex digits. */
void pinned_check_hash(const char *key, uint64_t h);

#endif
