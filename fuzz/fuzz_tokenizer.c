/* libFuzzer harness: tokenizer.json through ds_tokenizer_load (normalizer,
 * pre-tokenizer patterns, BPE vocabulary and merges, added tokens,
 * decoder, post-processor). Input: the whole file. A tokenizer it accepts
 * is then used: a few texts encoded (with and without the special tokens
 * the post-processor adds) and the ids decoded again, whole and streamed,
 * and ids outside the vocabulary decoded, which must be a named error or
 * text, never a crash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_file.h"

static const char *const texts[] = {
    "Hello world! It is a truth universally acknowledged, 1234 times.",
    "  leading spaces\tand\ttabs\n\nnew lines  ",
    "h\xc3\xa9llo \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 caf\xc3\xa9",
    "<|endoftext|><s></s><bos><|im_start|>user\nhi<|im_end|>",
    "",
};

static void use(const ds_tokenizer *tok) {
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        for (int special = 0; special < 2; special++) {
            int32_t *ids = NULL;
            size_t n = 0;
            ds_error *e = ds_tokenizer_encode(tok, texts[i], strlen(texts[i]), special, &ids, &n);
            if (e) {
                ds_fuzz_consume(e);
                continue;
            }
            char *text = NULL;
            size_t len = 0;
            e = ds_tokenizer_decode(tok, ids, n, special, &text, &len);
            if (!e && text[len] != 0) abort(); /* decode promises a NUL-terminated string */
            ds_fuzz_consume(e);
            free(text);
            ds_detok *d = ds_detok_new(tok, special);
            for (size_t k = 0; d && k < n; k++) {
                const char *out;
                size_t out_len;
                ds_fuzz_consume(ds_detok_push(d, ids[k], &out, &out_len));
            }
            if (d) {
                const char *out;
                size_t out_len;
                ds_fuzz_consume(ds_detok_finish(d, &out, &out_len));
            }
            ds_detok_free(d);
            free(ids);
        }
    }
    const int32_t outside[] = {-1, (int32_t)ds_tokenizer_vocab_size(tok), 0x7fffffff};
    char *text = NULL;
    size_t len = 0;
    ds_fuzz_consume(ds_tokenizer_decode(tok, outside, 3, false, &text, &len));
    free(text);
    (void)ds_tokenizer_token_id(tok, "hello");
    (void)ds_tokenizer_token_id(tok, "<|endoftext|>");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = ds_fuzz_file("tokenizer.json", data, size);
    ds_tokenizer *tok = NULL;
    ds_error *e = ds_tokenizer_load(path, &tok);
    if (e) {
        if (tok) abort(); /* an error leaves no tokenizer behind */
        ds_fuzz_consume(e);
        return 0;
    }
    use(tok);
    ds_tokenizer_free(tok);
    return 0;
}
