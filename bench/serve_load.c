/* Load generator for `dspark serve` (issue 40): N concurrent streaming
 * clients on loopback for a fixed time, each looping over the prompts of a
 * prompt file with streaming /v1/completions (or /v1/chat/completions)
 * requests. Plain sockets and pthreads, no HTTP library: what is measured is
 * the server, and a client library's buffering would blur the event times.
 *
 *   serve_load [--url http://HOST:PORT | --host H --port P] [--clients N] [--duration S]
 *              [--max-tokens N] [--temperature T] [--seed S] [--prompts FILE] [--max-prompts N]
 *              [--chat | --ids] [--ignore-eos] [--token-ids] [--api-key KEY] [--timeout S]
 *              [--server-pid PID] [--warmup S] [--check-t0] [--offline FILE] [--cancel-frac F]
 *              [--json OUT] [--row FILE] [--quiet]
 *   serve_load [--prompts FILE] [--max-prompts N] [--chat | --ids] --write-prompts OUT
 *
 * Per request: TTFT is request sent -> the first event carrying content;
 * the speculative engine emits several tokens per event (a verify round's
 * accepted prefix), so the inter-event gaps are reported as they are (ITL per
 * event) next to tokens per event and each request's decode tokens/s
 * ((tokens - first event's tokens) / (last event - first event)).
 * Output tokens are the server's usage.completion_tokens (last event).
 *
 * Outcomes: ok = status 200, every event valid JSON, content, usage and
 * `data: [DONE]` before the connection closed. error = any response that is
 * not that (non-200, malformed SSE, an error event, no [DONE]). lost = a
 * request that got no response at all (connect refused, reset or timeout
 * before a status line). Requests in flight at the deadline run to the end
 * (the drain); none are abandoned, so none are uncounted.
 *
 * --check-t0 (T = 0): the first answer to each prompt is kept; every later
 * answer to it must be byte-identical. --offline FILE: `dspark generate
 * --json` output for the same prompts (one object with "text" per prompt, in
 * the prompt file's order): every answer must equal it.
 * --server-pid PID samples /proc/PID/status (VmRSS, VmHWM) once a second;
 * "flat after warm-up" is reported as the RSS change and the least-squares
 * slope over the samples after --warmup seconds (default: a tenth of the run).
 * --ignore-eos and --token-ids send vLLM's ignore_eos (every answer max_tokens
 * long: fixed work a request, as on random synth weights) and
 * return_token_ids (an event counts as content when it brings ids, even if
 * its text is held back).
 * --cancel-frac F: that fraction of the requests (spread over the prompts)
 * disconnects right after its first content event, as a user pressing stop;
 * they count as cancelled, and the run ends by checking /metrics: nothing
 * running or waiting, the KV pool empty, as many aborts as cancels.
 * Exit status: 0 when every request was ok or cancelled on purpose, every
 * check matched, the server is alive, and /metrics (when served) shows
 * nothing running, waiting or holding KV after the run; 1 otherwise; 2 for
 * bad arguments or no server.
 * --row FILE appends the run as one Markdown table row (bench/serve_load.sh).
 * --write-prompts OUT writes the prompts exactly as they are sent, as a
 * `dspark generate --prompt-file` file ({"prompt"} or {"messages"} lines),
 * and exits: its output is what --offline compares against. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#define MAX_EVENT_BYTES (1 << 20) /* one SSE event larger than this is malformed */
#define MAX_ERROR_KINDS 8

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- growable arrays and buffers ---- */

typedef struct {
    double *v;
    size_t n, cap;
} dvec;

static void dvec_push(dvec *a, double x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 256;
        double *v = realloc(a->v, cap * sizeof *v);
        if (!v) {
            fprintf(stderr, "serve_load: out of memory\n");
            exit(1);
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
}

static void dvec_append(dvec *a, const dvec *b) {
    for (size_t i = 0; i < b->n; i++) dvec_push(a, b->v[i]);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array (NAN when empty). */
static double pct(const dvec *a, double p) {
    if (a->n == 0) return NAN;
    size_t k = (size_t)ceil(p / 100.0 * (double)a->n);
    if (k < 1) k = 1;
    if (k > a->n) k = a->n;
    return a->v[k - 1];
}

typedef struct {
    char *p;
    size_t n, cap;
} buf;

static bool buf_add(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

static void buf_drop_front(buf *b, size_t n) {
    memmove(b->p, b->p + n, b->n - n);
    b->n -= n;
    if (b->p) b->p[b->n] = 0;
}

/* ---- options and shared state ---- */

static struct {
    char host[256];
    int port;
    int clients;
    double duration;
    int max_tokens;
    double temperature;
    long seed;
    bool seed_set;
    const char *prompts_path;
    bool chat;
    bool ids;
    bool token_ids;
    bool ignore_eos;
    long max_prompts;
    double cancel_frac;
    const char *api_key;
    double timeout;
    int server_pid;
    double warmup;
    bool check_t0;
    const char *offline_path;
    const char *json_path;
    const char *row_path;
    const char *write_prompts;
    bool quiet;
} opt;

typedef struct {
    char *json;      /* the prompt as the request's JSON value: a string, or a messages array */
    char *label;     /* "id" of the line, for reports */
    char *first;     /* --check-t0: the first answer seen */
    char *offline;   /* --offline: the expected answer */
    int asked, mismatches;
} prompt;

static prompt *prompts;
static size_t n_prompts;
static char model_name[256];
static struct sockaddr_storage server_addr;
static socklen_t server_addr_len;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_size_t next_prompt;
static double t_start, t_deadline;

typedef struct {
    int id;
    pthread_t thread;
    dvec ttft, itl, tok_per_event, decode_tps, latency;
    long ok, errors, lost, out_tokens, in_tokens, events;
    long t0_checked, t0_mismatch, offline_checked, offline_mismatch, cancelled;
    double last_end;
} client;

/* Distinct error messages (first few), with counts, for the report. */
static struct {
    char what[200];
    long count;
} error_kinds[MAX_ERROR_KINDS];
static long error_kinds_other;

static void note_error(const char *fmt, ...) {
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&mu);
    int i = 0;
    for (; i < MAX_ERROR_KINDS && error_kinds[i].count; i++)
        if (!strcmp(error_kinds[i].what, what)) break;
    if (i == MAX_ERROR_KINDS) {
        error_kinds_other++;
    } else {
        if (!error_kinds[i].count) memcpy(error_kinds[i].what, what, sizeof what);
        error_kinds[i].count++;
    }
    pthread_mutex_unlock(&mu);
}

/* ---- RSS sampling ---- */

typedef struct {
    double t;
    long rss_kb, hwm_kb;
} rss_sample;

static rss_sample *rss;
static size_t n_rss, cap_rss;
static atomic_bool stop_sampler;

/* VmRSS and VmHWM of pid in KiB; false when the process is gone. */
static bool read_rss(int pid, long *rss_kb, long *hwm_kb) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    *rss_kb = *hwm_kb = -1;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmRSS:", 6)) *rss_kb = strtol(line + 6, NULL, 10);
        if (!strncmp(line, "VmHWM:", 6)) *hwm_kb = strtol(line + 6, NULL, 10);
    }
    fclose(f);
    return *rss_kb >= 0;
}

