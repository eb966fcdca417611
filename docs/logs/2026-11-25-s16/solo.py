"""Session 16 run 1: a team of one through shmem's kernels (kern) and
through a copy engine (ce), NCCL beside, medians of the two repetitions'
times per (op, dtype, bytes, graph). Usage: python3 solo.py RUN_DIR"""
import json, sys, statistics, collections, glob, os

d = sys.argv[1]
t = collections.defaultdict(list)
for f in glob.glob(os.path.join(d, "pe1-*.jsonl")):
    v = os.path.basename(f)[4:-7].rstrip("0123456789")
    for l in open(f):
        r = json.loads(l)
        impl = r["impl"] if r["impl"] != "shmem" else "shmem-" + v
        t[(r["op"], r["dtype"], r["graph"], r["bytes"], impl)].append(r["time_us"])
keys = sorted({k[:4] for k in t})
print("| op | dtype | graph | bytes | kernels µs | copy engine µs | NCCL µs | kernels / ce | NCCL / ce |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
for k in keys:
    m = {i: statistics.median(t[k + (i,)]) for i in ("shmem-kern", "shmem-ce", "nccl") if t.get(k + (i,))}
    if "shmem-kern" not in m or "shmem-ce" not in m:
        continue
    n = m.get("nccl")
    print(f"| {k[0]} | {k[1]} | {'graph' if k[2] else 'eager'} | {k[3]} | {m['shmem-kern']:.2f} | {m['shmem-ce']:.2f} | "
          + (f"{n:.2f}" if n else "-") + f" | {m['shmem-kern'] / m['shmem-ce']:.2f} | "
          + (f"{n / m['shmem-ce']:.2f}" if n else "-") + " |")
