/* The target model interface the speculative loop talks to. One forward
 * scores n tokens at absolute positions pos0..pos0+n-1 against the KV cache
 * (prefill, single-token decode and multi-token verify are the same call),
 * leaving logits for the last n_logits rows and the tapped hidden states of
 * every row on the backend. Architectures (qwen3.c, gemma4.c) implement it. */
#ifndef DS_TARGET_H
#define DS_TARGET_H

#include "backend/backend.h"
#include "backend/comm.h"
#include "io/checkpoint.h"

#define DS_MAX_TAPS 16
#define DS_MAX_STOP_IDS 8
#define DS_MAX_PLACEHOLDERS 4

typedef struct ds_target ds_target;

/* A batched forward (the batched engine): n rows from many sequences, row i
 * scoring ids[i] at position pos[i] of its own sequence, whose keys and
 * values live in the paged caches (pages: row_table per row; row_keys NULL,
 * as attention is causal). Every row's K/V are stored and tapped; the rows
 * logit_rows[0..n_logits) (ascending) get logits, in that order, in rows
 * 0..n_logits-1 of t->logits. */
typedef struct {
    int n;
    const int32_t *ids, *pos;
    const ds_kv_pages *pages;
    int n_logits;
    const int32_t *logit_rows;
} ds_target_rows;

typedef struct {
    ds_error *(*forward)(ds_target *t, const int32_t *ids, int n, int pos0, int n_logits);
    /* Optional: ds_target_rows over the target's caches as a pool of pages
     * (NULL: the architecture has no batched forward yet). ids already as
     * the wrapper embeds them. */
    ds_error *(*forward_rows)(ds_target *t, const ds_target_rows *b, const int32_t *ids);
    void (*destroy)(ds_target *t);
    /* Optional: the host's part of a forward (checks of the call, host-side
     * bookkeeping such as which position a ring row holds), run before the
     * forward's step region, since a replayed region skips forward(). */
    ds_error *(*prepare)(ds_target *t, const int32_t *ids, int n, int pos0); /* ids NULL: not on the host */
} ds_target_ops;

struct ds_target {
    const ds_target_ops *ops;
    ds_backend *be;
    ds_checkpoint *ck;
    const char *model_type; /* "qwen3", "gemma4_text" */
    int vocab, hidden, n_layers, max_ctx;
    int max_rows;       /* most tokens one forward takes (prefill is chunked by the caller) */
    int max_logit_rows; /* most rows one forward returns logits for */
    int n_cached;       /* KV cache holds positions 0..n_cached-1 */
    int n_taps, tap_layers[DS_MAX_TAPS]; /* -1 = embedding output */
    int n_stop, stop_ids[DS_MAX_STOP_IDS];
    /* Ids the checkpoint's wrapper never embeds as themselves: a multimodal
     * wrapper (Gemma4UnifiedForConditionalGeneration) swaps its placeholder
     * ids for pad_id before the lookup, so a forward embeds pad_id there.
     * placeholder_field names the config field each one comes from. */
    int n_placeholders;
    int32_t placeholders[DS_MAX_PLACEHOLDERS], pad_id;
    const char *placeholder_field[DS_MAX_PLACEHOLDERS];
    /* The reference computes logits in the checkpoint's dtype: with bf16
     * weights they are rounded to bf16 (argmax ties then go to the lowest id,
     * as torch.argmax does). Greedy decisions follow it. */
    bool logits_bf16;
    /* Tensor parallel: the rank's vocabulary slice of the logits [max_logit_rows, vocab / world], gathered
     * into logits by every forward (a full-logit gather; the distributed argmax that needs none is next). */
    ds_comm *comm;
    int pending_rows;   /* rows of logits_local not yet gathered into logits */
    ds_tensor logits_local;
    float *gather_host; /* [max_logit_rows * vocab] x 2: the local slice, then every rank's */
    ds_tensor logits;       /* [max_logit_rows, vocab] fp32 */
    ds_tensor taps;         /* [max_rows, n_taps*hidden] */
    ds_tensor final_hidden; /* [max_rows, hidden]: final-normed states of the last forward */
    ds_tensor gathered;     /* [max_logit_rows, hidden]: a batched forward's logit rows (allocated on first use) */
    int cache_rows;         /* rows of each layer's K/V cache: max_ctx, or a pool's pages x page rows */
    int opt_max_ctx;        /* ds_target_opts.max_ctx, for ds_target_limit_ctx */
    bool paged_cache;       /* the caches are a pool of pages (ds_target_opts.cache_rows given): only
                               forward_rows uses them (a Gemma 4 target then keeps no sliding ring) */
    /* A forward's per-step values (ids, positions, key count; argmax
     * results), which the architecture's forward reads its ids and
     * positions from (backend.h ds_step). graph_safe: the architecture's
     * forward takes every per-step value from here, so a backend may record
     * and replay it as a step region. */
    ds_step step;
    bool graph_safe;
};

typedef struct {
    int max_rows;       /* 0 = the backend's prefill_rows (CPU 64, CUDA 512) */
    int max_logit_rows; /* 0 = default (64) */
    int max_ctx;        /* 0 = the config's max_position_embeddings; else at most that (--ctx) */
    int cache_rows;     /* rows of each layer's K/V cache: 0 = max_ctx (one sequence); a batched engine's pool of
                           pages asks for pages x page rows */
    /* Tensor parallel (issue 43): this rank of comm's world holds its shard of the target and runs the same
     * calls as the other ranks, each in its own thread (NULL: the whole target). Qwen3 and Gemma 4 (not its per-layer-input E-series). */
    ds_comm *comm;
} ds_target_opts;

