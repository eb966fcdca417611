set -e
cd /work/main
eval "$(bash ci/gpu-toolchain.sh)"
rm -rf /tmp/wt2; git worktree prune
git worktree add -f /tmp/wt2 afcbb67
(cd /tmp/wt2 && SHMEM_KERNEL_PHASES=1 CARGO_TARGET_DIR=/work/main/target cargo build --release -p shmem --features mpi --example shmem-bench --bin shmemrun 2>&1 | tail -1)
rm -rf /tmp/pk && mkdir -p /tmp/pk/bin && cp target/release/shmemrun target/release/examples/shmem-bench /tmp/pk/bin/ && strip --strip-debug /tmp/pk/bin/* && tar -C /tmp/pk -cf - bin | xz -T2 -6 > .gpu-bundle/v9phold.tar.xz
git worktree remove --force /tmp/wt2
echo PHDONE
