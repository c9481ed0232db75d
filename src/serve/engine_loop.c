/* The engine thread: wait while idle, take the inbox, admit (tokenize +
 * ds_engine_submit), apply cancellations, step once, publish every live
 * request's new tokens as text into its mailbox and wake its waiter.
 *
 * Tokenizing here rather than in the HTTP threads: ds_engine_chat_encode
 * takes the engine (the chat template is looked up on first use), and one
 * owner for everything the engine holds is what the API asks for. A prompt
 * is bounded by the body size cap, so it cannot stall the thread for long.
 *
 * One mutex (l->mu) guards the inbox, every job's mailbox and the metrics
 * snapshot; the engine thread holds it while it publishes (detokenizing a
 * step's few tokens a request), never while it steps or tokenizes. */
#include "serve/engine_loop.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "serve/plain_chat.h"
#include "serve/stream.h"

const double ds_ttft_buckets[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, 0};
const double ds_e2e_buckets[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0, 0};

static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void observe(ds_histogram *h, const double *bounds, double v) {
    int b = 0;
    while (bounds[b] > 0 && v > bounds[b]) b++;
    if (bounds[b] > 0) h->counts[b]++; /* past the last bound: only +Inf (count) */
    h->count++;
    h->sum += v;
}

struct ds_job {
    ds_loop *loop;
    double t_post;          /* when it was posted (monotonic seconds) */
    bool first_seen;        /* its first token has been published (TTFT observed) */
    ds_serve_request req;   /* immutable once posted */
    pthread_cond_t cv;
    /* under loop->mu: */
    int refs;
    ds_job_phase phase;
    bool news;              /* something the waiter has not taken */
    bool cancel;            /* the HTTP side asked to end it */
    ds_sbuf text;
    int32_t *ids;
    size_t n_ids, cap_ids;
    const char *finish_reason;
    int prompt_tokens, completion_tokens;
    ds_api_error err;
    /* the engine thread's own: */
    ds_request_id id;
    ds_text_stream *ts;
    size_t n_seen;          /* committed tokens already fed to ts */
    bool stopped;           /* a stop string matched */
    ds_job *next;           /* inbox or live list */
};

struct ds_loop {
    ds_engine *engine;
    const ds_tokenizer *tok;
    ds_loop_opts o;
    bool plain_chat;        /* the model has no chat template: plain_chat.h */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t wake;    /* the engine thread sleeps on it while idle */
    pthread_cond_t idle;    /* live reached 0 (drain waits on it) */
    /* under mu: */
    ds_job *inbox, *inbox_tail;
    int n_inbox;
    int live;
    bool draining, cancel_all, stop, poke;
    ds_loop_snapshot snap;
    /* the engine thread's own: */
    ds_job *running;        /* submitted, not yet released */
    int active;             /* the engine's count after the last step or submit */
};

static void cond_init_monotonic(pthread_cond_t *c) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

static struct timespec deadline_in(double seconds) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    long long ns = (long long)t.tv_nsec + (long long)(seconds * 1e9);
    t.tv_sec += (time_t)(ns / 1000000000LL);
    t.tv_nsec = (long)(ns % 1000000000LL);
    return t;
}

/* ---- jobs ---------------------------------------------------------------- */

static void job_free(ds_job *j) {
    ds_serve_request_free(&j->req);
    pthread_cond_destroy(&j->cv);
    ds_sbuf_free(&j->text);
    free(j->ids);
    ds_text_stream_free(j->ts);
    free(j);
}

/* Drops a reference; the caller holds loop->mu. Returns the job to free
 * once the lock is let go (NULL if others still hold it). */
static ds_job *unref_locked(ds_job *j) { return --j->refs == 0 ? j : NULL; }

void ds_job_unref(ds_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->loop->mu);
    ds_job *dead = unref_locked(j);
    pthread_mutex_unlock(&j->loop->mu);
    if (dead) job_free(dead);
}

const ds_serve_request *ds_job_request(const ds_job *j) { return &j->req; }

void ds_job_ref(ds_job *j) {
    pthread_mutex_lock(&j->loop->mu);
    j->refs++;
    pthread_mutex_unlock(&j->loop->mu);
}

