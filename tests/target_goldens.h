/* Golden checks of a target against the reference's fixtures, shared by
 * test_qwen3.c and test_gemma4.c (see target_goldens.c). */
#ifndef DS_TARGET_GOLDENS_H
#define DS_TARGET_GOLDENS_H

#include "model/target.h"
#include "testlib.h"

/* Opens <fix>/target (with opts) and <fix>/golden.safetensors, the layout
 * of every target fixture. On an error nothing is left open. */
ds_error *open_target_fixture(ds_backend *be, const char *fix, const ds_target_opts *opts, ds_target **t,
                              ds_safetensors **g);

/* One forward of the golden prompt with every layer tapped: the logits, each
 * layer's output, hidden_states and the final norm within tol. */
void check_target_prompt(ds_target *t, ds_safetensors *g, double tol, const char *label);

/* Greedy decoding after the golden prompt was fed (its last row's logits
 * ready, next position pos): each step's logits within tol of the
 * reference's no-cache forward, and each token the reference's. */
void check_target_greedy(ds_target *t, ds_safetensors *g, int pos, double tol, const char *label);

#endif
