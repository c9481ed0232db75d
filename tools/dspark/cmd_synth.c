/* dspark synth: a seeded random bf16 checkpoint with a real model's shapes
 * (Hugging Face directory: config.json, generation_config.json, safetensors
 * sharded at 5 GB with an index), optionally with a DSpark drafter for it
 * (Qwen3DSparkModel or Gemma4DSparkModel: block 7, 5 layers, Markov head,
 * confidence head), for timing the engine at real sizes without real weights. Matrices are N(0, 0.02)
 * (Irwin-Hall approximation: four 16-bit uniforms per value), norm weights
 * 1, biases 0; every 2^20-element chunk has its own generator seeded from
 * (seed, tensor name, chunk), so the bytes do not depend on the thread count. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/rng.h"
#include "base/threadpool.h"
#include "commands.h"
#include "io/safetensors_write.h"
#include "synth.h"

/* google/gemma-4-12B's multimodal part and token ids: its config.json
 * (vision_config, audio_config, the top-level ids), which are
 * Gemma4Unified{Vision,Audio,}Config's defaults but num_soft_tokens. */
static const synth_mm mm_12b = {.patch_size = 16, .pooling = 3, .posemb = 1120, .soft_tokens = 280, .audio_dim = 640,
                                .image_id = 258880, .video_id = 258884, .audio_id = 258881, .boi_id = 255999,
                                .eoi_id = 258882, .boa_id = 256000, .eoa_id = 258883};
/* The same, at gemma4-tiny's size: 6 x 6 pixel patches, ids at the top of its vocabulary. */
static const synth_mm mm_tiny = {.patch_size = 2, .pooling = 3, .posemb = 16, .soft_tokens = 4, .audio_dim = 8,
                                 .image_id = 500, .video_id = 504, .audio_id = 501, .boi_id = 498, .eoi_id = 502,
                                 .boa_id = 499, .eoa_id = 503};

static const preset presets[] = {
    {.like = "qwen3-8b", .fam = FAM_QWEN3, .vocab = 151936, .hidden = 4096, .layers = 36, .heads = 32, .kv_heads = 8,
     .head_dim = 128, .inter = 12288, .max_pos = 40960, .tie = false, .bos = 151643, .eos = 151645, .pad = 151643,
     .d_layers = 5, .d_rank = 256, .gamma = 7, .mask_id = 151669},
    {.like = "qwen3-4b", .fam = FAM_QWEN3, .vocab = 151936, .hidden = 2560, .layers = 36, .heads = 32, .kv_heads = 8,
     .head_dim = 128, .inter = 9728, .max_pos = 40960, .tie = true, .bos = 151643, .eos = 151645, .pad = 151643,
     .d_layers = 5, .d_rank = 256, .gamma = 7, .mask_id = 151669},
    /* Qwen/Qwen3-32B (its config.json): two GPUs' worth of bf16 weights, 65.5 GB (issue 43). No DeepSpec
     * recipe targets it; the drafter is the 8B's (config/dspark/dspark_qwen3_8b.py) at its width. */
    {.like = "qwen3-32b", .fam = FAM_QWEN3, .vocab = 151936, .hidden = 5120, .layers = 64, .heads = 64, .kv_heads = 8,
     .head_dim = 128, .inter = 25600, .max_pos = 40960, .tie = false, .bos = 151643, .eos = 151645, .pad = 151643,
     .d_layers = 5, .d_rank = 256, .gamma = 7, .mask_id = 151669},
    /* A small model of the same family for tests on the CPU. */
    {.like = "tiny", .fam = FAM_QWEN3, .vocab = 512, .hidden = 64, .layers = 8, .heads = 4, .kv_heads = 2,
     .head_dim = 16, .inter = 128, .max_pos = 256, .tie = false, .bos = 1, .eos = 2, .pad = 2, .d_layers = 2,
     .d_rank = 16, .gamma = 7, .mask_id = 3},
    /* google/gemma-4-12B(-it), the "12B Unified" (released 2026-05), the
     * target of DeepSpec's Gemma 4 drafters (config/dflash/dflash_gemma4_12b.py:
     * target google/gemma-4-12B-it, block 7, 5 draft layers, mask_token_id 4;
     * released deepseek-ai/dspark_gemma4_12b_block7). Text tower numbers:
     * transformers' convert_gemma4_unified_weights.py variant "gemma-4-12b"
     * (hidden 3840, intermediate 4 x 3840, 48 layers of 5 sliding : 1 full,
     * 16 heads, 8 KV heads, 1 global KV head, attention_k_eq_v, soft-cap 30)
     * with Gemma4UnifiedTextConfig's defaults for the rest (vocab 262144,
     * head_dim 256, global_head_dim 512, sliding_window 1024,
     * max_position_embeddings 262144). Its text model is Gemma 4's decoder
     * without per-layer inputs or MoE (modular_gemma4_unified.py); it ships
     * as Gemma4UnifiedForConditionalGeneration (model_type gemma4_unified),
     * the layout written by default (--layout text: as Gemma4ForCausalLM). */
    {.like = "gemma4-12b", .fam = FAM_GEMMA4, .vocab = 262144, .hidden = 3840, .layers = 48, .heads = 16,
     .kv_heads = 8, .head_dim = 256, .inter = 15360, .max_pos = 262144, .tie = true, .bos = 2, .eos = 1, .pad = 0,
     .global_head_dim = 512, .global_kv_heads = 1, .window = 1024, .softcap = 30.0, .mm = &mm_12b,
     .unified_default = true, .d_layers = 5, .d_rank = 256, .gamma = 7, .mask_id = 4},
    /* google/gemma-4-31B(-it), dense: transformers' convert_gemma4_weights.py
     * variant "gemma-4-31b" (hidden 5376, intermediate 4 x 5376, 60 layers of
     * 5 sliding : 1 full, 32 heads, 16 KV heads, 4 global KV heads,
     * attention_k_eq_v, sliding_window 1024, soft-cap 30,
     * max_position_embeddings 262144) and Gemma4TextConfig's defaults (vocab
     * 262144, head_dim 256, global_head_dim 512). DeepSpec has no config for
     * it; the drafter's taps follow the rule that gives its 12B list. */
    {.like = "gemma4-31b", .fam = FAM_GEMMA4, .vocab = 262144, .hidden = 5376, .layers = 60, .heads = 32,
     .kv_heads = 16, .head_dim = 256, .inter = 21504, .max_pos = 262144, .tie = true, .bos = 2, .eos = 1, .pad = 0,
     .global_head_dim = 512, .global_kv_heads = 4, .window = 1024, .softcap = 30.0, .d_layers = 5, .d_rank = 256,
     .gamma = 7, .mask_id = 4},
    /* The 12B's structure (48 layers, 5:1, global heads twice as wide with
     * one K = V head, 2:1 grouped sliding heads, proportional RoPE, soft-cap,
     * tied embeddings, the same taps) at a width for tests on the CPU, with
     * a window short enough for the sliding layers to matter. Written as
     * Gemma4ForCausalLM unless --layout unified asks for the 12B's format. */
    {.like = "gemma4-tiny", .fam = FAM_GEMMA4, .vocab = 512, .hidden = 64, .layers = 48, .heads = 4, .kv_heads = 2,
     .head_dim = 16, .inter = 256, .max_pos = 256, .tie = true, .bos = 2, .eos = 1, .pad = 0, .global_head_dim = 32,
     .global_kv_heads = 1, .window = 8, .softcap = 30.0, .mm = &mm_tiny, .d_layers = 5, .d_rank = 16, .gamma = 7,
     .mask_id = 4},
};

