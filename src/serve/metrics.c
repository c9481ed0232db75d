#include "serve/metrics.h"

#include <stdio.h>
#include <string.h>

#include "serve/openai_json.h"

int ds_http_class(int status) {
    if (status < 400) return 0;
    if (status == 401) return 2;
    if (status == 429) return 3;
    if (status == 503) return 4;
    if (status >= 500) return 5;
    return 1;
}

/* One metric's HELP and TYPE lines. */
static void meta(ds_sbuf *o, const char *name, const char *type, const char *help) {
    ds_sbuf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{model_name="M"[,extra]} value */
static void sample(ds_sbuf *o, const char *name, const char *label, const char *extra, double v) {
    ds_sbuf_printf(o, "%s{model_name=%s%s%s} %.17g\n", name, label, extra ? "," : "", extra ? extra : "", v);
}

/* _bucket{le=...} cumulative counts, +Inf, _sum, _count. */
static void histogram(ds_sbuf *o, const char *name, const char *help, const char *label, const ds_histogram *h,
                      const double *bounds) {
    meta(o, name, "histogram", help);
    int64_t cum = 0;
    for (int b = 0; bounds[b] > 0 && b < DS_HIST_MAX_BUCKETS; b++) {
        cum += h->counts[b];
        ds_sbuf_printf(o, "%s_bucket{model_name=%s,le=\"%g\"} %lld\n", name, label, bounds[b], (long long)cum);
    }
    ds_sbuf_printf(o, "%s_bucket{model_name=%s,le=\"+Inf\"} %lld\n", name, label, (long long)h->count);
    ds_sbuf_printf(o, "%s_sum{model_name=%s} %.9g\n", name, label, h->sum);
    ds_sbuf_printf(o, "%s_count{model_name=%s} %lld\n", name, label, (long long)h->count);
}

void ds_metrics_text(ds_sbuf *o, const char *model, const ds_loop_snapshot *s, const ds_http_counts *h,
                     int positions) {
    /* The model name as a label value: JSON string escaping is also
     * Prometheus's (\\, \", \n). */
    ds_sbuf label = {0};
    ds_json_string(&label, model, strlen(model));
    const char *L = ds_sbuf_str(&label);
    const ds_engine_metrics *m = &s->m;

    meta(o, "vllm:num_requests_running", "gauge", "Requests in the engine holding KV pages.");
    sample(o, "vllm:num_requests_running", L, NULL, m->running);
    meta(o, "vllm:num_requests_waiting", "gauge", "Requests waiting to be admitted (queued or preempted).");
    sample(o, "vllm:num_requests_waiting", L, NULL, m->waiting + s->inbox);
    meta(o, "vllm:kv_cache_usage_perc", "gauge", "Fraction of the KV page pool in use (1 = full).");
    sample(o, "vllm:kv_cache_usage_perc", L, NULL,
           m->kv_pages_total > 0 ? (double)m->kv_pages_used / m->kv_pages_total : 0);
    meta(o, "dspark:kv_cache_pages", "gauge", "KV pool pages by state; each page holds dspark:kv_cache_page_rows tokens.");
    sample(o, "dspark:kv_cache_pages", L, "state=\"used\"", m->kv_pages_used);
    sample(o, "dspark:kv_cache_pages", L, "state=\"total\"", m->kv_pages_total);
    meta(o, "dspark:kv_cache_page_rows", "gauge", "Tokens a KV page holds.");
    sample(o, "dspark:kv_cache_page_rows", L, NULL, m->kv_page_rows);
    meta(o, "vllm:prompt_tokens_total", "counter", "Prefilled prompt tokens (recomputation after preemption included).");
    sample(o, "vllm:prompt_tokens_total", L, NULL, (double)m->prompt_tokens);
    meta(o, "vllm:generation_tokens_total", "counter", "Generated tokens committed.");
    sample(o, "vllm:generation_tokens_total", L, NULL, (double)m->generation_tokens);
    meta(o, "vllm:num_preemptions_total", "counter", "Requests whose KV pages were taken back and later recomputed.");
    sample(o, "vllm:num_preemptions_total", L, NULL, (double)m->preemptions);
    meta(o, "dspark:engine_steps_total", "counter", "Engine steps (one target forward each).");
    sample(o, "dspark:engine_steps_total", L, NULL, (double)m->steps);
    meta(o, "vllm:request_success_total", "counter", "Requests finished, by finish reason.");
    sample(o, "vllm:request_success_total", L, "finished_reason=\"stop\"", (double)s->finished_stop);
    sample(o, "vllm:request_success_total", L, "finished_reason=\"length\"", (double)s->finished_length);
    sample(o, "vllm:request_success_total", L, "finished_reason=\"abort\"", (double)s->finished_abort);
    meta(o, "dspark:requests_rejected_total", "counter", "Requests refused at admission (prompt too long, bad ids, ...).");
    sample(o, "dspark:requests_rejected_total", L, NULL, (double)s->rejected);

    meta(o, "vllm:spec_decode_num_drafts_total", "counter", "Verify rounds that verified at least one drafted token.");
    sample(o, "vllm:spec_decode_num_drafts_total", L, NULL, (double)m->drafts);
    meta(o, "vllm:spec_decode_num_draft_tokens_total", "counter", "Drafted tokens sent to verification.");
    sample(o, "vllm:spec_decode_num_draft_tokens_total", L, NULL, (double)m->draft_tokens);
    meta(o, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Drafted tokens the target accepted.");
    sample(o, "vllm:spec_decode_num_accepted_tokens_total", L, NULL, (double)m->accepted_tokens);
    meta(o, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Rounds whose drafted token at this position was accepted.");
    if (positions > DS_METRICS_POSITIONS) positions = DS_METRICS_POSITIONS;
    for (int k = 0; k < positions; k++) {
        char pos[32];
        snprintf(pos, sizeof pos, "position=\"%d\"", k);
        sample(o, "vllm:spec_decode_num_accepted_tokens_per_pos_total", L, pos, (double)m->accepted_per_pos[k]);
    }

    histogram(o, "vllm:time_to_first_token_seconds", "Seconds from a request's arrival to its first token.", L,
              &s->ttft, ds_ttft_buckets);
    histogram(o, "vllm:e2e_request_latency_seconds", "Seconds from a request's arrival to its end.", L, &s->e2e,
              ds_e2e_buckets);

    static const char *const classes[] = DS_HTTP_CLASSES;
    meta(o, "dspark:http_responses_total", "counter", "HTTP responses by status class.");
    for (int c = 0; c < 6; c++) {
        char st[32];
        snprintf(st, sizeof st, "status=\"%s\"", classes[c]);
        sample(o, "dspark:http_responses_total", L, st, (double)h->by_status[c]);
    }
    meta(o, "dspark:draining", "gauge", "1 while the server shuts down (new requests get 503).");
    sample(o, "dspark:draining", L, NULL, s->draining);
    ds_sbuf_free(&label);
}
