/* The speculative ops: the drafter's Markov walks and the verifier's
 * decisions (where a proposal is cut, how much of it is accepted), run where
 * the values are so that a round moves a few ints to the host instead of
 * rows of logits. A separate, optional table (ds_backend_ops.spec): model
 * code never needs it, and a backend without one (or with some entries
 * NULL) gets the host versions in src/draft/ and src/sample/, which these
 * ops follow bit for bit. CPU and CUDA implement it. */
#ifndef DS_SPEC_OPS_H
#define DS_SPEC_OPS_H

#include "backend/backend.h"

/* The Markov bias bound of draft/markov_bound.h on the backend: for every
 * e, |w2[n] . e - coef[n] . (proj e)| <= radius[n] |e|, fp32 rounding of
 * those three dot products included. */
#define DS_MARKOV_BOUND_K 8 /* the most directions a bound may have */
#define DS_MARKOV_SEQS_MAX 32 /* sequences one markov_sample_seqs call takes */

/* One verification of verify_sample_many: verify_sample's operands. */
typedef struct {
    ds_tensor logits, draft_probs;
    const int32_t *draft;
    int n;
    const ds_sampling *s;
    const double *u;
} ds_verify_job;

typedef struct {
    ds_tensor proj;   /* [k, r] fp32 */
    ds_tensor coef;   /* [V, k] fp32 */
    ds_tensor radius; /* [1, V] fp32 */
} ds_markov_bound;

/* The latent of DeepSpec's gated and RNN Markov heads (markov_head.py):
 * position k's bias is w2 @ z_k instead of w2 @ e_k (e_k = w1[prev_k]), with
 * h_k the block's hidden row k and, in fp32 as draft/markov.c's host walk:
 *   gated: z_k = sigmoid(w [h_k; e_k] + b) * e_k          (w: gate_proj [r, H + r])
 *   rnn:   [g; c; o] = w [s; e_k; h_k] + b, z_k = tanh(o),  (w: joint_proj [3r, 2r + H])
 *          then s = sigmoid(g) s + (1 - sigmoid(g)) tanh(c); s = 0 before position 0. */
typedef enum { DS_LATENT_GATED = 1, DS_LATENT_RNN = 2 } ds_latent_kind;
typedef struct {
    ds_latent_kind kind;
    ds_tensor hidden; /* [G, H] fp32 */
    ds_tensor w, b;   /* the projection and its bias ([1, rows of w]) */
} ds_markov_latent;