#define LIKE_NAMES "qwen3-8b, qwen3-4b, qwen3-32b, tiny, gemma4-12b, gemma4-31b, gemma4-tiny"

#define CHUNK_ELEMS ((size_t)1 << 20)

typedef struct {
    uint64_t seed;
    ds_pool *pool;
    const tensor_list *list;
    /* current block (for the pool's workers) */
    uint16_t *buf;
    size_t e0, n_elems;
    uint64_t uid;
} fill_ctx;

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

void synth_add_tensor(tensor_list *l, int kind, int ndim, int64_t d0, int64_t d1, int64_t d2, const char *fmt, ...) {
    if (l->n >= MAX_TENSORS) return; /* checked by the caller through l->n */
    tensor_info *ti = &l->info[l->n];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ti->name, sizeof ti->name, fmt, ap);
    va_end(ap);
    ti->kind = kind;
    /* The generator is seeded by the text model's own name, so a seed gives
     * the same weights in the unified layout as in the text-only one. */
    static const char nested[] = "model.language_model.";
    ti->uid = fnv1a(ti->name);
    if (!strncmp(ti->name, nested, sizeof nested - 1)) {
        char plain[sizeof ti->name];
        snprintf(plain, sizeof plain, "model.%s", ti->name + sizeof nested - 1);
        ti->uid = fnv1a(plain);
    }
    ds_st_spec *s = &l->spec[l->n];
    *s = (ds_st_spec){.name = ti->name, .dtype = DS_BF16, .ndim = ndim, .shape = {d0, d1, d2}};
    l->n++;
}

/* Most tensors have at most two dimensions. */
#define add_tensor(l, kind, ndim, d0, d1, ...) synth_add_tensor(l, kind, ndim, d0, d1, 0, __VA_ARGS__)

