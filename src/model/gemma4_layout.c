/* Gemma 4 checkpoint layouts (see gemma4_layout.h). What each one is, as
 * transformers writes it: configuration_gemma4_unified.py (model types,
 * Gemma4UnifiedConfig's token ids), convert_gemma4_unified_weights.py (the
 * "model.language_model." prefix unless --text_only, lm_head tied to the
 * embedding), modular_gemma4_unified.py (the placeholder -> pad rewrite). */
#include "model/gemma4_layout.h"

#include <stdio.h>
#include <string.h>

#include "io/config.h"

/* The nested text config, whose own model_type (when written) must be the
 * one its parent implies: a gemma4 wrapper around a unified text model, or
 * the reverse, would be read with the wrong defaults. */
static ds_error *nested_text(const cJSON *root, const char *where, const char *parent, const char *want,
                             const cJSON **out) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!cJSON_IsObject(tc)) return ds_errorf("%s: model_type %s but config has no text_config object", where, parent);
    const char *mt = ds_cfg_str(tc, "model_type");
    if (mt && strcmp(mt, want))
        return ds_errorf("%s: config field text_config.model_type = \"%s\" does not match model_type %s (expected "
                         "\"%s\")",
                         where, mt, parent, want);
    *out = tc;
    return NULL;
}

/* A wrapper's tie_word_embeddings and its text config's must agree: which
 * one transformers honours has changed between versions, so a checkpoint
 * where they differ has no single meaning. */
static ds_error *tie_agrees(const cJSON *root, const cJSON *text, const char *where) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings"),
                *b = cJSON_GetObjectItemCaseSensitive(text, "tie_word_embeddings");
    if (cJSON_IsBool(a) && cJSON_IsBool(b) && cJSON_IsTrue(a) != cJSON_IsTrue(b))
        return ds_errorf("%s: config field tie_word_embeddings = %s but text_config.tie_word_embeddings = %s", where,
                         cJSON_IsTrue(a) ? "true" : "false", cJSON_IsTrue(b) ? "true" : "false");
    return NULL;
}

/* One placeholder id of Gemma4UnifiedConfig: absent means its default,
 * null means the model has none (nothing matches it). */
static ds_error *placeholder(const cJSON *root, const char *where, const char *field, int32_t def,
                             ds_gemma4_layout *l) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, field);
    if (cJSON_IsNull(v)) return NULL;
    int64_t id;
    DS_TRY(ds_cfg_int_or(root, where, field, def, &id));
    if (id < 0 || id > INT32_MAX)
        return ds_errorf("%s: config field %s = %lld is out of range", where, field, (long long)id);
    l->placeholder[l->n_placeholders] = (int32_t)id;
    l->placeholder_field[l->n_placeholders++] = field;
    return NULL;
}

static ds_error *unified_wrapper(const cJSON *root, const char *where, ds_gemma4_layout *l) {
    DS_TRY(nested_text(root, where, "gemma4_unified", "gemma4_unified_text", &l->text));
    DS_TRY(tie_agrees(root, l->text, where));
    l->prefix = "model.language_model.";
    l->unified = true;
    /* Gemma4UnifiedConfig's defaults. */
    DS_TRY(placeholder(root, where, "image_token_id", 258880, l));
    DS_TRY(placeholder(root, where, "video_token_id", 258884, l));
    DS_TRY(placeholder(root, where, "audio_token_id", 258881, l));
    if (l->n_placeholders) {
        if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(l->text, "pad_token_id")))
            return ds_errorf("%s: config field text_config.pad_token_id is null, but the placeholder ids are "
                             "embedded as the pad token",
                             where);
        int64_t pad;
        char field[64];
        snprintf(field, sizeof field, "%s (text_config)", where);
        DS_TRY(ds_cfg_int_or(l->text, field, "pad_token_id", 0, &pad));
        if (pad < 0 || pad > INT32_MAX)
            return ds_errorf("%s: config field text_config.pad_token_id = %lld is out of range", where, (long long)pad);
        l->pad_id = (int32_t)pad;
    }
    return NULL;
}

ds_error *ds_gemma4_layout_read(const cJSON *root, const char *where, ds_gemma4_layout *l) {
    *l = (ds_gemma4_layout){.text = root, .prefix = "model."};
    const char *mt = ds_cfg_str(root, "model_type");
    if (mt && !strcmp(mt, "gemma4")) {
        DS_TRY(nested_text(root, where, "gemma4", "gemma4_text", &l->text));
        l->prefix = "model.language_model.";
    } else if (mt && !strcmp(mt, "gemma4_unified")) {
        DS_TRY(unified_wrapper(root, where, l));
    } else if (mt && !strcmp(mt, "gemma4_unified_text")) {
        l->unified = true;
    }
    return NULL;
}
