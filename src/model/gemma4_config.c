/* Gemma 4 text config: geometry per attention type, RoPE tables, KV
 * sharing. Optional fields default as in the reference's Gemma4TextConfig
 * (or Gemma4UnifiedTextConfig, where it differs), so a config that leans on
 * those defaults means what it means there. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/config.h"
#include "model/gemma4_layer.h"
#include "model/kv_cache.h"

static const char *const type_names[DS_G4_N_TYPES] = {"sliding_attention", "full_attention"};

float ds_gemma4_embed_scale(ds_dtype weight_dtype, int n) {
    float s = sqrtf((float)n);
    if (weight_dtype == DS_BF16) return ds_bf16_to_f32(ds_f32_to_bf16(s));
    if (weight_dtype == DS_F16) {
        /* 11 significant bits, ties to even (s is a normal, in-range value). */
        int e;
        float m = frexpf(s, &e);
        return ldexpf(nearbyintf(m * 2048.0f) / 2048.0f, e);
    }
    return s;
}

/* What one layer type's RoPE is: the rope_parameters entry for the type,
 * else the reference's default for it (θ 1e4 default RoPE for sliding,
 * θ 1e6 proportional 0.25 for full), where a top-level rope_theta (full) or
 * rope_local_base_freq (sliding) still sets θ. */
typedef struct {
    bool proportional;
    double theta, partial, factor;
} rope_spec;

static ds_error *rope_spec_read(const cJSON *cfg, const char *where, ds_gemma4_type type, rope_spec *r) {
    const char *tn = type_names[type];
    *r = type == DS_G4_FULL ? (rope_spec){true, 1e6, 0.25, 1.0} : (rope_spec){false, 1e4, 1.0, 1.0};
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    const cJSON *entry = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, tn) : NULL;
    char field[96];
    if (cJSON_IsObject(entry)) {
        snprintf(field, sizeof field, "%s (rope_parameters.%s)", where, tn);
        const char *rt = ds_cfg_str(entry, "rope_type");
        if (!rt || !strcmp(rt, "default"))
            r->proportional = false;
        else if (!strcmp(rt, "proportional"))
            r->proportional = true;
        else
            return ds_errorf("%s: rope_type \"%s\" is not supported (default, proportional)", field, rt);
        DS_TRY(ds_cfg_float(entry, field, "rope_theta", &r->theta));
        DS_TRY(ds_cfg_float_or(entry, field, "partial_rotary_factor", 1.0, &r->partial));
        DS_TRY(ds_cfg_float_or(entry, field, "factor", 1.0, &r->factor));
    } else if (entry && !cJSON_IsNull(entry)) {
        return ds_errorf("%s: config field rope_parameters.%s is not an object", where, tn);
    } else {
        const char *key = type == DS_G4_FULL ? "rope_theta" : "rope_local_base_freq";
        /* A flat rope_parameters (no per-type entries) carries the global θ. */
        if (type == DS_G4_FULL && cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta"))
            DS_TRY(ds_cfg_float(rp, where, "rope_theta", &r->theta));
        else
            DS_TRY(ds_cfg_float_or(cfg, where, key, r->theta, &r->theta));
    }
    if (!(r->theta > 1.0) || !(r->partial >= 0.0 && r->partial <= 1.0) || !(r->factor > 0.0))
        return ds_errorf("%s: RoPE parameters of %s out of range (theta %g, partial_rotary_factor %g, factor %g)",
                         where, tn, r->theta, r->partial, r->factor);
    return NULL;
}

ds_error *ds_gemma4_inv_freq(const cJSON *cfg, const char *where, ds_gemma4_type type, int head_dim, float **out) {
    rope_spec r;
    DS_TRY(rope_spec_read(cfg, where, type, &r));
    const int half = head_dim / 2;
    /* Proportional: only the first int(p*D/2) pairs rotate; their exponent
     * is still 2i/D over the full D, and the rest stay fixed (frequency 0).
     * The reference's default RoPE ignores partial_rotary_factor and factor. */
    int rotated = r.proportional ? (int)floor(r.partial * head_dim / 2.0) : half;
    if (rotated > half) rotated = half;
    const float factor = r.proportional ? (float)r.factor : 1.0f;
    float *f = malloc((size_t)(half > 0 ? half : 1) * sizeof *f);
    if (!f) return ds_errorf("out of memory");
    for (int i = 0; i < half; i++) {
        if (i >= rotated) {
            f[i] = 0.0f;
            continue;
        }
        /* As the reference: exponent (2i)/D and the power in fp32, then 1/x. */
        float e = (float)(2 * i) / (float)head_dim;
        float p = (float)pow((double)(float)r.theta, (double)e);
        f[i] = 1.0f / p / factor;
    }
    *out = f;
    return NULL;
}

