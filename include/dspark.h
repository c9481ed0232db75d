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

/* ---- engine: a target (+ drafter) ready to generate -------------------- */
typedef struct ds_engine ds_engine;

typedef struct {
    const char *model_dir;   /* Hugging Face target directory (required) */
    const char *drafter_dir; /* DeepSpec drafter directory, or NULL for plain decoding */
    const char *backend;     /* "cpu" (default) or "cuda" */
    int threads;             /* CPU threads (0: all online CPUs) */
} ds_engine_opts;

ds_error *ds_engine_open(const ds_engine_opts *opts, ds_engine **out);
void ds_engine_free(ds_engine *e);
/* The target's tokenizer (owned by the engine). */
const ds_tokenizer *ds_engine_tokenizer(const ds_engine *e);

typedef struct {
    int max_new;       /* tokens to generate at most */
    float temperature; /* 0: greedy */
    int top_k;         /* 0: off */
    float top_p;       /* 0 or >= 1: off */
    uint64_t seed;
    float threshold;   /* confidence threshold (0: keep the whole block) */
    int gamma;         /* proposal positions to use (0: the drafter's block size) */
    bool no_draft;     /* decode autoregressively even with a drafter */
    bool ignore_eos;   /* do not stop at the model's stop tokens */
} ds_generate_opts;

typedef struct {
    int32_t *tokens; /* generated ids (a final stop token included) */
    int n_tokens;
    bool stopped;    /* ended on a stop token */
    int rounds;      /* verify passes (drafted decoding) */
    double acceptance_length; /* tau: mean tokens committed per round */
    double prefill_s, draft_s, verify_s, total_s;
} ds_output;

/* Called with every committed token as soon as it is final; return false to stop. */
typedef bool (*ds_on_token)(void *user, int32_t token);

/* Generates from prompt ids. The engine serves one generation at a time. */
ds_error *ds_engine_generate(ds_engine *e, const int32_t *prompt, size_t n_prompt, const ds_generate_opts *opts,
                             ds_on_token on_token, void *user, ds_output *out);
void ds_output_free(ds_output *o);

#ifdef __cplusplus
}
#endif
#endif
