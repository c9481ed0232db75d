/* CPU benchmark on the bundled pico pair: prefill tokens/s, AR decode
 * tokens/s, drafted tokens/s with tau, and the drafted speedup, at T=0 and
 * T=1, measured side by side in one run over the dev prompts.
 *
 *   bench_cpu [--prompts N] [--new N] [--threads N] [--reps R] [--drafter DIR]
 *
 * Each configuration runs R times over the same prompts; the fastest pass is
 * reported (the others only absorb noise from a shared machine). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "draft/drafter.h"
#include "io/checkpoint.h"
#include "speculate/generate.h"
#include "speculate/metrics.h"

#define MAX_PROMPTS 64

typedef struct {
    int n;
    int32_t ids[128];
} prompt;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int load_prompts(prompt *out, int max) {
    char *buf;
    ds_error *e = ds_read_file(DS_MODELS "/prompts-dev.jsonl", &buf, NULL);
    if (e) {
        fprintf(stderr, "%s\n", ds_error_message(e));
        ds_error_free(e);
        return 0;
    }
    int n = 0;
    for (char *line = strtok(buf, "\n"); line && n < max; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *ids = cJSON_GetObjectItem(o, "input_ids");
        out[n].n = 0;
        for (const cJSON *v = ids ? ids->child : NULL; v && out[n].n < 128; v = v->next)
            out[n].ids[out[n].n++] = (int32_t)v->valuedouble;
        cJSON_Delete(o);
        n++;
    }
    free(buf);
    return n;
}

typedef struct {
    double best_s, tau;
    long tokens;
    double draft_s, verify_s;
} pass;

static int run_pass(ds_target *t, ds_drafter *d, const prompt *ps, int n, int max_new, float temp, int reps,
                    pass *out) {
    out->best_s = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        ds_metrics m = {0};
        double t0 = now_s();
        for (int i = 0; i < n; i++) {
            ds_gen_params p = {.max_new = max_new, .sampling = {.temperature = temp, .top_p = 1}, .seed = 980406 + i};
            ds_gen_result r;
            ds_error *e = ds_generate(t, d, ps[i].ids, ps[i].n, &p, NULL, NULL, &r);
            if (e) {
                fprintf(stderr, "generate: %s\n", ds_error_message(e));
                ds_error_free(e);
                return 1;
            }
            ds_metrics_add(&m, &r);
            ds_gen_result_free(&r);
        }
        double s = now_s() - t0;
        if (s < out->best_s) {
            out->best_s = s;
            out->tau = ds_metrics_tau(&m);
            out->tokens = m.tokens;
            out->draft_s = m.draft_s;
            out->verify_s = m.verify_s;
        }
    }
    return 0;
}

/* Prefill throughput: one forward over a 64-token prompt, best of reps. */
static double prefill_tps(ds_target *t, const prompt *p, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps * 5; r++) {
        double t0 = now_s();
        ds_target_crop(t, 0);
        ds_error *e = ds_target_forward(t, p->ids, p->n, 0, 1);
        if (e) {
            ds_error_free(e);
            return 0;
        }
        double s = now_s() - t0;
        if (s < best) best = s;
    }
    return p->n / best;
}

int main(int argc, char **argv) {
    int n_prompts = 8, max_new = 128, reps = 3;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cpus > 0 ? (int)cpus : 1;
    const char *drafter = DS_MODELS "/pico-qwen3-dspark";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--prompts")) n_prompts = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--new")) max_new = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--drafter")) drafter = argv[i + 1];
        else {
            fprintf(stderr, "usage: bench_cpu [--prompts N] [--new N] [--threads N] [--reps R] [--drafter DIR]\n");
            return 2;
        }
    }
    static prompt ps[MAX_PROMPTS];
    int n = load_prompts(ps, MAX_PROMPTS);
    if (n_prompts < n) n = n_prompts;
    ds_backend *be;
    ds_target *t;
    ds_drafter *d;
    ds_target_opts to = {.max_rows = 64, .max_logit_rows = DS_MAX_GAMMA + 1};
    ds_error *e = ds_backend_cpu_new(threads, &be);
    if (!e) e = ds_target_open(be, DS_MODELS "/pico-qwen3", &to, &t);
    if (!e) e = ds_drafter_open(be, drafter, t, NULL, &d);
    if (e) {
        fprintf(stderr, "bench_cpu: %s\n", ds_error_message(e));
        return 1;
    }
    printf("# pico-qwen3 + %s, %d prompts x %d new tokens, %d threads, best of %d\n", drafter, n, max_new, threads,
           reps);
    printf("prefill: %.0f tokens/s (64-token prompt)\n", prefill_tps(t, &ps[0], reps));
    for (int ti = 0; ti < 2; ti++) {
        float temp = ti ? 1.0f : 0.0f;
        pass ar, sp;
        if (run_pass(t, NULL, ps, n, max_new, temp, reps, &ar) || run_pass(t, d, ps, n, max_new, temp, reps, &sp))
            return 1;
        double ar_tps = ar.tokens / ar.best_s, sp_tps = sp.tokens / sp.best_s;
        printf("T=%.0f: AR %.1f tok/s | drafted %.1f tok/s, tau %.3f | speedup %.2fx (%.2f of tau) | "
               "draft %.0f%% verify %.0f%% of drafted time\n",
               temp, ar_tps, sp_tps, sp.tau, sp_tps / ar_tps, sp_tps / ar_tps / sp.tau, 100 * sp.draft_s / sp.best_s,
               100 * sp.verify_s / sp.best_s);
    }
    ds_drafter_free(d);
    ds_target_free(t);
    be->ops->destroy(be);
    return 0;
}