static ds_error *positive(const cJSON *cfg, const char *where, const char *field, int64_t def, bool required,
                          int *out) {
    int64_t v;
    if (required)
        DS_TRY(ds_cfg_int(cfg, where, field, &v));
    else
        DS_TRY(ds_cfg_int_or(cfg, where, field, def, &v));
    if (v <= 0 || v > (1 << 30))
        return ds_errorf("%s: config field %s = %lld is out of range", where, field, (long long)v);
    *out = (int)v;
    return NULL;
}

/* Unsupported variants are refused by name rather than run wrongly. */
static ds_error *check_supported(const cJSON *cfg, const char *where) {
    bool moe;
    int64_t experts;
    DS_TRY(ds_cfg_bool_or(cfg, where, "enable_moe_block", false, &moe));
    if (moe) return ds_errorf("%s: config field enable_moe_block = true: Gemma 4 MoE models are not supported", where);
    DS_TRY(ds_cfg_int_or(cfg, where, "num_experts", 0, &experts));
    if (experts > 0)
        return ds_errorf("%s: config field num_experts = %lld: Gemma 4 MoE models are not supported", where,
                         (long long)experts);
    const char *bidi = ds_cfg_str(cfg, "use_bidirectional_attention");
    if (bidi && !strcmp(bidi, "all"))
        return ds_errorf("%s: config field use_bidirectional_attention = \"all\" is not supported (causal LM)", where);
    const char *act = ds_cfg_str(cfg, "hidden_activation");
    if (act && strcmp(act, "gelu_pytorch_tanh"))
        return ds_errorf("%s: config field hidden_activation = \"%s\" is not supported (gelu_pytorch_tanh)", where,
                         act);
    return NULL;
}

/* layer_types, defaulting like the reference (5 sliding : 1 full) and with
 * the last layer always full (the reference forces that too). */
static ds_error *read_layer_types(const cJSON *cfg, const char *where, ds_gemma4_config *c) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers)
            return ds_errorf("%s: config field layer_types must list %d layer types", where, c->n_layers);
        for (int l = 0; l < c->n_layers; l++) {
            const cJSON *it = cJSON_GetArrayItem(lt, l);
            const char *s = cJSON_IsString(it) ? it->valuestring : "";
            if (!strcmp(s, type_names[DS_G4_SLIDING]))
                c->layer_type[l] = DS_G4_SLIDING;
            else if (!strcmp(s, type_names[DS_G4_FULL]))
                c->layer_type[l] = DS_G4_FULL;
            else
                return ds_errorf("%s: config field layer_types[%d] = \"%s\" is not sliding_attention/full_attention",
                                 where, l, s);
        }
    } else {
        for (int l = 0; l < c->n_layers; l++) c->layer_type[l] = (l + 1) % 6 ? DS_G4_SLIDING : DS_G4_FULL;
    }
    c->layer_type[c->n_layers - 1] = DS_G4_FULL;
    return NULL;
}

/* Head size and KV heads of layer l. Older configs give full layers
 * global_head_dim (and num_global_key_value_heads with attention_k_eq_v);
 * newer ones list per-layer overrides in per_layer_config instead. */
static ds_error *layer_geometry(const cJSON *cfg, const char *where, const ds_gemma4_config *c, int l, int head_dim,
                                int kv_heads, int *hd, int *kvh) {
    const cJSON *plc = cJSON_GetObjectItemCaseSensitive(cfg, "per_layer_config");
    *hd = head_dim;
    *kvh = kv_heads;
    if (!plc || cJSON_IsNull(plc)) {
        if (c->layer_type[l] == DS_G4_FULL) {
            DS_TRY(positive(cfg, where, "global_head_dim", 512, false, hd));
            if (c->k_eq_v) DS_TRY(positive(cfg, where, "num_global_key_value_heads", kv_heads, false, kvh));
        }
        return NULL;
    }
    if (!cJSON_IsObject(plc)) return ds_errorf("%s: config field per_layer_config is not an object", where);
    char key[16], field[64];
    snprintf(key, sizeof key, "%d", l);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(plc, key);
    if (!o) return NULL;
    snprintf(field, sizeof field, "%s (per_layer_config.%d)", where, l);
    if (!cJSON_IsObject(o)) return ds_errorf("%s: not an object", field);
    for (const cJSON *it = o->child; it; it = it->next)
        if (strcmp(it->string, "head_dim") && strcmp(it->string, "num_key_value_heads"))
            return ds_errorf("%s: override of %s is not supported", field, it->string);
    DS_TRY(positive(o, field, "head_dim", *hd, false, hd));
    DS_TRY(positive(o, field, "num_key_value_heads", *kvh, false, kvh));
    return NULL;
}

/* KV sharing: the last num_kv_shared_layers layers attend to the K/V of the
 * last earlier (non-shared) layer of their own type. */