static void *sampler_main(void *arg) {
    (void)arg;
    double next = now_s();
    while (!atomic_load(&stop_sampler)) {
        rss_sample s = {.t = now_s() - t_start};
        if (read_rss(opt.server_pid, &s.rss_kb, &s.hwm_kb)) {
            if (n_rss == cap_rss) {
                cap_rss = cap_rss ? 2 * cap_rss : 1024;
                rss_sample *r = realloc(rss, cap_rss * sizeof *r);
                if (!r) break;
                rss = r;
            }
            rss[n_rss++] = s;
        }
        next += 1.0;
        double d = next - now_s();
        if (d > 0) nanosleep(&(struct timespec){(time_t)d, (long)((d - floor(d)) * 1e9)}, NULL);
    }
    return NULL;
}

/* ---- one HTTP exchange ---- */

static int connect_server(void) {
    int fd = socket(server_addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct timeval tv = {(time_t)opt.timeout, (suseconds_t)((opt.timeout - floor(opt.timeout)) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&server_addr, server_addr_len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Writes the request line, headers and body for method/path into out. */
static bool format_request(buf *out, const char *method, const char *path, const char *body) {
    char head[1024];
    size_t blen = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: dspark-serve_load\r\n"
                     "Accept: text/event-stream, application/json\r\nConnection: close\r\n%s%s%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, opt.host, opt.port, opt.api_key ? "Authorization: Bearer " : "",
                     opt.api_key ? opt.api_key : "", opt.api_key ? "\r\n" : "", blen);
    if (n < 0 || (size_t)n >= sizeof head) return false;
    out->n = 0;
    return buf_add(out, head, (size_t)n) && (!body || buf_add(out, body, blen));
}

/* The body of a response, de-chunked as bytes arrive. */
typedef struct {
    bool chunked;
    long content_length; /* -1: until close */
    long body_seen;
    int state;           /* chunked: 0 size line, 1 data, 2 CRLF after data, 3 done */
    long remaining;
    char line[64];
    size_t line_n;
} body_decoder;

/* Appends the body bytes of raw[0..n) to out; false on a malformed chunk. */
static bool decode_body(body_decoder *d, const char *raw, size_t n, buf *out) {
    if (!d->chunked) {
        d->body_seen += (long)n;
        return buf_add(out, raw, n);
    }
    size_t i = 0;
    while (i < n && d->state != 3) {
        if (d->state == 0 || d->state == 2) {
            char c = raw[i++];
            if (c == '\n') {
                d->line[d->line_n] = 0;
                if (d->state == 2) {
                    if (d->line_n > 1 || (d->line_n == 1 && d->line[0] != '\r')) return false;
                    d->state = 0;
                } else {
                    char *end;
                    long size = strtol(d->line, &end, 16);
                    if (end == d->line || size < 0) return false;
                    d->remaining = size;
                    d->state = size == 0 ? 3 : 1;
                }
                d->line_n = 0;
            } else if (d->line_n + 1 < sizeof d->line) {
                d->line[d->line_n++] = c;
            } else {
                return false;
            }
        } else {
            size_t take = n - i < (size_t)d->remaining ? n - i : (size_t)d->remaining;
            if (!buf_add(out, raw + i, take)) return false;
            i += take;
            d->remaining -= (long)take;
            if (d->remaining == 0) d->state = 2;
        }
    }
    return true;
}

static bool body_complete(const body_decoder *d) {
    if (d->chunked) return d->state == 3;
    return d->content_length >= 0 && d->body_seen >= d->content_length;
}

typedef struct {
    int status;           /* 0: no status line came */
    bool transport_error; /* reset, timeout or malformed framing mid-response */
    buf body;             /* the whole body (non-stream) */
} http_result;

/* Splits off the head once it has arrived; returns the head length or 0. */
static size_t parse_head(const buf *raw, int *status, body_decoder *d) {
    char *end = strstr(raw->p, "\r\n\r\n");
    if (!end) return 0;
    size_t head_len = (size_t)(end - raw->p) + 4;
    if (sscanf(raw->p, "HTTP/1.%*d %d", status) != 1) *status = -1;
    d->chunked = false;
    d->content_length = -1;
    for (char *line = strstr(raw->p, "\r\n"); line && line < end; line = strstr(line + 2, "\r\n")) {
        const char *h = line + 2;
        if (!strncasecmp(h, "Transfer-Encoding:", 18) && strcasestr(h, "chunked") &&
            strcasestr(h, "chunked") < end)
            d->chunked = true;
        if (!strncasecmp(h, "Content-Length:", 15)) d->content_length = strtol(h + 15, NULL, 10);
    }
    return head_len;
}

/* A plain request (GET /v1/models and the like): status and whole body. */
static http_result http_simple(const char *method, const char *path, const char *body) {
    http_result r = {0};
    buf req = {0}, raw = {0};
    int fd = connect_server();
    if (fd < 0 || !format_request(&req, method, path, body) || !send_all(fd, req.p, req.n)) {
        r.transport_error = true;
        goto done;
    }
    body_decoder d = {0};
    size_t head_len = 0;
    char tmp[16384];
    for (;;) {
        ssize_t got = recv(fd, tmp, sizeof tmp, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            if (got < 0 || (head_len && (d.chunked || d.content_length >= 0) && !body_complete(&d)))
                r.transport_error = true;
            break;
        }
        if (!head_len) {
            if (!buf_add(&raw, tmp, (size_t)got)) break;
            head_len = parse_head(&raw, &r.status, &d);
            if (head_len && !decode_body(&d, raw.p + head_len, raw.n - head_len, &r.body)) {
                r.transport_error = true;
                break;
            }
        } else if (!decode_body(&d, tmp, (size_t)got, &r.body)) {
            r.transport_error = true;
            break;
        }
        if (head_len && body_complete(&d)) break;
    }
done:
    if (fd >= 0) close(fd);
    free(req.p);
    free(raw.p);
    return r;
}

/* ---- one streaming request ---- */

typedef struct {
    double t_sent, t_first, t_last;
    long events;           /* events that carried content */
    long tokens;           /* usage.completion_tokens, -1 if none came */
    long prompt_tokens;
    bool done, malformed, error_event, finish_seen;
    buf text;              /* the answer, concatenated */
    client *c;
} stream_state;

/* Handles one SSE event (its lines, \n-separated, \r stripped). */
static void handle_event(stream_state *s, char *ev, double t) {
    buf data = {0};
    for (char *line = ev; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (!strncmp(line, "data:", 5)) {
            const char *v = line + 5;
            if (*v == ' ') v++;
            if (data.n) buf_add(&data, "\n", 1);
            buf_add(&data, v, strlen(v));
        }
        line = nl ? nl + 1 : NULL;
    }
    if (!data.n) { /* a comment or keep-alive: fine */
        free(data.p);
        return;
    }
    if (s->done) {
        s->malformed = true; /* nothing may follow [DONE] */
        note_error("event after [DONE]");
    } else if (!strcmp(data.p, "[DONE]")) {
        s->done = true;
    } else {
        cJSON *j = cJSON_Parse(data.p);
        if (!j) {
            s->malformed = true;
            note_error("malformed SSE data (not JSON)");
        } else if (cJSON_GetObjectItemCaseSensitive(j, "error")) {
            s->error_event = true;
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
            note_error("error event: %s", cJSON_IsString(m) ? m->valuestring : "(no message)");
        } else {
            const cJSON *choices = cJSON_GetObjectItemCaseSensitive(j, "choices");
            const cJSON *ch = cJSON_GetArrayItem(choices, 0);
            const cJSON *content = NULL;
            if (opt.chat)
                content = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch, "delta"), "content");
            else
                content = cJSON_GetObjectItemCaseSensitive(ch, "text");
            /* --token-ids: an event whose ids are all held back as text (half a UTF-8
             * character, a possible stop string) still brought tokens. */
            int n_ids = opt.token_ids ? cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(ch, "token_ids")) : 0;
            if ((cJSON_IsString(content) && content->valuestring[0]) || n_ids > 0) {
                if (s->events == 0) {
                    s->t_first = t;
                } else {
                    dvec_push(&s->c->itl, t - s->t_last);
                }
                s->t_last = t;
                s->events++;
                if (cJSON_IsString(content)) buf_add(&s->text, content->valuestring, strlen(content->valuestring));
            }
            const cJSON *fr = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
            if (cJSON_IsString(fr)) s->finish_seen = true;
            const cJSON *usage = cJSON_GetObjectItemCaseSensitive(j, "usage");
            const cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
            const cJSON *pt = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
            if (cJSON_IsNumber(ct)) s->tokens = (long)ct->valuedouble;
            if (cJSON_IsNumber(pt)) s->prompt_tokens = (long)pt->valuedouble;
            if (!ch && !usage) {
                s->malformed = true;
                note_error("event with neither choices nor usage");
            }
        }
        cJSON_Delete(j);
    }
    free(data.p);
}

