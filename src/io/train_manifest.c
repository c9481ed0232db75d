#include "io/train_manifest.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json_file.h"

/* The identity as one canonical line: what two runs must agree on to share a cache. */
uint64_t ds_train_manifest_id(const ds_train_manifest *m) {
    char buf[2048];
    int n = snprintf(buf, sizeof buf,
                     "v%d|%s|%s|%016" PRIx64 "|%016" PRIx64 "|%d|%d|%d|%.9g|%.9g|%d|%d|%" PRIu64 "|%d|%" PRId64
                     "|%" PRId64 "|%016" PRIx64 "|%" PRId64 "|taps",
                     DS_TRAIN_FORMAT_VERSION, m->model_type, m->backend, m->target.config, m->target.weights, m->vocab, m->hidden,
                     m->n_layers, (double)m->temperature, (double)m->top_p, m->top_k, m->max_new, m->seed,
                     m->ignore_eos, m->n_prompts, m->n_raw, m->prompts_hash, m->shard_tokens);
    for (int i = 0; i < m->n_taps && n > 0 && n < (int)sizeof buf; i++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, ",%d", m->tap_layers[i]);
    return ds_fnv64(DS_FNV64_INIT, buf, n > 0 && n < (int)sizeof buf ? (size_t)n : sizeof buf);
}

ds_error *ds_train_manifest_compare(const ds_train_manifest *a, const ds_train_manifest *b) {
#define SAME(cond, field, fmt, x, y) \
    if (!(cond)) return ds_errorf("%s: the cache has " fmt ", this run " fmt, field, x, y)
    SAME(!strcmp(a->model_type, b->model_type), "target model_type", "%s", a->model_type, b->model_type);
    SAME(!strcmp(a->backend, b->backend), "backend", "%s", a->backend, b->backend);
    SAME(a->target.config == b->target.config, "target config.json (hash)", "%016" PRIx64, a->target.config,
         b->target.config);
    SAME(a->target.weights == b->target.weights, "target weights (fingerprint)", "%016" PRIx64, a->target.weights,
         b->target.weights);
    SAME(a->hidden == b->hidden, "hidden_size", "%d", a->hidden, b->hidden);
    if (a->n_taps != b->n_taps || memcmp(a->tap_layers, b->tap_layers, (size_t)a->n_taps * sizeof(int))) {
        char x[2][128];
        for (int k = 0; k < 2; k++) {
            const ds_train_manifest *m = k ? b : a;
            int n = snprintf(x[k], sizeof x[k], "[");
            for (int i = 0; i < m->n_taps && n < 100; i++) n += snprintf(x[k] + n, sizeof x[k] - (size_t)n, "%s%d", i ? "," : "", m->tap_layers[i]);
            snprintf(x[k] + n, sizeof x[k] - (size_t)n, "]");
        }
        return ds_errorf("tap_layers: the cache has %s, this run %s", x[0], x[1]);
    }
    SAME(a->temperature == b->temperature, "temperature", "%g", (double)a->temperature, (double)b->temperature);
    SAME(a->top_p == b->top_p, "top_p", "%g", (double)a->top_p, (double)b->top_p);
    SAME(a->top_k == b->top_k, "top_k", "%d", a->top_k, b->top_k);
    SAME(a->max_new == b->max_new, "max_new", "%d", a->max_new, b->max_new);
    SAME(a->seed == b->seed, "seed", "%" PRIu64, a->seed, b->seed);
    SAME(a->ignore_eos == b->ignore_eos, "ignore_eos", "%d", a->ignore_eos, b->ignore_eos);
    SAME(a->n_prompts == b->n_prompts, "prompts", "%" PRId64, a->n_prompts, b->n_prompts);
    SAME(a->n_raw == b->n_raw, "raw sequences", "%" PRId64, a->n_raw, b->n_raw);
    SAME(a->prompts_hash == b->prompts_hash, "prompts (ids hash)", "%016" PRIx64, a->prompts_hash, b->prompts_hash);
    SAME(a->shard_tokens == b->shard_tokens, "shard_tokens", "%" PRId64, a->shard_tokens, b->shard_tokens);
    SAME(a->vocab == b->vocab && a->n_layers == b->n_layers, "target vocab / layers", "%d", a->vocab, b->vocab);
#undef SAME
    return NULL;
}

ds_error *ds_train_manifest_add_shard(ds_train_manifest *m, const ds_train_shard_info *s) {
    ds_train_shard_info *g = realloc(m->shards, (size_t)(m->n_shards + 1) * sizeof *g);
    if (!g) return ds_errorf("out of memory");
    m->shards = g;
    m->shards[m->n_shards++] = *s;
    return NULL;
}

