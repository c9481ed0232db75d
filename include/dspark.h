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

/* ---- chat prompts ------------------------------------------------------ */
/* One turn of a conversation. A model's chat template renders a list of
 * them into the prompt text (see ds_engine_chat_encode). */
typedef struct {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content; /* UTF-8, NUL-terminated */
} ds_chat_message;

/* ---- engine: a target (+ drafter) ready to generate -------------------- */
typedef struct ds_engine ds_engine;

typedef struct {
    const char *model_dir;   /* Hugging Face target directory (required) */
    const char *drafter_dir; /* DeepSpec drafter directory, or NULL for plain decoding */
    const char *backend;     /* "cpu" (default) or "cuda" */
    int threads;             /* CPU threads (0: all online CPUs) */
    const char *tokenizer;   /* a tokenizer.json or a directory holding one; NULL: the model
                                directory's tokenizer.json if it has one, else no tokenizer
                                (prompts are then ids and output is ids) */
    int device;              /* CUDA device index (backend "cuda"; 0: the first GPU) */
    const char *sts;         /* STS temperatures for the drafter's confidence (`dspark calibrate`'s file);
                                NULL: the drafter directory's sts.json when there is one */
    bool no_sts;             /* read no temperature file: the confidence head as it is */
    int tp;                  /* tensor parallel: the target split across tp ranks (0, 1: none), one thread and one
                                backend a rank (CUDA: GPUs device .. device + tp - 1), the drafter on each; every
                                generation, and with batch every step of the batched engine, runs on all ranks
                                (the calls below go to rank 0, the others follow); Qwen3 and Gemma 4 targets
                                (not the E-series) */
    /* The batched engine (ds_engine_generate_batch): */
    int batch;               /* > 0: up to `batch` requests at once, one target forward a step over all of
                                them, KV caches a pool of pages; 0: one generation at a time */
    int ctx;                 /* tokens a request may hold, prompt and output (0: the model's context);
                                required with batch: the pool holds batch x ctx rows */
    int64_t kv_mem;          /* with batch: bytes for the KV pool, the target's and the drafter's caches
                                together (0: batch x ctx rows). Pages = what the budget holds at the bytes a
                                position takes in both (from the checkpoints' configs, before anything is
                                allocated), after the drafter's rows for every request's block; at most what
                                batch requests of ctx tokens can use. A budget short of one request of ctx
                                tokens (and a block) is an error naming both. ds_engine_info reports the pool */
    bool confidence_schedule; /* with batch: SPEC §6 Algorithm 1 chooses how much of each proposal is
                                 verified (needs a confidence head); the target's step cost is profiled
                                 at open */
    const char *sps_cache;   /* with confidence_schedule: the step-cost profile's cache file (NULL: none) */
} ds_engine_opts;

/* Opens the backend, the target, the drafter (and its STS temperatures)
 * and the tokenizer, in that order; the first that fails is the error
 * (naming its directory or file). With STS temperatures s_k, a threshold
 * cuts a proposal at the first position whose calibrated confidence
 * sigmoid(z_k / s_k) is below it (z_k the head's logit, fp32). */
ds_error *ds_engine_open(const ds_engine_opts *opts, ds_engine **out);
void ds_engine_free(ds_engine *e);
/* The engine's tokenizer (owned by the engine), or NULL when it has none:
 * no ds_engine_opts.tokenizer and no tokenizer.json in the model directory. */
const ds_tokenizer *ds_engine_tokenizer(const ds_engine *e);

/* What an open engine serves. */
typedef struct {
    int context;        /* tokens the target's context holds, prompt and generated together */
    int vocab_size;     /* the target's vocabulary: prompt ids lie in [0, vocab_size) */
    int block_size;     /* the drafter's proposal positions, the largest gamma (0: no drafter) */
    bool has_drafter;
    bool has_tokenizer;
    bool has_confidence; /* the drafter has a confidence head (a threshold can cut its proposals) */
    bool calibrated;     /* STS temperatures are applied to it */
    /* The batched engine's KV pool (zeros on an engine that is not batched): */
    int kv_pages, kv_page_rows;   /* pages of the target's pool, rows (positions) a page holds */
    int64_t kv_tokens;            /* kv_pages x kv_page_rows: positions the pool holds, all requests together */
    int64_t kv_bytes;             /* the pool's K/V caches, target and drafter (its block rows included) */
    int64_t kv_target_row_bytes;  /* bytes one position takes in the target's caches, every layer */
    int64_t kv_drafter_row_bytes; /* the same in the drafter's (0: no drafter) */
    int64_t held_bytes;           /* the drafter context rows held between its passes (fp32 taps; 0: no drafter) */
} ds_engine_info;
void ds_engine_get_info(const ds_engine *e, ds_engine_info *info);

