#!/usr/bin/env python3
"""shmem's performance targets against a GPU run's benchmark rows.

    python3 ci/targets.py DIR_OR_JSONL...

Reads every shmem-bench JSON row (one object a line) in the files given, or
in the *.jsonl files of the folders given (gpu-run.sh's --bench, --moe and
--tune write them under $OUT), keeps the rows of the most PEs measured, and
prints:

- each target (the collectives' latency and bandwidth, the MoE exchange's
  time), met or missed, with the row that decides it and NCCL's time from
  the same file where it ran;
- the four-GPU targets (issue 33, judged at 4 PEs: the all-reduce of 8 B,
  1 MiB and 16 MiB, its busbw at 256 MiB, the MoE ops at 1 token top-8,
  the dispatch of 128 tokens top-8 and of 4096 tokens top-1);
- the MoE layer's targets (issue 34, set for 4 PEs: graph-replayed bf16,
  hidden 7168, top-8: 128 tokens dispatch ≤ 20 µs and combine ≤ 25 µs,
  1 token ≤ 6 µs each), with the 2D op's and NCCL's time beside;
- the FP8 dispatch's target (issue 34): at 4096 tokens, top-8, hidden
  7168, `layer_dispatch` of dtype e4m3 (shmem-bench --fp8) at least 1.6×
  the logical GB/s of the bf16 one in the same file (both count the bf16
  tokens delivered, so this is the bf16 time over the FP8 time), graph
  rows where both have one, else eager; judged at any PE count above 1;
- the sizes where shmem's default is slower than NCCL in the same file;
- where the rows hold PyTorch SymmMem's all-reduce (ci/torch_symm_bench.py,
  gpu-run.sh --bench's torch-symm.jsonl: `torch-oneshot`, `torch-twoshot`),
  its faster time beside each target's row, and the sizes where shmem's
  default is slower than it in the same run;
- from the tuning sweep (tune-*.jsonl), the fastest setting at each size,
  and what the two defaults that wait for a two-GPU run would be:
  `Tuning::low_latency_lines_min_bytes` (the smallest all-reduce size from
  which the 128-byte lines beat the default at every larger size measured)
  and `Tuning::moe_lines_max_bytes` (the largest input at which the MoE
  line kernel beats the one kernel, with every smaller one).

Times are medians in µs as shmem-bench reports them; graph rows where both
exist, as the targets were set on graph replays (the bandwidth targets on
the faster of the two). Nothing is averaged across files: each row names
its file.

    python3 ci/targets.py --self-test    # made-up rows, no GPU
"""
import collections
import glob
import json
import os
import sys

KIB, MIB = 1 << 10, 1 << 20
ROW_BYTES = 7168 * 2  # the MoE rows of the targets: 7168 bf16
# PyTorch SymmMem's all-reduce (ci/torch_symm_bench.py), in its own file.
TORCH_IMPLS = ("torch-oneshot", "torch-twoshot")


def load(paths):
    rows = []
    for p in paths:
        files = sorted(glob.glob(os.path.join(p, "*.jsonl"))) if os.path.isdir(p) else [p]
        for f in files:
            for line in open(f):
                line = line.strip()
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                if "time_us" in r and "op" in r:
                    r["file"] = os.path.basename(f)
                    rows.append(r)
    return rows


def fmt_bytes(b):
    for unit, size in (("MiB", MIB), ("KiB", KIB)):
        if b >= size and b % size == 0:
            return f"{b // size} {unit}"
    return f"{b} B"


