/* The parts of a target every architecture shares: stop tokens, taps,
 * cropping, argument checks on forward (the dispatch: target_archs.c). */
#include "model/target.h"

#include <stdlib.h>
#include <string.h>

#include "io/config.h"

static void add_stop(ds_target *t, int64_t id) {
    if (id < 0 || id >= t->vocab || t->n_stop >= DS_MAX_STOP_IDS) return;
    for (int i = 0; i < t->n_stop; i++)
        if (t->stop_ids[i] == id) return;
    t->stop_ids[t->n_stop++] = (int)id;
}

/* Stop tokens: generation_config.json's eos_token_id (int or list), else config.json's. */
static ds_error *read_stop_ids(ds_target *t) {
    const cJSON *src = t->ck->generation && cJSON_GetObjectItemCaseSensitive(t->ck->generation, "eos_token_id")
                           ? t->ck->generation
                           : t->ck->config;
    int64_t *ids;
    int n;
    DS_TRY(ds_cfg_int_list(src, t->ck->dir, "eos_token_id", &ids, &n));
    for (int i = 0; i < n; i++) add_stop(t, ids[i]);
    free(ids);
    return NULL;
}

/* The config field that makes id a placeholder, or NULL. */
static const char *placeholder_of(const ds_target *t, int32_t id) {
    for (int i = 0; i < t->n_placeholders; i++)
        if (t->placeholders[i] == id) return t->placeholder_field[i];
    return NULL;
}

/* A row's id is valid if the embedding has it or the wrapper replaces it. */
static ds_error *check_id(const ds_target *t, int32_t id) {
    if ((id < 0 || id >= t->vocab) && !placeholder_of(t, id))
        return ds_errorf("token id %d is outside the vocabulary (0..%d)", id, t->vocab - 1);
    return NULL;
}

/* What the wrapper does before the embedding lookup: placeholders -> pad. */
static void embed_ids(const ds_target *t, int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        if (placeholder_of(t, ids[i])) ids[i] = t->pad_id;
}

void ds_target_init_common(ds_target *t, ds_backend *be, ds_checkpoint *ck, const ds_target_opts *opts) {
    t->be = be;
    t->ck = ck;
    t->max_rows = opts && opts->max_rows > 0 ? opts->max_rows : ds_backend_prefill_rows(be);
    t->max_logit_rows = opts && opts->max_logit_rows > 0 ? opts->max_logit_rows : 64;
    if (t->max_logit_rows > t->max_rows) t->max_logit_rows = t->max_rows;
}

ds_error *ds_target_open_finish(ds_target *t) {
    ds_error *e = read_stop_ids(t);
    if (!e) {
        int cap = t->max_rows > t->max_logit_rows ? t->max_rows : t->max_logit_rows;
        if (cap < DS_VERIFY_BLOCK_MAX) cap = DS_VERIFY_BLOCK_MAX; /* ds_target_verify_greedy's ids */
        t->step.cap = cap;
        t->step.ids = calloc((size_t)cap, sizeof *t->step.ids);
        t->step.pos = calloc((size_t)cap, sizeof *t->step.pos);
        t->step.out = calloc((size_t)cap, sizeof *t->step.out);
        if (!t->step.ids || !t->step.pos || !t->step.out) e = ds_errorf("out of memory");
    }
    return e;
}

void ds_target_free(ds_target *t) {
    if (!t) return;
    ds_backend *be = t->be;
    be->ops->release(be, &t->logits);
    be->ops->release(be, &t->taps);
    be->ops->release(be, &t->final_hidden);
    ds_checkpoint *ck = t->ck;
    free(t->step.ids);
    free(t->step.pos);
    free(t->step.out);
    if (t->ops) t->ops->destroy(t); /* frees t */
    ds_checkpoint_close(ck);
}

ds_error *ds_target_set_taps(ds_target *t, const int *layers, int n) {
    if (n > DS_MAX_TAPS) return ds_errorf("%d tap layers (at most %d)", n, DS_MAX_TAPS);
    for (int i = 0; i < n; i++)
        if (layers[i] < -1 || layers[i] >= t->n_layers)
            return ds_errorf("tap layer %d is outside the target's layers -1..%d", layers[i], t->n_layers - 1);
    t->be->ops->release(t->be, &t->taps);
    t->n_taps = n;
    memcpy(t->tap_layers, layers, (size_t)n * sizeof *layers);
    if (n) DS_TRY(t->be->ops->alloc(t->be, DS_F32, t->max_rows, (int64_t)n * t->hidden, &t->taps));
    return NULL;
}

ds_error *ds_target_forward(ds_target *t, const int32_t *ids, int n, int pos0, int n_logits) {
    return ds_target_forward_argmax(t, ids, n, pos0, n_logits, NULL);
}

