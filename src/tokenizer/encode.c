/* ds_tokenizer_encode: HF's pipeline for one sequence.
 *   1. added tokens are cut out of the raw text (normalized=false ones);
 *   2. each stretch in between is normalized, then cut again at the
 *      normalized=true added tokens;
 *   3. the pre-tokenizer splits what is left into words;
 *   4. BPE turns each word into ids;
 *   5. with add_special, the post-processor adds BOS/EOS & co. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/utf8.h"

typedef struct {
    ds_buf norm, norm_tmp;
    ds_segs segs, nsegs;
    ds_pieces pieces, pieces_tmp;
    ds_bpe_scratch bpe;
    ds_regex_scratch *rs;
    ds_ids ids;
} enc_ctx;

static void ctx_free(enc_ctx *c) {
    ds_buf_free(&c->norm);
    ds_buf_free(&c->norm_tmp);
    ds_segs_free(&c->segs);
    ds_segs_free(&c->nsegs);
    ds_pieces_free(&c->pieces);
    ds_pieces_free(&c->pieces_tmp);
    ds_bpe_scratch_free(&c->bpe);
    ds_regex_scratch_free(c->rs);
    ds_ids_free(&c->ids);
}

/* One stretch of text between added tokens; `first` if it starts the input. */
static ds_error *encode_stretch(const ds_tokenizer *tok, enc_ctx *c, const char *s, size_t n, bool first) {
    DS_TRY(ds_normalizer_apply(tok->normalizer, s, n, &c->norm, &c->norm_tmp, &c->rs));
    const char *t = c->norm.data ? c->norm.data : "";
    c->nsegs.n = 0;
    DS_TRY(ds_added_split(&tok->added, &tok->added.norm, t, c->norm.len, &c->nsegs));
    for (size_t k = 0; k < c->nsegs.n; k++) {
        const ds_seg *g = &c->nsegs.v[k];
        if (g->id >= 0) {
            if (!ds_ids_push(&c->ids, g->id)) return ds_errorf("out of memory");
            continue;
        }
        ds_pieces_clear(&c->pieces);
        if (!ds_pieces_add(&c->pieces, t + g->start, g->end - g->start, first && g->start == 0))
            return ds_errorf("out of memory");
        DS_TRY(ds_pretok_apply(tok->pretok, &c->pieces, &c->pieces_tmp, &c->rs));
        for (size_t i = 0; i < c->pieces.n; i++) {
            const ds_piece *p = &c->pieces.v[i];
            DS_TRY(ds_bpe_encode_word(&tok->bpe, c->pieces.text.data + p->off, p->len, &c->bpe, &c->ids));
        }
    }
    return NULL;
}

static ds_error *encode(const ds_tokenizer *tok, enc_ctx *c, const char *text, size_t len, bool add_special) {
    DS_TRY(ds_added_split(&tok->added, &tok->added.raw, text, len, &c->segs));
    for (size_t k = 0; k < c->segs.n; k++) {
        const ds_seg *g = &c->segs.v[k];
        if (g->id >= 0) {
            if (!ds_ids_push(&c->ids, g->id)) return ds_errorf("out of memory");
        } else {
            DS_TRY(encode_stretch(tok, c, text + g->start, g->end - g->start, g->start == 0));
        }
    }
    if (add_special) DS_TRY(ds_postproc_apply(tok->post, &c->ids));
    return NULL;
}

ds_error *ds_tokenizer_encode(const ds_tokenizer *tok, const char *text, size_t len, bool add_special,
                              int32_t **ids, size_t *n_ids) {
    if (!tok || !ids || !n_ids || (!text && len)) return ds_errorf("ds_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (!text) text = "";
    size_t bad = ds_utf8_invalid_at(text, len);
    if (bad < len) return ds_errorf("text is not valid UTF-8 at byte %zu", bad);
    enc_ctx c = {0};
    ds_error *e = encode(tok, &c, text, len, add_special);
    /* an empty result is still a malloc'd array the caller can free */
    if (!e && !c.ids.v && !(c.ids.v = malloc(sizeof *c.ids.v))) e = ds_errorf("out of memory");
    if (e) {
        ctx_free(&c);
        return e;
    }
    *ids = c.ids.v;
    *n_ids = c.ids.n;
    c.ids.v = NULL;
    ctx_free(&c);
    return NULL;
}
