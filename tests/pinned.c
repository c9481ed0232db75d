#include "pinned.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "testlib.h"

#if DS_X_BF16_ON
#define VARIANT "x_bf16"
#else
#define VARIANT "x_fp32"
#endif

static cJSON *all, *variant;
static bool writing;

bool pinned_writing(void) { return writing; }

void pinned_open(void) {
    writing = getenv("DS_PIN_WRITE") && !strcmp(getenv("DS_PIN_WRITE"), "1");
    if (writing) {
        FILE *f = fopen(PINNED_FILE, "r"); /* a first pin starts from nothing */
        if (f) fclose(f);
        all = f ? read_json_file(PINNED_FILE) : cJSON_CreateObject();
    } else {
        all = read_json_file(PINNED_FILE);
    }
    if (!all) return;
    variant = cJSON_GetObjectItemCaseSensitive(all, VARIANT);
    if (!variant) variant = cJSON_AddObjectToObject(all, VARIANT);
}

void pinned_close(void) {
    if (writing && all) write_json_file(PINNED_FILE, all);
    cJSON_Delete(all);
    all = variant = NULL;
}

void pinned_check(const char *key, const char *value) {
    if (!variant) {
        CHECK(0, "%s could not be read: %s not checked", PINNED_FILE, key);
        return;
    }
    if (writing) {
        cJSON_DeleteItemFromObject(variant, key);
        cJSON_AddStringToObject(variant, key, value);
        printf("  pinned %s.%s = %s\n", VARIANT, key, value);
        return;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(variant, key);
    CHECK(cJSON_IsString(v), "%s has no %s.%s (scripts/pin_goldens.sh records it)", PINNED_FILE, VARIANT, key);
    if (cJSON_IsString(v))
        CHECK(!strcmp(v->valuestring, value), "%s.%s: computed %s, pinned %s", VARIANT, key, value, v->valuestring);
    printf("  %s.%s %s\n", VARIANT, key, value);
}

uint64_t pinned_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

void pinned_check_hash(const char *key, uint64_t h) {
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    pinned_check(key, hex);
}
