/* dspark serve end to end (issue 40): the CLI at DS_CLI started on an
 * ephemeral port with the bundled pico pair, driven by a small HTTP client
 * over sockets (HTTP/1.1, chunked bodies decoded), so CI needs nothing new.
 *
 * - every endpoint (completions, chat, streamed and not, models, health,
 *   metrics, the chat page) and every error (400 malformed / bad field
 *   named, n > 1, 401, 404 path and model, 405, 413 declared and chunked,
 *   429, 431, 503 while draining);
 * - T = 0 answers token-identical to `dspark generate` for the same
 *   prompt, streamed and not, alone and among concurrent requests; a
 *   seeded T = 0.8 top-k top-p answer identical to generate's too;
 * - stop strings never leak, across token boundaries, streamed or not;
 * - a client that disconnects mid-stream frees its request at once
 *   (/metrics: nothing running, KV pool empty);
 * - SIGTERM: the request in flight completes, new ones get 503, exit 0;
 *   past the grace period it is cancelled (finish_reason "abort").
 * Also unit checks of the parts (request parsing, stop strings, JSON
 * escaping). DS_TEST_QUICK (the sanitizer build) runs fewer prompts. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "serve/openai_json.h"
#include "serve/request.h"
#include "serve/stream.h"
#include "testlib.h"

static bool quick;

/* ---- a server process -------------------------------------------------------- */

typedef struct {
    pid_t pid;
    int port;
    char log[64]; /* its standard error */
} server;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Starts `dspark serve --port 0 ARGS...` and reads the port it prints. */
static bool server_start(server *s, const char *const *args) {
    snprintf(s->log, sizeof s->log, "/tmp/test_serve_%d_XXXXXX", (int)getpid());
    int fd = mkstemp(s->log);
    if (fd < 0) return false;
    const char *argv[40] = {DS_CLI, "serve", "--port", "0", "--threads", "2"};
    int n = 6;
    for (int i = 0; args && args[i] && n < 38; i++) argv[n++] = args[i];
    argv[n] = NULL;
    s->pid = fork();
    if (s->pid == 0) {
        dup2(fd, 2);
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0), dup2(null, 1);
        execv(DS_CLI, (char *const *)argv);
        _exit(127);
    }
    close(fd);
    s->port = 0;
    for (double t0 = now_s(); now_s() - t0 < 120 && !s->port;) {
        usleep(20000);
        char *text = read_text_file(s->log, NULL);
        const char *p = text ? strstr(text, "listening on http://") : NULL;
        if (p && (p = strchr(p + 20, ':'))) s->port = atoi(p + 1);
        free(text);
        int st;
        if (!s->port && waitpid(s->pid, &st, WNOHANG) == s->pid) break;
    }
    if (!s->port) {
        char *text = read_text_file(s->log, NULL);
        fprintf(stderr, "dspark serve did not start:\n%s\n", text ? text : "");
        free(text);
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
        unlink(s->log);
    }
    return s->port != 0;
}

/* SIGTERM, then the exit status (-1: did not exit within 60 s). */
static int server_stop(server *s) {
    kill(s->pid, SIGTERM);
    int st = 0;
    for (double t0 = now_s(); now_s() - t0 < 60;) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            unlink(s->log);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(20000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    unlink(s->log);
    return -1;
}

/* ---- a small HTTP/1.1 client ---------------------------------------------------- */

typedef struct {
    int status;
    char *head;  /* status line and headers */
    char *body;  /* de-chunked, NUL-terminated */
    size_t len;
} response;

static void response_free(response *r) {
    free(r->head);
    free(r->body);
    *r = (response){0};
}

static int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return false;
        p += k, n -= (size_t)k;
    }
    return true;
}

