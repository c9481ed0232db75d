/* Perplexity of a target on held-out passages: what quantizing a model
 * costs (issue 42 compares int8 / int4 with bf16 on the same text).
 *
 *   bench_ppl -m MODEL_DIR --prompt-file F.jsonl [--threads N]
 *
 * Each line of F is an object with "input_ids" (used as given) or a text
 * field, "prompt" or "text" (tokenized with the model's tokenizer.json, no
 * special tokens). A passage (at most the model's context) is scored in
 * forwards of 64 rows: the mean over positions 1..T-1 of -log softmax(logits[i-1])[id[i]],
 * in double, from the logits as the engine returns them (bf16-rounded for
 * bf16 checkpoints, as the reference computes). Prints tokens, mean NLL in
 * nats and perplexity, pooled over all passages. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "dspark.h"
#include "io/checkpoint.h"
#include "model/target.h"

static int fail(ds_error *e) {
    fprintf(stderr, "bench_ppl: %s\n", ds_error_message(e));
    ds_error_free(e);
    return 1;
}

int main(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    int threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt-file")) file = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    if (!model || !file) {
        fprintf(stderr, "usage: bench_ppl -m MODEL_DIR --prompt-file F.jsonl [--threads N]\n");
        return 2;
    }
    ds_backend *be;
    ds_error *e = ds_backend_cpu_new(threads, &be);
    if (e) return fail(e);
    ds_target *t;
    if ((e = ds_target_open(be, model, NULL, &t))) return fail(e);
    ds_tokenizer *tok = NULL;
    char *tpath = ds_path_join(model, "tokenizer.json");
    if (tpath && ds_path_exists(tpath) && (e = ds_tokenizer_load(tpath, &tok))) return fail(e);
    free(tpath);
    char *text;
    size_t len;
    if ((e = ds_read_file(file, &text, &len))) return fail(e);
    const int V = t->vocab;
    float *logits = NULL;
    double nll = 0;
    long n_tok = 0, n_passages = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        if (!o) continue;
        int32_t *ids = NULL;
        size_t n = 0;
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "input_ids");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "prompt");
        if (!cJSON_IsString(s)) s = cJSON_GetObjectItemCaseSensitive(o, "text");
        if (cJSON_IsArray(arr)) {
            n = (size_t)cJSON_GetArraySize(arr);
            ids = malloc(n * sizeof *ids);
            size_t k = 0;
            for (const cJSON *it = arr->child; it; it = it->next) ids[k++] = (int32_t)it->valuedouble;
        } else if (cJSON_IsString(s) && tok) {
            if ((e = ds_tokenizer_encode(tok, s->valuestring, strlen(s->valuestring), false, &ids, &n))) return fail(e);
        }
        cJSON_Delete(o);
        if ((int)n > t->max_ctx) n = (size_t)t->max_ctx;
        if (n >= 2) {
            logits = realloc(logits, n * (size_t)V * sizeof *logits);
            ds_target_crop(t, 0);
            for (size_t c0 = 0; c0 < n; c0 += 64) { /* chunks a forward takes (the backend's prefill rows) */
                const int nc = n - c0 < 64 ? (int)(n - c0) : 64;
                if ((e = ds_target_forward(t, ids + c0, nc, (int)c0, nc))) return fail(e);
                be->ops->download(be, ds_rows(t->logits, 0, nc), logits + c0 * (size_t)V);
            }
            for (size_t i = 1; i < n; i++) {
                const float *l = logits + (i - 1) * (size_t)V;
                double m = l[0], z = 0;
                for (int v = 1; v < V; v++) m = l[v] > m ? l[v] : m;
                for (int v = 0; v < V; v++) z += exp((double)l[v] - m);
                nll += m + log(z) - l[ids[i]];
                n_tok++;
            }
            n_passages++;
        }
        free(ids);
    }
    printf("{\"model\": \"%s\", \"passages\": %ld, \"tokens\": %ld, \"nll\": %.6f, \"perplexity\": %.4f}\n", model,
           n_passages, n_tok, n_tok ? nll / (double)n_tok : 0.0, n_tok ? exp(nll / (double)n_tok) : 0.0);
    free(logits);
    free(text);
    ds_tokenizer_free(tok);
    ds_target_free(t);
    be->ops->destroy(be);
    return 0;
}
