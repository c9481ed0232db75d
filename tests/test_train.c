/* The drafter trainer against the DeepSpec recipe's goldens (issue 41, must-show 1):
 * testdata/fixtures/qwen3-tiny-train, made by scripts/train_reference.py and checked against DeepSpec
 * itself to ~5e-8. Tolerances are the fixture README's (about 100x the fp32-vs-fp64 noise floor):
 * each gradient tensor 1e-4 relative (L2), the step-0 loss, terms and gradient norm 1e-5, the 11 losses
 * of a 10-step AdamW run (and each term) 1e-4; in the batch mode and in DeepSpec's accumulation mode. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "draft/drafter.h"
#include "io/safetensors.h"
#include "model/target.h"
#include "testlib.h"
#include "train/drafter_train.h"
#include "train/lr_schedule.h"
#include "train/train_batch.h"
#include "train/trainer.h"

#define FIX DS_TESTDATA "/fixtures/qwen3-tiny-train"
#define DRAFTER DS_TESTDATA "/fixtures/qwen3-tiny/drafter"
#define NSEQ 3

typedef struct {
    ds_safetensors *st;
    cJSON *js;
    int B, S, N, tapw, H;
    int32_t ids[NSEQ][64];
    uint8_t mask[NSEQ][64];
    int len[NSEQ];
    int32_t anchors[NSEQ][16];
    int n_anchors[NSEQ];
    const float *taps, *last;
} golden;

static const ds_st_tensor *tensor(const golden *g, const char *name) {
    const ds_st_tensor *t = ds_safetensors_find(g->st, name);
    CHECK(t, "golden tensor %s missing", name);
    return t;
}

static void fixture_open(golden *g) {
    memset(g, 0, sizeof *g);
    CHECK_OK(ds_safetensors_open(FIX "/golden.safetensors", &g->st));
    g->js = read_json_file(FIX "/golden.json");
    CHECK(g->js, "golden.json");
    const ds_st_tensor *ids = tensor(g, "input_ids"), *lm = tensor(g, "loss_mask");
    const ds_st_tensor *an = tensor(g, "anchor_positions"), *keep = tensor(g, "block_keep_mask");
    const ds_st_tensor *taps = tensor(g, "target_hidden_states"), *last = tensor(g, "target_last_hidden_states");
    g->B = (int)ids->shape[0], g->S = (int)ids->shape[1], g->N = (int)an->shape[1];
    g->tapw = (int)taps->shape[2], g->H = (int)last->shape[2];
    CHECK(g->B == NSEQ && g->S <= 64 && g->N <= 16, "golden batch shape");
    const int64_t *I = ids->data, *M = lm->data, *A = an->data, *K = keep->data;
    const cJSON *lens = cJSON_GetObjectItem(cJSON_GetObjectItem(g->js, "batch"), "seq_len");
    for (int b = 0; b < g->B; b++) {
        g->len[b] = cJSON_GetArrayItem(lens, b)->valueint;
        for (int i = 0; i < g->S; i++) g->ids[b][i] = (int32_t)I[b * g->S + i], g->mask[b][i] = (uint8_t)M[b * g->S + i];
        for (int n = 0; n < g->N; n++)
            if (K[b * g->N + n]) g->anchors[b][g->n_anchors[b]++] = (int32_t)A[b * g->N + n];
    }
    g->taps = taps->data, g->last = last->data;
}

static void fixture_close(golden *g) {
    ds_safetensors_close(g->st);
    cJSON_Delete(g->js);
}

/* The batch of sequences [s0, s1). */
static void build(const golden *g, const ds_drafter_train_shape *sh, int s0, int s1, ds_train_batch *out) {
    ds_train_seq_view v[NSEQ];
    const int32_t *an[NSEQ];
    int na[NSEQ];
    for (int b = s0; b < s1; b++) {
        v[b - s0] = (ds_train_seq_view){.len = g->len[b], .ids = g->ids[b], .loss_mask = g->mask[b], .dtype = DS_F32,
                                        .taps = g->taps + (size_t)b * g->S * g->tapw,
                                        .final_hidden = g->last + (size_t)b * g->S * g->H};
        an[b - s0] = g->anchors[b];
        na[b - s0] = g->n_anchors[b];
    }
    CHECK_OK(ds_train_batch_build(v, s1 - s0, an, na, sh->gamma, sh->mask_id, ds_train_loss_deepspec.decay,
                                  sh->n_taps * sh->hidden, sh->hidden, out));
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

static double jnum(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    CHECK(cJSON_IsNumber(v), "golden.json field %s", k);
    return v->valuedouble;
}

/* DS_TRAIN_DEVICE=cuda: the trainer on CUDA GPU 0 (ctest's test_train_cuda), skipped (77) where there is
 * none or the build has no CUDA; else the CPU, skipped where the build has no OpenBLAS. */
static bool on_cuda(void) {
    const char *d = getenv("DS_TRAIN_DEVICE");
    return d && !strcmp(d, "cuda");
}

static ds_train_dev *dev_new(void) {
    ds_train_dev *dev = NULL;
    ds_error *e = on_cuda() ? ds_train_dev_cuda(0, &dev) : ds_train_dev_cpu(0, &dev);
    if (e) {
        const char *m = ds_error_message(e);
        const bool skip = strstr(m, "without OpenBLAS") || strstr(m, "without CUDA") || strstr(m, "no CUDA device");
        printf("%s: %s\n", skip ? "SKIP" : "FAIL", m);
        fflush(stdout);
        ds_error_free(e); /* LeakSanitizer would fail the skip */
        exit(skip ? 77 : 1);
    }
    printf("  training device: %s\n", dev->ops->name);
    return dev;
}

/* The step-0 loss, its terms and every gradient tensor (batch mode: the 3 sequences one micro-batch). */
static void test_step0_gradients(void) {
    golden g;
    fixture_open(&g);
    ds_train_dev *dev = dev_new();
    ds_drafter_train *t;
    CHECK_OK(ds_drafter_train_open(dev, DRAFTER, NULL, &t));
    CHECK(ds_drafter_train_n_tensors(t) == 29, "29 trainable tensors, got %d", ds_drafter_train_n_tensors(t));
    ds_train_batch b;
    build(&g, ds_drafter_train_shape_of(t), 0, NSEQ, &b);
    ds_drafter_train_zero_grad(t);
    ds_train_loss L;
    CHECK_OK(ds_drafter_train_grad(t, &b, &ds_train_loss_deepspec, 1.0f, &L));
    const cJSON *s0 = cJSON_GetObjectItem(g.js, "step0");
    printf("step 0: loss %.7f (golden %.7f) ce %.6f l1 %.6f conf %.6f, weight sum %.5f, %lld weighted rows\n", L.loss,
           jnum(s0, "loss"), L.ce, L.l1, L.conf, L.weight_sum, (long long)L.rows);
    CHECK(L.rows == 74, "74 supervised positions, got %lld", (long long)L.rows);
    CHECK(rel(L.weight_sum, jnum(s0, "weight_sum")) < 1e-6, "weight sum");
    CHECK(rel(L.loss, jnum(s0, "loss")) < 1e-5, "loss rel %.3g", rel(L.loss, jnum(s0, "loss")));
    CHECK(rel(L.ce, jnum(s0, "ce")) < 1e-5, "ce rel %.3g", rel(L.ce, jnum(s0, "ce")));
    CHECK(rel(L.l1, jnum(s0, "l1")) < 1e-5, "l1 rel %.3g", rel(L.l1, jnum(s0, "l1")));
    CHECK(rel(L.conf, jnum(s0, "confidence")) < 1e-5, "confidence rel %.3g", rel(L.conf, jnum(s0, "confidence")));
    double worst = 0;
    for (int i = 0; i < ds_drafter_train_n_tensors(t); i++) {
        const char *name = ds_drafter_train_tensor_name(t, i);
        int nd;
        int64_t shp[2];
        const int64_t n = ds_drafter_train_tensor_shape(t, i, &nd, shp);
        char gname[96];
        snprintf(gname, sizeof gname, "grad.%s", name);
        const ds_st_tensor *gt = tensor(&g, gname);
        CHECK(gt->nbytes == (size_t)n * sizeof(float), "%s: %lld elements", gname, (long long)n);
        float *got = malloc((size_t)n * sizeof *got);
        ds_drafter_train_get(t, i, DS_TRAIN_GRAD, got);
        const float *want = gt->data;
        double dd = 0, ww = 0;
        for (int64_t k = 0; k < n; k++) dd += ((double)got[k] - want[k]) * ((double)got[k] - want[k]), ww += (double)want[k] * want[k];
        const double r = sqrt(dd / fmax(ww, 1e-300));
        printf("  %-44s rel %.2e\n", gname, r);
        worst = fmax(worst, r);
        CHECK(r <= 1e-4, "%s: relative error %.3g > 1e-4", gname, r);
        free(got);
    }
    const double gn = ds_drafter_train_grad_norm(t);
    printf("gradients: worst tensor %.2e; norm %.7f (golden %.7f)\n", worst, gn, jnum(s0, "grad_norm_before_clip"));
    CHECK(rel(gn, jnum(s0, "grad_norm_before_clip")) < 1e-5, "grad norm");
    ds_train_batch_free(&b);
    ds_drafter_train_free(t);
    dev->ops->destroy(dev);
    fixture_close(&g);
}

/* 10 AdamW steps (clip 1.0, the recipe's schedule over 50 steps) on the same batch; the losses before
 * each step and after the last. accumulate: each sequence its own micro-batch (scale 1/3), as DeepSpec's
 * recipe configs run. */
static void run_steps(bool accumulate) {
    golden g;
    fixture_open(&g);
    ds_train_dev *dev = dev_new();
    ds_drafter_train *t;
    CHECK_OK(ds_drafter_train_open(dev, DRAFTER, NULL, &t));
    const ds_drafter_train_shape *sh = ds_drafter_train_shape_of(t);
    ds_train_batch batches[NSEQ];
    const int nb = accumulate ? NSEQ : 1;
    for (int i = 0; i < nb; i++) build(&g, sh, accumulate ? i : 0, accumulate ? i + 1 : NSEQ, &batches[i]);
    const ds_st_tensor *gl = tensor(&g, accumulate ? "accum_step_losses" : "step_losses");
    const ds_st_tensor *gnorm = tensor(&g, accumulate ? "accum_step_grad_norm" : "step_grad_norm");
    const ds_st_tensor *glr = tensor(&g, "step_lr");
    const float *want = gl->data, *wnorm = gnorm->data, *wlr = glr->data;
    const ds_lr_schedule sched = ds_lr_schedule_make(6e-4, 50, 0.04);
    double worst = 0;
    for (int s = 0; s <= 10; s++) {
        ds_drafter_train_zero_grad(t);
        double got[4] = {0};
        for (int i = 0; i < nb; i++) {
            ds_train_loss L;
            CHECK_OK(ds_drafter_train_grad(t, &batches[i], &ds_train_loss_deepspec, 1.0f / (float)nb, &L));
            got[0] += L.loss / nb, got[1] += L.ce / nb, got[2] += L.l1 / nb, got[3] += L.conf / nb;
        }
        for (int k = 0; k < 4; k++) {
            const double r = rel(got[k], want[s * 4 + k]);
            worst = fmax(worst, r);
            CHECK(r <= 1e-4, "%s step %d term %d: %.7f vs golden %.7f (rel %.3g)", accumulate ? "accum" : "batch", s,
                  k, got[k], want[s * 4 + k], r);
        }
        if (s == 10) break;
        const double norm = ds_drafter_train_grad_norm(t);
        CHECK(rel(norm, wnorm[s]) <= 1e-4, "step %d grad norm %.7f vs %.7f", s, norm, wnorm[s]);
        const double lr = ds_lr_at(&sched, s);
        CHECK(rel(lr, wlr[s]) <= 1e-6, "step %d lr %.9g vs golden %.9g", s, lr, wlr[s]);
        const double clip = fmin(1.0, 1.0 / (norm + 1e-6));
        ds_drafter_train_step(t, &ds_adamw_deepspec, (float)lr, (float)clip);
    }
    printf("%s mode: 10 AdamW steps, 11 losses x 4 terms, worst rel %.2e (bound 1e-4); final loss %.6f\n",
           accumulate ? "accumulation" : "batch", worst, want[40]);
    CHECK(ds_drafter_train_steps_taken(t) == 10, "10 steps taken");
    for (int i = 0; i < nb; i++) ds_train_batch_free(&batches[i]);
    ds_drafter_train_free(t);
    dev->ops->destroy(dev);
    fixture_close(&g);
}

static void test_ten_steps_batch(void) { run_steps(false); }
static void test_ten_steps_accumulate(void) { run_steps(true); }

/* The schedule's shape at other totals: warmup ramps to the peak, the hand-over runs slightly above it,
 * the cosine ends near zero; W = 0 starts on the cosine. */
static void test_lr_schedule(void) {
    const ds_lr_schedule s = ds_lr_schedule_make(1.0, 100, 0.04);
    CHECK(s.warmup_steps == 4, "W = int(0.04 * 100) = 4");
    CHECK(fabs(ds_lr_at(&s, 0) - 0.25) < 1e-15 && fabs(ds_lr_at(&s, 3) - 1.0) < 1e-15, "warmup");
    const double over = 2.0 / (1.0 + cos(M_PI / 96));
    CHECK(fabs(ds_lr_at(&s, 4) - over) < 1e-12 && ds_lr_at(&s, 4) > 1.0, "hand-over above the peak");
    CHECK(fabs(ds_lr_at(&s, 5) - 1.0) < 1e-12, "the step after it at exactly the peak");
    CHECK(ds_lr_at(&s, 99) < 1e-3, "the end near zero: %g", ds_lr_at(&s, 99));
    const ds_lr_schedule z = ds_lr_schedule_make(1.0, 10, 0.04);
    CHECK(z.warmup_steps == 0 && ds_lr_at(&z, 0) > 1.0, "W = 0: the first step is the hand-over");
}

/* Anchors: only candidates (token and next token target-generated), distinct, sorted, all of them when
 * there are fewer than asked; a bad anchor is an error naming it. */
static void test_anchors(void) {
    uint8_t mask[20] = {0, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
    int32_t out[32];
    ds_rng rng;
    ds_rng_seed(&rng, 7);
    const int n_all = ds_train_sample_anchors(mask, 20, 32, &rng, out);
    CHECK(n_all == 13, "13 candidates (3..5 and 8..17), got %d", n_all);
    for (int trial = 0; trial < 50; trial++) {
        const int n = ds_train_sample_anchors(mask, 20, 5, &rng, out);
        CHECK(n == 5, "5 drawn");
        for (int i = 0; i < n; i++) {
            CHECK(mask[out[i]] && mask[out[i] + 1] && out[i] < 19, "anchor %d is a candidate", out[i]);
            CHECK(i == 0 || out[i] > out[i - 1], "sorted and distinct");
        }
    }
    int32_t ids[20] = {0};
    float taps[20 * 2] = {0}, fin[20] = {0};
    ds_train_seq_view v = {.len = 20, .ids = ids, .loss_mask = mask, .dtype = DS_F32, .taps = taps, .final_hidden = fin};
    const int32_t bad[1] = {6}; /* token 6 is generated, token 7 is not */
    const int32_t *an[1] = {bad};
    const int na[1] = {1};
    ds_train_batch b;
    CHECK_ERR(ds_train_batch_build(&v, 1, an, na, 4, 1, 4.0f, 2, 1, &b), "sequence 0: anchor 6 is not");
}

/* ---- the run: dspark datagen's cache of the tiny target, trained, interrupted, resumed ---- */
#define TINY DS_TESTDATA "/fixtures/qwen3-tiny/target"

static char tmp_root[] = "/tmp/ds_train_XXXXXX";
static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tmp_root, name); }

