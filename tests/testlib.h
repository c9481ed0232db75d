/* A tiny test harness: CHECK records a failure and goes on, so one run
 * reports every broken expectation; test_main's exit code is the verdict. */
#ifndef DS_TESTLIB_H
#define DS_TESTLIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dspark.h"

extern int ds_test_failures;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            ds_test_failures++;                                            \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

/* Fails the test (and returns from the caller) if e is an error. */
#define CHECK_OK(expr)                                                     \
    do {                                                                   \
        ds_error *chk_e_ = (expr);                                         \
        if (chk_e_) {                                                      \
            ds_test_failures++;                                            \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, \
                    ds_error_message(chk_e_));                             \
            ds_error_free(chk_e_);                                         \
            return;                                                        \
        }                                                                  \
    } while (0)

/* Expects an error whose message contains `needle`; frees it. */
void check_error_contains(ds_error *e, const char *needle, const char *what, const char *file, int line);
#define CHECK_ERR(expr, needle) check_error_contains((expr), (needle), #expr, __FILE__, __LINE__)

/* Max over i of |a-b| / max(|b|_inf, tiny): error relative to the tensor's scale. */
double rel_err_max(const float *a, const float *b, size_t n);

/* Reads a whole file (NUL-terminated); NULL if unreadable. */
char *read_text_file(const char *path, size_t *len);

/* A JSON file parsed (cJSON *, the caller deletes it); NULL plus a failure
 * if it is missing or not JSON. void * keeps cJSON out of this header. */
void *read_json_file(const char *path);
/* Writes a cJSON tree to path, pretty-printed; a failure if it cannot. */
void write_json_file(const char *path, const void *json);

/* Loads DS_TOKDATA/<name>/tokenizer.json, one of the unpacked real
 * tokenizers several suites share; NULL plus a failure if it cannot. */
ds_tokenizer *load_test_tokenizer(const char *name);

/* Removes a scratch model directory (config.json, model.safetensors, the
 * directory) that a config test made, and frees dir; NULL does nothing. */
void remove_model_dir(char *dir);

/* Runs test functions and prints a summary; returns the process exit code. */
typedef void (*test_fn)(void);
int run_tests(const char *suite, const test_fn *fns, const char *const *names, int n);
#define RUN_TESTS(suite, ...)                                              \
    int main(void) {                                                       \
        test_fn fns_[] = {__VA_ARGS__};                                    \
        const char *names_[] = {DS_STRINGS_(__VA_ARGS__)};                 \
        return run_tests(suite, fns_, names_, (int)(sizeof fns_ / sizeof fns_[0])); \
    }
/* Stringify each of up to 32 arguments. */
#define DS_STRINGS_(...)                                                                                        \
    DS_STR_N_(__VA_ARGS__, DS_S32, DS_S31, DS_S30, DS_S29, DS_S28, DS_S27, DS_S26, DS_S25, DS_S24, DS_S23,       \
              DS_S22, DS_S21, DS_S20, DS_S19, DS_S18, DS_S17, DS_S16, DS_S15, DS_S14, DS_S13, DS_S12, DS_S11,    \
              DS_S10, DS_S9, DS_S8, DS_S7, DS_S6, DS_S5, DS_S4, DS_S3, DS_S2, DS_S1)(__VA_ARGS__)
#define DS_STR_N_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21, \
                  _22, _23, _24, _25, _26, _27, _28, _29, _30, _31, _32, N, ...)                                 \
    N
#define DS_S1(a) #a
#define DS_S2(a, ...) #a, DS_S1(__VA_ARGS__)
#define DS_S3(a, ...) #a, DS_S2(__VA_ARGS__)
#define DS_S4(a, ...) #a, DS_S3(__VA_ARGS__)
#define DS_S5(a, ...) #a, DS_S4(__VA_ARGS__)
#define DS_S6(a, ...) #a, DS_S5(__VA_ARGS__)
#define DS_S7(a, ...) #a, DS_S6(__VA_ARGS__)
#define DS_S8(a, ...) #a, DS_S7(__VA_ARGS__)
#define DS_S9(a, ...) #a, DS_S8(__VA_ARGS__)
#define DS_S10(a, ...) #a, DS_S9(__VA_ARGS__)
#define DS_S11(a, ...) #a, DS_S10(__VA_ARGS__)
#define DS_S12(a, ...) #a, DS_S11(__VA_ARGS__)
#define DS_S13(a, ...) #a, DS_S12(__VA_ARGS__)
#define DS_S14(a, ...) #a, DS_S13(__VA_ARGS__)
#define DS_S15(a, ...) #a, DS_S14(__VA_ARGS__)
#define DS_S16(a, ...) #a, DS_S15(__VA_ARGS__)
#define DS_S17(a, ...) #a, DS_S16(__VA_ARGS__)
#define DS_S18(a, ...) #a, DS_S17(__VA_ARGS__)
#define DS_S19(a, ...) #a, DS_S18(__VA_ARGS__)
#define DS_S20(a, ...) #a, DS_S19(__VA_ARGS__)
#define DS_S21(a, ...) #a, DS_S20(__VA_ARGS__)
#define DS_S22(a, ...) #a, DS_S21(__VA_ARGS__)
#define DS_S23(a, ...) #a, DS_S22(__VA_ARGS__)
#define DS_S24(a, ...) #a, DS_S23(__VA_ARGS__)
#define DS_S25(a, ...) #a, DS_S24(__VA_ARGS__)
#define DS_S26(a, ...) #a, DS_S25(__VA_ARGS__)
#define DS_S27(a, ...) #a, DS_S26(__VA_ARGS__)
#define DS_S28(a, ...) #a, DS_S27(__VA_ARGS__)
#define DS_S29(a, ...) #a, DS_S28(__VA_ARGS__)
#define DS_S30(a, ...) #a, DS_S29(__VA_ARGS__)
#define DS_S31(a, ...) #a, DS_S30(__VA_ARGS__)
#define DS_S32(a, ...) #a, DS_S31(__VA_ARGS__)

/* The backend a test runs its models on: the CPU (2 threads) unless
 * DS_BACKEND=cuda asks for the GPU (device DS_CUDA_DEVICE, default 0). A
 * CUDA run where no device can be used prints "SKIP: no CUDA device ..."
 * and exits 77, which ctest counts as skipped. */
typedef struct ds_backend ds_backend;
ds_error *test_backend_new(ds_backend **out);

/* Golden tensors: a safetensors file read whole into fp32 / int arrays. */
typedef struct ds_safetensors ds_safetensors;
ds_safetensors *golden_open(const char *path);
/* Copies tensor `name` as fp32 (malloc'd); NULL + a failure if absent. */
float *golden_f32(ds_safetensors *g, const char *name, size_t *n);
int32_t *golden_i32(ds_safetensors *g, const char *name, size_t *n);
void golden_close(ds_safetensors *g);

#endif
