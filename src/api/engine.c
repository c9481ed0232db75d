/* The public engine API: the internal target, drafter, tokenizer and loop
 * behind the few calls of include/dspark.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dspark.h"
#include "draft/drafter.h"
#include "speculate/generate.h"
#include "speculate/metrics.h"

struct ds_engine {
    ds_backend *be;
    ds_target *target;
    ds_drafter *drafter;
    ds_tokenizer *tok;
};

void ds_engine_free(ds_engine *e) {
    if (!e) return;
    ds_tokenizer_free(e->tok);
    ds_drafter_free(e->drafter);
    ds_target_free(e->target);
    if (e->be) e->be->ops->destroy(e->be);
    free(e);
}

ds_error *ds_engine_open(const ds_engine_opts *o, ds_engine **out) {
    *out = NULL;
    if (!o || !o->model_dir) return ds_errorf("ds_engine_open: no model directory given");
    ds_engine *e = calloc(1, sizeof *e);
    if (!e) return ds_errorf("out of memory");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = o->threads > 0 ? o->threads : cpus > 0 ? (int)cpus : 1;
    ds_error *err = NULL;
    if (!o->backend || !strcmp(o->backend, "cpu")) err = ds_backend_cpu_new(threads, &e->be);
    else if (!strcmp(o->backend, "cuda")) err = ds_backend_cuda_new(0, &e->be);
    else err = ds_errorf("unknown backend \"%s\" (cpu or cuda)", o->backend);
    ds_target_opts to = {.max_logit_rows = DS_MAX_GAMMA + 1}; /* prefill chunks: the backend's prefill_rows */
    if (!err) err = ds_target_open(e->be, o->model_dir, &to, &e->target);
    if (!err && o->drafter_dir) err = ds_drafter_open(e->be, o->drafter_dir, e->target, NULL, &e->drafter);
    if (!err) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer.json", o->model_dir);
        err = ds_tokenizer_load(path, &e->tok);
    }
    if (err) {
        ds_engine_free(e);
        return err;
    }
    *out = e;
    return NULL;
}

const ds_tokenizer *ds_engine_tokenizer(const ds_engine *e) { return e->tok; }

ds_error *ds_engine_generate(ds_engine *e, const int32_t *prompt, size_t n_prompt, const ds_generate_opts *o,
                             ds_on_token on_token, void *user, ds_output *out) {
    memset(out, 0, sizeof *out);
    if (!o) return ds_errorf("ds_engine_generate: no options");
    if (n_prompt > (size_t)e->target->max_ctx)
        return ds_errorf("prompt of %zu tokens does not fit the model's context of %d tokens", n_prompt,
                         e->target->max_ctx);
    ds_gen_params p = {.max_new = o->max_new,
                       .sampling = {.temperature = o->temperature, .top_k = o->top_k,
                                    .top_p = o->top_p > 0 && o->top_p < 1 ? o->top_p : 1.0f},
                       .seed = o->seed,
                       .threshold = o->threshold,
                       .gamma = o->gamma,
                       .ignore_stop = o->ignore_eos};
    ds_gen_result r;
    DS_TRY(ds_generate(e->target, o->no_draft ? NULL : e->drafter, prompt, (int)n_prompt, &p, on_token, user, &r));
    ds_metrics m = {0};
    ds_metrics_add(&m, &r);
    *out = (ds_output){.tokens = r.tokens, .n_tokens = r.n_tokens, .stopped = r.stopped, .rounds = r.rounds,
                       .acceptance_length = ds_metrics_tau(&m), .prefill_s = r.prefill_s, .draft_s = r.draft_s,
                       .verify_s = r.verify_s, .total_s = r.total_s};
    r.tokens = NULL; /* handed to *out */
    ds_gen_result_free(&r);
    return NULL;
}

void ds_output_free(ds_output *o) {
    free(o->tokens);
    memset(o, 0, sizeof *o);
}
