/* dspark datagen and the training cache (src/train/datagen.h,
 * src/io/train_cache.h): the cache holds what a direct target forward over
 * the same ids gives (bf16-rounded), continuations equal ds_generate's and
 * `dspark generate`'s for the same seed, a resumed run writes the bytes an
 * uninterrupted one writes, and a damaged cache is an error naming what is
 * wrong, never a crash. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/dtype.h"
#include "io/train_cache.h"
#include "speculate/generate.h"
#include "testlib.h"
#include "train/datagen.h"

#define TINY DS_TESTDATA "/fixtures/qwen3-tiny/target"
#define N_PROMPTS 5
static const int TAPS[] = {-1, 1, 2};
static char tmp_root[] = "/tmp/ds_datagen_XXXXXX";

static bool quick(void) { return getenv("DS_TEST_QUICK") != NULL; }

typedef struct {
    ds_backend *be;
    ds_target *t;
    int32_t ids[N_PROMPTS][16];
    ds_datagen_prompt prompts[N_PROMPTS];
} fixture;

static ds_error *fixture_open(fixture *f, int max_rows) {
    memset(f, 0, sizeof *f);
    DS_TRY(test_backend_new(&f->be));
    const ds_target_opts to = {.max_rows = max_rows};
    DS_TRY(ds_target_open(f->be, TINY, &to, &f->t));
    uint32_t x = 12345;
    for (int i = 0; i < N_PROMPTS; i++) {
        const int n = 5 + 2 * i;
        for (int k = 0; k < n; k++) {
            x = x * 1664525u + 1013904223u;
            f->ids[i][k] = (int32_t)(x >> 8) % 512;
        }
        /* the last one is a raw sequence: stored as given, mask 1 everywhere */
        f->prompts[i] = (ds_datagen_prompt){.ids = f->ids[i], .n = n, .line = i + 1, .raw = i == N_PROMPTS - 1};
    }
    return NULL;
}

static void fixture_close(fixture *f) {
    ds_target_free(f->t);
    if (f->be) f->be->ops->destroy(f->be);
}

static ds_datagen_opts tiny_opts(const char *out) {
    return (ds_datagen_opts){.out_dir = out, .target_dir = TINY, .prompt_file = "test",
                             .max_new = quick() ? 10 : 24, .sampling = {.temperature = 0.7f, .top_p = 0.95f},
                             .seed = 7, .taps = TAPS, .n_taps = 3, .shard_tokens = 30};
}

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tmp_root, name); }

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char p[1024];
    for (struct dirent *de; (de = readdir(d));)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return b;
}

static void write_file(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(b, 1, n, f) == n, "cannot write %s", path);
    if (f) fclose(f);
}

/* Every file of dir a is in b with the same bytes, and b has no other file. */
static void check_same_dirs(const char *a, const char *b, const char *what) {
    int files[2] = {0, 0};
    for (int side = 0; side < 2; side++) {
        DIR *d = opendir(side ? b : a);
        CHECK(d, "%s: cannot open %s", what, side ? b : a);
        if (!d) return;
        for (struct dirent *de; (de = readdir(d));) {
            if (de->d_name[0] == '.') continue;
            files[side]++;
            if (side) continue;
            char pa[1024], pb[1024];
            snprintf(pa, sizeof pa, "%s/%s", a, de->d_name);
            snprintf(pb, sizeof pb, "%s/%s", b, de->d_name);
            size_t na = 0, nb = 0;
            unsigned char *ba = read_file(pa, &na), *bb = read_file(pb, &nb);
            CHECK(ba && bb && na == nb && !memcmp(ba, bb, na), "%s: %s differs (%zu vs %zu bytes)", what, de->d_name,
                  na, nb);
            free(ba), free(bb);
        }
        closedir(d);
    }
    CHECK(files[0] == files[1] && files[0] > 1, "%s: %d files vs %d", what, files[0], files[1]);
}

static void copy_dir(const char *from, const char *to) {
    remove_dir(to);
    mkdir(to, 0755);
    DIR *d = opendir(from);
    if (!d) return;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char pa[1024], pb[1024];
        snprintf(pa, sizeof pa, "%s/%s", from, de->d_name);
        snprintf(pb, sizeof pb, "%s/%s", to, de->d_name);
        size_t n;
        unsigned char *b = read_file(pa, &n);
        if (b) write_file(pb, b, n);
        free(b);
    }
    closedir(d);
}