void ds_train_manifest_free(ds_train_manifest *m) {
    free(m->shards);
    m->shards = NULL;
    m->n_shards = 0;
}

static double shortest(float f) {
    char buf[32];
    for (int digits = 6; digits < 10; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

static void add_hex(cJSON *o, const char *name, uint64_t v) {
    char hex[17];
    ds_model_identity_hex(v, hex);
    cJSON_AddStringToObject(o, name, hex);
}

ds_error *ds_train_manifest_write(const char *dir, const ds_train_manifest *m) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", DS_TRAIN_FORMAT);
    cJSON_AddNumberToObject(j, "version", DS_TRAIN_FORMAT_VERSION);
    add_hex(j, "cache_id", m->cache_id);
    cJSON *t = cJSON_AddObjectToObject(j, "target");
    cJSON_AddStringToObject(t, "dir", m->target_dir);
    cJSON_AddStringToObject(t, "model_type", m->model_type);
    add_hex(t, "config_hash", m->target.config);
    add_hex(t, "weights_fingerprint", m->target.weights);
    cJSON_AddNumberToObject(t, "vocab_size", m->vocab);
    cJSON_AddNumberToObject(t, "hidden_size", m->hidden);
    cJSON_AddNumberToObject(t, "num_hidden_layers", m->n_layers);
    cJSON_AddItemToObject(j, "tap_layers", cJSON_CreateIntArray(m->tap_layers, m->n_taps));
    cJSON_AddNumberToObject(j, "hidden_size", m->hidden);
    cJSON_AddStringToObject(j, "dtype", "bf16");
    cJSON_AddStringToObject(j, "backend", m->backend);
    cJSON *s = cJSON_AddObjectToObject(j, "sampling");
    /* floats as their shortest decimal (0.7, not 0.699999988): the same float when read back */
    cJSON_AddNumberToObject(s, "temperature", shortest(m->temperature));
    cJSON_AddNumberToObject(s, "top_p", shortest(m->top_p));
    cJSON_AddNumberToObject(s, "top_k", m->top_k);
    cJSON_AddNumberToObject(s, "max_new", m->max_new);
    cJSON_AddNumberToObject(s, "seed", (double)m->seed);
    cJSON_AddBoolToObject(s, "ignore_eos", m->ignore_eos);
    cJSON *p = cJSON_AddObjectToObject(j, "prompts");
    cJSON_AddStringToObject(p, "file", m->prompt_file);
    cJSON_AddNumberToObject(p, "count", (double)m->n_prompts);
    cJSON_AddNumberToObject(p, "raw", (double)m->n_raw);
    add_hex(p, "ids_hash", m->prompts_hash);
    cJSON_AddNumberToObject(j, "shard_tokens", (double)m->shard_tokens);
    cJSON_AddBoolToObject(j, "complete", m->complete);
    int64_t seqs = 0, toks = 0, bytes = 0;
    cJSON *a = cJSON_AddArrayToObject(j, "shards");
    for (int i = 0; i < m->n_shards; i++) {
        const ds_train_shard_info *x = &m->shards[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "file", x->file);
        cJSON_AddNumberToObject(o, "first_seq", (double)x->first_seq);
        cJSON_AddNumberToObject(o, "n_seqs", (double)x->n_seqs);
        cJSON_AddNumberToObject(o, "n_tokens", (double)x->n_tokens);
        cJSON_AddNumberToObject(o, "bytes", (double)x->bytes);
        cJSON_AddItemToArray(a, o);
        seqs += x->n_seqs, toks += x->n_tokens, bytes += x->bytes;
    }
    cJSON_AddNumberToObject(j, "n_seqs", (double)seqs);
    cJSON_AddNumberToObject(j, "n_tokens", (double)toks);
    cJSON_AddNumberToObject(j, "bytes", (double)bytes);
    char path[4096];
    ds_error *e = NULL;
    if (snprintf(path, sizeof path, "%s/%s", dir, DS_TRAIN_MANIFEST) >= (int)sizeof path)
        e = ds_errorf("%s: path too long", dir);
    if (!e) e = ds_json_file_write(path, j);
    cJSON_Delete(j);
    return e;
}

/* ---- reading: every field checked, named in the error ---- */

static ds_error *get_num(const cJSON *o, const char *name, double lo, double hi, bool integer, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v) return ds_errorf("\"%s\" is missing", name);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return ds_errorf("\"%s\" is not a number", name);
    const double x = v->valuedouble;
    if (x < lo || x > hi || (integer && x != floor(x)))
        return ds_errorf("\"%s\" = %g is not %s in [%g, %g]", name, x, integer ? "an integer" : "a number", lo, hi);
    *out = x;
    return NULL;
}

