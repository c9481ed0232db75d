/* The parts of a target every architecture shares: stop tokens, taps,
 * cropping, argument checks on forward (the dispatch: target_archs.c). */
#include "model/target.h"

#include "base/argmax.h"

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
const char *ds_target_placeholder_of(const ds_target *t, int32_t id) {
    for (int i = 0; i < t->n_placeholders; i++)
        if (t->placeholders[i] == id) return t->placeholder_field[i];
    return NULL;
}

/* A row's id is valid if the embedding has it or the wrapper replaces it. */
ds_error *ds_target_check_id(const ds_target *t, int32_t id) {
    if ((id < 0 || id >= t->vocab) && !ds_target_placeholder_of(t, id))
        return ds_errorf("token id %d is outside the vocabulary (0..%d)", id, t->vocab - 1);
    return NULL;
}

/* What the wrapper does before the embedding lookup: placeholders -> pad. */
void ds_target_embed_ids(const ds_target *t, int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        if (ds_target_placeholder_of(t, ids[i])) ids[i] = t->pad_id;
}

void ds_target_init_common(ds_target *t, ds_backend *be, ds_checkpoint *ck, const ds_target_opts *opts) {
    t->be = be;
    t->ck = ck;
    t->max_rows = opts && opts->max_rows > 0 ? opts->max_rows : ds_backend_prefill_rows(be);
    t->max_logit_rows = opts && opts->max_logit_rows > 0 ? opts->max_logit_rows : 64;
    if (t->max_logit_rows > t->max_rows) t->max_logit_rows = t->max_rows;
    t->opt_max_ctx = opts ? opts->max_ctx : 0;
    t->cache_rows = opts ? opts->cache_rows : 0;
    t->paged_cache = t->cache_rows > 0;
    t->comm = opts && opts->comm && opts->comm->world > 1 ? opts->comm : NULL;
}

ds_error *ds_target_tp_alloc(ds_target *t) {
    if (!t->comm) return NULL;
    const int w = t->comm->world;
    if (t->vocab % w) return ds_errorf("%s: vocab_size %d does not divide among %d ranks", t->ck->dir, t->vocab, w);
    DS_TRY(t->be->ops->alloc(t->be, DS_F32, t->max_logit_rows, t->vocab / w, &t->logits_local));
    t->gather_host = malloc((size_t)t->max_logit_rows * (size_t)t->vocab * 2 * sizeof *t->gather_host);
    return t->gather_host ? NULL : ds_errorf("out of memory");
}

/* Tensor parallel: the ranks' vocabulary slices of n rows of logits into t->logits (every rank gets all). */
static void gather_logits(ds_target *t, ds_tensor lg, int n) {
    t->pending_rows = 0;
    ds_backend *be = t->be;
    const int w = t->comm->world;
    const int64_t vl = t->vocab / w, m = (int64_t)n * vl;
    float *mine = t->gather_host, *all = t->gather_host + (size_t)t->max_logit_rows * t->vocab;
    be->ops->download(be, ds_rows(t->logits_local, 0, n), mine);
    t->comm->ops->all_gather_host(t->comm, mine, m, all);
    /* all: rank r's [n, vl] block at r * m; the full rows side by side into mine */
    for (int i = 0; i < n; i++)
        for (int r = 0; r < w; r++)
            memcpy(mine + (size_t)i * t->vocab + (size_t)r * vl, all + (size_t)r * m + (size_t)i * vl,
                   (size_t)vl * sizeof *mine);
    be->ops->upload(be, lg, mine);
}

/* The LM head over rows x into lg: the whole vocabulary, or under tensor parallelism this rank's slice
 * (lm_head holds it) gathered from every rank. */
static void lm_head_rows(ds_target *t, ds_tensor lg, ds_tensor x, ds_tensor lm_head, int n) {
    ds_backend *be = t->be;
    ds_tensor out = t->comm ? ds_rows(t->logits_local, 0, n) : lg;
    be->ops->linear(be, out, x, lm_head, ds_no_tensor());
    if (t->logits_bf16) be->ops->round_bf16(be, out);
    if (t->comm) t->pending_rows = n; /* gathered when asked (ds_target_logits_sync): greedy needs only argmaxes */
}

void ds_target_logits_sync(ds_target *t) {
    if (t->comm && t->pending_rows > 0) gather_logits(t, ds_rows(t->logits, 0, t->pending_rows), t->pending_rows);
}

void ds_target_argmax(ds_target *t, int rows, int32_t *out) {
    ds_backend *be = t->be;
    if (!t->comm || t->pending_rows < rows) {
        ds_target_logits_sync(t);
        be->ops->argmax(be, ds_rows(t->logits, 0, rows), out);
        return;
    }
    /* Each rank's best of its slice, then the best of the ranks' (ties: the lowest id, as over the whole
     * row, since a lower rank holds lower ids): only 2 values a row cross between ranks. */
    const int w = t->comm->world;
    const int64_t vl = t->vocab / w;
    float *local = t->gather_host;
    float mine[2 * 64], all[2 * 64 * 64];
    for (int r0 = 0; r0 < rows; r0 += 64) {
        const int n = rows - r0 < 64 ? rows - r0 : 64;
        be->ops->download(be, ds_rows(t->logits_local, r0, n), local);
        for (int i = 0; i < n; i++) {
            const int64_t k = ds_argmax_f32(local + (size_t)i * vl, vl);
            mine[2 * i] = local[(size_t)i * vl + k];
            mine[2 * i + 1] = (float)k; /* < 2^24: exact */
        }
        t->comm->ops->all_gather_host(t->comm, mine, 2 * n, all);
        for (int i = 0; i < n; i++) {
            int best = 0;
            for (int q = 1; q < w; q++)
                if (all[(size_t)q * 2 * n + 2 * i] > all[(size_t)best * 2 * n + 2 * i]) best = q;
            out[r0 + i] = (int32_t)(best * vl + (int64_t)all[(size_t)best * 2 * n + 2 * i + 1]);
        }
    }
}

