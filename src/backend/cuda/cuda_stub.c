/* Stands in for the CUDA backend in builds without it (DS_CUDA=OFF, or no
 * nvcc at configure time): callers get an error that says so. */
#include "backend/backend.h"

ds_error *ds_backend_cuda_new(int device, ds_backend **out) {
    *out = NULL;
    return ds_errorf("cuda backend (device %d): CUDA support is not compiled in (no CUDA device usable; configure "
                     "with -DDS_CUDA=ON where nvcc is installed)",
                     device);
}
