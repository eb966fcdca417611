#!/usr/bin/env python3
"""Old against new from an A/B run's bench JSON (files PREFIX-{old,new}{1,2}-SET.jsonl):
graph rows, each build's two repetitions and the ratio of their means, per (op, impl, size)."""
import collections
import glob
import json
import re
import sys

for d in sys.argv[1:]:
    rows = collections.defaultdict(dict)
    for f in sorted(glob.glob(f"{d}/pe*-*[12]-*.jsonl")):
        m = re.search(r"pe(\d+)-(old|new)(\d)-(\w+)\.jsonl$", f)
        pes, build, k, _ = m.groups()
        for r in map(json.loads, open(f)):
            if not r.get("graph"):
                continue
            size = r.get("tokens", r["bytes"])
            rows[(int(pes), r["op"], r["impl"], size)][(build, k)] = r["time_us"]
    print("pes op impl size | old1 old2 | new1 new2 | new/old")
    for key in sorted(rows):
        v = rows[key]
        o = [v.get(("old", k)) for k in "12"]
        n = [v.get(("new", k)) for k in "12"]
        if None in o or None in n:
            continue
        print(*key, "| %.2f %.2f | %.2f %.2f | %.3f" % (*o, *n, sum(n) / sum(o)))
