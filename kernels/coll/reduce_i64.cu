// Reduction kernels on i64 (see coll/reduce.cuh).
#include "coll/reduce.cuh"

SHMEM_REDUCE_INT(i64, int64_t)