void ds_target_limit_ctx(ds_target *t, int config_max_ctx) {
    t->max_ctx = t->opt_max_ctx > 0 && t->opt_max_ctx < config_max_ctx ? t->opt_max_ctx : config_max_ctx;
    if (t->cache_rows <= 0) t->cache_rows = t->max_ctx;
}

ds_error *ds_target_open_finish(ds_target *t) {
    ds_error *e = read_stop_ids(t);
    if (!e) {
        int cap = t->max_rows > t->max_logit_rows ? t->max_rows : t->max_logit_rows;
        if (cap < DS_TARGET_STEP_MIN) cap = DS_TARGET_STEP_MIN;
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
    be->ops->release(be, &t->gathered);
    be->ops->release(be, &t->logits_local);
    free(t->gather_host);
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
    if (t->paged_cache)
        return ds_errorf("%s: this target's caches are a pool of pages: batched forwards only", t->ck->dir);
    if (n <= 0 || n > t->max_rows) return ds_errorf("forward of %d tokens (1..%d per call)", n, t->max_rows);
    if (n_logits < 0 || n_logits > n || n_logits > t->max_logit_rows)
        return ds_errorf("forward asks logits for %d rows (at most %d)", n_logits, t->max_logit_rows);
    if (best && n_logits < 1) return ds_errorf("forward asks the argmax of no logits rows");
    if (pos0 < 0 || pos0 > t->n_cached)
        return ds_errorf("forward at position %d but the KV cache holds only %d positions", pos0, t->n_cached);
    if (pos0 + n > t->max_ctx)
        return ds_errorf("sequence of %d tokens exceeds the model's context of %d", pos0 + n, t->max_ctx);
    for (int i = 0; i < n; i++) DS_TRY(ds_target_check_id(t, ids[i]));
    t->n_cached = pos0;
    ds_step *st = &t->step;
    memmove(st->ids, ids, (size_t)n * sizeof *ids);
    ds_target_embed_ids(t, st->ids, n);
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
        if (!e && best) ds_target_argmax(t, n_logits, st->out);
    }
    if (t->graph_safe) ds_region_end(be);
    if (e) return e;
    if (best) memcpy(best, st->out, (size_t)n_logits * sizeof *best);
    t->n_cached = pos0 + n;
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
    if (n_logits > 0) lm_head_rows(t, lg, ds_rows(fh, n - n_logits, n_logits), lm_head, n_logits);
    return lg;
}

ds_error *ds_target_forward_rows(ds_target *t, const ds_target_rows *b) {
    if (!t->ops->forward_rows)
        return ds_errorf("%s: the %s architecture has no batched forward yet", t->ck->dir, t->model_type);
    if (b->n <= 0 || b->n > t->max_rows) return ds_errorf("batched forward of %d rows (1..%d per call)", b->n, t->max_rows);
    if (b->n_logits < 0 || b->n_logits > t->max_logit_rows || b->n_logits > b->n)
        return ds_errorf("batched forward asks logits for %d rows (at most %d)", b->n_logits, t->max_logit_rows);
    if (!b->pages || b->pages->page_rows <= 0) return ds_errorf("batched forward without pages");
    ds_step *st = &t->step;
    for (int i = 0; i < b->n; i++) {
        DS_TRY(ds_target_check_id(t, b->ids[i]));
        if (b->pos[i] < 0 || b->pos[i] >= t->max_ctx)
            return ds_errorf("batched forward: row %d at position %d is outside the context of %d", i, b->pos[i],
                             t->max_ctx);
        const int64_t r = ds_kv_page_row(b->pages, i, b->pos[i]);
        if (r < 0 || r >= t->cache_rows)
            return ds_errorf("batched forward: row %d's page puts position %d at cache row %lld (the cache has %d)", i,
                             b->pos[i], (long long)r, t->cache_rows);
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n || (i && b->logit_rows[i] <= b->logit_rows[i - 1]))
            return ds_errorf("batched forward: logit row %d (%d) is not an ascending row of the %d", i,
                             b->logit_rows[i], b->n);
    if (b->n_logits > 0 && !t->gathered.data)
        DS_TRY(t->be->ops->alloc(t->be, DS_F32, t->max_logit_rows, t->hidden, &t->gathered));
    memcpy(st->ids, b->ids, (size_t)b->n * sizeof *b->ids);
    ds_target_embed_ids(t, st->ids, b->n);
    t->n_cached = 0; /* the single-sequence cache's positions mean nothing now */
    return t->ops->forward_rows(t, b, st->ids);
}

void ds_target_head_rows(ds_target *t, ds_tensor x, ds_tensor final_norm, float eps, ds_tensor lm_head, int n,
                         const int32_t *logit_rows, int n_logits) {
    ds_backend *be = t->be;
    ds_tensor fh = ds_rows(t->final_hidden, 0, n);
    be->ops->rmsnorm(be, fh, x, final_norm, t->hidden, eps);
    if (n_logits <= 0) return;
    /* the wanted rows side by side (runs of consecutive rows in one copy), then one LM head pass */
    for (int i = 0; i < n_logits;) {
        int k = 1;
        while (i + k < n_logits && logit_rows[i + k] == logit_rows[i] + k) k++;
        be->ops->copy(be, ds_rows(t->gathered, i, k), ds_rows(fh, logit_rows[i], k));
        i += k;
    }
    lm_head_rows(t, ds_rows(t->logits, 0, n_logits), ds_rows(t->gathered, 0, n_logits), lm_head, n_logits);
}
