#!/usr/bin/env python3
"""Plots of shmem-bench's JSON rows, as SVG files for docs/perf.md.

    python3 ci/plot_perf.py [--impl LIST] [--dtype LIST] SVG_DIR RESULT...
    python3 ci/plot_perf.py --self-test [SVG_DIR]

RESULT: a JSON-lines file of shmem-bench (`--json`), or a folder whose
*.jsonl files are read (but tune-*.jsonl, the tuning sweep's settings,
which gpu-run.sh --tune writes under the same names), such as the `$OUT/NAME-PES/` folders that
ci/gpu-compare.sh leaves (bench.jsonl, moe-top1.jsonl, moe-top8.jsonl);
give as many as there are, e.g. `out/main-2 out/main-4`. Rows of
ci/torch_a2av_2d.py (`dispatch_2d`) count as PyTorch's dispatch; those of
ci/torch_symm_bench.py (gpu-run.sh --bench's torch-symm.jsonl:
`torch-oneshot`, `torch-twoshot`, `torch-nccl`, in shmem-bench's format)
are drawn in the all-reduce plots beside NCCL.

Writes into SVG_DIR:
- OP_DTYPE.svg for each collective (and put/get) and element type: time
  and bus bandwidth against bytes per PE, both axes logarithmic; one row of
  panels per PE count; one colour per implementation, graph replays solid
  and eager calls dashed;
- moe_OP.svg for each MoE op (dispatch, combine, all_to_all_v): time
  against tokens, one row of panels per PE count, one column per top-k.

Where the folders come from several runs (gpu-compare.sh's NAME-PES, NAME
differing), shmem's lines are drawn per run and labelled with its NAME;
the other implementations' from the first run only (the same library,
measured again).

--impl: the implementations drawn, comma-separated (default: shmem, nccl,
nvshmem and every torch*; `all` for every one in the rows, shmem-oneshot
and the other forced forms included). --dtype: the element types
(default: every one in the rows).

--self-test writes rows in shmem-bench's format for 2 and 4 PEs into a
temporary folder, draws them (into SVG_DIR if given, else a temporary
folder) and checks that every file it should write is there. No GPU.

Needs Python 3 and matplotlib, on the machine where you draw, not the GPU
box: `python3 -m pip install matplotlib`.
"""
import argparse
import collections
import glob
import json
import math
import os
import re
import sys
import tempfile

MOE_OPS = ["dispatch", "combine", "all_to_all_v"]
# The overlapped matmuls are timed in operations, the barrier moves nothing.
NOT_BY_SIZE = {"barrier", "ag_matmul", "matmul_rs"}
DEFAULT_IMPLS = ["shmem", "nccl", "nvshmem"]
COLOURS = {"shmem": "#1f77b4", "nccl": "#2ca02c", "nvshmem": "#ff7f0e", "torch": "#d62728",
           # ci/torch_symm_bench.py's all-reduce
           "torch-oneshot": "#d62728", "torch-twoshot": "#e377c2", "torch-nccl": "#8c564b"}
OTHER_COLOURS = ["#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"]


def load(paths):
    """Every row of the files given or of the folders' *.jsonl files, each
    with `run`: the folder's name less a trailing -PES (gpu-compare.sh's
    NAME), or the file's name less .jsonl."""
    rows = []
    for p in paths:
        p = os.path.normpath(p)
        if not os.path.exists(p):
            sys.exit(f"plot_perf: {p}: no such file or folder")
        if os.path.isdir(p):
            files = sorted(f for f in glob.glob(os.path.join(p, "*.jsonl"))
                           if not os.path.basename(f).startswith("tune-"))
            run = re.sub(r"-\d+$", "", os.path.basename(p))
        else:
            files = [p]
            run = os.path.basename(p).removesuffix(".jsonl")
        if not files:
            print(f"plot_perf: no *.jsonl in {p}", file=sys.stderr)
        for f in files:
            with open(f) as fh:
                for line in fh:
                    line = line.strip()
                    if not line.startswith("{"):
                        continue
                    r = normalise(json.loads(line))
                    if r is not None:
                        r["run"] = run
                        rows.append(r)
    return rows