ds_job_phase ds_job_wait_admitted(ds_job *j, int timeout_ms) {
    ds_loop *l = j->loop;
    struct timespec dl = deadline_in(timeout_ms / 1000.0);
    pthread_mutex_lock(&l->mu);
    while (j->phase == DS_JOB_ADMITTING && pthread_cond_timedwait(&j->cv, &l->mu, &dl) != ETIMEDOUT) {
    }
    ds_job_phase p = j->phase;
    pthread_mutex_unlock(&l->mu);
    return p;
}

void ds_job_cancel(ds_job *j) {
    ds_loop *l = j->loop;
    pthread_mutex_lock(&l->mu);
    if (!j->cancel && (j->phase == DS_JOB_ADMITTING || j->phase == DS_JOB_RUNNING)) {
        j->cancel = true;
        l->poke = true;
        pthread_cond_signal(&l->wake);
    }
    pthread_mutex_unlock(&l->mu);
}

bool ds_job_take(ds_job *j, int timeout_ms, ds_job_update *u) {
    ds_loop *l = j->loop;
    *u = (ds_job_update){0};
    pthread_mutex_lock(&l->mu);
    if (!j->news && timeout_ms > 0) {
        struct timespec dl = deadline_in(timeout_ms / 1000.0);
        while (!j->news && pthread_cond_timedwait(&j->cv, &l->mu, &dl) != ETIMEDOUT) {
        }
    }
    bool news = j->news;
    j->news = false;
    u->phase = j->phase;
    u->text = j->text;
    j->text = (ds_sbuf){0};
    u->ids = j->ids;
    u->n_ids = j->n_ids;
    j->ids = NULL;
    j->n_ids = j->cap_ids = 0;
    u->finish_reason = j->finish_reason;
    u->prompt_tokens = j->prompt_tokens;
    u->completion_tokens = j->completion_tokens;
    u->err = j->err;
    pthread_mutex_unlock(&l->mu);
    return news;
}

/* ---- posting ------------------------------------------------------------- */

ds_job *ds_loop_post(ds_loop *l, ds_serve_request *req, ds_api_error *err) {
    ds_job *j = calloc(1, sizeof *j);
    if (!j) {
        ds_api_errorf(err, 500, NULL, "out of memory");
        return NULL;
    }
    j->loop = l;
    j->t_post = mono_s();
    cond_init_monotonic(&j->cv);
    j->refs = 2; /* the caller's and the engine thread's */
    j->phase = DS_JOB_ADMITTING;
    pthread_mutex_lock(&l->mu);
    const char *refusal = l->draining ? "draining" : l->live >= l->o.max_live ? "full" : NULL;
    if (!refusal) {
        j->req = *req;
        *req = (ds_serve_request){0};
        if (l->inbox_tail) l->inbox_tail->next = j;
        else l->inbox = j;
        l->inbox_tail = j;
        l->n_inbox++;
        l->live++;
        pthread_cond_signal(&l->wake);
    }
    pthread_mutex_unlock(&l->mu);
    if (!refusal) return j;
    pthread_cond_destroy(&j->cv);
    free(j);
    if (!strcmp(refusal, "draining"))
        ds_api_errorf(err, 503, NULL, "the server is shutting down and takes no new requests");
    else
        ds_api_errorf(err, 429, NULL, "the server is at capacity (%d requests running or queued); retry later",
                      l->o.max_live);
    return NULL;
}

/* ---- the engine thread ---------------------------------------------------- */

/* Ends a job's life in the engine thread; the caller holds mu. */
static ds_job *retire_locked(ds_loop *l, ds_job *j, ds_job_phase phase) {
    j->phase = phase;
    j->news = true;
    pthread_cond_broadcast(&j->cv);
    if (--l->live == 0) pthread_cond_broadcast(&l->idle);
    return unref_locked(j);
}

