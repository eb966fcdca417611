// Reduction kernels on u64 (see coll/reduce.cuh).
#include "coll/reduce.cuh"

SHMEM_REDUCE_INT(u64, uint64_t)
