/* Shard files of a training cache: the streaming writer and the mmap reader
 * with its checks (train_shard.h has the layout). The header and the index
 * are the host's structs written as they are: the format is little-endian,
 * which every host the engine builds for is. */
#include "io/train_shard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/dtype.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "shards are little-endian, written as the host's structs");

static uint64_t align_up(uint64_t x) { return (x + DS_SHARD_ALIGN - 1) & ~(uint64_t)(DS_SHARD_ALIGN - 1); }

/* ---- writing ---- */

struct ds_shard_writer {
    char *path, *tmp;
    int fd;
    ds_shard_header h;
    uint64_t end;          /* bytes of data written so far (the next sequence's blocks start here) */
    int32_t *ids;
    uint8_t *mask;
    ds_shard_entry *index;
    size_t cap_tok, cap_seq;
    uint16_t *row_buf;     /* bf16 staging for one chunk */
    size_t row_cap;
    int64_t rows_left;     /* rows of the current sequence still to write */
};

static ds_error *write_at(ds_shard_writer *w, const void *p, size_t n, uint64_t off) {
    const char *b = p;
    while (n > 0) {
        ssize_t k = pwrite(w->fd, b, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return ds_errorf("%s: write failed: %s", w->tmp, k < 0 ? strerror(errno) : "no progress");
        b += k, n -= (size_t)k, off += (uint64_t)k;
    }
    return NULL;
}

ds_error *ds_shard_writer_open(const char *path, uint32_t n_taps, uint32_t hidden, uint64_t cache_id,
                               uint64_t first_seq, ds_shard_writer **out) {
    *out = NULL;
    if (hidden == 0) return ds_errorf("%s: hidden size 0", path);
    ds_shard_writer *w = calloc(1, sizeof *w);
    if (!w) return ds_errorf("out of memory");
    w->fd = -1;
    size_t n = strlen(path);
    w->path = strdup(path);
    w->tmp = malloc(n + 5);
    if (!w->path || !w->tmp) {
        ds_shard_writer_free(w);
        return ds_errorf("out of memory");
    }
    memcpy(w->tmp, path, n);
    memcpy(w->tmp + n, ".tmp", 5);
    /* O_TRUNC: a temporary file a crash left behind is rewritten from the start */
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        ds_error *e = ds_errorf("%s: cannot create: %s", w->tmp, strerror(errno));
        free(w->tmp), w->tmp = NULL; /* nothing to remove */
        ds_shard_writer_free(w);
        return e;
    }
    memcpy(w->h.magic, DS_SHARD_MAGIC, 8);
    w->h.version = DS_SHARD_VERSION;
    w->h.header_bytes = DS_SHARD_HEADER_BYTES;
    w->h.n_taps = n_taps;
    w->h.hidden = hidden;
    w->h.dtype = DS_SHARD_DTYPE_BF16;
    w->h.first_seq = first_seq;
    w->h.cache_id = cache_id;
    w->end = DS_SHARD_HEADER_BYTES;
    *out = w;
    return NULL;
}

static ds_error *grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return NULL;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return ds_errorf("out of memory");
    *p = q;
    *cap = c;
    return NULL;
}

ds_error *ds_shard_writer_begin(ds_shard_writer *w, const int32_t *ids, int len, int n_prompt) {
    if (w->rows_left) return ds_errorf("%s: sequence %u still misses %lld rows", w->tmp, w->h.n_seqs - 1,
                                       (long long)w->rows_left);
    if (len < 1 || n_prompt < 0 || n_prompt > len) return ds_errorf("%s: sequence of %d tokens, %d of them prompt",
                                                                    w->tmp, len, n_prompt);
    const size_t tok = (size_t)w->h.n_tokens, seq = w->h.n_seqs;
    size_t cap_tok = w->cap_tok;
    DS_TRY(grow((void **)&w->ids, &cap_tok, tok + (size_t)len, sizeof *w->ids));
    size_t cap_mask = w->cap_tok;
    DS_TRY(grow((void **)&w->mask, &cap_mask, tok + (size_t)len, sizeof *w->mask));
    w->cap_tok = cap_tok < cap_mask ? cap_tok : cap_mask;
    DS_TRY(grow((void **)&w->index, &w->cap_seq, seq + 1, sizeof *w->index));
    memcpy(w->ids + tok, ids, (size_t)len * sizeof *ids);
    for (int i = 0; i < len; i++) w->mask[tok + (size_t)i] = i >= n_prompt;
    const uint64_t taps_bytes = (uint64_t)len * w->h.n_taps * w->h.hidden * 2;
    ds_shard_entry *e = &w->index[seq];
    e->taps_off = align_up(w->end);
    e->final_off = align_up(e->taps_off + taps_bytes);
    e->tok_start = tok;
    e->len = (uint32_t)len;
    e->n_prompt = (uint32_t)n_prompt;
    w->end = e->final_off + (uint64_t)len * w->h.hidden * 2;
    w->h.n_seqs++;
    w->h.n_tokens += (uint64_t)len;
    w->rows_left = len;
    return NULL;
}