/* The cache holds, for every sequence: the prompt then ds_generate's continuation (seed + i), the loss mask,
 * and bit for bit the bf16 of the taps and final hidden state one forward over all its ids gives (datagen's
 * target forwards 8 rows a call, the reference one call: row invariance makes them equal). */
static void test_cache_equals_forward(void) {
    fixture f, ref;
    CHECK_OK(fixture_open(&f, 8));
    CHECK_OK(fixture_open(&ref, 128));
    char out[512];
    path_in(out, sizeof out, "a");
    ds_datagen_opts o = tiny_opts(out);
    ds_datagen_stats st;
    CHECK_OK(ds_datagen_run(f.t, f.prompts, N_PROMPTS, &o, &st));
    CHECK(st.seqs_done == N_PROMPTS && st.seqs_resumed == 0 && st.gen_tokens == (int64_t)(N_PROMPTS - 1) * o.max_new,
          "stats: %lld done, %lld generated", (long long)st.seqs_done, (long long)st.gen_tokens);
    ds_train_cache *c;
    CHECK_OK(ds_train_cache_open(out, &c));
    const ds_train_manifest *m = ds_train_cache_manifest(c);
    CHECK(m->complete && m->n_shards > 1 && ds_train_cache_n_seqs(c) == N_PROMPTS && m->hidden == 64 &&
              m->n_taps == 3 && m->tap_layers[0] == -1,
          "manifest: complete %d, %d shards, %lld seqs", m->complete, m->n_shards, (long long)ds_train_cache_n_seqs(c));
    CHECK_OK(ds_target_set_taps(ref.t, TAPS, 3));
    const int H = 64, TW = 3 * 64;
    float *taps = malloc(128 * (size_t)TW * sizeof *taps), *fh = malloc(128 * (size_t)H * sizeof *fh);
    int64_t tokens = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        ds_train_seq s;
        CHECK_OK(ds_train_cache_seq(c, i, &s));
        const ds_datagen_prompt *p = &f.prompts[i];
        const int n_prompt = p->raw ? 0 : p->n, n_gen = p->raw ? 0 : o.max_new;
        CHECK(s.n_prompt == n_prompt && s.len == p->n + n_gen, "seq %d: %d tokens, %d prompt", i, s.len, s.n_prompt);
        CHECK(!memcmp(s.ids, p->ids, (size_t)p->n * sizeof *s.ids), "seq %d: the prompt", i);
        for (int k = 0; k < s.len; k++) CHECK(s.mask[k] == (k >= n_prompt), "seq %d: mask[%d] = %d", i, k, s.mask[k]);
        if (!p->raw) {
            const ds_gen_params gp = {.max_new = o.max_new, .sampling = o.sampling, .seed = o.seed + (uint64_t)i};
            ds_gen_result g;
            CHECK_OK(ds_generate(ref.t, NULL, p->ids, p->n, &gp, NULL, NULL, &g));
            CHECK(g.n_tokens == s.len - s.n_prompt && !memcmp(g.tokens, s.ids + s.n_prompt, (size_t)g.n_tokens * 4),
                  "seq %d: the continuation is not ds_generate's for seed %llu", i, (unsigned long long)gp.seed);
            ds_gen_result_free(&g);
        }
        CHECK_OK(ds_target_forward(ref.t, s.ids, s.len, 0, 0));
        ref.be->ops->download(ref.be, ds_rows(ref.t->taps, 0, s.len), taps);
        ref.be->ops->download(ref.be, ds_rows(ref.t->final_hidden, 0, s.len), fh);
        int bad_t = 0, bad_f = 0;
        for (size_t k = 0; k < (size_t)s.len * TW; k++) bad_t += s.taps[k] != ds_f32_to_bf16(taps[k]);
        for (size_t k = 0; k < (size_t)s.len * H; k++) bad_f += s.final_hidden[k] != ds_f32_to_bf16(fh[k]);
        CHECK(bad_t == 0 && bad_f == 0, "seq %d: %d tap values and %d final-hidden values differ", i, bad_t, bad_f);
        tokens += s.len;
    }
    CHECK(ds_train_cache_n_tokens(c) == tokens, "n_tokens %lld vs %lld", (long long)ds_train_cache_n_tokens(c),
          (long long)tokens);
    CHECK_ERR(ds_train_cache_seq(c, N_PROMPTS, &(ds_train_seq){0}), "outside the cache");
    CHECK_OK(ds_train_cache_check(c, TINY, TAPS, 3));
    CHECK_ERR(ds_train_cache_check(c, TINY, TAPS + 1, 2), "the drafter taps [1,2]");
    CHECK_ERR(ds_train_cache_check(c, DS_MODELS "/pico-qwen3", TAPS, 3), "another target");
    free(taps), free(fh);
    ds_train_cache_close(c);
    fixture_close(&f);
    fixture_close(&ref);
}

