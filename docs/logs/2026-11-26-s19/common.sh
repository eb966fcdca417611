# Sourced by this session's drivers, after session 12's common.sh (the
# box's environment, `run`, `unpack_old`, `ab_each`, `pack`).
# `stress BIN TAG ROUNDS SEED...`: spmd's coll::all_to_all::lines_after_packets
# (rounds of two all-to-alls in packets, then two in lines, on the same
# buffers) once for each seed, with the build in BIN (bin or old/bin).
stress() {
    local b=$1 tag=$2 rounds=$3 seed
    shift 3
    for seed in "$@"; do
        run "stress-$tag-$seed" 90 env SHMEM_TEST_SEED="$seed" SHMEM_TEST_ROUNDS="$rounds" \
            "$here/$b/shmemrun" -n 2 "$here/$b/spmd" coll::all_to_all::lines_after_packets
    done
}
# `lines3 REPS`: the MoE line kernel at 1, 32 and 128 tokens (graphs),
# old/ (8621847), mid/ (run 3's build) and this build in turn, REPS times.
lines3() {
    local k v b
    mkdir -p "$here/mid"
    tar -C "$here/mid" -xJf "$here/mid.tar.xz"
    for ((k = 1; k <= $1; k++)); do
        for v in old mid new; do
            b=$here/bin
            [[ $v != new ]] && b=$here/$v/bin
            run "moe-$v$k" 60 "$b/shmemrun" -n 2 "$b/shmem-bench" --backend gpu --op moe --tokens 1,32,128 \
                --graph --impl shmem-lines --json "$dest/r/moe-$v$k.jsonl"
        done
    done
}