static ds_error *kv_sharing(const char *where, ds_gemma4_config *c) {
    const int first = c->n_layers - c->n_kv_shared;
    if (c->n_kv_shared < 0 || first <= 0)
        return ds_errorf("%s: config field num_kv_shared_layers = %d must leave at least one layer with its own K/V",
                         where, c->n_kv_shared);
    for (int l = 0; l < c->n_layers; l++) {
        c->kv_source[l] = l;
        if (l < first) continue;
        c->kv_source[l] = -1;
        for (int s = first - 1; s >= 0 && c->kv_source[l] < 0; s--)
            if (c->layer_type[s] == c->layer_type[l]) c->kv_source[l] = s;
        if (c->kv_source[l] < 0)
            return ds_errorf("%s: KV-shared layer %d (%s) has no earlier %s layer to share K/V with "
                             "(num_kv_shared_layers %d)",
                             where, l, type_names[c->layer_type[l]], type_names[c->layer_type[l]], c->n_kv_shared);
    }
    return NULL;
}

static ds_error *read_geometry(const cJSON *cfg, const char *where, ds_gemma4_config *c) {
    int head_dim = 0, kv_heads = 0;
    DS_TRY(positive(cfg, where, "head_dim", 256, false, &head_dim));
    DS_TRY(positive(cfg, where, "num_key_value_heads", 4, false, &kv_heads));
    for (int l = 0; l < c->n_layers; l++) {
        int hd, kvh;
        DS_TRY(layer_geometry(cfg, where, c, l, head_dim, kv_heads, &hd, &kvh));
        ds_gemma4_attn_geom *g = &c->geom[c->layer_type[l]];
        if (g->used && (g->head_dim != hd || g->n_kv_heads != kvh))
            return ds_errorf(
                "%s: %s layers differ in head_dim / num_key_value_heads (layer %d: %d / %d, earlier: %d / %d)", where,
                type_names[c->layer_type[l]], l, hd, kvh, g->head_dim, g->n_kv_heads);
        if (hd % 2 || c->n_heads % kvh)
            return ds_errorf(
                "%s: layer %d: head_dim %d must be even and num_attention_heads %d a multiple of its %d KV heads",
                where, l, hd, c->n_heads, kvh);
        g->used = true;
        g->head_dim = hd;
        g->n_kv_heads = kvh;
    }
    for (int t = 0; t < DS_G4_N_TYPES; t++)
        if (c->geom[t].used)
            DS_TRY(ds_gemma4_inv_freq(cfg, where, (ds_gemma4_type)t, c->geom[t].head_dim, &c->geom[t].inv_freq));
    return NULL;
}

/* Per-layer inputs: Gemma4TextConfig defaults hidden_size_per_layer_input
 * to 256; Gemma4UnifiedTextConfig removes the field (its model has no
 * per-layer input block), so there a non-zero value is a contradiction we
 * refuse rather than silently drop. */
static ds_error *read_ple(const cJSON *cfg, const char *where, bool unified, ds_gemma4_config *c) {
    int64_t v;
    DS_TRY(ds_cfg_int_or(cfg, where, "hidden_size_per_layer_input", unified ? 0 : 256, &v));
    if (v < 0 || v > (1 << 20))
        return ds_errorf("%s: config field hidden_size_per_layer_input = %lld is out of range", where, (long long)v);
    if (unified && v)
        return ds_errorf("%s: config field hidden_size_per_layer_input = %lld: gemma4_unified_text has no per-layer "
                         "inputs",
                         where, (long long)v);
    c->ple_dim = (int)v;
    if (c->ple_dim) DS_TRY(positive(cfg, where, "vocab_size_per_layer_input", 262144, false, &c->ple_vocab));
    return NULL;
}