static ds_error *run_to(fixture *f, const char *out, int64_t stop_after, ds_datagen_stats *st) {
    ds_datagen_opts o = tiny_opts(out);
    o.stop_after = stop_after;
    return ds_datagen_run(f->t, f->prompts, N_PROMPTS, &o, st);
}

/* Interrupted, deleted or damaged shards: a rerun of the same command gives the uninterrupted run's bytes. */
static void test_resume_identical(void) {
    fixture f;
    CHECK_OK(fixture_open(&f, 0));
    char a[512], b[512], p[1024];
    path_in(a, sizeof a, "full");
    path_in(b, sizeof b, "resumed");
    ds_datagen_stats st;
    CHECK_OK(run_to(&f, a, 0, &st));
    /* interrupted after 3 sequences (its open shard lost, as in a crash), then resumed */
    CHECK_OK(run_to(&f, b, 3, &st));
    ds_train_manifest m;
    CHECK_OK(ds_train_manifest_read(b, &m));
    CHECK(!m.complete && m.n_shards >= 1, "interrupted: complete %d, %d shards", m.complete, m.n_shards);
    const int interrupted_shards = m.n_shards;
    ds_train_manifest_free(&m);
    CHECK_OK(run_to(&f, b, 0, &st));
    CHECK(st.seqs_resumed > 0 && st.seqs_resumed < N_PROMPTS, "resumed %lld", (long long)st.seqs_resumed);
    check_same_dirs(a, b, "interrupted + resumed");
    (void)interrupted_shards;
    /* nothing left to do: a no-op */
    CHECK_OK(run_to(&f, b, 0, &st));
    CHECK(st.seqs_resumed == N_PROMPTS && st.tokens == 0, "complete cache rerun made %lld tokens", (long long)st.tokens);
    /* the last shard deleted */
    CHECK_OK(ds_train_manifest_read(b, &m));
    snprintf(p, sizeof p, "%s/%s", b, m.shards[m.n_shards - 1].file);
    ds_train_manifest_free(&m);
    CHECK(unlink(p) == 0, "unlink %s", p);
    CHECK_OK(run_to(&f, b, 0, &st));
    CHECK(st.shards_dropped == 1, "dropped %d shards", st.shards_dropped);
    check_same_dirs(a, b, "last shard deleted + resumed");
    /* the first shard damaged (one byte of its data): every shard from it on is made again */
    snprintf(p, sizeof p, "%s/shard-00000.bin", b);
    size_t n;
    unsigned char *bytes = read_file(p, &n);
    CHECK(bytes && n > 200, "read %s", p);
    if (bytes) {
        bytes[0] ^= 1; /* the magic */
        write_file(p, bytes, n);
        free(bytes);
    }
    CHECK_OK(run_to(&f, b, 0, &st));
    CHECK(st.seqs_resumed == 0 && st.shards_dropped > 1, "damaged first shard: resumed %lld", (long long)st.seqs_resumed);
    check_same_dirs(a, b, "damaged shard + resumed");
    /* a crash's leftover temporary file is overwritten, never read */
    snprintf(p, sizeof p, "%s/shard-00001.bin.tmp", b);
    write_file(p, "junk", 4);
    CHECK_OK(ds_train_manifest_read(b, &m));
    snprintf(p, sizeof p, "%s/%s", b, m.shards[1].file);
    ds_train_manifest_free(&m);
    unlink(p);
    CHECK_OK(run_to(&f, b, 0, &st));
    check_same_dirs(a, b, "stale .tmp + resumed");

    /* the batched engine (3 at a time, windows of 12) makes the same bytes, and resumes a solo run's cache */
    ds_gen_batch g;
    CHECK_OK(ds_gen_batch_open(f.be, TINY, 3, 64, &g));
    char c[512];
    path_in(c, sizeof c, "batched");
    ds_datagen_opts ob = tiny_opts(c);
    ob.batch = &g;
    CHECK_OK(ds_datagen_run(f.t, f.prompts, N_PROMPTS, &ob, &st));
    check_same_dirs(a, c, "batched generation");
    CHECK_OK(ds_train_manifest_read(b, &m));
    snprintf(p, sizeof p, "%s/%s", b, m.shards[m.n_shards - 1].file);
    ds_train_manifest_free(&m);
    unlink(p);
    ob.out_dir = b;
    CHECK_OK(ds_datagen_run(f.t, f.prompts, N_PROMPTS, &ob, &st));
    check_same_dirs(a, b, "solo run resumed batched");
    ds_gen_batch_close(&g);

    /* another run's options on the same --out: refused, naming the field */
    ds_datagen_opts o = tiny_opts(b);
    o.sampling.temperature = 0.5f;
    CHECK_ERR(ds_datagen_run(f.t, f.prompts, N_PROMPTS, &o, &st), "temperature");
    o = tiny_opts(b);
    o.n_taps = 2;
    CHECK_ERR(ds_datagen_run(f.t, f.prompts, N_PROMPTS, &o, &st), "tap_layers");
    o = tiny_opts(b);
    CHECK_ERR(ds_datagen_run(f.t, f.prompts, N_PROMPTS - 1, &o, &st), "prompts");
    o = tiny_opts(b);
    o.seed = 8;
    CHECK_ERR(ds_datagen_run(f.t, f.prompts, N_PROMPTS, &o, &st), "seed");
    f.prompts[N_PROMPTS - 1].raw = false;
    o = tiny_opts(b);
    CHECK_ERR(ds_datagen_run(f.t, f.prompts, N_PROMPTS, &o, &st), "raw sequences");
    f.prompts[N_PROMPTS - 1].raw = true;
    /* a cache another run is writing (its lock held) */
    snprintf(p, sizeof p, "%s/.lock", b);
    int fd = open(p, O_RDWR | O_CREAT, 0644);
    CHECK(fd >= 0 && flock(fd, LOCK_EX) == 0, "lock %s", p);
    o = tiny_opts(b);
    CHECK_ERR(ds_datagen_run(f.t, f.prompts, N_PROMPTS, &o, &st), "another dspark datagen is writing");
    if (fd >= 0) close(fd);
    CHECK_OK(ds_datagen_run(f.t, f.prompts, N_PROMPTS, &o, &st));
    /* a directory that is not a cache */
    snprintf(p, sizeof p, "%s/other", tmp_root);
    mkdir(p, 0755);
    char junk[1100];
    snprintf(junk, sizeof junk, "%s/notes.txt", p);
    write_file(junk, "x", 1);
    o = tiny_opts(p);
    CHECK_ERR(ds_datagen_run(f.t, f.prompts, N_PROMPTS, &o, &st), "not empty");
    fixture_close(&f);
}

