/* dspark calibrate: STS (SPEC §6) for a drafter's confidence head. Runs
 * the calibration prompts through drafted decoding at threshold 0 and
 * records every round's confidence logits and accepted count, fits one
 * temperature per position (speculate/calibrate.h), writes them beside the
 * drafter (draft/sts_file.h: what generate picks up), and reports ECE,
 * AUROC and Brier per position before and after on the evaluation prompts,
 * with a reliability diagram. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_choice.h"
#include "cli_num.h"
#include "commands.h"
#include "prompt_ids.h"
#include "draft/sts_file.h"
#include "dspark.h"
#include "io/prompt_file.h"
#include "reliability_plot.h"
#include "speculate/calibrate.h"

typedef struct {
    const char *model, *drafter, *cal_file, *eval_file, *out, *png, *tokenizer;
    bool json, cuda;
    int threads;
    ds_generate_opts gen;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspark calibrate [-m MODEL_DIR] [-d DRAFTER_DIR] --prompt-file CAL.jsonl [--eval-file EVAL.jsonl]\n"
            "                        [--out FILE] [--png FILE] [-n MAX_NEW] [--temp T] [--seed S] [--tokenizer PATH]\n"
            "                        [--threads N] [--backend cpu|cuda] [--json]\n"
            "\n"
            "Sequential temperature scaling of the drafter's confidence head: one temperature s_k per\n"
            "draft position, the calibrated confidence sigmoid(z_k / s_k), fitted left to right so that the\n"
            "cumulative product over positions 0..k predicts whether the prefix through k is accepted.\n"
            "\n"
            "  -m DIR, -d DIR     target and drafter (default: the bundled pico-qwen3 pair)\n"
            "  --prompt-file F    calibration prompts (generate's prompt-file format)\n"
            "  --eval-file F      prompts to report the metrics on (default: the calibration prompts)\n"
            "  --out FILE         the temperature file (default: DRAFTER_DIR/sts.json, which generate reads)\n"
            "  --png FILE         the reliability diagram (default: the --out path, .json replaced by\n"
            "                     -reliability.png)\n"
            "  -n N               new tokens per prompt (default 128)\n"
            "  --temp T, --seed S sampling temperature (default 0: greedy) and seed (default 0; prompt i of\n"
            "                     the calibration then evaluation prompts uses seed S + i). Calibrate at the\n"
            "                     temperature you generate at: acceptance, and so calibration, depend on it\n"
            "  --json             one JSON object: positions (k, n, ece/auroc/brier before and after),\n"
            "                     temperatures, the files written\n");
}

/* An int option; out of int range leaves *end on the text so it is refused. */
static int int_arg(const char *s, char **end) {
    const long v = strtol(s, end, 10);
    if (v < -2147483647L || v > 2147483647L) *end = (char *)s;
    return (int)v;
}

static int parse_args(int argc, char **argv, options *o) {
    enum { O_PROMPT_FILE = 256, O_EVAL, O_OUT, O_PNG, O_TEMP, O_SEED, O_THREADS, O_JSON, O_BACKEND, O_TOKENIZER };
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},     {"drafter", required_argument, 0, 'd'},
        {"max-new", required_argument, 0, 'n'},   {"prompt-file", required_argument, 0, O_PROMPT_FILE},
        {"eval-file", required_argument, 0, O_EVAL}, {"out", required_argument, 0, O_OUT},
        {"png", required_argument, 0, O_PNG},     {"temp", required_argument, 0, O_TEMP},
        {"seed", required_argument, 0, O_SEED},   {"threads", required_argument, 0, O_THREADS},
        {"json", no_argument, 0, O_JSON},         {"backend", required_argument, 0, O_BACKEND},
        {"tokenizer", required_argument, 0, O_TOKENIZER}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    o->gen.max_new = 128;
    o->gen.top_p = 1.0f;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = cpus > 0 ? (int)cpus : 1;
    optind = 1;
    int c;
    char *end;