class Rows:
    def __init__(self, rows):
        self.rows = rows

    def pick(self, file=None, **want):
        """Rows with these fields, from `file` (a name prefix) if given."""
        out = []
        for r in self.rows:
            if file is not None and not r["file"].startswith(file):
                continue
            if all(r.get(k) == v for k, v in want.items()):
                out.append(r)
        return out

    def best(self, tuned=False, **want):
        """The fastest graph row with these fields (else the fastest eager
        one): of the defaults' files (every file but the tuning sweep's
        settings other than its `-default` rows), or with `tuned` of every
        file and every shmem form (`impl` shmem-ll128, shmem-lines, …)."""
        if tuned and want.get("impl") == "shmem":
            want = {k: v for k, v in want.items() if k != "impl"}
            rows = [r for r in self.pick(**want) if r["impl"].startswith("shmem")]
        else:
            rows = [r for r in self.pick(**want) if tuned or is_default(r)]
        graph = [r for r in rows if r.get("graph")]
        rows = graph or rows
        return min(rows, key=lambda r: r["time_us"]) if rows else None

    def beside(self, r, impl="nccl"):
        """The same measurement by `impl` from r's file."""
        same = self.pick(file=r["file"], op=r["op"], impl=impl, bytes=r["bytes"], graph=r.get("graph"))
        same = [x for x in same if x.get("dtype") == r.get("dtype") and x.get("tokens") == r.get("tokens")]
        return same[0] if same else None

    def torch_beside(self, r):
        """PyTorch SymmMem's faster row of r's measurement (op, dtype,
        size, mode, PEs), from any file: ci/torch_symm_bench.py writes its own."""
        same = [x for x in self.rows if x["impl"] in TORCH_IMPLS and x["op"] == r["op"] and x["bytes"] == r["bytes"]
                and x.get("graph") == r.get("graph") and x.get("dtype") == r.get("dtype")
                and x.get("pes") == r.get("pes")]
        return min(same, key=lambda x: x["time_us"]) if same else None


def is_default(r):
    """Whether a row is of shmem's default settings (gpu-run.sh's tune-*
    files other than tune-*-default set a knob)."""
    f = r["file"]
    return not f.startswith("tune-") or "-default" in f


def describe(rs, r):
    if r is None:
        return "not measured"
    mode = "graph" if r.get("graph") else "eager"
    s = f"{r['time_us']:.2f} µs ({r['impl']}, {mode}, {r['file']})"
    n = rs.beside(r)
    if n is not None:
        s += f"; NCCL {n['time_us']:.2f} µs"
    t = rs.torch_beside(r)
    if t is not None:
        s += f"; PyTorch {t['time_us']:.2f} µs ({t['impl']})"
    return s


def with_tuned(rs, r, **want):
    """`describe` of r, and of the fastest row of any shmem form or
    tuning setting where it is faster."""
    s = describe(rs, r)
    t = rs.best(tuned=True, **want)
    if t is not None and (r is None or t["time_us"] < r["time_us"]):
        s += f" (fastest shmem form or setting: {t['time_us']:.2f} µs, {t['impl']}, {t['file']})"
    return s


def verdict(ok):
    return "met" if ok else "MISSED"