struct ds_spec_ops {
    /* Greedy Markov walk over a drafted block (DSpark's vanilla head, or
     * none when w1.data is NULL), without a host round trip per position:
     * prev_0 = anchor; emb[k] = w1[prev_k]; out[k] = base[k] + emb[k] @ w2^T
     * (with bf16: round(base + round(bias)), as the reference computes it);
     * prev_{k+1} = argmax(out[k]) (ties to the lowest id) = tokens[k], on
     * the host when the call returns. out.data NULL: only the tokens are
     * wanted; then bound (or NULL) lets the backend skip rows that provably
     * cannot win. Optional: NULL runs the walk on the host
     * (draft/markov.c) with the same results. */
    void (*markov_greedy)(ds_backend *be, ds_tensor base, ds_tensor out, ds_tensor w1, ds_tensor w2,
                          const ds_markov_bound *bound, bool bf16, int32_t anchor, ds_tensor emb, int32_t *tokens);
    /* markov_greedy (tokens only) with its base logits still to compute:
     * base = x @ head^T, then round_bf16 with bf16, as linear and round_bf16
     * would write them; base [x.rows, V] is scratch the backend may fill. The
     * tokens are markov_greedy's; a backend may never write the whole of
     * base, bounding the head's products instead and computing only the rows
     * that may win (CUDA: head_bound.cu). Optional: NULL runs the three calls. */
    void (*markov_greedy_head)(ds_backend *be, ds_tensor x, ds_tensor head, ds_tensor base, bool bf16, ds_tensor w1,
                               ds_tensor w2, const ds_markov_bound *bound, int32_t anchor, ds_tensor emb,
                               int32_t *tokens);
    /* The greedy round's decisions where the values are (optional: NULL
     * runs the ds_* helpers' host versions below). conf_cut: out[0] = the
     * first row r of x (one column, fp32) with x[r] < cut[r] (cut: at least
     * x.rows rows of one fp32 column on the backend, a cutoff per position),
     * x.rows when none (a NaN never cuts).
     * accept_prefix: with m = min(n, max(*limit, 0)), out[0] = m and out[1]
     * = the least a < m with best[a] != draft[a], m when none (greedy
     * acceptance). Host arrays, or, inside a step region, pointers into the
     * step's ids / out (then the results come back at region_end). */
    void (*conf_cut)(ds_backend *be, ds_tensor x, ds_tensor cut, int32_t *out);
    void (*accept_prefix)(ds_backend *be, const int32_t *draft, const int32_t *best, int n, const int32_t *limit,
                          int32_t *out);
    /* ds_verify_uniforms: target logits [n+1, V] of the verify rows, the
     * draft tokens x[n] (host), draft_probs [n, V] processed drafter
     * distributions on the backend (unused when n = 0: then it is one draw
     * from logits row 0), u[n+1]; out[0] = accepted count, out[1] = the
     * next token, on the host when the call returns. n <= 64. */
    void (*verify_sample)(ds_backend *be, ds_tensor logits, const int32_t *draft, int n, ds_tensor draft_probs,
                          const ds_sampling *s, const double *u, int32_t *out);
    /* verify_sample for m jobs with one wait: out[2i], out[2i + 1] = job i's
     * accepted count and next token, the bits verify_sample gives it alone
     * (a batched step's requests, a wait for all instead of one each).
     * Optional: NULL runs verify_sample job by job. */
    void (*verify_sample_many)(ds_backend *be, int m, const ds_verify_job *jobs, int32_t *out);
    /* markov_greedy's walk (same operands, no bound), drawing instead of
     * taking the argmax: out[k] = the corrected logits (out.data NULL: not
     * wanted), probs[k] = their processed distribution, tokens[k] =
     * ds_sample_probs_u(probs[k], u[k]) = prev_{k+1}, on the host when the
     * call returns. u: one uniform per position, as the host walk draws. */
    void (*markov_sample)(ds_backend *be, ds_tensor base, ds_tensor out, ds_tensor probs, ds_tensor w1, ds_tensor w2,
                          bool bf16, int32_t anchor, const ds_sampling *s, const double *u, ds_tensor emb,
                          int32_t *tokens);
    /* markov_greedy (a vanilla head's walk, no corrected logits kept) for n
     * sequences with one wait: sequence j's block is rows j*G.. of base and
     * emb, its anchor anchors[j], its tokens tokens[j*G + k]; each sequence's
     * tokens and emb rows are markov_greedy's bits for it alone (its walk's
     * kernels, queued one sequence after another). Returns false, having
     * done nothing, where it does not apply (no head, n >
     * DS_MARKOV_SEQS_MAX). Optional. */
    bool (*markov_greedy_seqs)(ds_backend *be, int n, ds_tensor base, ds_tensor w1, ds_tensor w2,
                               const ds_markov_bound *bound, bool bf16, const int32_t *anchors, ds_tensor emb,
                               int32_t *tokens);
    /* markov_sample for n sequences at once (the batched drafter round):
     * sequence j's block is rows j*G..j*G+G-1 of base and emb (G =
     * base.rows / n), its anchor anchors[j], sampling s[j], uniforms
     * u[j*G + k], tokens tokens[j*G + k]; its distributions overwrite its
     * base rows (probs in place: row k is read before it is written), no
     * corrected logits are kept. Each sequence's tokens, distributions and
     * emb rows are the bits markov_sample gives it alone; w2 is read once a
     * position for all n. Returns false, having done nothing, where it does
     * not apply (shapes, rank, n > DS_MARKOV_SEQS_MAX): then a markov_sample
     * per sequence. Optional. */
    bool (*markov_sample_seqs)(ds_backend *be, int n, ds_tensor base, ds_tensor w1, ds_tensor w2, bool bf16,
                               const int32_t *anchors, const ds_sampling *const *s, const double *u, ds_tensor emb,
                               int32_t *tokens);
    /* markov_greedy and markov_sample with a gated or RNN head: the same
     * walks (emb[k] = w1[prev_k] still, the confidence head's input) with
     * w2 @ z_k (ds_markov_latent) as position k's bias; a greedy walk's
     * bound holds for any vector, z_k too. Optional: NULL runs the host walk
     * (draft/markov.c). */
    void (*markov_greedy_latent)(ds_backend *be, const ds_markov_latent *lat, ds_tensor base, ds_tensor out,
                                 ds_tensor w1, ds_tensor w2, const ds_markov_bound *bound, bool bf16, int32_t anchor,
                                 ds_tensor emb, int32_t *tokens);
    void (*markov_sample_latent)(ds_backend *be, const ds_markov_latent *lat, ds_tensor base, ds_tensor out,
                                 ds_tensor probs, ds_tensor w1, ds_tensor w2, bool bf16, int32_t anchor,
                                 const ds_sampling *s, const double *u, ds_tensor emb, int32_t *tokens);
};

