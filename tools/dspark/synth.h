/* What dspark synth's files share: the model presets, the tensor list a
 * checkpoint is written from, and the Gemma 4 "unified" layout
 * (synth_unified.c), the format google/gemma-4-12B ships in. */
#ifndef DS_SYNTH_H
#define DS_SYNTH_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "io/safetensors_write.h"

typedef enum { FAM_QWEN3, FAM_GEMMA4 } family;

/* The encoder-free multimodal part of a Gemma4UnifiedForConditionalGeneration
 * checkpoint (configuration_gemma4_unified.py): vision patches of
 * (patch_size * pooling_kernel_size)^2 * 3 pixels projected to mm_embed_dim
 * (= hidden) with a posemb x 2 position table, audio frames of audio_dim
 * samples, and the wrapper's special token ids. */
typedef struct {
    int patch_size, pooling, posemb, soft_tokens, audio_dim;
    int image_id, video_id, audio_id, boi_id, eoi_id, boa_id, eoa_id;
} synth_mm;

typedef struct {
    const char *like;
    family fam;
    int vocab, hidden, layers, heads, kv_heads, head_dim, inter, max_pos;
    bool tie;
    int bos, eos, pad;
    /* Gemma 4 only: full-attention layers' head size and KV heads (K = V),
     * the sliding window, the final logit soft-cap. Layers follow the
     * released 5 sliding : 1 full pattern (the last layer full). */
    int global_head_dim, global_kv_heads, window;
    double softcap;
    /* Gemma 4 only: the unified layout's multimodal part (NULL: the model has
     * no such layout), and whether the released model ships in it. */
    const synth_mm *mm;
    bool unified_default;
    /* drafter */
    int d_layers, d_rank, gamma, mask_id;
} preset;

#define MAX_TENSORS 1024

typedef struct {
    char name[128];
    int kind; /* 0 matrix (normal), 1 norm (ones), 2 bias (zeros) */
    uint64_t uid;
} tensor_info;

typedef struct {
    ds_st_spec spec[MAX_TENSORS];
    tensor_info info[MAX_TENSORS];
    size_t n;
} tensor_list;

/* Appends a bf16 tensor of ndim (0..3) dimensions d0, d1, d2. */
void synth_add_tensor(tensor_list *l, int kind, int ndim, int64_t d0, int64_t d1, int64_t d2, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
/* A float field as Python writes it (30.0, not 30). */
void synth_add_float(cJSON *o, const char *key, double v);
/* The text model's tensors (embedding, layers, final norm, untied head),
 * the model's own names under `prefix` ("model." or "model.language_model."). */
void synth_text_tensors(const preset *p, tensor_list *l, const char *prefix);

/* The unified layout: config.json around `text` (a gemma4_text config,
 * taken over and rewritten as the nested gemma4_unified_text one), and the
 * tensor list (text model under model.language_model., the projections). */
cJSON *synth_unified_config(const preset *p, cJSON *text);
void synth_unified_tensors(const preset *p, tensor_list *l);

#endif
