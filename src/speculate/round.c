#include "speculate/round.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"

ds_error *ds_round_fetch_logits(ds_target *t, int rows, float *logits) {
    ds_target_logits_sync(t);
    t->be->ops->download(t->be, ds_rows(t->logits, 0, rows), logits);
    return ds_backend_check(t->be);
}

/* The n + 1 uniforms ds_verify would draw, drawn here in its order, go
 * down; the accepted count and the next token come back. */
_Static_assert(DS_MAX_GAMMA <= DS_VERIFY_MAX_DRAFT, "a round's drafts fit a verification");
ds_error *ds_round_verify_sample(ds_target *t, int64_t row0, const int32_t *draft, int n, ds_tensor draft_probs,
                                 const ds_sampling *s, ds_rng *rng, int *accepted, int32_t *next) {
    double u[DS_VERIFY_MAX_DRAFT + 1];
    for (int i = 0; i <= n; i++) u[i] = ds_rng_uniform(rng);
    int32_t res[2];
    ds_target_logits_sync(t);
    ds_spec(t->be)->verify_sample(t->be, ds_rows(t->logits, row0, n + 1), draft, n,
                              n > 0 ? ds_rows(draft_probs, 0, n) : ds_no_tensor(), s, u, res);
    DS_TRY(ds_backend_check(t->be));
    *accepted = res[0];
    *next = res[1];
    return NULL;
}

ds_error *ds_round_verify_sample_many(ds_target *t, int m, const ds_round_verify_req *req, int *accepted,
                                      int32_t *next) {
    if (m <= 0) return NULL;
    if (!ds_spec(t->be)->verify_sample_many) {
        for (int i = 0; i < m; i++)
            DS_TRY(ds_round_verify_sample(t, req[i].row0, req[i].draft, req[i].n, req[i].draft_probs, req[i].s,
                                          req[i].rng, &accepted[i], &next[i]));
        return NULL;
    }
    const size_t per = DS_VERIFY_MAX_DRAFT + 1;
    double *u = malloc((size_t)m * per * sizeof *u);
    ds_verify_job *jobs = malloc((size_t)m * sizeof *jobs);
    int32_t *res = malloc((size_t)m * 2 * sizeof *res);
    ds_error *e = NULL;
    if (!u || !jobs || !res) e = ds_errorf("out of memory for %d verifications", m);
    for (int i = 0; i < m && !e; i++) {
        const int n = req[i].n;
        if (n < 0 || n > DS_VERIFY_MAX_DRAFT) {
            e = ds_errorf("verification of %d drafts (at most %d)", n, DS_VERIFY_MAX_DRAFT);
            break;
        }
        for (int k = 0; k <= n; k++) u[i * per + k] = ds_rng_uniform(req[i].rng);
        jobs[i] = (ds_verify_job){.logits = ds_rows(t->logits, req[i].row0, n + 1),
                                  .draft_probs = n > 0 ? ds_rows(req[i].draft_probs, 0, n) : ds_no_tensor(),
                                  .draft = req[i].draft, .n = n, .s = req[i].s, .u = u + i * per};
    }
    if (!e) {
        ds_target_logits_sync(t);
        ds_spec(t->be)->verify_sample_many(t->be, m, jobs, res);
        e = ds_backend_check(t->be);
    }
    for (int i = 0; i < m && !e; i++) accepted[i] = res[2 * i], next[i] = res[2 * i + 1];
    free(u), free(jobs), free(res);
    return e;
}

