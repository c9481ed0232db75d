/* dspark — lossless speculative decoding with DSpark drafters.
 *
 * Public C API. Every fallible call returns NULL on success or a ds_error
 * whose message says which file, tensor, field or request is at fault; the
 * caller frees it with ds_error_free(). */
#ifndef DSPARK_H
#define DSPARK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------ */
typedef struct ds_error ds_error;
const char *ds_error_message(const ds_error *e);
void ds_error_free(ds_error *e);

/* ---- tokenizer (Hugging Face tokenizer.json) --------------------------- */
typedef struct ds_tokenizer ds_tokenizer;

ds_error *ds_tokenizer_load(const char *path, ds_tokenizer **out);
void ds_tokenizer_free(ds_tokenizer *tok);

/* Encodes UTF-8 text (len bytes). Added/special tokens written in the text
 * are always matched; add_special also adds what the post-processor adds
 * (e.g. BOS), like HF add_special_tokens=True. *ids is malloc'd. Invalid
 * UTF-8 is an error. */
ds_error *ds_tokenizer_encode(const ds_tokenizer *tok, const char *text, size_t len,
                              bool add_special, int32_t **ids, size_t *n_ids);
/* Decodes ids to UTF-8 text (NUL-terminated, malloc'd), like HF decode(). */
ds_error *ds_tokenizer_decode(const ds_tokenizer *tok, const int32_t *ids, size_t n_ids,
                              bool skip_special, char **text, size_t *len);
size_t ds_tokenizer_vocab_size(const ds_tokenizer *tok);
/* Id of a token string (vocab or added token), or -1. */
int32_t ds_tokenizer_token_id(const ds_tokenizer *tok, const char *token);

/* Streaming detokenizer: feed ids one at a time, get back only complete
 * UTF-8 text (never half a character). */
typedef struct ds_detok ds_detok;
ds_detok *ds_detok_new(const ds_tokenizer *tok, bool skip_special);
/* Appends id; *out (valid until the next call) receives the newly
 * printable text, possibly empty. */
ds_error *ds_detok_push(ds_detok *d, int32_t id, const char **out, size_t *out_len);
/* Flushes what is left (an incomplete UTF-8 tail becomes U+FFFD). */
ds_error *ds_detok_finish(ds_detok *d, const char **out, size_t *out_len);
void ds_detok_free(ds_detok *d);

#ifdef __cplusplus
}
#endif
#endif
