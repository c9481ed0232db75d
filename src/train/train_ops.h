/* The ops a drafter's training step is written against (drafter_train.c):
 * forward, backward and the optimizer of a DSpark drafter, every one on
 * fp32 buffers in the device's memory. The CPU implements them with
 * OpenBLAS and a thread pool (train_ops_cpu.c); a CUDA device implements
 * the same table with cuBLAS and its own kernels.
 *
 * Conventions: matrices are row-major and dense (leading dimension = the
 * column count unless an argument says otherwise); a "weight" W is [out,
 * in] as in a checkpoint, so a linear layer is y = x W^T. Ops whose name
 * ends in _bwd ADD their parameter gradients into the dW / dw they are
 * given (a step may accumulate several micro-batches) and WRITE their input
 * gradients unless an argument says they add. */
#ifndef DS_TRAIN_OPS_H
#define DS_TRAIN_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct ds_train_dev ds_train_dev;

/* Where a block row's keys are (the training mask, SPEC §7): block b
 * (rows b*g .. b*g+g-1 of the block tensors) belongs to sequence seq[b],
 * whose context rows are ctx_start[seq[b]] .. ctx_start[seq[b]+1]-1 at
 * positions 0, 1, ...; it sees that sequence's context rows at positions <
 * anchor[b] and every row of its own block, nothing else. Device arrays. */
typedef struct {
    int n_blocks, gamma, n_seqs;
    int n_ctx;    /* context rows, every sequence's together (= ctx_start[n_seqs]) */
    int max_keys; /* the most keys a block sees: its anchor + gamma */
    const int32_t *seq, *anchor; /* [n_blocks] */
    const int32_t *ctx_start;    /* [n_seqs + 1] */
    int n_heads, n_kv_heads, head_dim;
    float scale;
} ds_train_attn;

/* One row's loss terms (SPEC §7), summed over a chunk of block rows. */
typedef struct {
    double ce, l1, conf; /* sum of w * term */
} ds_train_terms;

