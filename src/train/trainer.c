#include "train/trainer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "base/rng.h"
#include "io/checkpoint.h"
#include "io/json_file.h"
#include "io/train_cache.h"
#include "train/lr_schedule.h"
#include "train/train_batch.h"
#include "train/train_checkpoint.h"

ds_train_opts ds_train_opts_default(void) {
    return (ds_train_opts){.steps = 1000, .batch = 64, .micro = 1, .lr = 6e-4, .warmup_ratio = 0.04, .clip = 1.0,
                           .seed = 0, .init_seed = 0, .val_frac = 0.02, .save_dtype = DS_BF16};
}

/* splitmix64: independent streams from (seed, a, b). */
static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static uint64_t stream(uint64_t seed, uint64_t a, uint64_t b) { return mix(mix(mix(seed) ^ a) ^ (b * 0x632be59bd9b4e019ull)); }

typedef struct {
    const ds_train_opts *o;
    ds_train_cache *cache;
    ds_drafter_train *t;
    ds_train_dev *dev;
    int64_t n_train, n_val;
    int64_t *perm, perm_epoch; /* the training sequences' order in epoch perm_epoch */
    int anchors;
    int32_t *anchor_buf;
    FILE *log;
} run;

/* The sequence at position `slot` of the endless shuffled stream: epoch slot / n_train, each epoch a
 * permutation drawn from (seed, epoch). */
static int64_t seq_at(run *r, int64_t slot) {
    const int64_t epoch = slot / r->n_train;
    if (epoch != r->perm_epoch) {
        ds_rng rng;
        ds_rng_seed(&rng, stream(r->o->seed, 1, (uint64_t)epoch));
        for (int64_t i = 0; i < r->n_train; i++) r->perm[i] = i;
        for (int64_t i = r->n_train - 1; i > 0; i--) {
            const int64_t j = (int64_t)(ds_rng_next(&rng) % (uint64_t)(i + 1));
            const int64_t x = r->perm[i];
            r->perm[i] = r->perm[j], r->perm[j] = x;
        }
        r->perm_epoch = epoch;
    }
    return r->perm[slot % r->n_train];
}

/* The batch of sequences seqs[0..n), anchors drawn from (seed, tag, key of each). */
static ds_error *make_batch(run *r, const int64_t *seqs, const uint64_t *keys, int n, uint64_t tag,
                            ds_train_batch *out, int64_t *tokens) {
    const ds_drafter_train_shape *sh = ds_drafter_train_shape_of(r->t);
    ds_train_seq_view *v = calloc((size_t)n, sizeof *v);
    const int32_t **an = calloc((size_t)n, sizeof *an);
    int *na = calloc((size_t)n, sizeof *na);
    ds_error *e = v && an && na ? NULL : ds_errorf("out of memory");
    for (int i = 0; i < n && !e; i++) {
        ds_train_seq s;
        e = ds_train_cache_seq(r->cache, seqs[i], &s);
        if (e) break;
        v[i] = (ds_train_seq_view){.len = s.len, .ids = s.ids, .loss_mask = s.mask, .dtype = DS_BF16,
                                   .taps = s.taps, .final_hidden = s.final_hidden};
        ds_rng rng;
        ds_rng_seed(&rng, stream(r->o->seed, tag, keys[i]));
        int32_t *buf = r->anchor_buf + (size_t)i * r->anchors;
        na[i] = ds_train_sample_anchors(s.mask, s.len, r->anchors, &rng, buf);
        an[i] = buf;
        *tokens += s.len;
    }
    if (!e)
        e = ds_train_batch_build(v, n, an, na, sh->gamma, sh->mask_id, ds_train_loss_deepspec.decay,
                                 sh->n_taps * sh->hidden, sh->hidden, out);
    free(v), free(an), free(na);
    return e;
}

