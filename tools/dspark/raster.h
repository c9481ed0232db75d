/* A palette canvas for the CLI's plots (dspark calibrate's reliability
 * diagram): filled rectangles, lines, and text in a built-in 5x7 bitmap
 * font (upper-case letters, digits and a little punctuation; lower case
 * is drawn as upper case, anything else as '?'). Drawing outside the
 * canvas is clipped. */
#ifndef DS_RASTER_H
#define DS_RASTER_H

#include <stdint.h>

#include "base/error.h"

typedef struct {
    int w, h;
    uint8_t *px; /* w * h palette indices, top row first */
} ds_canvas;

ds_error *ds_canvas_new(ds_canvas *c, int w, int h, uint8_t background);
void ds_canvas_free(ds_canvas *c);

void ds_canvas_rect(ds_canvas *c, int x0, int y0, int x1, int y1, uint8_t colour); /* [x0, x1] x [y0, y1] */
/* A line from (x0, y0) to (x1, y1), width pixels thick; dash > 0 draws
 * dash pixels, skips dash, and so on. */
void ds_canvas_line(ds_canvas *c, int x0, int y0, int x1, int y1, int width, int dash, uint8_t colour);
/* Text with its top-left corner at (x, y), each font pixel scale x scale. */
void ds_canvas_text(ds_canvas *c, int x, int y, int scale, const char *text, uint8_t colour);
/* The width in pixels ds_canvas_text draws text at scale. */
int ds_canvas_text_width(const char *text, int scale);

#define DS_FONT_W 5
#define DS_FONT_H 7

#endif
