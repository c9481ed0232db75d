/* Confidence truncation (SPEC §4): a proposal ends before its first
 * position whose confidence sigmoid(c) is below the threshold. The host
 * decides it with ds_conf_keep; a walk on the backend cuts on the device
 * (backend.h conf_cut) against ds_conf_cutoff, which decides the same. */
#ifndef DS_CONFIDENCE_H
#define DS_CONFIDENCE_H

#include <stdbool.h>

/* Whether a confidence logit c cuts the proposal at threshold t:
 * sigmoid(c) < t, decided in fp32 as the reference does. */
bool ds_conf_below(float c, float t);
/* The least fp32 cutoff with: c < cutoff exactly when ds_conf_below(c, t)
 * (0 < t <= 1; NaN never cuts), so a backend decides by one comparison. */
float ds_conf_cutoff(float t);
/* How many of gamma drafts with confidence logits conf_logit[0..gamma)
 * the threshold keeps (threshold <= 0: all). */
int ds_conf_keep(const float *conf_logit, int gamma, float threshold);

#endif