/* The prompt's ids: given, or tokenized text, or rendered messages. */
static bool prompt_ids(ds_loop *l, ds_job *j, int32_t **ids, size_t *n, ds_api_error *err) {
    const ds_serve_request *r = &j->req;
    ds_error *e = NULL;
    const char *param = "prompt";
    if (r->kind == DS_REQ_CHAT && l->plain_chat) {
        param = "messages";
        ds_sbuf text = {0};
        ds_plain_chat_render(r->messages, r->n_messages, &text);
        e = text.oom ? ds_errorf("out of memory")
                     : ds_tokenizer_encode(l->tok, ds_sbuf_str(&text), text.len, false, ids, n);
        ds_sbuf_free(&text);
    } else if (r->kind == DS_REQ_CHAT) {
        param = "messages";
        e = ds_engine_chat_encode(l->engine, r->messages, r->n_messages, ids, n);
    } else if (r->prompt) {
        e = ds_tokenizer_encode(l->tok, r->prompt, strlen(r->prompt), false, ids, n);
    } else {
        *n = r->n_prompt_ids;
        if ((*ids = malloc((*n ? *n : 1) * sizeof **ids))) memcpy(*ids, r->prompt_ids, *n * sizeof **ids);
        else e = ds_errorf("out of memory");
    }
    if (e) {
        ds_api_errorf(err, 400, param, "'%s': %s", param, ds_error_message(e));
        ds_error_free(e);
        return false;
    }
    if (!*n) {
        ds_api_errorf(err, 400, param, "'%s' is empty: it encodes to no tokens", param);
        return false;
    }
    if (*n >= (size_t)l->o.ctx) {
        ds_api_errorf(err, 400, param, "'%s' is %zu tokens; a request holds at most %d tokens, prompt and output "
                      "(--ctx), so the prompt must be shorter", param, *n, l->o.ctx);
        return false;
    }
    return true;
}

/* Tokenizes and submits one job taken from the inbox; on refusal the job
 * is retired with a 400. */
static void admit(ds_loop *l, ds_job *j) {
    ds_api_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    const ds_serve_request *r = &j->req;
    bool ok = prompt_ids(l, j, &ids, &n, &err);
    ds_generate_opts g = {.temperature = r->temperature, .top_k = r->top_k, .top_p = r->top_p, .seed = r->seed,
                          .threshold = l->o.threshold, .gamma = l->o.gamma, .ignore_eos = r->ignore_eos};
    if (ok) {
        const int room = l->o.ctx - (int)n;
        if (r->max_tokens_given && r->max_tokens > room) {
            const char *name = r->kind == DS_REQ_CHAT ? "max_tokens (or max_completion_tokens)" : "max_tokens";
            ds_api_errorf(&err, 400, "max_tokens", "'%s' is %d, but the prompt is %zu tokens and a request holds at "
                          "most %d (--ctx): at most %d new tokens fit", name, r->max_tokens, n, l->o.ctx, room);
            ok = false;
        }
        g.max_new = r->max_tokens_given ? r->max_tokens
                    : l->o.default_max_tokens < room ? l->o.default_max_tokens : room;
    }
    /* A plain transcript's answer ends where the user's next turn would begin. */
    char *stops[DS_REQ_MAX_STOP + 1];
    size_t n_stop = r->n_stop;
    for (size_t k = 0; k < n_stop; k++) stops[k] = r->stop[k];
    if (r->kind == DS_REQ_CHAT && l->plain_chat) stops[n_stop++] = (char *)DS_PLAIN_CHAT_STOP;
    if (ok && !(j->ts = ds_text_stream_new(l->tok, stops, n_stop))) {
        ds_api_errorf(&err, 500, NULL, "out of memory");
        ok = false;
    }
    if (ok) {
        ds_error *e = ds_engine_submit(l->engine, ids, n, &g, &j->id);
        if (e) {
            ds_api_errorf(&err, 400, r->kind == DS_REQ_CHAT ? "messages" : "prompt", "%s", ds_error_message(e));
            ds_error_free(e);
            ok = false;
        }
    }
    free(ids);
    ds_job *dead = NULL;
    pthread_mutex_lock(&l->mu);
    j->prompt_tokens = (int)n;
    if (ok) {
        j->phase = DS_JOB_RUNNING;
        j->news = true;
        pthread_cond_broadcast(&j->cv);
        j->next = l->running;
        l->running = j;
        l->active = 1; /* the next step learns the true count */
    } else {
        j->err = err;
        l->snap.rejected++;
        dead = retire_locked(l, j, DS_JOB_REJECTED);
    }
    pthread_mutex_unlock(&l->mu);
    if (dead) job_free(dead);
}

static void append_id(ds_job *j, int32_t id) {
    if (j->n_ids == j->cap_ids) {
        size_t cap = j->cap_ids ? j->cap_ids * 2 : 16;
        int32_t *p = realloc(j->ids, cap * sizeof *p);
        if (!p) return; /* ids are an extra (return_token_ids): the text goes on */
        j->ids = p;
        j->cap_ids = cap;
    }
    j->ids[j->n_ids++] = id;
}

/* Moves one running job's new tokens into its mailbox; retires it when it
 * has finished (or a stop string matched, or it was cancelled). Holds mu.
 * Returns a job to free after unlocking, or NULL. */
