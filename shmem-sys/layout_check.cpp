// Prints the layout of NVSHMEM's init attribute and unique-id types, and the values
// that the header initializers put in them, as `name value` lines. regen.sh compiles
// it with g++ against an NVSHMEM_HOME; the numbers must equal the const asserts in
// src/layout.rs (the test there lists them).
#include <nvshmem_host.h>

#include <cstddef>
#include <cstdio>

#define SHOW(expr) std::printf("%-36s %lld\n", #expr, static_cast<long long>(expr))

int main() {
    std::printf("%-36s %d.%d.%d\n", "NVSHMEM_VENDOR_VERSION", NVSHMEM_VENDOR_MAJOR_VERSION,
                NVSHMEM_VENDOR_MINOR_VERSION, NVSHMEM_VENDOR_PATCH_VERSION);

    SHOW(sizeof(nvshmemx_uniqueid_t));
    SHOW(alignof(nvshmemx_uniqueid_t));
    SHOW(offsetof(nvshmemx_uniqueid_t, internal));

    SHOW(sizeof(nvshmemx_uniqueid_args_t));
    SHOW(alignof(nvshmemx_uniqueid_args_t));
    SHOW(offsetof(nvshmemx_uniqueid_args_t, id));
    SHOW(offsetof(nvshmemx_uniqueid_args_t, myrank));
    SHOW(offsetof(nvshmemx_uniqueid_args_t, nranks));

    SHOW(sizeof(nvshmemx_init_args_t));
    SHOW(alignof(nvshmemx_init_args_t));
    SHOW(offsetof(nvshmemx_init_args_t, uid_args));
#ifdef INIT_ARGS_V2_PADDING
    SHOW(offsetof(nvshmemx_init_args_t, cuda_device_id));
#endif
    SHOW(offsetof(nvshmemx_init_args_t, content));
    SHOW(sizeof(((nvshmemx_init_args_t *)nullptr)->content));

    SHOW(sizeof(nvshmemx_init_attr_t));
    SHOW(alignof(nvshmemx_init_attr_t));
    SHOW(offsetof(nvshmemx_init_attr_t, mpi_comm));
    SHOW(offsetof(nvshmemx_init_attr_t, args));

    nvshmemx_uniqueid_t uid = NVSHMEMX_UNIQUEID_INITIALIZER;
    SHOW(uid.version);
    nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
    SHOW(attr.version);
    SHOW(attr.mpi_comm == nullptr);
    SHOW(attr.args.version);
    SHOW(attr.args.uid_args.version);
    SHOW(attr.args.uid_args.id == nullptr);
    SHOW(attr.args.uid_args.myrank);
    SHOW(attr.args.uid_args.nranks);
#ifdef INIT_ARGS_V2_PADDING
    SHOW(attr.args.cuda_device_id);
#endif
    int nonzero_content = 0;
    for (char c : attr.args.content) nonzero_content += c != 0;
    SHOW(nonzero_content);

    SHOW(NVSHMEMX_INIT_WITH_UNIQUEID);
    SHOW(NVSHMEM_TEAM_WORLD);
    SHOW(NVSHMEM_SIGNAL_SET);
    SHOW(NVSHMEM_SIGNAL_ADD);
    SHOW(NVSHMEM_CMP_GE);
    return 0;
}
