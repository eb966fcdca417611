// Reduction kernels on f16 (see reduce.cuh).
#include "reduce.cuh"

SHMEM_REDUCE_FLOAT(f16, __half)
