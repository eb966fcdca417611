// Reduction kernels on i32 (see reduce.cuh).
#include "reduce.cuh"

SHMEM_REDUCE_INT(i32, int32_t)