def targets(rs, pes):
    print(f"# Targets at {pes} PEs\n")
    lines = []
    # The collectives: all-reduce bf16.
    ar = dict(op="all_reduce", impl="shmem", dtype="bf16", pes=pes)
    small = [rs.best(bytes=b, **ar) for b in sorted({r["bytes"] for r in rs.pick(**ar) if r["bytes"] <= 4 * KIB})]
    small = [r for r in small if r is not None]
    if small:
        worst = max(small, key=lambda r: r["time_us"])
        lines.append(("all-reduce ≤ 3 µs at ≤ 4 KiB", worst["time_us"] <= 3.0, f"slowest size {fmt_bytes(worst['bytes'])}: " + describe(rs, worst)))
    else:
        lines.append(("all-reduce ≤ 3 µs at ≤ 4 KiB", None, "not measured"))
    r = rs.best(bytes=MIB, **ar)
    lines.append(("all-reduce ≤ 6 µs at 1 MiB", r and r["time_us"] <= 6.0, with_tuned(rs, r, bytes=MIB, **ar)))
    big = rs.pick(bytes=256 * MIB, **ar)
    # The fastest row has the highest busbw; at 1 PE every busbw is 0
    # (the (n - 1) / n of nothing sent), so the time alone is shown.
    r = min(big, key=lambda x: x["time_us"]) if big else None
    if r is None:
        what = "not measured"
    else:
        what = (f"{r['busbw_gbps']:.1f} GB/s, " if pes > 1 else "no busbw at 1 PE, ") + describe(rs, r)
    lines.append(("all-reduce ≥ 360 GB/s busbw at 256 MiB", r and r["busbw_gbps"] >= 360.0, what))
    # All-gather of 256 MiB per rank: `bytes` is the whole output.
    ag = [x for x in rs.pick(op="all_gather", impl="shmem", pes=pes)]
    want = [x for x in ag if x["bytes"] == pes * 256 * MIB]
    if want:
        r = min(want, key=lambda x: x["time_us"])
        lines.append(("all-gather of 256 MiB a rank ≤ 760 µs", r["time_us"] <= 760.0, describe(rs, r)))
    elif ag:
        r = max(ag, key=lambda x: (x["bytes"], -x["time_us"]))
        scaled = r["time_us"] * pes * 256 * MIB / r["bytes"]
        lines.append(("all-gather of 256 MiB a rank ≤ 760 µs", None,
                      f"not measured; the largest, {fmt_bytes(r['bytes'] // pes)} a rank: {describe(rs, r)} "
                      f"(scaled by bytes: about {scaled:.0f} µs)"))
    else:
        lines.append(("all-gather of 256 MiB a rank ≤ 760 µs", None, "not measured"))
    # The MoE exchange: dispatch of 4096 and 128 tokens, combine within 10 %.
    for tokens, limit in ((4096, 95.0), (128, 10.0)):
        want = dict(op="dispatch", impl="shmem", tokens=tokens, pes=pes, topk=1)
        d = rs.best(**want)
        lines.append((f"MoE dispatch of {tokens} tokens ≤ {limit:g} µs", d and d["time_us"] <= limit,
                      with_tuned(rs, d, **want)))
        dl = rs.best(tuned=True, op="dispatch", impl="shmem-lines", tokens=tokens, pes=pes, topk=1)
        if dl is not None:
            lines.append((f"MoE dispatch of {tokens} tokens ≤ {limit:g} µs in the line kernel (asked for)",
                          dl["time_us"] <= limit, describe(rs, dl)))
        c = rs.best(op="combine", impl="shmem", tokens=tokens, pes=pes, topk=1)
        if d is not None and c is not None:
            lines.append((f"MoE combine of {tokens} tokens within 10 % of dispatch", c["time_us"] <= 1.1 * d["time_us"],
                          f"{c['time_us']:.2f} against {d['time_us']:.2f} µs ({c['time_us'] / d['time_us']:.2f}×)"))
    if pes != 2:
        print(f"(The targets are set for 2 PEs on two GPUs: these rows, of {pes} PE(s), get no verdict.)\n")
    for name, ok, what in lines:
        mark = "-" if ok is None or pes != 2 else verdict(ok)
        print(f"- {name}: {mark}: {what}")


LAYER_TARGETS = (("layer_dispatch", 128, 20.0), ("layer_combine", 128, 25.0),
                 ("layer_dispatch", 1, 6.0), ("layer_combine", 1, 6.0))
LAYER_PES = 4