def normalise(r):
    """The row in shmem-bench's fields, or None if it has no time."""
    if "time_us" not in r or "op" not in r or r["time_us"] is None:
        return None
    if r["op"] == "dispatch_2d":  # ci/torch_a2av_2d.py: eager, bytes as bytes_sent
        r["op"] = "dispatch"
        r.setdefault("bytes", r.get("bytes_sent"))
        if "topk" not in r and r.get("tokens") and r.get("rows_sent"):
            r["topk"] = max(1, round(r["rows_sent"] / r["tokens"]))
    r.setdefault("graph", False)
    return r


def wanted_impl(impl, impls):
    if impls is None:
        return impl in DEFAULT_IMPLS or impl.startswith("torch")
    return "all" in impls or impl in impls


def series(rows, impls, runs):
    """The rows grouped into lines: {(label, impl, graph): rows}, shmem's
    per run where there are several `runs`, the others' from the first;
    ci/torch_a2av_2d.py's per routing."""
    several = len(runs) > 1
    out = collections.defaultdict(list)
    for r in rows:
        if not wanted_impl(r["impl"], impls):
            continue
        shmem = r["impl"].startswith("shmem")
        if several and not shmem and r["run"] != runs[0]:
            continue
        label = r["impl"] + (f" ({r['run']})" if several and shmem else "")
        label += f" [{r['routing']}]" if r.get("routing") else ""
        out[(label, r["impl"], bool(r["graph"]))].append(r)
    return out


def colour(label, impl, palette):
    if label not in palette:
        base = next((c for k, c in COLOURS.items() if impl == k or impl.startswith(k + "_")), None)
        if base is None or base in palette.values():
            used = set(palette.values())
            base = next((c for c in OTHER_COLOURS if c not in used), OTHER_COLOURS[len(palette) % len(OTHER_COLOURS)])
        palette[label] = base
    return palette[label]


def fmt_bytes(b, _pos=None):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift:
            return f"{b / (1 << shift):g} {unit}"
    return f"{b:g} B"


def setup_matplotlib():
    import matplotlib
    matplotlib.use("svg")
    matplotlib.rcParams.update({
        "svg.fonttype": "none",  # text as text: small files
        "svg.hashsalt": "shmem",  # the same ids on every run: stable diffs
        "font.size": 8,
        "axes.grid": True,
        "grid.alpha": 0.3,
    })
    import matplotlib.pyplot as plt
    return plt


def draw_lines(ax, lines, x_of, y_of, palette, marker=None):
    """One line per series on `ax`; True if any was drawn. (A marker on
    every point costs an SVG element each: only where points are few.)"""
    drawn = False
    for (label, impl, graph), rs in sorted(lines.items(), key=lambda kv: (kv[0][1] != "shmem", kv[0][0], not kv[0][2])):
        by_x = {}
        for r in rs:
            if x_of(r) and y_of(r):
                by_x.setdefault(x_of(r), y_of(r))
        if len(by_x) < sum(1 for r in rs if x_of(r) and y_of(r)):
            print(f"plot_perf: {label}, {'graph' if graph else 'eager'}: several rows of one size in "
                  f"{ax.get_title() or 'a panel'}; the first drawn", file=sys.stderr)
        if not by_x:
            continue
        xs, ys = zip(*sorted(by_x.items()))
        ax.plot(xs, ys, color=colour(label, impl, palette), linestyle="-" if graph else "--", marker=marker,
                markersize=3, linewidth=1.1, label=f"{label}, {'graph' if graph else 'eager'}")
        drawn = True
    return drawn


def log_axes(ax, title, ylabel):
    from matplotlib.ticker import NullLocator
    ax.set_title(title)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylabel(ylabel)