/* Sends a request; extra: more header lines, each ending "\r\n". */
static int send_request(int port, const char *method, const char *path, const char *extra, const char *body) {
    int fd = dial(port);
    if (fd < 0) return -1;
    char head[8192];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s", method, path,
                     extra ? extra : "");
    if (body) n += snprintf(head + n, sizeof head - n, "Content-Type: application/json\r\nContent-Length: %zu\r\n",
                            strlen(body));
    n += snprintf(head + n, sizeof head - n, "\r\n");
    if (!send_all(fd, head, (size_t)n) || (body && !send_all(fd, body, strlen(body)))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Reads to EOF and splits status, headers, body (chunked decoded). */
static bool read_response(int fd, response *r) {
    *r = (response){0};
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    ssize_t k;
    while ((k = recv(fd, buf + len, cap - len - 1, 0)) > 0) {
        len += (size_t)k;
        if (cap - len < 1024) buf = realloc(buf, cap *= 2);
    }
    close(fd);
    buf[len] = 0;
    char *end = strstr(buf, "\r\n\r\n");
    if (!end || sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) {
        free(buf);
        return false;
    }
    *end = 0;
    r->head = strdup(buf);
    const char *p = end + 4;
    size_t rest = len - (size_t)(p - buf);
    r->body = malloc(rest + 1);
    if (strcasestr(r->head, "transfer-encoding: chunked")) {
        size_t out = 0;
        for (;;) {
            char *e;
            unsigned long n = strtoul(p, &e, 16);
            if (e == p || !(e = strstr(e, "\r\n"))) break;
            p = e + 2;
            if (!n || (size_t)(p - buf) + n > len) break;
            memcpy(r->body + out, p, n);
            out += n;
            p += n + 2;
        }
        r->len = out;
    } else {
        memcpy(r->body, p, rest);
        r->len = rest;
    }
    r->body[r->len] = 0;
    free(buf);
    return true;
}

static bool http(int port, const char *method, const char *path, const char *extra, const char *body, response *r) {
    int fd = send_request(port, method, path, extra, body);
    if (fd < 0) {
        *r = (response){0};
        return false;
    }
    return read_response(fd, r);
}

/* The error object's param ("" when null) and message, checked together. */
static void check_error(const response *r, int status, const char *param, const char *needle, const char *what) {
    CHECK(r->status == status, "%s: status %d, want %d (%s)", what, r->status, status, r->body ? r->body : "");
    cJSON *j = cJSON_Parse(r->body ? r->body : "");
    const cJSON *e = j ? cJSON_GetObjectItem(j, "error") : NULL;
    CHECK(e && cJSON_IsString(cJSON_GetObjectItem(e, "message")) && cJSON_GetObjectItem(e, "type"),
          "%s: not an OpenAI error object: %s", what, r->body ? r->body : "");
    if (e && param) {
        const cJSON *p = cJSON_GetObjectItem(e, "param");
        const char *got = cJSON_IsString(p) ? p->valuestring : "";
        CHECK(!strcmp(got, param), "%s: param '%s', want '%s' (%s)", what, got, param, r->body);
    }
    if (e && needle) {
        const cJSON *m = cJSON_GetObjectItem(e, "message");
        CHECK(cJSON_IsString(m) && strstr(m->valuestring, needle), "%s: message lacks '%s': %s", what, needle, r->body);
    }
    cJSON_Delete(j);
}

/* ---- answers ---------------------------------------------------------------------- */

typedef struct {
    char *text;
    int ids[1024];
    int n_ids;
    char finish[16];
    int prompt_tokens, completion_tokens;
    int events;        /* streamed: data events before [DONE] */
    bool done;         /* streamed: ended with data: [DONE] */
    bool leaked;       /* a chunk's text held `leak` */
} answer;

static void answer_free(answer *a) { free(a->text); }

static void take_ids(answer *a, const cJSON *arr) {
    const cJSON *t;
    cJSON_ArrayForEach(t, arr) if (a->n_ids < 1024) a->ids[a->n_ids++] = t->valueint;
}

static void take_usage(answer *a, const cJSON *u) {
    if (!u) return;
    a->prompt_tokens = cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
    a->completion_tokens = cJSON_GetObjectItem(u, "completion_tokens")->valueint;
}

/* A whole response's body. */
static bool parse_whole(const char *body, bool chat, answer *a) {
    *a = (answer){0};
    cJSON *j = cJSON_Parse(body);
    const cJSON *c = j ? cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0) : NULL;
    if (!c) {
        cJSON_Delete(j);
        return false;
    }
    const cJSON *t = chat ? cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content")
                          : cJSON_GetObjectItem(c, "text");
    a->text = strdup(cJSON_IsString(t) ? t->valuestring : "");
    take_ids(a, cJSON_GetObjectItem(c, "token_ids"));
    const cJSON *f = cJSON_GetObjectItem(c, "finish_reason");
    snprintf(a->finish, sizeof a->finish, "%s", cJSON_IsString(f) ? f->valuestring : "null");
    take_usage(a, cJSON_GetObjectItem(j, "usage"));
    cJSON_Delete(j);
    return true;
}

/* An SSE body: every event's text concatenated. */
static bool parse_stream(const char *body, bool chat, const char *leak, answer *a) {
    *a = (answer){0};
    size_t cap = strlen(body) + 1, len = 0;
    a->text = calloc(cap, 1);
    for (const char *p = body; (p = strstr(p, "data: "));) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) return false;
        if (!strncmp(p, "[DONE]", 6)) {
            a->done = !strstr(e, "data: "); /* nothing after it */
            break;
        }
        a->events++;
        cJSON *j = cJSON_ParseWithLength(p, (size_t)(e - p));
        if (!j) return false;
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        if (c) {
            const cJSON *t = chat ? cJSON_GetObjectItem(cJSON_GetObjectItem(c, "delta"), "content")
                                  : cJSON_GetObjectItem(c, "text");
            if (cJSON_IsString(t)) {
                size_t n = strlen(t->valuestring);
                memcpy(a->text + len, t->valuestring, n);
                len += n;
                if (leak && strstr(t->valuestring, leak)) a->leaked = true;
            }
            take_ids(a, cJSON_GetObjectItem(c, "token_ids"));
            const cJSON *f = cJSON_GetObjectItem(c, "finish_reason");
            if (cJSON_IsString(f)) snprintf(a->finish, sizeof a->finish, "%s", f->valuestring);
        }
        take_usage(a, cJSON_GetObjectItem(j, "usage"));
        cJSON_Delete(j);
        p = e;
    }
    return true;
}

static char *json_quote(const char *s) {
    ds_sbuf b = {0};
    ds_json_string(&b, s, strlen(s));
    return b.data;
}

/* One request and its answer; body_fmt gets the quoted prompt. */
static bool ask(int port, const char *path, const char *body, bool stream, const char *leak, answer *a) {
    response r;
    bool ok = http(port, "POST", path, NULL, body, &r) && r.status == 200;
    const bool chat = strstr(path, "chat") != NULL;
    if (ok) ok = stream ? parse_stream(r.body, chat, leak, a) : parse_whole(r.body, chat, a);
    if (!ok) {
        fprintf(stderr, "ask %s %s -> %d %s\n", path, body, r.status, r.body ? r.body : "(no response)");
        *a = (answer){0};
    }
    response_free(&r);
    return ok;
}