static ds_error *put_rows(ds_shard_writer *w, const float *x, size_t n, uint64_t off) {
    DS_TRY(grow((void **)&w->row_buf, &w->row_cap, n, sizeof *w->row_buf));
    for (size_t i = 0; i < n; i++) w->row_buf[i] = ds_f32_to_bf16(x[i]);
    return write_at(w, w->row_buf, n * sizeof *w->row_buf, off);
}

ds_error *ds_shard_writer_rows(ds_shard_writer *w, int row0, int n, const float *taps, const float *final_hidden) {
    if (!w->h.n_seqs) return ds_errorf("%s: rows before any sequence", w->tmp);
    const ds_shard_entry *e = &w->index[w->h.n_seqs - 1];
    if (row0 < 0 || n < 1 || (uint64_t)row0 + (uint64_t)n > e->len || n > w->rows_left)
        return ds_errorf("%s: rows %d..%d of a sequence of %u", w->tmp, row0, row0 + n - 1, e->len);
    const uint64_t tw = (uint64_t)w->h.n_taps * w->h.hidden, hw = w->h.hidden;
    if (tw) DS_TRY(put_rows(w, taps, (size_t)n * tw, e->taps_off + (uint64_t)row0 * tw * 2));
    DS_TRY(put_rows(w, final_hidden, (size_t)n * hw, e->final_off + (uint64_t)row0 * hw * 2));
    w->rows_left -= n;
    return NULL;
}

int64_t ds_shard_writer_tokens(const ds_shard_writer *w) { return (int64_t)w->h.n_tokens; }
int64_t ds_shard_writer_seqs(const ds_shard_writer *w) { return w->h.n_seqs; }

ds_error *ds_shard_writer_finish(ds_shard_writer *w, int64_t *bytes) {
    if (w->rows_left) return ds_errorf("%s: the last sequence misses %lld rows", w->tmp, (long long)w->rows_left);
    if (!w->h.n_seqs) return ds_errorf("%s: a shard of no sequence", w->tmp);
    const uint64_t nt = w->h.n_tokens;
    w->h.ids_off = align_up(w->end);
    w->h.mask_off = align_up(w->h.ids_off + nt * 4);
    w->h.index_off = align_up(w->h.mask_off + nt);
    w->h.file_bytes = w->h.index_off + (uint64_t)w->h.n_seqs * sizeof(ds_shard_entry);
    /* The alignment gaps are written as zeros (not left as holes), so equal shards are equal bytes. */
    static const uint8_t zeros[DS_SHARD_ALIGN];
    for (uint32_t i = 0; i < w->h.n_seqs; i++) {
        const ds_shard_entry *e = &w->index[i];
        const uint64_t taps_end = e->taps_off + (uint64_t)e->len * w->h.n_taps * w->h.hidden * 2;
        const uint64_t prev_end = i ? w->index[i - 1].final_off + (uint64_t)w->index[i - 1].len * w->h.hidden * 2
                                    : DS_SHARD_HEADER_BYTES;
        DS_TRY(write_at(w, zeros, (size_t)(e->taps_off - prev_end), prev_end));
        DS_TRY(write_at(w, zeros, (size_t)(e->final_off - taps_end), taps_end));
    }
    DS_TRY(write_at(w, zeros, (size_t)(w->h.ids_off - w->end), w->end));
    DS_TRY(write_at(w, w->ids, (size_t)nt * 4, w->h.ids_off));
    DS_TRY(write_at(w, zeros, (size_t)(w->h.mask_off - (w->h.ids_off + nt * 4)), w->h.ids_off + nt * 4));
    DS_TRY(write_at(w, w->mask, (size_t)nt, w->h.mask_off));
    DS_TRY(write_at(w, zeros, (size_t)(w->h.index_off - (w->h.mask_off + nt)), w->h.mask_off + nt));
    DS_TRY(write_at(w, w->index, (size_t)w->h.n_seqs * sizeof(ds_shard_entry), w->h.index_off));
    DS_TRY(write_at(w, &w->h, sizeof w->h, 0));
    if (fsync(w->fd)) return ds_errorf("%s: fsync: %s", w->tmp, strerror(errno));
    int rc = close(w->fd);
    w->fd = -1;
    if (rc) return ds_errorf("%s: close: %s", w->tmp, strerror(errno));
    if (rename(w->tmp, w->path)) return ds_errorf("%s: cannot rename to %s: %s", w->tmp, w->path, strerror(errno));
    free(w->tmp);
    w->tmp = NULL; /* renamed: nothing to remove */
    if (bytes) *bytes = (int64_t)w->h.file_bytes;
    return NULL;
}

