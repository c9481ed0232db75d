#include "train_plot.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/png_write.h"
#include "raster.h"

enum { WHITE, BLACK, GRID, BLUE, ORANGE, GREEN, PURPLE, RED, N_COLOURS };
static const uint8_t palette[3 * N_COLOURS] = {
    255, 255, 255, /* background */
    20,  20,  20,  /* text, axes */
    225, 225, 225, /* grid */
    31,  119, 180, /* loss */
    230, 110, 0,   /* 0.1 ce */
    44,  160, 44,  /* 0.9 l1 */
    148, 103, 189, /* confidence */
    214, 39,  40,  /* validation loss */
};

enum { W = 900, H = 480, LEFT = 64, RIGHT = 24, TOP = 70, BOTTOM = 44 };

typedef struct {
    int n;
    double *step, *v[5]; /* loss, 0.1 ce, 0.9 l1, conf, val loss (NAN where none) */
} series;

static const char *const keys[5] = {"loss", "ce", "l1", "confidence", "val_loss"};
static const double weights[5] = {1.0, 0.1, 0.9, 1.0, 1.0};

static ds_error *read_log(const char *path, series *s) {
    char *text = NULL;
    size_t len = 0;
    DS_TRY(ds_read_file(path, &text, &len));
    int cap = 0;
    ds_error *e = NULL;
    for (char *line = text, *next; line && *line && !e; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (!*line) continue;
        cJSON *j = cJSON_Parse(line);
        const cJSON *st = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
        if (!cJSON_IsNumber(st)) {
            cJSON_Delete(j);
            continue; /* a line cut by an interruption */
        }
        if (s->n == cap) {
            cap = cap ? 2 * cap : 256;
            double *p = realloc(s->step, (size_t)cap * sizeof *p);
            if (p) s->step = p;
            for (int k = 0; k < 5 && p; k++) {
                p = realloc(s->v[k], (size_t)cap * sizeof *p);
                if (p) s->v[k] = p;
            }
            if (!p) e = ds_errorf("out of memory");
        }
        if (!e) {
            s->step[s->n] = st->valuedouble;
            for (int k = 0; k < 5; k++) {
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[k]);
                s->v[k][s->n] = cJSON_IsNumber(v) ? v->valuedouble * weights[k] : NAN;
            }
            s->n++;
        }
        cJSON_Delete(j);
    }
    free(text);
    if (!e && s->n == 0) e = ds_errorf("%s: no steps logged", path);
    return e;
}

ds_error *ds_train_plot(const char *log_path, const char *png_path, const char *note) {
    series s = {0};
    ds_error *e = read_log(log_path, &s);
    ds_canvas c = {0};
    if (!e) e = ds_canvas_new(&c, W, H, WHITE);
    if (!e) {
        double x1 = s.step[s.n - 1], y1 = 0;
        for (int i = 0; i < s.n; i++)
            for (int k = 0; k < 5; k++)
                if (isfinite(s.v[k][i])) y1 = fmax(y1, s.v[k][i]);
        y1 = y1 > 0 ? y1 * 1.05 : 1;
        const double x0 = fmin(1, x1);
        if (x1 <= x0) x1 = x0 + 1;
        const int pw = W - LEFT - RIGHT, ph = H - TOP - BOTTOM;
#define PX(x) (LEFT + (int)lround(((x) - x0) / (x1 - x0) * (pw - 1)))
#define PY(y) (TOP + ph - 1 - (int)lround((y) / y1 * (ph - 1)))
        for (int g = 0; g <= 5; g++) {
            const double y = y1 * g / 5;
            ds_canvas_line(&c, LEFT, PY(y), LEFT + pw - 1, PY(y), 1, 0, GRID);
            char lab[32];
            snprintf(lab, sizeof lab, "%.2f", y);
            ds_canvas_text(&c, LEFT - 8 - ds_canvas_text_width(lab, 1), PY(y) - 3, 1, lab, BLACK);
        }
        ds_canvas_line(&c, LEFT, TOP, LEFT, TOP + ph - 1, 1, 0, BLACK);
        ds_canvas_line(&c, LEFT, TOP + ph - 1, LEFT + pw - 1, TOP + ph - 1, 1, 0, BLACK);
        char lab[96];
        snprintf(lab, sizeof lab, "STEP %.0f", x1);
        ds_canvas_text(&c, LEFT + pw - ds_canvas_text_width(lab, 1), TOP + ph + 10, 1, lab, BLACK);
        ds_canvas_text(&c, LEFT, TOP + ph + 10, 1, "1", BLACK);
        ds_canvas_text(&c, LEFT, 14, 2, "DSPARK TRAIN: LOSS", BLACK);
        if (note && *note) ds_canvas_text(&c, LEFT + ds_canvas_text_width("DSPARK TRAIN: LOSS", 2) + 24, 18, 1, note, BLACK);
        static const char *const names[5] = {"LOSS", "0.1 CE", "0.9 L1", "CONFIDENCE", "VALIDATION LOSS"};
        static const uint8_t cols[5] = {BLUE, ORANGE, GREEN, PURPLE, RED};
        for (int k = 0, x = LEFT; k < 5; k++) {
            ds_canvas_rect(&c, x, 44, x + 10, 50, cols[k]);
            ds_canvas_text(&c, x + 14, 44, 1, names[k], BLACK);
            x += 24 + ds_canvas_text_width(names[k], 1);
        }
        for (int k = 3; k >= 0; k--) { /* the total last, on top */
            int px = -1, py = -1;
            for (int i = 0; i < s.n; i++) {
                if (!isfinite(s.v[k][i])) continue;
                const int x = PX(s.step[i]), y = PY(s.v[k][i]);
                if (px >= 0) ds_canvas_line(&c, px, py, x, y, k == 0 ? 2 : 1, 0, cols[k]);
                px = x, py = y;
            }
        }
        for (int i = 0; i < s.n; i++)
            if (isfinite(s.v[4][i])) ds_canvas_rect(&c, PX(s.step[i]) - 3, PY(s.v[4][i]) - 3, PX(s.step[i]) + 3, PY(s.v[4][i]) + 3, RED);
#undef PX
#undef PY
        const ds_png_image img = {.width = c.w, .height = c.h, .channels = 1, .pixels = c.px, .palette = palette,
                                  .n_colors = N_COLOURS};
        e = ds_png_write(png_path, &img);
    }
    ds_canvas_free(&c);
    free(s.step);
    for (int k = 0; k < 5; k++) free(s.v[k]);
    return e;
}
