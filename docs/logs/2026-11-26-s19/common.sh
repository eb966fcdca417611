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