def plot_collective(plt, rows, runs, op, dtype, impls, path):
    """Time and busbw against bytes per PE, a row of panels per PE count."""
    from matplotlib.ticker import FuncFormatter, LogLocator
    pes_list = sorted({r["pes"] for r in rows})
    fig, axes = plt.subplots(len(pes_list), 2, figsize=(9, 3.0 * len(pes_list)), squeeze=False)
    palette = {}
    drawn = False
    for (t_ax, bw_ax), pes in zip(axes, pes_list):
        lines = series([r for r in rows if r["pes"] == pes], impls, runs)
        name = f"{op.replace('_', '-')}, {dtype}, {pes} PEs"
        log_axes(t_ax, f"{name}: time", "time (µs)")
        log_axes(bw_ax, f"{name}: bus bandwidth", "bus bandwidth (GB/s)")
        drawn |= draw_lines(t_ax, lines, lambda r: r["bytes"], lambda r: r["time_us"], palette)
        draw_lines(bw_ax, lines, lambda r: r["bytes"], lambda r: r.get("busbw_gbps"), palette)
        for ax in (t_ax, bw_ax):
            ax.xaxis.set_major_locator(LogLocator(base=4))
            ax.xaxis.set_major_formatter(FuncFormatter(fmt_bytes))
            ax.tick_params(axis="x", labelrotation=45)
        if t_ax.has_data():
            t_ax.legend(fontsize=6, loc="upper left")
    for ax in axes[-1]:
        ax.set_xlabel("bytes per PE")
    return finish(plt, fig, drawn, path)


def plot_moe(plt, rows, runs, op, impls, path):
    """Time against tokens, a row of panels per PE count, a column per top-k."""
    from matplotlib.ticker import FixedLocator, NullLocator
    pes_list = sorted({r["pes"] for r in rows})
    topks = sorted({r["topk"] for r in rows if r.get("topk") is not None})
    tokens = sorted({r["tokens"] for r in rows if r.get("tokens")})
    hidden = next((r["hidden"] for r in rows if r.get("hidden")), None)
    fig, axes = plt.subplots(len(pes_list), len(topks), figsize=(4.5 * len(topks), 3.0 * len(pes_list)),
                             squeeze=False)
    palette = {}
    drawn = False
    for row, pes in zip(axes, pes_list):
        for ax, topk in zip(row, topks):
            lines = series([r for r in rows if r["pes"] == pes and r.get("topk") == topk], impls, runs)
            log_axes(ax, f"{op}, top-{topk}, hidden {hidden}, {pes} PEs", "time (µs)")
            drawn |= draw_lines(ax, lines, lambda r: r.get("tokens"), lambda r: r["time_us"], palette, ".")
            ax.xaxis.set_major_locator(FixedLocator(tokens))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter("{x:g}")
            if ax.has_data():
                ax.legend(fontsize=6, loc="upper left")
    for ax in axes[-1]:
        ax.set_xlabel("tokens per PE")
    return finish(plt, fig, drawn, path)


