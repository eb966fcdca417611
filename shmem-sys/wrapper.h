// Input to bindgen (see regen.sh): NVSHMEM's host API. nvshmem_host.h includes
// host/nvshmem_api.h and host/nvshmemx_api.h, with the type, constant and collective
// headers they need, and none of the device headers. It parses as C++17 (not as C:
// the headers use static_assert and C++ casts) given the CUDA include directories.
#include <nvshmem_host.h>
