/* `dspark train`'s run (issue 41): a drafter trained on a datagen cache by
 * the DeepSpec recipe (SPEC §7) — sequences shuffled each epoch, anchors
 * drawn per sequence, micro-batches accumulated into optimizer steps,
 * AdamW with warmup + cosine and gradient clipping — with a held-out
 * validation split, checkpoints, and resumption: rerunning the same command
 * continues from the last saved state and ends where an uninterrupted run
 * would (the data order and the anchors are functions of the seed and the
 * step, not of the run's history). */
#ifndef DS_TRAINER_H
#define DS_TRAINER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/error.h"
#include "train/drafter_train.h"

typedef struct {
    int64_t step, steps;       /* steps done (after this report), of */
    double loss, ce, l1, conf; /* this step's (mean over its micro-batches) */
    double lr, grad_norm;
    double tokens_per_s;       /* cache tokens consumed a second, this run */
    double elapsed_s, eta_s;
    bool has_val;              /* a validation pass ran at this step */
    double val_loss, val_ce, val_l1, val_conf;
    bool saved;                /* a checkpoint was written at this step */
} ds_train_progress;

typedef struct {
    const char *target_dir; /* the target the cache was made with: checked, and its embeddings are the drafter's */
    const char *init_dir;   /* start from this drafter's weights, or */
    const char *config_path; /* from scratch: this drafter config.json (init_seed) */
    const char *data_dir;   /* a `dspark datagen` cache */
    const char *out_dir;    /* the trained drafter, trainer_state.safetensors, train_log.jsonl, run.json */
    int64_t steps;          /* optimizer steps */
    int batch;              /* sequences a step */
    int micro;              /* sequences a micro-batch, each normalised on its own (0: batch) */
    int num_anchors;        /* anchors a sequence (0: the config's num_anchors, else 64) */
    double lr, warmup_ratio, clip;
    uint64_t seed, init_seed;
    int64_t save_every;     /* steps between checkpoints (0: only at the end) */
    int64_t eval_every;     /* steps between validation passes (0: only at the end) */
    double val_frac;        /* the cache's last sequences held out for validation (0: none) */
    ds_dtype save_dtype;    /* DS_BF16 or DS_F32 */
    int threads;            /* CPU threads (0: all) */
    bool tf32;              /* CUDA: GEMMs on TF32 tensor cores (faster; ~1e-3 relative instead of fp32's) */
    bool cuda;              /* train on CUDA GPU 0 (train_ops_cuda.cu) instead of the CPU */
    void (*progress)(void *user, const ds_train_progress *p);
    void *user;
    /* Set (by a signal handler, or the progress callback) to stop: the run saves a checkpoint after the
     * current step and returns; rerunning resumes there. NULL: none. */
    volatile sig_atomic_t *stop;
} ds_train_opts;

/* The recipe's defaults (lr 6e-4, 4 % warmup, clip 1.0, batch 64 sequences, micro 1 as DeepSpec's
 * configs, val 2 %, bf16 checkpoints). */
ds_train_opts ds_train_opts_default(void);

typedef struct {
    int64_t steps_run, resumed_from, n_train, n_val;
    bool interrupted; /* stopped by opts.stop, with a checkpoint saved */
    double seconds, tokens_per_s;
    ds_train_progress last;
} ds_train_report;

ds_error *ds_train_run(const ds_train_opts *o, ds_train_report *rep);

#endif