def finish(plt, fig, drawn, path):
    """Writes the figure if anything was drawn in it; whether it was."""
    if drawn:
        fig.tight_layout()
        fig.savefig(path, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    return drawn


def plot_all(svg_dir, rows, impls=None, dtypes=None):
    """Draws every plot the rows hold; returns the paths written."""
    plt = setup_matplotlib()
    os.makedirs(svg_dir, exist_ok=True)
    runs = list(dict.fromkeys(r["run"] for r in rows))
    written = []
    by_size = [r for r in rows if r["op"] not in MOE_OPS and r["op"] not in NOT_BY_SIZE
               and r.get("dtype") and r.get("bytes")]
    for op in dict.fromkeys(r["op"] for r in by_size):
        mine = [r for r in by_size if r["op"] == op]
        for dtype in sorted({r["dtype"] for r in mine}):
            if dtypes and dtype not in dtypes:
                continue
            path = os.path.join(svg_dir, f"{op}_{dtype}.svg")
            if plot_collective(plt, [r for r in mine if r["dtype"] == dtype], runs, op, dtype, impls, path):
                written.append(path)
    for op in MOE_OPS:
        mine = [r for r in rows if r["op"] == op and r.get("tokens") and r.get("topk")]
        path = os.path.join(svg_dir, f"moe_{op}.svg")
        if mine and plot_moe(plt, mine, runs, op, impls, path):
            written.append(path)
    return written


# The self-test: rows as shmem-bench writes them (bench/src/report.rs,
# Row::json), for made-up times.

REFERENCES = ["nccl", "nvshmem", "memcpy"]


def bus_factor(op, n):
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", *MOE_OPS):
        return (n - 1) / n
    return 1.0


def num(x):
    """A number as report.rs's `num` writes it: four decimals, or null."""
    return f"{x:.4f}" if x is not None and math.isfinite(x) else "null"


def bench_line(op, impl, dtype, nbytes, pes, graph, time_us, moe=None, vs=None):
    algbw = nbytes / (time_us * 1e3)
    s = (f'{{"op":"{op}","impl":"{impl}","backend":"gpu","dtype":"{dtype}","bytes":{nbytes},"pes":{pes},'
         f'"graph":{"true" if graph else "false"},"time_us":{num(time_us)},"algbw_gbps":{num(algbw)},'
         f'"busbw_gbps":{num(algbw * bus_factor(op, pes))}')
    if moe:
        s += ',"tokens":{tokens},"hidden":{hidden},"experts_per_pe":{experts_per_pe},"topk":{topk},' \
             '"major_align":{major_align}'.format(**moe)
    for ref in REFERENCES:
        s += f',"vs_{ref}":{num((vs or {}).get(ref))}'
    return s + "}"


def model_time(impl, nbytes, pes, graph):
    """A made-up time: a latency and a link rate per implementation."""
    latency = {"shmem": 3.0, "shmem-oneshot": 3.5, "nccl": 8.0, "nvshmem": 12.0, "torch-oneshot": 4.0,
               "torch-twoshot": 6.0, "torch-nccl": 9.0}[impl] * (1 + 0.3 * (pes - 2))
    latency *= 1.0 if graph else 1.6
    rate = {"shmem": 330e3, "shmem-oneshot": 250e3, "nccl": 310e3, "nvshmem": 200e3, "torch-oneshot": 150e3,
            "torch-twoshot": 300e3, "torch-nccl": 305e3}[impl] / (1 + 0.1 * (pes - 2))
    return latency + nbytes / rate


def torch_symm_line(impl, dtype, nbytes, pes, graph, time_us):
    """A row as ci/torch_symm_bench.py writes it: shmem-bench's fields,
    backend "torch", its vs_* null, and the torch version."""
    s = bench_line("all_reduce", impl, dtype, nbytes, pes, graph, time_us)
    return s.replace('"backend":"gpu"', '"backend":"torch"')[:-1] + ',"torch":"2.9.0"}'


def write_synthetic(folder, pes, run="main", with_torch=False):
    """gpu-compare.sh's files for one run at `pes` PEs, made up (with
    `with_torch`, gpu-run.sh --bench's torch-symm.jsonl too)."""
    dest = os.path.join(folder, f"{run}-{pes}")
    os.makedirs(dest, exist_ok=True)
    lines = []
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"):
        for dtype in ("f32", "bf16"):
            b = 8
            while b <= 256 << 20:
                times = {}
                for graph in (False, True) if b <= 1 << 20 else (False,):
                    for impl in ("shmem", "shmem-oneshot", "nvshmem", "nccl"):
                        if (impl == "shmem-oneshot" and op != "all_reduce") or (impl == "nvshmem" and graph):
                            continue
                        times[impl, graph] = model_time(impl, b, pes, graph)
                for (impl, graph), t in times.items():
                    vs = {ref: times[ref, graph] / t for ref in REFERENCES
                          if impl.startswith("shmem") and (ref, graph) in times}
                    lines.append(bench_line(op, impl, dtype, b, pes, graph, t, vs=vs))
                b *= 2
    with open(os.path.join(dest, "bench.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if with_torch:  # gpu-run.sh --bench's torch-symm.jsonl: all-reduce, f32 and bf16
        lines = []
        for dtype in ("f32", "bf16"):
            b = 8
            while b <= 256 << 20:
                for graph in (False, True) if b <= 1 << 20 else (False,):
                    for impl in ("torch-oneshot", "torch-twoshot", "torch-nccl"):
                        lines.append(torch_symm_line(impl, dtype, b, pes, graph, model_time(impl, b, pes, graph)))
                b *= 2
        with open(os.path.join(dest, "torch-symm.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")
    hidden = 7168
    for topk in (1, 8):
        lines = []
        for tokens in (1, 32, 128, 4096):
            nbytes = tokens * topk * hidden * 2
            moe = dict(tokens=tokens, hidden=hidden, experts_per_pe=8, topk=topk, major_align=1)
            for op in MOE_OPS:
                for graph in (False, True):
                    times = {impl: model_time(impl, nbytes, pes, graph) * (1.2 if op == "combine" else 1.0)
                             for impl in ("shmem", "nccl")}
                    for impl, t in times.items():
                        vs = {"nccl": times["nccl"] / t} if impl == "shmem" else None
                        lines.append(bench_line(op, impl, "bf16", nbytes, pes, graph, t, moe=moe, vs=vs))
        with open(os.path.join(dest, f"moe-top{topk}.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return dest


def self_test(svg_dir):
    with tempfile.TemporaryDirectory(prefix="plot_perf.") as tmp:
        # PyTorch's all-reduce rows at 2 PEs only: a plot draws what there is.
        results = [write_synthetic(tmp, pes, with_torch=pes == 2) for pes in (2, 4)]
        rows = load(results)
        for r in rows:  # the synthetic rows parse into the bench's fields
            assert {"op", "impl", "backend", "dtype", "bytes", "pes", "graph", "time_us", "busbw_gbps"} <= r.keys(), r
        out = svg_dir or os.path.join(tmp, "svg")
        written = plot_all(out, rows)
        want = {f"{op}_{d}.svg" for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
                for d in ("f32", "bf16")} | {f"moe_{op}.svg" for op in MOE_OPS}
        got = {os.path.basename(p) for p in written}
        assert got == want, f"written {sorted(got)}, want {sorted(want)}"
        for p in written:
            with open(p) as f:
                svg = f.read()
            assert svg.lstrip().startswith("<?xml") and "</svg>" in svg, p
            assert "<text" in svg, f"{p}: text drawn as paths (svg.fonttype)"
            assert "2 PEs" in svg and "4 PEs" in svg, f"{p}: a PE count is missing"
            assert "shmem, graph" in svg and "nccl, eager" in svg, f"{p}: a line is missing from the legend"
            torch_lines = [f"{i}, {m}" for i in ("torch-oneshot", "torch-twoshot", "torch-nccl")
                           for m in ("graph", "eager")]
            if os.path.basename(p).startswith("all_reduce_"):
                missing = [t for t in torch_lines if t not in svg]
                assert not missing, f"{p}: PyTorch's lines {missing} are missing from the legend"
            else:
                assert "torch-" not in svg, f"{p}: PyTorch's all-reduce drawn in another op's plot"
        torch_rows = [r for r in rows if r["impl"].startswith("torch-")]
        assert torch_rows and all(r["backend"] == "torch" and r["op"] == "all_reduce" for r in torch_rows)
        # --impl shmem,nccl leaves them out; the default draws them in their own colours.
        palette = {}
        assert len({colour(i, i, palette) for i in ("shmem", "nccl", "torch-oneshot", "torch-twoshot",
                                                    "torch-nccl")}) == 5, palette
        assert not any(wanted_impl(i, ["shmem", "nccl"]) for i in ("torch-oneshot", "torch-twoshot"))
        sizes = sorted(os.path.getsize(p) for p in written)
        where = out if svg_dir else "a temporary folder (give SVG_DIR to keep them)"
        print(f"plot_perf: self-test drew {len(written)} plots from {len(rows)} rows into {where} "
              f"({sizes[0] // 1024}–{sizes[-1] // 1024} KiB each)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--self-test", action="store_true", help="draw made-up rows; SVG_DIR optional")
    p.add_argument("--impl", help="implementations drawn, comma-separated, or `all`")
    p.add_argument("--dtype", help="element types drawn, comma-separated")
    p.add_argument("svg_dir", nargs="?", metavar="SVG_DIR")
    p.add_argument("results", nargs="*", metavar="RESULT")
    a = p.parse_args()
    if a.self_test:
        self_test(a.svg_dir)
        return
    if not a.svg_dir or not a.results:
        p.error("give SVG_DIR and at least one RESULT (a shmem-bench .jsonl or a folder of them)")
    rows = load(a.results)
    if not rows:
        sys.exit("plot_perf: no shmem-bench rows in " + " ".join(a.results))
    impls = a.impl.split(",") if a.impl else None
    dtypes = a.dtype.split(",") if a.dtype else None
    for path in plot_all(a.svg_dir, rows, impls, dtypes):
        print(path)


if __name__ == "__main__":
    main()
