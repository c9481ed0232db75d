/* The HTTP side: libmicrohttpd, routing, authentication, limits, and the
 * glue from a request body to a job and from a job to a response.
 *
 * Threading: MHD_USE_THREAD_PER_CONNECTION with an internal polling
 * thread. A connection's thread blocks inside our callbacks while its
 * request runs: the access handler waits for a non-streamed answer, the
 * content reader waits for a streamed one's next text (each on its job's
 * condition variable, waking every 50 ms to see whether the client hung
 * up, so a client that leaves is cancelled within one poll and its KV
 * pages go back at the engine's next turn). Blocking is what this mode is
 * for, so the code reads top to bottom; the cost, a thread per connection,
 * is bounded by the connection limit (--max-connections), and a request
 * never holds more than its body (--max-body) and its own output. The
 * alternative, suspend/resume from the engine thread, would make the
 * engine thread call into MHD and every waiter a state machine. */
#include "serve/serve.h"

#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/error.h"
#include "serve/api_error.h"
#include "serve/chat_page.h"
#include "serve/metrics.h"
#include "serve/openai_json.h"
#include "serve/request.h"
#include "serve/sbuf.h"
#include "serve/sse.h"

#define POLL_MS 50

struct ds_server {
    ds_server_opts o;
    char *model_name;
    char *api_key;
    ds_engine_info info;
    ds_loop *loop;
    struct MHD_Daemon *mhd;
    int port;
    long long started;      /* Unix seconds (/v1/models' created) */
    pthread_mutex_t mu;     /* counters, ids, answering */
    pthread_cond_t answered; /* answering reached 0 */
    ds_http_counts counts;
    uint64_t next_id;
    int answering;          /* requests holding a job whose response is not yet sent */
};

typedef enum { R_NONE, R_COMPLETIONS, R_CHAT, R_MODELS, R_HEALTH, R_METRICS, R_PAGE } route;

/* One connection's request, from its first callback to completion. */
typedef struct {
    route r;
    ds_sbuf body;
    bool too_large;
    ds_job *job;
} conn_ctx;

/* ---- replies -------------------------------------------------------------- */

static void count(ds_server *s, int status) {
    pthread_mutex_lock(&s->mu);
    s->counts.by_status[ds_http_class(status)]++;
    pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result reply(ds_server *s, struct MHD_Connection *c, int status, const char *type,
                             const void *data, size_t len, enum MHD_ResponseMemoryMode mode) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE) free((void *)data);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count(s, status);
    return ok;
}

/* A body built in an sbuf: MHD takes ownership of the bytes. */
static enum MHD_Result reply_buf(ds_server *s, struct MHD_Connection *c, int status, const char *type, ds_sbuf *b) {
    if (b->oom) {
        ds_sbuf_free(b);
        static const char msg[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"internal_error\","
                                  "\"param\":null,\"code\":500}}";
        return reply(s, c, 500, "application/json", msg, sizeof msg - 1, MHD_RESPMEM_PERSISTENT);
    }
    size_t len = b->len;
    char *data = b->data ? b->data : strdup("");
    *b = (ds_sbuf){0};
    return reply(s, c, status, type, data, len, MHD_RESPMEM_MUST_FREE);
}

static enum MHD_Result reply_error(ds_server *s, struct MHD_Connection *c, const ds_api_error *e) {
    ds_sbuf b = {0};
    ds_oai_error(&b, e);
    if (e->status == 405 || e->status == 401) {
        /* Headers these statuses call for: Allow, WWW-Authenticate. */
        struct MHD_Response *r = MHD_create_response_from_buffer(b.len, b.data ? b.data : "", MHD_RESPMEM_MUST_COPY);
        ds_sbuf_free(&b);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        if (e->status == 405) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, e->code ? e->code : "GET");
        else MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
        enum MHD_Result ok = MHD_queue_response(c, (unsigned)e->status, r);
        MHD_destroy_response(r);
        count(s, e->status);
        return ok;
    }
    return reply_buf(s, c, e->status, "application/json", &b);
}

/* ---- routing and checks ---------------------------------------------------- */

static route route_of(const char *url) {
    static const struct {
        const char *path;
        route r;
    } table[] = {{"/v1/completions", R_COMPLETIONS}, {"/v1/chat/completions", R_CHAT}, {"/v1/models", R_MODELS},
                 {"/health", R_HEALTH}, {"/metrics", R_METRICS}, {"/", R_PAGE}, {"/index.html", R_PAGE}};
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (!strcmp(url, table[i].path)) return table[i].r;
    return R_NONE;
}

/* Constant time in the key's length, so the key cannot be found a byte at a time by timing. */
static bool key_ok(const char *want, const char *got) {
    size_t n = strlen(want), m = got ? strlen(got) : 0;
    unsigned char diff = n != m;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(i < m ? got[i] : 0);
    return !diff;
}

