/* A training micro-batch as the drafter's step reads it (drafter_train.c),
 * built on the host from whole sequences and their anchors (SPEC §7):
 * every block is [token_a, MASK x (gamma-1)] at positions a..a+gamma-1 with
 * labels tokens a+1..a+gamma; its weights are the cumulative validity mask
 * (a label exists and is a target-generated token) times exp(-k / decay);
 * its Markov inputs are teacher-forced (prev_k = token a+k); the target's
 * logits for position k come from the target's final hidden state at a+k.
 * A sequence contributes the context rows its blocks can see (positions
 * below its last anchor) and no padding. */
#ifndef DS_TRAIN_BATCH_H
#define DS_TRAIN_BATCH_H

#include <stdint.h>

#include "base/dtype.h"
#include "base/error.h"
#include "base/rng.h"

/* One sequence's data: ids and loss mask (1 on target-generated tokens), the target's taps [len,
 * tap_width] and final hidden state [len, hidden], fp32 or bf16 (a datagen cache's). */
typedef struct {
    int len;
    const int32_t *ids;
    const uint8_t *loss_mask;
    ds_dtype dtype;
    const void *taps, *final_hidden;
} ds_train_seq_view;

typedef struct {
    int n_seqs, n_blocks, gamma, tap_width, hidden;
    int32_t *ctx_start;     /* [n_seqs + 1]: sequence s's context rows */
    int32_t *ctx_pos;       /* [n_ctx]: each context row's position in its sequence */
    float *taps;            /* [n_ctx, tap_width] */
    int32_t *block_seq;     /* [n_blocks] */
    int32_t *block_anchor;  /* [n_blocks] */
    int32_t *ids, *pos, *labels, *prev; /* [n_blocks * gamma] */
    float *weight;          /* [n_blocks * gamma] */
    float *target_hidden;   /* [n_blocks * gamma, hidden] */
} ds_train_batch;

static inline int64_t ds_train_batch_ctx_rows(const ds_train_batch *b) { return b->ctx_start[b->n_seqs]; }

/* Anchor candidates of a sequence: positions i < len-1 with loss_mask[i] and loss_mask[i+1]. Draws up to
 * max_anchors distinct ones uniformly (all of them when there are fewer), sorted, into out; returns the
 * count. */
int ds_train_sample_anchors(const uint8_t *loss_mask, int len, int max_anchors, ds_rng *rng, int32_t *out);

/* Builds the batch of n sequences with anchors[s][0..n_anchors[s]) each (a sequence without anchors adds
 * nothing). Errors name the sequence and anchor at fault (an anchor that is not a candidate). */
ds_error *ds_train_batch_build(const ds_train_seq_view *seqs, int n, const int32_t *const *anchors,
                               const int *n_anchors, int gamma, int mask_id, float decay, int tap_width,
                               int hidden, ds_train_batch *out);
void ds_train_batch_free(ds_train_batch *b);

#endif