/* ---- dspark generate's answers ------------------------------------------------------ */

typedef struct {
    char *text;
    int ids[1024];
    int n_ids;
    char reason[16];
} offline;

#define N_PROMPTS 6
static const char *prompts[N_PROMPTS] = {
    "It is a truth universally acknowledged",
    "In the beginning God created",
    "Mr. Speaker, Mr. Vice President, members of Congress",
    "def fibonacci(n):",
    "Emma Woodhouse, handsome, clever, and rich,",
    "And the LORD said unto Moses,",
};
static int max_tokens = 24; /* DS_TEST_QUICK: 12 */
static offline offl[N_PROMPTS];
static int n_prompts;

/* Every prompt through `dspark generate --prompt-file --json` (one model load). */
static bool run_generate(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/test_serve_prompts_%d.jsonl", (int)getpid());
    FILE *f = fopen(path, "w");
    for (int i = 0; i < n_prompts; i++) {
        char *q = json_quote(prompts[i]);
        fprintf(f, "{\"prompt\": %s}\n", q);
        free(q);
    }
    fclose(f);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s generate --prompt-file %s --json -n %d --threads 2", DS_CLI, path, max_tokens);
    FILE *p = popen(cmd, "r");
    char line[65536];
    int i = 0;
    while (p && fgets(line, sizeof line, p) && i < n_prompts) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *toks = j ? cJSON_GetObjectItem(j, "tokens") : NULL;
        if (toks) {
            offl[i].text = strdup(cJSON_GetObjectItem(j, "text")->valuestring);
            const cJSON *t;
            cJSON_ArrayForEach(t, toks) if (offl[i].n_ids < 1024) offl[i].ids[offl[i].n_ids++] = t->valueint;
            snprintf(offl[i].reason, sizeof offl[i].reason, "%s", cJSON_GetObjectItem(j, "stop_reason")->valuestring);
            i++;
        }
        cJSON_Delete(j);
    }
    int rc = p ? pclose(p) : -1;
    unlink(path);
    CHECK(rc == 0 && i == n_prompts, "dspark generate: exit %d, %d of %d prompts", rc, i, n_prompts);
    return rc == 0 && i == n_prompts;
}

/* The answer is generate's: same ids, same text, same finish reason. */
static void check_same(const answer *a, int i, const char *what) {
    const offline *o = &offl[i];
    bool same_ids = a->n_ids == o->n_ids && !memcmp(a->ids, o->ids, sizeof(int) * (size_t)o->n_ids);
    int k = 0;
    while (k < a->n_ids && k < o->n_ids && a->ids[k] == o->ids[k]) k++;
    CHECK(same_ids, "%s, prompt %d: %d ids, generate's %d (first difference at %d)", what, i, a->n_ids, o->n_ids, k);
    CHECK(a->text && !strcmp(a->text, o->text), "%s, prompt %d: text\n  '%s'\nwant\n  '%s'", what, i,
          a->text ? a->text : "(none)", o->text);
    CHECK(!strcmp(a->finish, o->reason), "%s, prompt %d: finish_reason %s, generate's %s", what, i, a->finish,
          o->reason);
    CHECK(a->completion_tokens == o->n_ids, "%s, prompt %d: usage.completion_tokens %d, want %d", what, i,
          a->completion_tokens, o->n_ids);
}

static char *completion_body(int i, bool stream, const char *extra) {
    char *q = json_quote(prompts[i]);
    char *b = malloc(strlen(q) + 256 + (extra ? strlen(extra) : 0));
    sprintf(b, "{\"model\":\"pico-qwen3\",\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,\"stream\":%s,"
               "\"return_token_ids\":true%s}", q, max_tokens, stream ? "true" : "false", extra ? extra : "");
    free(q);
    return b;
}

/* ---- the main server's tests ---------------------------------------------------------- */

static server main_srv;
static bool main_up;

static double metric(int port, const char *name) {
    response r;
    double v = -1;
    if (http(port, "GET", "/metrics", NULL, NULL, &r) && r.status == 200) {
        char key[160];
        snprintf(key, sizeof key, "\n%s{", name);
        const char *p = strstr(r.body, key);
        if (p && (p = strchr(p, '}'))) v = strtod(p + 1, NULL);
    }
    response_free(&r);
    return v;
}