ds_error *ds_target_forward_argmax(ds_target *t, const int32_t *ids, int n, int pos0, int n_logits, int32_t *best) {
    if (n <= 0 || n > t->max_rows) return ds_errorf("forward of %d tokens (1..%d per call)", n, t->max_rows);
    if (n_logits < 0 || n_logits > n || n_logits > t->max_logit_rows)
        return ds_errorf("forward asks logits for %d rows (at most %d)", n_logits, t->max_logit_rows);
    if (best && n_logits < 1) return ds_errorf("forward asks the argmax of no logits rows");
    if (pos0 < 0 || pos0 > t->n_cached)
        return ds_errorf("forward at position %d but the KV cache holds only %d positions", pos0, t->n_cached);
    if (pos0 + n > t->max_ctx)
        return ds_errorf("sequence of %d tokens exceeds the model's context of %d", pos0 + n, t->max_ctx);
    for (int i = 0; i < n; i++) DS_TRY(check_id(t, ids[i]));
    t->n_cached = pos0;
    ds_step *st = &t->step;
    memmove(st->ids, ids, (size_t)n * sizeof *ids);
    embed_ids(t, st->ids, n);
    if (t->ops->prepare) DS_TRY(t->ops->prepare(t, st->ids, n, pos0));
    for (int i = 0; i < n; i++) st->pos[i] = pos0 + i;
    st->n_keys = pos0 + n;
    st->n_ids = st->n_pos = n;
    st->n_out = best ? n_logits : 0;
    st->keep_out = st->out_kept = false;
    st->ids_prev_at = st->n_ids_prev = 0;
    /* The op sequence depends on n, n_logits, the argmax, the bf16 rounding
     * and the taps (whose buffer is allocated anew when they change). */
    ds_region_key key = {DS_REGION_TARGET, n, n_logits | (best ? 1 << 16 : 0) | (t->logits_bf16 ? 1 << 17 : 0) |
                                                  t->n_taps << 18, t};
    ds_backend *be = t->be;
    ds_error *e = NULL;
    if (!t->graph_safe || ds_region_begin(be, &key, st)) {
        e = t->ops->forward(t, st->ids, n, pos0, n_logits);
        if (!e && best) be->ops->argmax(be, ds_rows(t->logits, 0, n_logits), st->out);
    }
    if (t->graph_safe) ds_region_end(be);
    if (e) return e;
    if (best) memcpy(best, st->out, (size_t)n_logits * sizeof *best);
    t->n_cached = pos0 + n;
    return NULL;
}

ds_error *ds_target_verify_greedy(ds_target *t, int32_t anchor, const int32_t *block, int gamma, int n_kept, int cap,
                                  int pos0, int32_t *best, int *n_out, int *accepted) {
    const int rows = cap + 1;
    if (gamma < 1 || gamma + 2 > DS_VERIFY_BLOCK_MAX || cap < 0 || cap > gamma || n_kept < 0 || n_kept > gamma + 1)
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
    ds_step *st = &t->step;
    st->ids[0] = anchor;
    memcpy(st->ids + 1, block, (size_t)(gamma + 1) * sizeof *block);
    for (int i = 0; i < rows; i++) DS_TRY(check_id(t, st->ids[i]));
    /* The drafts stay as they are: acceptance compares them with the
     * argmaxes (an accepted placeholder is refused below). */
    embed_ids(t, st->ids, 1);
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
            be->ops->argmax(be, ds_rows(t->logits, 0, rows), st->out);
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
        if (placeholder_of(t, st->out[i]))
            return ds_errorf("greedy verification accepted draft token %d, the placeholder of config field %s, "
                             "which the model embeds as pad token %d: the drafts are scored as drafted, so the "
                             "next rows would be wrong",
                             st->out[i], placeholder_of(t, st->out[i]), t->pad_id);
    memcpy(best, st->out, (size_t)rows * sizeof *best);
    *n_out = m;
    *accepted = a;
    t->n_cached = pos0 + rows;
    return NULL;
}

void ds_target_crop(ds_target *t, int len) {
    if (len < t->n_cached) t->n_cached = len < 0 ? 0 : len;
}

bool ds_target_is_stop(const ds_target *t, int32_t id) {
    for (int i = 0; i < t->n_stop; i++)
        if (t->stop_ids[i] == id) return true;
    return false;
}

void ds_target_tap(ds_target *t, int layer, ds_tensor x, int n) {
    for (int i = 0; i < t->n_taps; i++)
        if (t->tap_layers[i] == layer)
            t->be->ops->copy(t->be, ds_rows(ds_cols(t->taps, (int64_t)i * t->hidden, t->hidden), 0, n), x);
}

ds_tensor ds_target_head(ds_target *t, ds_tensor x, ds_tensor final_norm, float eps, ds_tensor lm_head, int n,
                         int n_logits) {
    ds_backend *be = t->be;
    ds_tensor fh = ds_rows(t->final_hidden, 0, n), lg = ds_rows(t->logits, 0, n_logits);
    be->ops->rmsnorm(be, fh, x, final_norm, t->hidden, eps);
    if (n_logits > 0) {
        be->ops->linear(be, lg, ds_rows(fh, n - n_logits, n_logits), lm_head, ds_no_tensor());
        if (t->logits_bf16) be->ops->round_bf16(be, lg);
    }
    return lg;
}
