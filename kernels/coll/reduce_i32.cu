// Reduction kernels on i32 (see coll/reduce.cuh).
#include "coll/reduce.cuh"

SHMEM_REDUCE_INT(i32, int32_t)