/* Renders msgs[0..n) (n >= 1) with the model directory's chat template, as
 * transformers' apply_chat_template(add_generation_prompt=True,
 * enable_thinking=False) renders it, and encodes the text without adding
 * special tokens (the templates write any BOS themselves): the prompt ids
 * for ds_engine_generate, *ids malloc'd. Errors: no tokenizer, no or an
 * unsupported chat template (Qwen3 ChatML, Gemma 3 and Gemma 4 are
 * supported; the template is found on first use), a bad message (named by
 * its index). */
ds_error *ds_engine_chat_encode(ds_engine *e, const ds_chat_message *msgs, size_t n, int32_t **ids, size_t *n_ids);
/* The rendered text alone (NUL-terminated, malloc'd); needs no tokenizer. */
ds_error *ds_engine_chat_render(ds_engine *e, const ds_chat_message *msgs, size_t n, char **text);

typedef struct {
    int max_new;       /* tokens to generate at most (>= 0) */
    float temperature; /* 0: greedy; finite and >= 0 */
    int top_k;         /* 0: off */
    float top_p;       /* 0 or >= 1: off */
    uint64_t seed;
    float threshold;   /* confidence threshold in [0, 1] (0: keep the whole block) */
    int gamma;         /* proposal positions to use, at most the block size (0: all of them) */
    bool no_draft;     /* decode autoregressively even with a drafter */
    bool ignore_eos;   /* do not stop at the model's stop tokens */
    bool record_confidence; /* fill ds_output.confidence (dspark calibrate); drafting then runs on
                               the host path, where the confidence logits are */
} ds_generate_opts;

/* Why a generation ended. */
typedef enum {
    DS_FINISH_LENGTH,  /* max_new tokens were generated */
    DS_FINISH_STOP,    /* a stop token, the last of the output */
    DS_FINISH_CONTEXT, /* the model's context ran out before max_new */
    DS_FINISH_CALLER,  /* the ds_on_token callback returned false */
} ds_finish_reason;
/* "length", "stop", "context" or "caller" (OpenAI-style names for the first two). */
const char *ds_finish_reason_name(ds_finish_reason r);

typedef struct {
    int32_t *tokens; /* generated ids (a final stop token included) */
    int n_tokens;
    bool stopped;    /* ended on a stop token */
    ds_finish_reason finish_reason;
    int rounds;      /* verify passes (drafted decoding; 0 otherwise) */
    /* Per round, rounds of each (NULL without rounds): */
    int *accepted;   /* drafted tokens the target accepted */
    int *proposed;   /* drafted tokens sent to verification (cut to the stop token in a stop round) */
    int *accept_len; /* tokens the round committed: accepted + 1 (the target's own next token),
                        or accepted where a drafted stop token ended the round */
    float *confidence; /* record_confidence with a confidence head: per round, block_size raw
                          confidence logits (row r = round r, before any STS temperature); else NULL */
    double acceptance_length; /* tau: mean accept_len */
    double prefill_s, draft_s, verify_s, total_s; /* wall time: prompt, drafting, verification, all */
} ds_output;

/* Called with every committed token as soon as it is final; return false to stop. */
typedef bool (*ds_on_token)(void *user, int32_t token);

/* Generates from prompt ids (from a tokenizer, ds_engine_chat_encode, or
 * given as is: each in [0, vocab_size), no BOS added). Options out of range
 * are errors naming the field. On a batched engine (ds_engine_opts.batch)
 * it is a batch of one, and on_token sees the tokens once it has ended. */
ds_error *ds_engine_generate(ds_engine *e, const int32_t *prompt, size_t n_prompt, const ds_generate_opts *opts,
                             ds_on_token on_token, void *user, ds_output *out);
void ds_output_free(ds_output *o);

/* Generates for prompts[0..n) at once on a batched engine (ds_engine_opts
 * .batch > 0), at most `batch` in flight, requests joining as others end:
 * outs[i] for prompts[i] (n_prompts[i] ids) under opts[i]. Each output is
 * token for token what ds_engine_generate gives that prompt alone, at
 * T > 0 too (every request draws from its own seed's stream), whatever
 * else runs beside it; with confidence_schedule the rounds, and at T > 0
 * which tokens are drawn, depend on the batch (the distribution does not).
 * Per request no_draft and record_confidence are not offered. An output's
 * total_s is its share (1/n) of the batch's wall time, so that pooled
 * stats add up to it; summary (may be NULL) gets the whole. */
typedef struct {
    double total_s;    /* wall time of the whole batch */
    long steps;        /* engine steps (one target forward each) */
    long preemptions;  /* requests whose KV pages were taken back and recomputed */
    int max_running;   /* most requests in flight at once */
} ds_batch_summary;
ds_error *ds_engine_generate_batch(ds_engine *e, size_t n, const int32_t *const *prompts, const size_t *n_prompts,
                                   const ds_generate_opts *opts, ds_output *outs, ds_batch_summary *summary);

