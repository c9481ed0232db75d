/* Typed reads of config.json fields; a missing or mistyped field is an
 * error that names the field and the directory. */
#ifndef DS_CONFIG_H
#define DS_CONFIG_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

ds_error *ds_cfg_int(const cJSON *cfg, const char *where, const char *field, int64_t *out);
ds_error *ds_cfg_float(const cJSON *cfg, const char *where, const char *field, double *out);
/* Optional fields: return def when absent or null; still an error when mistyped. */
ds_error *ds_cfg_int_or(const cJSON *cfg, const char *where, const char *field, int64_t def, int64_t *out);
ds_error *ds_cfg_float_or(const cJSON *cfg, const char *where, const char *field, double def, double *out);
ds_error *ds_cfg_bool_or(const cJSON *cfg, const char *where, const char *field, bool def, bool *out);
/* Integer list (a scalar counts as a list of one). *out is malloc'd; absent -> n = 0. */
ds_error *ds_cfg_int_list(const cJSON *cfg, const char *where, const char *field, int64_t **out, int *n);
/* Refuses size fields (num_hidden_layers, vocab_size, max_position_embeddings,
 * ...), here or in a nested object, beyond what any model could have: run on
 * every config.json before anything is sized from it. */
ds_error *ds_cfg_check_sizes(const cJSON *cfg, const char *where);
/* String or NULL when absent. */
const char *ds_cfg_str(const cJSON *cfg, const char *field);

#endif
