/* The CLI's byte sizes (tools/dspark/size_arg.c): --kv-mem's parser, which
 * every command that opens a batched engine shares, and the sizes the KV
 * pool's line prints. */
#include <string.h>

#include "size_arg.h"
#include "testlib.h"

static void test_sizes(void) {
    static const struct {
        const char *text;
        int64_t bytes;
    } ok[] = {
        {"0", 0},
        {"1073741824", 1073741824},
        {"512M", 512LL << 20},
        {"8G", 8LL << 30},
        {"1.5GiB", 3LL << 29},
        {"1.5gib", 3LL << 29},
        {"2KB", 2048},
        {"1k", 1024},
        {"4Gi", 4LL << 30},
        {"3T", 3LL << 40},
        {"100B", 100},
        {".5K", 512},
        {"1.", 1},
        {"1.9", 1},              /* a fraction of a byte is dropped */
        {"0.001K", 1},           /* 1.024 bytes */
        {"8388607T", 8388607LL << 40},
        {"8388607.99T", (8388607LL << 40) + (int64_t)(0.99 * (1LL << 40))},
        {"9223372036854775807", INT64_MAX},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        int64_t v = -1;
        ds_error *e = ds_size_arg("--kv-mem", ok[i].text, &v);
        CHECK(!e && v == ok[i].bytes, "'%s': %lld, expected %lld (%s)", ok[i].text, (long long)v,
              (long long)ok[i].bytes, e ? ds_error_message(e) : "ok");
        ds_error_free(e);
    }
    static const char *const bad[] = {"", "M", "G8", "-1G", "+1G", " 1G", "1G ", "1 G", "1e9", "0x10", "nan", "inf",
                                      "1.5x", "1GG", "1GBs", "1..5G", "1,5G", "1P"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int64_t v = -1;
        char needle[80];
        snprintf(needle, sizeof needle, "--kv-mem expects a size in bytes, e.g. 512M, 8G, 1.5GiB or 1073741824");
        CHECK_ERR(ds_size_arg("--kv-mem", bad[i], &v), needle);
        CHECK(v == 0, "'%s' refused, but left %lld", bad[i], (long long)v);
    }
    static const char *const huge[] = {"8388608T", "9223372036854775808", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof huge / sizeof *huge; i++) {
        int64_t v = -1;
        CHECK_ERR(ds_size_arg("--kv-mem", huge[i], &v), "is more bytes than fit in 63 bits");
    }
}

static void test_format(void) {
    static const struct {
        int64_t bytes;
        const char *text;
    } cases[] = {{0, "0 B"}, {1023, "1023 B"}, {1536, "1.50 KiB"}, {8192, "8.00 KiB"}, {34340864, "32.8 MiB"},
                 {200LL << 20, "200 MiB"}, {8LL << 30, "8.00 GiB"}, {3LL << 40, "3.00 TiB"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char buf[32];
        ds_size_format(cases[i].bytes, buf, sizeof buf);
        CHECK(!strcmp(buf, cases[i].text), "%lld bytes: \"%s\", expected \"%s\"", (long long)cases[i].bytes, buf,
              cases[i].text);
    }
    ds_engine_info in = {.kv_pages = 262, .kv_page_rows = 16, .kv_tokens = 4192, .kv_bytes = 262LL * 16 * 11264,
                         .kv_target_row_bytes = 8192, .kv_drafter_row_bytes = 3072};
    char line[256];
    ds_kv_pool_line(&in, line, sizeof line);
    CHECK(!strcmp(line, "KV pool: 262 pages x 16 rows = 4192 tokens, 45.0 MiB (target 8.00 KiB + drafter 3.00 KiB "
                        "per row)"),
          "%s", line);
    in.kv_drafter_row_bytes = 0;
    in.kv_bytes = 262LL * 16 * 8192;
    ds_kv_pool_line(&in, line, sizeof line);
    CHECK(!strcmp(line, "KV pool: 262 pages x 16 rows = 4192 tokens, 32.8 MiB (target 8.00 KiB per row)"), "%s", line);
    in.kv_drafter_row_bytes = 3072, in.kv_bytes = 262LL * 16 * 11264;
    in.held_bytes = 2LL * 256 * 8 * 20480 * 4; /* 256 in flight, gamma 7, 5 taps of 4096 */
    ds_kv_pool_line(&in, line, sizeof line);
    CHECK(!strcmp(line, "KV pool: 262 pages x 16 rows = 4192 tokens, 45.0 MiB (target 8.00 KiB + drafter 3.00 KiB "
                        "per row); held drafter context 320 MiB"),
          "%s", line);
}

RUN_TESTS("size_arg", test_sizes, test_format)