/* A cache of 10 sequences: random prompts of 4..9 ids, 16 target tokens each. */
static void make_cache(char *cache, size_t cap) {
    char prompts[512], cmd[2048];
    path_in(prompts, sizeof prompts, "prompts.jsonl");
    path_in(cache, cap, "cache");
    FILE *f = fopen(prompts, "w");
    CHECK(f, "%s", prompts);
    if (!f) return;
    ds_rng rng;
    ds_rng_seed(&rng, 41);
    for (int i = 0; i < 10; i++) {
        fprintf(f, "{\"input_ids\": [");
        const int n = 4 + i % 6;
        for (int k = 0; k < n; k++) fprintf(f, "%s%d", k ? ", " : "", (int)(ds_rng_next(&rng) % 500));
        fprintf(f, "]}\n");
    }
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s datagen -m %s -d %s --prompt-file %s --out %s -n 16 --threads 2 >/dev/null 2>&1", DS_CLI,
             TINY, DRAFTER, prompts, cache);
    CHECK(system(cmd) == 0, "%s", cmd);
}

static ds_train_opts run_opts(const char *cache, const char *out) {
    ds_train_opts o = ds_train_opts_default();
    o.target_dir = TINY, o.init_dir = DRAFTER, o.data_dir = cache, o.out_dir = out;
    o.steps = 6, o.batch = 4, o.micro = 2, o.num_anchors = 4, o.val_frac = 0.2, o.eval_every = 3;
    o.save_dtype = DS_F32, o.threads = 2, o.seed = 5, o.cuda = on_cuda();
    return o;
}

