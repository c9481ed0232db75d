/* Stands in for comm_nccl.cu in builds without CUDA or without NCCL: a
 * multi-GPU tensor-parallel group is then an error that says why. */
#include "backend/comm.h"

ds_error *ds_comm_group_nccl(int world, const int *devices, ds_comm_group **out, ds_comm *ranks) {
    (void)world, (void)devices, (void)ranks;
    *out = NULL;
    return ds_errorf("tensor parallel over GPUs: this build has no NCCL (CUDA off, or libnccl not found at configure)");
}
