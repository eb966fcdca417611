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
# old/ (8621847), mid/ (run 3's build) and this build in turn, REPS times
# (session 18's `ab3`; when run 4 ran, the loop was written out here).
lines3() {
    . "$here/../docs/logs/2026-11-25-s18/common.sh"
    AB3_IMPL=shmem-lines ab3 "$1"
}
# `mid_as_bin`: run 3's build (mid.tar.xz) in bin/ instead of this one,
# and as the bundle's bin.tar.xz for gpu-run.sh. (Runs 5 and 6 did this
# before sourcing the common steps, when they ran: the same result.)
mid_as_bin() {
    rm -rf "$here/bin"
    tar -C "$here" -xJf "$here/mid.tar.xz"
    mv "$here/mid.tar.xz" "$here/bin.tar.xz"
}