static ds_error *get_int(const cJSON *o, const char *name, double lo, double hi, int64_t *out) {
    double x;
    DS_TRY(get_num(o, name, lo, hi, true, &x));
    *out = (int64_t)x;
    return NULL;
}

static ds_error *get_str(const cJSON *o, const char *name, char *out, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v) return ds_errorf("\"%s\" is missing", name);
    if (!cJSON_IsString(v)) return ds_errorf("\"%s\" is not a string", name);
    if (strlen(v->valuestring) >= cap) return ds_errorf("\"%s\" is longer than %zu bytes", name, cap - 1);
    strcpy(out, v->valuestring);
    return NULL;
}

static ds_error *get_hex(const cJSON *o, const char *name, uint64_t *out) {
    char s[32];
    DS_TRY(get_str(o, name, s, sizeof s));
    char *end;
    *out = strtoull(s, &end, 16);
    if (strlen(s) != 16 || *end) return ds_errorf("\"%s\" = \"%s\" is not 16 hex digits", name, s);
    return NULL;
}

static ds_error *get_bool(const cJSON *o, const char *name, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v) return ds_errorf("\"%s\" is missing", name);
    if (!cJSON_IsBool(v)) return ds_errorf("\"%s\" is not true or false", name);
    *out = cJSON_IsTrue(v);
    return NULL;
}

static ds_error *get_obj(const cJSON *o, const char *name, const cJSON **out) {
    *out = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!*out) return ds_errorf("\"%s\" is missing", name);
    if (!cJSON_IsObject(*out)) return ds_errorf("\"%s\" is not an object", name);
    return NULL;
}

#define BIG 9007199254740992.0 /* 2^53: integers a JSON number holds exactly */

static ds_error *parse_shard(const cJSON *o, int i, int64_t next_seq, ds_train_shard_info *s) {
    if (!cJSON_IsObject(o)) return ds_errorf("shards[%d] is not an object", i);
    ds_error *e = get_str(o, "file", s->file, sizeof s->file);
    if (!e && (strchr(s->file, '/') || !strcmp(s->file, "..") || !s->file[0]))
        e = ds_errorf("\"file\" = \"%s\" is not a file name in the cache directory", s->file);
    if (!e) e = get_int(o, "first_seq", 0, BIG, &s->first_seq);
    if (!e) e = get_int(o, "n_seqs", 1, BIG, &s->n_seqs);
    if (!e) e = get_int(o, "n_tokens", 1, BIG, &s->n_tokens);
    if (!e) e = get_int(o, "bytes", 1, BIG, &s->bytes);
    if (!e && s->first_seq != next_seq)
        e = ds_errorf("first_seq %lld does not follow the shards before it (%lld)", (long long)s->first_seq,
                      (long long)next_seq);
    return ds_error_wrap(e, "shards[%d]", i);
}

