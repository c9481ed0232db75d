/* struct ds_tokenizer, shared by the files of src/tokenizer/. A loaded
 * tokenizer is immutable: encode/decode/detokenizers may use it from
 * several threads at once; all per-call state lives in the caller. */
#ifndef DS_TOK_TOKENIZER_INTERNAL_H
#define DS_TOK_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dspark.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalize.h"
#include "tokenizer/postprocess.h"
#include "tokenizer/pretokenize.h"

struct ds_tokenizer {
    ds_bpe bpe;
    ds_added_vocab added;
    ds_normalizer *normalizer; /* NULL: none */
    ds_pretok *pretok;         /* NULL: a whole stretch is one word */
    ds_postproc *post;         /* NULL: add_special adds nothing */
    ds_decoder *decoder;       /* never NULL */
    size_t vocab_size;         /* 1 + the largest id of the vocab or added tokens */
    int32_t *added_of_id;      /* per id: index into added.tok, or -1 */
    uint8_t *special;          /* per id: dropped by decode(skip_special) */
};

/* The string HF decodes id as (added token content first, then the model
 * vocab), or NULL for an id inside the range that has no token. */
const char *ds_tokenizer_piece(const ds_tokenizer *tok, int32_t id, size_t *len);

#endif
