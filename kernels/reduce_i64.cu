// Reduction kernels on i64 (see reduce.cuh).
#include "reduce.cuh"

SHMEM_REDUCE_INT(i64, int64_t)