#define NUM(dst, conv, what) CLI_NUM("calibrate", dst, conv, what)
    while ((c = getopt_long(argc, argv, "m:d:n:h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'd': o->drafter = optarg; break;
        case 'n': NUM(o->gen.max_new, int_arg(optarg, &end), "-n"); break;
        case O_PROMPT_FILE: o->cal_file = optarg; break;
        case O_EVAL: o->eval_file = optarg; break;
        case O_OUT: o->out = optarg; break;
        case O_PNG: o->png = optarg; break;
        case O_TEMP: NUM(o->gen.temperature, strtof(optarg, &end), "--temp"); break;
        case O_SEED: NUM(o->gen.seed, strtoull(optarg, &end, 10), "--seed"); break;
        case O_THREADS: NUM(o->threads, int_arg(optarg, &end), "--threads"); break;
        case O_JSON: o->json = true; break;
        case O_TOKENIZER: o->tokenizer = optarg; break;
        case O_BACKEND: {
            const int b = cli_choice("calibrate", "--backend", optarg, CLI_BACKENDS);
            if (b < 0) return 2;
            o->cuda = b == 1;
            break;
        }
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
    }
#undef NUM
    const char *bad = optind < argc                                               ? "unexpected argument"
                      : !o->cal_file                                              ? "--prompt-file is required"
                      : !(o->gen.max_new >= 1 && o->gen.max_new <= 1 << 20)       ? "-n must be in 1 .. 1048576"
                      : !(o->gen.temperature >= 0 && isfinite(o->gen.temperature)) ? "--temp must be a finite number >= 0"
                      : !(o->threads >= 1)                                        ? "--threads must be >= 1"
                      : !o->drafter && o->model ? "-d is required with -m (the drafter to calibrate)"
                                                : NULL;
    if (bad) {
        fprintf(stderr, "dspark calibrate: %s%s%s\n", bad, optind < argc ? " " : "", optind < argc ? argv[optind] : "");
        return 2;
    }
    if (!o->model) o->model = DS_DEFAULT_MODEL_DIR "/pico-qwen3";
    if (!o->drafter) o->drafter = DS_DEFAULT_MODEL_DIR "/pico-qwen3-dspark";
    o->gen.threshold = 0; /* SPEC §6: every position proposed, every position labelled */
    o->gen.record_confidence = true;
    return 0;
}

/* Every prompt of list through drafted decoding; every round into r.
 * Prompt i samples (--temp > 0) with seed seed0 + i: one random stream a
 * prompt, so that prompts' acceptances are not drawn from the same uniforms. */
static ds_error *collect(ds_engine *eng, const options *o, const char *name, const ds_prompt_list *list, int gamma,
                         uint64_t seed0, ds_cal_rounds *r) {
    ds_generate_opts gen = o->gen;
    for (size_t i = 0; i < list->n; i++) {
        gen.seed = seed0 + i;
        int32_t *ids;
        size_t n;
        DS_TRY(ds_error_wrap(cli_prompt_ids(eng, &list->items[i], &ids, &n), "%s:%d", name, list->items[i].line));
        ds_output out;
        ds_error *e = ds_engine_generate(eng, ids, n, &gen, NULL, NULL, &out);
        free(ids);
        if (e) return ds_error_wrap(e, "%s:%d", name, list->items[i].line);
        for (int k = 0; k < out.rounds && !e; k++)
            e = ds_cal_rounds_add(r, out.confidence + (size_t)k * (size_t)gamma, out.proposed[k], out.accepted[k]);
        ds_output_free(&out);
        DS_TRY(e);
    }
    return NULL;
}

/* What the temperature file keeps besides the temperatures: how they were fitted. */
static cJSON *fit_record(const options *o, const ds_cal_rounds *cal, const ds_cal_metrics *before,
                         const ds_cal_metrics *after, int gamma) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "drafter", o->drafter);
    cJSON_AddStringToObject(x, "calibration_prompts", o->cal_file);
    cJSON_AddNumberToObject(x, "calibration_rounds", (double)cal->n);
    cJSON_AddNumberToObject(x, "max_new", o->gen.max_new);
    cJSON_AddNumberToObject(x, "sampling_temperature", o->gen.temperature);
    cJSON_AddNumberToObject(x, "seed", (double)o->gen.seed);
    char grid[160];
    snprintf(grid, sizeof grid, "s = 2^(i/%d), |i| <= %d, then %d points between the best one's neighbours; min ECE",
             DS_STS_STEPS, DS_STS_OCTAVES * DS_STS_STEPS, DS_STS_REFINE);
    cJSON_AddStringToObject(x, "grid", grid);
    cJSON *ece = cJSON_AddArrayToObject(x, "calibration_ece_before");
    cJSON *ece2 = cJSON_AddArrayToObject(x, "calibration_ece_after");
    for (int k = 0; k < gamma; k++) {
        cJSON_AddItemToArray(ece, cJSON_CreateNumber(before[k].ece));
        cJSON_AddItemToArray(ece2, cJSON_CreateNumber(after[k].ece));
    }
    return x;
}

