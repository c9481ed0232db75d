/* An error as the OpenAI API reports it: an HTTP status and the body
 * {"error": {"message", "type", "param", "code"}}. Every refusal the server
 * makes is one of these, so a client always learns which field or limit it
 * ran into. Fixed-size: filling one in never allocates. */
#ifndef DS_SERVE_API_ERROR_H
#define DS_SERVE_API_ERROR_H

typedef struct {
    int status;        /* 400, 401, 404, 405, 413, 429, 431, 500, 503 */
    const char *type;  /* "invalid_request_error", ... (a string literal) */
    const char *code;  /* a string literal or NULL (JSON null) */
    char param[96];    /* the field at fault ("messages[2].content"), "" for null */
    char message[512];
} ds_api_error;

/* Fills *e; type follows the status (400-413: invalid_request_error, 401:
 * authentication_error, 404: not_found_error, 429: rate_limit_error, 503:
 * service_unavailable, 500: internal_error). param may be NULL. */
void ds_api_errorf(ds_api_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
