/* Simulated acceptance (`--sim-acceptance FILE`): at real shapes with
 * synthetic weights the drafts are never right, so the batched engine runs
 * every kernel for real and takes each round's confidences and accepted
 * length from a profile instead. Results measured this way must say so.
 *
 * A profile gives per-position conditional acceptance
 * p_k = P(draft k accepted | drafts 0..k-1 accepted) and a concentration
 * kappa. A round draws, per position, a confidence c_k ~ Beta(kappa p_k,
 * kappa (1 - p_k)) and an acceptance a_k ~ Bernoulli(c_k), independently
 * across positions. So P(accept k | c_k) = c_k (the confidences are
 * calibrated), P(accept k | accepted 0..k-1) = E[c_k] = p_k (the profile's
 * marginal), and the survival prod_{i<=k} c_i is exactly the probability
 * that drafts 0..k are all accepted: what Algorithm 1 assumes. kappa sets how
 * much a confidence tells (small: near 0 or 1, sharp; large: near p_k, no
 * more than the profile). The accepted length of a round that verifies L
 * drafts is min(L, the first rejection): verifying fewer drafts only
 * truncates.
 *
 * Each request owns one seeded stream (ds_sim_stream_seed), and a round
 * always draws all gamma positions whatever is verified, so a request's
 * draws never depend on the rest of the batch or on the schedule.
 *
 * File: {"name": "...", "kappa": K or [K_0, ...], "acceptance": [p_0, ...]},
 * other fields (notes, sources) ignored. */
#ifndef DS_SIM_ACCEPTANCE_H
#define DS_SIM_ACCEPTANCE_H

#include <stdint.h>

#include "base/error.h"
#include "base/rng.h"

#define DS_SIM_MAX_POSITIONS 64

typedef struct ds_sim_profile ds_sim_profile;

ds_error *ds_sim_profile_load(const char *path, ds_sim_profile **out);
/* A profile from values (kappa: one per position, or NULL and kappa_all). */
ds_error *ds_sim_profile_new(const char *name, const double *accept, int n, const double *kappa, double kappa_all,
                             ds_sim_profile **out);
void ds_sim_profile_free(ds_sim_profile *p);

const char *ds_sim_profile_name(const ds_sim_profile *p);
int ds_sim_profile_positions(const ds_sim_profile *p);
double ds_sim_profile_accept(const ds_sim_profile *p, int k);
/* Expected tokens per round when every round verifies gamma drafts:
 * 1 + sum_{k<gamma} prod_{i<=k} p_i (DeepSpec's acceptance length). */
double ds_sim_profile_tau(const ds_sim_profile *p, int gamma);

/* Request `request`'s stream under run seed `seed`. */
void ds_sim_stream_seed(ds_rng *rng, uint64_t seed, uint64_t request);
/* One round of gamma (1..positions) drafts: conf[0..gamma) the confidences,
 * *first_reject the index of the first rejected draft (gamma: none). */
ds_error *ds_sim_round(const ds_sim_profile *p, ds_rng *rng, int gamma, float *conf, int *first_reject);

#endif
