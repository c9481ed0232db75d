/* The temperature file STS calibration writes beside a drafter
 * (`<drafter dir>/sts.json`, `dspark calibrate`) and generation reads:
 *   {"format": "dspark-sts", "version": 1,
 *    "definition": "...",            the calibrated confidence, for a reader
 *    "block_size": G,
 *    "temperatures": [s_0, ..., s_{G-1}],   each finite and > 0
 *    ...}                            anything else (how it was fitted) is kept for people
 * Position k's calibrated confidence is sigmoid(z_k / s_k) in fp32
 * (draft/confidence.h ds_conf_prob). */
#ifndef DS_STS_FILE_H
#define DS_STS_FILE_H

#include <stdbool.h>

#include "base/error.h"

#define DS_STS_FILE_NAME "sts.json"
#define DS_STS_FORMAT "dspark-sts"
#define DS_STS_MAX 32

typedef struct {
    int n;                  /* temperatures: the drafter's block size */
    float temp[DS_STS_MAX];
} ds_sts;

/* Reads path into *out; errors name the file and the field at fault. */
ds_error *ds_sts_read(const char *path, ds_sts *out);
/* Writes sts with extra fields (a cJSON object, may be NULL: moved into
 * the file, so the caller no longer owns it) to path. */
struct cJSON;
ds_error *ds_sts_write(const char *path, const ds_sts *sts, struct cJSON *extra);

/* "<dir>/sts.json" into buf (false when it does not fit). */
bool ds_sts_path(const char *dir, char *buf, int size);

#endif
