// Reduction kernels on f64 (see reduce.cuh).
#include "reduce.cuh"

SHMEM_REDUCE_FLOAT(f64, double)
