/* One file per subcommand; each returns the process exit code. */
#ifndef DS_COMMANDS_H
#define DS_COMMANDS_H

#include <time.h>

int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Seconds on the monotonic clock, for timing spans (synth and bench). */
static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#endif