/* One Qwen3 decoder layer's tensors, names prefixed with `pre`. */
static void add_layer(tensor_list *l, const preset *p, const char *pre, int i) {
    const int64_t H = p->hidden, q = (int64_t)p->heads * p->head_dim, kv = (int64_t)p->kv_heads * p->head_dim;
    add_tensor(l, 1, 1, H, 0, "%slayers.%d.input_layernorm.weight", pre, i);
    add_tensor(l, 0, 2, H, p->inter, "%slayers.%d.mlp.down_proj.weight", pre, i);
    add_tensor(l, 0, 2, p->inter, H, "%slayers.%d.mlp.gate_proj.weight", pre, i);
    add_tensor(l, 0, 2, p->inter, H, "%slayers.%d.mlp.up_proj.weight", pre, i);
    add_tensor(l, 1, 1, H, 0, "%slayers.%d.post_attention_layernorm.weight", pre, i);
    add_tensor(l, 1, 1, p->head_dim, 0, "%slayers.%d.self_attn.k_norm.weight", pre, i);
    add_tensor(l, 0, 2, kv, H, "%slayers.%d.self_attn.k_proj.weight", pre, i);
    add_tensor(l, 0, 2, H, q, "%slayers.%d.self_attn.o_proj.weight", pre, i);
    add_tensor(l, 1, 1, p->head_dim, 0, "%slayers.%d.self_attn.q_norm.weight", pre, i);
    add_tensor(l, 0, 2, q, H, "%slayers.%d.self_attn.q_proj.weight", pre, i);
    add_tensor(l, 0, 2, kv, H, "%slayers.%d.self_attn.v_proj.weight", pre, i);
}

/* Gemma 4: layer i is full attention every sixth layer and at the end. */
static bool g4_full(const preset *p, int i) { return (i + 1) % 6 == 0 || i == p->layers - 1; }

/* One Gemma 4 decoder layer's tensors, names prefixed with `pre`: with the
 * full-attention geometry (global_head_dim, global KV heads, K = V: no
 * v_proj, as attention_k_eq_v makes it; every Gemma 4 preset has it) or the
 * sliding one. */
static void add_gemma4_layer(tensor_list *l, const preset *p, const char *pre, int i, bool full) {
    const int64_t H = p->hidden, hd = full ? p->global_head_dim : p->head_dim;
    const int64_t q = p->heads * hd, kv = (full ? p->global_kv_heads : p->kv_heads) * hd;
    add_tensor(l, 1, 1, H, 0, "%slayers.%d.input_layernorm.weight", pre, i);
    add_tensor(l, 1, 1, 1, 0, "%slayers.%d.layer_scalar", pre, i);
    add_tensor(l, 0, 2, H, p->inter, "%slayers.%d.mlp.down_proj.weight", pre, i);
    add_tensor(l, 0, 2, p->inter, H, "%slayers.%d.mlp.gate_proj.weight", pre, i);
    add_tensor(l, 0, 2, p->inter, H, "%slayers.%d.mlp.up_proj.weight", pre, i);
    add_tensor(l, 1, 1, H, 0, "%slayers.%d.post_attention_layernorm.weight", pre, i);
    add_tensor(l, 1, 1, H, 0, "%slayers.%d.post_feedforward_layernorm.weight", pre, i);
    add_tensor(l, 1, 1, H, 0, "%slayers.%d.pre_feedforward_layernorm.weight", pre, i);
    add_tensor(l, 1, 1, hd, 0, "%slayers.%d.self_attn.k_norm.weight", pre, i);
    add_tensor(l, 0, 2, kv, H, "%slayers.%d.self_attn.k_proj.weight", pre, i);
    add_tensor(l, 0, 2, H, q, "%slayers.%d.self_attn.o_proj.weight", pre, i);
    add_tensor(l, 1, 1, hd, 0, "%slayers.%d.self_attn.q_norm.weight", pre, i);
    add_tensor(l, 0, 2, q, H, "%slayers.%d.self_attn.q_proj.weight", pre, i);
    if (!full) add_tensor(l, 0, 2, kv, H, "%slayers.%d.self_attn.v_proj.weight", pre, i);
}

void synth_text_tensors(const preset *p, tensor_list *l, const char *prefix) {
    add_tensor(l, 0, 2, p->vocab, p->hidden, "%sembed_tokens.weight", prefix);
    for (int i = 0; i < p->layers; i++) {
        if (p->fam == FAM_GEMMA4) add_gemma4_layer(l, p, prefix, i, g4_full(p, i));
        else add_layer(l, p, prefix, i);
    }
    add_tensor(l, 1, 1, p->hidden, 0, "%snorm.weight", prefix);
    if (!p->tie) add_tensor(l, 0, 2, p->vocab, p->hidden, "lm_head.weight");
}

static void target_tensors(const preset *p, tensor_list *l) { synth_text_tensors(p, l, "model."); }

/* DFlash/DeepSpec's spread of tapped layers: 1 .. n_target - 3, evenly. */
static void spread_taps(const preset *p, int *taps) {
    if (p->d_layers == 1) {
        taps[0] = p->layers / 2;
        return;
    }
    const double start = 1, span = (p->layers - 3) - start;
    for (int i = 0; i < p->d_layers; i++) {
        double v = start + i * span / (p->d_layers - 1);
        taps[i] = (int)(v + 0.5);
    }
}

/* Gemma 4 taps as DeepSpec chose them for gemma-4-12B ([5, 17, 29, 41, 46]
 * of 48 layers): d_layers - 1 full-attention layers spread evenly (rounded)
 * from the first to the last one before the final layer, then layer
 * n_target - 2. Too few full-attention layers: the DFlash spread. */
