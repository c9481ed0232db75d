/* What a training run writes: the drafter as a checkpoint (DeepSpec's
 * layout: config.json + model.safetensors with every drafter tensor,
 * embed_tokens and lm_head included, which `dspark generate -d` and
 * DeepSpec load), and the optimizer state a run resumes from (fp32 master
 * weights, AdamW's moments, the step count). Files are written under a
 * temporary name and renamed into place: one that exists is whole. */
#ifndef DS_TRAIN_CHECKPOINT_H
#define DS_TRAIN_CHECKPOINT_H

#include "base/dtype.h"
#include "train/drafter_train.h"

#define DS_TRAIN_STATE_FILE "trainer_state.safetensors"

/* dir/config.json (the drafter's, "dtype" set to dtype's name) and dir/model.safetensors in dtype
 * (DS_BF16 or DS_F32); dir is created if missing. */
ds_error *ds_train_save_drafter(const ds_drafter_train *t, const char *dir, ds_dtype dtype);
/* path: weights.*, adam_m.*, adam_v.* (fp32) and steps. */
ds_error *ds_train_save_state(const ds_drafter_train *t, const char *path);
/* Restores what save_state wrote; an error names the file and the tensor that is missing or of another
 * shape (a state of another drafter). */
ds_error *ds_train_load_state(ds_drafter_train *t, const char *path);

#endif
