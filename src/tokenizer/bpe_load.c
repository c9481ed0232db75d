/* Loading the BPE model: model.vocab and model.merges (from the cJSON
 * tree or the fast scanner's lists) into the hash tables encode uses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/json_util.h"
#include "tokenizer/utf8.h"

static void find_split_marker(ds_bpe *m);

static char *dup_or_null(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- loading ---------------------------------------------------------------- */

static ds_error *vocab_from_json(const cJSON *vocab, ds_bpe_lists *l) {
    if (!cJSON_IsObject(vocab))
        return ds_errorf("model.vocab should be an object of token: id, is %s", ds_json_kind(vocab));
    size_t n = (size_t)cJSON_GetArraySize(vocab), i = 0;
    if (!(l->vocab = malloc((n ? n : 1) * sizeof *l->vocab))) return ds_errorf("out of memory");
    for (const cJSON *c = vocab->child; c; c = c->next, i++) {
        long long id;
        char w[96];
        snprintf(w, sizeof w, "model.vocab[\"%.40s\"]", c->string ? c->string : "");
        DS_TRY(ds_json_as_uint(c, w, DS_MAX_TOKEN_ID, &id));
        size_t len = strlen(c->string);
        if (len > UINT32_MAX / 4) return ds_errorf("%s: token too long", w);
        l->vocab[i] = (ds_vocab_entry){c->string, (uint32_t)len, (int32_t)id};
    }
    l->n_vocab = i;
    return NULL;
}

/* HF accepts merges as "left right" strings (tokenizers < 0.20 files) or
 * as [left, right] pairs (newer files, which allow spaces in tokens). */
static ds_error *merges_from_json(const cJSON *merges, ds_bpe_lists *l) {
    if (!merges) return NULL;
    if (!cJSON_IsArray(merges)) return ds_errorf("model.merges should be an array, is %s", ds_json_kind(merges));
    size_t n = (size_t)cJSON_GetArraySize(merges), i = 0;
    if (!(l->merges = malloc((n ? n : 1) * sizeof *l->merges))) return ds_errorf("out of memory");
    for (const cJSON *mg = merges->child; mg; mg = mg->next, i++) {
        const char *a, *b;
        if (cJSON_IsString(mg)) {
            const char *sp = strchr(mg->valuestring, ' ');
            if (!sp) return ds_errorf("model.merges[%zu] \"%.60s\" is not \"left right\"", i, mg->valuestring);
            a = mg->valuestring;
            b = sp + 1;
            l->merges[i] = (ds_merge_entry){a, b, (uint32_t)(sp - a), (uint32_t)strlen(b)};
        } else if (cJSON_IsArray(mg) && cJSON_GetArraySize(mg) == 2 && cJSON_IsString(mg->child) &&
                   cJSON_IsString(mg->child->next)) {
            a = mg->child->valuestring;
            b = mg->child->next->valuestring;
            l->merges[i] = (ds_merge_entry){a, b, (uint32_t)strlen(a), (uint32_t)strlen(b)};
        } else {
            return ds_errorf("model.merges[%zu] should be \"left right\" or [left, right], is %s", i, ds_json_kind(mg));
        }
    }
    l->n_merges = i;
    return NULL;
}

static ds_error *load_vocab(ds_bpe *m, const ds_bpe_lists *l) {
    size_t bytes = 0;
    int32_t max_id = -1;
    for (size_t i = 0; i < l->n_vocab; i++) {
        bytes += l->vocab[i].n;
        if (l->vocab[i].id > max_id) max_id = l->vocab[i].id;
    }
    DS_TRY(ds_strtab_init(&m->vocab, (size_t)max_id + 1, l->n_vocab, bytes));
    for (size_t i = 0; i < l->n_vocab; i++) {
        if (i + 16 < l->n_vocab) ds_strtab_prefetch(&m->vocab, l->vocab[i + 16].s, l->vocab[i + 16].n);
        ds_strtab_set(&m->vocab, l->vocab[i].id, l->vocab[i].s, l->vocab[i].n);
    }
    return NULL;
}

/* Merges are resolved in blocks: gather the three strings of each merge
 * (left, right, left+right), look them all up with ds_strtab_find_many
 * (the lookups are independent, so their cache misses overlap), then
 * insert. Loading is memory-latency bound; this halves it for gemma3. */
enum { MERGE_BLOCK = 1024 };

