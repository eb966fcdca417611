"""Session 16 run 1: a team of one through shmem's kernels (kern) and
through a copy engine (ce), NCCL beside, medians of the two repetitions'
times per (op, dtype, bytes, graph). Usage: python3 solo.py RUN_DIR"""
import json, sys, statistics, collections, glob, os


def load(run_dir):
    """Every time of the run's `pe1-<setting><round>.jsonl` files, keyed by
    (op, dtype, graph, bytes, setting): shmem's rows under the file's
    setting (default, kern, ce), NCCL's under "nccl"."""
    t = collections.defaultdict(list)
    for f in glob.glob(os.path.join(run_dir, "pe1-*.jsonl")):
        v = os.path.basename(f)[4:-7].rstrip("0123456789")
        for l in open(f):
            r = json.loads(l)
            setting = v if r["impl"] == "shmem" else r["impl"]
            t[(r["op"], r["dtype"], r["graph"], r["bytes"], setting)].append(r["time_us"])
    return t


def main(run_dir):
    t = load(run_dir)
    print("| op | dtype | graph | bytes | kernels µs | copy engine µs | NCCL µs | kernels / ce | NCCL / ce |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for k in sorted({k[:4] for k in t}):
        m = {i: statistics.median(t[k + (i,)]) for i in ("kern", "ce", "nccl") if t.get(k + (i,))}
        if "kern" not in m or "ce" not in m:
            continue
        n = m.get("nccl")
        print(f"| {k[0]} | {k[1]} | {'graph' if k[2] else 'eager'} | {k[3]} | {m['kern']:.2f} | {m['ce']:.2f} | "
              + (f"{n:.2f}" if n else "-") + f" | {m['kern'] / m['ce']:.2f} | "
              + (f"{n / m['ce']:.2f}" if n else "-") + " |")


if __name__ == "__main__":
    main(sys.argv[1])