_Static_assert(DS_MAX_GAMMA + 2 <= DS_TARGET_STEP_MIN, "a verify step's ids and outputs fit the target's step");
ds_error *ds_round_verify_greedy(ds_target *t, int32_t anchor, const ds_proposal *prop, int gamma, int cap, int pos0,
                                 int32_t *best, int *n_out, int *accepted) {
    const int rows = cap + 1, n_kept = prop->n_kept;
    if (gamma < 1 || gamma + 2 > DS_TARGET_STEP_MIN || cap < 0 || cap > gamma || n_kept < 0 || n_kept > gamma + 1)
        return ds_errorf("greedy verification of %d of %d drafts (%d kept on the backend) is out of range", cap, gamma,
                         n_kept);
    if (n_kept > 0 && !t->graph_safe)
        return ds_errorf("greedy verification: the drafts were kept on the backend, but this target's forward does not "
                         "run as a step region (it reads its ids on the host)");
    if (rows > t->max_rows || rows > t->max_logit_rows)
        return ds_errorf("greedy verification of %d rows (at most %d, logits for %d)", rows, t->max_rows,
                         t->max_logit_rows);
    if (pos0 < 0 || pos0 > t->n_cached)
        return ds_errorf("forward at position %d but the KV cache holds only %d positions", pos0, t->n_cached);
    if (pos0 + rows > t->max_ctx)
        return ds_errorf("sequence of %d tokens exceeds the model's context of %d", pos0 + rows, t->max_ctx);
    /* The step's ids: [anchor, draft_0 .. draft_{gamma-1}, n], the first
     * n_kept entries after the anchor taken from the drafter's step. */
    ds_step *st = &t->step;
    st->ids[0] = anchor;
    memcpy(st->ids + 1, prop->tokens, (size_t)gamma * sizeof *st->ids);
    st->ids[gamma + 1] = prop->n;
    for (int i = 0; i < rows; i++) DS_TRY(ds_target_check_id(t, st->ids[i]));
    /* The drafts stay as they are: acceptance compares them with the
     * argmaxes (an accepted placeholder is refused below). */
    ds_target_embed_ids(t, st->ids, 1);
    t->n_cached = pos0;
    for (int i = 0; i < rows; i++) st->pos[i] = pos0 + i;
    st->n_keys = pos0 + rows;
    st->n_ids = gamma + 2;
    st->n_pos = rows;
    st->n_out = rows + 2; /* the argmaxes, then m and a */
    st->keep_out = st->out_kept = false;
    st->ids_prev_at = 1;
    st->n_ids_prev = n_kept;
    /* The architecture's host checks and bookkeeping, as for a forward (a
     * sliding ring's rows must be marked, or a later call refuses them, and
     * a rewind past what the ring holds must be refused here too). Drafts
     * kept on the backend are not on the host to check. */
    if (t->ops->prepare) DS_TRY(t->ops->prepare(t, n_kept ? NULL : st->ids, rows, pos0));
    ds_region_key key = {DS_REGION_TARGET, rows,
                         rows | 1 << 16 | (t->logits_bf16 ? 1 << 17 : 0) | t->n_taps << 18 | 1 << 28, t};
    ds_backend *be = t->be;
    ds_error *e = NULL;
    if (!t->graph_safe || ds_region_begin(be, &key, st)) {
        e = t->ops->forward(t, st->ids, rows, pos0, rows);
        if (!e) {
            ds_target_argmax(t, rows, st->out);
            ds_accept_prefix(be, st->ids + 1, st->out, cap, st->ids + gamma + 1, st->out + rows);
        }
    }
    if (t->graph_safe) ds_region_end(be);
    st->n_ids_prev = 0;
    if (e) return e;
    DS_TRY(ds_backend_check(be));
    const int m = st->out[rows], a = st->out[rows + 1];
    if (m < 0 || m > cap || a < 0 || a > m || st->out[a] < 0 || st->out[a] >= t->vocab)
        return ds_errorf("greedy verification came back inconsistent (%d of %d drafts proposed, %d accepted, next "
                         "token %d)", m, cap, a, a >= 0 && a <= cap ? st->out[a] : -1);
    /* Rows after an accepted placeholder draft embedded the placeholder's
     * own row, not pad: their argmaxes are not the reference's. */
    for (int i = 0; i < a; i++)
        if (ds_target_placeholder_of(t, st->out[i]))
            return ds_errorf("greedy verification accepted draft token %d, the placeholder of config field %s, "
                             "which the model embeds as pad token %d: the drafts are scored as drafted, so the "
                             "next rows would be wrong",
                             st->out[i], ds_target_placeholder_of(t, st->out[i]), t->pad_id);
    memcpy(best, st->out, (size_t)rows * sizeof *best);
    *n_out = m;
    *accepted = a;
    t->n_cached = pos0 + rows;
    return NULL;
}

