#!/usr/bin/env python3
"""Run 3's block sweep (files peP-bbSIZE-K.jsonl): graph rows, the mean of
the repetitions per (PEs, op, impl, tokens) and --moe-block-bytes."""
import collections
import glob
import json
import sys

sizes = ["32K", "16K", "8K", "4K", "2K"]
for d in sys.argv[1:]:
    rows = collections.defaultdict(list)
    for f in sorted(glob.glob(f"{d}/pe*-bb*-*.jsonl")):
        pe, bb, _ = f.split("/")[-1][: -len(".jsonl")].split("-")
        for r in map(json.loads, open(f)):
            if r.get("graph"):
                rows[(int(pe[2:]), r["op"], r["impl"], r["tokens"], bb[2:])].append(r["time_us"])
    print("pes op impl tokens |", " ".join(sizes))
    for key in sorted({k[:4] for k in rows}):
        cells = [rows.get(key + (b,)) for b in sizes]
        print(*key, "|", " ".join("%6.2f" % (sum(c) / len(c)) if c else "     -" for c in cells))
