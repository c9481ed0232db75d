#include "pico_prompts.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

static int read_ids(const cJSON *arr, int32_t *dst, int cap) {
    int n = 0;
    for (const cJSON *v = arr ? arr->child : NULL; v && n < cap; v = v->next) dst[n++] = (int32_t)v->valuedouble;
    return n;
}

int pico_load_prompts(pico_prompt *out, int max) {
    size_t len;
    char *buf = read_text_file(DS_MODELS "/prompts-dev.jsonl", &len);
    if (!buf) {
        CHECK(0, "cannot read %s", DS_MODELS "/prompts-dev.jsonl");
        return 0;
    }
    int n = 0;
    for (char *line = strtok(buf, "\n"); line && n < max; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        if (!o) continue;
        out[n].n_ids = read_ids(cJSON_GetObjectItem(o, "input_ids"), out[n].ids, 128);
        out[n].n_ar = read_ids(cJSON_GetObjectItem(o, "ar_greedy_output_ids"), out[n].ar, 128);
        cJSON_Delete(o);
        n++;
    }
    free(buf);
    return n;
}
