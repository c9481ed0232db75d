/* dspark train's loss curves: OUT/train_log.jsonl drawn as OUT/loss.png —
 * the training loss a step (and its three terms, scaled by the recipe's
 * weights) and the validation passes' loss as points. */
#ifndef DS_TRAIN_PLOT_H
#define DS_TRAIN_PLOT_H

#include "base/error.h"

/* note: a line under the title (tau on the validation prompts), or "". */
ds_error *ds_train_plot(const char *log_path, const char *png_path, const char *note);

#endif