/* A table of NULLs (spec_ops.c): every op on the host. */
#ifdef __cplusplus
extern "C" const ds_spec_ops ds_spec_ops_none;
#else
extern const ds_spec_ops ds_spec_ops_none;
#endif

/* The backend's speculative ops; ds_spec_ops_none where it has none. */
static inline const ds_spec_ops *ds_spec(const ds_backend *be) {
    return be->ops->spec ? be->ops->spec : &ds_spec_ops_none;
}

/* conf_cut and accept_prefix (see the ops), on the host where a backend has none. */
static inline void ds_conf_cut(ds_backend *be, ds_tensor x, ds_tensor cut, int32_t *out) {
    if (ds_spec(be)->conf_cut) {
        ds_spec(be)->conf_cut(be, x, cut, out);
        return;
    }
    float c, v;
    out[0] = (int32_t)x.rows;
    for (int64_t r = 0; r < x.rows; r++) {
        be->ops->download(be, ds_cols(ds_rows(x, r, 1), 0, 1), &v);
        be->ops->download(be, ds_cols(ds_rows(cut, r, 1), 0, 1), &c);
        if (v < c) {
            out[0] = (int32_t)r;
            break;
        }
    }
}
static inline void ds_accept_prefix_host(const int32_t *draft, const int32_t *best, int n, const int32_t *limit,
                                         int32_t *out) {
    const int m = n < *limit ? n : *limit > 0 ? *limit : 0;
    int a = 0;
    while (a < m && best[a] == draft[a]) a++;
    out[0] = m;
    out[1] = a;
}
static inline void ds_accept_prefix(ds_backend *be, const int32_t *draft, const int32_t *best, int n,
                                    const int32_t *limit, int32_t *out) {
    if (ds_spec(be)->accept_prefix) ds_spec(be)->accept_prefix(be, draft, best, n, limit, out);
    else ds_accept_prefix_host(draft, best, n, limit, out);
}

/* markov_sample's operands fit one another (base [G, V]; out, when kept,
 * and probs at least G rows of V; w2 [V, r], emb at least G rows of r with a
 * head): true, or false with what does not fit in msg[n] (each backend
 * reports it as its op's failure). */
static inline bool ds_markov_sample_fits(ds_tensor base, ds_tensor out, ds_tensor probs, ds_tensor w1, ds_tensor w2,
                                         ds_tensor emb, char *msg, size_t n) {
    const int64_t G = base.rows, V = base.cols;
    if ((!out.data || (out.rows >= G && out.cols == V)) && probs.rows >= G && probs.cols == V &&
        (!w1.data || (w2.rows == V && w2.cols == w1.cols && emb.rows >= G && emb.cols == w1.cols)))
        return true;
    snprintf(msg, n, "shapes do not match: base %lldx%lld, out %lldx%lld, probs %lldx%lld, w1 %lldx%lld, w2 %lldx%lld, "
             "emb %lldx%lld", (long long)G, (long long)V, (long long)out.rows, (long long)out.cols,
             (long long)probs.rows, (long long)probs.cols, (long long)w1.rows, (long long)w1.cols, (long long)w2.rows,
             (long long)w2.cols, (long long)emb.rows, (long long)emb.cols);
    return false;
}

#endif
