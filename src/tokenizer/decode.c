/* ds_tokenizer_decode: ids -> token strings -> the decoder, like HF's
 * decode(). Ids inside the vocab range that have no token are skipped as
 * HF does; ids outside it are an error (HF would silently drop them, which
 * hides bugs upstream). */
#include <stdio.h>

#include "base/error.h"
#include "tokenizer/tokenizer_internal.h"

ds_error *ds_tokenizer_decode(const ds_tokenizer *tok, const int32_t *ids, size_t n_ids, bool skip_special,
                              char **text, size_t *len) {
    if (!tok || !text || (!ids && n_ids)) return ds_errorf("ds_tokenizer_decode: NULL argument");
    *text = NULL;
    if (len) *len = 0;
    ds_decode_stream st;
    DS_TRY(ds_decode_stream_init(&st, tok->decoder, true));
    ds_error *e = NULL;
    for (size_t i = 0; i < n_ids && !e; i++) {
        int32_t id = ids[i];
        if (id < 0 || (size_t)id >= tok->vocab_size) {
            e = ds_errorf("token id %d at position %zu is out of range (vocab size %zu)", id, i, tok->vocab_size);
            break;
        }
        if (skip_special && tok->special[id]) continue;
        size_t n;
        const char *piece = ds_tokenizer_piece(tok, id, &n);
        if (piece) e = ds_decode_stream_push(&st, piece, n);
    }
    if (!e) e = ds_decode_stream_finish(&st);
    if (!e) {
        *text = ds_buf_take(&st.out, len);
        if (!*text) e = ds_errorf("out of memory");
    }
    ds_decode_stream_free(&st);
    return e;
}
