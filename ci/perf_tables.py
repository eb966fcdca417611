#!/usr/bin/env python3
"""docs/perf.md's tables from shmem-bench's JSON rows.

    python3 ci/perf_tables.py DIR_OR_JSONL...

Reads every shmem-bench row (one JSON object a line) in the files given, or
in the *.jsonl files of the folders given, and prints one Markdown table
per operation family and PE count: shmem's default against NCCL (and
NVSHMEM's own collective, eager, where measured) at a fixed set of sizes,
graph-replayed up to the bench's `--graph-max-bytes` and eager throughout;
then the MoE all-to-all-v by tokens, and the MoE layer by tokens beside
the 2D ops and NCCL of the same file. Times are the bench's medians in µs;
"NCCL / shmem" above 1 means shmem is faster.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from targets import KIB, MIB, fmt_bytes, load  # noqa: E402  (beside this script, here and in the bundle)

SIZES = [8, 256, 4 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]
COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"]
MOE_OPS = ["dispatch", "combine", "all_to_all_v"]
LAYER_OPS = ["layer_dispatch", "layer_combine"]


def find(rows, **want):
    for r in rows:
        if all(r.get(k) == v for k, v in want.items()):
            return r
    return None


def cell(r):
    return f"{r['time_us']:.2f}" if r else "—"


def ratio(ours, theirs):
    return f"{theirs['time_us'] / ours['time_us']:.2f}" if ours and theirs else "—"


def collective_table(rows, op, dtype, pes):
    mine = [r for r in rows if r["op"] == op and r.get("dtype") == dtype and r["pes"] == pes]
    if not mine:
        return
    busbw = op in ("all_reduce", "reduce_scatter", "all_gather")
    nvshmem = any(r["impl"] == "nvshmem" for r in mine)
    print(f"#### {op.replace('_', '-')}, {dtype}, {pes} PEs\n")
    head = "| bytes | graph: shmem | NCCL | NCCL / shmem | eager: shmem | NCCL | NCCL / shmem |"
    head += " NVSHMEM |" * nvshmem + " busbw GB/s |" * busbw
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for b in SIZES:
        k = dict(op=op, dtype=dtype, pes=pes, bytes=b)
        sg, ng = find(mine, impl="shmem", graph=True, **k), find(mine, impl="nccl", graph=True, **k)
        se, ne = find(mine, impl="shmem", graph=False, **k), find(mine, impl="nccl", graph=False, **k)
        nv = find(mine, impl="nvshmem", graph=False, **k)
        if not (sg or se):
            continue
        line = (f"| {fmt_bytes(b)} | {cell(sg)} | {cell(ng)} | {ratio(sg, ng)} "
                f"| {cell(se)} | {cell(ne)} | {ratio(se, ne)} |") + f" {cell(nv)} |" * nvshmem
        if busbw:
            best = min((x for x in (sg, se) if x), key=lambda x: x["time_us"])
            line += f" {best['busbw_gbps']:.1f} |"
        print(line)
    print()


def moe_table(rows, pes):
    mine = [r for r in rows if r["op"] in MOE_OPS and r["pes"] == pes]
    if not mine:
        return
    hidden = mine[0].get("hidden")
    print(f"#### MoE all-to-all-v, bf16, hidden {hidden}, {pes} PEs\n")
    print("| op | tokens | top-k | graph: shmem | NCCL | NCCL / shmem | eager: shmem | NCCL | NCCL / shmem |")
    print("|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(MOE_OPS.index(r["op"]), r["op"], r.get("tokens"), r.get("topk")) for r in mine})
    for _, op, tokens, topk in keys:
        k = dict(op=op, pes=pes, tokens=tokens, topk=topk)
        sg, ng = find(mine, impl="shmem", graph=True, **k), find(mine, impl="nccl", graph=True, **k)
        se, ne = find(mine, impl="shmem", graph=False, **k), find(mine, impl="nccl", graph=False, **k)
        print(f"| {op} | {tokens} | {topk} | {cell(sg)} | {cell(ng)} | {ratio(sg, ng)} "
              f"| {cell(se)} | {cell(ne)} | {ratio(se, ne)} |")
    print()


def layer_table(rows, pes):
    mine = [r for r in rows if r["op"] in LAYER_OPS and r["pes"] == pes]
    if not mine:
        return
    hidden = mine[0].get("hidden")
    print(f"#### MoE layer (deduplicated), hidden {hidden}, {pes} PEs, graph replays\n")
    print("| op | dtype | tokens | top-k | layer | 2D | NCCL | NCCL / layer | link bytes/PE | logical GB/s (DeepEP) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(LAYER_OPS.index(r["op"]), r["op"], r.get("dtype"), r.get("tokens"), r.get("topk")) for r in mine})
    for _, op, dtype, tokens, topk in keys:
        k = dict(pes=pes, dtype=dtype, tokens=tokens, topk=topk, hidden=hidden)
        # Graph rows where measured, else eager ones.
        graph = find(mine, op=op, impl="shmem", graph=True, **k) is not None
        lr = find(mine, op=op, impl="shmem", graph=graph, **k)
        base = op[len("layer_"):]
        sr, nr = find(rows, op=base, impl="shmem", graph=graph, **k), find(rows, op=base, impl="nccl", graph=graph, **k)
        gbps = f"{lr['logical_gbps']:.1f}" if lr.get("logical_gbps") is not None else "—"
        print(f"| {op}{'' if graph else ' (eager)'} | {dtype} | {tokens} | {topk} | {cell(lr)} | {cell(sr)} | {cell(nr)} "
              f"| {ratio(lr, nr)} | {lr.get('link_bytes', '—')} | {gbps} |")
    print()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = load(sys.argv[1:])
    for pes in sorted({r["pes"] for r in rows}):
        for op in COLLECTIVES:
            for dtype in sorted({r.get("dtype") for r in rows if r["op"] == op and r["pes"] == pes}):
                collective_table(rows, op, dtype, pes)
        moe_table(rows, pes)
        layer_table(rows, pes)


if __name__ == "__main__":
    main()