static void check_open_fails(const char *dir, const char *needle, const char *what) {
    ds_train_cache *c = NULL;
    ds_error *e = ds_train_cache_open(dir, &c);
    CHECK(e && strstr(ds_error_message(e), needle), "%s: expected an error with \"%s\", got: %s", what, needle,
          e ? ds_error_message(e) : "success");
    ds_error_free(e);
    ds_train_cache_close(c);
}

/* Edits the manifest's JSON in dir: fn changes the parsed tree. */
static void edit_manifest(const char *dir, void (*fn)(cJSON *)) {
    char p[1024];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    cJSON *j = read_json_file(p);
    if (!j) return;
    fn(j);
    write_json_file(p, j);
    cJSON_Delete(j);
}
static void more_tokens(cJSON *j) {
    cJSON *s = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "shards"), 0);
    cJSON_SetNumberValue(cJSON_GetObjectItem(s, "n_tokens"), cJSON_GetObjectItem(s, "n_tokens")->valuedouble + 1);
}
static void no_hidden(cJSON *j) { cJSON_DeleteItemFromObject(j, "hidden_size"); }
static void other_seed(cJSON *j) { cJSON_SetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "sampling"), "seed"), 99); }
static void other_taps(cJSON *j) {
    cJSON_ReplaceItemInObject(j, "tap_layers", cJSON_CreateIntArray((const int[]){1, 2, 3}, 3));
}
static void bad_file_name(cJSON *j) {
    cJSON *s = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "shards"), 0);
    cJSON_ReplaceItemInObject(s, "file", cJSON_CreateString("../../etc/passwd"));
}

