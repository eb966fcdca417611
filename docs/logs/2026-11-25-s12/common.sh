# Sourced by this session's drivers (after they ran, their shared start
# moved here): the box's environment as gpu-run.sh sets it, the bundle
# unpacked, `run NAME LIMIT CMD...` (the step's output in $dest/r/NAME.log,
# its exit status and time and last lines in $dest/r/run.log), and
# `mps_on PES` / `mps_off` (PES sharing the GPU under CUDA MPS, as
# `gpu-run.sh --share`). At the end a driver calls `pack`.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
dest=${OUT:-/tmp/out}
mkdir -p "$dest/r"
tar -C "$here" -xJf "$here/bin.tar.xz"
bin=$here/bin
nvlib=$(ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia/nvshmem/lib /usr/local/lib/python3*/dist-packages/nvidia/nvshmem/lib 2>/dev/null | head -1)
nccl=$(ls /opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2 2>/dev/null | head -1)
export NVSHMEM_HOME=${nvlib%/lib} LD_LIBRARY_PATH=$nvlib:/usr/local/cuda/lib64${nccl:+:$(dirname "$nccl")} SHMEM_BACKEND=gpu
log=$dest/r/run.log
run() {
    local name=$1 limit=$2 t0 rc
    shift 2
    t0=$SECONDS
    echo "== $name: $*" >>"$log"
    timeout --kill-after=10 "$limit" "$@" >"$dest/r/$name.log" 2>&1
    rc=$?
    echo "== $name: rc $rc, $((SECONDS - t0)) s" >>"$log"
    tail -3 "$dest/r/$name.log" >>"$log"
}
mps_on() {
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    export SHMEM_PES_PER_GPU=$1 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / $1))
    mkdir -p /tmp/mps-pipe /tmp/mps-log
    nvidia-cuda-mps-control -d
}
mps_off() {
    echo quit | nvidia-cuda-mps-control
    sleep 1
    unset SHMEM_PES_PER_GPU CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
}
# The line tests under compute-sanitizer at 2 PEs sharing the GPU.
sanitize_lines() {
    OUT=$dest/r/san SHMEM_GPU_PES=2 SANITIZE_TESTS='^moe::(lines|tuned::lines)::' SAN_JOBS=4 SAN_TIMEOUT=150 \
        timeout 200 bash "$here/gpu-run.sh" --share --sanitize >"$dest/r/san.log" 2>&1
    echo "== san: rc $?" >>"$log"
}
# A/B against the build before (old.tar.xz beside the bundle, into old/).
unpack_old() {
    mkdir -p "$here/old"
    tar -C "$here/old" -xJf "$here/old.tar.xz"
}
# `ab_each PATTERN LIMIT PES BENCH_ARGS...`: shmem-bench at PES PEs, the
# old build then the new, once each, the step and its JSON named PATTERN
# with {v} made old or new. (Later sessions' drivers call it; its callers
# had the loop inline when they ran: the same commands.)
ab_each() {
    local pat=$1 limit=$2 p=$3 v b name
    shift 3
    for v in old new; do
        b=$here/bin
        [[ $v == old ]] && b=$here/old/bin
        name=${pat//\{v\}/$v}
        run "$name" "$limit" "$b/shmemrun" -n "$p" "$b/shmem-bench" --backend gpu "$@" --json "$dest/r/$name.jsonl"
    done
}
# `ab_reps PES REPS`: the MoE forms' bench at PES PEs, the two builds
# alternating REPS times.
ab_reps() {
    local p=$1 k
    for ((k = 1; k <= $2; k++)); do
        ab_each "pe$p-{v}$k-moe" 60 "$p" --op moe --tokens 1,32,128 --graph --impl shmem,shmem-lines
    done
}
# The MoE forms' bench at PES PEs, each build twice, alternating.
ab_moe() { ab_reps "$1" 2; }
pack() {
    tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
}