/* The pooled value over positions, weighted by their samples (DeepSpec's
 * summarize_confidence_row); which: 0 ECE, 1 AUROC, 2 Brier. */
static double pooled(const ds_cal_metrics *m, int gamma, int which) {
    double sum = 0, w = 0;
    for (int k = 0; k < gamma; k++) {
        const double v = which == 0 ? m[k].ece : which == 1 ? m[k].auroc : m[k].brier;
        if (m[k].n > 0 && !isnan(v)) {
            sum += v * (double)m[k].n;
            w += (double)m[k].n;
        }
    }
    return w > 0 ? sum / w : NAN;
}

static void print_table(const options *o, const ds_cal_rounds *cal, const ds_cal_rounds *ev, const float *temp,
                        const ds_cal_metrics *b, const ds_cal_metrics *a, int gamma, const char *png) {
    printf("STS: calibrated on %s (%ld rounds), evaluated on %s (%ld rounds)\n", o->cal_file, cal->n,
           o->eval_file ? o->eval_file : "the calibration prompts", ev->n);
    printf("%3s %7s %8s | %8s %8s | %8s %8s | %8s %8s\n", "k", "n", "s_k", "ECE", "after", "AUROC", "after", "Brier",
           "after");
    for (int k = 0; k < gamma; k++)
        printf("%3d %7ld %8.4f | %8.4f %8.4f | %8.4f %8.4f | %8.4f %8.4f\n", k, a[k].n, temp[k], b[k].ece, a[k].ece,
               b[k].auroc, a[k].auroc, b[k].brier, a[k].brier);
    printf("%3s %7s %8s | %8.4f %8.4f | %8.4f %8.4f | %8.4f %8.4f\n", "all", "", "", pooled(b, gamma, 0),
           pooled(a, gamma, 0), pooled(b, gamma, 1), pooled(a, gamma, 1), pooled(b, gamma, 2), pooled(a, gamma, 2));
    printf("wrote %s and %s\n", o->out, png);
}

static void print_json(const options *o, const ds_cal_rounds *cal, const ds_cal_rounds *ev, const float *temp,
                       const ds_cal_metrics *b, const ds_cal_metrics *a, int gamma, const char *png) {
    cJSON *j = cJSON_CreateObject();
    cJSON *pos = cJSON_AddArrayToObject(j, "positions");
    for (int k = 0; k < gamma; k++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "k", k);
        cJSON_AddNumberToObject(p, "n", (double)a[k].n);
        cJSON_AddNumberToObject(p, "ece_before", b[k].ece);
        cJSON_AddNumberToObject(p, "ece_after", a[k].ece);
        cJSON_AddNumberToObject(p, "auroc_before", b[k].auroc);
        cJSON_AddNumberToObject(p, "auroc_after", a[k].auroc);
        cJSON_AddNumberToObject(p, "brier_before", b[k].brier);
        cJSON_AddNumberToObject(p, "brier_after", a[k].brier);
        cJSON_AddItemToArray(pos, p);
    }
    cJSON *t = cJSON_AddArrayToObject(j, "temperatures");
    for (int k = 0; k < gamma; k++) cJSON_AddItemToArray(t, cJSON_CreateNumber(temp[k]));
    cJSON_AddNumberToObject(j, "calibration_rounds", (double)cal->n);
    cJSON_AddNumberToObject(j, "eval_rounds", (double)ev->n);
    cJSON_AddStringToObject(j, "calibration_file", o->cal_file);
    cJSON_AddStringToObject(j, "eval_file", o->eval_file ? o->eval_file : o->cal_file);
    cJSON_AddStringToObject(j, "out", o->out);
    cJSON_AddStringToObject(j, "png", png);
    char *s = cJSON_PrintUnformatted(j);
    puts(s);
    free(s);
    cJSON_Delete(j);
}

typedef struct {
    ds_prompt_list cal, eval;
    ds_engine *eng;
    ds_cal_rounds cal_r, eval_r;
    char out[4096], png[4096];
} run_state;

