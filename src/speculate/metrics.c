#include "speculate/metrics.h"

void ds_metrics_add(ds_metrics *m, const ds_gen_result *r) {
    m->samples++;
    m->tokens += r->n_tokens;
    m->total_s += r->total_s;
    m->draft_s += r->draft_s;
    m->verify_s += r->verify_s;
    m->prefill_s += r->prefill_s;
    for (int i = 0; i < r->rounds; i++) {
        m->rounds++;
        m->accept_len_sum += r->accept_len[i];
        m->proposal_sum += r->proposed[i];
        m->accepted_sum += r->accepted[i];
        for (int k = 0; k < DS_MAX_GAMMA; k++) {
            if (r->proposed[i] > k) m->proposals_at[k]++;
            if (r->accepted[i] > k) m->accepted_at[k]++;
        }
    }
}

double ds_metrics_tau(const ds_metrics *m) { return m->rounds ? (double)m->accept_len_sum / m->rounds : 0; }

double ds_metrics_verify_rate(const ds_metrics *m) {
    return m->rounds ? (double)m->accept_len_sum / (double)(m->proposal_sum + m->rounds) : 0;
}

double ds_metrics_accept_rate_at(const ds_metrics *m, int k) {
    if (k < 0 || k >= DS_MAX_GAMMA) return -1; /* no proposal reaches past the arrays */
    return m->proposals_at[k] ? (double)m->accepted_at[k] / (double)m->proposals_at[k] : -1;
}