static void test_units(void) {
    ds_serve_request r;
    ds_api_error e;
    static const struct {
        ds_req_kind kind;
        const char *body, *param;
    } bad[] = {
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\"", ""},
        {DS_REQ_COMPLETION, "[1, 2]", ""},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\"} {}", ""},
        {DS_REQ_COMPLETION, "{}", "prompt"},
        {DS_REQ_COMPLETION, "{\"prompt\": 5}", "prompt"},
        {DS_REQ_COMPLETION, "{\"prompt\": [\"a\", \"b\"]}", "prompt"},
        {DS_REQ_COMPLETION, "{\"prompt\": [1, -2]}", "prompt[1]"},
        {DS_REQ_COMPLETION, "{\"prompt\": [1, 2.5]}", "prompt[1]"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 0}", "max_tokens"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": \"9\"}", "max_tokens"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"temperature\": -1}", "temperature"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"top_p\": 0}", "top_p"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"top_p\": 1.5}", "top_p"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"top_k\": -2}", "top_k"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"seed\": 1.5}", "seed"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"n\": 2}", "n"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"stream\": 1}", "stream"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"stop\": 3}", "stop"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"stop\": [\"a\", 3]}", "stop[1]"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\","
                            "\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}", "stop"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 2}", "logprobs"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"echo\": true}", "echo"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"presence_penalty\": 0.5}", "presence_penalty"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"best_of\": 3}", "best_of"},
        {DS_REQ_COMPLETION, "{\"prompt\": \"x\", \"model\": 7}", "model"},
        {DS_REQ_CHAT, "{\"messages\": []}", "messages"},
        {DS_REQ_CHAT, "{\"messages\": [{\"role\": \"user\"}]}", "messages[0].content"},
        {DS_REQ_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"robot\", "
                      "\"content\": \"b\"}]}", "messages[1].role"},
        {DS_REQ_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
         "messages[0].content"},
        {DS_REQ_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": [{}]}", "tools"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        bool ok = ds_serve_request_parse(bad[i].kind, bad[i].body, strlen(bad[i].body), &r, &e);
        CHECK(!ok && e.status == 400 && !strcmp(e.param, bad[i].param) && *e.message,
              "bad body %zu (%s): ok %d, status %d, param '%s' (want '%s'), message '%s'", i, bad[i].body, ok,
              e.status, e.param, bad[i].param, e.message);
        if (ok) ds_serve_request_free(&r);
    }
    const char *good = "{\"model\": null, \"prompt\": [[5, 6, 7]], \"max_tokens\": 9, \"temperature\": 0.5, "
                       "\"top_p\": 0.9, \"top_k\": -1, \"seed\": -1, \"stop\": [\"a\", \"\"], \"n\": 1, "
                       "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"logprobs\": null, "
                       "\"user\": \"u\", \"frequency_penalty\": 0}";
    CHECK(ds_serve_request_parse(DS_REQ_COMPLETION, good, strlen(good), &r, &e), "good body refused: %s", e.message);
    CHECK(r.n_prompt_ids == 3 && r.prompt_ids[2] == 7 && r.max_tokens == 9 && r.max_tokens_given &&
              r.temperature == 0.5f && r.top_k == 0 && r.seed == UINT64_MAX && r.n_stop == 1 && r.stream &&
              r.include_usage && !r.model,
          "good body parsed wrong");
    ds_serve_request_free(&r);
    const char *chat = "{\"messages\": [{\"role\": \"developer\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, "
                       "{\"type\": \"text\", \"text\": \"b\"}]}, {\"role\": \"user\", \"content\": \"q\"}], "
                       "\"max_completion_tokens\": 4, \"max_tokens\": 100}";
    CHECK(ds_serve_request_parse(DS_REQ_CHAT, chat, strlen(chat), &r, &e), "chat body refused: %s", e.message);
    CHECK(r.n_messages == 2 && !strcmp(r.messages[0].role, "system") && !strcmp(r.messages[0].content, "ab") &&
              r.max_tokens == 4,
          "chat body parsed wrong");
    ds_serve_request_free(&r);

    /* JSON text: escapes, NUL bytes, broken UTF-8 -> U+FFFD, valid UTF-8 kept. */
    ds_sbuf b = {0};
    ds_json_string(&b, "a\"\\\n\x01\0\xc3\xa9\xff\xe2\x82", 11);
    CHECK(!strcmp(ds_sbuf_str(&b), "\"a\\\"\\\\\\n\\u0001\\u0000\xc3\xa9\\ufffd\\ufffd\\ufffd\""), "escaped: %s",
          ds_sbuf_str(&b));
    ds_sbuf_free(&b);

    /* Stop strings across tokens: the pico tokenizer, text pushed id by id. */
    ds_tokenizer *tok = NULL;
    CHECK_OK(ds_tokenizer_load(DS_MODELS "/pico-qwen3/tokenizer.json", &tok));
    const char *text = "It is a truth universally acknowledged, that a single man in possession";
    int32_t *ids;
    size_t n;
    CHECK_OK(ds_tokenizer_encode(tok, text, strlen(text), false, &ids, &n));
    static const struct {
        const char *stop[2];
        const char *want;
        bool stopped;
    } cases[] = {
        {{"universally ack", NULL}, "It is a truth ", true},   /* spans tokens */
        {{"ruth", "It"}, "", true},                           /* the earliest match wins */
        {{"t a s", "xyz"}, "It is a truth universally acknowledged, tha", true},
        {{"possessionX", NULL}, "It is a truth universally acknowledged, that a single man in possession", false},
        {{"zzz", NULL}, "It is a truth universally acknowledged, that a single man in possession", false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char *stops[2];
        size_t ns = 0;
        for (int k = 0; k < 2; k++)
            if (cases[c].stop[k]) stops[ns++] = (char *)cases[c].stop[k];
        ds_text_stream *ts = ds_text_stream_new(tok, stops, ns);
        ds_sbuf out = {0};
        bool stopped = false;
        for (size_t i = 0; i < n && !stopped; i++) {
            stopped = ds_text_stream_push(ts, ids[i], &out);
            for (size_t k = 0; k < ns; k++) CHECK(!strstr(ds_sbuf_str(&out), stops[k]), "case %zu: leaked", c);
        }
        if (!stopped) stopped = ds_text_stream_finish(ts, &out);
        CHECK(stopped == cases[c].stopped && !strcmp(ds_sbuf_str(&out), cases[c].want),
              "stop case %zu: '%s' (stopped %d), want '%s'", c, ds_sbuf_str(&out), stopped, cases[c].want);
        ds_sbuf_free(&out);
        ds_text_stream_free(ts);
    }
    free(ids);
    ds_tokenizer_free(tok);
}

