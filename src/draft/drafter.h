/* The drafter interface: a DSpark (or DFlash) drafter proposes up to gamma
 * tokens per round from one block forward (SPEC §4). The architecture file
 * (dspark_qwen3.c, dspark_gemma4.c; opened by drafter_archs.c) supplies the backbone; the
 * context projection, LM head, Markov chain, confidence and truncation are
 * shared (drafter.c, markov.c). */
#ifndef DS_DRAFTER_H
#define DS_DRAFTER_H

#include "backend/spec_ops.h"
#include "base/rng.h"
#include "draft/confidence.h"
#include "io/checkpoint.h"
#include "model/target.h"
#include "sample/sampling.h"

#define DS_MAX_GAMMA 32

typedef enum { DS_MARKOV_NONE = 0, DS_MARKOV_VANILLA, DS_MARKOV_GATED, DS_MARKOV_RNN } ds_markov_type;

typedef struct ds_drafter ds_drafter;

typedef struct {
    /* K/V of projected context rows ctx[n, hidden] at positions pos[0..n) (consecutive) into every layer's
     * cache. pos points into d->step (backend.h ds_step). */
    void (*context)(ds_drafter *d, ds_tensor ctx, const int32_t *pos);
    /* Backbone over ids[rows] at positions pos[rows] into out[rows, hidden] (final-normed): one block
     * (rows gamma, at start..; ids, pos point into d->step) or a batched round's blocks, gamma rows a
     * sequence. Not causal: row i sees keys 0..n_keys-1 (start+gamma = d->step.n_keys for one block), or
     * with d->pages->row_keys its own sequence's. The block's K/V are stored at pos first. */
    void (*block)(ds_drafter *d, int rows, const int32_t *ids, const int32_t *pos, int n_keys, ds_tensor out);
    /* Grows the work buffers for blocks of up to block_rows rows and context appends of up to ctx_rows
     * (a failure keeps the old ones; NULL: one sequence a pass only). */
    ds_error *(*reserve)(ds_drafter *d, int block_rows, int ctx_rows);
    void (*destroy)(ds_drafter *d);
} ds_drafter_ops;

struct ds_drafter {
    const ds_drafter_ops *ops;
    ds_backend *be;
    ds_checkpoint *ck;
    const char *arch; /* "Qwen3DSparkModel", "Gemma4DSparkModel" */
    int vocab, hidden, gamma, mask_id, max_ctx, max_rows;
    int n_taps, tap_layers[DS_MAX_TAPS], num_target_layers;
    int n_ctx;         /* context rows held: positions 0..n_ctx-1 */
    float eps;         /* hidden_norm epsilon */
    float logit_softcap; /* 0 = none (Gemma4 drafters soft-cap before the Markov bias) */
    bool logits_bf16;    /* bf16 checkpoint: logits, bias, their sum and the confidence rounded to bf16 */
    ds_markov_type markov;
    int markov_rank;
    bool confidence, confidence_with_markov;
    ds_tensor embed, fc, hidden_norm, lm_head;
    ds_tensor markov_w1, markov_w2, gate_w, gate_b, joint_w, joint_b;
    ds_markov_bound markov_bound; /* the bias bound (markov_bound.h) device walks skip rows by */
    ds_tensor conf_w, conf_b;
    /* Work buffers. */
    ds_tensor ctx;          /* [max_rows, hidden] projected context rows */
    ds_tensor block_hidden; /* [gamma, hidden] */
    ds_tensor logits;       /* [gamma, vocab] base logits */
    ds_tensor mlogits;      /* [gamma, vocab] Markov-corrected logits, when the backend walks on the device */
    ds_tensor probs;        /* [gamma, vocab] processed draft distributions, when the backend samples (markov_sample) */
    /* Greedy proposals walked on the device leave the corrected logits there;
     * set this to have propose() copy them to the host too (out->logits). */
    bool keep_logits;
    ds_tensor conf_cut;     /* [gamma, 1]: per position, the fp32 confidence logit below which a proposal is cut (conf_cut_t's) */
    float conf_cut_t;       /* the threshold conf_cut holds the cutoff of (0: none yet) */
    float conf_temp[DS_MAX_GAMMA]; /* STS temperature per position (1: the head as it is) */
    ds_tensor step_in, step_out; /* small Markov/confidence vectors */
    float *host_logits;     /* [gamma, vocab] Markov-corrected logits */
    float *host_probs;      /* [gamma, vocab] processed draft distributions */
    float *host_hidden;     /* [gamma, hidden] */
    float *host_bias;       /* [vocab] */
    float *host_prev;       /* [gamma, markov_rank] markov_w1[prev_k] */
    float *host_feat;       /* [2*markov_rank + hidden + 1] head inputs */
    float *host_proj;       /* [3*markov_rank + 1] head projections */
    float *host_state;      /* [markov_rank + 1] RNN head state */
    /* A round's per-step values (block ids, context and block positions, the
     * key count; the walked tokens), read by the architecture's context and
     * block through the pointers they are given. graph_safe: they take every
     * per-step value from there, so a backend may record and replay a round
     * as a step region (backend.h ds_step). */
    ds_step step;
    bool graph_safe;
    /* The batched engine's sequences share the context caches as a pool of
     * pages: pages (set per call, NULL: rows by position) says where the
     * current sequence's positions live, rows of the context append and of
     * the block alike (row_table all zero: one sequence a call). paged: the
     * architecture honours it. */
    const ds_kv_pages *pages;
    bool paged;
    int cache_rows;
    /* Batched rounds (drafter_batch.h): blocks one pass takes (0 or 1: one), and their buffers
     * ([max_seqs * gamma] rows; taps: the sequences' pending rows gathered, max_seqs * (gamma + 1)). */
    int max_seqs;
    ds_tensor batch_hidden, batch_logits, batch_taps;
    /* ds_markov_chain_seqs: the confidence head's features [DS_MARKOV_SEQS_MAX * gamma, hidden (+ rank)]
     * and its logits [.., 1], allocated where the backend has markov_greedy_seqs or markov_sample_seqs. */
    ds_tensor seqs_feat, seqs_conf;
};

