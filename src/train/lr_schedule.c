#include "train/lr_schedule.h"

#include <math.h>

ds_lr_schedule ds_lr_schedule_make(double peak, int64_t total_steps, double warmup_ratio) {
    return (ds_lr_schedule){peak, total_steps, (int64_t)(warmup_ratio * (double)total_steps)};
}

double ds_lr_at(const ds_lr_schedule *s, int64_t step) {
    const int64_t W = s->warmup_steps, T = s->total_steps - W;
    if (step < W) return s->peak * (double)(step + 1) / (double)W;
    if (T <= 1) return s->peak; /* 1 + cos(pi / 1) = 0: the formula has no value there */
    return s->peak * (1.0 + cos(M_PI * (double)(step - W) / (double)T)) / (1.0 + cos(M_PI / (double)T));
}