def layer_targets(rs, pes):
    """The MoE layer's targets: graph rows of shmem's default, bf16, hidden
    7168, top-8; judged at LAYER_PES only."""
    print(f"\n# MoE layer targets at {pes} PEs (set for {LAYER_PES})\n")
    for op, tokens, limit in LAYER_TARGETS:
        want = dict(op=op, impl="shmem", dtype="bf16", hidden=7168, topk=8, tokens=tokens, pes=pes, graph=True)
        got = rs.pick(**want)
        r = min(got, key=lambda x: x["time_us"]) if got else None
        name = f"{op} of {tokens} token{'s' * (tokens != 1)}, top-8, graph ≤ {limit:g} µs"
        if r is None:
            print(f"- {name}: -: not measured")
            continue
        what = f"{r['time_us']:.2f} µs ({r['file']})"
        if r.get("logical_gbps") is not None:
            what += f", {r['logical_gbps']:.1f} GB/s as DeepEP counts, {r.get('link_bytes')} B on the link"
        base = op[len("layer_"):]
        for impl, label in (("shmem", "2D"), ("nccl", "NCCL")):
            same = [x for x in rs.pick(file=r["file"], op=base, impl=impl, dtype="bf16", graph=True, tokens=tokens, topk=8)
                    if x.get("hidden") == 7168]
            if same:
                what += f"; {label} {same[0]['time_us']:.2f} µs"
        mark = verdict(r["time_us"] <= limit) if pes == LAYER_PES else "-"
        print(f"- {name}: {mark}: {what}")


FOUR_PES = 4


def four_gpu_targets(rs, pes):
    """The four-GPU targets (issue 33): bf16, the MoE rows of hidden 7168;
    each the fastest graph row of shmem's default where the bench replays
    that size, else the fastest eager one; judged at FOUR_PES only."""
    print(f"\n# Four-GPU targets at {pes} PEs (set for {FOUR_PES})\n")
    ar = dict(op="all_reduce", impl="shmem", dtype="bf16", pes=pes)

    def moe(op, tokens, topk):
        return dict(op=op, impl="shmem", dtype="bf16", hidden=7168, tokens=tokens, topk=topk, pes=pes)

    for name, want, limit in (
        ("all-reduce of 8 B ≤ 3 µs", dict(bytes=8, **ar), 3.0),
        ("all-reduce of 1 MiB ≤ 8 µs", dict(bytes=MIB, **ar), 8.0),
        ("all-reduce of 16 MiB ≤ 72 µs", dict(bytes=16 * MIB, **ar), 72.0),
        ("MoE dispatch of 1 token, top-8, ≤ 6 µs", moe("dispatch", 1, 8), 6.0),
        ("MoE combine of 1 token, top-8, ≤ 6 µs", moe("combine", 1, 8), 6.0),
        ("1D all_to_all_v of 1 token, top-8, ≤ 6 µs", moe("all_to_all_v", 1, 8), 6.0),
        ("MoE dispatch of 128 tokens, top-8, ≤ 30 µs", moe("dispatch", 128, 8), 30.0),
        ("MoE dispatch of 4096 tokens, top-1, ≤ 115 µs", moe("dispatch", 4096, 1), 115.0),
    ):
        r = rs.best(**want)
        mark = "-" if r is None or pes != FOUR_PES else verdict(r["time_us"] <= limit)
        print(f"- {name}: {mark}: {describe(rs, r)}")
    big = rs.pick(bytes=256 * MIB, **ar)
    r = min(big, key=lambda x: x["time_us"]) if big else None
    name = "all-reduce of 256 MiB ≥ 360 GB/s busbw"
    if r is None:
        print(f"- {name}: -: not measured")
    else:
        mark = verdict(r["busbw_gbps"] >= 360.0) if pes == FOUR_PES else "-"
        print(f"- {name}: {mark}: {r['busbw_gbps']:.1f} GB/s, {describe(rs, r)}")


FP8_TOKENS, FP8_RATIO = 4096, 1.6


