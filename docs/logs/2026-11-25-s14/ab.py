#!/usr/bin/env python3
"""Old against new from an A/B run's bench JSON (files PREFIX-{old,new}K-SET.jsonl,
any number of repetitions K): graph rows, each build's repetitions and the
ratio of their means, per (PEs, op, impl, size, topk)."""
import collections
import glob
import json
import re
import sys

for d in sys.argv[1:]:
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    for f in sorted(glob.glob(f"{d}/pe*-*[0-9]-*.jsonl")):
        m = re.search(r"pe(\d+)-(old|new)(\d+)-(\w+)\.jsonl$", f)
        if not m:
            continue
        pes, build, _, _ = m.groups()
        for r in map(json.loads, open(f)):
            if not r.get("graph"):
                continue
            size = r.get("tokens", r["bytes"])
            rows[(int(pes), r["op"], r["impl"], size, r.get("topk", 1))][build].append(r["time_us"])
    print("pes op impl size topk | old | new | new/old")
    for key in sorted(rows):
        o, n = rows[key]["old"], rows[key]["new"]
        if not o or not n:
            continue
        fmt = lambda v: " ".join("%.2f" % x for x in v)
        print(*key, "| %s | %s | %.3f" % (fmt(o), fmt(n), (sum(n) / len(n)) / (sum(o) / len(o))))