static void tap_layers(const preset *p, int *taps) {
    int full[256], nf = 0;
    for (int i = 0; p->fam == FAM_GEMMA4 && i < p->layers - 1 && nf < 256; i++)
        if (g4_full(p, i)) full[nf++] = i;
    const int picks = p->d_layers - 1;
    if (p->fam != FAM_GEMMA4 || picks < 2 || nf < picks || full[nf - 1] >= p->layers - 2) {
        spread_taps(p, taps);
        return;
    }
    for (int i = 0; i < picks; i++) taps[i] = full[(int)((double)i * (nf - 1) / (picks - 1) + 0.5)];
    taps[picks] = p->layers - 2;
}

static void drafter_tensors(const preset *p, tensor_list *l) {
    const int64_t H = p->hidden, V = p->vocab, r = p->d_rank;
    add_tensor(l, 2, 1, 1, 0, "confidence_head.proj.bias");
    add_tensor(l, 0, 2, 1, H + r, "confidence_head.proj.weight");
    add_tensor(l, 0, 2, V, H, "embed_tokens.weight");
    add_tensor(l, 0, 2, H, (int64_t)p->d_layers * H, "fc.weight");
    add_tensor(l, 1, 1, H, 0, "hidden_norm.weight");
    /* Gemma4DSparkModel layers all have the full-attention geometry. */
    for (int i = 0; i < p->d_layers; i++) {
        if (p->fam == FAM_GEMMA4) add_gemma4_layer(l, p, "", i, true);
        else add_layer(l, p, "", i);
    }
    add_tensor(l, 0, 2, V, H, "lm_head.weight");
    add_tensor(l, 0, 2, V, r, "markov_head.markov_w1.weight");
    add_tensor(l, 0, 2, V, r, "markov_head.markov_w2.weight");
    add_tensor(l, 1, 1, H, 0, "norm.weight");
}

static void fill_chunks(void *vctx, int64_t begin, int64_t end, int tid) {
    (void)tid;
    fill_ctx *c = vctx;
    /* Scale: 0.02 / sd of a sum of four uniforms on 0..65535 (65536 * sqrt(1/3)). */
    const float scale = 0.02f / 37837.23f, mean = 4 * 32767.5f;
    for (int64_t k = begin; k < end; k++) {
        size_t first = (size_t)k * CHUNK_ELEMS; /* within the block */
        size_t n = c->n_elems - first < CHUNK_ELEMS ? c->n_elems - first : CHUNK_ELEMS;
        size_t chunk = (c->e0 + first) / CHUNK_ELEMS;
        ds_rng rng;
        ds_rng_seed(&rng, c->seed ^ (c->uid * 0x9e3779b97f4a7c15ull) ^ (chunk * 0xbf58476d1ce4e5b9ull));
        uint16_t *out = c->buf + first;
        for (size_t j = 0; j < n; j++) {
            uint64_t x = ds_rng_next(&rng);
            float s = (float)((x & 0xffff) + ((x >> 16) & 0xffff) + ((x >> 32) & 0xffff) + (x >> 48));
            out[j] = ds_f32_to_bf16((s - mean) * scale);
        }
    }
}

static ds_error *fill(void *user, size_t index, size_t offset, void *buf, size_t nbytes) {
    fill_ctx *c = user;
    const tensor_info *ti = &c->list->info[index];
    uint16_t *b = buf;
    size_t n = nbytes / 2;
    if (ti->kind != 0) {
        uint16_t v = ti->kind == 1 ? 0x3f80 : 0; /* bf16 1.0 / 0.0 */
        for (size_t i = 0; i < n; i++) b[i] = v;
        return NULL;
    }
    if ((offset / 2) % CHUNK_ELEMS) return ds_errorf("write block not aligned to the generator's chunks");
    c->buf = b;
    c->e0 = offset / 2;
    c->n_elems = n;
    c->uid = ti->uid;
    ds_pool_run(c->pool, (int64_t)((n + CHUNK_ELEMS - 1) / CHUNK_ELEMS), 1, fill_chunks, c);
    return NULL;
}

static ds_error *write_text(const char *dir, const char *name, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return ds_errorf("%s: cannot create: %s", path, strerror(errno));
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n && fputc('\n', f) != EOF;
    if (fclose(f) || !ok) return ds_errorf("%s: write failed", path);
    return NULL;
}

static ds_error *write_json(const char *dir, const char *name, cJSON *o) {
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (!s) return ds_errorf("%s/%s: out of memory", dir, name);
    ds_error *e = write_text(dir, name, s);
    free(s);
    return e;
}

static ds_error *make_dir(const char *dir) {
    if (mkdir(dir, 0755) && errno != EEXIST) return ds_errorf("%s: cannot create directory: %s", dir, strerror(errno));
    return NULL;
}

