/* The CUDA backend's environment switches (cuda_config.c, plain C in every
 * build): what an unset environment gives, each value a switch takes, and a
 * malformed value refused with an error naming the variable. Runs without a
 * GPU. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_config.h"
#include "testlib.h"

static const char *const VARS[] = {"DS_CUDA_GRAPHS", "DS_CUDA_PROFILE", "DS_CUDA_RING", "DS_CUDA_RING_BOXES",
                                   "DS_CUDA_HEAD_BOUND", "DS_CUDA_MARKOV_FUSED", "DS_CUDA_INVARIANT", "DS_CUDA_QUANT", "DS_CUDA_RING_TRACE"};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof VARS / sizeof VARS[0]; i++) unsetenv(VARS[i]);
}

/* The config from the environment with name=value; NULL value: unset. An error's message into why. */
static bool parse(const char *name, const char *value, ds_cuda_config *c, char *why, size_t n) {
    clear_env();
    if (value) setenv(name, value, 1);
    ds_error *e = ds_cuda_config_from_env(c);
    why[0] = 0;
    if (e) {
        snprintf(why, n, "%s", ds_error_message(e));
        ds_error_free(e);
    }
    return e == NULL;
}

static void test_defaults(void) {
    ds_cuda_config c;
    char why[256];
    CHECK(parse("DS_CUDA_GRAPHS", NULL, &c, why, sizeof why), "unset environment: %s", why);
    const ds_cuda_config d = ds_cuda_config_default();
    CHECK(c.graphs && !c.profile && c.ring && c.head_bound && c.quant && !c.invariant, "switches' defaults");
    CHECK(c.markov_fused == -1 && c.ring_boxes == DS_CU_BOXES_AUTO, "auto settings");
    CHECK(c.ring_min_tiles == d.ring_min_tiles && c.fused_attn_min_rows == d.fused_attn_min_rows &&
              c.att_pack_min_blocks == d.att_pack_min_blocks && !strcmp(c.ring_trace, d.ring_trace),
          "an unset environment gives ds_cuda_config_default()'s thresholds");
}

static void test_values(void) {
    ds_cuda_config c;
    char why[256];
    CHECK(parse("DS_CUDA_INVARIANT", "1", &c, why, sizeof why) && c.invariant, "DS_CUDA_INVARIANT=1");
    CHECK(parse("DS_CUDA_GRAPHS", "0", &c, why, sizeof why) && !c.graphs, "DS_CUDA_GRAPHS=0");
    CHECK(parse("DS_CUDA_QUANT", "0", &c, why, sizeof why) && !c.quant, "DS_CUDA_QUANT=0");
    CHECK(parse("DS_CUDA_MARKOV_FUSED", "0", &c, why, sizeof why) && c.markov_fused == 0, "DS_CUDA_MARKOV_FUSED=0");
    CHECK(parse("DS_CUDA_RING_BOXES", "1", &c, why, sizeof why) && c.ring_boxes == DS_CU_BOXES_ALWAYS,
          "DS_CUDA_RING_BOXES=1");
    CHECK(parse("DS_CUDA_RING_TRACE", "/tmp/t.bin", &c, why, sizeof why) && !strcmp(c.ring_trace, "/tmp/t.bin"),
          "DS_CUDA_RING_TRACE");
}

static void test_malformed(void) {
    ds_cuda_config c;
    char why[256];
    const struct {
        const char *name, *value;
    } bad[] = {{"DS_CUDA_RING_BOXES", "2"}, {"DS_CUDA_RING_BOXES", "yes"}, {"DS_CUDA_RING_BOXES", "some"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const bool ok = parse(bad[i].name, bad[i].value, &c, why, sizeof why);
        CHECK(!ok && strstr(why, bad[i].name) && strstr(why, bad[i].value), "%s=%s: refused naming both (\"%s\")",
              bad[i].name, bad[i].value, why);
    }
    char longpath[600];
    memset(longpath, 'a', sizeof longpath - 1);
    longpath[sizeof longpath - 1] = 0;
    CHECK(!parse("DS_CUDA_RING_TRACE", longpath, &c, why, sizeof why) && strstr(why, "DS_CUDA_RING_TRACE"),
          "an over-long trace path refused (\"%s\")", why);
    clear_env();
}

RUN_TESTS("cuda_config", test_defaults, test_values, test_malformed)
