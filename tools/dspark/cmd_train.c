/* dspark train: a DSpark drafter trained on a `dspark datagen` cache by the
 * DeepSpec recipe (src/train/trainer.h), with a progress line (tokens/s,
 * loss, ETA), checkpoints in DeepSpec's format, and resumption. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_choice.h"
#include "cli_num.h"
#include "commands.h"
#include "train_eval.h"
#include "train_plot.h"
#include "train/trainer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspark train [-m TARGET_DIR] (-d INIT_DIR | --config CFG.json) --data CACHE_DIR --out DIR\n"
            "                    [--steps N] [--batch B] [--micro M] [--lr LR] [--warmup R] [--clip C]\n"
            "                    [--anchors A] [--seed S] [--init-seed S] [--val-frac F] [--eval-every N]\n"
            "                    [--save-every N] [--save-dtype bf16|fp32] [--backend cpu|cuda] [--threads N] [--quiet]\n"
            "\n"
            "Trains a DSpark drafter (Qwen3 backbone, vanilla Markov head, confidence head) by the DeepSpec recipe\n"
            "(SPEC §7): blocks at anchors drawn among the target-generated tokens, the training mask, loss 0.1 CE +\n"
            "0.9 L1 + 1.0 confidence BCE weighted exp(-k/4), AdamW on fp32 master weights, warmup + cosine, clipping;\n"
            "embed_tokens and lm_head are the target's, frozen. DIR receives the drafter (config.json +\n"
            "model.safetensors: `dspark generate -d DIR` and DeepSpec load it), trainer_state.safetensors (to resume),\n"
            "train_log.jsonl (one line a step), loss.png (the curves) and run.json. Rerunning the same command resumes from the last save.\n"
            "\n"
            "  -m DIR          the target the cache was made with (default: the bundled pico-qwen3)\n"
            "  -d DIR          start from this drafter's weights   --config F: from scratch, this drafter config\n"
            "  --data DIR      a `dspark datagen` cache made with -m and the drafter's tap layers\n"
            "  --steps N       optimizer steps (default 1000)      --batch B: sequences a step (default 64)\n"
            "  --micro M       sequences a micro-batch, each normalised on its own, gradients summed (default 1, as\n"
            "                  DeepSpec's configs; M = B: the whole step one batch)\n"
            "  --lr LR         peak learning rate (default 6e-4)   --warmup R: warmup fraction (default 0.04)\n"
            "  --clip C        gradient-norm clip (default 1; 0: off)\n"
            "  --anchors A     blocks a sequence (default: the config's num_anchors, else 64)\n"
            "  --seed S        data order and anchors (default 0)  --init-seed S: --config's initial weights (0)\n"
            "  --val-frac F    the cache's last sequences held out for validation (default 0.02)\n"
            "  --eval-every N  validation every N steps (default 0: at the end)\n"
            "  --save-every N  checkpoint every N steps (default 0: at the end)\n"
            "  --save-dtype T  bf16 (default) or fp32\n"
            "  --backend B     cpu (default) or cuda (GPU 0)   --threads N: CPU threads (default all)\n"
            "  --val-prompts F prompts (generate's format) to measure tau on at the end, greedy, with the trained\n"
            "                  drafter (and with -d's, for comparison): printed, in eval.json and on loss.png\n"
            "  --val-max-new N new tokens a validation prompt (default 64)\n"
            "  --tf32          with --backend cuda: GEMMs on TF32 tensor cores (several times faster, ~1e-3\n"
            "                  relative instead of fp32's; DeepSpec trains in bf16)\n"
            "  --quiet         no progress line\n");
}

typedef struct {
    ds_train_opts t;
    const char *model, *val_prompts;
    int val_max_new;
    bool quiet;
} options;

static int parse_args(int argc, char **argv, options *o) {
    enum { O_CONFIG = 256, O_DATA, O_OUT, O_STEPS, O_BATCH, O_MICRO, O_LR, O_WARMUP, O_CLIP, O_ANCHORS, O_SEED,
           O_INIT_SEED, O_VAL, O_EVAL, O_SAVE, O_DTYPE, O_BACKEND, O_THREADS, O_QUIET, O_TF32, O_VAL_PROMPTS,
           O_VAL_MAX_NEW };
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},          {"drafter", required_argument, 0, 'd'},
        {"config", required_argument, 0, O_CONFIG},    {"data", required_argument, 0, O_DATA},
        {"out", required_argument, 0, O_OUT},          {"steps", required_argument, 0, O_STEPS},
        {"batch", required_argument, 0, O_BATCH},      {"micro", required_argument, 0, O_MICRO},
        {"lr", required_argument, 0, O_LR},            {"warmup", required_argument, 0, O_WARMUP},
        {"clip", required_argument, 0, O_CLIP},        {"anchors", required_argument, 0, O_ANCHORS},
        {"seed", required_argument, 0, O_SEED},        {"init-seed", required_argument, 0, O_INIT_SEED},
        {"val-frac", required_argument, 0, O_VAL},     {"eval-every", required_argument, 0, O_EVAL},
        {"save-every", required_argument, 0, O_SAVE},  {"save-dtype", required_argument, 0, O_DTYPE},
        {"backend", required_argument, 0, O_BACKEND},  {"threads", required_argument, 0, O_THREADS},
        {"quiet", no_argument, 0, O_QUIET},            {"help", no_argument, 0, 'h'},
        {"tf32", no_argument, 0, O_TF32}, {"val-prompts", required_argument, 0, O_VAL_PROMPTS}, {"val-max-new", required_argument, 0, O_VAL_MAX_NEW},
        {0, 0, 0, 0}};
    o->t = ds_train_opts_default();
    o->val_max_new = 64;
    optind = 1;
    int c;
    char *end;
#define NUM(dst, conv, what) CLI_NUM("train", dst, conv, what)
    long long v;
    while ((c = getopt_long(argc, argv, "m:d:h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'd': o->t.init_dir = optarg; break;
        case O_CONFIG: o->t.config_path = optarg; break;
        case O_DATA: o->t.data_dir = optarg; break;
        case O_OUT: o->t.out_dir = optarg; break;
        case O_STEPS: NUM(o->t.steps, strtoll(optarg, &end, 10), "--steps"); break;
        case O_BATCH: NUM(v, strtoll(optarg, &end, 10), "--batch"); o->t.batch = v < 1 || v > 4096 ? 0 : (int)v; break;
        case O_MICRO: NUM(v, strtoll(optarg, &end, 10), "--micro"); o->t.micro = v < 0 || v > 4096 ? -1 : (int)v; break;
        case O_LR: NUM(o->t.lr, strtod(optarg, &end), "--lr"); break;
        case O_WARMUP: NUM(o->t.warmup_ratio, strtod(optarg, &end), "--warmup"); break;
        case O_CLIP: NUM(o->t.clip, strtod(optarg, &end), "--clip"); break;
        case O_ANCHORS: NUM(v, strtoll(optarg, &end, 10), "--anchors"); o->t.num_anchors = v < 1 || v > 1 << 16 ? -1 : (int)v; break;
        case O_SEED: NUM(o->t.seed, strtoull(optarg, &end, 10), "--seed"); break;
        case O_INIT_SEED: NUM(o->t.init_seed, strtoull(optarg, &end, 10), "--init-seed"); break;
        case O_VAL: NUM(o->t.val_frac, strtod(optarg, &end), "--val-frac"); break;
        case O_EVAL: NUM(o->t.eval_every, strtoll(optarg, &end, 10), "--eval-every"); break;
        case O_SAVE: NUM(o->t.save_every, strtoll(optarg, &end, 10), "--save-every"); break;
        case O_THREADS: NUM(v, strtoll(optarg, &end, 10), "--threads"); o->t.threads = v < 1 || v > 4096 ? -1 : (int)v; break;
        case O_QUIET: o->quiet = true; break;
        case O_TF32: o->t.tf32 = true; break;
        case O_VAL_PROMPTS: o->val_prompts = optarg; break;
        case O_VAL_MAX_NEW: NUM(v, strtoll(optarg, &end, 10), "--val-max-new"); o->val_max_new = v < 1 || v > 1 << 20 ? -1 : (int)v; break;
        case O_DTYPE: {
            const int d = cli_choice("train", "--save-dtype", optarg, (const char *const[]){"bf16", "fp32", NULL});
            if (d < 0) return 2;
            o->t.save_dtype = d == 0 ? DS_BF16 : DS_F32;
            break;
        }
        case O_BACKEND: {
            const int b = cli_choice("train", "--backend", optarg, CLI_BACKENDS);
            if (b < 0) return 2;
            o->t.cuda = b == 1;
            break;
        }
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
    }
#undef NUM
    const ds_train_opts *t = &o->t;
    const char *bad = optind < argc                                     ? "unexpected argument"
                      : !t->init_dir == !t->config_path                 ? "give one of -d INIT_DIR and --config CFG"
                      : !t->data_dir                                    ? "--data is required"
                      : !t->out_dir                                     ? "--out is required"
                      : t->steps < 1 || t->steps > (1ll << 40)          ? "--steps must be >= 1"
                      : t->batch < 1                                    ? "--batch must be in 1 .. 4096"
                      : t->micro < 0                                    ? "--micro must be in 0 .. 4096"
                      : !(t->lr > 0 && t->lr < 1)                       ? "--lr must be in (0, 1)"
                      : !(t->warmup_ratio >= 0 && t->warmup_ratio < 1)  ? "--warmup must be in [0, 1)"
                      : !(t->clip >= 0 && isfinite(t->clip))            ? "--clip must be >= 0"
                      : t->num_anchors < 0                              ? "--anchors must be in 1 .. 65536"
                      : !(t->val_frac >= 0 && t->val_frac < 0.5)        ? "--val-frac must be in [0, 0.5)"
                      : t->eval_every < 0 || t->save_every < 0          ? "--eval-every and --save-every must be >= 0"
                      : t->threads < 0                                  ? "--threads must be in 1 .. 4096"
                      : o->val_max_new < 1                              ? "--val-max-new must be in 1 .. 1048576"
                      : t->seed > (1ull << 53) || t->init_seed > (1ull << 53) ? "seeds must be at most 2^53"
                                                                        : NULL;
    if (bad) {
        fprintf(stderr, "dspark train: %s\n", bad);
        return 2;
    }
    return 0;
}

static void fmt_time(double s, char *out, size_t cap) {
    if (!isfinite(s) || s < 0) s = 0;
    const long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else snprintf(out, cap, "%ldm%02lds", t / 60, t % 60);
}

/* One line, redrawn in place on a terminal; every 10 % and the validation passes on their own lines elsewhere. */
static void progress(void *user, const ds_train_progress *p) {
    const bool tty = *(const bool *)user;
    char el[32], eta[32];
    fmt_time(p->elapsed_s, el, sizeof el);
    fmt_time(p->eta_s, eta, sizeof eta);
    const int width = 24, fill = (int)((double)p->step / (double)p->steps * width);
    char bar[32];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    const bool line = tty || p->has_val || p->step == p->steps || p->step % (p->steps / 10 > 0 ? p->steps / 10 : 1) == 0;
    if (!line) return;
    fprintf(stderr, "%s[%s] step %lld/%lld  loss %.4f (ce %.3f l1 %.3f conf %.3f)  lr %.2e  %.0f tok/s  %s, ETA %s",
            tty ? "\r\033[K" : "", bar, (long long)p->step, (long long)p->steps, p->loss, p->ce, p->l1, p->conf, p->lr,
            p->tokens_per_s, el, eta);
    if (p->has_val) fprintf(stderr, "  | val loss %.4f (ce %.3f l1 %.3f conf %.3f)", p->val_loss, p->val_ce, p->val_l1, p->val_conf);
    if (!tty || p->has_val || p->step == p->steps) fputc('\n', stderr);
    fflush(stderr);
}

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