static bool authorized(const ds_server *s, struct MHD_Connection *c) {
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    return key_ok(s->api_key, h);
}

/* The first look at a request, before its body: route, method, headers,
 * key, drain, declared size. A refusal here is queued at once (MHD then
 * closes the connection rather than read a body nobody wants). */
static bool precheck(ds_server *s, struct MHD_Connection *c, const char *url, const char *method, conn_ctx *cc,
                     ds_api_error *err) {
    int headers = MHD_get_connection_values(c, MHD_HEADER_KIND, NULL, NULL);
    if (headers > s->o.max_headers) {
        ds_api_errorf(err, 431, NULL, "the request has %d header lines; at most %d are allowed", headers,
                      s->o.max_headers);
        return false;
    }
    cc->r = route_of(url);
    if (cc->r == R_NONE) {
        ds_api_errorf(err, 404, NULL, "no such endpoint: %s %.200s (POST /v1/completions, POST /v1/chat/completions, "
                      "GET /v1/models, /health, /metrics, /)", method, url);
        return false;
    }
    const bool post = cc->r == R_COMPLETIONS || cc->r == R_CHAT;
    const bool get_like = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (post ? strcmp(method, "POST") : !get_like) {
        ds_api_errorf(err, 405, NULL, "%s does not take %s; use %s", url, method, post ? "POST" : "GET");
        err->code = post ? "POST" : "GET, HEAD"; /* the Allow header (reply_error) */
        return false;
    }
    if ((post || cc->r == R_MODELS) && !authorized(s, c)) {
        ds_api_errorf(err, 401, NULL, "missing or wrong API key: send \"Authorization: Bearer KEY\" with the "
                      "server's --api-key");
        return false;
    }
    if (post && ds_loop_draining(s->loop)) {
        ds_api_errorf(err, 503, NULL, "the server is shutting down and takes no new requests");
        return false;
    }
    if (post) {
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (n > s->o.max_body) {
                ds_api_errorf(err, 413, NULL, "the body is %s bytes; at most %zu are allowed (--max-body)", cl,
                              s->o.max_body);
                return false;
            }
        }
    }
    return true;
}

/* ---- GET endpoints --------------------------------------------------------- */

static enum MHD_Result serve_get(ds_server *s, struct MHD_Connection *c, route r) {
    ds_sbuf b = {0};
    switch (r) {
    case R_PAGE:
        return reply(s, c, 200, "text/html; charset=utf-8", ds_chat_page, ds_chat_page_size, MHD_RESPMEM_PERSISTENT);
    case R_MODELS:
        ds_oai_models(&b, s->model_name, s->started, s->o.loop.ctx);
        return reply_buf(s, c, 200, "application/json", &b);
    case R_HEALTH: {
        const bool draining = ds_loop_draining(s->loop);
        ds_sbuf_puts(&b, draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ok\"}");
        return reply_buf(s, c, draining ? 503 : 200, "application/json", &b);
    }
    case R_METRICS: {
        ds_loop_snapshot snap;
        ds_loop_snapshot_get(s->loop, &snap);
        ds_http_counts h;
        pthread_mutex_lock(&s->mu);
        h = s->counts;
        pthread_mutex_unlock(&s->mu);
        ds_metrics_text(&b, s->model_name, &snap, &h, s->info.block_size > 0 ? s->info.block_size : 1);
        return reply_buf(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", &b);
    }
    default: return MHD_NO;
    }
}

/* ---- POST endpoints -------------------------------------------------------- */

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    return ds_sse_read(cls, buf, max);
}

static void sse_free(void *cls) { ds_sse_free(cls); }

