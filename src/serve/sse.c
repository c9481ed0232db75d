#include "serve/sse.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/openai_json.h"

/* How often a blocked reader looks at its socket: a client that hangs up
 * while its request waits in the queue or between tokens is noticed within
 * this, and its request cancelled (its KV pages freed). */
#define POLL_MS 50

struct ds_sse {
    ds_job *job;
    char id[48];
    char *model;
    long long created;
    int fd;
    ds_sbuf pending;   /* framed bytes not yet handed to the HTTP layer */
    size_t sent;       /* of pending */
    bool started;      /* the first chunk (chat: the role) is out */
    bool done;         /* [DONE] is in pending */
};

/* POLLRDHUP: the peer closed (or shut down its sending side). A client
 * that half-closes after its request would read as gone; HTTP/1.1 clients
 * do not (the request's end is its length, not EOF), and reading the end of
 * a stream is what tells a hang-up apart from a slow reader. */
bool ds_peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

ds_sse *ds_sse_new(ds_job *job, const char *id, const char *model, long long created, int fd) {
    ds_sse *s = calloc(1, sizeof *s);
    if (!s || !(s->model = strdup(model))) {
        free(s);
        return NULL;
    }
    s->job = job;
    snprintf(s->id, sizeof s->id, "%s", id);
    s->created = created;
    s->fd = fd;
    return s;
}

void ds_sse_free(ds_sse *s) {
    if (!s) return;
    ds_job_cancel(s->job);
    ds_job_unref(s->job);
    ds_sbuf_free(&s->pending);
    free(s->model);
    free(s);
}

static void frame(ds_sse *s, void (*write)(ds_sbuf *, const ds_oai_out *), const ds_oai_out *o) {
    ds_sbuf_puts(&s->pending, "data: ");
    write(&s->pending, o);
    ds_sbuf_puts(&s->pending, "\n\n");
}

/* Turns one update into events. */
static void events(ds_sse *s, const ds_job_update *u) {
    const ds_serve_request *r = ds_job_request(s->job);
    ds_oai_out o = {.kind = r->kind, .id = s->id, .created = s->created, .model = s->model,
                    .text = ds_sbuf_str(&u->text), .text_len = u->text.len,
                    .ids = r->return_token_ids ? u->ids : NULL, .n_ids = u->n_ids,
                    .prompt_tokens = u->prompt_tokens, .completion_tokens = u->completion_tokens};
    if (!s->started && r->kind == DS_REQ_CHAT) {
        ds_oai_out first = o;
        first.first = true, first.text_len = 0, first.ids = NULL;
        frame(s, ds_oai_chunk, &first);
    }
    s->started = true;
    const bool end = u->phase == DS_JOB_FINISHED || u->phase == DS_JOB_REJECTED;
    if (end && u->err.status) {
        /* The engine failed mid-stream: the status line is long gone, so
         * the error goes as an event, as vLLM sends it. */
        ds_sbuf_puts(&s->pending, "data: ");
        ds_oai_error(&s->pending, &u->err);
        ds_sbuf_puts(&s->pending, "\n\n");
    } else if (end) {
        /* The last chunk: the rest of the text, the finish reason, usage. */
        o.finish_reason = u->finish_reason;
        o.usage = true;
        frame(s, ds_oai_chunk, &o);
        if (r->include_usage) frame(s, ds_oai_usage_chunk, &o);
    } else if (u->text.len || (o.ids && u->n_ids)) {
        frame(s, ds_oai_chunk, &o);
    }
    if (end) {
        ds_sbuf_puts(&s->pending, "data: [DONE]\n\n");
        s->done = true;
    }
}

ssize_t ds_sse_read(ds_sse *s, char *buf, size_t max) {
    while (s->sent == s->pending.len) {
        if (s->done) return DS_SSE_END;
        ds_sbuf_clear(&s->pending);
        s->sent = 0;
        if (ds_peer_gone(s->fd)) return DS_SSE_ERROR;
        ds_job_update u;
        bool news = ds_job_take(s->job, POLL_MS, &u);
        if (news || !s->started) events(s, &u);
        ds_sbuf_free(&u.text);
        free(u.ids);
        if (s->pending.oom) return DS_SSE_ERROR;
    }
    size_t n = s->pending.len - s->sent;
    if (n > max) n = max;
    memcpy(buf, s->pending.data + s->sent, n);
    s->sent += n;
    return (ssize_t)n;
}