/* The loss over the validation sequences (fixed anchors, micro-batches of the run's size). */
static ds_error *validate(run *r, ds_train_loss *out) {
    memset(out, 0, sizeof *out);
    const int m = r->o->micro > 0 ? r->o->micro : r->o->batch;
    int64_t seqs[4096];
    uint64_t keys[4096];
    double wsum = 0, ce = 0, l1 = 0, conf = 0;
    for (int64_t v0 = 0; v0 < r->n_val; v0 += m) {
        const int n = (int)(r->n_val - v0 < m ? r->n_val - v0 : m);
        for (int i = 0; i < n; i++) seqs[i] = r->n_train + v0 + i, keys[i] = (uint64_t)seqs[i];
        ds_train_batch b;
        int64_t tok = 0;
        DS_TRY(make_batch(r, seqs, keys, n, 3, &b, &tok));
        ds_train_loss L;
        ds_error *e = ds_drafter_train_eval(r->t, &b, &ds_train_loss_deepspec, &L);
        ds_train_batch_free(&b);
        if (e) return e;
        /* pooled over every validation position: sum(w * term) / sum(w) */
        wsum += L.weight_sum, ce += L.ce * L.weight_sum, l1 += L.l1 * L.weight_sum, conf += L.conf * L.weight_sum;
    }
    if (wsum > 0) out->ce = ce / wsum, out->l1 = l1 / wsum, out->conf = conf / wsum;
    const ds_train_loss_recipe *rc = &ds_train_loss_deepspec;
    out->loss = rc->alpha_ce * out->ce + rc->alpha_l1 * out->l1 + rc->alpha_conf * out->conf;
    out->weight_sum = wsum;
    return NULL;
}

/* What must match for a rerun to resume: OUT/run.json. */
static cJSON *run_identity(const ds_train_opts *o, const ds_train_cache *c) {
    cJSON *j = cJSON_CreateObject();
    char id[32];
    snprintf(id, sizeof id, "%016llx", (unsigned long long)ds_train_cache_manifest(c)->cache_id);
    cJSON_AddStringToObject(j, "cache_id", id);
    cJSON_AddStringToObject(j, "init", o->init_dir ? o->init_dir : "");
    cJSON_AddStringToObject(j, "config", o->config_path ? o->config_path : "");
    cJSON_AddNumberToObject(j, "steps", (double)o->steps);
    cJSON_AddNumberToObject(j, "batch", o->batch);
    cJSON_AddNumberToObject(j, "micro", o->micro);
    cJSON_AddNumberToObject(j, "num_anchors", o->num_anchors);
    cJSON_AddNumberToObject(j, "lr", o->lr);
    cJSON_AddNumberToObject(j, "warmup_ratio", o->warmup_ratio);
    cJSON_AddNumberToObject(j, "clip", o->clip);
    cJSON_AddNumberToObject(j, "seed", (double)o->seed);
    cJSON_AddNumberToObject(j, "init_seed", (double)o->init_seed);
    cJSON_AddNumberToObject(j, "val_frac", o->val_frac);
    cJSON_AddBoolToObject(j, "tf32", o->tf32);
    return j;
}

static ds_error *check_resume(const char *out_dir, cJSON *want, bool *resume) {
    char path[4096];
    snprintf(path, sizeof path, "%s/run.json", out_dir);
    *resume = false;
    if (!ds_path_exists(path)) return ds_json_file_write(path, want);
    cJSON *have = NULL;
    DS_TRY(ds_json_file_read(path, 1 << 20, &have));
    ds_error *e = NULL;
    for (const cJSON *w = want->child; w && !e; w = w->next) {
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(have, w->string);
        if (!h || !cJSON_Compare(h, w, true)) {
            char *a = h ? cJSON_PrintUnformatted(h) : NULL, *b = cJSON_PrintUnformatted(w);
            e = ds_errorf("%s: %s was %s, now %s: a run with other options does not resume this one (use another "
                          "--out, or delete it)", path, w->string, a ? a : "(absent)", b ? b : "?");
            free(a), free(b);
        }
    }
    cJSON_Delete(have);
    *resume = !e;
    return e;
}

static ds_error *save(run *r) {
    char path[4096];
    snprintf(path, sizeof path, "%s/" DS_TRAIN_STATE_FILE, r->o->out_dir);
    DS_TRY(ds_train_save_drafter(r->t, r->o->out_dir, r->o->save_dtype));
    return ds_train_save_state(r->t, path);
}

