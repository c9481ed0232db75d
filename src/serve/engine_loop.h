/* The one engine thread. The engine is not thread-safe (include/dspark.h),
 * so exactly this thread touches it: it tokenizes prompts (chat templates
 * included), submits, steps, reads each request's committed tokens, turns
 * them into text (detokenizer, stop strings), cancels and releases. HTTP
 * threads talk to it through a mutex-protected inbox (new requests,
 * cancellations) and read each request's mailbox (text and ids not yet
 * taken, its phase), each waiting on its own condition variable.
 *
 * A job is shared by the HTTP side and the engine thread, reference
 * counted: the engine thread drops its reference when the request leaves
 * the engine, the HTTP side when its connection is done. */
#ifndef DS_SERVE_ENGINE_LOOP_H
#define DS_SERVE_ENGINE_LOOP_H

#include <stdbool.h>
#include <stdint.h>

#include "dspark.h"
#include "serve/api_error.h"
#include "serve/request.h"
#include "serve/sbuf.h"

typedef struct ds_loop ds_loop;
typedef struct ds_job ds_job;

typedef struct {
    int max_live;            /* requests in the server at once, running and queued; one more is a 429 */
    int ctx;                 /* tokens a request may hold, prompt and output */
    int default_max_tokens;  /* when a request gives no max_tokens (capped by what the context leaves) */
    float threshold;         /* the engine's confidence threshold and gamma, as dspark generate's flags */
    int gamma;
} ds_loop_opts;

ds_error *ds_loop_start(ds_engine *e, const ds_loop_opts *o, ds_loop **out);
/* Cancels whatever is left, stops the thread and frees the loop (jobs still
 * referenced by the HTTP side stay valid until they are unreferenced). */
void ds_loop_free(ds_loop *l);

/* Hands a parsed request to the engine thread; takes *req (zeroed). NULL:
 * *err is a 429 (the server holds max_live requests) or a 503 (draining).
 * The job comes with one reference for the caller. */
ds_job *ds_loop_post(ds_loop *l, ds_serve_request *req, ds_api_error *err);

typedef enum {
    DS_JOB_ADMITTING, /* in the inbox: not yet tokenized and submitted */
    DS_JOB_REJECTED,  /* err says why (a 400: prompt too long, bad ids, ...) */
    DS_JOB_RUNNING,   /* submitted: waiting or running in the engine */
    DS_JOB_FINISHED,  /* finish_reason says how (err.status != 0: the engine failed) */
} ds_job_phase;

typedef struct {
    ds_job_phase phase;
    ds_sbuf text;              /* text new since the last take (the caller frees it) */
    int32_t *ids;              /* token ids new since the last take (the caller frees them) */
    size_t n_ids;
    const char *finish_reason; /* "stop", "length" or "abort", once finished */
    int prompt_tokens, completion_tokens;
    ds_api_error err;
} ds_job_update;

/* Takes what is new, waiting up to timeout_ms for something to be
 * (0: does not wait). Returns whether anything changed. */
bool ds_job_take(ds_job *j, int timeout_ms, ds_job_update *u);
/* Asks the engine thread to end the job now (its KV pages go back at the
 * engine's next turn); harmless on a finished job. */
void ds_job_cancel(ds_job *j);
/* Another reference (a streamed response holds its own). */
void ds_job_ref(ds_job *j);
void ds_job_unref(ds_job *j);
/* Waits up to timeout_ms while the job is still DS_JOB_ADMITTING, taking
 * nothing; returns its phase. */
ds_job_phase ds_job_wait_admitted(ds_job *j, int timeout_ms);
const ds_serve_request *ds_job_request(const ds_job *j);

/* A Prometheus histogram with fixed upper bounds (seconds). */
#define DS_HIST_MAX_BUCKETS 24
typedef struct {
    int64_t counts[DS_HIST_MAX_BUCKETS]; /* per bucket, not cumulative (metrics.c sums) */
    int64_t count;                       /* observations, the +Inf bucket */
    double sum;
} ds_histogram;
/* vLLM's bucket bounds for vllm:time_to_first_token_seconds and
 * vllm:e2e_request_latency_seconds; each list ends with a 0. */
extern const double ds_ttft_buckets[];
extern const double ds_e2e_buckets[];

/* What /metrics and /health report, copied by the engine thread after
 * every step (HTTP threads never call the engine). */
typedef struct {
    ds_engine_metrics m;
    int inbox;                   /* requests posted, not yet submitted */
    int live;                    /* posted and not finished */
    bool draining;
    int64_t finished_stop, finished_length, finished_abort, rejected;
    int64_t step_errors;
    ds_histogram ttft;           /* posted -> first token committed */
    ds_histogram e2e;            /* posted -> finished (stop, length or abort) */
} ds_loop_snapshot;
void ds_loop_snapshot_get(ds_loop *l, ds_loop_snapshot *s);

/* Whether chat requests use plain_chat.h's transcript (no chat template). */
bool ds_loop_plain_chat(const ds_loop *l);

/* Shutdown: refuse new requests from now on (503) ... */
void ds_loop_begin_drain(ds_loop *l);
bool ds_loop_draining(ds_loop *l);
/* ... wait up to `seconds` for the requests in flight to finish (returns
 * how many are left) ... */
int ds_loop_wait_idle(ds_loop *l, double seconds);
/* ... and cancel the rest (finish reason "abort"), waiting until the
 * engine has let them go. */
void ds_loop_cancel_all(ds_loop *l);

#endif