static void test_endpoints(void) {
    if (!main_up) return;
    const int port = main_srv.port;
    response r;
    CHECK(http(port, "GET", "/health", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "ok"), "/health: %d",
          r.status);
    response_free(&r);
    CHECK(http(port, "GET", "/v1/models", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"pico-qwen3\"") &&
              strstr(r.body, "\"object\":\"list\""),
          "/v1/models: %d %s", r.status, r.body);
    response_free(&r);
    CHECK(http(port, "GET", "/", NULL, NULL, &r) && r.status == 200 && strcasestr(r.head, "text/html") &&
              strcasestr(r.body, "<html"),
          "/: %d", r.status);
    response_free(&r);
    CHECK(http(port, "GET", "/metrics", NULL, NULL, &r) && r.status == 200, "/metrics: %d", r.status);
    static const char *const names[] = {
        "vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:prompt_tokens_total{",
        "vllm:generation_tokens_total{", "vllm:kv_cache_usage_perc{", "vllm:spec_decode_num_drafts_total{",
        "vllm:spec_decode_num_draft_tokens_total{", "vllm:spec_decode_num_accepted_tokens_total{",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"pico-qwen3\",position=\"0\"}",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"pico-qwen3\",position=\"6\"}",
        "# TYPE vllm:generation_tokens_total counter"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        CHECK(r.body && strstr(r.body, names[i]), "/metrics lacks %s", names[i]);
    response_free(&r);

    /* Errors. */
    http(port, "GET", "/nope", NULL, NULL, &r);
    check_error(&r, 404, "", "no such endpoint", "GET /nope");
    response_free(&r);
    http(port, "GET", "/v1/completions", NULL, NULL, &r);
    check_error(&r, 405, "", "POST", "GET /v1/completions");
    CHECK(r.head && strcasestr(r.head, "\nAllow: POST"), "405 without Allow: %s", r.head);
    response_free(&r);
    http(port, "POST", "/v1/completions", NULL, "{\"prompt\": ", &r);
    check_error(&r, 400, "", "not valid JSON", "malformed JSON");
    response_free(&r);
    http(port, "POST", "/v1/completions", NULL, "{\"prompt\": \"x\", \"temperature\": \"hot\"}", &r);
    check_error(&r, 400, "temperature", "temperature", "bad temperature");
    response_free(&r);
    http(port, "POST", "/v1/completions", NULL, "{\"prompt\": \"x\", \"n\": 3}", &r);
    check_error(&r, 400, "n", "'n' must be 1", "n = 3");
    response_free(&r);
    http(port, "POST", "/v1/chat/completions", NULL, "{\"messages\": [{\"role\": \"user\", \"content\": 4}]}", &r);
    check_error(&r, 400, "messages[0].content", "messages[0].content", "bad content");
    response_free(&r);
    http(port, "POST", "/v1/completions", NULL, "{\"prompt\": \"x\", \"model\": \"gpt-4\"}", &r);
    check_error(&r, 404, "model", "gpt-4", "unknown model");
    response_free(&r);
    http(port, "POST", "/v1/completions", NULL, "{\"prompt\": [1, 99999999]}", &r);
    check_error(&r, 400, "prompt", "99999999", "out-of-vocabulary id");
    response_free(&r);
    http(port, "POST", "/v1/completions", NULL, "{\"prompt\": \"\"}", &r);
    check_error(&r, 400, "prompt", "empty", "empty prompt");
    response_free(&r);
    http(port, "POST", "/v1/completions", NULL, "{\"prompt\": \"x\", \"max_tokens\": 100000}", &r);
    check_error(&r, 400, "max_tokens", "max_tokens", "max_tokens past the context");
    response_free(&r);
    /* A prompt longer than the context: ~4 tokens a repetition. */
    {
        ds_sbuf big = {0};
        ds_sbuf_puts(&big, "{\"prompt\": \"");
        for (int i = 0; i < 400; i++) ds_sbuf_puts(&big, "the cat sat on ");
        ds_sbuf_puts(&big, "\"}");
        http(port, "POST", "/v1/completions", NULL, ds_sbuf_str(&big), &r);
        check_error(&r, 400, "prompt", "tokens", "over-long prompt");
        response_free(&r);
        ds_sbuf_free(&big);
    }
    /* Too many header lines. */
    {
        ds_sbuf h = {0};
        for (int i = 0; i < 80; i++) ds_sbuf_printf(&h, "X-Filler-%d: %d\r\n", i, i);
        http(port, "GET", "/health", ds_sbuf_str(&h), NULL, &r);
        CHECK(r.status == 431, "80 header lines: status %d", r.status);
        response_free(&r);
        ds_sbuf_free(&h);
    }
    /* max_tokens: 1 gives one token, finish "length". */
    answer a;
    CHECK(ask(port, "/v1/completions", "{\"prompt\": \"In the beginning\", \"max_tokens\": 1}", false, NULL, &a) &&
              a.completion_tokens == 1 && !strcmp(a.finish, "length"),
          "max_tokens 1: %d tokens, %s", a.completion_tokens, a.finish);
    answer_free(&a);
}

static void test_identical_to_generate(void) {
    if (!main_up) return;
    const int port = main_srv.port;
    for (int i = 0; i < n_prompts; i++) {
        for (int stream = 0; stream < 2; stream++) {
            char *body = completion_body(i, stream, stream ? ",\"stream_options\":{\"include_usage\":true}" : NULL);
            answer a;
            if (ask(port, "/v1/completions", body, stream, NULL, &a)) {
                check_same(&a, i, stream ? "streamed, alone" : "whole, alone");
                if (stream) CHECK(a.done && a.events >= 2, "stream %d: %d events, [DONE] %d", i, a.events, a.done);
            } else {
                CHECK(false, "prompt %d stream %d: no answer", i, stream);
            }
            answer_free(&a);
            free(body);
        }
    }
}

typedef struct {
    int port, prompt;
    bool stream;
    answer a;
    bool ok;
} job_arg;

static void *run_job(void *p) {
    job_arg *j = p;
    char *body = completion_body(j->prompt, j->stream, NULL);
    j->ok = ask(j->port, "/v1/completions", body, j->stream, NULL, &j->a);
    free(body);
    return NULL;
}

static void test_concurrent_identical(void) {
    if (!main_up) return;
    /* Each prompt twice at once, streamed and not: 2 x n requests beside each other. */
    enum { MAX = 2 * N_PROMPTS };
    job_arg jobs[MAX];
    pthread_t th[MAX];
    const int n = 2 * n_prompts;
    for (int i = 0; i < n; i++) {
        jobs[i] = (job_arg){.port = main_srv.port, .prompt = i % n_prompts, .stream = i >= n_prompts};
        pthread_create(&th[i], NULL, run_job, &jobs[i]);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].ok, "concurrent request %d failed", i);
        if (jobs[i].ok) check_same(&jobs[i].a, jobs[i].prompt, jobs[i].stream ? "streamed, concurrent" : "whole, concurrent");
        answer_free(&jobs[i].a);
    }
    CHECK(metric(main_srv.port, "vllm:num_requests_running") == 0, "requests still running after the burst");
    CHECK(metric(main_srv.port, "vllm:spec_decode_num_drafts_total") > 0, "no drafts counted");
    CHECK(metric(main_srv.port, "vllm:generation_tokens_total") > 0, "no tokens counted");
    CHECK(metric(main_srv.port, "vllm:time_to_first_token_seconds_count") >= 2 * n_prompts &&
              metric(main_srv.port, "vllm:e2e_request_latency_seconds_count") >= 2 * n_prompts &&
              metric(main_srv.port, "vllm:e2e_request_latency_seconds_sum") > 0,
          "latency histograms not counting");
}

