/* GET /metrics: Prometheus text exposition (format 0.0.4), named as vLLM
 * names its metrics so that dashboards and comparisons carry over:
 * vllm:num_requests_running, vllm:num_requests_waiting,
 * vllm:kv_cache_usage_perc (a fraction, as vLLM's), token counters, and
 * the speculative-decoding counters vllm:spec_decode_num_drafts_total,
 * ..._num_draft_tokens_total, ..._num_accepted_tokens_total and
 * ..._num_accepted_tokens_per_pos_total{position="k"}, and the latency
 * histograms vllm:time_to_first_token_seconds and
 * vllm:e2e_request_latency_seconds (vLLM's buckets). Every series
 * carries model_name, as vLLM's do. */
#ifndef DS_SERVE_METRICS_H
#define DS_SERVE_METRICS_H

#include <stdint.h>

#include "serve/engine_loop.h"
#include "serve/sbuf.h"

/* HTTP responses by status, counted by the HTTP layer. */
typedef struct {
    int64_t by_status[6]; /* in the order of DS_HTTP_CLASSES: below 400, other 4xx, 401, 429, 503, other 5xx */
} ds_http_counts;
#define DS_HTTP_CLASSES {"2xx", "4xx", "401", "429", "503", "5xx"}
/* Index into by_status for an HTTP status. */
int ds_http_class(int status);

void ds_metrics_text(ds_sbuf *out, const char *model, const ds_loop_snapshot *s, const ds_http_counts *h,
                     int positions);

#endif