typedef struct {
    const char *key[3 * MERGE_BLOCK];
    uint32_t len[3 * MERGE_BLOCK];
    size_t cat_off[MERGE_BLOCK];
    int32_t id[3 * MERGE_BLOCK];
    ds_buf cat; /* the merged strings of the block, back to back */
} merge_block;

static ds_error *resolve_block(ds_bpe *m, merge_block *bl, size_t first, size_t cnt) {
    if (bl->cat.failed) return ds_errorf("out of memory");
    for (size_t k = 0; k < cnt; k++) bl->key[3 * k + 2] = bl->cat.data + bl->cat_off[k];
    ds_strtab_find_many(&m->vocab, bl->key, bl->len, 3 * cnt, bl->id);
    for (size_t k = 0; k < cnt; k++) {
        const int32_t *id = &bl->id[3 * k];
        for (int j = 0; j < 3; j++)
            if (id[j] < 0)
                return ds_errorf("model.merges[%zu]: %stoken \"%.*s\" is not in model.vocab", first + k,
                                 j == 2 ? "merged " : "", (int)bl->len[3 * k + j], bl->key[3 * k + j]);
    }
    for (size_t k = 0; k < cnt; k++) {
        if (k + 8 < cnt) {
            uint64_t ahead = (uint64_t)(uint32_t)bl->id[3 * (k + 8)] << 32 | (uint32_t)bl->id[3 * (k + 8) + 1];
            __builtin_prefetch(&m->merges.slots[(size_t)ds_pairmap_mix(ahead) & m->merges.mask]);
        }
        /* A repeated pair keeps the later rank, as HF's HashMap collect does. */
        const int32_t *id = &bl->id[3 * k];
        ds_pairmap_put(&m->merges, (uint64_t)(uint32_t)id[0] << 32 | (uint32_t)id[1], (uint32_t)(first + k), id[2]);
    }
    return NULL;
}

static ds_error *load_merges(ds_bpe *m, const ds_bpe_lists *l) {
    DS_TRY(ds_pairmap_init(&m->merges, l->n_merges));
    merge_block *bl = calloc(1, sizeof *bl);
    if (!bl) return ds_errorf("out of memory");
    size_t plen = m->cont_prefix ? strlen(m->cont_prefix) : 0;
    size_t cnt = 0;
    ds_error *e = NULL;
    for (size_t i = 0; i < l->n_merges && !e; i++) {
        const ds_merge_entry *mg = &l->merges[i];
        const char *b = mg->b;
        uint32_t nb = mg->nb;
        bl->key[3 * cnt] = mg->a;
        bl->len[3 * cnt] = mg->na;
        bl->key[3 * cnt + 1] = b;
        bl->len[3 * cnt + 1] = nb;
        /* The merged token drops the right part's continuation prefix. */
        if (plen && nb >= plen && !memcmp(b, m->cont_prefix, plen)) {
            b += plen;
            nb -= (uint32_t)plen;
        }
        bl->cat_off[cnt] = bl->cat.len;
        ds_buf_append(&bl->cat, mg->a, mg->na);
        ds_buf_append(&bl->cat, b, nb);
        bl->len[3 * cnt + 2] = mg->na + nb;
        if (++cnt == MERGE_BLOCK) {
            e = resolve_block(m, bl, i + 1 - cnt, cnt);
            cnt = 0;
            ds_buf_clear(&bl->cat);
        }
    }
    if (!e && cnt) e = resolve_block(m, bl, l->n_merges - cnt, cnt);
    ds_buf_free(&bl->cat);
    free(bl);
    return e;
}

static ds_error *load_tables(ds_bpe *m, const cJSON *model, const ds_bpe_lists *pre) {
    ds_bpe_lists own = {0};
    ds_error *e = NULL;
    if (!pre) {
        e = vocab_from_json(ds_json_get(model, "vocab"), &own);
        if (!e) e = merges_from_json(ds_json_get(model, "merges"), &own);
        pre = &own;
    }
    if (!e) e = load_vocab(m, pre);
    if (!e) e = load_merges(m, pre);
    free(own.vocab);
    free(own.merges);
    return e;
}

