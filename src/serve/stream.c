/* Stop strings: after each token the text not yet shown (`held`) is
 * searched for the earliest occurrence of any stop string. A match ends the
 * output before it. Otherwise the longest suffix of `held` that is a proper
 * prefix of some stop string stays held and the rest is shown; a match can
 * only start inside that suffix later, so what was shown never needs taking
 * back. `held` is therefore shorter than the longest stop string between
 * calls (at most DS_REQ_MAX_STOP_BYTES), whatever the output's length. */
#include "serve/stream.h"

#include <stdlib.h>
#include <string.h>

struct ds_text_stream {
    ds_detok *detok;
    char **stop;
    size_t *stop_len;
    size_t n_stop;
    ds_sbuf held;
    bool done;
};

ds_text_stream *ds_text_stream_new(const ds_tokenizer *tok, char *const *stop, size_t n_stop) {
    ds_text_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    /* skip_special: the model's stop token and other special tokens are not
     * text, as dspark generate prints them. */
    if (!(s->detok = ds_detok_new(tok, true))) goto fail;
    if (n_stop) {
        s->stop = calloc(n_stop, sizeof *s->stop);
        s->stop_len = calloc(n_stop, sizeof *s->stop_len);
        if (!s->stop || !s->stop_len) goto fail;
    }
    for (size_t i = 0; i < n_stop; i++) {
        s->stop_len[i] = strlen(stop[i]);
        if (!(s->stop[i] = malloc(s->stop_len[i] + 1))) goto fail;
        memcpy(s->stop[i], stop[i], s->stop_len[i] + 1);
        s->n_stop = i + 1;
    }
    return s;
fail:
    ds_text_stream_free(s);
    return NULL;
}

void ds_text_stream_free(ds_text_stream *s) {
    if (!s) return;
    ds_detok_free(s->detok);
    for (size_t i = 0; i < s->n_stop; i++) free(s->stop[i]);
    free(s->stop);
    free(s->stop_len);
    ds_sbuf_free(&s->held);
    free(s);
}

/* Earliest start of any stop string in h[0..n), or n. memmem, not strstr:
 * the text may hold NUL bytes (a token can decode to one). */
static size_t first_match(const ds_text_stream *s, const char *h, size_t n) {
    size_t best = n;
    for (size_t i = 0; i < s->n_stop; i++) {
        const char *p = memmem(h, n, s->stop[i], s->stop_len[i]);
        if (p && (size_t)(p - h) < best) best = (size_t)(p - h);
    }
    return best;
}

/* Length of the longest suffix of h[0..n) that is a proper prefix of a stop string. */
static size_t held_suffix(const ds_text_stream *s, const char *h, size_t n) {
    size_t keep = 0;
    for (size_t i = 0; i < s->n_stop; i++) {
        size_t max = s->stop_len[i] - 1 < n ? s->stop_len[i] - 1 : n;
        for (size_t k = max; k > keep; k--) {
            if (!memcmp(h + n - k, s->stop[i], k)) {
                keep = k;
                break;
            }
        }
    }
    return keep;
}

/* Moves what is safe from held to out; true on a stop match. */
static bool release(ds_text_stream *s, ds_sbuf *out, bool final) {
    const char *h = ds_sbuf_str(&s->held);
    size_t n = s->held.len;
    size_t m = first_match(s, h, n);
    if (m < n) {
        ds_sbuf_append(out, h, m);
        ds_sbuf_clear(&s->held);
        s->done = true;
        return true;
    }
    size_t show = final ? n : n - held_suffix(s, h, n);
    ds_sbuf_append(out, h, show);
    ds_sbuf_consume(&s->held, show);
    return false;
}

bool ds_text_stream_push(ds_text_stream *s, int32_t id, ds_sbuf *out) {
    if (s->done) return true;
    const char *text = "";
    size_t len = 0;
    ds_error *e = ds_detok_push(s->detok, id, &text, &len);
    /* An id outside the vocabulary cannot come from the engine; were it to,
     * it is shown as nothing rather than ending the request. */
    if (e) {
        ds_error_free(e);
        len = 0;
    }
    if (!s->n_stop) {
        ds_sbuf_append(out, text, len);
        return false;
    }
    ds_sbuf_append(&s->held, text, len);
    return release(s, out, false);
}

bool ds_text_stream_finish(ds_text_stream *s, ds_sbuf *out) {
    if (s->done) return true;
    const char *text = "";
    size_t len = 0;
    ds_error *e = ds_detok_finish(s->detok, &text, &len);
    if (e) {
        ds_error_free(e);
        len = 0;
    }
    ds_sbuf_append(&s->held, text, len);
    s->done = true;
    return release(s, out, true);
}