void ds_shard_writer_free(ds_shard_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->tmp) unlink(w->tmp);
    free(w->path), free(w->tmp), free(w->ids), free(w->mask), free(w->index), free(w->row_buf);
    free(w);
}

/* ---- reading ---- */

struct ds_shard {
    char *path;
    const uint8_t *map;
    size_t size;
    ds_shard_header h;
    const ds_shard_entry *index;
};

const ds_shard_header *ds_shard_get_header(const ds_shard *s) { return &s->h; }

void ds_shard_close(ds_shard *s) {
    if (!s) return;
    if (s->map) munmap((void *)s->map, s->size);
    free(s->path);
    free(s);
}

/* [off, off + n) inside [lo, hi), without overflow. */
static bool inside(uint64_t off, uint64_t n, uint64_t lo, uint64_t hi) { return off >= lo && off <= hi && n <= hi - off; }

static ds_error *check_header(const ds_shard *s, const ds_shard_expect *x) {
    const ds_shard_header *h = &s->h;
    if (memcmp(h->magic, DS_SHARD_MAGIC, 8)) return ds_errorf("bad magic (not a dspark training-cache shard)");
    if (h->version != DS_SHARD_VERSION) return ds_errorf("format version %u (this build reads %d)", h->version, DS_SHARD_VERSION);
    if (h->header_bytes != DS_SHARD_HEADER_BYTES) return ds_errorf("header_bytes %u (expected %d)", h->header_bytes, DS_SHARD_HEADER_BYTES);
    if (h->dtype != DS_SHARD_DTYPE_BF16) return ds_errorf("dtype %u (expected %d: bf16)", h->dtype, DS_SHARD_DTYPE_BF16);
    if (h->file_bytes != s->size)
        return ds_errorf("truncated or extended: the header says %llu bytes, the file has %zu",
                         (unsigned long long)h->file_bytes, s->size);
    if (x) {
        if (h->cache_id != x->cache_id)
            return ds_errorf("cache_id %016llx is not the manifest's %016llx (a shard of another cache)",
                             (unsigned long long)h->cache_id, (unsigned long long)x->cache_id);
        if (h->n_taps != x->n_taps || h->hidden != x->hidden)
            return ds_errorf("n_taps %u, hidden %u; the manifest says %u, %u", h->n_taps, h->hidden, x->n_taps, x->hidden);
        if (h->first_seq != x->first_seq)
            return ds_errorf("first_seq %llu; the manifest says %llu", (unsigned long long)h->first_seq,
                             (unsigned long long)x->first_seq);
        if (x->n_seqs >= 0 && h->n_seqs != (uint64_t)x->n_seqs)
            return ds_errorf("n_seqs %u; the manifest says %lld", h->n_seqs, (long long)x->n_seqs);
        if (x->n_tokens >= 0 && h->n_tokens != (uint64_t)x->n_tokens)
            return ds_errorf("n_tokens %llu; the manifest says %lld", (unsigned long long)h->n_tokens,
                             (long long)x->n_tokens);
    }
    if (h->hidden == 0 || h->hidden > (1u << 20) || h->n_taps > 64 || h->n_seqs == 0)
        return ds_errorf("n_seqs %u, n_taps %u, hidden %u out of range", h->n_seqs, h->n_taps, h->hidden);
    const uint64_t nt = h->n_tokens, end = h->file_bytes;
    if (nt > end || !inside(h->ids_off, nt * 4, DS_SHARD_HEADER_BYTES, end) || h->ids_off % 4 ||
        !inside(h->mask_off, nt, DS_SHARD_HEADER_BYTES, end) || h->index_off % 8 ||
        !inside(h->index_off, (uint64_t)h->n_seqs * sizeof(ds_shard_entry), DS_SHARD_HEADER_BYTES, end))
        return ds_errorf("ids_off / mask_off / index_off outside the file (truncated or corrupt header)");
    return NULL;
}