def fp8_target(rs, pes):
    """The FP8 dispatch against the bf16 one: logical GB/s, same file,
    same timing mode (graph where both have one)."""
    name = f"FP8 layer_dispatch of {FP8_TOKENS} tokens, top-8, ≥ {FP8_RATIO:g}× the bf16 one's logical GB/s"
    want = dict(op="layer_dispatch", impl="shmem", hidden=7168, topk=8, tokens=FP8_TOKENS, pes=pes)
    pairs = []
    for f in rs.pick(dtype="e4m3", **want):
        same = [b for b in rs.pick(file=f["file"], dtype="bf16", graph=f.get("graph"), **want)]
        if same and f.get("logical_gbps") and same[0].get("logical_gbps"):
            pairs.append((f, min(same, key=lambda b: b["time_us"])))
    if not pairs:
        print(f"- {name}: -: not measured")
        return
    graph = [p for p in pairs if p[0].get("graph")]
    f, b = max(graph or pairs, key=lambda p: p[0]["logical_gbps"] / p[1]["logical_gbps"])
    ratio = f["logical_gbps"] / b["logical_gbps"]
    mode = "graph" if f.get("graph") else "eager"
    what = (f"{ratio:.2f}×: {f['logical_gbps']:.1f} against {b['logical_gbps']:.1f} GB/s ({f['time_us']:.2f} against "
            f"{b['time_us']:.2f} µs, {mode}, {f['file']}; {f.get('link_bytes')} against {b.get('link_bytes')} B on the link)")
    mark = verdict(ratio >= FP8_RATIO) if pes > 1 else "-"
    print(f"- {name}: {mark}: {what}")


def against_nccl(rs, pes):
    """Sizes where shmem's default is slower than NCCL in the same file."""
    slower, total = [], 0
    for r in filter(is_default, rs.pick(impl="shmem", pes=pes)):
        n = rs.beside(r)
        if n is None:
            continue
        total += 1
        if r["time_us"] > n["time_us"]:
            slower.append((r, n))
    print(f"\n# shmem's default against NCCL in the same run: {total - len(slower)} of {total} at least as fast\n")
    for r, n in sorted(slower, key=lambda x: (x[0]["op"], x[0].get("dtype", ""), x[0]["bytes"])):
        mode = "graph" if r.get("graph") else "eager"
        size = f"{r['tokens']} tokens" if "tokens" in r else fmt_bytes(r["bytes"])
        print(f"- {r['op']} {r.get('dtype', '')} {size} {mode}: {r['time_us']:.2f} against {n['time_us']:.2f} µs "
              f"({n['time_us'] / r['time_us']:.2f}×, {r['file']})")


def against_torch(rs, pes):
    """Sizes where shmem's default is slower than PyTorch SymmMem's faster
    all-reduce in the same run (only where there are PyTorch rows)."""
    if not rs.pick(pes=pes, impl=TORCH_IMPLS[0]) and not rs.pick(pes=pes, impl=TORCH_IMPLS[1]):
        return
    slower, total = [], 0
    for r in filter(is_default, rs.pick(impl="shmem", pes=pes)):
        t = rs.torch_beside(r)
        if t is None:
            continue
        total += 1
        if r["time_us"] > t["time_us"]:
            slower.append((r, t))
    print(f"\n# shmem's default against PyTorch SymmMem (the faster of one-shot and two-shot) in the same run: "
          f"{total - len(slower)} of {total} at least as fast\n")
    for r, t in sorted(slower, key=lambda x: (x[0]["op"], x[0].get("dtype", ""), x[0]["bytes"], x[0].get("graph"))):
        mode = "graph" if r.get("graph") else "eager"
        print(f"- {r['op']} {r.get('dtype', '')} {fmt_bytes(r['bytes'])} {mode}: {r['time_us']:.2f} against "
              f"{t['time_us']:.2f} µs ({t['impl']}, {t['time_us'] / r['time_us']:.2f}×, {r['file']})")


