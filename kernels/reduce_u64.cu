// Reduction kernels on u64 (see reduce.cuh).
#include "reduce.cuh"

SHMEM_REDUCE_INT(u64, uint64_t)
