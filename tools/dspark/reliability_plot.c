#include "reliability_plot.h"

#include <math.h>
#include <stdio.h>

#include "io/png_write.h"
#include "raster.h"

enum { WHITE, BLACK, GRID, DIAGONAL, BLUE, ORANGE, LIGHT_BLUE, LIGHT_ORANGE, N_COLOURS };
static const uint8_t palette[3 * N_COLOURS] = {
    255, 255, 255, /* background */
    20,  20,  20,  /* text, axes */
    225, 225, 225, /* grid */
    150, 150, 150, /* the diagonal */
    31,  119, 180, /* before */
    230, 110, 0,   /* after */
    190, 215, 235, /* before's bars */
    250, 210, 170, /* after's bars */
};

/* Geometry: a panel is a header of three text lines, the plot square and
 * the x tick labels; the figure is a title block and the panels, four a row. */
enum { PLOT = 240, LEFT = 44, RIGHT = 20, HEAD = 64, FOOT = 26, PANEL_W = LEFT + PLOT + RIGHT,
       PANEL_H = HEAD + PLOT + FOOT, TITLE = 76, MARGIN = 12, COLS = 4 };

static int px_x(int x0, double v) { return x0 + (int)lround(v * (PLOT - 1)); }
static int px_y(int y0, double v) { return y0 + PLOT - 1 - (int)lround(v * (PLOT - 1)); }

static void curve(ds_canvas *c, int x0, int y0, const ds_cal_metrics *m, uint8_t colour) {
    int px = -1, py = -1;
    for (int b = 0; b < DS_CAL_ECE_BINS; b++) {
        if (m->bin_n[b] <= 0) continue;
        const int x = px_x(x0, m->bin_pred[b] / m->bin_n[b]), y = px_y(y0, m->bin_target[b] / m->bin_n[b]);
        if (px >= 0) ds_canvas_line(c, px, py, x, y, 2, 0, colour);
        ds_canvas_rect(c, x - 3, y - 3, x + 3, y + 3, colour);
        px = x;
        py = y;
    }
}

/* Each bin's share of the samples, before in the bin's left half and after
 * in its right half, up to a quarter of the plot for the fullest bin. */
static void bars(ds_canvas *c, int x0, int y0, const ds_cal_metrics *before, const ds_cal_metrics *after) {
    double most = 0;
    for (int b = 0; b < DS_CAL_ECE_BINS; b++) {
        if (before->bin_n[b] > most) most = before->bin_n[b];
        if (after->bin_n[b] > most) most = after->bin_n[b];
    }
    if (most <= 0) return;
    for (int b = 0; b < DS_CAL_ECE_BINS; b++) {
        const int xa = px_x(x0, (double)b / DS_CAL_ECE_BINS) + 1, xm = px_x(x0, (b + 0.5) / DS_CAL_ECE_BINS),
                  xb = px_x(x0, (double)(b + 1) / DS_CAL_ECE_BINS) - 1, bottom = y0 + PLOT - 1;
        const int hb = (int)lround(before->bin_n[b] / most * PLOT / 4), ha = (int)lround(after->bin_n[b] / most * PLOT / 4);
        if (hb > 0) ds_canvas_rect(c, xa, bottom - hb, xm - 1, bottom, LIGHT_BLUE);
        if (ha > 0) ds_canvas_rect(c, xm, bottom - ha, xb, bottom, LIGHT_ORANGE);
    }
}

static void fmt(char *buf, size_t n, const char *what, double a, double b) {
    if (isnan(a) || isnan(b)) snprintf(buf, n, "%s -", what);
    else snprintf(buf, n, "%s %.4f -> %.4f", what, a, b);
}