def tuning(rs, pes):
    tune = [r for r in rs.rows if r["file"].startswith("tune-") and r.get("pes") == pes and r.get("graph")]
    if not tune:
        return
    print("\n# Tuning sweep (graph replays): the fastest setting at each size\n")
    by = collections.defaultdict(list)
    for r in tune:
        if r["impl"] == "nccl":
            continue
        setting = r["file"][len("tune-"):-len(".jsonl")] + ("" if r["impl"] == "shmem" else f" ({r['impl']})")
        size = r.get("tokens", r["bytes"])
        by[(r["op"], r.get("dtype"), size)].append((r["time_us"], setting))
    for (op, dtype, size), got in sorted(by.items()):
        got.sort()
        label = f"{size} tokens" if op == "dispatch" else fmt_bytes(size)
        rest = ", ".join(f"{s} {t:.2f}" for t, s in got[1:4])
        print(f"- {op} {dtype} {label}: {got[0][1]} {got[0][0]:.2f} µs" + (f" (then {rest})" if rest else ""))

    # Tuning::low_latency_lines_min_bytes: the all-reduce in lines against
    # the default, size by size.
    def times(file_prefix, op, impl, key="bytes"):
        """The fastest time at each size (`key`) of these rows."""
        out = {}
        for r in tune:
            if r["file"].startswith(file_prefix) and r["op"] == op and r["impl"] == impl:
                out[r[key]] = min(out.get(r[key], 1e30), r["time_us"])
        return out

    default = times("tune-ar-default", "all_reduce", "shmem")
    lines = times("tune-ar-ll128", "all_reduce", "shmem-ll128")
    sizes = sorted(set(default) & set(lines))
    if sizes:
        from_size = None
        for b in reversed(sizes):
            if lines[b] < default[b]:
                from_size = b
            else:
                break
        said = fmt_bytes(from_size) if from_size is not None else "never (the lines are slower at the largest size)"
        print(f"\nTuning::low_latency_lines_min_bytes, by these rows: {said}")
    # Tuning::moe_lines_max_bytes: the line kernel against the one kernel.
    one = times("tune-moe-default", "dispatch", "shmem", key="tokens")
    lin = times("tune-moe-lines.", "dispatch", "shmem-lines", key="tokens")
    toks = sorted(set(one) & set(lin))
    if toks:
        upto = None
        for t in toks:
            if lin[t] < one[t]:
                upto = t
            else:
                break
        if upto is None:
            print("Tuning::moe_lines_max_bytes, by these rows: never (the one kernel is faster at the fewest tokens)")
        else:
            later = [t for t in toks if t > upto]
            below = f", below {later[0] * ROW_BYTES} ({later[0]} tokens)" if later else ""
            print(f"Tuning::moe_lines_max_bytes, by these rows: at least {upto * ROW_BYTES} bytes of input "
                  f"({upto} tokens of 7168 bf16){below}")


