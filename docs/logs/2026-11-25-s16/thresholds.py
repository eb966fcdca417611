"""Session 16 run 4: per (op, dtype, bytes), the median over three rounds of
the default, the kernels alone, the copy engine alone and NCCL (NCCL: every
file's row). Usage: python3 thresholds.py RUN_DIR"""
import json, sys, glob, os, collections, statistics

t = collections.defaultdict(list)
for f in glob.glob(os.path.join(sys.argv[1], "pe1-*.jsonl")):
    v = os.path.basename(f)[4:-7].rstrip("0123456789")
    for l in open(f):
        r = json.loads(l)
        t[(r["op"], r["dtype"], r["bytes"], v if r["impl"] == "shmem" else "nccl")].append(r["time_us"])
print("| op | dtype | bytes | default | kernels | copy engine | NCCL | NCCL / default |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for k in sorted({k[:3] for k in t}):
    m = {v: statistics.median(t[k + (v,)]) for v in ("default", "kern", "ce", "nccl")}
    print(f"| {k[0]} | {k[1]} | {k[2] >> 10} KiB | {m['default']:.2f} | {m['kern']:.2f} | {m['ce']:.2f} | "
          f"{m['nccl']:.2f} | {m['nccl'] / m['default']:.2f} |")
