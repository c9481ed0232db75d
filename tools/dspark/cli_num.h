/* A flag's number (--temp 0.7, --seed 42): every command parses and refuses it the same way. */
#ifndef DS_CLI_NUM_H
#define DS_CLI_NUM_H

#include <errno.h>
#include <stdio.h>

/* Inside an option loop over optarg with a `char *end` that CONV sets (strtof(optarg, &end), ...): dst = CONV,
 * or "dspark CMD: WHAT expects a number, got 'ARG'" on stderr and return 2 when optarg is not all number or out
 * of the type's range. */
#define CLI_NUM(cmd, dst, conv, what)                                                                      \
    do {                                                                                                   \
        errno = 0;                                                                                         \
        dst = conv;                                                                                        \
        if (*end || end == optarg || errno) {                                                              \
            fprintf(stderr, "dspark %s: %s expects a number, got '%s'\n", cmd, what, optarg);              \
            return 2;                                                                                      \
        }                                                                                                  \
    } while (0)

#endif
