/* The target model interface the speculative loop talks to. One forward
 * scores n tokens at absolute positions pos0..pos0+n-1 against the KV cache
 * (prefill, single-token decode and multi-token verify are the same call),
 * leaving logits for the last n_logits rows and the tapped hidden states of
 * every row on the backend. Architectures (qwen3.c, gemma4.c) implement it. */
#ifndef DS_TARGET_H
#define DS_TARGET_H

#include "backend/backend.h"
#include "io/checkpoint.h"

#define DS_MAX_TAPS 16
#define DS_MAX_STOP_IDS 8
#define DS_MAX_PLACEHOLDERS 4

typedef struct ds_target ds_target;

typedef struct {
    ds_error *(*forward)(ds_target *t, const int32_t *ids, int n, int pos0, int n_logits);
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
    ds_tensor logits;       /* [max_logit_rows, vocab] fp32 */
    ds_tensor taps;         /* [max_rows, n_taps*hidden] */
    ds_tensor final_hidden; /* [max_rows, hidden]: final-normed states of the last forward */
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
} ds_target_opts;

/* Opens a Hugging Face target directory (architecture from config.json).
 * Defined with the table of architectures (target_archs.c), which sits above
 * the architectures, so that no architecture depends on this file's code
 * while it depends on them. */
ds_error *ds_target_open(ds_backend *be, const char *dir, const ds_target_opts *opts, ds_target **out);
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
/* What ds_target_open does after the constructor: stop tokens, step buffers.
 * On an error the caller frees t (ds_target_free). */
ds_error *ds_target_open_finish(ds_target *t);

#endif