/* Sampling: a seed's answer is generate's with the same seed and settings
 * (each request draws from its own seed's stream, whatever runs beside it). */
static void test_sampled_identical(void) {
    if (!main_up) return;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s generate -p 'In the beginning God created' --json -n %d --temp 0.8 --top-k 40 "
             "--top-p 0.9 --seed 1234 --threads 2", DS_CLI, max_tokens);
    FILE *p = popen(cmd, "r");
    char line[65536] = "";
    if (!p || !fgets(line, sizeof line, p)) line[0] = 0;
    if (p) pclose(p);
    cJSON *j = cJSON_Parse(line);
    const cJSON *toks = j ? cJSON_GetObjectItem(j, "tokens") : NULL;
    CHECK(toks, "dspark generate at T = 0.8 gave no tokens");
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"In the beginning God created\",\"max_tokens\":%d,\"temperature\":0.8,"
             "\"top_k\":40,\"top_p\":0.9,\"seed\":1234,\"return_token_ids\":true}", max_tokens);
    answer a;
    if (toks && ask(main_srv.port, "/v1/completions", body, false, NULL, &a)) {
        bool same = a.n_ids == cJSON_GetArraySize(toks);
        for (int i = 0; same && i < a.n_ids; i++) same = a.ids[i] == cJSON_GetArrayItem(toks, i)->valueint;
        CHECK(same, "T = 0.8, seed 1234: the server's %d tokens differ from generate's %d", a.n_ids,
              cJSON_GetArraySize(toks));
        answer_free(&a);
    }
    cJSON_Delete(j);
}

static void test_stop_strings(void) {
    if (!main_up) return;
    /* A stop string from the middle of prompt 0's known answer. */
    const char *full = offl[0].text;
    size_t len = strlen(full);
    if (len < 20) return;
    char stop[8];
    memcpy(stop, full + len / 2, 5);
    stop[5] = 0;
    const char *cut = strstr(full, stop);
    size_t want_len = (size_t)(cut - full);
    char *qs = json_quote(stop);
    for (int stream = 0; stream < 2; stream++) {
        char extra[128];
        snprintf(extra, sizeof extra, ",\"stop\":[\"\\u0000never\",%s]", qs);
        char *body = completion_body(0, stream, extra);
        answer a;
        if (ask(main_srv.port, "/v1/completions", body, stream, stop, &a)) {
            CHECK(strlen(a.text) == want_len && !strncmp(a.text, full, want_len),
                  "stop '%s' (stream %d): '%s', want the first %zu bytes of '%s'", stop, stream, a.text, want_len, full);
            CHECK(!strcmp(a.finish, "stop"), "stop string: finish_reason %s", a.finish);
            CHECK(!a.leaked, "stop string leaked into a streamed chunk");
        }
        answer_free(&a);
        free(body);
    }
    free(qs);
}

