/* The CPU backend's sampling ops (backend.h probs, sample, verify_sample,
 * markov_sample). The math is src/sample/'s (probs, draw, verify), called
 * row by row on the tensors' memory: one host implementation, which the
 * GPU backend's ops are checked against. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "base/dtype.h"
#include "sample/draw.h"
#include "sample/probs.h"
#include "sample/verify.h"

static const float *row_of(ds_tensor t, int64_t r) { return (const float *)t.data + r * t.stride; }

/* The ops sample (T > 0): greedy decisions have their own ops. */
static bool sampling_ok(ds_backend *be, const char *op, const ds_sampling *s) {
    if (!ds_sampling_greedy(s)) return true;
    ds_cpu_fail(be, op, "temperature %g is greedy (argmax / markov_greedy decide those)", (double)s->temperature);
    return false;
}

void ds_cpu_probs(ds_backend *be, ds_tensor out, ds_tensor logits, const ds_sampling *s) {
    if (!sampling_ok(be, "probs", s)) return;
    if (out.rows != logits.rows || out.cols != logits.cols) {
        ds_cpu_fail(be, "probs", "out %lldx%lld for logits %lldx%lld", (long long)out.rows, (long long)out.cols,
                    (long long)logits.rows, (long long)logits.cols);
        return;
    }
    for (int64_t r = 0; r < out.rows; r++)
        ds_probs_from_logits(row_of(logits, r), (int)logits.cols, s, (float *)out.data + r * out.stride);
}

void ds_cpu_sample(ds_backend *be, ds_tensor probs, const double *u, int32_t *out) {
    for (int64_t r = 0; r < probs.rows; r++) out[r] = ds_sample_probs_u(row_of(probs, r), (int)probs.cols, u[r]);
}

void ds_cpu_verify_sample(ds_backend *be, ds_tensor logits, const int32_t *draft, int n, ds_tensor draft_probs,
                          const ds_sampling *s, const double *u, int32_t *out) {
    out[0] = 0;
    out[1] = 0;
    if (!sampling_ok(be, "verify_sample", s)) return;
    const int64_t V = logits.cols;
    if (n < 0 || n > DS_VERIFY_MAX_DRAFT || logits.rows < n + 1 ||
        (n > 0 && (draft_probs.rows < n || draft_probs.cols != V))) {
        ds_cpu_fail(be, "verify_sample", "%d drafts (at most %d) for logits %lldx%lld and draft probs %lldx%lld", n,
                    DS_VERIFY_MAX_DRAFT, (long long)logits.rows, (long long)V, (long long)draft_probs.rows,
                    (long long)draft_probs.cols);
        return;
    }
    float *scratch = malloc((size_t)(2 * V) * sizeof *scratch);
    if (!scratch) {
        ds_cpu_fail(be, "verify_sample", "out of memory for %lld floats", (long long)(2 * V));
        return;
    }
    int32_t next;
    out[0] = ds_verify_uniforms(logits.data, (size_t)logits.stride, (int)V, draft, n,
                                n > 0 ? draft_probs.data : NULL, n > 0 ? (size_t)draft_probs.stride : 0, s, u,
                                scratch, &next);
    out[1] = next;
    free(scratch);
}

/* The host walk of draft/markov.c, step by step on this backend's own ops
 * (embed, the 1-row linear), so the bias of every step is the same bits. */
void ds_cpu_markov_sample(ds_backend *be, ds_tensor base, ds_tensor out, ds_tensor probs, ds_tensor w1, ds_tensor w2,
                          bool bf16, int32_t anchor, const ds_sampling *s, const double *u, ds_tensor emb,
                          int32_t *tokens) {
    if (!sampling_ok(be, "markov_sample", s)) return;
    const int64_t G = base.rows, V = base.cols;
    const bool markov = w1.data != NULL, keep = out.data != NULL;
    char why[256];
    if (!ds_markov_sample_fits(base, out, probs, w1, w2, emb, why, sizeof why)) {
        ds_cpu_fail(be, "markov_sample", "%s", why);
        return;
    }
    /* The bias row, and the corrected logits when out does not keep them. */
    float *bias = markov ? malloc((size_t)V * sizeof *bias) : NULL;
    float *row = markov && !keep ? malloc((size_t)V * sizeof *row) : NULL;
    if (markov && (!bias || (!keep && !row))) {
        ds_cpu_fail(be, "markov_sample", "out of memory for %lld floats", (long long)(2 * V));
        free(bias);
        free(row);
        return;
    }
    const ds_tensor bt = {DS_F32, bias, 1, V, V, false, {0, 0, NULL, NULL}};
    int32_t prev = anchor;
    for (int64_t k = 0; k < G; k++) {
        const float *b = row_of(base, k);
        float *l = keep ? (float *)out.data + k * out.stride : row;
        if (markov) {
            ds_tensor ek = ds_rows(emb, k, 1);
            be->ops->embed(be, ek, w1, &prev, 1.0f);
            be->ops->linear(be, bt, ek, w2, ds_no_tensor());
            if (bf16) { /* bias and sum in bf16, as the reference */
                ds_round_bf16_n(bias, (size_t)V);
                for (int64_t i = 0; i < V; i++) l[i] = b[i] + bias[i];
                ds_round_bf16_n(l, (size_t)V);
            } else {
                for (int64_t i = 0; i < V; i++) l[i] = b[i] + bias[i];
            }
        } else if (keep) {
            memcpy(l, b, (size_t)V * sizeof *l);
        } else {
            l = (float *)b; /* no head: the base logits are the corrected ones (read only) */
        }
        float *pk = (float *)probs.data + k * probs.stride;
        ds_probs_from_logits(l, (int)V, s, pk);
        prev = ds_sample_probs_u(pk, (int)V, u[k]);
        tokens[k] = prev;
    }
    free(bias);
    free(row);
}
