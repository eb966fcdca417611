// Reduction kernels on bf16 (see coll/reduce.cuh).
#include "coll/reduce.cuh"

SHMEM_REDUCE_FLOAT(bf16, __nv_bfloat16)
