/* libFuzzer harness: the training cache's readers (src/io/train_shard.h,
 * train_manifest.h, train_cache.h), what a trainer opens. Input: the first
 * byte picks what the rest is:
 *   even: a shard file, opened with ds_shard_open (no manifest to agree with,
 *         so the header and index checks alone stand between it and the reads);
 *   odd:  the manifest.json of a cache directory whose one shard is a valid
 *         shard made at start-up (2 sequences, 2 taps x hidden 8), opened
 *         with ds_train_cache_open.
 * Whatever opens is read through: every sequence's ids, mask, taps and final
 * hidden state touched (ASan checks each view lies inside its mapping), and
 * every error must say what is wrong. DS_FUZZ_SEEDS=DIR writes the valid
 * shard and manifest there as seeds (fuzz/corpus/train_cache). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_file.h"
#include "io/train_cache.h"

static char cache_dir[600], shard_path[700];

static void must(ds_error *e, const char *what) {
    if (!e) return;
    fprintf(stderr, "fuzz_train_cache: %s: %s\n", what, ds_error_message(e));
    abort();
}

static unsigned touch(const ds_train_seq *s, uint32_t n_taps, uint32_t hidden) {
    unsigned sum = 0;
    for (int k = 0; k < s->len; k++) sum += (unsigned)s->ids[k] + s->mask[k];
    for (size_t k = 0; k < (size_t)s->len * n_taps * hidden; k++) sum += s->taps[k];
    for (size_t k = 0; k < (size_t)s->len * hidden; k++) sum += s->final_hidden[k];
    return sum;
}

/* The valid cache the manifest inputs point at: 2 sequences in one shard. */
static void make_cache(void) {
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", ds_fuzz_tmpdir());
    snprintf(shard_path, sizeof shard_path, "%s/shard-00000.bin", cache_dir);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", cache_dir);
    if (system(cmd)) abort();
    ds_train_manifest m = {.vocab = 64, .hidden = 8, .n_layers = 4, .n_taps = 2, .tap_layers = {-1, 2},
                           .temperature = 0.7f, .top_p = 0.95f, .max_new = 4, .n_prompts = 2, .shard_tokens = 100,
                           .complete = true, .target = {1, 2}, .prompts_hash = 3};
    strcpy(m.model_type, "qwen3");
    strcpy(m.backend, "cpu");
    strcpy(m.target_dir, "target");
    strcpy(m.prompt_file, "prompts.jsonl");
    m.cache_id = ds_train_manifest_id(&m);
    ds_shard_writer *w;
    must(ds_shard_writer_open(shard_path, 2, 8, m.cache_id, 0, &w), "writer");
    float taps[6 * 16], fh[6 * 8];
    for (int i = 0; i < 6 * 16; i++) taps[i] = (float)i * 0.25f;
    for (int i = 0; i < 6 * 8; i++) fh[i] = -(float)i;
    const int32_t ids[2][6] = {{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 0, 0}};
    ds_train_shard_info info = {.first_seq = 0, .n_seqs = 2, .n_tokens = 10};
    strcpy(info.file, "shard-00000.bin");
    must(ds_shard_writer_begin(w, ids[0], 6, 2), "begin");
    must(ds_shard_writer_rows(w, 0, 6, taps, fh), "rows");
    must(ds_shard_writer_begin(w, ids[1], 4, 3), "begin");
    must(ds_shard_writer_rows(w, 0, 4, taps, fh), "rows");
    must(ds_shard_writer_finish(w, &info.bytes), "finish");
    ds_shard_writer_free(w);
    must(ds_train_manifest_add_shard(&m, &info), "manifest");
    const char *seeds = getenv("DS_FUZZ_SEEDS");
    if (seeds) { /* the valid inputs: 0x00 + the shard, 0x01 + the manifest */
        must(ds_train_manifest_write(cache_dir, &m), "manifest write");
        const char *names[2] = {"shard-00000.bin", "manifest.json"};
        for (int k = 0; k < 2; k++) {
            char in[800], out[800];
            snprintf(in, sizeof in, "%s/%s", cache_dir, names[k]);
            snprintf(out, sizeof out, "%s/seed-%s", seeds, names[k]);
            FILE *f = fopen(in, "rb"), *g = fopen(out, "wb");
            if (!f || !g) abort();
            fputc(k, g);
            for (int c; (c = fgetc(f)) != EOF;) fputc(c, g);
            fclose(f), fclose(g);
        }
    }
    ds_train_manifest_free(&m);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    make_cache();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] % 2 == 0) {
        ds_shard *s = NULL;
        ds_error *e = ds_shard_open(ds_fuzz_file("shard", data + 1, size - 1), NULL, &s);
        if (!e) {
            const ds_shard_header *h = ds_shard_get_header(s);
            unsigned sum = 0;
            for (uint32_t i = 0; i < h->n_seqs; i++) {
                ds_train_seq q;
                ds_shard_seq(s, i, &q);
                sum += touch(&q, h->n_taps, h->hidden);
            }
            (void)sum;
        }
        ds_fuzz_consume(e);
        ds_shard_close(s);
        return 0;
    }
    char path[700];
    snprintf(path, sizeof path, "%s/manifest.json", cache_dir);
    ds_fuzz_write(path, data + 1, size - 1);
    ds_train_cache *c = NULL;
    ds_error *e = ds_train_cache_open(cache_dir, &c);
    if (!e) {
        const ds_train_manifest *m = ds_train_cache_manifest(c);
        unsigned sum = 0;
        for (int64_t i = 0; i < ds_train_cache_n_seqs(c); i++) {
            ds_train_seq q;
            ds_fuzz_consume(ds_train_cache_seq(c, i, &q));
            sum += touch(&q, (uint32_t)m->n_taps, (uint32_t)m->hidden);
        }
        (void)sum;
        ds_error *past = ds_train_cache_seq(c, ds_train_cache_n_seqs(c), &(ds_train_seq){0});
        if (!past) abort(); /* one past the last sequence is an error */
        ds_fuzz_consume(past);
    }
    ds_fuzz_consume(e);
    ds_train_cache_close(c);
    return 0;
}
