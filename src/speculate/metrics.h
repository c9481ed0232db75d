/* Acceptance metrics pooled over a set of generations, with the meaning of
 * DeepSpec's build_metrics_row: tau = sum of per-round acceptance lengths /
 * rounds; verify_rate = accepted / (proposed + rounds); accept rate at k =
 * rounds that accepted more than k drafts / rounds that proposed more than k. */
#ifndef DS_METRICS_H
#define DS_METRICS_H

#include "draft/drafter.h"
#include "speculate/generate.h"

typedef struct {
    int samples, rounds;
    long accept_len_sum, proposal_sum, accepted_sum;
    long proposals_at[DS_MAX_GAMMA], accepted_at[DS_MAX_GAMMA];
    long tokens;
    double total_s, draft_s, verify_s, prefill_s;
} ds_metrics;

void ds_metrics_add(ds_metrics *m, const ds_gen_result *r);
double ds_metrics_tau(const ds_metrics *m);
double ds_metrics_verify_rate(const ds_metrics *m);
/* -1 where no round proposed more than k tokens (any k, negative or past DS_MAX_GAMMA included). */
double ds_metrics_accept_rate_at(const ds_metrics *m, int k);

#endif