typedef struct {
    const char *name;
    /* Logit values a training step keeps at once (two [rows, vocab] buffers together): the chunk of rows
     * the loss runs on. A GPU wants wide chunks (its LM-head GEMMs and loss blocks fill the device); a
     * CPU's stay cache-sized. */
    int64_t logit_values;
    /* GEMMs on TF32 tensor cores (10-bit mantissas: ~1e-3 relative, several times faster) instead of fp32;
     * NULL: the device has no such mode (the CPU). */
    ds_error *(*set_tf32)(ds_train_dev *dev, bool on);
    void (*destroy)(ds_train_dev *dev);
    /* Memory (zero-filled), host <-> device copies, zeroing. */
    ds_error *(*alloc)(ds_train_dev *dev, size_t bytes, void **out);
    void (*free)(ds_train_dev *dev, void *p);
    void (*upload)(ds_train_dev *dev, void *dst, const void *src, size_t bytes);
    void (*download)(ds_train_dev *dev, void *dst, const void *src, size_t bytes);
    void (*zero)(ds_train_dev *dev, void *p, size_t bytes);

    /* C[M,N] = alpha * op(A) op(B) + beta * C; op(A) is [M,K] (A stored [K,M] when ta), op(B) is [K,N]
     * (B stored [N,K] when tb). Leading dimensions are the stored column counts. */
    void (*gemm)(ds_train_dev *dev, bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc);
    /* y += alpha * x over n elements. */
    void (*axpy)(ds_train_dev *dev, size_t n, float alpha, const float *x, float *y);

    /* out[i] = table[ids[i]] (rows of cols). */
    void (*gather)(ds_train_dev *dev, int rows, int cols, const float *table, const int32_t *ids, float *out);
    /* dtable[ids[i]] += d[i]. */
    void (*scatter_add)(ds_train_dev *dev, int rows, int cols, const float *d, const int32_t *ids, float *dtable);

    /* RMSNorm over rows of n: y = w * x / sqrt(mean(x^2) + eps); rstd[r] keeps 1/sqrt(...). */
    void (*rmsnorm)(ds_train_dev *dev, int rows, int n, const float *x, const float *w, float eps, float *y,
                    float *rstd);
    /* dx = d/dx (add_dx: dx +=), dw += d/dw, from x, rstd and dy. */
    void (*rmsnorm_bwd)(ds_train_dev *dev, int rows, int n, const float *x, const float *w, const float *rstd,
                        const float *dy, float *dx, bool add_dx, float *dw);

    /* RoPE (rotate-half, transformers' default) in place on rows of heads x head_dim at positions pos[rows];
     * inverse: the transposed rotation (the backward of the forward). inv_freq: device, [head_dim / 2]. */
    void (*rope)(ds_train_dev *dev, int rows, int heads, int head_dim, const int32_t *pos, const float *inv_freq,
                 float *x, bool inverse);

    /* The training attention: q [R, H*D], block keys/values kb, vb [R, KV*D] (R = n_blocks * gamma),
     * context kc, vc [ctx rows, KV*D]. out [R, H*D]; lse [R*H] keeps each (row, head)'s log-sum-exp. */
    void (*attn)(ds_train_dev *dev, const ds_train_attn *a, const float *q, const float *kc, const float *vc,
                 const float *kb, const float *vb, float *out, float *lse);
    /* Its backward: writes dq, dkb, dvb, dkc, dvc (zeroed first) from dout, out, lse. */
    void (*attn_bwd)(ds_train_dev *dev, const ds_train_attn *a, const float *q, const float *kc, const float *vc,
                     const float *kb, const float *vb, const float *out, const float *lse, const float *dout,
                     float *dq, float *dkc, float *dvc, float *dkb, float *dvb);

    /* m = silu(gate) * up; its backward writes dgate, dup (in place of gate's and up's gradients). */
    void (*swiglu)(ds_train_dev *dev, size_t n, const float *gate, const float *up, float *m);
    void (*swiglu_bwd)(ds_train_dev *dev, size_t n, const float *gate, const float *up, const float *dm,
                       float *dgate, float *dup);

    /* The DSpark loss over rows of vocab logits (SPEC §7): draft [rows, V] (Markov-corrected) is
     * overwritten by d(loss)/d(draft); target [rows, V] the target's logits (overwritten: scratch); conf
     * [rows] the confidence logits -> dconf [rows]. w[rows]: each row's weight eval*exp(-k/decay);
     * coef_* = alpha_term * scale / (weight sum + 1e-6). Adds the chunk's weighted sums to *terms. */
    void (*dspark_loss)(ds_train_dev *dev, int rows, int vocab, float *draft, float *target, const float *conf,
                        const int32_t *labels, const float *w, float coef_ce, float coef_l1, float coef_conf,
                        float *dconf, ds_train_terms *terms);

    /* Sum of squares of x (for the gradient's norm). */
    double (*sumsq)(ds_train_dev *dev, size_t n, const float *x);
    /* One AdamW step (torch's): g *= clip; m, v updated; p -= lr * m_hat / (sqrt(v_hat) + eps) after
     * p *= 1 - lr * wd. bc1, bc2: 1 - beta^t. */
    void (*adamw)(ds_train_dev *dev, size_t n, float *p, const float *g, float *m, float *v, float clip, float lr,
                  float beta1, float beta2, float eps, float wd, float bc1, float bc2);
} ds_train_ops;

struct ds_train_dev {
    const ds_train_ops *ops;
};

/* The CPU device (n_threads <= 0: every core). */
ds_error *ds_train_dev_cpu(int n_threads, ds_train_dev **out);
/* CUDA GPU `device` (cuBLAS fp32 GEMMs, no TF32); an error where there is none or the build has no CUDA. */
ds_error *ds_train_dev_cuda(int device, ds_train_dev **out);

#endif
