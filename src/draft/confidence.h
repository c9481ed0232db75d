/* Confidence truncation (SPEC §4): a proposal ends before its first
 * position whose confidence sigmoid(c) is below the threshold. The host
 * decides it with ds_conf_keep; a walk on the backend cuts on the device
 * (conf_cut) against ds_conf_cutoff_at, which decides the same.
 *
 * With STS temperatures (SPEC §6, speculate/calibrate.h) position k's
 * confidence is the calibrated one, sigmoid(c_k / s_k): ds_conf_prob is the
 * one definition that truncation, calibration and the cutoffs share. */
#ifndef DS_CONFIDENCE_H
#define DS_CONFIDENCE_H

#include <stdbool.h>

/* The calibrated confidence of logit c at temperature s > 0: sigmoid(c / s)
 * in fp32. At s = 1 it is the head's own sigmoid(c) bit for bit (c / 1 is c). */
float ds_conf_prob(float c, float s);
/* Whether a confidence logit c cuts the proposal at threshold t:
 * sigmoid(c) < t, decided in fp32 as the reference does. */
bool ds_conf_below(float c, float t);
/* The same at temperature s: ds_conf_prob(c, s) < t. */
bool ds_conf_below_at(float c, float s, float t);
/* The least fp32 cutoff with: c < cutoff exactly when ds_conf_below(c, t)
 * (0 < t <= 1; NaN never cuts), so a backend decides by one comparison. */
float ds_conf_cutoff(float t);
/* The same for ds_conf_below_at(c, s, t): one cutoff per position. */
float ds_conf_cutoff_at(float t, float s);
/* How many of gamma drafts with confidence logits conf_logit[0..gamma)
 * the threshold keeps (threshold <= 0: all), position k at temperature
 * temp[k] (temp NULL: every s_k = 1). */
int ds_conf_keep(const float *conf_logit, const float *temp, int gamma, float threshold);

#endif
