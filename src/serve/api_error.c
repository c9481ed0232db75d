#include "serve/api_error.h"

#include <stdarg.h>
#include <stdio.h>

static const char *type_of(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    case 500: return "internal_error";
    default: return "invalid_request_error";
    }
}

void ds_api_errorf(ds_api_error *e, int status, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type_of(status);
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}
