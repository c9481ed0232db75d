/* Stands in for the CUDA backend in builds without it (DS_CUDA=OFF, or no
 * nvcc at configure time): callers get an error that says so. */
#include "backend/backend.h"
#include "backend/cuda/cuda_config.h"

ds_error *ds_backend_cuda_new_with(int device, const ds_cuda_config *cfg, ds_backend **out) {
    (void)cfg;
    *out = NULL;
    return ds_errorf("cuda backend (device %d): CUDA support is not compiled in (no CUDA device usable; configure "
                     "with -DDS_CUDA=ON where nvcc is installed)",
                     device);
}

ds_error *ds_backend_cuda_new(int device, ds_backend **out) { return ds_backend_cuda_new_with(device, NULL, out); }

ds_cuda_config *ds_cuda_config_of(ds_backend *be) {
    (void)be;
    return NULL;
}