/* Every damage named; a fuzzed shard header or index is an error or readable, never a crash. */
static void test_corrupt_errors(void) {
    fixture f;
    CHECK_OK(fixture_open(&f, 0));
    char good[512], bad[512], other[512], p[1100], q[1100];
    path_in(good, sizeof good, "good");
    path_in(bad, sizeof bad, "bad");
    path_in(other, sizeof other, "other-seed");
    ds_datagen_stats st;
    CHECK_OK(run_to(&f, good, 0, &st));
    ds_datagen_opts o = tiny_opts(other);
    o.seed = 8;
    CHECK_OK(ds_datagen_run(f.t, f.prompts, N_PROMPTS, &o, &st));
    fixture_close(&f);
    snprintf(p, sizeof p, "%s/shard-00000.bin", bad);
    size_t n;
    copy_dir(good, bad);
    unsigned char *orig = read_file(p, &n);
    CHECK(orig && n > DS_SHARD_HEADER_BYTES, "read %s", p);
    if (!orig) return;

    write_file(p, orig, n - 1);
    check_open_fails(bad, "truncated", "a byte short");
    write_file(p, orig, 100);
    check_open_fails(bad, "truncated", "shorter than the header");
    unsigned char *b = malloc(n);
    memcpy(b, orig, n);
    b[3] ^= 0x20;
    write_file(p, b, n);
    check_open_fails(bad, "bad magic", "magic");
    memcpy(b, orig, n);
    b[8] = 9; /* version */
    write_file(p, b, n);
    check_open_fails(bad, "version", "version");
    unlink(p);
    check_open_fails(bad, "shard-00000.bin", "missing shard");
    snprintf(q, sizeof q, "%s/shard-00000.bin", other);
    copy_dir(good, bad);
    size_t no;
    unsigned char *ob = read_file(q, &no);
    if (ob) write_file(p, ob, no);
    free(ob);
    check_open_fails(bad, "another cache", "a shard of another cache");
    copy_dir(good, bad);
    edit_manifest(bad, more_tokens);
    check_open_fails(bad, "the manifest says", "manifest n_tokens");
    copy_dir(good, bad);
    edit_manifest(bad, no_hidden);
    check_open_fails(bad, "\"hidden_size\" is missing", "manifest field");
    copy_dir(good, bad);
    edit_manifest(bad, other_seed);
    check_open_fails(bad, "cache_id", "manifest identity edited");
    copy_dir(good, bad);
    edit_manifest(bad, other_taps);
    check_open_fails(bad, "cache_id", "manifest taps edited");
    copy_dir(good, bad);
    edit_manifest(bad, bad_file_name);
    check_open_fails(bad, "not a file name", "manifest shard path");
    copy_dir(good, bad);
    snprintf(q, sizeof q, "%s/manifest.json", bad);
    write_file(q, "{\"format\": ", 11);
    check_open_fails(bad, "manifest.json", "manifest not JSON");

    /* Fuzz: bytes of the header and the index set to random values, and every cut of the first 300 bytes.
     * Opening must fail cleanly or give views that stay inside the file (ASan checks the reads). */
    copy_dir(good, bad);
    const ds_shard_header *h = (const ds_shard_header *)orig;
    const size_t index_off = (size_t)h->index_off;
    uint32_t x = 99;
    const int rounds = quick() ? 150 : 600;
    int opened = 0;
    for (int r = 0; r < rounds; r++) {
        memcpy(b, orig, n);
        for (int k = 0; k < 1 + r % 3; k++) {
            x = x * 1664525u + 1013904223u;
            size_t at = (x >> 8) % 2 ? (x >> 9) % DS_SHARD_HEADER_BYTES : index_off + (x >> 9) % (n - index_off);
            x = x * 1664525u + 1013904223u;
            b[at] = (unsigned char)(x >> 24);
        }
        write_file(p, b, n);
        ds_train_cache *c = NULL;
        ds_error *e = ds_train_cache_open(bad, &c);
        if (!e) {
            opened++;
            unsigned sum = 0;
            for (int64_t i = 0; i < ds_train_cache_n_seqs(c); i++) {
                ds_train_seq s;
                ds_error_free(ds_train_cache_seq(c, i, &s));
                const ds_train_manifest *m = ds_train_cache_manifest(c);
                for (int k = 0; k < s.len; k++) sum += (unsigned)s.ids[k] + s.mask[k];
                for (size_t k = 0; k < (size_t)s.len * (size_t)m->n_taps * (size_t)m->hidden; k++) sum += s.taps[k];
                for (size_t k = 0; k < (size_t)s.len * (size_t)m->hidden; k++) sum += s.final_hidden[k];
            }
            (void)sum;
        }
        ds_error_free(e);
        ds_train_cache_close(c);
    }
    for (size_t cut = 0; cut < 300 && cut < n; cut += quick() ? 7 : 1) {
        write_file(p, orig, cut);
        check_open_fails(bad, "truncated", "cut shard");
    }
    fprintf(stderr, "fuzz: %d of %d damaged shards still opened (bytes that do not matter)\n", opened, rounds);
    free(b);
    free(orig);
}

