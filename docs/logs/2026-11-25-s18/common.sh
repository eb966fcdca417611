# Sourced by this session's drivers, after session 12's common.sh (the
# box's environment, `run`, `unpack_old`, `ab_each`, `pack`): their shared
# steps, which the drivers had inline when they ran (the same commands).
# `start_ab_phases`: session 14's common.sh too, dc17ab6's build (old/)
# and the profiling build (phases/) unpacked. `ab3 REPS`: the MoE forms'
# bench at 2 PEs, dc17ab6's build, run 4's (mid/) and this one in turn,
# REPS times (`--impl` from AB3_IMPL, by default shmem,nccl; session 19's
# `lines3` calls it with shmem-lines). `torn_test SEED...`: `coll::all_to_all::default` once for
# each seed. `moe_run`: `gpu-run.sh --moe` into g/.
start_ab_phases() {
    . "$here/../docs/logs/2026-11-25-s14/common.sh"
    unpack_old
    unpack_phases
}
ab3() {
    local k v b
    unpack_old
    mkdir -p "$here/mid"
    tar -C "$here/mid" -xJf "$here/mid.tar.xz"
    for ((k = 1; k <= $1; k++)); do
        for v in old mid new; do
            b=$here/bin
            [[ $v != new ]] && b=$here/$v/bin
            run "moe-$v$k" 60 "$b/shmemrun" -n 2 "$b/shmem-bench" --backend gpu --op moe --tokens 1,32,128 \
                --graph --impl "${AB3_IMPL:-shmem,nccl}" --json "$dest/r/moe-$v$k.jsonl"
        done
    done
}
torn_test() {
    local seed
    for seed in "$@"; do
        run "a2a-$seed" 60 env SHMEM_TEST_SEED="$seed" SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" \
            coll::all_to_all::default
    done
}
moe_run() {
    OUT=$dest/g timeout 150 bash "$here/gpu-run.sh" --moe >"$dest/r/gpu-run.out" 2>&1
    echo "== gpu-run --moe: rc $?" >>"$log"
    tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$dest/g"
}
