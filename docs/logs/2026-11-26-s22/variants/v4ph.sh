# Run 2's profiling build (v4ph): the tree after run 1's changes, with
# `gap_last` in phases.cuh, SHMEM_KERNEL_PHASES=1.
set -e
cd /work/main
eval "$(bash ci/gpu-toolchain.sh)"
SHMEM_KERNEL_PHASES=1 cargo build --release -p shmem --features mpi --example shmem-bench --bin shmemrun 2>&1 | tail -1
rm -rf /tmp/pk && mkdir -p /tmp/pk/bin && cp target/release/shmemrun target/release/examples/shmem-bench /tmp/pk/bin/ && strip --strip-debug /tmp/pk/bin/* && tar -C /tmp/pk -cf - bin | xz -T2 -6 > .gpu-bundle/v4ph.tar.xz
echo V4PH
