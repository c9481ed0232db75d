/* Byte sizes on the command line (--kv-mem SIZE): one parser for every
 * command that opens a batched engine (generate, bench --concurrency,
 * serve), and the way they print sizes back (the KV pool's line). */
#ifndef DS_SIZE_ARG_H
#define DS_SIZE_ARG_H

#include <stddef.h>
#include <stdint.h>

#include "dspark.h"

/* Parses text as bytes: a whole number ("1073741824"), or a number with a
 * unit, decimals allowed ("512M", "8G", "1.5GiB"). K, M, G, T are powers
 * of 1024, alone or followed by "B", "i" or "iB" (K = KB = Ki = KiB), any case;
 * no sign, spaces or exponents. A fraction of a byte is truncated;
 * more than INT64_MAX bytes, or anything else, is an error naming option
 * (e.g. "--kv-mem") and the text. */
ds_error *ds_size_arg(const char *option, const char *text, int64_t *out);
/* bytes as "512 B", "1.50 KiB", "8.00 GiB" (3 significant digits or more). */
void ds_size_format(int64_t bytes, char *buf, size_t n);
/* What a batched engine's KV pool holds, as every command reports it:
 * "KV pool: 96 pages x 16 rows = 1536 tokens, 16.5 MiB (target 8.00 KiB +
 * drafter 3.00 KiB per row)" (no drafter: "target 8.00 KiB per row"). */
void ds_kv_pool_line(const ds_engine_info *info, char *buf, size_t n);

#endif
