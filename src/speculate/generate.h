/* One request, start to finish: prefill, then plain autoregressive decoding
 * or DSpark rounds (draft -> verify in one target pass -> accept -> commit),
 * exactly as SPEC §5 / DeepSpec's generate_decoding_sample. */
#ifndef DS_GENERATE_H
#define DS_GENERATE_H

#include "draft/drafter.h"
#include "model/target.h"
#include "sample/sampling.h"
#include "sample/verify.h"

typedef struct {
    int max_new;          /* tokens to generate at most */
    ds_sampling sampling;
    uint64_t seed;
    float threshold;      /* confidence threshold (<= 0: keep all gamma) */
    int gamma;            /* proposal positions to use (0: the checkpoint's block size) */
    bool ignore_stop;     /* run past stop tokens (the goldens are made this way) */
    ds_verify_fn verify;  /* NULL: ds_verify (tests substitute broken verifiers here) */
    bool record_conf;     /* keep every round's raw confidence logits (ds_gen_result.conf); the
                             rounds then draft on the host path, where the logits are */
} ds_gen_params;

/* Called with every committed token as soon as it is final; return false to stop. */
typedef bool (*ds_token_fn)(void *user, int32_t token);

/* Why a generation ended. */
typedef enum {
    DS_STOP_LENGTH,   /* max_new tokens were generated */
    DS_STOP_TOKEN,    /* a stop token (it ends the output) */
    DS_STOP_CONTEXT,  /* the model's context ran out before max_new */
    DS_STOP_CALLER,   /* the token callback returned false */
} ds_stop_reason;

/* "length", "stop", "context" or "caller" (the names OpenAI-style APIs use
 * for the first two). */
const char *ds_stop_reason_name(ds_stop_reason r);

typedef struct {
    int32_t *tokens;  /* generated ids (a final stop token included), malloc'd */
    int n_tokens;
    bool stopped;     /* ended on a stop token */
    ds_stop_reason stop_reason;
    int rounds;
    int *accepted;    /* per round: accepted draft tokens */
    int *proposed;    /* per round: proposal length sent to verification */
    int *accept_len;  /* per round: accepted + 1, or accepted in a stop round */
    float *conf;      /* record_conf with a confidence head: per round, the drafter's block size of
                         raw confidence logits (row r = round r); else NULL */
    double prefill_s, draft_s, verify_s, total_s;
} ds_gen_result;

/* drafter NULL = autoregressive. */
ds_error *ds_generate(ds_target *t, ds_drafter *d, const int32_t *prompt, int n_prompt, const ds_gen_params *p,
                      ds_token_fn on_token, void *user, ds_gen_result *out);
void ds_gen_result_free(ds_gen_result *r);
/* Records one round's counts (accepted drafts, drafts verified, tokens it committed). */
ds_error *ds_gen_result_add_round(ds_gen_result *r, int accepted, int proposed, int len);

#endif
