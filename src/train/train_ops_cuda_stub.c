/* Stands in for the CUDA trainer (train_ops_cuda.cu) in builds without CUDA
 * (DS_CUDA=OFF, or no nvcc at configure time): callers get an error that
 * says so. */
#include "train/train_ops.h"

ds_error *ds_train_dev_cuda(int device, ds_train_dev **out) {
    *out = NULL;
    return ds_errorf("cuda trainer (device %d): this dspark was built without CUDA (configure with -DDS_CUDA=ON "
                     "where nvcc is installed), or train on the CPU (--backend cpu)",
                     device);
}
