/* A small PNG encoder (dspark calibrate's reliability diagrams): 8-bit RGB
 * or 8-bit palette images in one IDAT chunk. The zlib stream is one
 * fixed-Huffman deflate block whose only matches are runs along the row
 * (distance 1) and copies of the row above (distance = a row's bytes): a
 * plot is mostly flat colour, so this alone makes it tens of KB instead of
 * MB, with no tables to build. */
#ifndef DS_PNG_WRITE_H
#define DS_PNG_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct {
    int width, height;       /* 1 .. 65535 each */
    int channels;            /* 3: RGB triples; 1: indices into palette */
    const uint8_t *pixels;   /* height rows of width * channels bytes, top row first */
    const uint8_t *palette;  /* channels 1: n_colors RGB triples */
    int n_colors;            /* channels 1: 1 .. 256, and every index below it */
} ds_png_image;

/* The PNG file's bytes, malloc'd into *out (*n bytes). */
ds_error *ds_png_encode(const ds_png_image *img, uint8_t **out, size_t *n);
/* Encodes img and writes it to path (the error names path). */
ds_error *ds_png_write(const char *path, const ds_png_image *img);

/* The checksums PNG uses: CRC-32 (ISO 3309, of a chunk's type and data)
 * and zlib's Adler-32 (of the uncompressed stream). */
uint32_t ds_crc32(const uint8_t *p, size_t n);
uint32_t ds_adler32(const uint8_t *p, size_t n);

#endif
