/* dspark serve: the OpenAI-compatible server (src/serve/) on a batched
 * engine. This file is flags, the engine's opening and the signals:
 * SIGTERM / SIGINT are blocked in every thread (before any is started) and
 * taken here with sigwait, so shutdown runs as ordinary code in the main
 * thread, not in a signal handler. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "cli_choice.h"
#include "cli_num.h"
#include "commands.h"
#include "dspark.h"
#include "serve/serve.h"
#include "size_arg.h"

typedef struct {
    const char *model, *drafter, *tokenizer, *sts, *sps_cache, *model_name;
    bool no_draft, no_sts, cuda, schedule_confidence;
    int threads, batch, ctx, max_queue, default_max_tokens, gamma;
    int tp; /* --tp N: the target split across N ranks */
    float threshold;
    int64_t kv_mem; /* --kv-mem SIZE: the KV pool from a byte budget (0: batch x ctx) */
    double grace_s;
    ds_server_opts srv;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspark serve [-m MODEL_DIR] [-d DRAFTER_DIR | --no-draft] [--host ADDR] [--port N]\n"
            "                    [--batch N] [--ctx N] [--kv-mem SIZE] [--schedule fixed|confidence] [--api-key KEY]\n"
            "                    [--backend cpu|cuda] [--threads N] [--max-queue N] [--model-name NAME]\n"
            "                    [--tokenizer PATH] [--threshold C] [--gamma G] [--sts FILE | --no-sts]\n"
            "                    [--sps-cache FILE] [--max-tokens N] [--max-connections N] [--max-body BYTES]\n"
            "                    [--grace S] [--tp N]\n"
            "\n"
            "An OpenAI-compatible HTTP server on the batched engine:\n"
            "  POST /v1/completions, POST /v1/chat/completions (stream: Server-Sent Events),\n"
            "  GET /v1/models, GET /health, GET /metrics (Prometheus, vLLM's names), GET / (a chat page).\n"
            "\n"
            "  -m DIR             target model directory (default: the bundled pico-qwen3)\n"
            "  -d DIR             drafter directory (default with the bundled model: pico-qwen3-dspark)\n"
            "  --no-draft         plain autoregressive decoding\n"
            "  --host ADDR        address to listen on (default 127.0.0.1)\n"
            "  --port N           port (default 8080; 0: any free port). The bound port is printed on\n"
            "                     standard error: \"listening on http://HOST:PORT\"\n"
            "  --batch N          requests in flight at once (default 8)\n"
            "  --ctx N            tokens a request may hold, prompt and output (default 2048, capped at\n"
            "                     the model's context); the KV pool holds batch x ctx tokens\n"
            "  --kv-mem SIZE      the KV pool (target and drafter) from a byte budget instead, e.g. 512M, 8G\n"
            "                     (requests beyond what it holds wait or are preempted and recomputed)\n"
            "  --schedule S       fixed (each proposal whole, default) or confidence (SPEC 6 Algorithm 1;\n"
            "                     needs a drafter with a confidence head; --sps-cache FILE keeps the profile)\n"
            "  --api-key KEY      /v1/ requires \"Authorization: Bearer KEY\" (401 otherwise)\n"
            "  --max-queue N      requests queued beyond --batch before the server answers 429 (default 256)\n"
            "  --max-tokens N     new tokens when a request gives no max_tokens (default 128, as generate)\n"
            "  --threshold C, --gamma G, --sts FILE, --no-sts   as dspark generate\n"
            "  --model-name NAME  the model's name in /v1/models (default: the model directory's name)\n"
            "  --max-connections N  concurrent connections, one thread each (default 512)\n"
            "  --max-body BYTES   request body limit (default 1048576; more: 413)\n"
            "  --grace S          on SIGTERM / SIGINT: seconds the requests in flight get to finish before\n"
            "                     they are cancelled (default 30); new requests get 503 meanwhile\n"
            "  --backend B        cpu (default) or cuda;  --threads N  CPU threads (default: all)\n"
            "  --tp N             tensor parallel: the target (Qwen3, Gemma 4) split across N ranks, one thread\n"
            "                     each (CUDA: GPUs 0..N-1; CPU: the threads shared out), the drafter on every\n"
            "                     rank; every step runs on all ranks, the server talks to rank 0\n");
}

