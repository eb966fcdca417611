# v5 (nomoe.py on the tree of run 2's build, its comments since).
set -e
cd /work/main
eval "$(bash ci/gpu-toolchain.sh)"
python3 docs/logs/2026-11-26-s22/variants/nomoe.py kernels/common.cuh
git diff --stat
cargo build --release -p shmem --features mpi --example shmem-bench --bin shmemrun 2>&1 | tail -1
rm -rf /tmp/pk && mkdir -p /tmp/pk/bin && cp target/release/shmemrun target/release/examples/shmem-bench /tmp/pk/bin/ && strip --strip-debug /tmp/pk/bin/* && tar -C /tmp/pk -cf - bin | xz -T2 -6 > .gpu-bundle/v5.tar.xz
python3 - <<'PY'
p='kernels/common.cuh'; s=open(p).read()
s=s.replace("if (!kRolled && live && whole(","if (live && whole(").replace("if (!kRolled && whole(","if (whole(")
open(p,'w').write(s)
PY
echo V5DONE
