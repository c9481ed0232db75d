#include "io/png_write.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint32_t ds_crc32(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xffffffffu;
}

uint32_t ds_adler32(const uint8_t *p, size_t n) {
    uint32_t a = 1, b = 0;
    for (size_t i = 0; i < n; i++) {
        a = (a + p[i]) % 65521u;
        b = (b + a) % 65521u;
    }
    return b << 16 | a;
}

/* A growing byte buffer with deflate's bit order (least significant bit
 * first); ok turns false when memory runs out and stays so. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
    uint32_t acc;
    int bits;
    bool ok;
} sink;

static void put_byte(sink *s, uint8_t b) {
    if (!s->ok) return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4096;
        uint8_t *p = realloc(s->p, cap);
        if (!p) {
            s->ok = false;
            return;
        }
        s->p = p;
        s->cap = cap;
    }
    s->p[s->n++] = b;
}

static void put_be32(sink *s, uint32_t v) {
    for (int i = 3; i >= 0; i--) put_byte(s, (uint8_t)(v >> (8 * i)));
}

/* n low bits of v, least significant first (deflate's extra bits). */
static void put_bits(sink *s, uint32_t v, int n) {
    s->acc |= v << s->bits;
    s->bits += n;
    while (s->bits >= 8) {
        put_byte(s, (uint8_t)s->acc);
        s->acc >>= 8;
        s->bits -= 8;
    }
}

/* A Huffman code of n bits: deflate sends it most significant bit first. */
static void put_code(sink *s, uint32_t code, int n) {
    for (int i = n - 1; i >= 0; i--) put_bits(s, (code >> i) & 1, 1);
}

static void flush_bits(sink *s) {
    if (s->bits) put_byte(s, (uint8_t)s->acc);
    s->acc = 0;
    s->bits = 0;
}

/* The fixed literal/length code of RFC 1951 §3.2.6. */
static void put_symbol(sink *s, int v) {
    if (v < 144) put_code(s, 0x30u + (uint32_t)v, 8);
    else if (v < 256) put_code(s, 0x190u + (uint32_t)(v - 144), 9);
    else if (v < 280) put_code(s, (uint32_t)(v - 256), 7);
    else put_code(s, 0xc0u + (uint32_t)(v - 280), 8);
}