static ds_error *parse(const cJSON *j, ds_train_manifest *m) {
    char fmt[64];
    int64_t v;
    DS_TRY(get_str(j, "format", fmt, sizeof fmt));
    if (strcmp(fmt, DS_TRAIN_FORMAT)) return ds_errorf("\"format\" = \"%s\", not \"%s\"", fmt, DS_TRAIN_FORMAT);
    DS_TRY(get_int(j, "version", 0, BIG, &v));
    if (v != DS_TRAIN_FORMAT_VERSION) return ds_errorf("\"version\" = %lld (this build reads %d)", (long long)v,
                                                       DS_TRAIN_FORMAT_VERSION);
    const cJSON *t, *s, *p;
    DS_TRY(get_obj(j, "target", &t));
    DS_TRY(ds_error_wrap(get_str(t, "dir", m->target_dir, sizeof m->target_dir), "target"));
    DS_TRY(ds_error_wrap(get_str(t, "model_type", m->model_type, sizeof m->model_type), "target"));
    DS_TRY(ds_error_wrap(get_hex(t, "config_hash", &m->target.config), "target"));
    DS_TRY(ds_error_wrap(get_hex(t, "weights_fingerprint", &m->target.weights), "target"));
    DS_TRY(ds_error_wrap(get_int(t, "vocab_size", 1, 1 << 30, &v), "target"));
    m->vocab = (int)v;
    DS_TRY(ds_error_wrap(get_int(t, "num_hidden_layers", 1, 1 << 20, &v), "target"));
    m->n_layers = (int)v;
    DS_TRY(get_int(j, "hidden_size", 1, 1 << 20, &v));
    m->hidden = (int)v;
    char dtype[16];
    DS_TRY(get_str(j, "dtype", dtype, sizeof dtype));
    if (strcmp(dtype, "bf16")) return ds_errorf("\"dtype\" = \"%s\" (this build reads bf16)", dtype);
    DS_TRY(get_str(j, "backend", m->backend, sizeof m->backend));
    const cJSON *taps = cJSON_GetObjectItemCaseSensitive(j, "tap_layers");
    if (!cJSON_IsArray(taps)) return ds_errorf("\"tap_layers\" is missing or not an array");
    m->n_taps = cJSON_GetArraySize(taps);
    if (m->n_taps > DS_TRAIN_MAX_TAPS) return ds_errorf("\"tap_layers\": %d taps (at most %d)", m->n_taps, DS_TRAIN_MAX_TAPS);
    for (int i = 0; i < m->n_taps; i++) {
        const cJSON *x = cJSON_GetArrayItem(taps, i);
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < -1 ||
            x->valuedouble >= m->n_layers)
            return ds_errorf("\"tap_layers\"[%d] is not a layer in -1..%d", i, m->n_layers - 1);
        m->tap_layers[i] = (int)x->valuedouble;
    }
    DS_TRY(get_obj(j, "sampling", &s));
    double x;
    DS_TRY(ds_error_wrap(get_num(s, "temperature", 0, 1e30, false, &x), "sampling"));
    m->temperature = (float)x;
    DS_TRY(ds_error_wrap(get_num(s, "top_p", 0, 1, false, &x), "sampling"));
    m->top_p = (float)x;
    DS_TRY(ds_error_wrap(get_int(s, "top_k", 0, 1 << 30, &v), "sampling"));
    m->top_k = (int)v;
    DS_TRY(ds_error_wrap(get_int(s, "max_new", 0, 1 << 30, &v), "sampling"));
    m->max_new = (int)v;
    DS_TRY(ds_error_wrap(get_int(s, "seed", 0, BIG, &v), "sampling"));
    m->seed = (uint64_t)v;
    DS_TRY(ds_error_wrap(get_bool(s, "ignore_eos", &m->ignore_eos), "sampling"));
    DS_TRY(get_obj(j, "prompts", &p));
    DS_TRY(ds_error_wrap(get_str(p, "file", m->prompt_file, sizeof m->prompt_file), "prompts"));
    DS_TRY(ds_error_wrap(get_int(p, "count", 0, BIG, &m->n_prompts), "prompts"));
    DS_TRY(ds_error_wrap(get_int(p, "raw", 0, (double)m->n_prompts, &m->n_raw), "prompts"));
    DS_TRY(ds_error_wrap(get_hex(p, "ids_hash", &m->prompts_hash), "prompts"));
    DS_TRY(get_int(j, "shard_tokens", 1, BIG, &m->shard_tokens));
    DS_TRY(get_bool(j, "complete", &m->complete));
    DS_TRY(get_hex(j, "cache_id", &m->cache_id));
    if (m->cache_id != ds_train_manifest_id(m))
        return ds_errorf("\"cache_id\" %016llx is not the hash of the fields that make the cache (%016llx): edited?",
                         (unsigned long long)m->cache_id, (unsigned long long)ds_train_manifest_id(m));
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shards");
    if (!cJSON_IsArray(sh)) return ds_errorf("\"shards\" is missing or not an array");
    int64_t next = 0;
    for (int i = 0; i < cJSON_GetArraySize(sh); i++) {
        ds_train_shard_info info = {0};
        DS_TRY(parse_shard(cJSON_GetArrayItem(sh, i), i, next, &info));
        DS_TRY(ds_train_manifest_add_shard(m, &info));
        next += info.n_seqs;
    }
    if (next > m->n_prompts)
        return ds_errorf("\"shards\" hold %lld sequences, more than the %lld prompts", (long long)next,
                         (long long)m->n_prompts);
    if (m->complete && next != m->n_prompts)
        return ds_errorf("\"complete\" but the shards hold %lld of the %lld sequences", (long long)next,
                         (long long)m->n_prompts);
    return NULL;
}

ds_error *ds_train_manifest_read(const char *dir, ds_train_manifest *out) {
    memset(out, 0, sizeof *out);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, DS_TRAIN_MANIFEST) >= (int)sizeof path)
        return ds_errorf("%s: path too long", dir);
    cJSON *j;
    DS_TRY(ds_json_file_read(path, 64u << 20, &j));
    ds_error *e = parse(j, out);
    cJSON_Delete(j);
    if (e) {
        ds_train_manifest_free(out);
        return ds_error_wrap(e, "%s", path);
    }
    return NULL;
}