/* Parses complete events out of the decoded body; false when one is too big. */
static bool drain_events(stream_state *s, buf *body, double t) {
    for (;;) {
        /* Events end at a blank line; accept \r\n line ends by stripping \r first. */
        size_t w = 0;
        for (size_t i = 0; i < body->n; i++)
            if (body->p[i] != '\r') body->p[w++] = body->p[i];
        body->n = w;
        if (body->p) body->p[w] = 0;
        char *end = body->p ? strstr(body->p, "\n\n") : NULL;
        if (!end) return body->n <= MAX_EVENT_BYTES;
        *end = 0;
        handle_event(s, body->p, t);
        buf_drop_front(body, (size_t)(end - body->p) + 2);
    }
}

static char *request_body(const prompt *p, bool stream) {
    buf b = {0};
    char tmp[512];
    buf_add(&b, "{", 1);
    if (model_name[0]) {
        cJSON *m = cJSON_CreateString(model_name);
        char *ms = cJSON_PrintUnformatted(m);
        snprintf(tmp, sizeof tmp, "\"model\":%s,", ms);
        buf_add(&b, tmp, strlen(tmp));
        free(ms);
        cJSON_Delete(m);
    }
    buf_add(&b, opt.chat ? "\"messages\":" : "\"prompt\":", opt.chat ? 11 : 9);
    buf_add(&b, p->json, strlen(p->json));
    /* stream_options.include_usage: how OpenAI clients ask for the usage chunk. */
    snprintf(tmp, sizeof tmp, ",\"max_tokens\":%d,\"temperature\":%.17g,\"stream\":%s%s", opt.max_tokens,
             opt.temperature, stream ? "true" : "false", stream ? ",\"stream_options\":{\"include_usage\":true}" : "");
    buf_add(&b, tmp, strlen(tmp));
    if (opt.seed_set) {
        snprintf(tmp, sizeof tmp, ",\"seed\":%ld", opt.seed);
        buf_add(&b, tmp, strlen(tmp));
    }
    /* vLLM's extensions, which dspark serve takes too. */
    if (opt.ignore_eos) { const char *e = ",\"ignore_eos\":true"; buf_add(&b, e, strlen(e)); }
    if (opt.token_ids) { const char *e = ",\"return_token_ids\":true"; buf_add(&b, e, strlen(e)); }
    buf_add(&b, "}", 1);
    return b.p;
}

typedef enum { OUT_OK, OUT_ERROR, OUT_LOST, OUT_CANCELLED } outcome;