/* A non-streamed answer: the text as it is published, until the end. */
static enum MHD_Result answer_whole(ds_server *s, struct MHD_Connection *c, conn_ctx *cc, const char *id) {
    const ds_serve_request *r = ds_job_request(cc->job);
    ds_sbuf text = {0};
    int32_t *ids = NULL;
    size_t n_ids = 0, cap_ids = 0;
    const int fd = conn_fd(c);
    ds_job_update u;
    for (;;) {
        ds_job_take(cc->job, POLL_MS, &u);
        ds_sbuf_append(&text, ds_sbuf_str(&u.text), u.text.len);
        if (r->return_token_ids && u.n_ids) {
            if (n_ids + u.n_ids > cap_ids) {
                size_t cap = (n_ids + u.n_ids) * 2;
                int32_t *p = realloc(ids, cap * sizeof *p);
                if (p) ids = p, cap_ids = cap;
            }
            if (n_ids + u.n_ids <= cap_ids) memcpy(ids + n_ids, u.ids, u.n_ids * sizeof *ids), n_ids += u.n_ids;
        }
        ds_sbuf_free(&u.text);
        free(u.ids);
        if (u.phase == DS_JOB_FINISHED || u.phase == DS_JOB_REJECTED) break;
        if (ds_peer_gone(fd)) { /* nobody to answer: end it now, free its pages */
            ds_job_cancel(cc->job);
            ds_sbuf_free(&text);
            free(ids);
            return MHD_NO;
        }
    }
    enum MHD_Result ok;
    if (u.err.status) {
        ok = reply_error(s, c, &u.err);
    } else {
        ds_sbuf b = {0};
        ds_oai_out o = {.kind = r->kind, .id = id, .created = (long long)time(NULL), .model = s->model_name,
                        .text = ds_sbuf_str(&text), .text_len = text.len,
                        .ids = r->return_token_ids ? (ids ? ids : (int32_t[1]){0}) : NULL, .n_ids = n_ids,
                        .finish_reason = u.finish_reason, .usage = true, .prompt_tokens = u.prompt_tokens,
                        .completion_tokens = u.completion_tokens};
        ds_oai_response(&b, &o);
        if (text.oom) b.oom = true;
        ok = reply_buf(s, c, 200, "application/json", &b);
    }
    ds_sbuf_free(&text);
    free(ids);
    return ok;
}

static enum MHD_Result serve_post(ds_server *s, struct MHD_Connection *c, conn_ctx *cc) {
    ds_api_error err = {0};
    ds_serve_request req;
    if (cc->too_large) {
        ds_api_errorf(&err, 413, NULL, "the body is over %zu bytes (--max-body)", s->o.max_body);
        return reply_error(s, c, &err);
    }
    if (cc->body.oom) {
        ds_api_errorf(&err, 500, NULL, "out of memory while reading the body");
        return reply_error(s, c, &err);
    }
    ds_req_kind kind = cc->r == R_CHAT ? DS_REQ_CHAT : DS_REQ_COMPLETION;
    if (!ds_serve_request_parse(kind, ds_sbuf_str(&cc->body), cc->body.len, &req, &err))
        return reply_error(s, c, &err);
    ds_sbuf_free(&cc->body);
    if (req.model && strcmp(req.model, s->model_name)) {
        ds_api_errorf(&err, 404, "model", "the model '%.200s' does not exist; this server serves '%.200s'",
                      req.model, s->model_name);
        err.code = "model_not_found";
        ds_serve_request_free(&req);
        return reply_error(s, c, &err);
    }
    const bool stream = req.stream;
    if (!(cc->job = ds_loop_post(s->loop, &req, &err))) {
        ds_serve_request_free(&req);
        return reply_error(s, c, &err);
    }
    char id[48];
    pthread_mutex_lock(&s->mu);
    unsigned long long n = ++s->next_id;
    s->answering++; /* until on_completed: the response has gone out (or the client has) */
    pthread_mutex_unlock(&s->mu);
    snprintf(id, sizeof id, "%s-%llx%06llx", kind == DS_REQ_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)s->started,
             n);

    /* The status line waits for the verdict: a prompt the engine refuses
     * is a 400, not a 200 stream that fails. */
    const int fd = conn_fd(c);
    ds_job_phase phase;
    while ((phase = ds_job_wait_admitted(cc->job, POLL_MS)) == DS_JOB_ADMITTING) {
        if (ds_peer_gone(fd)) {
            ds_job_cancel(cc->job);
            return MHD_NO;
        }
    }
    if (phase == DS_JOB_REJECTED) {
        ds_job_update u;
        ds_job_take(cc->job, 0, &u);
        ds_sbuf_free(&u.text);
        free(u.ids);
        return reply_error(s, c, &u.err);
    }
    if (!stream) return answer_whole(s, c, cc, id);

    ds_job_ref(cc->job);
    ds_sse *sse = ds_sse_new(cc->job, id, s->model_name, (long long)time(NULL), fd);
    if (!sse) {
        ds_job_unref(cc->job);
        ds_api_errorf(&err, 500, NULL, "out of memory");
        return reply_error(s, c, &err);
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_reader, sse, sse_free);
    if (!r) {
        ds_sse_free(sse);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    count(s, 200);
    return ok;
}

