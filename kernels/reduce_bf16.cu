// Reduction kernels on bf16 (see reduce.cuh).
#include "reduce.cuh"

SHMEM_REDUCE_FLOAT(bf16, __nv_bfloat16)
