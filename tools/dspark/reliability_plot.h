/* dspark calibrate's reliability diagram: one panel per draft position,
 * the ECE bins' mean predicted prefix acceptance (x) against the observed
 * rate (y) before and after STS, the diagonal where they agree, and each
 * bin's share of the samples as bars. A PNG of the project's own
 * rasterizer (raster.h) and encoder (io/png_write.h). */
#ifndef DS_RELIABILITY_PLOT_H
#define DS_RELIABILITY_PLOT_H

#include "speculate/calibrate.h"

typedef struct {
    int gamma;                     /* panels */
    const ds_cal_metrics *before;  /* [gamma] the head as it is */
    const ds_cal_metrics *after;   /* [gamma] with temp */
    const float *temp;             /* [gamma] the fitted temperatures */
    const char *subtitle;          /* one line under the title (what was evaluated), may be NULL */
} ds_reliability_plot;

ds_error *ds_reliability_plot_write(const char *path, const ds_reliability_plot *p);

#endif
