# Session 22's variants, built from patched trees of main (7695814) and
# packed beside the bundle: v1 (co.py "576, 2"), v2 (one.py, co.py
# "576, 2"), v3 (one.py alone), v2ph (v2, a profiling build).
set -e
cd /work/main
eval "$(bash ci/gpu-toolchain.sh)"
v=docs/logs/2026-11-26-s22/variants
pack() {
  rm -rf /tmp/pk && mkdir -p /tmp/pk/bin && cp target/release/shmemrun target/release/examples/shmem-bench /tmp/pk/bin/ && strip --strip-debug /tmp/pk/bin/* && tar -C /tmp/pk -cf - bin | xz -T2 -6 > .gpu-bundle/$1.tar.xz
  echo packed $1
}
build() { "$@" cargo build --release -p shmem --features mpi --example shmem-bench --bin shmemrun 2>&1 | tail -1; }
python3 $v/co.py kernels/reduce.cuh "576, 2"
build env; pack v1
git checkout kernels/
python3 $v/one.py kernels/reduce.cuh kernels/common.cuh
build env; pack v3
python3 $v/co.py kernels/reduce.cuh "576, 2"
build env; pack v2
build env SHMEM_KERNEL_PHASES=1; pack v2ph
git checkout kernels/
echo ALLDONE
# Then main's profiling build (phases.tar.xz, into phases/).
build env SHMEM_KERNEL_PHASES=1; pack phases
echo PHDONE