/* cancel: disconnect right after the first content event (--cancel-frac). */
static outcome stream_request(client *c, size_t pi, bool cancel) {
    prompt *p = &prompts[pi];
    char *body = request_body(p, true);
    buf req = {0}, raw = {0}, dec = {0}, errbody = {0};
    stream_state s = {.tokens = -1, .prompt_tokens = -1, .c = c};
    body_decoder d = {0};
    outcome result = OUT_LOST;
    int status = 0;
    size_t head_len = 0;
    const char *path = opt.chat ? "/v1/chat/completions" : "/v1/completions";
    int fd = connect_server();
    if (fd < 0) {
        note_error("connect: %s", strerror(errno));
        goto done;
    }
    if (!format_request(&req, "POST", path, body)) goto done;
    s.t_sent = now_s();
    if (!send_all(fd, req.p, req.n)) {
        note_error("send: %s", strerror(errno));
        goto done;
    }
    char tmp[16384];
    bool framing_ok = true;
    for (;;) {
        ssize_t got = recv(fd, tmp, sizeof tmp, 0);
        double t = now_s();
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            note_error("recv: %s", errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : strerror(errno));
            framing_ok = false;
            break;
        }
        if (got == 0) break;
        const char *bytes = tmp;
        size_t nb = (size_t)got;
        if (!head_len) {
            buf_add(&raw, tmp, nb);
            head_len = parse_head(&raw, &status, &d);
            if (!head_len) {
                if (raw.n > 65536) {
                    framing_ok = false;
                    note_error("response head over 64 KiB");
                    break;
                }
                continue;
            }
            bytes = raw.p + head_len;
            nb = raw.n - head_len;
        }
        if (!decode_body(&d, bytes, nb, status == 200 ? &dec : &errbody)) {
            framing_ok = false;
            note_error("malformed chunked encoding");
            break;
        }
        if (status == 200 && !drain_events(&s, &dec, t)) {
            s.malformed = true;
            note_error("SSE event over %d bytes", MAX_EVENT_BYTES);
            break;
        }
        if (cancel && s.events > 0 && !s.malformed && !s.error_event) {
            result = OUT_CANCELLED;
            c->cancelled++;
            goto done; /* closing the socket is the cancel */
        }
        if (body_complete(&d) || (status != 200 && errbody.n > 65536)) break;
    }
    if (status == 0) { /* no response at all: lost */
        if (framing_ok) note_error("connection closed before a status line");
        goto done;
    }
    result = OUT_ERROR;
    if (status != 200) {
        cJSON *j = errbody.p ? cJSON_Parse(errbody.p) : NULL;
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
        note_error("HTTP %d: %s", status, cJSON_IsString(m) ? m->valuestring : "(no OpenAI error object)");
        cJSON_Delete(j);
        goto done;
    }
    if (!framing_ok || s.malformed || s.error_event) goto done;
    if (dec.n && strspn(dec.p, "\n") != dec.n) {
        note_error("trailing bytes after the last event");
        goto done;
    }
    if (!s.done) {
        note_error("stream ended without data: [DONE]");
        goto done;
    }
    if (s.tokens < 0) {
        note_error("no usage in the stream");
        goto done;
    }
    if (s.events == 0 && s.tokens > 0) {
        note_error("usage counts tokens but no content event came");
        goto done;
    }
    result = OUT_OK;
    c->ok++;
    c->out_tokens += s.tokens;
    if (s.prompt_tokens > 0) c->in_tokens += s.prompt_tokens;
    c->events += s.events;
    dvec_push(&c->latency, now_s() - s.t_sent);
    if (s.events > 0) {
        dvec_push(&c->ttft, s.t_first - s.t_sent);
        dvec_push(&c->tok_per_event, (double)s.tokens / (double)s.events);
        /* The first event's tokens arrive at TTFT; the rest over the decode span. The
         * first event's share is estimated as the mean tokens per event. */
        if (s.events > 1 && s.t_last > s.t_first) {
            double rest = (double)s.tokens * (double)(s.events - 1) / (double)s.events;
            dvec_push(&c->decode_tps, rest / (s.t_last - s.t_first));
        }
    }
    if (opt.check_t0 || p->offline) {
        const char *text = s.text.p ? s.text.p : "";
        pthread_mutex_lock(&mu);
        p->asked++;
        if (opt.check_t0) {
            if (!p->first) {
                p->first = strdup(text);
            } else {
                c->t0_checked++;
                if (strcmp(p->first, text)) {
                    c->t0_mismatch++;
                    if (p->mismatches++ == 0) {
                        size_t k = 0;
                        while (p->first[k] && p->first[k] == text[k]) k++;
                        fprintf(stderr, "serve_load: T=0 mismatch on prompt %s: answers differ at byte %zu\n",
                                p->label, k);
                    }
                }
            }
        }
        if (p->offline) {
            c->offline_checked++;
            if (strcmp(p->offline, text)) {
                c->offline_mismatch++;
                size_t k = 0;
                while (p->offline[k] && p->offline[k] == text[k]) k++;
                fprintf(stderr, "serve_load: prompt %s differs from the offline answer at byte %zu\n", p->label,
                        k);
            }
        }
        pthread_mutex_unlock(&mu);
    }
done:
    if (result == OUT_ERROR) c->errors++;
    if (result == OUT_LOST) c->lost++;
    if (fd >= 0) close(fd);
    free(body);
    free(req.p);
    free(raw.p);
    free(dec.p);
    free(errbody.p);
    free(s.text.p);
    return result;
}

/* splitmix64: which requests --cancel-frac cancels, spread over the prompts. */
static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void *client_main(void *arg) {
    client *c = arg;
    while (now_s() < t_deadline) {
        size_t k = atomic_fetch_add(&next_prompt, 1);
        bool cancel = opt.cancel_frac > 0 && (double)(mix64(k) >> 11) * 0x1p-53 < opt.cancel_frac;
        stream_request(c, k % n_prompts, cancel);
        c->last_end = now_s();
    }
    return NULL;
}

/* ---- setup ---- */

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "serve_load: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    buf b = {0};
    char tmp[65536];
    size_t got;
    while ((got = fread(tmp, 1, sizeof tmp, f)) > 0)
        if (!buf_add(&b, tmp, got)) die("out of memory reading %s", path);
    fclose(f);
    *len = b.n;
    if (!b.p) b.p = calloc(1, 1);
    return b.p;
}

/* Prompts: a line's "messages" (chat), else its "prompt" or "text" (as a
 * string prompt, or one user message with --chat). "input_ids" are sent
 * only with --ids (as /v1/completions' token-id prompt): by default the
 * server's text path, which is what clients use, is what runs. */
