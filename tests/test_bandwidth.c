/* The memory bandwidth probe (ds_backend_ops.bandwidth) on the CPU backend
 * and the floor `dspark bench` divides by: the probe names what it timed and
 * gives a plausible rate, bad arguments are errors, and the bench's JSON
 * derives its floor and percentages from the figure it reports (measured,
 * or, with --bandwidth-mib 0, none on a CPU, which has no datasheet figure). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "backend/backend.h"
#include "testlib.h"

#define NUM(o, k) cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k))

static bool close_to(double a, double b) { return fabs(a - b) <= 1e-9 * fabs(b); }

static void test_cpu_probe(void) {
    ds_backend *be;
    CHECK_OK(ds_backend_cpu_new(2, &be));
    ds_bandwidth bw;
    /* asked for less than the probe's minimum: it reads 64 MiB anyway (past the caches it is meant to miss) */
    ds_error *e = ds_backend_bandwidth(be, 1 << 20, 2, &bw);
    CHECK(!e, "%s", e ? ds_error_message(e) : "");
    ds_error_free(e);
    CHECK(bw.buffer_bytes == 64.0 * (1 << 20), "buffer %g bytes", bw.buffer_bytes);
    /* any machine this runs on reads between 100 MB/s and 10 TB/s */
    CHECK(bw.bytes_per_s > 1e8 && bw.bytes_per_s < 1e13, "%g bytes/s", bw.bytes_per_s);
    CHECK(bw.method && strstr(bw.method, "read"), "method %s", bw.method ? bw.method : "(none)");
    CHECK(bw.peak_bytes_per_s == 0 && bw.device[0] == 0, "a CPU has no datasheet figure here: %g '%s'",
          bw.peak_bytes_per_s, bw.device);
    CHECK_ERR(ds_backend_bandwidth(be, 1 << 26, 0, &bw), "0 repetitions");
    be->ops->destroy(be);
}

/* Runs dspark bench --json on the pico target; the parsed object, or NULL and a failure. */
static cJSON *bench_json(const char *extra) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' bench -m '%s/pico-qwen3' --threads 2 --prompt-len 8 --decode 8 --reps 2 --json %s",
             DS_CLI, DS_MODELS, extra);
    FILE *f = popen(cmd, "r");
    static char buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = 0;
    int st = f ? pclose(f) : -1;
    CHECK(st == 0, "%s: status %d", cmd, st);
    cJSON *j = cJSON_Parse(buf);
    CHECK(j, "%s: not JSON: %s", cmd, buf);
    return j;
}

static void test_bench_floor_measured(void) {
    cJSON *j = bench_json("--bandwidth-mib 64");
    if (!j) return;
    const cJSON *bw = cJSON_GetObjectItemCaseSensitive(j, "memory_bandwidth"),
                *a = cJSON_GetObjectItemCaseSensitive(j, "ar_decode"), *m = cJSON_GetObjectItemCaseSensitive(j, "model");
    const double measured = NUM(bw, "measured_bytes_per_s");
    CHECK(measured > 1e8, "measured %g", measured);
    CHECK(NUM(bw, "buffer_bytes") == 64.0 * (1 << 20) && NUM(bw, "reps") == 3, "buffer %g reps %g",
          NUM(bw, "buffer_bytes"), NUM(bw, "reps"));
    CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(bw, "datasheet_bytes_per_s")), "a CPU datasheet figure");
    CHECK(!cJSON_GetObjectItemCaseSensitive(bw, "assumed_bytes_per_s"), "the GPU's assumed figure on a CPU");
    const char *basis = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(a, "floor_basis"));
    CHECK(basis && !strcmp(basis, "measured"), "floor basis %s", basis ? basis : "(none)");
    CHECK(NUM(a, "floor_bytes_per_s") == measured, "floor at %g, measured %g", NUM(a, "floor_bytes_per_s"), measured);
    const double floor_ms = NUM(m, "bytes_read_per_token") / measured * 1e3;
    CHECK(close_to(NUM(a, "floor_ms_per_token"), floor_ms), "floor %.17g ms, expected %.17g",
          NUM(a, "floor_ms_per_token"), floor_ms);
    CHECK(close_to(NUM(a, "pct_of_floor"), 100 * floor_ms / NUM(a, "ms_per_token")), "pct %.17g of a %.17g floor at %g",
          NUM(a, "pct_of_floor"), floor_ms, NUM(a, "ms_per_token"));
    CHECK(!cJSON_GetObjectItemCaseSensitive(a, "pct_of_datasheet_floor") &&
              !cJSON_GetObjectItemCaseSensitive(a, "pct_of_assumed_floor"),
          "percentages of figures a CPU does not have");
    cJSON_Delete(j);
}

static void test_bench_floor_unmeasured(void) {
    cJSON *j = bench_json("--bandwidth-mib 0");
    if (!j) return;
    const cJSON *bw = cJSON_GetObjectItemCaseSensitive(j, "memory_bandwidth"),
                *a = cJSON_GetObjectItemCaseSensitive(j, "ar_decode");
    CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(bw, "measured_bytes_per_s")), "measured without a probe");
    const char *probe = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(bw, "probe"));
    CHECK(probe && strstr(probe, "--bandwidth-mib 0"), "probe %s", probe ? probe : "(none)");
    /* no figure at all on a CPU: no floor rather than a made-up one */
    CHECK(!cJSON_GetObjectItemCaseSensitive(a, "floor_basis") && !cJSON_GetObjectItemCaseSensitive(a, "pct_of_floor"),
          "a floor without a bandwidth");
    CHECK(NUM(a, "ms_per_token") > 0, "ms per token %g", NUM(a, "ms_per_token"));
    cJSON_Delete(j);
}

/* A bad probe size is refused by name, before any model loads. */
static void test_bench_bad_size(void) {
    const char *bad[] = {"-1", "x", "2000000"};
    for (int i = 0; i < 3; i++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "'%s' bench -m '%s/pico-qwen3' --bandwidth-mib %s 2>&1 >/dev/null", DS_CLI, DS_MODELS,
                 bad[i]);
        FILE *f = popen(cmd, "r");
        char err[1024] = {0};
        size_t n = f ? fread(err, 1, sizeof err - 1, f) : 0;
        err[n] = 0;
        int st = f ? pclose(f) : -1;
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2, "--bandwidth-mib %s: status %d", bad[i], st);
        CHECK(strstr(err, "--bandwidth-mib expects 0..1048576"), "--bandwidth-mib %s: %s", bad[i], err);
    }
}

RUN_TESTS("bandwidth", test_cpu_probe, test_bench_floor_measured, test_bench_floor_unmeasured, test_bench_bad_size)