static void log_line(run *r, const ds_train_progress *p) {
    if (!r->log) return;
    fprintf(r->log, "{\"step\": %lld, \"lr\": %.9g, \"loss\": %.7g, \"ce\": %.7g, \"l1\": %.7g, \"confidence\": %.7g, "
                    "\"grad_norm\": %.7g, \"tokens_per_s\": %.1f",
            (long long)p->step, p->lr, p->loss, p->ce, p->l1, p->conf, p->grad_norm, p->tokens_per_s);
    if (p->has_val)
        fprintf(r->log, ", \"val_loss\": %.7g, \"val_ce\": %.7g, \"val_l1\": %.7g, \"val_confidence\": %.7g", p->val_loss,
                p->val_ce, p->val_l1, p->val_conf);
    fprintf(r->log, "}\n");
    fflush(r->log);
}

static ds_error *train_loop(run *r, ds_train_report *rep) {
    const ds_train_opts *o = r->o;
    const int m = o->micro > 0 ? o->micro : o->batch, n_micro = (o->batch + m - 1) / m;
    const ds_lr_schedule sched = ds_lr_schedule_make(o->lr, o->steps, o->warmup_ratio);
    const int64_t start = ds_drafter_train_steps_taken(r->t);
    rep->resumed_from = start;
    const double t0 = ds_now_s();
    int64_t tokens = 0;
    int64_t seqs[4096];
    uint64_t keys[4096];
    for (int64_t s = start; s < o->steps; s++) {
        ds_drafter_train_zero_grad(r->t);
        ds_train_progress p = {.step = s + 1, .steps = o->steps};
        for (int k = 0; k < n_micro; k++) {
            const int first = k * m, n = o->batch - first < m ? o->batch - first : m;
            for (int i = 0; i < n; i++) {
                const int64_t slot = s * o->batch + first + i;
                seqs[i] = seq_at(r, slot), keys[i] = (uint64_t)slot;
            }
            ds_train_batch b;
            DS_TRY(make_batch(r, seqs, keys, n, 2, &b, &tokens));
            ds_train_loss L;
            ds_error *e = ds_drafter_train_grad(r->t, &b, &ds_train_loss_deepspec, 1.0f / (float)n_micro, &L);
            ds_train_batch_free(&b);
            if (e) return ds_error_wrap(e, "step %lld", (long long)s);
            p.loss += L.loss / n_micro, p.ce += L.ce / n_micro, p.l1 += L.l1 / n_micro, p.conf += L.conf / n_micro;
        }
        p.grad_norm = ds_drafter_train_grad_norm(r->t);
        if (!isfinite(p.grad_norm))
            return ds_errorf("step %lld: the gradient is not finite (loss %g): stopping before it reaches the weights",
                             (long long)s, p.loss);
        p.lr = ds_lr_at(&sched, s);
        const double clip = o->clip > 0 ? fmin(1.0, o->clip / (p.grad_norm + 1e-6)) : 1.0;
        ds_drafter_train_step(r->t, &ds_adamw_deepspec, (float)p.lr, (float)clip);
        const bool last = s + 1 == o->steps;
        if (r->n_val > 0 && (last || (o->eval_every > 0 && (s + 1) % o->eval_every == 0))) {
            ds_train_loss V;
            DS_TRY(validate(r, &V));
            p.has_val = true, p.val_loss = V.loss, p.val_ce = V.ce, p.val_l1 = V.l1, p.val_conf = V.conf;
        }
        const bool stop = o->stop && *o->stop;
        if (last || stop || (o->save_every > 0 && (s + 1) % o->save_every == 0)) {
            DS_TRY(save(r));
            p.saved = true;
        }
        p.elapsed_s = ds_now_s() - t0;
        p.tokens_per_s = (double)tokens / fmax(p.elapsed_s, 1e-9);
        p.eta_s = p.elapsed_s / (double)(s + 1 - start) * (double)(o->steps - s - 1);
        log_line(r, &p);
        if (o->progress) o->progress(o->user, &p);
        rep->last = p;
        rep->steps_run++;
        if (stop && !last) {
            rep->interrupted = true;
            break;
        }
    }
    rep->seconds = ds_now_s() - t0;
    rep->tokens_per_s = (double)tokens / fmax(rep->seconds, 1e-9);
    return NULL;
}

