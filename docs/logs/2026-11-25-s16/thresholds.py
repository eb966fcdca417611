"""Session 16 run 4: per (op, dtype, bytes), the median over three rounds of
the default, the kernels alone, the copy engine alone and NCCL (NCCL: every
file's row). Usage: python3 thresholds.py RUN_DIR"""
import sys, statistics
from solo import load

t = load(sys.argv[1])
print("| op | dtype | bytes | default | kernels | copy engine | NCCL | NCCL / default |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for k in sorted({k[:4] for k in t if not k[2]}):
    m = {v: statistics.median(t[k + (v,)]) for v in ("default", "kern", "ce", "nccl")}
    print(f"| {k[0]} | {k[1]} | {k[3] >> 10} KiB | {m['default']:.2f} | {m['kern']:.2f} | {m['ce']:.2f} | "
          f"{m['nccl']:.2f} | {m['nccl'] / m['default']:.2f} |")
