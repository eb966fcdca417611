// Reduction kernels on f16 (see coll/reduce.cuh).
#include "coll/reduce.cuh"

SHMEM_REDUCE_FLOAT(f16, __half)
