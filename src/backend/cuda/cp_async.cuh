/* Asynchronous global -> shared copies (cp.async, sm_80+), shared by the
 * kernels that stage operands through a ring of shared-memory stages
 * (matmul_invariant.cu, matmul_quant.cu). The "memory" clobbers keep the
 * compiler from moving shared-memory reads across a wait. */
#ifndef DS_CUDA_CP_ASYNC_CUH
#define DS_CUDA_CP_ASYNC_CUH

/* 16 bytes, L2 only (a stream read once per block). */
__device__ __forceinline__ void ds_cu_cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src)
                 : "memory");
}
/* Closes the copies issued since the last commit into one group. */
__device__ __forceinline__ void ds_cu_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Waits until at most N groups are still in flight. */
template <int N> __device__ __forceinline__ void ds_cu_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

#endif
