/* Loading a Hugging Face tokenizer.json: parse once with cJSON, hand each
 * section to its module, then derive the per-id tables decode needs. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "io/checkpoint.h"
#include "tokenizer/json_util.h"
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/vocab_scan.h"

const char *ds_tokenizer_piece(const ds_tokenizer *tok, int32_t id, size_t *len) {
    if (id < 0 || (size_t)id >= tok->vocab_size) return NULL;
    int32_t a = tok->added_of_id[id];
    if (a >= 0) {
        if (len) *len = tok->added.tok[a].len;
        return tok->added.tok[a].content;
    }
    return ds_strtab_get(&tok->bpe.vocab, id, len);
}

/* Per-id tables: which added token an id is, and whether decode with
 * skip_special drops it. HF tests the token *string* against the set of
 * special contents, so a vocab id whose string equals a special token's
 * content (llama2's "<s>") is special too. */
static ds_error *build_id_tables(ds_tokenizer *tok) {
    size_t n = tok->vocab_size ? tok->vocab_size : 1;
    tok->added_of_id = malloc(n * sizeof *tok->added_of_id);
    tok->special = calloc(n, 1);
    if (!tok->added_of_id || !tok->special) return ds_errorf("out of memory");
    for (size_t i = 0; i < n; i++) tok->added_of_id[i] = -1;
    for (size_t i = 0; i < tok->added.n; i++) {
        int32_t id = tok->added.tok[i].id;
        if (tok->added_of_id[id] < 0) tok->added_of_id[id] = (int32_t)i;
    }
    for (size_t i = 0; i < tok->added.n; i++) {
        const ds_added_token *t = &tok->added.tok[i];
        if (!t->special) continue;
        tok->special[t->id] = 1;
        int32_t v = ds_strtab_find(&tok->bpe.vocab, t->content, t->len);
        if (v >= 0 && tok->added_of_id[v] < 0) tok->special[v] = 1;
    }
    return NULL;
}

static ds_error *build(ds_tokenizer *tok, const cJSON *root, const ds_bpe_lists *pre) {
    if (!cJSON_IsObject(root)) return ds_errorf("the top level should be an object, is %s", ds_json_kind(root));
    const cJSON *model = ds_json_get(root, "model");
    if (!model) return ds_errorf("\"model\" is missing");
    DS_TRY(ds_bpe_load(&tok->bpe, model, pre));
    DS_TRY(ds_normalizer_parse(ds_json_get(root, "normalizer"), &tok->normalizer));
    DS_TRY(ds_added_load(&tok->added, ds_json_get(root, "added_tokens"), tok->normalizer, &tok->bpe.vocab));
    DS_TRY(ds_pretok_parse(ds_json_get(root, "pre_tokenizer"), &tok->pretok));
    DS_TRY(ds_decoder_parse(ds_json_get(root, "decoder"), &tok->decoder));
    tok->vocab_size = tok->bpe.vocab.n_ids;
    for (size_t i = 0; i < tok->added.n; i++)
        if ((size_t)tok->added.tok[i].id + 1 > tok->vocab_size) tok->vocab_size = (size_t)tok->added.tok[i].id + 1;
    if (tok->vocab_size == 0) return ds_errorf("model.vocab is empty");
    DS_TRY(ds_postproc_parse(ds_json_get(root, "post_processor"), (long long)tok->vocab_size - 1, &tok->post));
    return build_id_tables(tok);
}

ds_error *ds_tokenizer_load(const char *path, ds_tokenizer **out) {
    if (!out) return ds_errorf("ds_tokenizer_load: out is NULL");
    *out = NULL;
    if (!path || !*path) return ds_errorf("tokenizer path is empty");
    /* A model directory stands for the tokenizer.json inside it. */
    char *full = NULL;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        size_t n = strlen(path);
        if (!(full = malloc(n + 16))) return ds_errorf("out of memory");
        snprintf(full, n + 16, "%s%stokenizer.json", path, n && path[n - 1] == '/' ? "" : "/");
        path = full;
    }
    char *data;
    size_t len = 0;
    ds_error *e = ds_read_file(path, &data, &len);
    if (e) {
        free(full);
        return e;
    }
    ds_vocab_scan scan;
    bool scanned = ds_vocab_scan_run(data, &len, &scan);
    const char *end = NULL;
    /* len + 1 with require_null_terminated: trailing garbage is an error */
    cJSON *root = cJSON_ParseWithLengthOpts(data, len + 1, &end, true);
    if (!root) {
        size_t at = end && end >= data && end <= data + len ? (size_t)(end - data) : 0;
        if (scanned) at = ds_vocab_scan_orig_offset(&scan, at);
        e = ds_errorf("%s: not valid JSON (parse error near byte %zu)", path, at);
        ds_vocab_scan_free(&scan);
        free(data);
        free(full);
        return e;
    }
    free(data);
    ds_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) e = ds_errorf("out of memory");
    if (!e) e = build(tok, root, scanned ? &scan.lists : NULL);
    ds_vocab_scan_free(&scan);
    cJSON_Delete(root);
    if (e) {
        ds_tokenizer_free(tok);
        e = ds_error_wrap(e, "%s", path);
    } else {
        *out = tok;
    }
    free(full);
    return e;
}

void ds_tokenizer_free(ds_tokenizer *tok) {
    if (!tok) return;
    ds_bpe_free(&tok->bpe);
    ds_added_free(&tok->added);
    ds_normalizer_free(tok->normalizer);
    ds_pretok_free(tok->pretok);
    ds_postproc_free(tok->post);
    ds_decoder_free(tok->decoder);
    free(tok->added_of_id);
    free(tok->special);
    free(tok);
}

size_t ds_tokenizer_vocab_size(const ds_tokenizer *tok) { return tok ? tok->vocab_size : 0; }

int32_t ds_tokenizer_token_id(const ds_tokenizer *tok, const char *token) {
    if (!tok || !token) return -1;
    size_t n = strlen(token);
    /* Added tokens first, as HF's token_to_id. */
    int32_t a = ds_strtab_find(&tok->added.by_content, token, n);
    if (a >= 0) return tok->added.tok[a].id;
    return ds_strtab_find(&tok->bpe.vocab, token, n);
}