static void test_chat(void) {
    if (!main_up) return;
    const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":\"Who wrote Pride and Prejudice?\"}],"
                       "\"max_tokens\":20,\"return_token_ids\":true%s}";
    char b1[512], b2[512];
    snprintf(b1, sizeof b1, body, "");
    snprintf(b2, sizeof b2, body, ",\"stream\":true");
    answer whole, streamed;
    bool ok1 = ask(main_srv.port, "/v1/chat/completions", b1, false, NULL, &whole);
    bool ok2 = ask(main_srv.port, "/v1/chat/completions", b2, true, NULL, &streamed);
    CHECK(ok1 && ok2, "chat requests failed");
    if (ok1 && ok2) {
        CHECK(!strcmp(whole.text, streamed.text) && whole.n_ids == streamed.n_ids &&
                  !memcmp(whole.ids, streamed.ids, sizeof(int) * (size_t)whole.n_ids),
              "chat: streamed '%s' != whole '%s'", streamed.text, whole.text);
        CHECK(streamed.done, "chat stream without [DONE]");
        CHECK(whole.prompt_tokens > 5 && whole.completion_tokens >= 1 && *whole.text, "chat usage %d / %d",
              whole.prompt_tokens, whole.completion_tokens);
    }
    answer_free(&whole);
    answer_free(&streamed);
}

/* Reads from fd until `needle` has arrived (or 30 s). */
static bool read_until(int fd, const char *needle) {
    char buf[8192];
    size_t len = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    for (double t0 = now_s(); now_s() - t0 < 30;) {
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t k = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (k <= 0) return false;
        len += (size_t)k;
        buf[len] = 0;
        if (strstr(buf, needle)) return true;
        if (len > sizeof buf / 2) memmove(buf, buf + len / 2, len - len / 2), len -= len / 2;
    }
    return false;
}

/* Waits until /metrics shows no request running or waiting and the pool empty. */
static bool engine_idle(int port, double seconds) {
    for (double t0 = now_s(); now_s() - t0 < seconds;) {
        if (metric(port, "vllm:num_requests_running") == 0 && metric(port, "vllm:num_requests_waiting") == 0 &&
            metric(port, "vllm:kv_cache_usage_perc") == 0)
            return true;
        usleep(20000);
    }
    return false;
}

/* Long enough to outlast the checks made while it runs, short enough to
 * finish in the drain's grace period (the sanitizer build is ~50x slower). */
static char long_stream[160];

static void test_disconnect(void) {
    if (!main_up) return;
    const int port = main_srv.port;
    int fd = send_request(port, "POST", "/v1/completions", NULL, long_stream);
    CHECK(fd >= 0 && read_until(fd, "data: {"), "no first event");
    CHECK(metric(port, "vllm:num_requests_running") == 1, "the long request is not running");
    double t0 = now_s();
    close(fd);
    /* Within a step or two; the sanitizer build's steps are ~50x slower. */
    const double limit = quick ? 30 : 5;
    CHECK(engine_idle(port, limit), "a disconnected stream still runs %.0f s later", limit);
    printf("  disconnect -> engine idle in %.0f ms\n", (now_s() - t0) * 1e3);
    /* A non-streamed request whose client leaves is cancelled too. */
    fd = send_request(port, "POST", "/v1/completions", NULL,
                      "{\"prompt\":\"In the beginning\",\"max_tokens\":400,\"ignore_eos\":true}");
    for (double t = now_s(); now_s() - t < 10 && metric(port, "vllm:num_requests_running") != 1;) usleep(10000);
    close(fd);
    CHECK(engine_idle(port, limit), "a disconnected whole request still runs %.0f s later", limit);
}

