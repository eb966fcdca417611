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

Where the rows hold PyTorch SymmMem's all-reduce (ci/torch_symm_bench.py's
`torch-oneshot` and `torch-twoshot`, gpu-run.sh --bench's torch-symm.jsonl),
the all-reduce tables get a PyTorch column beside NCCL in each mode, the
faster of the two at that size (marked 1 or 2), and "PyTorch / shmem".

    python3 ci/perf_tables.py --self-test    # made-up rows, no GPU
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from targets import KIB, MIB, fmt_bytes, load  # noqa: E402  (beside this script, here and in the bundle)

SIZES = [8, 256, 4 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]
COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"]
MOE_OPS = ["dispatch", "combine", "all_to_all_v"]
# PyTorch SymmMem's all-reduce (ci/torch_symm_bench.py), by its mark in the tables.
TORCH_IMPLS = {"torch-oneshot": "1", "torch-twoshot": "2"}
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


def fastest_torch(rows, **k):
    """PyTorch SymmMem's faster row (one-shot or two-shot) of these fields."""
    got = [r for i in TORCH_IMPLS for r in [find(rows, impl=i, **k)] if r]
    return min(got, key=lambda r: r["time_us"]) if got else None


def torch_cell(r):
    return f"{r['time_us']:.2f} ({TORCH_IMPLS[r['impl']]})" if r else "—"


def collective_table(rows, op, dtype, pes):
    mine = [r for r in rows if r["op"] == op and r.get("dtype") == dtype and r["pes"] == pes]
    if not mine:
        return
    busbw = op in ("all_reduce", "reduce_scatter", "all_gather")
    nvshmem = any(r["impl"] == "nvshmem" for r in mine)
    pt = any(r["impl"] in TORCH_IMPLS for r in mine)
    print(f"#### {op.replace('_', '-')}, {dtype}, {pes} PEs\n")
    if pt:
        print("PyTorch: SymmMem's faster all-reduce at that size, one-shot (1) or two-shot (2) "
              "(ci/torch_symm_bench.py).\n")
    torch_head = " PyTorch | PyTorch / shmem |" * pt
    head = (f"| bytes | graph: shmem | NCCL | NCCL / shmem |{torch_head} eager: shmem | NCCL | NCCL / shmem |"
            f"{torch_head}")
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
        tg, te = fastest_torch(mine, graph=True, **k), fastest_torch(mine, graph=False, **k)
        line = (f"| {fmt_bytes(b)} | {cell(sg)} | {cell(ng)} | {ratio(sg, ng)} |"
                + f" {torch_cell(tg)} | {ratio(sg, tg)} |" * pt
                + f" {cell(se)} | {cell(ne)} | {ratio(se, ne)} |"
                + f" {torch_cell(te)} | {ratio(se, te)} |" * pt) + f" {cell(nv)} |" * nvshmem
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
    if any(r.get("dtype") == "e4m3" for r in mine):
        # shmem-bench --fp8: the FP8 dispatch's logical bytes are the bf16 tokens delivered.
        print("e4m3: the FP8 dispatch of the bf16 tokens; its logical GB/s counts them as bf16, as the bf16 rows do.\n")
    # shmem-bench --impl shmem-lines: the layer's exchange form beside the automatic one.
    exchange = any(r["impl"] == "shmem-lines" for r in mine)
    extra = (" exchange form |", "---|") if exchange else ("", "")
    print(f"| op | dtype | tokens | top-k | layer |{extra[0]} 2D | NCCL | NCCL / layer | link bytes/PE "
          "| logical GB/s (DeepEP) |")
    print(f"|---|---|---|---|---|{extra[1]}---|---|---|---|---|")
    keys = sorted({(LAYER_OPS.index(r["op"]), r["op"], r.get("dtype"), r.get("tokens"), r.get("topk")) for r in mine})
    for _, op, dtype, tokens, topk in keys:
        k = dict(pes=pes, dtype=dtype, tokens=tokens, topk=topk, hidden=hidden)
        # Graph rows where measured, else eager ones.
        graph = find(mine, op=op, impl="shmem", graph=True, **k) is not None
        lr = find(mine, op=op, impl="shmem", graph=graph, **k)
        base = op[len("layer_"):]
        sr, nr = find(rows, op=base, impl="shmem", graph=graph, **k), find(rows, op=base, impl="nccl", graph=graph, **k)
        gbps = f"{lr['logical_gbps']:.1f}" if lr.get("logical_gbps") is not None else "—"
        xr = f" {cell(find(mine, op=op, impl='shmem-lines', graph=graph, **k))} |" if exchange else ""
        print(f"| {op}{'' if graph else ' (eager)'} | {dtype} | {tokens} | {topk} | {cell(lr)} |{xr} {cell(sr)} "
              f"| {cell(nr)} | {ratio(lr, nr)} | {lr.get('link_bytes', '—')} | {gbps} |")
    print()