/* ---- MHD callbacks --------------------------------------------------------- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    (void)version;
    ds_server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        *con_cls = cc;
        ds_api_error err = {0};
        if (!precheck(s, c, url, method, cc, &err)) return reply_error(s, c, &err);
        if (cc->r != R_COMPLETIONS && cc->r != R_CHAT) return serve_get(s, c, cc->r);
        return MHD_YES; /* the body comes in the next calls */
    }
    if (*upload_data_size) {
        /* Past the cap the rest is read and dropped (MHD cannot answer
         * mid-body), so memory stays bounded; the answer is a 413. */
        if (!cc->too_large && cc->body.len + *upload_data_size <= s->o.max_body)
            ds_sbuf_append(&cc->body, upload_data, *upload_data_size);
        else
            cc->too_large = true, ds_sbuf_free(&cc->body);
        *upload_data_size = 0;
        return MHD_YES;
    }
    return serve_post(s, c, cc);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)c, (void)why;
    ds_server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    if (cc->job) {
        /* However the request ended (answered, client gone, shutdown), the
         * job ends with it; a finished job ignores this. */
        ds_job_cancel(cc->job);
        ds_job_unref(cc->job);
        pthread_mutex_lock(&s->mu);
        if (--s->answering == 0) pthread_cond_broadcast(&s->answered);
        pthread_mutex_unlock(&s->mu);
    }
    ds_sbuf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

/* ---- life ------------------------------------------------------------------ */

/* MHD's own messages, prefixed; the ones about a connection we closed on
 * purpose (the client left mid-stream, ds_sse_read said so) are dropped:
 * under load with clients that stop early they would flood the log. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (strstr(msg, "application error generating response")) return;
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    fprintf(stderr, "dspark serve: http: %s\n", msg);
}

ds_error *ds_server_start(ds_engine *e, const ds_server_opts *o, ds_server **out) {
    *out = NULL;
    if (!(o->port >= 0 && o->port <= 65535)) return ds_errorf("--port must be in [0, 65535], got %d", o->port);
    if (!(o->max_connections >= 1)) return ds_errorf("--max-connections must be >= 1, got %d", o->max_connections);
    if (!(o->max_body >= 64)) return ds_errorf("--max-body must be >= 64 bytes, got %zu", o->max_body);
    ds_server *s = calloc(1, sizeof *s);
    if (!s) return ds_errorf("out of memory");
    s->o = *o;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->answered, &ca);
    pthread_condattr_destroy(&ca);
    s->started = (long long)time(NULL);
    s->model_name = strdup(o->model_name ? o->model_name : "dspark");
    s->api_key = o->api_key && *o->api_key ? strdup(o->api_key) : NULL;
    s->o.max_headers = o->max_headers > 0 ? o->max_headers : 64;
    ds_engine_get_info(e, &s->info);
    ds_error *err = s->model_name ? NULL : ds_errorf("out of memory");
    if (!err) err = ds_loop_start(e, &o->loop, &s->loop);

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    if (!err) {
        int rc = getaddrinfo(o->host ? o->host : "127.0.0.1", port, &hints, &ai);
        if (rc) err = ds_errorf("--host %s: %s", o->host ? o->host : "127.0.0.1", gai_strerror(rc));
    }
    if (!err) {
        unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                         MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
        s->mhd = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                                  MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, /* first, or MHD says so */
                                  MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                  MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
                                  /* request line + headers must fit (MHD answers 431 past it) */
                                  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
                                  /* an idle keep-alive connection gives its thread back */
                                  MHD_OPTION_CONNECTION_TIMEOUT, 60u,
                                  MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                  MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
                                  MHD_OPTION_END);
        if (!s->mhd) err = ds_errorf("cannot listen on %s:%d (in use, or not an address of this machine?)",
                                     o->host ? o->host : "127.0.0.1", o->port);
    }
    if (ai) freeaddrinfo(ai);
    if (!err) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
        s->port = di ? di->port : o->port;
    }
    if (err) {
        ds_server_free(s);
        return err;
    }
    *out = s;
    return NULL;
}

int ds_server_port(const ds_server *s) { return s->port; }

bool ds_server_plain_chat(const ds_server *s) { return ds_loop_plain_chat(s->loop); }

/* How long, after every job has ended, the last answers get to reach
 * their clients before the connections are closed (a client that stopped
 * reading must not hold the exit forever). */
#define SEND_GRACE_S 10

void ds_server_shutdown(ds_server *s, double grace_s) {
    if (!s->loop) return;
    ds_loop_begin_drain(s->loop);
    if (ds_loop_wait_idle(s->loop, grace_s) > 0) ds_loop_cancel_all(s->loop);
    /* Every job has ended, but its last text, finish reason and [DONE] may
     * still be on their way out: stopping the daemon now would cut them.
     * Wait for each request's completion (MHD's notice) first. */
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += SEND_GRACE_S;
    pthread_mutex_lock(&s->mu);
    while (s->answering > 0 && pthread_cond_timedwait(&s->answered, &s->mu, &dl) == 0) {
    }
    pthread_mutex_unlock(&s->mu);
    if (s->mhd) MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
}

void ds_server_free(ds_server *s) {
    if (!s) return;
    if (s->mhd) ds_server_shutdown(s, 0);
    ds_loop_free(s->loop);
    pthread_cond_destroy(&s->answered);
    pthread_mutex_destroy(&s->mu);
    free(s->model_name);
    free(s->api_key);
    free(s);
}