ds_error *ds_bpe_load(ds_bpe *m, const cJSON *model, const ds_bpe_lists *pre) {
    memset(m, 0, sizeof *m);
    m->unk_id = -1;
    for (int b = 0; b < 256; b++) m->byte_id[b] = -1;
    if (!cJSON_IsObject(model)) return ds_errorf("model should be an object, is %s", ds_json_kind(model));
    const char *type, *unk, *prefix, *suffix;
    DS_TRY(ds_json_str_opt(model, "type", "model", &type));
    if (type && strcmp(type, "BPE"))
        return ds_errorf("model.type \"%s\" is not supported (BPE only)", type);
    if (!type && !ds_json_get(model, "merges") && !pre)
        return ds_errorf("model.type is missing and the model has no merges (only BPE is supported)");
    const cJSON *dropout = ds_json_get(model, "dropout");
    if (dropout && (!cJSON_IsNumber(dropout) || dropout->valuedouble != 0))
        return ds_errorf("model.dropout is set; BPE dropout is random and not supported for inference");
    DS_TRY(ds_json_str_opt(model, "unk_token", "model", &unk));
    DS_TRY(ds_json_str_opt(model, "continuing_subword_prefix", "model", &prefix));
    DS_TRY(ds_json_str_opt(model, "end_of_word_suffix", "model", &suffix));
    DS_TRY(ds_json_bool(model, "fuse_unk", "model", false, &m->fuse_unk));
    DS_TRY(ds_json_bool(model, "byte_fallback", "model", false, &m->byte_fallback));
    DS_TRY(ds_json_bool(model, "ignore_merges", "model", false, &m->ignore_merges));
    /* Empty affixes behave like none. */
    if ((unk && !(m->unk_token = dup_or_null(unk))) || (prefix && *prefix && !(m->cont_prefix = dup_or_null(prefix))) ||
        (suffix && *suffix && !(m->end_suffix = dup_or_null(suffix)))) {
        ds_bpe_free(m);
        return ds_errorf("out of memory");
    }
    ds_error *e = load_tables(m, model, pre);
    if (e) {
        ds_bpe_free(m);
        return e;
    }
    if (m->unk_token) m->unk_id = ds_strtab_find(&m->vocab, m->unk_token, strlen(m->unk_token));
    find_split_marker(m);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->byte_id[b] = ds_strtab_find(&m->vocab, name, 6);
    }
    return NULL;
}

void ds_bpe_free(ds_bpe *m) {
    ds_strtab_free(&m->vocab);
    ds_pairmap_free(&m->merges);
    free(m->unk_token);
    free(m->cont_prefix);
    free(m->end_suffix);
    memset(m, 0, sizeof *m);
}

/* ---- where long words may be cut (used by ds_bpe_encode_word) ---------------- */

/* Long words (a SentencePiece-style model sees a whole line as one word)
 * are cut into pieces that BPE provably never merges across, so the merge
 * queue stays small and cache-resident. A cut goes before the word-start
 * marker C (▁ or Ġ) when the character x before it is an ordinary vocab
 * character and no vocab token contains "xC": every merged symbol is a vocab
 * token, so no symbol can ever span the cut, and the result is identical. */
static void find_split_marker(ds_bpe *m) {
    static const char *const markers[] = {"\xE2\x96\x81" /* ▁ */, "\xC4\xA0" /* Ġ */};
    m->split_cp = 0;
    if (m->cont_prefix || m->end_suffix) return; /* affixes depend on word position */
    for (int k = 0; k < 2; k++) {
        uint32_t c;
        ds_utf8_next(markers[k], &c);
        if (ds_strtab_find(&m->vocab, markers[k], strlen(markers[k])) < 0) continue;
        size_t np = 0;
        bool ok = true;
        for (size_t id = 0; id < m->vocab.n_ids && ok; id++) {
            size_t n;
            const char *t = ds_strtab_get(&m->vocab, (int32_t)id, &n);
            /* a symbol spanning a cut would be text, so valid UTF-8 */
            if (!t || ds_utf8_invalid_at(t, n) != n) continue;
            uint32_t prev = 0;
            for (size_t i = 0; i < n;) {
                uint32_t cp;
                i += (size_t)ds_utf8_next(t + i, &cp);
                if (cp == c && i > (size_t)ds_utf8_len((unsigned char)t[0]) && prev != c) {
                    bool known = false;
                    for (size_t j = 0; j < np; j++) known |= m->split_after_not[j] == prev;
                    if (!known) {
                        if (np == DS_BPE_MAX_GLUE) {
                            ok = false;
                            break;
                        }
                        m->split_after_not[np++] = prev;
                    }
                }
                prev = cp;
            }
        }
        if (ok) {
            m->split_cp = c;
            m->n_split_after_not = np;
            return;
        }
    }
}