static ds_error *config_read(const cJSON *cfg, const char *where, bool share_kv, bool unified, ds_gemma4_config *c) {
    double d;
    int64_t v;
    DS_TRY(check_supported(cfg, where));
    DS_TRY(positive(cfg, where, "vocab_size", 0, true, &c->vocab));
    DS_TRY(positive(cfg, where, "hidden_size", 0, true, &c->hidden));
    DS_TRY(positive(cfg, where, "num_hidden_layers", 0, true, &c->n_layers));
    DS_TRY(positive(cfg, where, "num_attention_heads", 0, true, &c->n_heads));
    DS_TRY(positive(cfg, where, "intermediate_size", 0, true, &c->inter));
    DS_TRY(positive(cfg, where, "max_position_embeddings", 131072, false, &c->max_pos));
    DS_TRY(positive(cfg, where, "sliding_window", unified ? 1024 : 512, false, &c->window));
    DS_TRY(ds_cfg_float_or(cfg, where, "rms_norm_eps", 1e-6, &d));
    c->eps = (float)d;
    DS_TRY(ds_cfg_float_or(cfg, where, "final_logit_softcapping", 0.0, &d));
    if (d < 0) return ds_errorf("%s: config field final_logit_softcapping = %g must be positive", where, d);
    c->softcap = (float)d;
    DS_TRY(ds_cfg_bool_or(cfg, where, "attention_k_eq_v", false, &c->k_eq_v));
    DS_TRY(ds_cfg_bool_or(cfg, where, "attention_bias", false, &c->attention_bias));
    DS_TRY(ds_cfg_bool_or(cfg, where, "tie_word_embeddings", true, &c->tie_embeddings));
    DS_TRY(ds_cfg_bool_or(cfg, where, "use_double_wide_mlp", false, &c->double_wide));
    DS_TRY(read_ple(cfg, where, unified, c));
    DS_TRY(ds_cfg_int_or(cfg, where, "num_kv_shared_layers", 0, &v));
    /* A drafter config inherits the target's value, which may exceed the
     * drafter's own depth; it is only a layer count for the target. */
    if (v < 0 || (share_kv && v > c->n_layers))
        return ds_errorf("%s: config field num_kv_shared_layers = %lld is out of range", where, (long long)v);
    c->n_kv_shared = share_kv ? (int)v : 0;
    c->layer_type = calloc((size_t)c->n_layers, sizeof *c->layer_type);
    c->kv_source = calloc((size_t)c->n_layers, sizeof *c->kv_source);
    if (!c->layer_type || !c->kv_source) return ds_errorf("out of memory");
    DS_TRY(read_layer_types(cfg, where, c));
    DS_TRY(kv_sharing(where, c));
    DS_TRY(ds_kv_dtype_read(cfg, NULL, where, &c->kv_dtype));
    return read_geometry(cfg, where, c);
}

ds_error *ds_gemma4_config_read_as(const cJSON *cfg, const char *where, bool share_kv, bool unified,
                                   ds_gemma4_config *c) {
    *c = (ds_gemma4_config){0};
    ds_error *e = config_read(cfg, where, share_kv, unified, c);
    if (e) ds_gemma4_config_free(c);
    return e;
}

ds_error *ds_gemma4_config_read(const cJSON *cfg, const char *where, bool share_kv, ds_gemma4_config *c) {
    const char *mt = ds_cfg_str(cfg, "model_type");
    return ds_gemma4_config_read_as(cfg, where, share_kv, mt && !strcmp(mt, "gemma4_unified_text"), c);
}

void ds_gemma4_config_free(ds_gemma4_config *c) {
    for (int t = 0; t < DS_G4_N_TYPES; t++) free(c->geom[t].inv_freq);
    free(c->layer_type);
    free(c->kv_source);
    *c = (ds_gemma4_config){0};
}

ds_error *ds_gemma4_config_split(ds_gemma4_config *c, ds_comm *comm, const char *where) {
    c->comm = comm && comm->world > 1 ? comm : NULL;
    c->n_heads_all = c->n_heads, c->inter_all = c->inter;
    for (int t = 0; t < DS_G4_N_TYPES; t++) c->kv_all[t] = c->geom[t].n_kv_heads, c->kv_first[t] = 0;
    if (!c->comm) return NULL;
    const int w = comm->world, r = comm->rank;
    if (c->ple_dim)
        return ds_errorf("%s: per-layer inputs (hidden_size_per_layer_input, the E-series) are not split across "
                         "tensor-parallel ranks", where);
    if (c->n_heads % w) return ds_errorf("%s: num_attention_heads = %d does not divide among %d ranks", where, c->n_heads, w);
    if (c->inter % w) return ds_errorf("%s: intermediate_size = %d does not divide among %d ranks", where, c->inter, w);
    if (c->vocab % w) return ds_errorf("%s: vocab_size = %d does not divide among %d ranks", where, c->vocab, w);
    const int h = c->n_heads / w;
    for (int t = 0; t < DS_G4_N_TYPES; t++) {
        ds_gemma4_attn_geom *g = &c->geom[t];
        if (!g->used) continue;
        const int kv = g->n_kv_heads;
        if (kv % w == 0) { /* the rank's slice of the KV heads */
            g->n_kv_heads = kv / w;
            c->kv_first[t] = r * (kv / w);
        } else if (w % kv == 0) { /* fewer KV heads than ranks: the one this rank's query heads share */
            g->n_kv_heads = 1;
            c->kv_first[t] = (r * h) / (c->n_heads / kv);
        } else {
            return ds_errorf("%s: %s layers' %d KV heads neither divide among nor replicate over %d ranks", where,
                             t == DS_G4_FULL ? "full" : "sliding", kv, w);
        }
    }
    c->n_heads = h;
    c->inter /= w;
    return NULL;
}
