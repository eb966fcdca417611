#!/usr/bin/env python3
"""Medians of the phase stamps (kernels/core/phases.cuh) in bench logs.

Usage: phases.py LOG...  For each log and kernel, the samples split into the
eager ones and the graph ones (the bench runs eager first; the last
`--graph-samples` are the graph replays'), each phase's median in ns.
"""
import argparse
import collections
import statistics

ap = argparse.ArgumentParser()
ap.add_argument("logs", nargs="+")
ap.add_argument("--graph-samples", type=int, default=12)
args = ap.parse_args()
for log in args.logs:
    samples = collections.defaultdict(lambda: collections.defaultdict(dict))
    order = collections.defaultdict(list)
    for line in open(log, errors="replace"):
        f = line.split()
        # `shmemrun --tag-output`: PE 0's only.
        if f and f[0].startswith("["):
            if f[0] != "[0]":
                continue
            f = f[1:]
        if len(f) != 5 or f[0] != "phase":
            continue
        _, kernel, sample, name, ns = f
        # A name stamped again in one launch (a phase in a loop): name#2, #3...
        seen = samples[kernel][int(sample)]
        base, k = name, 1
        while name in seen:
            k += 1
            name = f"{base}#{k}"
        seen[name] = int(ns)
        if name not in order[kernel]:
            order[kernel].append(name)
    for kernel, by in samples.items():
        keys = sorted(by)
        parts = {"graph": keys[-args.graph_samples:], "eager": keys[: -args.graph_samples]}
        print(f"{log}: {kernel}")
        for mode, ks in parts.items():
            if not ks:
                continue
            row = []
            for name in order[kernel]:
                vals = [by[k][name] for k in ks if name in by[k]]
                if vals:
                    row.append(f"{name} {statistics.median(vals):.0f}")
            print(f"  {mode} ({len(ks)}): " + ", ".join(row))