/* Fields both configs share (Qwen3 backbone). */
static cJSON *base_config(const preset *p, const char *arch, int layers) {
    cJSON *o = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(arch));
    cJSON_AddBoolToObject(o, "attention_bias", false);
    cJSON_AddNumberToObject(o, "attention_dropout", 0.0);
    cJSON_AddNumberToObject(o, "bos_token_id", p->bos);
    cJSON_AddStringToObject(o, "dtype", "bfloat16");
    cJSON_AddNumberToObject(o, "eos_token_id", p->eos);
    cJSON_AddNumberToObject(o, "head_dim", p->head_dim);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "hidden_size", p->hidden);
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    cJSON_AddNumberToObject(o, "intermediate_size", p->inter);
    cJSON *lt = cJSON_AddArrayToObject(o, "layer_types");
    for (int i = 0; i < layers; i++) cJSON_AddItemToArray(lt, cJSON_CreateString("full_attention"));
    cJSON_AddNumberToObject(o, "max_position_embeddings", p->max_pos);
    cJSON_AddNumberToObject(o, "max_window_layers", layers);
    cJSON_AddStringToObject(o, "model_type", "qwen3");
    cJSON_AddNumberToObject(o, "num_attention_heads", p->heads);
    cJSON_AddNumberToObject(o, "num_hidden_layers", layers);
    cJSON_AddNumberToObject(o, "num_key_value_heads", p->kv_heads);
    cJSON_AddNumberToObject(o, "rms_norm_eps", 1e-6);
    cJSON *rp = cJSON_AddObjectToObject(o, "rope_parameters");
    cJSON_AddNumberToObject(rp, "rope_theta", 1000000.0);
    cJSON_AddStringToObject(rp, "rope_type", "default");
    cJSON_AddNullToObject(o, "sliding_window");
    cJSON_AddBoolToObject(o, "use_cache", true);
    cJSON_AddBoolToObject(o, "use_sliding_window", false);
    cJSON_AddNumberToObject(o, "vocab_size", p->vocab);
    return o;
}

/* A float field as Python writes it (the shortest text that reads back, with
 * a decimal point or exponent: 30.0, not 30): transformers' strict configs
 * refuse an integer where the field is a float (final_logit_softcapping). */
void synth_add_float(cJSON *o, const char *key, double v) {
    char buf[64];
    if (v > -1e15 && v < 1e15 && (double)(long long)v == v) {
        snprintf(buf, sizeof buf, "%.1f", v);
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, v);
            if (strtod(buf, NULL) == v) break;
        }
        if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
    }
    cJSON_AddRawToObject(o, key, buf);
}

/* A Gemma 4 text config (gemma4_text) as transformers writes the released
 * ones' text_config: the layout with top-level global_head_dim /
 * num_global_key_value_heads, which every transformers version with Gemma 4
 * reads (newer ones rebuild per_layer_config from it) and DeepSpec's
 * Gemma 4 drafter requires. The drafter's has `layers` all full_attention. */
static cJSON *gemma4_config(const preset *p, const char *arch, int layers, bool drafter) {
    cJSON *o = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(arch));
    cJSON_AddBoolToObject(o, "attention_bias", false);
    synth_add_float(o, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(o, "attention_k_eq_v", true);
    cJSON_AddNumberToObject(o, "bos_token_id", p->bos);
    cJSON_AddStringToObject(o, "dtype", "bfloat16");
    cJSON_AddBoolToObject(o, "enable_moe_block", false);
    cJSON_AddNumberToObject(o, "eos_token_id", p->eos);
    synth_add_float(o, "final_logit_softcapping", p->softcap);
    cJSON_AddNumberToObject(o, "global_head_dim", p->global_head_dim);
    cJSON_AddNumberToObject(o, "head_dim", p->head_dim);
    cJSON_AddStringToObject(o, "hidden_activation", "gelu_pytorch_tanh");
    cJSON_AddNumberToObject(o, "hidden_size", p->hidden);
    cJSON_AddNumberToObject(o, "hidden_size_per_layer_input", 0);
    synth_add_float(o, "initializer_range", 0.02);
    cJSON_AddNumberToObject(o, "intermediate_size", p->inter);
    cJSON *lt = cJSON_AddArrayToObject(o, "layer_types");
    for (int i = 0; i < layers; i++)
        cJSON_AddItemToArray(
            lt, cJSON_CreateString(drafter || g4_full(p, i) ? "full_attention" : "sliding_attention"));
    cJSON_AddNumberToObject(o, "max_position_embeddings", p->max_pos);
    cJSON_AddStringToObject(o, "model_type", "gemma4_text");
    cJSON_AddNullToObject(o, "moe_intermediate_size");
    cJSON_AddNumberToObject(o, "num_attention_heads", p->heads);
    cJSON_AddNullToObject(o, "num_experts");
    cJSON_AddNumberToObject(o, "num_global_key_value_heads", p->global_kv_heads);
    cJSON_AddNumberToObject(o, "num_hidden_layers", layers);
    cJSON_AddNumberToObject(o, "num_key_value_heads", p->kv_heads);
    cJSON_AddNumberToObject(o, "num_kv_shared_layers", 0);
    cJSON_AddNumberToObject(o, "pad_token_id", p->pad);
    synth_add_float(o, "rms_norm_eps", 1e-6);
    cJSON *rp = cJSON_AddObjectToObject(o, "rope_parameters");
    cJSON *full = cJSON_AddObjectToObject(rp, "full_attention");
    synth_add_float(full, "partial_rotary_factor", 0.25);
    synth_add_float(full, "rope_theta", 1000000.0);
    cJSON_AddStringToObject(full, "rope_type", "proportional");
    cJSON *sl = cJSON_AddObjectToObject(rp, "sliding_attention");
    synth_add_float(sl, "rope_theta", 10000.0);
    cJSON_AddStringToObject(sl, "rope_type", "default");
    cJSON_AddNumberToObject(o, "sliding_window", p->window);
    cJSON_AddNullToObject(o, "top_k_experts");
    /* Bidirectional for image tokens only; text is causal. */
    cJSON_AddStringToObject(o, "use_bidirectional_attention", "vision");
    cJSON_AddBoolToObject(o, "use_cache", true);
    cJSON_AddBoolToObject(o, "use_double_wide_mlp", false);
    cJSON_AddNumberToObject(o, "vocab_size", p->vocab);
    cJSON_AddNumberToObject(o, "vocab_size_per_layer_input", p->vocab);
    return o;
}

