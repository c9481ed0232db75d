/* Seconds on the monotonic clock, for timing spans (the loop's draft and
 * verify times, the benches, the bandwidth probe). */
#ifndef DS_CLOCK_H
#define DS_CLOCK_H

#include <time.h>

static inline double ds_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
