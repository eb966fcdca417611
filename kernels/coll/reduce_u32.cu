// Reduction kernels on u32 (see coll/reduce.cuh).
#include "coll/reduce.cuh"

SHMEM_REDUCE_INT(u32, uint32_t)
