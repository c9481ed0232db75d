/* Golden checks of a drafter against the reference's fixtures (see drafter_goldens.c). */
#ifndef DS_DRAFTER_GOLDENS_H
#define DS_DRAFTER_GOLDENS_H

#include "draft/drafter.h"

/* Opens the target, then a drafter for it: the drafter tests' usual pair.
 * On an error nothing is left open. */
ds_error *open_target_and_drafter(ds_backend *be, const char *target_dir, const ds_target_opts *topts,
                                  const char *drafter_dir, const ds_drafter_opts *dopts, ds_target **t,
                                  ds_drafter **d);

void check_drafter_round0(ds_backend *be, const char *target_dir, const char *drafter_dir, const char *golden);
void check_drafter_rounds(ds_backend *be, const char *target_dir, const char *drafter_dir, const char *golden,
                          const ds_drafter_opts *dopts);
void check_drafter_spec_run(ds_backend *be, const char *target_dir, const char *drafter_dir, const char *golden);

#endif