static void load_prompts(const char *path) {
    size_t len;
    char *all = read_file(path, &len);
    if (!all) die("cannot read %s: %s", path, strerror(errno));
    int line_no = 0;
    for (char *line = all; line && *line && !(opt.max_prompts && (long)n_prompts >= opt.max_prompts);) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        line_no++;
        if (strspn(line, " \t\r") != strlen(line)) {
            cJSON *j = cJSON_Parse(line);
            if (!cJSON_IsObject(j)) die("%s:%d: not a JSON object", path, line_no);
            const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "prompt");
            if (!cJSON_IsString(text)) text = cJSON_GetObjectItemCaseSensitive(j, "text");
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "input_ids");
            prompt p = {0};
            if (opt.ids) {
                if (!cJSON_IsArray(ids)) die("%s:%d: --ids: no \"input_ids\" array", path, line_no);
                p.json = cJSON_PrintUnformatted(ids);
            } else if (opt.chat && cJSON_IsArray(msgs)) {
                p.json = cJSON_PrintUnformatted(msgs);
            } else if (cJSON_IsString(text)) {
                if (opt.chat) {
                    cJSON *arr = cJSON_CreateArray(), *m = cJSON_CreateObject();
                    cJSON_AddStringToObject(m, "role", "user");
                    cJSON_AddStringToObject(m, "content", text->valuestring);
                    cJSON_AddItemToArray(arr, m);
                    p.json = cJSON_PrintUnformatted(arr);
                    cJSON_Delete(arr);
                } else {
                    p.json = cJSON_PrintUnformatted(text);
                }
            } else {
                die("%s:%d: no \"prompt\" or \"text\" string%s", path, line_no,
                    opt.chat ? " nor \"messages\" array" : "");
            }
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
            char lbl[64];
            if (cJSON_IsString(id))
                snprintf(lbl, sizeof lbl, "%s", id->valuestring);
            else
                snprintf(lbl, sizeof lbl, "%s:%d", path, line_no);
            p.label = strdup(lbl);
            prompt *np = realloc(prompts, (n_prompts + 1) * sizeof *np);
            if (!np || !p.json || !p.label) die("out of memory");
            prompts = np;
            prompts[n_prompts++] = p;
            cJSON_Delete(j);
        }
        line = nl ? nl + 1 : NULL;
    }
    free(all);
    if (!n_prompts) die("%s: no prompts", path);
}

/* `dspark generate --json` output: the objects with "text", in order. */
static void load_offline(const char *path) {
    size_t len, k = 0;
    char *all = read_file(path, &len);
    if (!all) die("cannot read %s: %s", path, strerror(errno));
    for (char *line = all; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        cJSON *j = cJSON_Parse(line);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
        if (cJSON_IsString(text)) {
            if (k >= n_prompts) die("%s: more answers than the %zu prompts", path, n_prompts);
            prompts[k++].offline = strdup(text->valuestring);
        }
        cJSON_Delete(j);
        line = nl ? nl + 1 : NULL;
    }
    free(all);
    if (k != n_prompts) die("%s: %zu answers for %zu prompts", path, k, n_prompts);
}

static void resolve(void) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    char port[16];
    snprintf(port, sizeof port, "%d", opt.port);
    int rc = getaddrinfo(opt.host, port, &hints, &res);
    if (rc) die("cannot resolve %s: %s", opt.host, gai_strerror(rc));
    memcpy(&server_addr, res->ai_addr, res->ai_addrlen);
    server_addr_len = res->ai_addrlen;
    freeaddrinfo(res);
}

static void parse_url(const char *url) {
    const char *p = url;
    if (!strncmp(p, "http://", 7))
        p += 7;
    else if (strstr(p, "://"))
        die("--url %s: only http:// is supported", url);
    const char *colon = strrchr(p, ':'), *slash = strchr(p, '/');
    if (slash && colon > slash) colon = NULL;
    size_t hl = colon ? (size_t)(colon - p) : slash ? (size_t)(slash - p) : strlen(p);
    if (hl == 0 || hl >= sizeof opt.host) die("--url %s: no host", url);
    memcpy(opt.host, p, hl);
    opt.host[hl] = 0;
    if (opt.host[0] == '[' && opt.host[hl - 1] == ']') { /* [::1] */
        memmove(opt.host, opt.host + 1, hl - 2);
        opt.host[hl - 2] = 0;
    }
    opt.port = colon ? atoi(colon + 1) : 80;
}

/* What /metrics says once the clients are done: every request gone and
 * every KV page back. Cancels reach the engine asynchronously, so this polls
 * for up to 10 s until nothing runs or waits. */
typedef struct {
    bool seen;
    double running, waiting, kv_use, aborted;
} server_state;

static bool metric(const char *text, const char *name, const char *label, double *out) {
    size_t nl = strlen(name);
    for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (strncmp(line, name, nl) || (line[nl] != ' ' && line[nl] != '{')) continue;
        const char *end = strchr(line, '\n');
        if (!end) end = line + strlen(line);
        if (label) {
            const char *l = strstr(line, label);
            if (!l || l > end) continue;
        }
        const char *v = end;
        while (v > line && v[-1] != ' ') v--;
        *out = strtod(v, NULL);
        return true;
    }
    return false;
}

static server_state server_after_run(void) {
    server_state st = {0};
    for (int tries = 0; tries < 20; tries++) {
        http_result r = http_simple("GET", "/metrics", NULL);
        if (r.status == 200 && r.body.p) {
            st.seen = metric(r.body.p, "vllm:num_requests_running", NULL, &st.running) &&
                      metric(r.body.p, "vllm:num_requests_waiting", NULL, &st.waiting);
            metric(r.body.p, "vllm:kv_cache_usage_perc", NULL, &st.kv_use);
            metric(r.body.p, "vllm:request_success_total", "finished_reason=\"abort\"", &st.aborted);
        }
        free(r.body.p);
        if (!st.seen || (st.running == 0 && st.waiting == 0)) break;
        nanosleep(&(struct timespec){0, 500000000}, NULL);
    }
    return st;
}

static void usage(void) {
    fprintf(stderr,
            "usage: serve_load [--url http://HOST:PORT | --host H --port P] [--clients N] [--duration S]\n"
            "                  [--max-tokens N] [--temperature T] [--seed S] [--prompts FILE] [--max-prompts N]\n"
            "                  [--chat | --ids] [--ignore-eos] [--token-ids] [--api-key KEY] [--timeout S]\n"
            "                  [--server-pid PID] [--warmup S] [--check-t0] [--offline FILE] [--cancel-frac F]\n"
            "                  [--json OUT] [--row FILE] [--quiet]\n"
            "       serve_load [--prompts FILE] [--max-prompts N] [--chat | --ids] --write-prompts OUT\n");
    exit(2);
}

static double num_arg(const char *name, const char *v, double lo, double hi) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= lo && x <= hi)) die("%s %s: expected a number in [%g, %g]", name, v, lo, hi);
    return x;
}

static void print_dist(FILE *f, const char *name, dvec *a, double scale, const char *unit) {
    fprintf(f, "  %-22s p50 %9.2f  p90 %9.2f  p99 %9.2f  max %9.2f %s  (n = %zu)\n", name, pct(a, 50) * scale,
            pct(a, 90) * scale, pct(a, 99) * scale, a->n ? a->v[a->n - 1] * scale : NAN, unit, a->n);
}

