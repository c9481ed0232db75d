/* The learning rate of each optimizer step: linear warmup, then cosine
 * decay, exactly as DeepSpec's CosineAnnealingWarmupLR produces it (the
 * recipe's schedule, SPEC §7). Its chainable cosine takes one extra step at
 * the hand-over, so step W runs slightly above the peak and the whole
 * cosine is scaled by 2 / (1 + cos(pi / T)); the golden losses
 * (testdata/fixtures/qwen3-tiny-train) depend on it at 1e-4. */
#ifndef DS_LR_SCHEDULE_H
#define DS_LR_SCHEDULE_H

#include <stdint.h>

typedef struct {
    double peak;
    int64_t total_steps, warmup_steps; /* warmup = (int)(ratio * total), as DeepSpec */
} ds_lr_schedule;

ds_lr_schedule ds_lr_schedule_make(double peak, int64_t total_steps, double warmup_ratio);
/* The lr of 0-based optimizer step s: peak * (s+1) / W for s < W, else
 * peak * (1 + cos(pi (s-W) / T)) / (1 + cos(pi / T)) with T = total - W (T <= 1: the peak). */
double ds_lr_at(const ds_lr_schedule *s, int64_t step);

#endif
