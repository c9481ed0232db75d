/* The public streaming detokenizer: the decoder in streaming mode (see
 * decoder.h for where it can differ from decode()). Text is handed out
 * only when final: a UTF-8 character split across tokens (byte-level
 * "ðŁ" + "į" + "ķ", or "<0xF0>" "<0x9F>" ...) comes out whole with the
 * token that completes it. */
#include <stdlib.h>

#include "base/error.h"
#include "tokenizer/tokenizer_internal.h"

struct ds_detok {
    const ds_tokenizer *tok;
    bool skip_special;
    bool finished;
    ds_decode_stream st;
};

ds_detok *ds_detok_new(const ds_tokenizer *tok, bool skip_special) {
    if (!tok) return NULL;
    ds_detok *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->tok = tok;
    d->skip_special = skip_special;
    ds_error *e = ds_decode_stream_init(&d->st, tok->decoder, false);
    if (e) {
        ds_error_free(e);
        free(d);
        return NULL;
    }
    return d;
}

static void hand_out(ds_detok *d, const char **out, size_t *out_len) {
    if (out) *out = d->st.out.data ? d->st.out.data : "";
    if (out_len) *out_len = d->st.out.len;
}

ds_error *ds_detok_push(ds_detok *d, int32_t id, const char **out, size_t *out_len) {
    if (out) *out = "";
    if (out_len) *out_len = 0;
    if (!d) return ds_errorf("ds_detok_push: detokenizer is NULL");
    if (d->finished) return ds_errorf("ds_detok_push: token %d pushed after ds_detok_finish", id);
    const ds_tokenizer *tok = d->tok;
    if (id < 0 || (size_t)id >= tok->vocab_size)
        return ds_errorf("token id %d is out of range (vocab size %zu)", id, tok->vocab_size);
    ds_buf_clear(&d->st.out);
    if (d->skip_special && tok->special[id]) return NULL;
    size_t n;
    const char *piece = ds_tokenizer_piece(tok, id, &n);
    if (piece) DS_TRY(ds_decode_stream_push(&d->st, piece, n));
    hand_out(d, out, out_len);
    return NULL;
}

ds_error *ds_detok_finish(ds_detok *d, const char **out, size_t *out_len) {
    if (out) *out = "";
    if (out_len) *out_len = 0;
    if (!d) return ds_errorf("ds_detok_finish: detokenizer is NULL");
    ds_buf_clear(&d->st.out);
    if (d->finished) return NULL;
    d->finished = true;
    DS_TRY(ds_decode_stream_finish(&d->st));
    hand_out(d, out, out_len);
    return NULL;
}

void ds_detok_free(ds_detok *d) {
    if (!d) return;
    ds_decode_stream_free(&d->st);
    free(d);
}
