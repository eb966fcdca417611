# Sourced by this session's drivers (and session 22's): session 20's
# common.sh (the box's environment, `run`, `ab_each`, `ab_lines`, `ab_all`, `ar_at`,
# `phases_ar`, `nccl_ar`, `gpu_run`, `pack`; old/ and phases/ unpacked
# where the bundle has them), and alt/ (alt.tar.xz: shmem-bench and
# shmemrun of an experimental build, named in the README) unpacked where
# the bundle has it.
. "$here/../docs/logs/2026-11-26-s20/common.sh"
if [[ -f $here/alt.tar.xz ]]; then
    mkdir -p "$here/alt"
    tar -C "$here/alt" -xJf "$here/alt.tar.xz"
fi
# `ab3 PATTERN LIMIT BENCH_ARGS...`: shmem-bench at 2 PEs, old/ then this
# build then alt/, once each, named PATTERN with {v} made old, new or alt.
ab3() {
    local pat=$1 limit=$2
    shift 2
    ab_each "$pat" "$limit" 2 "$@"
    run "${pat//\{v\}/alt}" "$limit" "$here/alt/bin/shmemrun" -n 2 "$here/alt/bin/shmem-bench" --backend gpu "$@" \
        --json "$dest/r/${pat//\{v\}/alt}.jsonl"
}
# Variant builds beside the bundle (VAR.tar.xz: shmem-bench and shmemrun),
# each unpacked into VAR/; `bench_v VAR NAME BENCH_ARGS...` runs VAR's
# shmem-bench at 2 PEs (VAR old: old/, new: this build), its log and JSON
# NAME.
for f in "$here"/v[0-9]*.tar.xz; do
    [[ -f $f ]] || continue
    v=$(basename "$f" .tar.xz)
    mkdir -p "$here/$v"
    tar -C "$here/$v" -xJf "$f"
done
bench_v() {
    local v=$1 name=$2 b
    shift 2
    case $v in
        new) b=$bin ;;
        old) b=$here/old/bin ;;
        *) b=$here/$v/bin ;;
    esac
    run "$name" 60 "$b/shmemrun" -n 2 "$b/shmem-bench" --backend gpu "$@" --json "$dest/r/$name.jsonl"
}
# `sweep`: the standard sweep into $dest/g (every op and implementation,
# f32 and bf16, eager to 256 MiB and graphs to 1 MiB; the all-gather
# target; the MoE forms) and targets.py on it into r/targets.txt, as
# `gpu-run.sh --bench` runs them but without its test pass. (s21d.sh,
# s22d.sh and s22e.sh had these steps inline when they ran; moved here in
# session 22, the same commands.)
sweep() {
    g=$dest/g
    mkdir -p "$g"
    run bench 300 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all --dtype f32,bf16 --max-bytes 256M \
        --graph --graph-max-bytes 1M --json "$g/bench.jsonl"
    run bench-ag-target 120 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_gather --dtype bf16 \
        --min-bytes 512M --max-bytes 512M --impl shmem,nccl --json "$g/bench-ag-target.jsonl"
    run bench-moe 120 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op moe --graph --json "$g/bench-moe.jsonl"
    python3 "$here/targets.py" "$g" >"$dest/r/targets.txt" 2>&1
}