static cJSON *json_dist(dvec *a, double scale) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "n", (double)a->n);
    if (a->n) {
        double sum = 0;
        for (size_t i = 0; i < a->n; i++) sum += a->v[i];
        cJSON_AddNumberToObject(o, "mean", sum / (double)a->n * scale);
        cJSON_AddNumberToObject(o, "p50", pct(a, 50) * scale);
        cJSON_AddNumberToObject(o, "p90", pct(a, 90) * scale);
        cJSON_AddNumberToObject(o, "p99", pct(a, 99) * scale);
        cJSON_AddNumberToObject(o, "max", a->v[a->n - 1] * scale);
    }
    return o;
}

int main(int argc, char **argv) {
    snprintf(opt.host, sizeof opt.host, "127.0.0.1");
    opt.port = 8080;
    opt.clients = 16;
    opt.duration = 60;
    opt.max_tokens = 64;
    opt.temperature = 0;
    opt.timeout = 300;
    opt.warmup = -1;
    opt.prompts_path = DS_MODELS "/prompts-dev.jsonl";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV() do { if (!v) die("%s needs a value", a); i++; } while (0)
        if (!strcmp(a, "--url")) { NEEDV(); parse_url(v); }
        else if (!strcmp(a, "--host")) { NEEDV(); snprintf(opt.host, sizeof opt.host, "%s", v); }
        else if (!strcmp(a, "--port")) { NEEDV(); opt.port = (int)num_arg(a, v, 1, 65535); }
        else if (!strcmp(a, "--clients")) { NEEDV(); opt.clients = (int)num_arg(a, v, 1, 4096); }
        else if (!strcmp(a, "--duration")) { NEEDV(); opt.duration = num_arg(a, v, 0.1, 1e6); }
        else if (!strcmp(a, "--max-tokens")) { NEEDV(); opt.max_tokens = (int)num_arg(a, v, 1, 1e6); }
        else if (!strcmp(a, "--temperature")) { NEEDV(); opt.temperature = num_arg(a, v, 0, 100); }
        else if (!strcmp(a, "--seed")) { NEEDV(); opt.seed = (long)num_arg(a, v, 0, 9e15); opt.seed_set = true; }
        else if (!strcmp(a, "--prompts")) { NEEDV(); opt.prompts_path = v; }
        else if (!strcmp(a, "--chat")) opt.chat = true;
        else if (!strcmp(a, "--ids")) opt.ids = true;
        else if (!strcmp(a, "--token-ids")) opt.token_ids = true;
        else if (!strcmp(a, "--max-prompts")) { NEEDV(); opt.max_prompts = (long)num_arg(a, v, 1, 1e9); }
        else if (!strcmp(a, "--ignore-eos")) opt.ignore_eos = true;
        else if (!strcmp(a, "--cancel-frac")) { NEEDV(); opt.cancel_frac = num_arg(a, v, 0, 1); }
        else if (!strcmp(a, "--api-key")) { NEEDV(); opt.api_key = v; }
        else if (!strcmp(a, "--timeout")) { NEEDV(); opt.timeout = num_arg(a, v, 0.1, 1e6); }
        else if (!strcmp(a, "--server-pid")) { NEEDV(); opt.server_pid = (int)num_arg(a, v, 1, 1e9); }
        else if (!strcmp(a, "--warmup")) { NEEDV(); opt.warmup = num_arg(a, v, 0, 1e6); }
        else if (!strcmp(a, "--check-t0")) opt.check_t0 = true;
        else if (!strcmp(a, "--offline")) { NEEDV(); opt.offline_path = v; }
        else if (!strcmp(a, "--json")) { NEEDV(); opt.json_path = v; }
        else if (!strcmp(a, "--row")) { NEEDV(); opt.row_path = v; }
        else if (!strcmp(a, "--write-prompts")) { NEEDV(); opt.write_prompts = v; }
        else if (!strcmp(a, "--quiet")) opt.quiet = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) usage();
        else die("unknown option %s (--help lists them)", a);