typedef struct {
    volatile sig_atomic_t flag;
    int64_t at;
} stopper;
static void stop_at(void *user, const ds_train_progress *p) {
    stopper *s = user;
    if (p->step == s->at) s->flag = 1;
}

static char *slurp(const char *dir, const char *name, size_t *n) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return read_text_file(p, n);
}

/* A run stopped after step 3 and rerun ends byte-identical to an uninterrupted one; a rerun with other
 * options is refused; the drafter written loads in the inference engine against its target. */
static void test_run_resume(void) {
    char cache[512], a[512], b[512];
    make_cache(cache, sizeof cache);
    path_in(a, sizeof a, "a");
    path_in(b, sizeof b, "b");
    ds_train_opts oa = run_opts(cache, a);
    ds_train_report ra, rb;
    CHECK_OK(ds_train_run(&oa, &ra));
    CHECK(ra.steps_run == 6 && ra.n_val == 2 && ra.n_train == 8 && !ra.interrupted, "6 steps, 8 + 2 sequences");
    CHECK(ra.last.has_val && isfinite(ra.last.val_loss) && ra.last.val_loss > 0, "a validation loss at the end");
    stopper st = {0, 2}; /* raised in step 2's report: seen at the end of step 3 (as a signal during it would be) */
    ds_train_opts ob = run_opts(cache, b);
    ob.stop = &st.flag, ob.progress = stop_at, ob.user = &st;
    CHECK_OK(ds_train_run(&ob, &rb));
    CHECK(rb.interrupted && rb.steps_run == 3, "stopped after step 3 (ran %lld)", (long long)rb.steps_run);
    ob.stop = NULL, ob.progress = NULL;
    CHECK_OK(ds_train_run(&ob, &rb));
    CHECK(rb.resumed_from == 3 && rb.steps_run == 3, "resumed at 3, ran 3 more (%lld, %lld)", (long long)rb.resumed_from,
          (long long)rb.steps_run);
    size_t na, nb;
    char *ma = slurp(a, "model.safetensors", &na), *mb = slurp(b, "model.safetensors", &nb);
    CHECK(ma && mb && na == nb && !memcmp(ma, mb, na), "the resumed run's drafter is byte-identical to the straight one's");
    free(ma), free(mb);
    CHECK(fabs(ra.last.loss - rb.last.loss) == 0, "last loss %.9g vs %.9g", ra.last.loss, rb.last.loss);
    CHECK_OK(ds_train_run(&ob, &rb));
    CHECK(rb.steps_run == 0, "a finished run does nothing");
    ob.lr = 1e-3;
    CHECK_ERR(ds_train_run(&ob, &rb), "lr was");
    /* the engine loads what was written */
    ds_backend *be;
    CHECK_OK(test_backend_new(&be));
    ds_target *t;
    CHECK_OK(ds_target_open(be, TINY, NULL, &t));
    ds_drafter *d;
    CHECK_OK(ds_drafter_open(be, a, t, NULL, &d));
    ds_drafter_free(d);
    ds_target_free(t);
    be->ops->destroy(be);
}

