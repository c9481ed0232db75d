/* tokenizer.json "decoder" (ByteLevel, ByteFallback, Fuse, Replace, Strip,
 * Metaspace, Sequence), run as a stream so that decode() and the streaming
 * detokenizer share one implementation.
 *
 * HF decoders work on the list of token strings; every supported chain is
 * reduced to three stages: per-token steps (Replace/Strip/Metaspace before
 * anything joins tokens), the join (ByteLevel alphabet -> bytes,
 * ByteFallback "<0xNN>" runs -> bytes, concatenation), and steps on the
 * joined text (Replace/Strip after a join, e.g. llama2's Strip of the one
 * leading space). Bytes become text only once a UTF-8 character is
 * complete.
 *
 * Exact mode (decode) reproduces HF's decode() byte for byte. Streaming mode
 * (detokenizer) emits text as soon as it is final and can differ from
 * exact mode only on ill-formed bytes: HF turns a whole "<0xNN>" run that
 * is not valid UTF-8 into one U+FFFD per byte, while the stream has
 * already shown the run's valid leading characters; and a post-join
 * Replace whose pattern would match across two emitted chunks. */
#ifndef DS_TOK_DECODER_H
#define DS_TOK_DECODER_H

#include <cjson/cJSON.h>
#include <stdbool.h>

#include "dspark.h"
#include "tokenizer/regex.h"
#include "tokenizer/strbuf.h"

typedef struct ds_decoder ds_decoder;

/* j: the "decoder" value; NULL/null gives HF's fallback (tokens joined
 * with spaces). *out is always allocated on success. */
ds_error *ds_decoder_parse(const cJSON *j, ds_decoder **out);
void ds_decoder_free(ds_decoder *d);

/* Per-step state of a post-join Strip. */
typedef struct {
    size_t start_left; /* leading content chars still to strip */
    ds_buf held;       /* trailing content chars not yet known to be final */
} ds_strip_state;

typedef struct {
    const ds_decoder *dec;
    bool exact;
    size_t n_tokens;   /* tokens pushed so far */
    ds_buf pend;       /* byte-level bytes waiting for a complete character */
    ds_buf run;        /* current "<0xNN>" run */
    size_t run_done;   /* streaming: bytes of run already shown */
    bool run_bad;      /* streaming: run is not valid UTF-8 */
    ds_buf a, b;       /* per-token scratch */
    ds_buf chunk;      /* newly joined text */
    ds_buf tokbytes;   /* the bytes of a byte-level token */
    ds_buf joined;     /* exact mode: all joined text, post steps run at finish */
    ds_buf p1, p2;     /* post-step scratch */
    ds_strip_state *strip;
    ds_regex_scratch *rs;
    ds_buf out;        /* final text produced (the caller may consume/clear it) */
} ds_decode_stream;

ds_error *ds_decode_stream_init(ds_decode_stream *s, const ds_decoder *d, bool exact);
/* Feeds one token string; newly final text is appended to s->out. */
ds_error *ds_decode_stream_push(ds_decode_stream *s, const char *tok, size_t n);
/* Flushes everything held back into s->out. */
ds_error *ds_decode_stream_finish(ds_decode_stream *s);
void ds_decode_stream_free(ds_decode_stream *s);

#endif