/* Opens a Hugging Face target directory (architecture from config.json).
 * Defined with the table of architectures (target_archs.c), which sits above
 * the architectures, so that no architecture depends on this file's code
 * while it depends on them. */
ds_error *ds_target_open(ds_backend *be, const char *dir, const ds_target_opts *opts, ds_target **out);
/* Bytes one cached position takes in the K/V caches the target in dir would
 * allocate as a pool of pages (ds_target_opts.cache_rows), every layer
 * together, in the model's dtype (kv_cache.h): read from dir's config.json
 * alone, before anything is loaded, so a memory budget can size the pool. */
ds_error *ds_target_kv_row_bytes(const char *dir, int64_t *out);
/* The same read, with the context the config allows (max_position_embeddings):
 * a pool sized for longer requests than the model takes would be wasted. */
ds_error *ds_target_kv_shape(const char *dir, int64_t *row_bytes, int *max_ctx);
void ds_target_free(ds_target *t);
/* Which layers' outputs the next forwards tap (SPEC §3 convention). */
ds_error *ds_target_set_taps(ds_target *t, const int *layers, int n);
/* Scores ids[0..n) at positions pos0.. (pos0 <= n_cached; the cache is cut
 * to pos0 first). n <= max_rows, n_logits <= min(n, max_logit_rows). */
ds_error *ds_target_forward(ds_target *t, const int32_t *ids, int n, int pos0, int n_logits);
/* ds_target_forward, then best[i] = argmax of logits row i for i < n_logits
 * (ties to the lowest id): on a backend that records steps, one recording
 * per shape and one device->host copy for the whole step. */
ds_error *ds_target_forward_argmax(ds_target *t, const int32_t *ids, int n, int pos0, int n_logits, int32_t *best);
/* The least ids, positions and outputs a target's step holds: enough for
 * a step over gamma + 2 ids (DS_MAX_GAMMA 32), whatever max_rows is. */
#define DS_TARGET_STEP_MIN 40
/* A forward's host side, for callers that build a target step themselves:
 * whether id may be scored (ds_errorf when not); ids as the checkpoint's
 * wrapper embeds them (placeholders -> pad_id); the config field that makes
 * id a placeholder, or NULL. */
ds_error *ds_target_check_id(const ds_target *t, int32_t id);
void ds_target_embed_ids(const ds_target *t, int32_t *ids, int n);
const char *ds_target_placeholder_of(const ds_target *t, int32_t id);
/* A batched forward (ds_target_rows) over the caches as a pool of pages:
 * checks the rows (ids, positions under max_ctx, pages inside the cache,
 * logit rows) and runs the architecture's forward_rows. */
ds_error *ds_target_forward_rows(ds_target *t, const ds_target_rows *b);
/* For architecture forwards: final_hidden = rmsnorm(x[n, hidden]), then the
 * LM head over rows logit_rows[0..n_logits) into logits rows 0.. (bf16
 * rounded when logits_bf16). */
void ds_target_head_rows(ds_target *t, ds_tensor x, ds_tensor final_norm, float eps, ds_tensor lm_head, int n,
                         const int32_t *logit_rows, int n_logits);
/* Forgets cached positions >= len. */
void ds_target_crop(ds_target *t, int len);
bool ds_target_is_stop(const ds_target *t, int32_t id);
/* For architecture forwards: copies the residual x[n, hidden] after `layer`
 * (-1: the embeddings) into every tap slot that asks for that layer. */
void ds_target_tap(ds_target *t, int layer, ds_tensor x, int n);
/* For architecture forwards: final_hidden = rmsnorm(x[n, hidden], final_norm),
 * then the LM head over its last n_logits rows into logits (rounded to bf16
 * when logits_bf16). Returns those logits rows (none when n_logits is 0). */
ds_tensor ds_target_head(ds_target *t, ds_tensor x, ds_tensor final_norm, float eps, ds_tensor lm_head, int n,
                         int n_logits);

/* Architecture constructors (qwen3.h, gemma4.h): allocate their own struct
 * (ds_target first), call ds_target_init_common, take ownership of ck only
 * on success. */
void ds_target_init_common(ds_target *t, ds_backend *be, ds_checkpoint *ck, const ds_target_opts *opts);
/* Under tensor parallelism (t->comm), after vocab is known: the local logits and the gather's buffers. */
ds_error *ds_target_tp_alloc(ds_target *t);
/* The last forward's logits rows in t->logits: under tensor parallelism the ranks' slices are gathered
 * here, on first need (a no-op otherwise). Call before reading t->logits. */
void ds_target_logits_sync(ds_target *t);
/* Each of the first `rows` logits rows' argmax (ties: the lowest id) into out (host). Under tensor
 * parallelism from the ranks' slices, without gathering the logits: 2 values a row cross. */
void ds_target_argmax(ds_target *t, int rows, int32_t *out);
/* For constructors: max_ctx = the config's context, cut to opts.max_ctx;
 * cache_rows = opts.cache_rows, or max_ctx. */
void ds_target_limit_ctx(ds_target *t, int config_max_ctx);
/* What ds_target_open does after the constructor: stop tokens, step buffers.
 * On an error the caller frees t (ds_target_free). */
ds_error *ds_target_open_finish(ds_target *t);

#endif