#undef NEEDV
    }
    if (opt.ids && opt.chat) die("--ids is for /v1/completions (token ids as the prompt), not --chat");
    if (opt.check_t0 && opt.temperature != 0) die("--check-t0 needs --temperature 0");
    if (opt.offline_path && opt.temperature != 0) die("--offline needs --temperature 0");
    if (opt.warmup < 0) opt.warmup = opt.duration / 10;
    signal(SIGPIPE, SIG_IGN);
    load_prompts(opt.prompts_path);
    if (opt.write_prompts) {
        FILE *f = fopen(opt.write_prompts, "w");
        if (!f) die("cannot write %s: %s", opt.write_prompts, strerror(errno));
        for (size_t i = 0; i < n_prompts; i++) fprintf(f, "{\"%s\": %s}\n", opt.chat ? "messages" : opt.ids ? "input_ids" : "prompt", prompts[i].json);
        if (fclose(f) != 0) die("cannot write %s", opt.write_prompts);
        return 0;
    }
    if (opt.offline_path) load_offline(opt.offline_path);
    resolve();

    /* The model's name from /v1/models, as a real client would send it. */
    http_result m = http_simple("GET", "/v1/models", NULL);
    if (m.status == 0) die("no answer from http://%s:%d (is `dspark serve` running?)", opt.host, opt.port);
    if (m.status == 200 && m.body.p) {
        cJSON *j = cJSON_Parse(m.body.p);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "data"), 0), "id");
        if (cJSON_IsString(id)) snprintf(model_name, sizeof model_name, "%s", id->valuestring);
        cJSON_Delete(j);
    }
    free(m.body.p);
    if (!opt.quiet)
        fprintf(stderr, "serve_load: %d clients, %.0f s, http://%s:%d%s, model %s, %zu prompts, max_tokens %d, T %g\n",
                opt.clients, opt.duration, opt.host, opt.port, opt.chat ? "/v1/chat/completions" : "/v1/completions",
                model_name[0] ? model_name : "(none)", n_prompts, opt.max_tokens, opt.temperature);

    client *cl = calloc((size_t)opt.clients, sizeof *cl);
    if (!cl) die("out of memory");
    long hwm_before = -1, rss_before = -1;
    if (opt.server_pid && !read_rss(opt.server_pid, &rss_before, &hwm_before))
        die("--server-pid %d: cannot read /proc/%d/status", opt.server_pid, opt.server_pid);
    t_start = now_s();
    t_deadline = t_start + opt.duration;
    pthread_t sampler;
    if (opt.server_pid && pthread_create(&sampler, NULL, sampler_main, NULL)) die("cannot start the RSS sampler");
    for (int i = 0; i < opt.clients; i++) {
        cl[i].id = i;
        if (pthread_create(&cl[i].thread, NULL, client_main, &cl[i])) die("cannot start client %d", i);
    }
    for (int i = 0; i < opt.clients; i++) pthread_join(cl[i].thread, NULL);
    double t_end = now_s();
    if (opt.server_pid) {
        atomic_store(&stop_sampler, true);
        pthread_join(sampler, NULL);
    }
    long hwm_after = -1, rss_after = -1;
    bool server_alive = !opt.server_pid || read_rss(opt.server_pid, &rss_after, &hwm_after);

    /* Pool the clients. */
    client all = {0};
    for (int i = 0; i < opt.clients; i++) {
        client *c = &cl[i];
        all.ok += c->ok;
        all.errors += c->errors;
        all.lost += c->lost;
        all.out_tokens += c->out_tokens;
        all.in_tokens += c->in_tokens;
        all.events += c->events;
        all.t0_checked += c->t0_checked;
        all.t0_mismatch += c->t0_mismatch;
        all.offline_checked += c->offline_checked;
        all.offline_mismatch += c->offline_mismatch;
        all.cancelled += c->cancelled;
        dvec_append(&all.ttft, &c->ttft);
        dvec_append(&all.itl, &c->itl);
        dvec_append(&all.tok_per_event, &c->tok_per_event);
        dvec_append(&all.decode_tps, &c->decode_tps);
        dvec_append(&all.latency, &c->latency);
    }
    dvec *dists[] = {&all.ttft, &all.itl, &all.tok_per_event, &all.decode_tps, &all.latency};
    for (size_t i = 0; i < sizeof dists / sizeof *dists; i++) qsort(dists[i]->v, dists[i]->n, sizeof(double), cmp_double);
    double elapsed = t_end - t_start;
    long requests = all.ok + all.errors + all.lost + all.cancelled;
    server_state after = server_after_run();

    /* RSS after warm-up: change and least-squares slope. */
    long rss_peak = 0, rss_warm = -1, rss_last = -1, rss_min_after = -1, rss_max_after = -1;
    double slope = NAN;
    {
        double sx = 0, sy = 0, sxx = 0, sxy = 0;
        size_t n = 0;
        for (size_t i = 0; i < n_rss; i++) {
            if (rss[i].rss_kb > rss_peak) rss_peak = rss[i].rss_kb;
            if (rss[i].t < opt.warmup) continue;
            if (rss_warm < 0) rss_warm = rss[i].rss_kb;
            rss_last = rss[i].rss_kb;
            if (rss_min_after < 0 || rss[i].rss_kb < rss_min_after) rss_min_after = rss[i].rss_kb;
            if (rss[i].rss_kb > rss_max_after) rss_max_after = rss[i].rss_kb;
            double x = rss[i].t / 60.0, y = (double)rss[i].rss_kb / 1024.0;
            sx += x, sy += y, sxx += x * x, sxy += x * y;
            n++;
        }
        if (n >= 2 && n * sxx - sx * sx > 0) slope = ((double)n * sxy - sx * sy) / ((double)n * sxx - sx * sx);
    }
    long hwm = hwm_after > hwm_before ? hwm_after : hwm_before;
    if (n_rss && rss[n_rss - 1].hwm_kb > hwm) hwm = rss[n_rss - 1].hwm_kb;

    printf("serve_load: %d clients, %.1f s (%.1f s with the drain), %s\n", opt.clients, opt.duration, elapsed,
           opt.chat ? "chat" : "completions");
    printf("  requests %ld: ok %ld, errors %ld, lost %ld, cancelled by the client %ld\n", requests, all.ok,
           all.errors, all.lost, all.cancelled);
    printf("  requests/s %.3f   output tokens/s %.1f   (%ld output tokens, %ld prompt tokens, %.2f tokens/event)\n",
           (double)all.ok / elapsed, (double)all.out_tokens / elapsed, all.out_tokens, all.in_tokens,
           all.events ? (double)all.out_tokens / (double)all.events : 0.0);
    print_dist(stdout, "TTFT", &all.ttft, 1e3, "ms");
    print_dist(stdout, "ITL (per event)", &all.itl, 1e3, "ms");
    print_dist(stdout, "tokens per event", &all.tok_per_event, 1, "");
    print_dist(stdout, "decode tokens/s a req", &all.decode_tps, 1, "");
    print_dist(stdout, "request latency", &all.latency, 1, "s");
    if (opt.check_t0)
        printf("  T=0 repeats checked %ld: mismatches %ld\n", all.t0_checked, all.t0_mismatch);
    if (opt.offline_path)
        printf("  offline answers checked %ld: mismatches %ld\n", all.offline_checked, all.offline_mismatch);
    /* Once every client is done nothing may run, wait or hold KV pages: a leak otherwise. */
    bool leaked = after.seen && (after.running != 0 || after.waiting != 0 || after.kv_use != 0);
    if (after.seen)
        printf("  server after the run (/metrics): running %.0f, waiting %.0f, KV use %.4f, aborted requests %.0f%s\n",
               after.running, after.waiting, after.kv_use, after.aborted, leaked ? "  LEFT OVER" : "");
    if (opt.server_pid) {
        printf("  server RSS: peak (VmHWM) %.1f MiB; after %.0f s warm-up %.1f -> %.1f MiB (min %.1f, max %.1f), "
               "slope %+.3f MiB/min; %zu samples%s\n",
               hwm / 1024.0, opt.warmup, rss_warm / 1024.0, rss_last / 1024.0, rss_min_after / 1024.0,
               rss_max_after / 1024.0, slope, n_rss, server_alive ? "" : "; THE SERVER EXITED");
    }
    for (int i = 0; i < MAX_ERROR_KINDS && error_kinds[i].count; i++)
        printf("  error x%ld: %s\n", error_kinds[i].count, error_kinds[i].what);
    if (error_kinds_other) printf("  other errors: %ld\n", error_kinds_other);

    if (opt.row_path) {
        FILE *f = fopen(opt.row_path, "a");
        char rss_col[64] = "-";
        if (opt.server_pid) snprintf(rss_col, sizeof rss_col, "%.0f", hwm / 1024.0);
        if (!f || fprintf(f, "| %d | %.0f | %ld | %.2f | %.1f | %.0f | %.0f | %.0f | %.0f | %.2f | %.1f | %ld | %ld | %s |\n",
                          opt.clients, opt.duration, requests, (double)all.ok / elapsed,
                          (double)all.out_tokens / elapsed, pct(&all.ttft, 50) * 1e3, pct(&all.ttft, 99) * 1e3,
                          pct(&all.itl, 50) * 1e3, pct(&all.itl, 99) * 1e3,
                          all.events ? (double)all.out_tokens / (double)all.events : 0.0, pct(&all.decode_tps, 50),
                          all.errors, all.lost, rss_col) < 0 || fclose(f) != 0)
            die("cannot write %s", opt.row_path);
    }

    if (opt.json_path) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "url", opt.host);
        cJSON_AddNumberToObject(o, "port", opt.port);
        cJSON_AddStringToObject(o, "endpoint", opt.chat ? "/v1/chat/completions" : "/v1/completions");
        cJSON_AddStringToObject(o, "model", model_name);
        cJSON_AddNumberToObject(o, "clients", opt.clients);
        cJSON_AddNumberToObject(o, "duration_s", opt.duration);
        cJSON_AddNumberToObject(o, "elapsed_s", elapsed);
        cJSON_AddNumberToObject(o, "max_tokens", opt.max_tokens);
        cJSON_AddNumberToObject(o, "temperature", opt.temperature);
        cJSON_AddNumberToObject(o, "requests", (double)requests);
        cJSON_AddNumberToObject(o, "ok", (double)all.ok);
        cJSON_AddNumberToObject(o, "errors", (double)all.errors);
        cJSON_AddNumberToObject(o, "lost", (double)all.lost);
        cJSON_AddNumberToObject(o, "cancelled", (double)all.cancelled);
        cJSON_AddNumberToObject(o, "cancel_frac", opt.cancel_frac);
        if (after.seen) {
            cJSON *a = cJSON_AddObjectToObject(o, "server_after_run");
            cJSON_AddNumberToObject(a, "num_requests_running", after.running);
            cJSON_AddNumberToObject(a, "num_requests_waiting", after.waiting);
            cJSON_AddNumberToObject(a, "kv_cache_usage_perc", after.kv_use);
            cJSON_AddNumberToObject(a, "request_success_abort", after.aborted);
        }
        cJSON_AddNumberToObject(o, "requests_per_s", (double)all.ok / elapsed);
        cJSON_AddNumberToObject(o, "output_tokens", (double)all.out_tokens);
        cJSON_AddNumberToObject(o, "prompt_tokens", (double)all.in_tokens);
        cJSON_AddNumberToObject(o, "output_tokens_per_s", (double)all.out_tokens / elapsed);
        cJSON_AddNumberToObject(o, "tokens_per_event", all.events ? (double)all.out_tokens / (double)all.events : 0);
        cJSON_AddItemToObject(o, "ttft_ms", json_dist(&all.ttft, 1e3));
        cJSON_AddItemToObject(o, "itl_event_ms", json_dist(&all.itl, 1e3));
        cJSON_AddItemToObject(o, "tokens_per_event_dist", json_dist(&all.tok_per_event, 1));
        cJSON_AddItemToObject(o, "decode_tokens_per_s_request", json_dist(&all.decode_tps, 1));
        cJSON_AddItemToObject(o, "latency_s", json_dist(&all.latency, 1));
        if (opt.check_t0) {
            cJSON_AddNumberToObject(o, "t0_checked", (double)all.t0_checked);
            cJSON_AddNumberToObject(o, "t0_mismatches", (double)all.t0_mismatch);
        }
        if (opt.offline_path) {
            cJSON_AddNumberToObject(o, "offline_checked", (double)all.offline_checked);
            cJSON_AddNumberToObject(o, "offline_mismatches", (double)all.offline_mismatch);
        }
        if (opt.server_pid) {
            cJSON *r = cJSON_AddObjectToObject(o, "server_rss");
            cJSON_AddNumberToObject(r, "pid", opt.server_pid);
            cJSON_AddBoolToObject(r, "alive_at_end", server_alive);
            cJSON_AddNumberToObject(r, "peak_hwm_mib", hwm / 1024.0);
            cJSON_AddNumberToObject(r, "peak_sampled_mib", rss_peak / 1024.0);
            cJSON_AddNumberToObject(r, "warmup_s", opt.warmup);
            cJSON_AddNumberToObject(r, "after_warmup_first_mib", rss_warm / 1024.0);
            cJSON_AddNumberToObject(r, "after_warmup_last_mib", rss_last / 1024.0);
            cJSON_AddNumberToObject(r, "after_warmup_min_mib", rss_min_after / 1024.0);
            cJSON_AddNumberToObject(r, "after_warmup_max_mib", rss_max_after / 1024.0);
            if (!isnan(slope)) cJSON_AddNumberToObject(r, "after_warmup_slope_mib_per_min", slope);
            cJSON *series = cJSON_AddArrayToObject(r, "samples");
            for (size_t i = 0; i < n_rss; i++) {
                cJSON *pt = cJSON_CreateArray();
                cJSON_AddItemToArray(pt, cJSON_CreateNumber(round(rss[i].t * 10) / 10));
                cJSON_AddItemToArray(pt, cJSON_CreateNumber((double)rss[i].rss_kb));
                cJSON_AddItemToArray(series, pt);
            }
        }
        cJSON *errs = cJSON_AddArrayToObject(o, "error_kinds");
        for (int i = 0; i < MAX_ERROR_KINDS && error_kinds[i].count; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "what", error_kinds[i].what);
            cJSON_AddNumberToObject(e, "count", (double)error_kinds[i].count);
            cJSON_AddItemToArray(errs, e);
        }
        char *s = cJSON_Print(o);
        FILE *f = fopen(opt.json_path, "w");
        if (!f || fprintf(f, "%s\n", s) < 0 || fclose(f) != 0) die("cannot write %s", opt.json_path);
        free(s);
        cJSON_Delete(o);
    }

    for (int i = 0; i < opt.clients; i++) {
        client *c = &cl[i];
        free(c->ttft.v), free(c->itl.v), free(c->tok_per_event.v), free(c->decode_tps.v), free(c->latency.v);
    }
    free(all.ttft.v), free(all.itl.v), free(all.tok_per_event.v), free(all.decode_tps.v), free(all.latency.v);
    for (size_t i = 0; i < n_prompts; i++) {
        free(prompts[i].json), free(prompts[i].label), free(prompts[i].first), free(prompts[i].offline);
    }
    free(prompts);
    free(rss);
    free(cl);
    bool bad = all.errors || all.lost || all.t0_mismatch || all.offline_mismatch || !server_alive || all.ok == 0 ||
               leaked;
    return bad ? 1 : 0;
}