/* The CLI on the pico target: taps default to the pico drafter's, and each continuation is `dspark
 * generate`'s (no drafter) for seed S + i with the same sampling. */
static void test_cli_matches_generate(void) {
    char prompts[512], out[512], one[512], got[512], cmd[4096];
    path_in(prompts, sizeof prompts, "prompts.jsonl");
    path_in(out, sizeof out, "cli");
    path_in(one, sizeof one, "one.jsonl");
    path_in(got, sizeof got, "gen.json");
    size_t n;
    char *dev = read_text_file(DS_MODELS "/prompts-dev.jsonl", &n);
    CHECK(dev != NULL, "prompts-dev.jsonl");
    if (!dev) return;
    char *l1 = strchr(dev, '\n'), *l2 = l1 ? strchr(l1 + 1, '\n') : NULL;
    if (!l2) return;
    write_file(prompts, dev, (size_t)(l2 + 1 - dev));
    const int max_new = 16;
    snprintf(cmd, sizeof cmd,
             "'%s' datagen --prompt-file '%s' --out '%s' -n %d --temp 0.7 --top-p 0.95 --seed 3 --threads 2 2>/dev/null "
             ">/dev/null", DS_CLI, prompts, out, max_new);
    int rc = system(cmd);
    CHECK(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s: exit %d", cmd, rc);
    ds_train_cache *c;
    CHECK_OK(ds_train_cache_open(out, &c));
    const ds_train_manifest *m = ds_train_cache_manifest(c);
    CHECK(m->n_taps == 3 && m->tap_layers[0] == 1 && m->tap_layers[1] == 3 && m->tap_layers[2] == 5,
          "default taps: the pico drafter's 1, 3, 5");
    for (int i = 0; i < 2; i++) {
        write_file(one, i ? l1 + 1 : dev, (size_t)(i ? l2 - l1 : l1 + 1 - dev));
        snprintf(cmd, sizeof cmd,
                 "'%s' generate --no-draft --json --prompt-file '%s' -n %d --temp 0.7 --top-p 0.95 --seed %d "
                 "--threads 2 >'%s' 2>/dev/null", DS_CLI, one, max_new, 3 + i, got);
        rc = system(cmd);
        CHECK(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s: exit %d", cmd, rc);
        char *text = read_text_file(got, NULL);
        cJSON *j = text ? cJSON_ParseWithOpts(text, NULL, false) : NULL; /* the first line: the prompt's object */
        const cJSON *toks = j ? cJSON_GetObjectItem(j, "tokens") : NULL;
        ds_train_seq s;
        CHECK_OK(ds_train_cache_seq(c, i, &s));
        int same = toks && cJSON_GetArraySize(toks) == s.len - s.n_prompt;
        for (int k = 0; same && k < s.len - s.n_prompt; k++)
            same = cJSON_GetArrayItem(toks, k)->valueint == s.ids[s.n_prompt + k];
        CHECK(same, "prompt %d: the cached continuation is not `dspark generate --seed %d`'s", i, 3 + i);
        cJSON_Delete(j);
        free(text);
    }
    ds_train_cache_close(c);
    /* bad arguments are usage errors */
    snprintf(cmd, sizeof cmd, "'%s' datagen --out '%s' >/dev/null 2>&1", DS_CLI, out);
    rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "no --prompt-file: exit %d", WEXITSTATUS(rc));
    snprintf(cmd, sizeof cmd, "'%s' datagen --prompt-file '%s' --out '%s' --tap-layers 1,x >/dev/null 2>&1", DS_CLI,
             prompts, out);
    rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "--tap-layers 1,x: exit %d", WEXITSTATUS(rc));
    free(dev);
}

static void cleanup(void) {
    const char *dirs[] = {"a", "full", "resumed", "batched", "other", "good", "bad", "other-seed", "cli"};
    char p[1024];
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        path_in(p, sizeof p, dirs[i]);
        remove_dir(p);
    }
    remove_dir(tmp_root);
}

static void setup(void) {
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        exit(1);
    }
    atexit(cleanup);
}

static void test_setup(void) { setup(); }

RUN_TESTS("datagen", test_setup, test_cache_equals_forward, test_resume_identical, test_corrupt_errors,
          test_cli_matches_generate)
