/* Where a Gemma 4 checkpoint keeps its text model, and what the wrapper
 * around it does to the ids before the text model sees them.
 *
 * Four layouts, by config.json's model_type:
 *   gemma4_text          Gemma4ForCausalLM: the config is the text config,
 *                        tensors under "model."
 *   gemma4               Gemma4ForConditionalGeneration: text_config nested,
 *                        tensors under "model.language_model."
 *   gemma4_unified       Gemma4UnifiedForConditionalGeneration (the released
 *                        google/gemma-4-12B): text_config nested (model_type
 *                        gemma4_unified_text), tensors under
 *                        "model.language_model.", next to the encoder-free
 *                        vision/audio projections (model.vision_embedder.*,
 *                        model.embed_vision.*, model.embed_audio.*), which a
 *                        text forward never reads
 *   gemma4_unified_text  Gemma4UnifiedForCausalLM (the converter's
 *                        --text_only): the text config, tensors under "model."
 *
 * The unified text config has defaults of its own (Gemma4UnifiedTextConfig:
 * sliding_window 1024, no per-layer inputs), so the reader is told which
 * class the text config is. */
#ifndef DS_GEMMA4_LAYOUT_H
#define DS_GEMMA4_LAYOUT_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

#define DS_G4_MAX_PLACEHOLDERS 3

typedef struct {
    const cJSON *text;     /* the text config (root itself, or root's text_config) */
    const char *prefix;    /* the text model's tensor prefix */
    bool unified;          /* the text config is a Gemma4UnifiedTextConfig */
    /* Gemma4UnifiedForConditionalGeneration replaces the image / video /
     * audio placeholder ids by text_config.pad_token_id before the embedding
     * lookup (modular_gemma4_unified.py, Gemma4UnifiedModel.forward), so a
     * text-only forward embeds them as pad. */
    int n_placeholders;
    int32_t placeholder[DS_G4_MAX_PLACEHOLDERS];
    const char *placeholder_field[DS_G4_MAX_PLACEHOLDERS]; /* the config field that names it */
    int32_t pad_id;
} ds_gemma4_layout;

/* Reads root (a config.json) as one of the layouts; errors name the field. */
ds_error *ds_gemma4_layout_read(const cJSON *root, const char *where, ds_gemma4_layout *out);

#endif
