// Reduction kernels on f64 (see coll/reduce.cuh).
#include "coll/reduce.cuh"

SHMEM_REDUCE_FLOAT(f64, double)