static ds_job *publish_locked(ds_loop *l, ds_job *j, bool *retired) {
    *retired = false;
    ds_request_state st;
    ds_error *e = ds_engine_request(l->engine, j->id, &st);
    if (e) { /* cannot happen for a job we have not released; if it does, the request ends */
        ds_api_errorf(&j->err, 500, NULL, "the engine lost the request: %s", ds_error_message(e));
        ds_error_free(e);
        j->finish_reason = "abort";
        *retired = true;
        return retire_locked(l, j, DS_JOB_FINISHED);
    }
    bool news = false;
    for (size_t k = j->n_seen; k < st.n_tokens && !j->stopped; k++) {
        append_id(j, st.tokens[k]);
        j->completion_tokens++;
        j->stopped = ds_text_stream_push(j->ts, st.tokens[k], &j->text);
        news = true;
    }
    j->n_seen = st.n_tokens;
    if (news && !j->first_seen) {
        j->first_seen = true;
        observe(&l->snap.ttft, ds_ttft_buckets, mono_s() - j->t_post);
    }
    const bool cancelled = j->cancel || l->cancel_all;
    if (!st.finished && !j->stopped && !cancelled) {
        if (news) {
            j->news = true;
            pthread_cond_broadcast(&j->cv);
        }
        return NULL;
    }
    /* It ends: text held back for a possible stop string goes out now. */
    if (!j->stopped) j->stopped = ds_text_stream_finish(j->ts, &j->text);
    if (j->stopped) j->finish_reason = "stop", l->snap.finished_stop++;
    else if (st.finished && st.finish_reason == DS_FINISH_STOP) j->finish_reason = "stop", l->snap.finished_stop++;
    else if (st.finished && st.finish_reason != DS_FINISH_CALLER) j->finish_reason = "length", l->snap.finished_length++;
    else j->finish_reason = "abort", l->snap.finished_abort++;
    observe(&l->snap.e2e, ds_e2e_buckets, mono_s() - j->t_post);
    /* Release cancels first when it still runs: its KV pages go back now. */
    ds_error_free(ds_engine_release(l->engine, j->id));
    *retired = true;
    return retire_locked(l, j, DS_JOB_FINISHED);
}

static void *engine_main(void *arg) {
    ds_loop *l = arg;
    for (;;) {
        pthread_mutex_lock(&l->mu);
        while (!l->stop && !l->inbox && !l->active && !l->poke && !(l->cancel_all && l->running))
            pthread_cond_wait(&l->wake, &l->mu);
        if (l->stop && !l->inbox && !l->running) {
            pthread_mutex_unlock(&l->mu);
            break;
        }
        l->poke = false;
        ds_job *batch = l->inbox;
        l->inbox = l->inbox_tail = NULL;
        l->n_inbox = 0;
        pthread_mutex_unlock(&l->mu);

        /* Admit in arrival order; a job cancelled (its client gone) or
         * caught by shutdown before it was submitted ends here. */
        while (batch) {
            ds_job *j = batch;
            batch = j->next;
            j->next = NULL;
            pthread_mutex_lock(&l->mu);
            bool drop = j->cancel || l->cancel_all;
            ds_job *dead = NULL;
            if (drop) {
                ds_api_errorf(&j->err, 503, NULL, "the request was cancelled before it started");
                j->finish_reason = "abort";
                l->snap.finished_abort++;
                dead = retire_locked(l, j, DS_JOB_REJECTED);
            }
            pthread_mutex_unlock(&l->mu);
            if (dead) job_free(dead);
            if (!drop) admit(l, j);
        }

        /* Cancellations first, so a gone client's pages are free for this step. */
        pthread_mutex_lock(&l->mu);
        for (ds_job *j = l->running; j; j = j->next)
            if (j->cancel || l->cancel_all) ds_error_free(ds_engine_cancel(l->engine, j->id));
        pthread_mutex_unlock(&l->mu);

        if (l->active) {
            int active = 0;
            ds_error *e = ds_engine_step(l->engine, &active);
            if (e) {
                /* A failed step fails the requests in flight, not the server. */
                fprintf(stderr, "dspark serve: engine step failed: %s\n", ds_error_message(e));
                pthread_mutex_lock(&l->mu);
                l->snap.step_errors++;
                for (ds_job *j = l->running; j; j = j->next) {
                    ds_api_errorf(&j->err, 500, NULL, "the engine failed: %s", ds_error_message(e));
                    ds_error_free(ds_engine_cancel(l->engine, j->id));
                }
                pthread_mutex_unlock(&l->mu);
                ds_error_free(e);
                active = 0;
            }
            l->active = active;
        }

        /* Publish: every running job's new text, retiring those that ended. */
        ds_job *dead = NULL;
        pthread_mutex_lock(&l->mu);
        for (ds_job **pj = &l->running; *pj;) {
            ds_job *j = *pj;
            bool retired;
            ds_job *d = publish_locked(l, j, &retired);
            if (retired) *pj = j->next;
            else pj = &j->next;
            if (d) d->next = dead, dead = d;
        }
        ds_engine_get_metrics(l->engine, &l->snap.m);
        if (!l->running) l->active = 0;
        pthread_mutex_unlock(&l->mu);
        while (dead) {
            ds_job *n = dead->next;
            job_free(dead);
            dead = n;
        }
    }
    return NULL;
}

