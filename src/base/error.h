/* Errors are values: a fallible call returns NULL on success or a heap
 * ds_error whose message names the file, tensor, field or request at fault.
 * Callers add context on the way up with ds_error_wrap(). */
#ifndef DS_ERROR_H
#define DS_ERROR_H

#include "dspark.h"

ds_error *ds_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prefixes "<context>: " to e's message and returns e (NULL stays NULL). */
ds_error *ds_error_wrap(ds_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Propagate an error: DS_TRY(call) returns the error from the enclosing function. */
#define DS_TRY(call)                      \
    do {                                  \
        ds_error *ds_try_e_ = (call);     \
        if (ds_try_e_) return ds_try_e_;  \
    } while (0)

#endif