static const int len_base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
static const int len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const int dist_base[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                                  193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
static const int dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

static void put_match(sink *s, int len, int dist) {
    int c = 28;
    while (len_base[c] > len) c--;
    put_symbol(s, 257 + c);
    put_bits(s, (uint32_t)(len - len_base[c]), len_extra[c]);
    int d = 29;
    while (dist_base[d] > dist) d--;
    put_code(s, (uint32_t)d, 5);
    put_bits(s, (uint32_t)(dist - dist_base[d]), dist_extra[d]);
}

static int run_at(const uint8_t *raw, size_t i, size_t n, size_t dist) {
    if (dist == 0 || dist > 32768 || i < dist) return 0;
    int len = 0;
    while (len < 258 && i + (size_t)len < n && raw[i + (size_t)len] == raw[i + (size_t)len - dist]) len++;
    return len;
}

/* raw[0..n) as a zlib stream: one final fixed-Huffman block, greedy
 * matches at distance 1 or stride (the row above), literals otherwise. */
static void deflate_fixed(sink *s, const uint8_t *raw, size_t n, size_t stride) {
    put_byte(s, 0x78); /* deflate, 32 KiB window */
    put_byte(s, 0x01); /* no dictionary; 0x7801 is a multiple of 31 */
    put_bits(s, 1, 1); /* BFINAL */
    put_bits(s, 1, 2); /* BTYPE 01: fixed Huffman codes */
    for (size_t i = 0; i < n;) {
        int a = run_at(raw, i, n, 1), b = run_at(raw, i, n, stride);
        int len = a >= b ? a : b;
        if (len >= 3) {
            put_match(s, len, a >= b ? 1 : (int)stride);
            i += (size_t)len;
        } else {
            put_symbol(s, raw[i++]);
        }
    }
    put_symbol(s, 256);
    flush_bits(s);
    put_be32(s, ds_adler32(raw, n));
}

/* A chunk: chunk_begin writes a length to fill in later and the type, and
 * returns where the type starts; the data follows; chunk_end fills in the
 * length and appends the CRC of the type and the data. */
static size_t chunk_begin(sink *s, const char *type) {
    put_be32(s, 0); /* the length, filled in by chunk_end */
    size_t at = s->n;
    for (int i = 0; i < 4; i++) put_byte(s, (uint8_t)type[i]);
    return at;
}

static void chunk_end(sink *s, size_t at) {
    if (!s->ok) return;
    const size_t len = s->n - at - 4;
    for (int i = 0; i < 4; i++) s->p[at - 4 + (size_t)i] = (uint8_t)(len >> (8 * (3 - i)));
    put_be32(s, ds_crc32(s->p + at, s->n - at));
}

ds_error *ds_png_encode(const ds_png_image *img, uint8_t **out, size_t *n) {
    *out = NULL;
    *n = 0;
    if (img->width < 1 || img->width > 65535 || img->height < 1 || img->height > 65535)
        return ds_errorf("png: image of %d x %d pixels (each side 1 .. 65535)", img->width, img->height);
    if (img->channels != 1 && img->channels != 3)
        return ds_errorf("png: %d channels per pixel (1: palette, 3: RGB)", img->channels);
    if (img->channels == 1 && (!img->palette || img->n_colors < 1 || img->n_colors > 256))
        return ds_errorf("png: a palette image needs 1 .. 256 palette colours, got %d", img->n_colors);
    const size_t row = (size_t)img->width * (size_t)img->channels, stride = row + 1;
    if (img->channels == 1)
        for (size_t i = 0; i < row * (size_t)img->height; i++)
            if (img->pixels[i] >= img->n_colors)
                return ds_errorf("png: pixel %zu has palette index %d, past the %d colours", i, img->pixels[i],
                                 img->n_colors);
    /* Each row behind its filter byte (0: none). */
    uint8_t *raw = malloc(stride * (size_t)img->height);
    if (!raw) return ds_errorf("out of memory");
    for (int y = 0; y < img->height; y++) {
        raw[(size_t)y * stride] = 0;
        memcpy(raw + (size_t)y * stride + 1, img->pixels + (size_t)y * row, row);
    }
    sink s = {.ok = true};
    static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    for (int i = 0; i < 8; i++) put_byte(&s, signature[i]);
    size_t at = chunk_begin(&s, "IHDR");
    put_be32(&s, (uint32_t)img->width);
    put_be32(&s, (uint32_t)img->height);
    put_byte(&s, 8);                            /* bits per sample */
    put_byte(&s, img->channels == 3 ? 2 : 3);   /* colour type: RGB / palette */
    put_byte(&s, 0);                            /* deflate */
    put_byte(&s, 0);                            /* adaptive filters */
    put_byte(&s, 0);                            /* no interlace */
    chunk_end(&s, at);
    if (img->channels == 1) {
        at = chunk_begin(&s, "PLTE");
        for (int i = 0; i < 3 * img->n_colors; i++) put_byte(&s, img->palette[i]);
        chunk_end(&s, at);
    }
    at = chunk_begin(&s, "IDAT");
    deflate_fixed(&s, raw, stride * (size_t)img->height, stride);
    chunk_end(&s, at);
    at = chunk_begin(&s, "IEND");
    chunk_end(&s, at);
    free(raw);
    if (!s.ok) {
        free(s.p);
        return ds_errorf("out of memory");
    }
    *out = s.p;
    *n = s.n;
    return NULL;
}

ds_error *ds_png_write(const char *path, const ds_png_image *img) {
    uint8_t *bytes;
    size_t n;
    DS_TRY(ds_error_wrap(ds_png_encode(img, &bytes, &n), "%s", path));
    FILE *f = fopen(path, "wb");
    ds_error *e = NULL;
    if (!f) e = ds_errorf("%s: cannot open for writing", path);
    else if (fwrite(bytes, 1, n, f) != n) e = ds_errorf("%s: write failed", path);
    if (f && fclose(f) && !e) e = ds_errorf("%s: write failed", path);
    free(bytes);
    return e;
}