int cmd_train(int argc, char **argv) {
    options o = {0};
    const int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    o.t.target_dir = o.model ? o.model : DS_DEFAULT_MODEL_DIR "/pico-qwen3";
    bool tty = isatty(2);
    if (!o.quiet) o.t.progress = progress, o.t.user = &tty;
    /* Ctrl-C / SIGTERM: finish the step, save, exit; the same command resumes. */
    o.t.stop = &stop_flag;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    ds_train_report rep;
    ds_error *e = ds_train_run(&o.t, &rep);
    if (e) {
        fprintf(stderr, "%sdspark train: %s\n", tty && !o.quiet ? "\n" : "", ds_error_message(e));
        ds_error_free(e);
        return 1;
    }
    if (rep.interrupted) {
        printf("interrupted after step %lld of %lld: saved to %s; run the same command to resume\n",
               (long long)rep.last.step, (long long)o.t.steps, o.t.out_dir);
        return 130;
    }
    if (rep.steps_run == 0) {
        printf("%s: already trained (%lld steps)\n", o.t.out_dir, (long long)o.t.steps);
    } else {
        printf("trained %lld steps%s on %lld sequences (%lld held out) in %.1f s, %.0f tokens/s; final loss %.4f",
               (long long)rep.steps_run, rep.resumed_from ? " (resumed)" : "", (long long)rep.n_train,
               (long long)rep.n_val, rep.seconds, rep.tokens_per_s, rep.last.loss);
        if (rep.last.has_val) printf(", validation loss %.4f", rep.last.val_loss);
        putchar('\n');
    }
    char log[4096], png[4096], note[160] = "";
    if (o.val_prompts) {
        train_eval before = {0}, after = {0};
        e = o.t.init_dir ? train_eval_tau(o.t.target_dir, o.t.init_dir, o.val_prompts, o.val_max_new, o.t.threads,
                                          o.t.cuda ? "cuda" : "cpu", &before)
                         : NULL;
        if (!e) e = train_eval_tau(o.t.target_dir, o.t.out_dir, o.val_prompts, o.val_max_new, o.t.threads,
                                   o.t.cuda ? "cuda" : "cpu", &after);
        if (e) {
            fprintf(stderr, "dspark train: the validation prompts: %s\n", ds_error_message(e));
            ds_error_free(e);
            return 1;
        }
        if (o.t.init_dir) snprintf(note, sizeof note, "TAU %.3f (FROM %.3f), T=0, %d PROMPTS", after.tau, before.tau, after.prompts);
        else snprintf(note, sizeof note, "TAU %.3f, T=0, %d PROMPTS", after.tau, after.prompts);
        printf("validation prompts (%d, %d new tokens each, greedy): tau %.3f", after.prompts, o.val_max_new, after.tau);
        if (o.t.init_dir) printf(" (the initial drafter's: %.3f)", before.tau);
        putchar('\n');
        char path[4096];
        snprintf(path, sizeof path, "%s/eval.json", o.t.out_dir);
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f, "{\"val_prompts\": \"%s\", \"prompts\": %d, \"max_new\": %d, \"tau\": %.6f, \"rounds\": %d",
                    o.val_prompts, after.prompts, o.val_max_new, after.tau, after.rounds);
            if (o.t.init_dir) fprintf(f, ", \"tau_init\": %.6f", before.tau);
            fprintf(f, ", \"steps\": %lld}\n", (long long)o.t.steps);
            fclose(f);
        }
    }
    snprintf(log, sizeof log, "%s/train_log.jsonl", o.t.out_dir);
    snprintf(png, sizeof png, "%s/loss.png", o.t.out_dir);
    e = ds_train_plot(log, png, note);
    if (e) { /* the drafter is saved: a plot that fails is a warning */
        fprintf(stderr, "dspark train: warning: %s\n", ds_error_message(e));
        ds_error_free(e);
        png[0] = 0;
    }
    printf("drafter: %s%s%s\n", o.t.out_dir, png[0] ? "; loss curves: " : "", png);
    return 0;
}
