/* dspark train's measure of a drafter: its acceptance length (tau, SPEC §5)
 * on a validation prompt set, greedy, speculative decoding through the
 * engine exactly as `dspark generate --prompt-file` runs it. */
#ifndef DS_TRAIN_EVAL_H
#define DS_TRAIN_EVAL_H

#include "dspark.h"

typedef struct {
    double tau;       /* sum of accept_len / rounds over every prompt */
    int prompts, rounds;
    int64_t tokens;
} train_eval;

/* prompt_file: generate's format (text needs the target's tokenizer; chat messages its template). */
ds_error *train_eval_tau(const char *target_dir, const char *drafter_dir, const char *prompt_file, int max_new,
                         int threads, const char *backend, train_eval *out);

#endif