/* ---- requests that come and go: the batched engine stepped by its caller -- */
/* For a server: on a batched engine (ds_engine_opts.batch > 0) requests are
 * submitted at any time, each ds_engine_step runs one target forward over
 * every request in flight (requests join and leave between steps), and a
 * request's committed tokens can be read after every step. Each request's
 * tokens are those ds_engine_generate gives it alone (see
 * ds_engine_generate_batch). Not thread-safe: one thread submits, steps,
 * reads, cancels and releases (a server's engine thread). */
typedef int64_t ds_request_id;

/* Queues a request (prompt copied); *id is unique for the engine's life.
 * A request that could never run (empty, over-long or out-of-vocabulary
 * prompt, a prompt the KV pool cannot hold, bad options) is an error naming
 * the field; nothing is queued then. */
ds_error *ds_engine_submit(ds_engine *e, const int32_t *prompt, size_t n_prompt, const ds_generate_opts *opts,
                           ds_request_id *id);
/* One step: admit waiting requests, draft, one target forward, accept,
 * commit. *active: requests submitted and not finished after it (0: the
 * engine is idle; a step then does nothing and returns at once). */
ds_error *ds_engine_step(ds_engine *e, int *active);

typedef struct {
    const int32_t *tokens;  /* committed so far (a final stop token included); valid until the next
                               step, cancel or release */
    size_t n_tokens;
    size_t n_prompt;
    bool running;           /* holds KV pages now (prefilling or decoding); false while waiting or done */
    bool finished;
    ds_finish_reason finish_reason; /* once finished */
    int rounds;             /* verify passes so far */
    long accepted;          /* drafts the target accepted so far */
    long proposed;          /* drafts sent to verification so far */
} ds_request_state;
/* The state of a request not yet released; an unknown id is an error. */
ds_error *ds_engine_request(const ds_engine *e, ds_request_id id, ds_request_state *st);
/* Ends a request now (finish reason "caller"; its tokens so far stay
 * readable) and gives its KV pages back. No-op on a finished request. */
ds_error *ds_engine_cancel(ds_engine *e, ds_request_id id);
/* Forgets a request (cancelling it first if it runs): its id becomes unknown. */
ds_error *ds_engine_release(ds_engine *e, ds_request_id id);

/* What a batched engine did since it opened (the counters a server
 * exports: names follow vLLM's metrics where vLLM has one). */
#define DS_METRICS_POSITIONS 32
typedef struct {
    int running;              /* requests holding KV pages */
    int waiting;              /* requests queued, not admitted (or preempted) */
    int kv_pages_used, kv_pages_total; /* the target's KV pool */
    int kv_page_rows;         /* rows (tokens) a page holds */
    int64_t steps;            /* engine steps with a target forward */
    int64_t prompt_tokens;    /* prefilled rows (recomputes after preemption included) */
    int64_t generation_tokens; /* tokens committed */
    int64_t preemptions;
    int64_t requests_finished;
    /* speculative decoding (vllm:spec_decode_*): */
    int64_t drafts;            /* verify rounds that verified at least one draft */
    int64_t draft_tokens;      /* drafts sent to verification */
    int64_t accepted_tokens;   /* drafts the target accepted */
    int64_t accepted_per_pos[DS_METRICS_POSITIONS]; /* rounds whose draft at position k was accepted */
} ds_engine_metrics;
/* Zeros on an engine that is not batched. */
void ds_engine_get_metrics(const ds_engine *e, ds_engine_metrics *m);

/* ---- metrics pooled over generations ------------------------------------ */
/* The meaning of DeepSpec's build_metrics_row, over every round of every
 * output added. */
typedef struct ds_stats ds_stats;

ds_error *ds_stats_new(ds_stats **out);
void ds_stats_free(ds_stats *s);
void ds_stats_add(ds_stats *s, const ds_output *o);

typedef struct {
    int outputs;                 /* outputs added */
    long tokens;                 /* tokens generated */
    int rounds;                  /* verify passes */
    double acceptance_length;    /* tau: sum of accept_len / rounds */
    double verify_rate;          /* sum of accept_len / (sum of proposed + rounds) */
    double proposed_per_round;   /* sum of proposed / rounds */
    double total_s, prefill_s, draft_s, verify_s; /* sums */
} ds_stats_summary; /* ratios are 0 without rounds */
void ds_stats_summarize(const ds_stats *s, ds_stats_summary *out);
/* Acceptance at draft position k (0-based): rounds that accepted more than
 * k drafts / rounds that proposed more than k; -1 where no round proposed
 * more than k, so positions 0, 1, ... up to the first -1 are the profile. */
double ds_stats_accept_rate_at(const ds_stats *s, int k);

#ifdef __cplusplus
}
#endif
#endif