static ds_error *check_index(const ds_shard *s, int32_t vocab) {
    const ds_shard_header *h = &s->h;
    const uint64_t tw = (uint64_t)h->n_taps * h->hidden * 2, hw = (uint64_t)h->hidden * 2;
    const uint64_t data_end = h->ids_off < h->mask_off ? h->ids_off : h->mask_off;
    uint64_t tok = 0;
    for (uint32_t i = 0; i < h->n_seqs; i++) {
        const ds_shard_entry *e = &s->index[i];
        if (e->len == 0 || e->n_prompt > e->len || e->tok_start != tok || e->len > h->n_tokens - tok)
            return ds_errorf("index[%u]: len %u, n_prompt %u, tok_start %llu do not tile the %llu tokens", i, e->len,
                             e->n_prompt, (unsigned long long)e->tok_start, (unsigned long long)h->n_tokens);
        if (e->taps_off % 2 || e->final_off % 2 || !inside(e->taps_off, e->len * tw, DS_SHARD_HEADER_BYTES, data_end) ||
            !inside(e->final_off, e->len * hw, DS_SHARD_HEADER_BYTES, data_end))
            return ds_errorf("index[%u]: taps_off %llu / final_off %llu outside the data", i,
                             (unsigned long long)e->taps_off, (unsigned long long)e->final_off);
        tok += e->len;
    }
    if (tok != h->n_tokens) return ds_errorf("index: sequences hold %llu tokens, the header says %llu",
                                             (unsigned long long)tok, (unsigned long long)h->n_tokens);
    const int32_t *ids = (const int32_t *)(s->map + h->ids_off);
    const uint8_t *mask = s->map + h->mask_off;
    for (uint64_t t = 0; t < tok; t++) {
        if (ids[t] < 0 || (vocab > 0 && ids[t] >= vocab))
            return ds_errorf("ids[%llu] = %d is outside the vocabulary (0..%d)", (unsigned long long)t, ids[t], vocab - 1);
        if (mask[t] > 1) return ds_errorf("mask[%llu] = %u (0 or 1)", (unsigned long long)t, mask[t]);
    }
    return NULL;
}

ds_error *ds_shard_open(const char *path, const ds_shard_expect *expect, ds_shard **out) {
    *out = NULL;
    ds_shard *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        return ds_errorf("out of memory");
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ds_error *e = NULL;
    struct stat st;
    if (fd < 0) e = ds_errorf("%s: %s", path, strerror(errno));
    else if (fstat(fd, &st)) e = ds_errorf("%s: %s", path, strerror(errno));
    else if (st.st_size < DS_SHARD_HEADER_BYTES)
        e = ds_errorf("%s: truncated: %lld bytes, shorter than the %d-byte header", path, (long long)st.st_size,
                      DS_SHARD_HEADER_BYTES);
    if (!e) {
        s->size = (size_t)st.st_size;
        void *m = mmap(NULL, s->size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) e = ds_errorf("%s: mmap: %s", path, strerror(errno));
        else s->map = m;
    }
    if (fd >= 0) close(fd);
    if (!e) {
        memcpy(&s->h, s->map, sizeof s->h);
        e = check_header(s, expect);
        if (!e) s->index = (const ds_shard_entry *)(s->map + s->h.index_off); /* inside the file: checked */
        if (!e) e = check_index(s, expect ? expect->vocab : 0);
        if (e) e = ds_error_wrap(e, "%s", path);
    }
    if (e) {
        ds_shard_close(s);
        return e;
    }
    *out = s;
    return NULL;
}

void ds_shard_seq(const ds_shard *s, int64_t i, ds_train_seq *out) {
    const ds_shard_entry *e = &s->index[i];
    out->len = (int)e->len;
    out->n_prompt = (int)e->n_prompt;
    out->ids = (const int32_t *)(s->map + s->h.ids_off) + e->tok_start;
    out->mask = s->map + s->h.mask_off + e->tok_start;
    out->taps = (const uint16_t *)(s->map + e->taps_off);
    out->final_hidden = (const uint16_t *)(s->map + e->final_off);
}
