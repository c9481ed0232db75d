/* Byte sizes on the command line (size_arg.h). Parsed by hand rather than
 * with strtod, which would take signs, spaces, hex, exponents, "nan" and
 * "inf": a memory budget is digits, an optional fraction, a unit. */
#include "size_arg.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <strings.h>

#include "base/error.h"

/* 1024^k for the unit at u ("", "B", "K", "KB", "Ki", "KiB", ... "TiB"), or 0 when u is no unit. */
static int64_t unit_scale(const char *u) {
    static const char prefixes[] = "KMGT";
    if (!*u) return 1;
    if (!strcasecmp(u, "B")) return 1;
    int64_t scale = 1;
    for (const char *p = prefixes; *p; p++) {
        scale *= 1024;
        if (toupper((unsigned char)u[0]) != *p) continue;
        const char *rest = u + 1;
        return !*rest || !strcasecmp(rest, "B") || !strcasecmp(rest, "i") || !strcasecmp(rest, "iB") ? scale : 0;
    }
    return 0;
}

ds_error *ds_size_arg(const char *option, const char *text, int64_t *out) {
    *out = 0;
    const char *s = text;
    int64_t whole = 0;
    bool digits = false, overflow = false;
    for (; isdigit((unsigned char)*s); s++, digits = true) {
        if (whole > (INT64_MAX - (*s - '0')) / 10) overflow = true;
        else whole = whole * 10 + (*s - '0');
    }
    /* The fraction as a double: exact enough for a budget (1.5 GiB is 1610612736 exactly). */
    double frac = 0, place = 0.1;
    if (*s == '.') {
        for (s++; isdigit((unsigned char)*s); s++, place /= 10, digits = true) frac += (*s - '0') * place;
    }
    const int64_t scale = unit_scale(s);
    if (!digits || !scale)
        return ds_errorf("%s expects a size in bytes, e.g. 512M, 8G, 1.5GiB or 1073741824 (K, M, G, T: powers of "
                         "1024), got '%s'",
                         option, text);
    const int64_t part = (int64_t)(frac * (double)scale); /* < scale <= 2^40: exact in a double */
    if (overflow || whole > INT64_MAX / scale || whole * scale > INT64_MAX - part)
        return ds_errorf("%s: '%s' is more bytes than fit in 63 bits", option, text);
    *out = whole * scale + part;
    return NULL;
}

void ds_size_format(int64_t bytes, char *buf, size_t n) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, n, "%lld B", (long long)bytes);
        return;
    }
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 6) v /= 1024, u++;
    snprintf(buf, n, "%.*f %s", v < 10 ? 2 : v < 100 ? 1 : 0, v, units[u]);
}

void ds_kv_pool_line(const ds_engine_info *info, char *buf, size_t n) {
    char total[32], trow[32], drow[32];
    ds_size_format(info->kv_bytes, total, sizeof total);
    ds_size_format(info->kv_target_row_bytes, trow, sizeof trow);
    ds_size_format(info->kv_drafter_row_bytes, drow, sizeof drow);
    const bool d = info->kv_drafter_row_bytes > 0;
    const int at = snprintf(buf, n, "KV pool: %d pages x %d rows = %lld tokens, %s (target %s%s%s per row)",
                            info->kv_pages, info->kv_page_rows, (long long)info->kv_tokens, total, trow,
                            d ? " + drafter " : "", d ? drow : "");
    if (info->held_bytes > 0 && at > 0 && (size_t)at < n) {
        char held[32];
        ds_size_format(info->held_bytes, held, sizeof held);
        snprintf(buf + at, n - (size_t)at, "; held drafter context %s", held);
    }
}