ds_error *ds_round(ds_target *t, ds_drafter *d, const ds_round_params *p, bool keep_on_backend, ds_rng *rng,
                   ds_round_state *st, ds_round_result *out) {
    const int G = d->gamma;
    const int gamma = p->gamma > 0 && p->gamma < G ? p->gamma : G;
    const bool greedy = ds_sampling_greedy(&p->sampling) && !p->verify;
    memset(out, 0, sizeof *out);

    /* Draft: the pending context rows, then a block after the anchor. */
    const double t0 = ds_now_s();
    ds_proposal prop;
    DS_TRY(ds_drafter_round(d, t->taps, st->ctx_pos0, st->ctx_n, st->anchor, st->start, &p->sampling, p->threshold,
                            keep_on_backend, rng, &prop));
    st->ctx_n = 0;
    out->has_conf = d->confidence && !keep_on_backend;
    if (out->has_conf) memcpy(out->conf_logit, prop.conf_logit, (size_t)G * sizeof *out->conf_logit);

    /* Verify and accept, in one target forward. The verified rows must fit
     * the context. */
    const int cap = gamma < t->max_ctx - st->start - 1 ? gamma : t->max_ctx - st->start - 1;
    int n = prop.n < cap ? prop.n : cap, a;
    int32_t next;
    const double t1 = ds_now_s();
    if (greedy) {
        /* With the proposal length on the backend, all cap drafts are
         * scored (rows past it leave the first rows' argmaxes unchanged). */
        int32_t best[DS_MAX_GAMMA + 1];
        DS_TRY(ds_round_verify_greedy(t, st->anchor, &prop, G, prop.n_kept > G ? cap : n, st->start, best, &n, &a));
        memcpy(prop.tokens, best, (size_t)a * sizeof *best); /* the accepted drafts (kept ones were not here) */
        next = best[a];
    } else {
        int32_t ids[DS_MAX_GAMMA + 1];
        ids[0] = st->anchor;
        memcpy(ids + 1, prop.tokens, (size_t)n * sizeof *ids);
        if (!p->verify && ds_spec(t->be)->verify_sample && prop.probs_dev.data) {
            DS_TRY(ds_target_forward(t, ids, n + 1, st->start, n + 1));
            DS_TRY(ds_round_verify_sample(t, 0, prop.tokens, n, prop.probs_dev, &p->sampling, rng, &a, &next));
        } else {
            DS_TRY(ds_drafter_host_probs(d, &prop)); /* a host verifier reads them there */
            DS_TRY(ds_target_forward(t, ids, n + 1, st->start, n + 1));
            DS_TRY(ds_round_fetch_logits(t, n + 1, p->logits));
            a = (p->verify ? p->verify : ds_verify)(p->logits, t->vocab, prop.tokens, n, prop.probs, &p->sampling,
                                                    rng, p->scratch, &next);
        }
    }
    out->draft_s = t1 - t0;
    out->verify_s = ds_now_s() - t1;

    /* A stop token among the accepted drafts ends the output after it: no
     * target token, and nothing more to commit. */
    memcpy(out->tokens, prop.tokens, (size_t)a * sizeof *out->tokens);
    for (int i = 0; i < a && !p->ignore_stop; i++)
        if (ds_target_is_stop(t, prop.tokens[i])) {
            out->n_tokens = out->accepted = out->proposed = i + 1;
            out->stop_draft = true;
            return NULL;
        }
    out->tokens[a] = next;
    out->n_tokens = a + 1;
    out->accepted = a;
    out->proposed = n;

    /* Commit: the target keeps the anchor's and the accepted drafts' rows,
     * whose taps become the drafter's context at its next round. */
    ds_target_crop(t, st->start + a + 1);
    st->ctx_pos0 = st->start;
    st->ctx_n = a + 1;
    st->start += a + 1;
    st->anchor = next;
    return NULL;
}