/* ---- life ----------------------------------------------------------------- */

ds_error *ds_loop_start(ds_engine *e, const ds_loop_opts *o, ds_loop **out) {
    *out = NULL;
    if (!ds_engine_tokenizer(e))
        return ds_errorf("the server needs a tokenizer: the model directory has no tokenizer.json (give --tokenizer)");
    if (!(o->max_live >= 1 && o->ctx >= 2 && o->default_max_tokens >= 1))
        return ds_errorf("server limits out of range (max_live %d, ctx %d, default max_tokens %d)", o->max_live,
                         o->ctx, o->default_max_tokens);
    ds_loop *l = calloc(1, sizeof *l);
    if (!l) return ds_errorf("out of memory");
    l->engine = e;
    l->tok = ds_engine_tokenizer(e);
    l->o = *o;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->wake, NULL);
    cond_init_monotonic(&l->idle);
    ds_engine_get_metrics(e, &l->snap.m);
    /* Whether the model has a chat template: one render tells (before the
     * engine thread exists, so this thread may still touch the engine). */
    char *probe = NULL;
    ds_error *pe = ds_engine_chat_render(e, &(ds_chat_message){"user", "hi"}, 1, &probe);
    l->plain_chat = pe != NULL;
    ds_error_free(pe);
    free(probe);
    int rc = pthread_create(&l->thread, NULL, engine_main, l);
    if (rc) {
        ds_loop_free(l);
        return ds_errorf("cannot start the engine thread: %s", strerror(rc));
    }
    l->thread_started = true;
    *out = l;
    return NULL;
}

void ds_loop_free(ds_loop *l) {
    if (!l) return;
    if (l->thread_started) {
        pthread_mutex_lock(&l->mu);
        l->draining = l->cancel_all = l->stop = true;
        pthread_cond_signal(&l->wake);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
    }
    pthread_cond_destroy(&l->wake);
    pthread_cond_destroy(&l->idle);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

void ds_loop_snapshot_get(ds_loop *l, ds_loop_snapshot *s) {
    pthread_mutex_lock(&l->mu);
    *s = l->snap;
    s->inbox = l->n_inbox;
    s->live = l->live;
    s->draining = l->draining;
    pthread_mutex_unlock(&l->mu);
}

void ds_loop_begin_drain(ds_loop *l) {
    pthread_mutex_lock(&l->mu);
    l->draining = true;
    pthread_mutex_unlock(&l->mu);
}

bool ds_loop_plain_chat(const ds_loop *l) { return l->plain_chat; }

bool ds_loop_draining(ds_loop *l) {
    pthread_mutex_lock(&l->mu);
    bool d = l->draining;
    pthread_mutex_unlock(&l->mu);
    return d;
}

int ds_loop_wait_idle(ds_loop *l, double seconds) {
    struct timespec dl = deadline_in(seconds > 0 ? seconds : 0);
    pthread_mutex_lock(&l->mu);
    while (l->live > 0 && pthread_cond_timedwait(&l->idle, &l->mu, &dl) != ETIMEDOUT) {
    }
    int left = l->live;
    pthread_mutex_unlock(&l->mu);
    return left;
}

void ds_loop_cancel_all(ds_loop *l) {
    pthread_mutex_lock(&l->mu);
    l->draining = l->cancel_all = true;
    pthread_cond_signal(&l->wake);
    while (l->live > 0) pthread_cond_wait(&l->idle, &l->mu);
    pthread_mutex_unlock(&l->mu);
}