/* One round's proposal. */
typedef struct {
    int n;                          /* tokens kept after confidence truncation */
    int32_t tokens[DS_MAX_GAMMA];   /* all gamma drawn tokens */
    float conf_logit[DS_MAX_GAMMA]; /* confidence logits (when the head exists) */
    const float *logits;            /* [gamma, vocab] Markov-corrected logits (drafter-owned) */
    const float *probs;             /* [gamma, vocab] processed draft distributions (T > 0), or NULL when
                                       they are on the backend only (probs_dev; ds_drafter_host_probs) */
    ds_tensor probs_dev;            /* the same on the backend, when it sampled the walk (else data NULL) */
    /* Entries of [tokens[0..gamma), n] the backend kept instead of the host
     * (ds_drafter_round's keep_on_backend): 0 (all on the host), gamma (the tokens: n is
     * gamma) or gamma + 1 (the tokens and n). Kept entries hold 0 here. */
    int n_kept;
} ds_proposal;

typedef struct {
    int max_rows;   /* most context rows per append (0: the backend's prefill_rows) */
    int cache_rows; /* rows of each layer's context K/V: 0 = max_ctx + gamma (one sequence); a batched engine's
                       pool of pages asks for pages x page rows (the architecture must take pages: d->paged) */
    int max_seqs;   /* blocks one batched round's pass takes (drafter_batch.h; 0: 1) */
} ds_drafter_opts;

/* Opens a DeepSpec drafter directory and checks it against the target.
 * Defined with the table of drafter architectures (drafter_archs.c), which
 * sits above the architectures that depend on this file's code. */
ds_error *ds_drafter_open(ds_backend *be, const char *dir, const ds_target *target, const ds_drafter_opts *opts,
                          ds_drafter **out);
/* Bytes one cached context position takes in the K/V caches the drafter in
 * dir would allocate (every layer together, in the model's dtype: kv_cache.h):
 * read from dir's config.json alone, before anything is loaded, so a memory
 * budget can size the pool. */
ds_error *ds_drafter_kv_row_bytes(const char *dir, int64_t *out);
void ds_drafter_free(ds_drafter *d);
/* Appends context rows from target taps [n, n_taps*hidden] at positions pos0..
 * (pos0 <= n_ctx: later rows are forgotten first). n <= max_rows. */
ds_error *ds_drafter_append(ds_drafter *d, ds_tensor taps, int pos0, int n);
/* Drafts a block after anchor at position start (== n_ctx). threshold > 0
 * cuts the proposal before the first confidence below it. */
ds_error *ds_drafter_propose(ds_drafter *d, int32_t anchor, int start, const ds_sampling *s, float threshold,
                             ds_rng *rng, ds_proposal *out);
