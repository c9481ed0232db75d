#include "train/train_batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool is_candidate(const uint8_t *mask, int len, int i) { return i >= 0 && i < len - 1 && mask[i] && mask[i + 1]; }

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int ds_train_sample_anchors(const uint8_t *loss_mask, int len, int max_anchors, ds_rng *rng, int32_t *out) {
    int n = 0;
    /* Reservoir sampling over the candidates: uniform without replacement, one pass, no list. */
    for (int i = 0; i < len - 1; i++) {
        if (!is_candidate(loss_mask, len, i)) continue;
        if (n < max_anchors) {
            out[n] = i;
        } else {
            const uint64_t j = ds_rng_next(rng) % (uint64_t)(n + 1);
            if (j < (uint64_t)max_anchors) out[j] = i;
        }
        n++;
    }
    const int k = n < max_anchors ? n : max_anchors;
    qsort(out, (size_t)k, sizeof *out, cmp_i32);
    return k;
}

void ds_train_batch_free(ds_train_batch *b) {
    if (!b) return;
    free(b->ctx_start);
    free(b->ctx_pos);
    free(b->taps);
    free(b->block_seq);
    free(b->block_anchor);
    free(b->ids);
    free(b->pos);
    free(b->labels);
    free(b->prev);
    free(b->weight);
    free(b->target_hidden);
    memset(b, 0, sizeof *b);
}

static void to_f32(ds_dtype t, const void *src, size_t offset, float *dst, size_t n) {
    ds_to_f32(t, (const char *)src + offset * ds_dtype_size(t), dst, n);
}

ds_error *ds_train_batch_build(const ds_train_seq_view *seqs, int n, const int32_t *const *anchors,
                               const int *n_anchors, int gamma, int mask_id, float decay, int tap_width,
                               int hidden, ds_train_batch *out) {
    memset(out, 0, sizeof *out);
    if (gamma < 1 || tap_width < 1 || hidden < 1) return ds_errorf("training batch: bad sizes");
    int64_t n_ctx = 0, n_blocks = 0;
    for (int s = 0; s < n; s++) {
        const ds_train_seq_view *q = &seqs[s];
        if (q->dtype != DS_F32 && q->dtype != DS_BF16)
            return ds_errorf("training batch: sequence %d: hidden states in %s (fp32 or bf16 only)", s,
                             ds_dtype_name(q->dtype));
        int last = -1;
        for (int i = 0; i < n_anchors[s]; i++) {
            const int a = anchors[s][i];
            if (!is_candidate(q->loss_mask, q->len, a))
                return ds_errorf("training batch: sequence %d: anchor %d is not a position whose token and next "
                                 "token are both target-generated (length %d)", s, a, q->len);
            if (a <= last) return ds_errorf("training batch: sequence %d: anchors must be distinct and sorted", s);
            last = a;
        }
        n_ctx += last > 0 ? last : 0;
        n_blocks += n_anchors[s];
    }
    if (n_ctx > INT32_MAX / 2 || n_blocks * gamma > INT32_MAX / 2) return ds_errorf("training batch: too large");
    const size_t R = (size_t)(n_blocks * gamma);
    ds_train_batch *b = out;
    b->n_seqs = n, b->n_blocks = (int)n_blocks, b->gamma = gamma, b->tap_width = tap_width, b->hidden = hidden;
    b->ctx_start = calloc((size_t)n + 1, sizeof *b->ctx_start);
    b->ctx_pos = calloc((size_t)n_ctx + 1, sizeof *b->ctx_pos);
    b->taps = calloc((size_t)n_ctx * tap_width + 1, sizeof *b->taps);
    b->block_seq = calloc((size_t)n_blocks + 1, sizeof *b->block_seq);
    b->block_anchor = calloc((size_t)n_blocks + 1, sizeof *b->block_anchor);
    b->ids = calloc(R + 1, sizeof *b->ids);
    b->pos = calloc(R + 1, sizeof *b->pos);
    b->labels = calloc(R + 1, sizeof *b->labels);
    b->prev = calloc(R + 1, sizeof *b->prev);
    b->weight = calloc(R + 1, sizeof *b->weight);
    b->target_hidden = calloc(R * hidden + 1, sizeof *b->target_hidden);
    if (!b->ctx_start || !b->ctx_pos || !b->taps || !b->block_seq || !b->block_anchor || !b->ids || !b->pos ||
        !b->labels || !b->prev || !b->weight || !b->target_hidden) {
        ds_train_batch_free(b);
        return ds_errorf("training batch: out of memory (%lld context rows, %lld blocks)", (long long)n_ctx,
                         (long long)n_blocks);
    }
    int64_t c = 0, blk = 0;
    for (int s = 0; s < n; s++) {
        const ds_train_seq_view *q = &seqs[s];
        b->ctx_start[s] = (int32_t)c;
        const int rows = n_anchors[s] ? anchors[s][n_anchors[s] - 1] : 0; /* the keys its blocks see */
        to_f32(q->dtype, q->taps, 0, b->taps + c * tap_width, (size_t)rows * tap_width);
        for (int i = 0; i < rows; i++) b->ctx_pos[c + i] = i;
        c += rows;
        for (int i = 0; i < n_anchors[s]; i++, blk++) {
            const int a = anchors[s][i];
            b->block_seq[blk] = s;
            b->block_anchor[blk] = a;
            bool valid = true;
            for (int k = 0; k < gamma; k++) {
                const size_t r = (size_t)blk * gamma + k;
                const int idx = a + 1 + k, at = a + k < q->len ? a + k : q->len - 1;
                valid = valid && idx < q->len && q->loss_mask[idx];
                b->ids[r] = k == 0 ? q->ids[a] : mask_id;
                b->pos[r] = a + k;
                b->labels[r] = q->ids[idx < q->len ? idx : q->len - 1];
                b->prev[r] = q->ids[at];
                b->weight[r] = valid ? expf(-(float)k / decay) : 0.0f;
                to_f32(q->dtype, q->final_hidden, (size_t)at * hidden, b->target_hidden + r * hidden, (size_t)hidden);
            }
        }
    }
    b->ctx_start[n] = (int32_t)c;
    return NULL;
}
