/* A DSpark drafter (Qwen3 backbone) being trained: fp32 master weights,
 * their gradients and AdamW's moments on a training device (train_ops.h),
 * and the training step of SPEC §7 — the forward under the training mask
 * (a block sees its sequence's context strictly before its anchor and its
 * own block; blocks never see each other), the teacher-forced Markov head,
 * the confidence head, the DeepSpec loss and its exact backward.
 * embed_tokens and lm_head are held too but frozen (no gradient). */
#ifndef DS_DRAFTER_TRAIN_H
#define DS_DRAFTER_TRAIN_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "base/error.h"
#include "train/train_batch.h"
#include "train/train_ops.h"

/* The recipe's loss (DeepSpec config/dspark: ce_loss_alpha, l1_loss_alpha, confidence_head_alpha, and
 * loss_decay_gamma in the weights exp(-k / decay)). */
typedef struct {
    float alpha_ce, alpha_l1, alpha_conf, decay;
} ds_train_loss_recipe;
extern const ds_train_loss_recipe ds_train_loss_deepspec;

/* A micro-batch's loss: each term is sum(w * term) / (sum(w) + 1e-6) over its rows. */
typedef struct {
    double loss, ce, l1, conf;
    double weight_sum;
    int64_t rows; /* block rows with weight > 0 */
} ds_train_loss;

typedef struct ds_drafter_train ds_drafter_train;

/* The drafter's shapes, as training needs them (from its config.json). */
typedef struct {
    int vocab, hidden, n_layers, n_heads, n_kv_heads, head_dim, inter;
    int gamma, mask_id, markov_rank, n_taps;
    int tap_layers[16];
    int num_anchors; /* config num_anchors (the recipe's anchors a sequence), 0 when absent */
    float eps;
    int conf_in; /* the confidence head's input width: hidden (+ markov_rank with confidence_head_with_markov) */
} ds_drafter_train_shape;

/* Loads dir (config.json + safetensors; fp32, bf16 or f16) as fp32 master weights on dev. Only Qwen3
 * DSpark drafters with a vanilla Markov head and a confidence head: another is an error naming the
 * config field. embed_tokens and lm_head come from target_dir's checkpoint when given (as DeepSpec
 * does), else from dir's. Errors name the directory, field or tensor. */
ds_error *ds_drafter_train_open(ds_train_dev *dev, const char *dir, const char *target_dir, ds_drafter_train **out);
/* A drafter from scratch: config_path's shapes, weights drawn as transformers' _init_weights does for
 * these modules (Linear and Embedding N(0, initializer_range), biases 0, norms 1) from a stream seeded
 * by seed, embed_tokens and lm_head the target's. */
ds_error *ds_drafter_train_init(ds_train_dev *dev, const char *config_path, const char *target_dir, uint64_t seed,
                                ds_drafter_train **out);
void ds_drafter_train_free(ds_drafter_train *t);
const ds_drafter_train_shape *ds_drafter_train_shape_of(const ds_drafter_train *t);

/* The trainable tensors (embed_tokens, lm_head not among them), in checkpoint order. */
int ds_drafter_train_n_tensors(const ds_drafter_train *t);
const char *ds_drafter_train_tensor_name(const ds_drafter_train *t, int i);
/* Elements of tensor i, its shape (ndim 1 or 2). */
int64_t ds_drafter_train_tensor_shape(const ds_drafter_train *t, int i, int *ndim, int64_t shape[2]);
/* Tensor i's weights, gradient or AdamW moments (fp32), to or from the host. */
typedef enum { DS_TRAIN_WEIGHTS, DS_TRAIN_GRAD, DS_TRAIN_ADAM_M, DS_TRAIN_ADAM_V } ds_train_array;
void ds_drafter_train_get(const ds_drafter_train *t, int i, ds_train_array a, float *host);
void ds_drafter_train_set(ds_drafter_train *t, int i, ds_train_array a, const float *host);
/* The frozen embed_tokens (lm_head false) or lm_head, [vocab, hidden] fp32. */
void ds_drafter_train_get_frozen(const ds_drafter_train *t, bool lm_head, float *host);
/* The drafter's config.json as it was read. */
const cJSON *ds_drafter_train_config(const ds_drafter_train *t);

/* Zeroes the gradients (a step starts here). */
void ds_drafter_train_zero_grad(ds_drafter_train *t);
/* One micro-batch: forward, loss, and scale * d(loss)/d(weights) ADDED to the gradients. */
ds_error *ds_drafter_train_grad(ds_drafter_train *t, const ds_train_batch *b, const ds_train_loss_recipe *r,
                                float scale, ds_train_loss *out);
/* The loss alone (no gradient): validation. */
ds_error *ds_drafter_train_eval(ds_drafter_train *t, const ds_train_batch *b, const ds_train_loss_recipe *r,
                                ds_train_loss *out);
/* The gradients' total L2 norm (over every trainable tensor). */
double ds_drafter_train_grad_norm(ds_drafter_train *t);

/* AdamW (torch's, fp32): one step with learning rate lr on gradients scaled by clip (the clip coefficient). */
typedef struct {
    float beta1, beta2, eps, weight_decay;
} ds_adamw;
extern const ds_adamw ds_adamw_deepspec;
void ds_drafter_train_step(ds_drafter_train *t, const ds_adamw *opt, float lr, float clip);
int64_t ds_drafter_train_steps_taken(const ds_drafter_train *t);
void ds_drafter_train_set_steps(ds_drafter_train *t, int64_t steps); /* a resumed run's (AdamW's bias correction) */

#endif
