set -e
cd /work/main
eval "$(bash ci/gpu-toolchain.sh)"
pack() {
  rm -rf /tmp/pk && mkdir -p /tmp/pk/bin && cp target/release/shmemrun target/release/examples/shmem-bench /tmp/pk/bin/ && strip --strip-debug /tmp/pk/bin/* && tar -C /tmp/pk -cf - bin | xz -T2 -6 > .gpu-bundle/$1.tar.xz
  echo packed $1
}
build() { cargo build --release -p shmem --features mpi --example shmem-bench --bin shmemrun 2>&1 | tail -1; }
python3 /tmp/unown.py kernels/reduce.cuh
git diff --stat
build; pack v2
python3 /tmp/sleep.py kernels/common.cuh 100
build; pack v3
git checkout kernels/
rm -rf /tmp/wt1; git worktree prune
git worktree add -f /tmp/wt1 afcbb67
python3 /tmp/own.py /tmp/wt1/kernels/reduce.cuh
(cd /tmp/wt1 && git diff --stat && CARGO_TARGET_DIR=/work/main/target cargo build --release -p shmem --features mpi --example shmem-bench --bin shmemrun 2>&1 | tail -1)
pack v1
git worktree remove --force /tmp/wt1
echo ALLDONE