/* The second server: an API key, one request at a time and no queue, a small body cap. */
static void test_limits_and_shutdown(void) {
    server s;
    const char *args[] = {"--api-key", "sekrit", "--batch", "1", "--max-queue", "0", "--max-body", "4096",
                          "--grace", "120", NULL};
    if (!server_start(&s, args)) {
        CHECK(false, "the second server did not start");
        return;
    }
    const int port = s.port;
    response r;
    const char *auth = "Authorization: Bearer sekrit\r\n";
    http(port, "POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &r);
    check_error(&r, 401, "", "API key", "no key");
    response_free(&r);
    http(port, "POST", "/v1/completions", "Authorization: Bearer wrong\r\n", "{\"prompt\":\"x\"}", &r);
    check_error(&r, 401, "", "API key", "wrong key");
    response_free(&r);
    http(port, "GET", "/v1/models", NULL, NULL, &r);
    check_error(&r, 401, "", NULL, "models without key");
    response_free(&r);
    CHECK(http(port, "GET", "/health", NULL, NULL, &r) && r.status == 200, "/health needs no key: %d", r.status);
    response_free(&r);
    answer a;
    {
        char body[128];
        snprintf(body, sizeof body, "{\"prompt\":\"In the beginning\",\"max_tokens\":3}");
        response rr;
        CHECK(http(port, "POST", "/v1/completions", auth, body, &rr) && rr.status == 200, "with the key: %d %s",
              rr.status, rr.body);
        response_free(&rr);
    }
    /* 413: declared, and chunked with no length. */
    {
        ds_sbuf big = {0};
        ds_sbuf_puts(&big, "{\"prompt\":\"");
        for (int i = 0; i < 600; i++) ds_sbuf_puts(&big, "abcdefgh");
        ds_sbuf_puts(&big, "\"}");
        http(port, "POST", "/v1/completions", auth, ds_sbuf_str(&big), &r);
        check_error(&r, 413, "", "4096", "declared big body");
        response_free(&r);
        int fd = dial(port);
        ds_sbuf req = {0};
        ds_sbuf_printf(&req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s"
                             "Transfer-Encoding: chunked\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n",
                       auth, big.len, ds_sbuf_str(&big));
        send_all(fd, ds_sbuf_str(&req), req.len);
        read_response(fd, &r);
        check_error(&r, 413, "", "4096", "chunked big body");
        response_free(&r);
        ds_sbuf_free(&req);
        ds_sbuf_free(&big);
    }
    /* 429: one long request holds the only slot. */
    int fd = send_request(port, "POST", "/v1/completions", auth, long_stream);
    CHECK(fd >= 0 && read_until(fd, "data: {"), "the long stream did not start");
    http(port, "POST", "/v1/completions", auth, "{\"prompt\":\"x\",\"max_tokens\":2}", &r);
    check_error(&r, 429, "", "capacity", "queue full");
    response_free(&r);
    /* SIGTERM while it streams: new requests get 503, it completes, exit 0. */
    kill(s.pid, SIGTERM);
    bool saw_503 = false;
    for (double t0 = now_s(); now_s() - t0 < 5 && !saw_503;) {
        http(port, "POST", "/v1/completions", auth, "{\"prompt\":\"x\",\"max_tokens\":2}", &r);
        saw_503 = r.status == 503;
        if (saw_503) check_error(&r, 503, "", "shutting down", "while draining");
        response_free(&r);
        if (!saw_503) usleep(20000);
    }
    CHECK(saw_503, "no 503 while draining");
    /* The rest of the stream, raw (its chunk framing left in: the strings
     * looked for are far shorter than one event's chunk). */
    ds_sbuf tail = {0};
    char buf[4096];
    ssize_t k;
    while ((k = recv(fd, buf, sizeof buf, 0)) > 0) ds_sbuf_append(&tail, buf, (size_t)k);
    close(fd);
    CHECK(strstr(ds_sbuf_str(&tail), "data: [DONE]") && strstr(ds_sbuf_str(&tail), "\"finish_reason\":\"length\""),
          "the stream in flight did not complete during the grace period");
    ds_sbuf_free(&tail);
    int st = -1;
    for (double t0 = now_s(); now_s() - t0 < 60;) {
        int w;
        if (waitpid(s.pid, &w, WNOHANG) == s.pid) {
            st = WIFEXITED(w) ? WEXITSTATUS(w) : 128 + WTERMSIG(w);
            break;
        }
        usleep(20000);
    }
    CHECK(st == 0, "SIGTERM: exit status %d", st);
    if (st == -1) kill(s.pid, SIGKILL), waitpid(s.pid, NULL, 0);
    unlink(s.log);
    (void)a;
}

/* A grace period too short for the request in flight: it is cancelled,
 * its stream still ends properly (finish_reason "abort", [DONE]), exit 0. */
static void test_grace_expires(void) {
    server s;
    const char *args[] = {"--grace", "0", NULL};
    if (!server_start(&s, args)) {
        CHECK(false, "the third server did not start");
        return;
    }
    char body[160];
    snprintf(body, sizeof body, "{\"prompt\":\"In the beginning\",\"max_tokens\":%d,\"ignore_eos\":true,"
             "\"stream\":true}", 400);
    int fd = send_request(s.port, "POST", "/v1/completions", NULL, body);
    CHECK(fd >= 0 && read_until(fd, "data: {"), "the stream did not start");
    kill(s.pid, SIGTERM);
    ds_sbuf tail = {0};
    char buf[4096];
    ssize_t k;
    while ((k = recv(fd, buf, sizeof buf, 0)) > 0) ds_sbuf_append(&tail, buf, (size_t)k);
    close(fd);
    CHECK(strstr(ds_sbuf_str(&tail), "\"finish_reason\":\"abort\"") && strstr(ds_sbuf_str(&tail), "data: [DONE]"),
          "a stream cut by the grace period did not end with abort and [DONE]");
    ds_sbuf_free(&tail);
    int st = -1;
    for (double t0 = now_s(); now_s() - t0 < 60;) {
        int w;
        if (waitpid(s.pid, &w, WNOHANG) == s.pid) {
            st = WIFEXITED(w) ? WEXITSTATUS(w) : 128 + WTERMSIG(w);
            break;
        }
        usleep(20000);
    }
    CHECK(st == 0, "SIGTERM after the grace period: exit status %d", st);
    if (st == -1) kill(s.pid, SIGKILL), waitpid(s.pid, NULL, 0);
    unlink(s.log);
}

static void setup(void) {
    quick = getenv("DS_TEST_QUICK") != NULL;
    n_prompts = quick ? 2 : N_PROMPTS;
    if (quick) max_tokens = 12;
    snprintf(long_stream, sizeof long_stream,
             "{\"prompt\":\"In the beginning\",\"max_tokens\":%d,\"ignore_eos\":true,\"stream\":true}",
             quick ? 48 : 400);
    run_generate();
    main_up = server_start(&main_srv, (const char *const[]){"--batch", "4", NULL});
    CHECK(main_up, "the server did not start");
}

static void teardown(void) {
    if (main_up) CHECK(server_stop(&main_srv) == 0, "SIGTERM: the server did not exit 0");
    for (int i = 0; i < N_PROMPTS; i++) free(offl[i].text);
}

RUN_TESTS("serve", setup, test_units, test_endpoints, test_identical_to_generate, test_concurrent_identical,
          test_sampled_identical, test_stop_strings, test_chat, test_disconnect, test_limits_and_shutdown, test_grace_expires, teardown)
