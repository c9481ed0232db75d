/* dspark synth's Gemma 4 "unified" layout: the format google/gemma-4-12B
 * ships in (Gemma4UnifiedForConditionalGeneration, model_type
 * gemma4_unified). As its config.json and transformers' conversion script
 * (convert_gemma4_unified_weights.py) have it:
 *   - the text config nested as text_config (model_type gemma4_unified_text,
 *     no architectures or dtype of its own), next to vision_config,
 *     audio_config and the multimodal token ids;
 *   - the text model's tensors under model.language_model., the tied LM head
 *     not stored;
 *   - the encoder-free multimodal part: model.vision_embedder.* (LayerNorm,
 *     Dense, LayerNorm, a posemb x 2 x D position table, LayerNorm) and the
 *     projections model.embed_vision / model.embed_audio
 *     .embedding_projection.weight (their RMSNorms have no weight). */
#include <stdio.h>

#include "synth.h"

static cJSON *vision_config(const preset *p) {
    const synth_mm *m = p->mm;
    cJSON *o = cJSON_CreateObject();
    synth_add_float(o, "initializer_range", 0.02);
    cJSON_AddNumberToObject(o, "mm_embed_dim", p->hidden);
    cJSON_AddNumberToObject(o, "mm_posemb_size", m->posemb);
    cJSON_AddNumberToObject(o, "model_patch_size", m->patch_size * m->pooling);
    cJSON_AddStringToObject(o, "model_type", "gemma4_unified_vision");
    cJSON_AddNumberToObject(o, "num_soft_tokens", m->soft_tokens);
    cJSON_AddNumberToObject(o, "output_proj_dims", p->hidden);
    cJSON_AddNumberToObject(o, "patch_size", m->patch_size);
    cJSON_AddNumberToObject(o, "pooling_kernel_size", m->pooling);
    synth_add_float(o, "rms_norm_eps", 1e-6);
    return o;
}

static cJSON *audio_config(const preset *p) {
    const synth_mm *m = p->mm;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "audio_embed_dim", m->audio_dim);
    cJSON_AddNumberToObject(o, "audio_samples_per_token", m->audio_dim);
    cJSON_AddNumberToObject(o, "hidden_size", m->audio_dim);
    synth_add_float(o, "initializer_range", 0.02);
    cJSON_AddStringToObject(o, "model_type", "gemma4_unified_audio");
    cJSON_AddNumberToObject(o, "output_proj_dims", m->audio_dim);
    synth_add_float(o, "rms_norm_eps", 1e-6);
    return o;
}

cJSON *synth_unified_config(const preset *p, cJSON *text) {
    const synth_mm *m = p->mm;
    cJSON_DeleteItemFromObjectCaseSensitive(text, "architectures");
    cJSON_DeleteItemFromObjectCaseSensitive(text, "dtype");
    cJSON_ReplaceItemInObjectCaseSensitive(text, "model_type", cJSON_CreateString("gemma4_unified_text"));
    cJSON *o = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString("Gemma4UnifiedForConditionalGeneration"));
    cJSON_AddItemToObject(o, "audio_config", audio_config(p));
    cJSON_AddNumberToObject(o, "audio_token_id", m->audio_id);
    cJSON_AddNumberToObject(o, "boa_token_id", m->boa_id);
    cJSON_AddNumberToObject(o, "boi_token_id", m->boi_id);
    cJSON_AddStringToObject(o, "dtype", "bfloat16");
    cJSON_AddNumberToObject(o, "eoa_token_index", m->eoa_id);
    cJSON_AddNumberToObject(o, "eoi_token_id", m->eoi_id);
    cJSON_AddNumberToObject(o, "image_token_id", m->image_id);
    synth_add_float(o, "initializer_range", 0.02);
    cJSON_AddStringToObject(o, "model_type", "gemma4_unified");
    cJSON_AddItemToObject(o, "text_config", text);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", p->tie);
    cJSON_AddNumberToObject(o, "video_token_id", m->video_id);
    cJSON_AddItemToObject(o, "vision_config", vision_config(p));
    return o;
}

void synth_unified_tensors(const preset *p, tensor_list *l) {
    const synth_mm *m = p->mm;
    const int64_t H = p->hidden, side = (int64_t)m->patch_size * m->pooling, patch = side * side * 3;
    synth_add_tensor(l, 0, 2, H, m->audio_dim, 0, "model.embed_audio.embedding_projection.weight");
    synth_add_tensor(l, 0, 2, H, H, 0, "model.embed_vision.embedding_projection.weight");
    synth_text_tensors(p, l, "model.language_model.");
    synth_add_tensor(l, 2, 1, H, 0, 0, "model.vision_embedder.patch_dense.bias");
    synth_add_tensor(l, 0, 2, H, patch, 0, "model.vision_embedder.patch_dense.weight");
    synth_add_tensor(l, 2, 1, patch, 0, 0, "model.vision_embedder.patch_ln1.bias");
    synth_add_tensor(l, 1, 1, patch, 0, 0, "model.vision_embedder.patch_ln1.weight");
    synth_add_tensor(l, 2, 1, H, 0, 0, "model.vision_embedder.patch_ln2.bias");
    synth_add_tensor(l, 1, 1, H, 0, 0, "model.vision_embedder.patch_ln2.weight");
    synth_add_tensor(l, 0, 3, m->posemb, 2, H, "model.vision_embedder.pos_embedding");
    synth_add_tensor(l, 2, 1, H, 0, 0, "model.vision_embedder.pos_norm.bias");
    synth_add_tensor(l, 1, 1, H, 0, 0, "model.vision_embedder.pos_norm.weight");
}
