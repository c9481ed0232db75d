/* Small JSON files the engine both reads and writes (the step-cost cache,
 * simulated acceptance profiles): read whole and parsed, or written whole
 * through a temporary file and a rename, so a reader never sees half a file
 * (two processes profiling at once leave one complete cache). */
#ifndef DS_JSON_FILE_H
#define DS_JSON_FILE_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "base/error.h"

/* Parses path (at most max_bytes) into *out (the caller deletes it). Errors
 * name the file: missing, unreadable, too large, or not JSON (with the
 * line where parsing stopped). */
ds_error *ds_json_file_read(const char *path, size_t max_bytes, cJSON **out);
/* Writes j pretty-printed to path + ".tmp.<pid>", then renames it over path. */
ds_error *ds_json_file_write(const char *path, const cJSON *j);

#endif
