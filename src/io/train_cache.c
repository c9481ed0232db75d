#include "io/train_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ds_train_cache {
    ds_train_manifest m;
    ds_shard **shards;
    int64_t n_seqs, n_tokens;
};

void ds_train_cache_close(ds_train_cache *c) {
    if (!c) return;
    for (int i = 0; c->shards && i < c->m.n_shards; i++) ds_shard_close(c->shards[i]);
    free(c->shards);
    ds_train_manifest_free(&c->m);
    free(c);
}

ds_error *ds_train_cache_open(const char *dir, ds_train_cache **out) {
    *out = NULL;
    ds_train_cache *c = calloc(1, sizeof *c);
    if (!c) return ds_errorf("out of memory");
    ds_error *e = ds_train_manifest_read(dir, &c->m);
    if (!e && !(c->shards = calloc((size_t)(c->m.n_shards ? c->m.n_shards : 1), sizeof *c->shards)))
        e = ds_errorf("out of memory");
    for (int i = 0; !e && i < c->m.n_shards; i++) {
        const ds_train_shard_info *s = &c->m.shards[i];
        const ds_shard_expect x = {.n_taps = (uint32_t)c->m.n_taps, .hidden = (uint32_t)c->m.hidden,
                                   .vocab = c->m.vocab, .cache_id = c->m.cache_id,
                                   .first_seq = (uint64_t)s->first_seq, .n_seqs = s->n_seqs,
                                   .n_tokens = s->n_tokens};
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, s->file) >= (int)sizeof path) e = ds_errorf("%s: path too long", dir);
        if (!e) e = ds_error_wrap(ds_shard_open(path, &x, &c->shards[i]), "%s/%s shards[%d]", dir, DS_TRAIN_MANIFEST, i);
        c->n_seqs += s->n_seqs;
        c->n_tokens += s->n_tokens;
    }
    if (e) {
        ds_train_cache_close(c);
        return e;
    }
    *out = c;
    return NULL;
}

const ds_train_manifest *ds_train_cache_manifest(const ds_train_cache *c) { return &c->m; }
int64_t ds_train_cache_n_seqs(const ds_train_cache *c) { return c->n_seqs; }
int64_t ds_train_cache_n_tokens(const ds_train_cache *c) { return c->n_tokens; }

ds_error *ds_train_cache_seq(const ds_train_cache *c, int64_t i, ds_train_seq *out) {
    if (i < 0 || i >= c->n_seqs)
        return ds_errorf("sequence %lld is outside the cache's %lld", (long long)i, (long long)c->n_seqs);
    /* the shards tile [0, n_seqs) in order: binary search for the last first_seq <= i */
    int lo = 0, hi = c->m.n_shards - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (c->m.shards[mid].first_seq <= i) lo = mid;
        else hi = mid - 1;
    }
    ds_shard_seq(c->shards[lo], i - c->m.shards[lo].first_seq, out);
    return NULL;
}

ds_error *ds_train_cache_check(const ds_train_cache *c, const char *target_dir, const int *taps, int n_taps) {
    ds_model_identity id;
    DS_TRY(ds_model_identity_of(target_dir, &id));
    const ds_train_manifest *m = &c->m;
    if (id.config != m->target.config || id.weights != m->target.weights)
        return ds_errorf("the cache was made with another target (%s; config %016llx, weights %016llx), not %s "
                         "(config %016llx, weights %016llx)", m->target_dir, (unsigned long long)m->target.config,
                         (unsigned long long)m->target.weights, target_dir, (unsigned long long)id.config,
                         (unsigned long long)id.weights);
    if (n_taps != m->n_taps || memcmp(taps, m->tap_layers, (size_t)n_taps * sizeof *taps)) {
        char have[160] = "", want[160] = "";
        for (int i = 0, n = 0; i < m->n_taps && n < 150; i++) n += snprintf(have + n, sizeof have - (size_t)n, "%s%d", i ? "," : "", m->tap_layers[i]);
        for (int i = 0, n = 0; i < n_taps && n < 150; i++) n += snprintf(want + n, sizeof want - (size_t)n, "%s%d", i ? "," : "", taps[i]);
        return ds_errorf("the cache taps layers [%s], the drafter taps [%s]", have, want);
    }
    return NULL;
}