/* Writes the tensors as model.safetensors, or as shards of at most
 * shard_bytes with model.safetensors.index.json when they do not fit one. */
static ds_error *write_weights(const char *dir, const tensor_list *l, fill_ctx *fc, size_t shard_bytes,
                               bool write, size_t *total_out) {
    size_t n_shards = 0, total = 0, cur = 0;
    int shard_of[MAX_TENSORS];
    for (size_t i = 0; i < l->n; i++) {
        size_t nb = ds_st_spec_nbytes(&l->spec[i]);
        if (cur > 0 && cur + nb > shard_bytes) {
            n_shards++;
            cur = 0;
        }
        shard_of[i] = (int)n_shards;
        cur += nb;
        total += nb;
    }
    n_shards++;
    *total_out = total;
    if (!write) return NULL;
    char path[4096], file[64];
    cJSON *map = n_shards > 1 ? cJSON_CreateObject() : NULL;
    for (size_t s = 0, i0 = 0; s < n_shards; s++) {
        size_t i1 = i0;
        while (i1 < l->n && shard_of[i1] == (int)s) i1++;
        if (n_shards > 1) snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", s + 1, n_shards);
        else snprintf(file, sizeof file, "model.safetensors");
        snprintf(path, sizeof path, "%s/%s", dir, file);
        ds_error *e = ds_safetensors_write(path, &l->spec[i0], i1 - i0, 0, fill, fc);
        if (e) {
            cJSON_Delete(map);
            return e;
        }
        for (size_t i = i0; map && i < i1; i++) cJSON_AddStringToObject(map, l->info[i].name, file);
        fprintf(stderr, "dspark synth: wrote %s\n", path);
        i0 = i1;
    }
    if (!map) return NULL;
    cJSON *idx = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(idx, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON_AddItemToObject(idx, "weight_map", map);
    return write_json(dir, "model.safetensors.index.json", idx);
}

/* What to write: configs, weights (or only their size), where to. */
typedef struct {
    fill_ctx *fc;
    size_t shard_bytes;
    bool weights;
    bool unified; /* Gemma 4: the Gemma4UnifiedForConditionalGeneration layout (synth_unified.c) */
    tensor_list *l;
} write_opts;

/* Lists the tensors list_tensors names for p and writes them as dir's
 * weights (or only sums their bytes). */
static ds_error *write_tensors(const preset *p, const char *dir, void (*list_tensors)(const preset *, tensor_list *),
                               const write_opts *w, size_t *bytes) {
    tensor_list *l = w->l;
    l->n = 0;
    list_tensors(p, l);
    if (l->n >= MAX_TENSORS) return ds_errorf("%s: too many tensors", dir);
    w->fc->list = l;
    return write_weights(dir, l, w->fc, w->shard_bytes, w->weights, bytes);
}

static ds_error *write_target(const preset *p, const char *dir, const write_opts *w, size_t *bytes) {
    DS_TRY(make_dir(dir));
    const bool g4 = p->fam == FAM_GEMMA4;
    cJSON *cfg = g4 ? gemma4_config(p, "Gemma4ForCausalLM", p->layers, false)
                    : base_config(p, "Qwen3ForCausalLM", p->layers);
    cJSON_AddBoolToObject(cfg, "tie_word_embeddings", p->tie);
    if (w->unified) cfg = synth_unified_config(p, cfg);
    DS_TRY(write_json(dir, "config.json", cfg));
    cJSON *g = cJSON_CreateObject();
    cJSON_AddNumberToObject(g, "bos_token_id", p->bos);
    cJSON *eos = cJSON_AddArrayToObject(g, "eos_token_id");
    cJSON_AddItemToArray(eos, cJSON_CreateNumber(p->eos));
    if (g4) {
        /* The released Gemma 4 stop ids: <eos>, <turn|>, <|tool_response>. */
        cJSON_AddItemToArray(eos, cJSON_CreateNumber(106));
        cJSON_AddItemToArray(eos, cJSON_CreateNumber(50));
    } else {
        cJSON_AddItemToArray(eos, cJSON_CreateNumber(p->bos));
    }
    cJSON_AddNumberToObject(g, "pad_token_id", p->pad);
    cJSON_AddBoolToObject(g, "do_sample", false);
    DS_TRY(write_json(dir, "generation_config.json", g));
    return write_tensors(p, dir, w->unified ? synth_unified_tensors : target_tensors, w, bytes);
}

static ds_error *write_drafter(const preset *p, const char *dir, const write_opts *w, size_t *bytes) {
    DS_TRY(make_dir(dir));
    const bool g4 = p->fam == FAM_GEMMA4;
    cJSON *cfg = g4 ? gemma4_config(p, "Gemma4DSparkModel", p->d_layers, true)
                    : base_config(p, "Qwen3DSparkModel", p->d_layers);
    cJSON_AddNumberToObject(cfg, "block_size", p->gamma);
    cJSON_AddBoolToObject(cfg, "confidence_head_with_markov", true);
    cJSON_AddBoolToObject(cfg, "enable_confidence_head", true);
    cJSON_AddStringToObject(cfg, "markov_head_type", "vanilla");
    cJSON_AddNumberToObject(cfg, "markov_rank", p->d_rank);
    cJSON_AddNumberToObject(cfg, "mask_token_id", p->mask_id);
    if (g4) {
        /* Gemma4DSparkModel requires these (num_anchors: DeepSpec's 12B config). */
        cJSON_AddNumberToObject(cfg, "num_anchors", 512);
        /* DeepSpec's build_draft_config copies the target's text config (a
         * Gemma4UnifiedTextConfig for the unified layout) and records both types. */
        if (w->unified)
            cJSON_ReplaceItemInObjectCaseSensitive(cfg, "model_type", cJSON_CreateString("gemma4_unified_text"));
        cJSON_AddStringToObject(cfg, "target_model_type", w->unified ? "gemma4_unified" : "gemma4");
        cJSON_AddStringToObject(cfg, "target_text_model_type", w->unified ? "gemma4_unified_text" : "gemma4_text");
    }
    cJSON_AddNumberToObject(cfg, "num_target_layers", p->layers);
    int taps[16];
    tap_layers(p, taps);
    cJSON *t = cJSON_AddArrayToObject(cfg, "target_layer_ids");
    for (int i = 0; i < p->d_layers; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(taps[i]));
    cJSON_AddBoolToObject(cfg, "tie_word_embeddings", false);
    DS_TRY(write_json(dir, "config.json", cfg));
    return write_tensors(p, dir, drafter_tensors, w, bytes);
}

static void usage(FILE *f) {
    fprintf(f, "usage: dspark synth --like NAME --out DIR [--drafter [--drafter-out DDIR]] [--config-only]\n"
               "                    [--layout text|unified] [--seed S] [--threads N] [--shard-size BYTES]\n"
               "\n"
               "  Writes a random bf16 checkpoint with the named model's real shapes and config\n"
               "  (seeded: the same seed gives the same bytes). NAME is one of\n"
               "    qwen3-8b, qwen3-4b    Qwen/Qwen3-8B, Qwen/Qwen3-4B\n"
               "    qwen3-32b             Qwen/Qwen3-32B (two GPUs' worth: tensor parallel)\n"
               "    gemma4-12b            google/gemma-4-12B (\"12B Unified\") as released:\n"
               "                          Gemma4UnifiedForConditionalGeneration (text model under\n"
               "                          model.language_model., vision/audio projections);\n"
               "                          DeepSpec's Gemma 4 target\n"
               "    gemma4-31b            google/gemma-4-31B (dense): its text model\n"
               "    tiny, gemma4-tiny     small models of each family, for tests\n"
               "  --drafter also writes a DSpark drafter for it (Qwen3DSparkModel or\n"
               "  Gemma4DSparkModel: block 7, 5 layers, Markov rank 256, confidence head)\n"
               "  to DDIR (default DIR-dspark). Shards hold at most BYTES (default 5e9).\n"
               "  --config-only writes the configs and reports the weights' size without\n"
               "  writing them. --layout (Gemma 4 12B and tiny) picks the format: text, the\n"
               "  text model alone as Gemma4ForCausalLM (gemma4-tiny's default), or unified,\n"
               "  the 12B's released one (its default); a seed gives the same text weights in\n"
               "  both. Not available: Gemma 4 E2B/E4B (per-layer inputs, which\n"
               "  DeepSpec's Gemma 4 drafter does not support) and 26B-A4B (MoE, which the\n"
               "  engine does not run).\n");
}

int cmd_synth(int argc, char **argv) {
    enum { O_LIKE = 256, O_OUT, O_DRAFTER, O_DRAFTER_OUT, O_SEED, O_THREADS, O_SHARD, O_CONFIG_ONLY, O_LAYOUT };
    static const struct option longs[] = {
        {"like", required_argument, 0, O_LIKE}, {"out", required_argument, 0, O_OUT},
        {"drafter", no_argument, 0, O_DRAFTER}, {"drafter-out", required_argument, 0, O_DRAFTER_OUT},
        {"seed", required_argument, 0, O_SEED}, {"threads", required_argument, 0, O_THREADS},
        {"shard-size", required_argument, 0, O_SHARD}, {"config-only", no_argument, 0, O_CONFIG_ONLY},
        {"layout", required_argument, 0, O_LAYOUT},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *like = NULL, *out = NULL, *dout = NULL, *layout = NULL;
    bool drafter = false, config_only = false;
    uint64_t seed = 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cpus > 0 ? (int)cpus : 1;
    double shard = 5e9;
    char *end;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case O_LIKE: like = optarg; break;
        case O_OUT: out = optarg; break;
        case O_DRAFTER: drafter = true; break;
        case O_DRAFTER_OUT: dout = optarg; drafter = true; break;
        case O_CONFIG_ONLY: config_only = true; break;
        case O_LAYOUT: layout = optarg; break;
        case O_SEED:
            seed = strtoull(optarg, &end, 10);
            if (*end || end == optarg) goto bad_num;
            break;
        case O_THREADS: {
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 1 || v > 1024) goto bad_num;
            threads = (int)v;
            break;
        }
        case O_SHARD:
            shard = strtod(optarg, &end);
            if (*end || end == optarg || !(shard >= 1)) goto bad_num;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc || !like || !out) {
        usage(stderr);
        return 2;
    }
    const preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].like, like)) p = &presets[i];
    if (!p) {
        if (!strncmp(like, "gemma4-e", 8) || !strncmp(like, "gemma4-26b", 10))
            fprintf(stderr,
                    "dspark synth: --like %s is not available: Gemma 4 E2B/E4B have per-layer inputs, which "
                    "DeepSpec's Gemma 4 drafter does not support, and 26B-A4B is MoE, which the engine does not "
                    "run (available: " LIKE_NAMES ")\n",
                    like);
        else fprintf(stderr, "dspark synth: unknown --like '%s' (" LIKE_NAMES ")\n", like);
        return 2;
    }
    bool unified = p->unified_default;
    if (layout && !strcmp(layout, "unified") && p->mm) {
        unified = true;
    } else if (layout && !strcmp(layout, "text") && p->fam == FAM_GEMMA4) {
        unified = false;
    } else if (layout) {
        fprintf(stderr, "dspark synth: --layout %s is not available for %s (text, unified: gemma4-12b, gemma4-tiny)\n",
                layout, like);
        return 2;
    }
    char ddir[4096];
    snprintf(ddir, sizeof ddir, "%s-dspark", out);
    if (dout) snprintf(ddir, sizeof ddir, "%s", dout);

    tensor_list *l = malloc(sizeof *l);
    ds_pool *pool = ds_pool_new(threads);
    if (!l || !pool) {
        free(l);
        ds_pool_free(pool);
        fprintf(stderr, "dspark synth: out of memory\n");
        return 1;
    }
    fill_ctx fc = {.seed = seed, .pool = pool};
    write_opts w = {.fc = &fc, .shard_bytes = (size_t)shard, .weights = !config_only, .unified = unified, .l = l};
    size_t tb = 0, db = 0;
    double t0 = ds_now_s();
    ds_error *e = write_target(p, out, &w, &tb);
    double t1 = ds_now_s();
    if (!e && drafter) {
        fc.seed = seed ^ 0x5bd1e995ull; /* the drafter's own stream */
        e = write_drafter(p, ddir, &w, &db);
    }
    double t2 = ds_now_s();
    free(l);
    ds_pool_free(pool);
    if (e) {
        fprintf(stderr, "dspark synth: %s\n", ds_error_message(e));
        ds_error_free(e);
        return 1;
    }
    printf("{\"like\":\"%s\",\"target\":\"%s\",\"target_bytes\":%zu,\"target_write_s\":%.2f", like, out, tb, t1 - t0);
    if (drafter) printf(",\"drafter\":\"%s\",\"drafter_bytes\":%zu,\"drafter_write_s\":%.2f", ddir, db, t2 - t1);
    printf(",\"layout\":\"%s\",\"seed\":%llu,\"threads\":%d,\"weights_written\":%s}\n",
           p->fam == FAM_GEMMA4 ? (unified ? "unified" : "text") : "text", (unsigned long long)seed, threads,
           config_only ? "false" : "true");
    return 0;
bad_num:
    fprintf(stderr, "dspark synth: bad value '%s' (--seed >= 0, --threads 1..1024, --shard-size >= 1)\n", optarg);
    return 2;
}