def tables(rows):
    for pes in sorted({r["pes"] for r in rows}):
        for op in COLLECTIVES:
            for dtype in sorted({r.get("dtype") for r in rows if r["op"] == op and r["pes"] == pes}):
                collective_table(rows, op, dtype, pes)
        moe_table(rows, pes)
        layer_table(rows, pes)


def self_test():
    """The tables of made-up rows, with and without PyTorch's."""
    import contextlib
    import io

    def row(impl, b, graph, t, op="all_reduce"):
        return {"op": op, "impl": impl, "dtype": "bf16", "bytes": b, "pes": 2, "graph": graph, "time_us": t,
                "busbw_gbps": b / (t * 1e3), "file": "bench.jsonl"}

    ours = []
    for b in SIZES:
        for graph in (True, False):
            ours += [row("shmem", b, graph, 2.0 + b / 3e5), row("nccl", b, graph, 6.0 + b / 3e5)]
            ours.append(row("shmem", b, graph, 3.0 + b / 3e5, op="all_gather"))
    torch_rows = []
    for b in SIZES:
        for graph in (True, False):
            torch_rows += [row("torch-oneshot", b, graph, 4.0 + b / 1e5), row("torch-twoshot", b, graph, 8.0 + b / 3e5)]

    def text(rows):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            tables(rows)
        return out.getvalue()

    plain, with_torch = text(ours), text(ours + torch_rows)
    old_head = "| bytes | graph: shmem | NCCL | NCCL / shmem | eager: shmem | NCCL | NCCL / shmem | busbw GB/s |"
    assert old_head in plain and "PyTorch" not in plain, plain
    new_head = ("| bytes | graph: shmem | NCCL | NCCL / shmem | PyTorch | PyTorch / shmem | eager: shmem | NCCL "
                "| NCCL / shmem | PyTorch | PyTorch / shmem | busbw GB/s |")
    assert new_head in with_torch, with_torch
    # 8 B: one-shot (4.00) is the faster; 256 MiB: two-shot.
    assert "| 8 B | 2.00 | 6.00 | 3.00 | 4.00 (1) | 2.00 |" in with_torch, with_torch
    assert "(2) |" in with_torch.split("256 MiB")[1].splitlines()[0], with_torch
    # The other collectives' tables are as before.
    ag = [t for t in with_torch.split("#### ") if t.startswith("all-gather")][0]
    assert "PyTorch" not in ag and ag in plain
    for t in with_torch.split("#### ")[1:]:
        lines = [x for x in t.splitlines() if x.startswith("|")]
        assert len({x.count("|") for x in lines}) == 1, t
    print(f"perf_tables: self-test passed ({len(ours)} rows of ours, {len(torch_rows)} of PyTorch)")


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        self_test()
        return
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    tables(load(sys.argv[1:]))


if __name__ == "__main__":
    main()