static int int_arg(const char *s, char **end) {
    long v = strtol(s, end, 10);
    if (v < -2147483647L || v > 2147483647L) *end = (char *)s;
    return (int)v;
}

static int parse_args(int argc, char **argv, options *o) {
    enum { O_NO_DRAFT = 256, O_HOST, O_PORT, O_BATCH, O_CTX, O_SCHEDULE, O_API_KEY, O_BACKEND, O_THREADS,
           O_MAX_QUEUE, O_MODEL_NAME, O_TOKENIZER, O_THRESHOLD, O_GAMMA, O_STS, O_NO_STS, O_SPS_CACHE,
           O_MAX_TOKENS, O_MAX_CONN, O_MAX_BODY, O_GRACE, O_KV_MEM, O_TP };
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'}, {"drafter", required_argument, 0, 'd'},
        {"no-draft", no_argument, 0, O_NO_DRAFT}, {"host", required_argument, 0, O_HOST},
        {"port", required_argument, 0, O_PORT}, {"batch", required_argument, 0, O_BATCH},
        {"ctx", required_argument, 0, O_CTX}, {"schedule", required_argument, 0, O_SCHEDULE},
        {"api-key", required_argument, 0, O_API_KEY}, {"backend", required_argument, 0, O_BACKEND},
        {"threads", required_argument, 0, O_THREADS}, {"max-queue", required_argument, 0, O_MAX_QUEUE},
        {"model-name", required_argument, 0, O_MODEL_NAME}, {"tokenizer", required_argument, 0, O_TOKENIZER},
        {"threshold", required_argument, 0, O_THRESHOLD}, {"gamma", required_argument, 0, O_GAMMA},
        {"sts", required_argument, 0, O_STS}, {"no-sts", no_argument, 0, O_NO_STS},
        {"sps-cache", required_argument, 0, O_SPS_CACHE}, {"max-tokens", required_argument, 0, O_MAX_TOKENS},
        {"max-connections", required_argument, 0, O_MAX_CONN}, {"max-body", required_argument, 0, O_MAX_BODY},
        {"grace", required_argument, 0, O_GRACE}, {"kv-mem", required_argument, 0, O_KV_MEM},
        {"tp", required_argument, 0, O_TP},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = cpus > 0 ? (int)cpus : 1;
    o->batch = 8;
    o->ctx = 2048;
    o->max_queue = 256;
    o->default_max_tokens = 128;
    o->grace_s = 30;
    o->srv = (ds_server_opts){.host = "127.0.0.1", .port = 8080, .max_connections = 512, .max_body = 1 << 20,
                              .max_headers = 64};
    optind = 1;
    int c;
    char *end;
#define NUM(dst, conv, what) CLI_NUM("serve", dst, conv, what)
    long long body = o->srv.max_body;
    while ((c = getopt_long(argc, argv, "m:d:h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'd': o->drafter = optarg; break;
        case O_NO_DRAFT: o->no_draft = true; break;
        case O_HOST: o->srv.host = optarg; break;
        case O_PORT: NUM(o->srv.port, int_arg(optarg, &end), "--port"); break;
        case O_BATCH: NUM(o->batch, int_arg(optarg, &end), "--batch"); break;
        case O_CTX: NUM(o->ctx, int_arg(optarg, &end), "--ctx"); break;
        case O_API_KEY: o->srv.api_key = optarg; break;
        case O_THREADS: NUM(o->threads, int_arg(optarg, &end), "--threads"); break;
        case O_TP: NUM(o->tp, int_arg(optarg, &end), "--tp"); break;
        case O_MAX_QUEUE: NUM(o->max_queue, int_arg(optarg, &end), "--max-queue"); break;
        case O_MODEL_NAME: o->model_name = optarg; break;
        case O_TOKENIZER: o->tokenizer = optarg; break;
        case O_THRESHOLD: NUM(o->threshold, strtof(optarg, &end), "--threshold"); break;
        case O_GAMMA: NUM(o->gamma, int_arg(optarg, &end), "--gamma"); break;
        case O_STS: o->sts = optarg; break;
        case O_NO_STS: o->no_sts = true; break;
        case O_SPS_CACHE: o->sps_cache = optarg; break;
        case O_MAX_TOKENS: NUM(o->default_max_tokens, int_arg(optarg, &end), "--max-tokens"); break;
        case O_MAX_CONN: NUM(o->srv.max_connections, int_arg(optarg, &end), "--max-connections"); break;
        case O_MAX_BODY: NUM(body, strtoll(optarg, &end, 10), "--max-body"); break;
        case O_GRACE: NUM(o->grace_s, strtod(optarg, &end), "--grace"); break;
        case O_KV_MEM: {
            ds_error *e = ds_size_arg("--kv-mem", optarg, &o->kv_mem);
            if (e) {
                fprintf(stderr, "dspark serve: %s\n", ds_error_message(e));
                ds_error_free(e);
                return 2;
            }
            break;
        }
        case O_SCHEDULE: {
            const int c = cli_choice("serve", "--schedule", optarg, (const char *const[]){"fixed", "confidence", NULL});
            if (c < 0) return 2;
            o->schedule_confidence = c == 1;
            break;
        }
        case O_BACKEND: {
            const int b = cli_choice("serve", "--backend", optarg, CLI_BACKENDS);
            if (b < 0) return 2;
            o->cuda = b == 1;
            break;
        }
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
    }
#undef NUM
    if (optind < argc) {
        fprintf(stderr, "dspark serve: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    char bad[160] = "";
    if (!(o->srv.port >= 0 && o->srv.port <= 65535)) snprintf(bad, sizeof bad, "--port must be in [0, 65535]");
    else if (!(o->batch >= 1)) snprintf(bad, sizeof bad, "--batch must be >= 1, got %d", o->batch);
    else if (!(o->ctx >= 2)) snprintf(bad, sizeof bad, "--ctx must be >= 2, got %d", o->ctx);
    else if (!(o->max_queue >= 0)) snprintf(bad, sizeof bad, "--max-queue must be >= 0, got %d", o->max_queue);
    else if (!(o->threads >= 1)) snprintf(bad, sizeof bad, "--threads must be >= 1, got %d", o->threads);
    else if (!(o->tp >= 0 && o->tp <= 64)) snprintf(bad, sizeof bad, "--tp must be in 1..64, got %d", o->tp);
    else if (!(o->default_max_tokens >= 1)) snprintf(bad, sizeof bad, "--max-tokens must be >= 1");
    else if (!(o->threshold >= 0 && o->threshold <= 1)) snprintf(bad, sizeof bad, "--threshold must be in [0, 1]");
    else if (!(o->gamma >= 0)) snprintf(bad, sizeof bad, "--gamma must be >= 1");
    else if (!(o->srv.max_connections >= 1)) snprintf(bad, sizeof bad, "--max-connections must be >= 1");
    else if (!(body >= 64 && body <= (1LL << 30))) snprintf(bad, sizeof bad, "--max-body must be in [64, 2^30]");
    else if (!(o->grace_s >= 0 && o->grace_s <= 86400)) snprintf(bad, sizeof bad, "--grace must be in [0, 86400]");
    else if (o->sts && o->no_sts) snprintf(bad, sizeof bad, "give at most one of --sts FILE and --no-sts");
    if (*bad) {
        fprintf(stderr, "dspark serve: %s\n", bad);
        return 2;
    }
    o->srv.max_body = (size_t)body;
    return 0;
}

/* The model directory's last path component: what /v1/models lists. */
static const char *dir_name(const char *dir, char *buf, size_t n) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && dir[start - 1] != '/') start--;
    snprintf(buf, n, "%.*s", (int)(len - start), dir + start);
    return buf;
}

int cmd_serve(int argc, char **argv) {
    options o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;

    /* Before any thread exists (the engine's pool, the server's): every
     * thread inherits the mask, and only sigwait below takes them. A
     * client that hangs up must not kill the process with SIGPIPE. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    const char *model = o.model ? o.model : DS_DEFAULT_MODEL_DIR "/pico-qwen3";
    const char *drafter = o.drafter;
    if (!drafter && !o.model) drafter = DS_DEFAULT_MODEL_DIR "/pico-qwen3-dspark";
    if (o.no_draft) drafter = NULL;
    ds_engine_opts eo = {.model_dir = model, .drafter_dir = drafter, .backend = o.cuda ? "cuda" : "cpu",
                         .threads = o.threads, .tokenizer = o.tokenizer, .sts = o.sts,
                         .no_sts = o.no_sts || !drafter, .batch = o.batch, .ctx = o.ctx, .kv_mem = o.kv_mem,
                         .confidence_schedule = o.schedule_confidence, .sps_cache = o.sps_cache, .tp = o.tp};
    ds_engine *engine = NULL;
    ds_server *server = NULL;
    ds_error *e = ds_engine_open(&eo, &engine);
    ds_engine_info info = {0};
    if (!e) {
        ds_engine_get_info(engine, &info);
        if (o.gamma > 0 && info.has_drafter && o.gamma > info.block_size)
            e = ds_errorf("--gamma %d is above the drafter's block size %d", o.gamma, info.block_size);
    }
    char name[256];
    if (!e) {
        o.srv.model_name = o.model_name ? o.model_name : dir_name(model, name, sizeof name);
        /* A request holds at most --ctx tokens, and never more than the model's context. */
        int ctx = o.ctx < info.context ? o.ctx : info.context;
        long long live = (long long)o.batch + o.max_queue;
        o.srv.loop = (ds_loop_opts){.max_live = live > 1000000 ? 1000000 : (int)live, .ctx = ctx,
                                    .default_max_tokens = o.default_max_tokens, .threshold = o.threshold,
                                    .gamma = o.gamma};
        e = ds_server_start(engine, &o.srv, &server);
    }
    if (e) {
        fprintf(stderr, "dspark serve: %s\n", ds_error_message(e));
        ds_error_free(e);
        ds_engine_free(engine);
        return 1;
    }
    if (ds_server_plain_chat(server))
        fprintf(stderr, "dspark serve: %s has no chat template: chat requests are rendered as a plain "
                        "\"User: ...\\n\\nAssistant:\" transcript, the answer stopped at \"\\nUser:\"\n", model);
    char pool[192];
    ds_kv_pool_line(&info, pool, sizeof pool);
    fprintf(stderr, "dspark serve: %s\n", pool);
    const char *host = o.srv.host;
    fprintf(stderr, "dspark serve: %s%s%s, batch %d, ctx %d, schedule %s, tp %d\n", o.srv.model_name,
            drafter ? " + drafter " : "", drafter ? drafter : "", o.batch, o.srv.loop.ctx,
            o.schedule_confidence ? "confidence" : "fixed", o.tp > 1 ? o.tp : 1);
    fprintf(stderr, "listening on http://%s%s%s:%d\n", strchr(host, ':') ? "[" : "", host,
            strchr(host, ':') ? "]" : "", ds_server_port(server));
    fflush(stderr);

    int sig = 0;
    while (sigwait(&stop, &sig) == EINTR) {
    }
    fprintf(stderr, "dspark serve: %s: finishing the requests in flight (up to %g s), then exiting\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", o.grace_s);
    ds_server_shutdown(server, o.grace_s);
    ds_server_free(server);
    ds_engine_free(engine);
    fprintf(stderr, "dspark serve: stopped\n");
    return 0;
}