static void panel(ds_canvas *c, int ox, int oy, int k, const ds_reliability_plot *p) {
    const ds_cal_metrics *before = &p->before[k], *after = &p->after[k];
    char line[64];
    snprintf(line, sizeof line, "K=%d N=%ld S=%.3f", k, after->n, p->temp[k]);
    ds_canvas_text(c, ox + LEFT, oy + 4, 2, line, BLACK);
    fmt(line, sizeof line, "ECE", before->ece, after->ece);
    ds_canvas_text(c, ox + LEFT, oy + 24, 2, line, BLACK);
    fmt(line, sizeof line, "AUC", before->auroc, after->auroc);
    ds_canvas_text(c, ox + LEFT, oy + 44, 2, line, BLACK);
    const int x0 = ox + LEFT, y0 = oy + HEAD;
    for (int g = 1; g < 4; g++) {
        ds_canvas_line(c, px_x(x0, g / 4.0), y0, px_x(x0, g / 4.0), y0 + PLOT - 1, 1, 0, GRID);
        ds_canvas_line(c, x0, px_y(y0, g / 4.0), x0 + PLOT - 1, px_y(y0, g / 4.0), 1, 0, GRID);
    }
    bars(c, x0, y0, before, after);
    ds_canvas_line(c, x0, y0 + PLOT - 1, x0 + PLOT - 1, y0, 1, 4, DIAGONAL);
    curve(c, x0, y0, before, BLUE);
    curve(c, x0, y0, after, ORANGE);
    /* The frame and the ticks at 0, 0.5 and 1. */
    ds_canvas_line(c, x0 - 1, y0 - 1, x0 + PLOT, y0 - 1, 1, 0, BLACK);
    ds_canvas_line(c, x0 - 1, y0 + PLOT, x0 + PLOT, y0 + PLOT, 1, 0, BLACK);
    ds_canvas_line(c, x0 - 1, y0 - 1, x0 - 1, y0 + PLOT, 1, 0, BLACK);
    ds_canvas_line(c, x0 + PLOT, y0 - 1, x0 + PLOT, y0 + PLOT, 1, 0, BLACK);
    static const char *ticks[3] = {"0", "0.5", "1"};
    for (int t = 0; t < 3; t++) {
        const int xt = px_x(x0, t / 2.0), yt = px_y(y0, t / 2.0), w = ds_canvas_text_width(ticks[t], 2);
        ds_canvas_text(c, xt - w / 2, y0 + PLOT + 6, 2, ticks[t], BLACK);
        ds_canvas_text(c, x0 - 6 - w, yt - DS_FONT_H, 2, ticks[t], BLACK);
    }
}

ds_error *ds_reliability_plot_write(const char *path, const ds_reliability_plot *p) {
    if (p->gamma < 1) return ds_errorf("%s: a reliability diagram of %d positions", path, p->gamma);
    const int cols = p->gamma < COLS ? p->gamma : COLS, rows = (p->gamma + cols - 1) / cols;
    const int w = 2 * MARGIN + cols * PANEL_W, h = TITLE + rows * PANEL_H + MARGIN;
    ds_canvas c;
    DS_TRY(ds_canvas_new(&c, w < 640 ? 640 : w, h, WHITE));
    ds_canvas_text(&c, MARGIN + LEFT, MARGIN, 3, "STS RELIABILITY", BLACK);
    if (p->subtitle) ds_canvas_text(&c, MARGIN + LEFT, MARGIN + 30, 1, p->subtitle, BLACK);
    /* The legend, and what the axes are. */
    int x = MARGIN + LEFT, y = MARGIN + 46;
    ds_canvas_rect(&c, x, y, x + 13, y + 13, BLUE);
    ds_canvas_text(&c, x + 20, y, 2, "BEFORE", BLACK);
    x += 20 + ds_canvas_text_width("BEFORE", 2) + 24;
    ds_canvas_rect(&c, x, y, x + 13, y + 13, ORANGE);
    ds_canvas_text(&c, x + 20, y, 2, "AFTER STS", BLACK);
    x += 20 + ds_canvas_text_width("AFTER STS", 2) + 24;
    ds_canvas_text(&c, x, y + 4, 1, "X: PREDICTED PREFIX ACCEPTANCE (MEAN OF ECE BIN)  Y: OBSERVED  BARS: SAMPLES PER BIN",
                   BLACK);
    for (int k = 0; k < p->gamma; k++)
        panel(&c, MARGIN + (k % cols) * PANEL_W, TITLE + (k / cols) * PANEL_H, k, p);
    const ds_png_image img = {.width = c.w, .height = c.h, .channels = 1, .pixels = c.px, .palette = palette,
                              .n_colors = N_COLOURS};
    ds_error *e = ds_png_write(path, &img);
    ds_canvas_free(&c);
    return e;
}
