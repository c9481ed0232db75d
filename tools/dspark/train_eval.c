#include "train_eval.h"

#include <stdlib.h>
#include <string.h>

#include "io/prompt_file.h"
#include "prompt_ids.h"

ds_error *train_eval_tau(const char *target_dir, const char *drafter_dir, const char *prompt_file, int max_new,
                         int threads, const char *backend, train_eval *out) {
    memset(out, 0, sizeof *out);
    ds_prompt_list list = {0};
    DS_TRY(ds_prompt_file_read(prompt_file, &list));
    const ds_engine_opts eo = {.model_dir = target_dir, .drafter_dir = drafter_dir, .threads = threads,
                               .backend = backend, .no_sts = true};
    ds_engine *e = NULL;
    ds_stats *st = NULL;
    ds_error *err = ds_engine_open(&eo, &e);
    if (!err) err = ds_stats_new(&st);
    const ds_generate_opts go = {.max_new = max_new};
    for (size_t i = 0; i < list.n && !err; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        err = cli_prompt_ids(e, &list.items[i], &ids, &n);
        ds_output r;
        if (!err) err = ds_engine_generate(e, ids, n, &go, NULL, NULL, &r);
        if (err) err = ds_error_wrap(err, "%s:%d", prompt_file, list.items[i].line);
        free(ids);
        if (err) break;
        ds_stats_add(st, &r);
        out->tokens += r.n_tokens;
        ds_output_free(&r);
        out->prompts++;
    }
    if (!err) {
        ds_stats_summary m;
        ds_stats_summarize(st, &m);
        out->tau = m.acceptance_length, out->rounds = m.rounds;
    }
    ds_stats_free(st);
    ds_engine_free(e);
    ds_prompt_list_free(&list);
    return err;
}
