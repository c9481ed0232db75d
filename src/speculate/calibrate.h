/* Calibration of a drafter's confidence head (SPEC §6): the rounds a
 * calibration run records, the per-position metrics of the predicted
 * prefix acceptance, and STS, the sequential temperature fit.
 *
 * A round drafted at threshold 0 gives gamma confidence logits z_k, the
 * effective proposal length L (the drafts verified, cut after an accepted
 * stop token) and the accepted count a. Position k < L is one sample: the
 * prediction is the cumulative product P_k = prod_{i<=k} c_i (c_i the
 * calibrated confidence, draft/confidence.h ds_conf_prob, widened to fp64,
 * the product in fp64, clamped to [1e-8, 1 - 1e-8] for the metrics), the
 * label whether the prefix through k was accepted (k < a). The metrics are
 * those of DeepSpec's eval/dspark/confidence_head.py (its fp64 version):
 * ECE over 20 equal-width bins of P (bin floor(20 P)), weighted by the bins'
 * counts; AUROC from 1000-bin histograms of P for each label (pairs in a
 * lower bin plus half the ties in the same bin); Brier the mean (P - y)^2. */
#ifndef DS_CALIBRATE_H
#define DS_CALIBRATE_H

#include "base/error.h"

#define DS_CAL_ECE_BINS 20
#define DS_CAL_AUROC_BINS 1000
#define DS_CAL_EPS 1e-8
#define DS_CAL_MAX_GAMMA 32

typedef struct {
    int gamma;       /* confidence logits per round (the drafter's block size) */
    long n, cap;     /* rounds recorded, allocated */
    float *logit;    /* [cap][gamma] raw confidence logits */
    int *len;        /* per round: the effective proposal length (labelled positions) */
    int *accepted;   /* per round: drafts accepted */
} ds_cal_rounds;

ds_error *ds_cal_rounds_init(ds_cal_rounds *r, int gamma);
/* Records a round: logit[0..gamma), 0 <= accepted <= len <= gamma (a round
 * with len 0 has no sample and is skipped, as DeepSpec skips it). */
ds_error *ds_cal_rounds_add(ds_cal_rounds *r, const float *logit, int len, int accepted);
void ds_cal_rounds_free(ds_cal_rounds *r);

/* One position's metrics; ece, auroc, brier and the means are NaN without
 * samples, auroc also when every label is the same. */
typedef struct {
    long n;
    double ece, auroc, brier, pred_mean, target_mean;
    /* The ECE bins (the reliability diagram): samples, sums of P and of y. */
    double bin_n[DS_CAL_ECE_BINS], bin_pred[DS_CAL_ECE_BINS], bin_target[DS_CAL_ECE_BINS];
} ds_cal_metrics;

/* The metrics of positions 0..gamma-1 into out[0..gamma) with temperature
 * temp[k] at position k (temp NULL: the head as it is, every s_k = 1). */
ds_error *ds_cal_evaluate(const ds_cal_rounds *r, const float *temp, ds_cal_metrics *out);

/* The STS grid: every s = 2^(i / DS_STS_STEPS) for |i| <= DS_STS_OCTAVES *
 * DS_STS_STEPS (1/64 .. 64, 1 included, so the fit never ends worse than
 * the head as it is on the calibration rounds), then DS_STS_REFINE points
 * evenly in log s between the best point's two neighbours. Ties go to the
 * s nearest 1 in log s. Log spacing: a temperature scales the logit, so
 * over- and under-confidence by the same factor are equally far from 1. */
#define DS_STS_OCTAVES 6
#define DS_STS_STEPS 16
#define DS_STS_REFINE 32

/* Fits temp[0..gamma) left to right: s_k minimises the ECE of P_k at
 * position k with s_0..s_{k-1} already fitted. A position without samples
 * keeps s_k = 1. */
ds_error *ds_sts_fit(const ds_cal_rounds *r, float *temp);

#endif