/* From scratch (--config): initial weights from the seed, embeddings from the target; the loss falls. */
static void test_run_from_config(void) {
    char cache[512], out[512];
    path_in(cache, sizeof cache, "cache");
    path_in(out, sizeof out, "scratch");
    ds_train_opts o = run_opts(cache, out);
    o.init_dir = NULL, o.config_path = DRAFTER "/config.json", o.steps = 12, o.lr = 3e-3, o.eval_every = 0;
    ds_train_report r;
    CHECK_OK(ds_train_run(&o, &r));
    size_t n;
    char *log = slurp(out, "train_log.jsonl", &n);
    CHECK(log != NULL, "train_log.jsonl");
    double first = 0, last = 0;
    if (log) {
        first = strtod(strstr(log, "\"loss\": ") + 8, NULL);
        const char *p = log, *q;
        while ((q = strstr(p + 1, "\"loss\": "))) p = q;
        last = strtod(p + 8, NULL);
    }
    printf("from scratch: loss %.4f -> %.4f over 12 steps\n", first, last);
    CHECK(last < first * 0.95, "the loss falls: %.4f -> %.4f", first, last);
    free(log);
}

/* The CLI: a run, its loss curves, and bad arguments refused with the flag named. */
static void test_cli(void) {
    char cache[512], out[512], cmd[2048];
    path_in(cache, sizeof cache, "cache");
    path_in(out, sizeof out, "cli");
    char prompts[512];
    path_in(prompts, sizeof prompts, "prompts.jsonl");
    snprintf(cmd, sizeof cmd, "%s train -m %s -d %s --data %s --out %s --steps 2 --batch 2 --threads 2 --quiet "
             "--val-prompts %s --val-max-new 12 --backend %s >/dev/null", DS_CLI, TINY, DRAFTER, cache, out, prompts,
             on_cuda() ? "cuda" : "cpu");
    CHECK(system(cmd) == 0, "%s", cmd);
    size_t n;
    char *ev = slurp(out, "eval.json", &n);
    const char *tau = ev ? strstr(ev, "\"tau\": ") : NULL, *init = ev ? strstr(ev, "\"tau_init\": ") : NULL;
    CHECK(tau && init, "eval.json has tau and tau_init");
    if (tau && init) {
        const double t1 = strtod(tau + 7, NULL), t0 = strtod(init + 12, NULL);
        printf("validation prompts: tau %.3f (initial %.3f)\n", t1, t0);
        CHECK(t1 >= 1 && t1 <= 5 && t0 >= 1 && t0 <= 5, "tau in [1, gamma + 1]");
    }
    free(ev);
    char *png = slurp(out, "loss.png", &n);
    CHECK(png && n > 100 && !memcmp(png, "\x89PNG", 4), "loss.png written");
    free(png);
    snprintf(cmd, sizeof cmd, "%s train -m %s -d %s --data %s --out %s --steps 0 2>&1 | grep -q -- '--steps must be'",
             DS_CLI, TINY, DRAFTER, cache, out);
    CHECK(system(cmd) == 0, "--steps 0 refused");
    snprintf(cmd, sizeof cmd, "%s train -m %s --data %s --out %s 2>&1 | grep -q 'give one of -d'", DS_CLI, TINY, cache, out);
    CHECK(system(cmd) == 0, "no -d / --config refused");
    snprintf(cmd, sizeof cmd, "%s train -m %s -d %s --data %s --out %s --save-dtype fp8 2>&1 | "
             "grep -q -- \"--save-dtype expects bf16 or fp32, got 'fp8'\"", DS_CLI, TINY, DRAFTER, cache, out);
    CHECK(system(cmd) == 0, "--save-dtype fp8 refused, naming the choices");
    if (!on_cuda()) {
        snprintf(cmd, sizeof cmd, "%s train -m %s -d %s --data %s --out %s/tf32 --tf32 2>&1 | grep -q \"TF32 is a GPU's\"",
                 DS_CLI, TINY, DRAFTER, cache, tmp_root);
        CHECK(system(cmd) == 0, "--tf32 on the CPU refused");
    }
}

static void cleanup(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmp_root);
}

static void test_setup(void) {
    CHECK(mkdtemp(tmp_root) != NULL, "mkdtemp");
    atexit(cleanup);
}

RUN_TESTS("train", test_lr_schedule, test_anchors, test_step0_gradients, test_ten_steps_batch,
          test_ten_steps_accumulate, test_setup, test_run_resume, test_run_from_config, test_cli)
