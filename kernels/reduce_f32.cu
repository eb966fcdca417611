// Reduction kernels on f32 (see reduce.cuh).
#include "reduce.cuh"

SHMEM_REDUCE_FLOAT(f32, float)