static ds_error *run(options *o, run_state *st) {
    /* Every prompt file is read before the model opens: a bad line is named at once. */
    DS_TRY(ds_prompt_file_read(o->cal_file, &st->cal));
    if (o->eval_file) DS_TRY(ds_prompt_file_read(o->eval_file, &st->eval));
    if (!o->out) {
        if (!ds_sts_path(o->drafter, st->out, sizeof st->out)) return ds_errorf("%s: path too long", o->drafter);
        o->out = st->out;
    }
    if (o->png) {
        snprintf(st->png, sizeof st->png, "%s", o->png);
    } else {
        size_t len = strlen(o->out);
        if (len >= 5 && !strcmp(o->out + len - 5, ".json")) len -= 5;
        if (snprintf(st->png, sizeof st->png, "%.*s-reliability.png", (int)len, o->out) >= (int)sizeof st->png)
            return ds_errorf("%s: path too long", o->out);
    }
    /* The raw head: any temperature file already there is not read. */
    ds_engine_opts eo = {.model_dir = o->model, .drafter_dir = o->drafter, .backend = o->cuda ? "cuda" : "cpu",
                         .threads = o->threads, .tokenizer = o->tokenizer, .no_sts = true};
    DS_TRY(ds_engine_open(&eo, &st->eng));
    ds_engine_info info;
    ds_engine_get_info(st->eng, &info);
    if (!info.has_confidence)
        return ds_errorf("%s: the drafter has no confidence head (config.json enable_confidence_head)", o->drafter);
    const int G = info.block_size;
    DS_TRY(ds_cal_rounds_init(&st->cal_r, G));
    DS_TRY(ds_cal_rounds_init(&st->eval_r, G));
    DS_TRY(collect(st->eng, o, o->cal_file, &st->cal, G, o->gen.seed, &st->cal_r));
    if (st->cal_r.n == 0) return ds_errorf("%s: no drafting round to calibrate on", o->cal_file);
    if (o->eval_file) DS_TRY(collect(st->eng, o, o->eval_file, &st->eval, G, o->gen.seed + st->cal.n, &st->eval_r));
    const ds_cal_rounds *ev = o->eval_file ? &st->eval_r : &st->cal_r;

    ds_sts sts = {.n = G};
    ds_cal_metrics cal_before[DS_CAL_MAX_GAMMA], cal_after[DS_CAL_MAX_GAMMA], before[DS_CAL_MAX_GAMMA],
        after[DS_CAL_MAX_GAMMA];
    DS_TRY(ds_sts_fit(&st->cal_r, sts.temp));
    DS_TRY(ds_cal_evaluate(&st->cal_r, NULL, cal_before));
    DS_TRY(ds_cal_evaluate(&st->cal_r, sts.temp, cal_after));
    DS_TRY(ds_cal_evaluate(ev, NULL, before));
    DS_TRY(ds_cal_evaluate(ev, sts.temp, after));
    DS_TRY(ds_sts_write(o->out, &sts, fit_record(o, &st->cal_r, cal_before, cal_after, G)));
    char subtitle[512];
    snprintf(subtitle, sizeof subtitle, "EVALUATED ON %.200s (%ld ROUNDS); FITTED ON %.200s (%ld ROUNDS)",
             o->eval_file ? o->eval_file : o->cal_file, ev->n, o->cal_file, st->cal_r.n);
    const ds_reliability_plot plot = {.gamma = G, .before = before, .after = after, .temp = sts.temp,
                                      .subtitle = subtitle};
    DS_TRY(ds_reliability_plot_write(st->png, &plot));
    if (o->json) print_json(o, &st->cal_r, ev, sts.temp, before, after, G, st->png);
    else print_table(o, &st->cal_r, ev, sts.temp, before, after, G, st->png);
    return NULL;
}

int cmd_calibrate(int argc, char **argv) {
    options o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    run_state *st = calloc(1, sizeof *st);
    ds_error *e = st ? run(&o, st) : ds_errorf("out of memory");
    if (st) {
        ds_cal_rounds_free(&st->cal_r);
        ds_cal_rounds_free(&st->eval_r);
        ds_engine_free(st->eng);
        ds_prompt_list_free(&st->cal);
        ds_prompt_list_free(&st->eval);
        free(st);
    }
    if (e) {
        fprintf(stderr, "dspark calibrate: %s\n", ds_error_message(e));
        ds_error_free(e);
        return 1;
    }
    return 0;
}