def self_test():
    """targets() and the comparisons on made-up rows, with and without PyTorch's."""
    import contextlib
    import io

    def row(impl, b, graph, t, file="bench.jsonl"):
        return {"op": "all_reduce", "impl": impl, "dtype": "bf16", "bytes": b, "pes": 2, "graph": graph,
                "time_us": t, "busbw_gbps": b / (t * 1e3), "file": file}

    ours = [row(i, b, g, (2.0 if i == "shmem" else 6.0) + b / 4e5)
            for i in ("shmem", "nccl") for b in (8, 4 * KIB, MIB, 256 * MIB) for g in (True, False)]
    pt = [row(i, b, g, (1.5 if i == "torch-oneshot" else 9.0) + b / 2e5, "torch-symm.jsonl")
          for i in TORCH_IMPLS for b in (8, 4 * KIB, MIB) for g in (True, False)]

    def text(rows):
        rs = Rows(rows)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            targets(rs, 2)
            against_nccl(rs, 2)
            against_torch(rs, 2)
        return out.getvalue()

    plain, with_torch = text(ours), text(ours + pt)
    assert "PyTorch" not in plain and "against NCCL in the same run: 8 of 8" in plain, plain
    assert "all-reduce ≤ 3 µs at ≤ 4 KiB: met" in with_torch, with_torch
    assert "; NCCL 6.01 µs; PyTorch 1.52 µs (torch-oneshot)" in with_torch, with_torch
    assert "against PyTorch SymmMem (the faster of one-shot and two-shot) in the same run: 2 of 6" in with_torch
    assert "- all_reduce bf16 8 B graph: 2.00 against 1.50 µs (torch-oneshot, 0.75×, bench.jsonl)" in with_torch
    # What was there before, as before.
    import re
    assert re.sub(r"; PyTorch [0-9.]+ µs \(torch-\w+\)", "", with_torch).startswith(plain), with_torch
    # The FP8 dispatch's target: the graph pair where there is one.
    def layer(dtype, graph, t, gbps):
        return {"op": "layer_dispatch", "impl": "shmem", "dtype": dtype, "bytes": 1, "pes": 4, "graph": graph,
                "time_us": t, "hidden": 7168, "topk": 8, "tokens": 4096, "logical_gbps": gbps, "link_bytes": 1,
                "file": "bench-moe-layer.jsonl"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fp8_target(Rows([layer("bf16", False, 100.0, 50.0), layer("e4m3", False, 80.0, 62.5),
                         layer("bf16", True, 90.0, 55.0), layer("e4m3", True, 50.0, 99.0)]), 4)
    assert "top-8, ≥ 1.6× the bf16 one's logical GB/s: met: 1.80×: 99.0 against 55.0 GB/s" in out.getvalue(), out.getvalue()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fp8_target(Rows([layer("bf16", False, 100.0, 50.0), layer("e4m3", False, 80.0, 62.5)]), 4)
    assert ": MISSED: 1.25×" in out.getvalue() and "eager" in out.getvalue(), out.getvalue()
    # The four-GPU targets: judged at 4 PEs, the graph row where there is one.
    four = [dict(r, pes=4) for r in ours] + [
        {"op": "dispatch", "impl": i, "dtype": "bf16", "bytes": 1, "pes": 4, "graph": g, "time_us": t, "hidden": 7168,
         "tokens": 1, "topk": 8, "file": "moe-top8.jsonl"}
        for i, g, t in (("shmem", True, 5.5), ("shmem", False, 9.0), ("nccl", True, 7.5))] + [
        {"op": "dispatch", "impl": "shmem", "dtype": "bf16", "bytes": 1, "pes": 4, "graph": True, "time_us": 35.0,
         "hidden": 7168, "tokens": 128, "topk": 8, "file": "moe-top8.jsonl"}]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        four_gpu_targets(Rows(four), 4)
    got = out.getvalue()
    assert "- all-reduce of 8 B ≤ 3 µs: met: 2.00 µs (shmem, graph, bench.jsonl); NCCL 6.00 µs" in got, got
    assert "- all-reduce of 1 MiB ≤ 8 µs: met: 4.62" in got and "16 MiB ≤ 72 µs: -: not measured" in got, got
    assert "top-8, ≤ 6 µs: met: 5.50 µs (shmem, graph, moe-top8.jsonl); NCCL 7.50 µs" in got, got
    assert "- MoE dispatch of 128 tokens, top-8, ≤ 30 µs: MISSED: 35.00 µs" in got, got
    assert "≥ 360 GB/s busbw: met: 398.8 GB/s" in got, got
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        four_gpu_targets(Rows(ours), 2)
    assert "met" not in out.getvalue() and "MISSED" not in out.getvalue(), out.getvalue()
    print("targets: self-test passed")


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        self_test()
        return 0
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    rs = Rows(load(argv[1:]))
    if not rs.rows:
        print("targets: no benchmark rows found in " + " ".join(argv[1:]), file=sys.stderr)
        return 1
    pes = max(r.get("pes", 1) for r in rs.rows)
    rs.rows = [r for r in rs.rows if r.get("pes", 1) == pes]
    targets(rs, pes)
    four_gpu_targets(rs, pes)
    layer_targets(rs, pes)
    fp8_target(rs, pes)
    against_nccl(rs, pes)
    against_torch(rs, pes)
    tuning(rs, pes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