ds_error *ds_train_run(const ds_train_opts *o, ds_train_report *rep) {
    memset(rep, 0, sizeof *rep);
    if (!o->target_dir || !o->data_dir || !o->out_dir) return ds_errorf("train: the target, the data and --out are needed");
    if (!o->init_dir == !o->config_path) return ds_errorf("train: give one of -d INIT and --config CFG");
    if (o->steps < 1 || o->batch < 1 || o->batch > 4096 || o->micro < 0)
        return ds_errorf("train: steps %lld, batch %d, micro %d: steps >= 1, batch 1..4096, micro >= 0",
                         (long long)o->steps, o->batch, o->micro);
    if (!(o->lr > 0) || !(o->warmup_ratio >= 0 && o->warmup_ratio < 1) || !(o->val_frac >= 0 && o->val_frac < 0.5))
        return ds_errorf("train: lr %g > 0, warmup ratio %g in [0, 1), val fraction %g in [0, 0.5)", o->lr,
                         o->warmup_ratio, o->val_frac);
    run r = {.o = o, .perm_epoch = -1};
    ds_error *e = ds_train_cache_open(o->data_dir, &r.cache);
    if (!e) e = o->cuda ? ds_train_dev_cuda(0, &r.dev) : ds_train_dev_cpu(o->threads, &r.dev);
    if (!e && o->tf32)
        e = r.dev->ops->set_tf32 ? r.dev->ops->set_tf32(r.dev, true)
                                 : ds_errorf("train: TF32 is a GPU's mode: the %s trainer computes in fp32", r.dev->ops->name);
    if (!e) {
        e = o->init_dir ? ds_drafter_train_open(r.dev, o->init_dir, o->target_dir, &r.t)
                        : ds_drafter_train_init(r.dev, o->config_path, o->target_dir, o->init_seed, &r.t);
    }
    if (!e) {
        const ds_drafter_train_shape *sh = ds_drafter_train_shape_of(r.t);
        e = ds_train_cache_check(r.cache, o->target_dir, sh->tap_layers, sh->n_taps);
        r.anchors = o->num_anchors > 0 ? o->num_anchors : sh->num_anchors > 0 ? sh->num_anchors : 64;
    }
    if (!e) {
        const int64_t n = ds_train_cache_n_seqs(r.cache);
        r.n_val = o->val_frac > 0 && n >= 2 ? (int64_t)ceil(o->val_frac * (double)n) : 0;
        r.n_train = n - r.n_val;
        if (r.n_train < 1) e = ds_errorf("%s: no training sequences", o->data_dir);
        rep->n_train = r.n_train, rep->n_val = r.n_val;
    }
    if (!e) {
        r.perm = malloc((size_t)r.n_train * sizeof *r.perm);
        r.anchor_buf = malloc((size_t)(o->batch + 1) * (size_t)r.anchors * sizeof *r.anchor_buf);
        if (!r.perm || !r.anchor_buf) e = ds_errorf("out of memory");
    }
    if (!e && mkdir(o->out_dir, 0755) && errno != EEXIST)
        e = ds_errorf("%s: cannot create: %s", o->out_dir, strerror(errno));
    bool resume = false;
    if (!e) {
        cJSON *want = run_identity(o, r.cache);
        e = want ? check_resume(o->out_dir, want, &resume) : ds_errorf("out of memory");
        cJSON_Delete(want);
    }
    char path[4096];
    if (!e && resume) {
        snprintf(path, sizeof path, "%s/" DS_TRAIN_STATE_FILE, o->out_dir);
        if (ds_path_exists(path)) e = ds_train_load_state(r.t, path);
    }
    if (!e) {
        snprintf(path, sizeof path, "%s/train_log.jsonl", o->out_dir);
        r.log = fopen(path, ds_drafter_train_steps_taken(r.t) > 0 ? "a" : "w");
        if (!r.log) e = ds_errorf("%s: cannot write: %s", path, strerror(errno));
    }
    if (!e) e = train_loop(&r, rep);
    if (r.log) fclose(r.log);
    free(r.perm);
    free(r.anchor_buf);
    ds_drafter_train_free(r.t);
    if (r.dev) r.dev->ops->destroy(r.dev);
    ds_train_cache_close(r.cache);
    return e;
}