/* One drafter round: ds_drafter_append(d, taps, pos0, n) (none when n is 0),
 * then ds_drafter_propose(d, anchor, start, ...), start == pos0 + n. On a
 * backend that records steps the context update, the block forward, the LM
 * head and a greedy walk on the device are one recording per (n, gamma),
 * with one device->host copy (the walked tokens). keep_on_backend: for a
 * greedy round the caller verifies on the backend (speculate/round.h), a
 * walk there may leave the tokens (and, with a threshold, the proposal
 * length, decided by conf_cut) on the backend instead (out->n_kept), with
 * no copy at all; conf_logit is then not filled. */
ds_error *ds_drafter_round(ds_drafter *d, ds_tensor taps, int pos0, int n, int32_t anchor, int start,
                           const ds_sampling *s, float threshold, bool keep_on_backend, ds_rng *rng,
                           ds_proposal *out);

/* STS (SPEC §6): position k's confidence becomes the calibrated
 * ds_conf_prob(c_k, temp[k]) wherever a threshold cuts (temp: the block
 * size's worth, each finite and > 0; NULL: every s_k = 1 again). */
ds_error *ds_drafter_set_temperatures(ds_drafter *d, const float *temp, int n);

/* Makes out->probs available on the host (a download when the walk was
 * sampled on the backend), for a verifier that runs on the host. */
ds_error *ds_drafter_host_probs(ds_drafter *d, ds_proposal *out);

/* Shared pieces for architecture files. */
ds_error *ds_drafter_load_common(ds_drafter *d, const ds_target *target);
void ds_drafter_release_common(ds_drafter *d);
/* ctx = hidden_norm(fc(taps)) for n rows, into every layer's K/V at pos[0..n) (through d->pages). */
void ds_drafter_context(ds_drafter *d, ds_tensor taps, int n, const int32_t *pos);
/* logits = lm_head(hidden), rounded and soft-capped as the reference (bf16 checkpoints: bf16 results). */
void ds_drafter_lm_head(ds_drafter *d, ds_tensor logits, ds_tensor hidden);
/* Markov chain + confidence over the block (markov.c). */
ds_error *ds_markov_load_bound(ds_drafter *d);
void ds_markov_chain(ds_drafter *d, int32_t anchor, const ds_sampling *s, ds_rng *rng, ds_proposal *out);
/* The greedy walk on the backend, in two halves: whether it applies; the
 * walk queued (tokens on the host when the backend says so: at once, or at
 * the end of a step region); what follows once out->tokens holds them
 * (corrected logits kept, confidence). ds_markov_chain runs both. */
bool ds_markov_device_walk(const ds_drafter *d, const ds_sampling *s);
void ds_markov_walk_queue(ds_drafter *d, int32_t anchor, int32_t *tokens);
/* The same walk with the LM head still to apply (backend markov_greedy_head:
 * the backend may bound the head's products instead of writing them all),
 * where the walk applies, only the tokens are wanted and the base logits need
 * no soft-cap. */
bool ds_markov_head_walk(const ds_drafter *d);
void ds_markov_walk_head_queue(ds_drafter *d, int32_t anchor, int32_t *tokens);
void ds_markov_walk_finish(ds_drafter *d, ds_proposal *out);
/* The walks of n <= DS_MARKOV_SEQS_MAX sequences at once, all greedy or
 * all sampled (the batched round; backend markov_greedy_seqs /
 * markov_sample_seqs): sequence j's block is rows j*G.. of hidden (final
 * hidden states) and logits (base logits; a sampled walk overwrites them
 * with its distributions), anchors[j], s[j], rng[j]. out[j] gets what
 * ds_markov_chain gives sequence j alone, bit for bit (tokens, confidence
 * logits; probs_dev: its rows of logits when sampled), n and n_kept not
 * set; each rng advances as there. False where the walk does not apply
 * (mixed rules, a non-vanilla head, kept logits, the backend's op declines):
 * nothing done, no rng moved. */
bool ds_markov_chain_seqs(ds_drafter *d, ds_tensor hidden, ds_tensor logits, int n, const int32_t *anchors,
                          const ds_sampling *const *s, ds_rng *const *rng, ds_proposal *out);
/* After a queued walk: the confidence logits of the block into column 0 of
 * d->step_out (rounded to bf16 with a bf16 checkpoint), queued on the
 * backend (no host copy), for conf_cut. */
void ds_markov_confidence_queue(ds_drafter *d);

#endif
