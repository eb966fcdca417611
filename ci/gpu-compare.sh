#!/usr/bin/env bash
# Runs the benchmark sweep of two or more bundles (ci/gpu-bundle.sh's
# .gpu-bundle/, unpacked or not) on this GPU machine, one after another at
# each PE count, so that their rows are measured on the same GPUs in the
# same call and can be compared:
#
#   bash ci/gpu-compare.sh [--pes 2,4] [--quick] NAME=BUNDLE_DIR[:NODES]...
#
# A bundle named with :NODES runs its jobs on that many emulated nodes
# (shmemrun --nodes), e.g. `1x4=B 2x2=B:2` with --pes 4 compares one node
# of 4 GPUs with 2 nodes of 2 on the same bundle.
# For each PE count p and bundle NAME it writes $OUT/NAME-p/*.jsonl
# and .log: every collective against NCCL and NVSHMEM, eager from 8 B to
# 256 MiB and graph-replayed up to 1 MiB (f32 and bf16; --quick: bf16 only,
# shmem's default and NCCL), and the MoE all-to-all-v at 1, 32, 128 and 4096
# tokens, top-1 and top-8. PE counts below 4 use the first GPUs
# (CUDA_VISIBLE_DEVICES). Then, for each count, the ratio of every row of
# each bundle to the first bundle's: compare.txt.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
. "$here/gpu-env.sh"

pes_list=2 quick=''
bundles=()
while (($#)); do
    case $1 in
    --pes) pes_list=$2; shift ;;
    --quick) quick=1 ;;
    *=*) bundles+=("$1") ;;
    *) echo "gpu-compare: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
((${#bundles[@]})) || { echo "usage: gpu-compare.sh [--pes 2,4] [--quick] NAME=BUNDLE_DIR[:NODES]..." >&2; exit 2; }

# A bundle's folder and its nodes (1 unless named with :NODES).
bundle_dir() { local d=${1#*=}; [[ $d =~ :[0-9]+$ ]] && d=${d%:*}; echo "$d"; }
bundle_nodes() { local d=${1#*=}; [[ $d =~ :([0-9]+)$ ]] && echo "${BASH_REMATCH[1]}" || echo 1; }

for b in "${bundles[@]}"; do
    dir=$(bundle_dir "$b")
    if [[ -f "$dir/bin.tar.xz" && ! -d "$dir/bin" ]]; then
        tar -C "$dir" -xJf "$dir/bin.tar.xz" || { echo "gpu-compare: cannot unpack $dir/bin.tar.xz" >&2; exit 1; }
    fi
done

if [[ -n $quick ]]; then
    coll=(--op all_reduce,all_gather,reduce_scatter,broadcast,all_to_all --dtype bf16 --impl shmem,nccl)
else
    coll=(--op all --dtype f32,bf16)
fi
failed=0
gpus=$(nvidia-smi -L | grep -c '^GPU')
for pes in ${pes_list//,/ }; do
    visible=$(seq -s, 0 $((pes - 1)))
    ((pes > gpus)) && { echo "gpu-compare: $pes PEs but $gpus GPUs: skipped" >&2; continue; }
    for b in "${bundles[@]}"; do
        name=${b%%=*} bin=$(bundle_dir "$b")/bin dest=$out/$name-$pes
        run=("$bin/shmemrun" -n "$pes" --nodes "$(bundle_nodes "$b")")
        mkdir -p "$dest"
        echo "== $name, $pes PEs on $(bundle_nodes "$b") node(s)"
        CUDA_VISIBLE_DEVICES=$visible timeout 420 "${run[@]}" "$bin/shmem-bench" --backend gpu \
            "${coll[@]}" --max-bytes 256M --graph --graph-max-bytes 1M --json "$dest/bench.jsonl" \
            >"$dest/bench.log" 2>&1 || { echo "   bench failed: $dest/bench.log"; failed=1; }
        for topk in 1 8; do
            CUDA_VISIBLE_DEVICES=$visible timeout 300 "${run[@]}" "$bin/shmem-bench" --backend gpu \
                --op moe --tokens 1,32,128,4096 --topk $topk --hidden 7168 --experts-per-pe 8 --graph \
                --impl shmem,nccl --json "$dest/moe-top$topk.jsonl" >"$dest/moe-top$topk.log" 2>&1 ||
                { echo "   moe failed: $dest/moe-top$topk.log"; failed=1; }
        done
    done
done

# Each bundle's rows against the first's: the ratio of times, by row.
python3 - "$out" "$pes_list" "${bundles[@]}" >"$out/compare.txt" <<'EOF'
import json, os, statistics, sys
out, pes_list, bundles = sys.argv[1], sys.argv[2].split(","), [b.split("=")[0] for b in sys.argv[3:]]
def rows(d):
    got = {}
    for f in ("bench.jsonl", "moe-top1.jsonl", "moe-top8.jsonl"):
        p = os.path.join(d, f)
        for line in open(p) if os.path.exists(p) else []:
            if line.startswith("{"):
                r = json.loads(line)
                key = (r["op"], r["impl"], r.get("dtype"), r["bytes"], r.get("tokens"), r.get("topk"), r["graph"])
                got[key] = r["time_us"]
    return got
for pes in pes_list:
    base = rows(os.path.join(out, f"{bundles[0]}-{pes}"))
    for name in bundles[1:]:
        other = rows(os.path.join(out, f"{name}-{pes}"))
        common = [k for k in base if k in other and k[1].startswith("shmem")]
        if not common:
            continue
        ratios = sorted((other[k] / base[k], k) for k in common)
        print(f"# {pes} PEs: {name} / {bundles[0]} over {len(common)} shmem rows: "
              f"median {statistics.median(r for r, _ in ratios):.3f}, min {ratios[0][0]:.3f}, max {ratios[-1][0]:.3f}")
        for r, k in ratios[:5] + ratios[-5:]:
            print(f"  {r:.3f} {k}: {base[k]:.2f} -> {other[k]:.2f} µs")
EOF
cat "$out/compare.txt"
exit $failed
