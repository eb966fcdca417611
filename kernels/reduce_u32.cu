// Reduction kernels on u32 (see reduce.cuh).
#include "reduce.cuh"

SHMEM_REDUCE_INT(u32, uint32_t)
