// Reduction kernels on f32 (see coll/reduce.cuh).
#include "coll/reduce.cuh"

SHMEM_REDUCE_FLOAT(f32, float)
