#!/usr/bin/env python3
"""PyTorch SymmMem's one-shot and two-shot all-reduce, timed as shmem-bench
times its rows, its JSON lines in shmem-bench's format: the PyTorch column
of docs/perf.md's tables and plots.

    torchrun --nproc-per-node N ci/torch_symm_bench.py --json OUT.jsonl
        [--min-bytes 8] [--max-bytes 256M] [--graph-max-bytes 1M] [--no-graph]
        [--dtype f32,bf16] [--impl torch-oneshot,torch-twoshot,torch-nccl]
        [--iters N] [--warmup 5]
    python3 ci/torch_symm_bench.py --self-test     # the pure-Python parts, no GPU, no torch

Implementations (`impl`), on the CUDA backend of SymmMem (``symm_mem.empty``
and ``symm_mem.rendezvous`` over the world group; NVLink multicast off):

- ``torch-oneshot``: ``torch.ops.symm_mem.one_shot_all_reduce_out`` (out of
  place: every rank reads every peer's symmetric input, sums, writes its own
  plain output; ``one_shot_all_reduce`` where this torch has no ``_out``);
- ``torch-twoshot``: ``torch.ops.symm_mem.two_shot_all_reduce_`` (in place on
  the symmetric buffer: each rank reduces its slice and writes it to every
  peer);
- ``torch-nccl``: ``torch.distributed.all_reduce`` (in place, NCCL, on a plain
  device tensor): torch's NCCL beside shmem-bench's own ``nccl`` rows.

An op missing from the installed torch is noted on stderr and has no rows;
so has an implementation that fails at a size (an unsupported size, a
capture it cannot be part of), every rank agreeing before going on. Both
symm_mem ops take f32 and bf16 (PyTorch's AT_DISPATCH_FLOAT_AND_BFLOAT16),
any world size, and a size and offset aligned to 4 bytes (or the element).

**Sizes** double from ``--min-bytes`` to ``--max-bytes``, as shmem-bench's
do; ``bytes`` is each rank's buffer; algbw is bytes over time, busbw algbw
× 2(n−1)/n (nccl-tests' all-reduce).

**Timing** (rank 0's clock, as shmem-bench's "Timing"): eager, CUDA events
around 5 batches of ``--iters`` back-to-back calls (default: enough to move
256 MiB, within 10..=1000), each batch started by a host barrier and a
barrier on the stream (SymmMem's own, on a separate symmetric word, where
this torch has it), after ``--warmup`` untimed calls: the median batch's
mean, with ``issue_us`` the host's time to issue one call in that batch.
Graph rows (up to ``--graph-max-bytes``, unless ``--no-graph``): 100 calls
captured in a ``torch.cuda.CUDAGraph``, 3 untimed replays, then 5 timed with
events, each after the barriers: the median per call.

**Checks**: before timing, the output is poisoned (all-ones bytes, a NaN),
the symmetric input refilled, every rank waits for every other, the op runs
once and every element is compared with the exact sum; after timing, again.
Inputs are small integers, exact in the dtype, naming the rank: element i
of rank p is ``p + 1 + n·r(i)``, ``r`` pseudo-random per index, dtype and size
in ``0..m``, ``m`` small enough that the sum over the n ranks stays exact
(shmem-bench's rule). The in-place implementations (two-shot, NCCL) multiply
their buffer by n at each timed call (up to +inf: no NaN, and the same
kernel time); their checks refill the input and run one call (the graph's
check: a graph of one call, captured beside the timed one). A wrong result
is reported on stderr with the impl, dtype, size and rank, its row is left
out, and the run exits 1.

Rank 0 writes the rows to ``--json`` (to ``--json``.partial as they are
measured, so a crash keeps what was done) and prints a table. The rows have
shmem-bench's fields (``op`` all_reduce, ``impl``, ``backend`` "torch",
``dtype``, ``bytes``, ``pes``, ``graph``, ``time_us``, ``algbw_gbps``,
``busbw_gbps``, ``net_bytes``, ``net_bytes_pes``, ``issue_us``, ``vs_*``
null), and ``torch``, the version: ci/perf_tables.py, ci/plot_perf.py and
ci/targets.py read them beside shmem-bench's.
"""

import os

# NVLink multicast stays off on these machines (see shared/GPU.md): forced,
# whatever the environment says, before torch, NCCL or NVSHMEM read it.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
# SymmMem's CUDA backend (driver VMM and IPC), whatever TORCH_SYMMMEM says;
# set_backend("CUDA") below as well, where this torch has it.
os.environ["TORCH_SYMMMEM"] = "CUDA"

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

NAME = "torch_symm_bench"
OP = "all_reduce"
BACKEND = "torch"
IMPLS = ("torch-oneshot", "torch-twoshot", "torch-nccl")
# Integers up to these are exact (shmem-bench's Value::EXACT).
EXACT = {"f32": 1 << 24, "bf16": 1 << 8}
ELEMENT_BYTES = {"f32": 4, "bf16": 2}
PER_GRAPH = 100
BATCHES = 5
GRAPH_UNTIMED = 3
# Bytes moved per eager batch when --iters is not given (shmem-bench's).
BATCH_BYTES = 256 << 20
REFERENCES = ("nccl", "nvshmem", "memcpy")
# The fields of a shmem-bench row (bench/src/report.rs, Row::json), in order.
ROW_FIELDS = ("op", "impl", "backend", "dtype", "bytes", "pes", "graph", "time_us", "algbw_gbps", "busbw_gbps",
              "net_bytes", "net_bytes_pes", "issue_us", "vs_nccl", "vs_nvshmem", "vs_memcpy")


def note(msg):
    sys.stderr.write(f"{NAME}: {msg}\n")
    sys.stderr.flush()


# ---- pure Python: no torch (and --self-test) --------------------------------

def parse_bytes(s):
    """8, 64K, 1M, 2G (powers of 1024), as shmem-bench's --min-bytes."""
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    digits = s[:-1] if mult > 1 else s
    if not digits.isdigit() or int(digits) <= 0:
        raise argparse.ArgumentTypeError(f"{s!r} is not a positive size such as 8, 64K or 256M")
    return int(digits) * mult


def sweep(min_bytes, max_bytes):
    """shmem-bench's sizes: doubling from the smallest up to the largest."""
    sizes, b = [], min_bytes
    while b <= max_bytes:
        sizes.append(b)
        b *= 2
    return sizes


def human(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def pattern_range(dtype, n):
    """``m``: ``r(i)`` takes values in 0..m, so that every sum over n ranks,
    ``n(n+1)/2 + n²·r``, is exact in the dtype (shmem-bench's Pattern::new)."""
    first = n * (n + 1) // 2
    if first > EXACT[dtype]:
        raise ValueError(f"sums over {n} ranks are not exact in {dtype}: use f32")
    return min((EXACT[dtype] - first) // (n * n) + 1, 1 << 16)


def seed_of(dtype, nbytes):
    """One seed per dtype and size, the same on every rank (below 2^31)."""
    h = 2166136261
    for c in f"{OP}/{dtype}/{nbytes}".encode():
        h = ((h ^ c) * 16777619) % (1 << 32)
    return h % 2147483647


def pattern_r(index, seed, m):
    """``r(i)`` for an int64 array of indices (numpy or torch, on any device),
    or one index: multiplications mod a prime below 2^31 with xor-shifts
    between them (the shifts make it other than one affine map), every
    value non-negative and every product below 2^62, so no int64 overflows
    for indices below 2^30."""
    p = 2147483647
    h = (index * 1103515245 + seed) % p
    h = h ^ (h >> 15)
    h = (h * 48271 + (seed ^ 0x5BD1E995)) % p
    h = h ^ (h >> 13)
    h = (h * 69621 + 12345) % p
    h = h ^ (h >> 16)
    return h % m


def input_value(rank, n, r):
    return rank + 1 + n * r


def sum_value(n, r):
    return n * (n + 1) // 2 + n * n * r


def bus_factor(n):
    return 2 * (n - 1) / n


def iters_for(nbytes, iters):
    return iters if iters else max(10, min(1000, BATCH_BYTES // max(nbytes, 1)))


def num(x):
    """A JSON number as shmem-bench writes it (four decimals), or None."""
    return round(x, 4) if x is not None and x == x and abs(x) != float("inf") else None


def row_json(impl, dtype, nbytes, pes, graph, time_us, issue_us=None, torch_version=None):
    """One row, in shmem-bench's fields and order, then ``torch``."""
    algbw = nbytes / (time_us * 1e3)
    row = {
        "op": OP, "impl": impl, "backend": BACKEND, "dtype": dtype, "bytes": nbytes, "pes": pes,
        "graph": graph, "time_us": num(time_us), "algbw_gbps": num(algbw),
        "busbw_gbps": num(algbw * bus_factor(pes)), "net_bytes": None, "net_bytes_pes": None,
        "issue_us": num(issue_us),
    }
    for ref in REFERENCES:
        row[f"vs_{ref}"] = None
    row["torch"] = torch_version
    return json.dumps(row, separators=(",", ":"))


def median_batch(batches):
    """The median batch (time, issue) of an odd number, by time, as
    shmem-bench's harness takes it."""
    ordered = sorted(batches, key=lambda b: b[0])
    return ordered[len(ordered) // 2]


def table(rows, n):
    """Rank 0's summary: one line per size and mode, one column per impl."""
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    lines = [f"# {NAME}: {n} ranks, all_reduce; time: µs on rank 0, median; busbw as nccl-tests"]
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for graph in (True, False):
            mine = [r for r in rows if r["dtype"] == dtype and r["graph"] == graph]
            if not mine:
                continue
            lines.append(f"\n## all_reduce {dtype} {'graph' if graph else 'eager'}")
            lines.append(f"{'size':>7}" + "".join(f"{i:>16}" for i in impls) + f"{'best busbw':>12}")
            for b in sorted({r["bytes"] for r in mine}):
                at = {r["impl"]: r for r in mine if r["bytes"] == b}
                cells = "".join(f"{at[i]['time_us']:>16.2f}" if i in at else f"{'-':>16}" for i in impls)
                best = max(r["busbw_gbps"] for r in at.values())
                lines.append(f"{human(b):>7}{cells}{best:>12.2f}")
    return "\n".join(lines)


def self_test():
    """The parts that need no GPU and no torch."""
    import numpy as np

    assert parse_bytes("8") == 8 and parse_bytes("64K") == 65536 and parse_bytes("256M") == 256 << 20
    assert parse_bytes("1g") == 1 << 30
    for bad in ("0", "-8", "1.5M", "M", ""):
        try:
            parse_bytes(bad)
        except argparse.ArgumentTypeError:
            continue
        raise AssertionError(f"parse_bytes accepted {bad!r}")
    sizes = sweep(8, 256 << 20)
    assert sizes[0] == 8 and sizes[-1] == 256 << 20 and len(sizes) == 26, sizes
    assert all(b * 2 == c for b, c in zip(sizes, sizes[1:]))
    assert sweep(64, 32) == [] and sweep(12, 48) == [12, 24, 48]
    assert [human(b) for b in (8, 4096, 3 << 20, 1 << 30, 1536)] == ["8", "4K", "3M", "1G", "1536"]

    # The pattern: every sum exact, every input unlike every sum (so an
    # element left unwritten shows), r spread over its range.
    def bf16_exact(v):
        bits = struct.unpack("<I", struct.pack("<f", float(v)))[0]
        return bits & 0xFFFF == 0 and struct.unpack("<f", struct.pack("<I", bits))[0] == v

    def f32_exact(v):
        return struct.unpack("<f", struct.pack("<f", float(v)))[0] == v

    exact = {"bf16": bf16_exact, "f32": f32_exact}
    for dtype in ("bf16", "f32"):
        for n in range(2, 17):
            m = pattern_range(dtype, n)
            assert m >= 1
            top = sum_value(n, m - 1)
            assert top <= EXACT[dtype], (dtype, n, m, top)
            assert exact[dtype](top) and exact[dtype](input_value(n - 1, n, m - 1)), (dtype, n, m)
            # Every partial sum of positive terms is below the total: exact too.
            # (At one index: the check compares element i with the sum at i.)
            for p in range(n):
                for r in range(m):
                    assert input_value(p, n, r) != sum_value(n, r), (dtype, n, p, r)
    try:
        pattern_range("bf16", 23)
        raise AssertionError("23 ranks in bf16 should not be exact")
    except ValueError:
        pass
    idx = np.arange(1 << 16, dtype=np.int64)
    for dtype, n in (("bf16", 2), ("bf16", 8), ("f32", 4)):
        m = pattern_range(dtype, n)
        seed = seed_of(dtype, 1 << 17)
        r = pattern_r(idx, seed, m)
        assert r.dtype == np.int64 and r.min() >= 0 and r.max() < m
        if m <= 1024:  # every value about equally often
            counts = np.bincount(r, minlength=m)
            assert counts.min() > 0.5 * len(idx) / m and counts.max() < 1.5 * len(idx) / m, (dtype, n, counts)
        else:  # as many distinct values as random draws give (1 - 1/e of them)
            assert len(np.unique(r)) > 0.55 * len(idx), (dtype, n, len(np.unique(r)))
        # The same on every rank: a pure function of index and seed; and
        # the pure-Python arithmetic gives the numpy one.
        assert np.array_equal(r, pattern_r(idx.copy(), seed, m))
        assert [int(pattern_r(i, seed, m)) for i in (0, 1, 12345, 65535)] == [int(r[i]) for i in (0, 1, 12345, 65535)]
    # No int64 overflow at the largest index of 256 MiB of bf16 (2^27 elements).
    big = np.array([(1 << 27) - 1, (1 << 30) - 1], dtype=np.int64)
    assert (pattern_r(big, 2147483646, 64) >= 0).all()
    assert (1 << 30) * 1103515245 + 2147483647 < (1 << 62) and 2147483647 * 69621 < (1 << 62)
    assert seed_of("bf16", 8) != seed_of("f32", 8) != seed_of("f32", 16)
    assert all(0 <= seed_of(d, b) < 2147483647 for d in ("bf16", "f32") for b in sizes)

    # Rows: shmem-bench's fields, its bandwidths.
    line = row_json("torch-oneshot", "bf16", 1 << 20, 2, True, 10.0, torch_version="2.9.0")
    r = json.loads(line)
    assert tuple(r)[:len(ROW_FIELDS)] == ROW_FIELDS and r["torch"] == "2.9.0", r
    assert r["algbw_gbps"] == round((1 << 20) / 10e3, 4) and r["busbw_gbps"] == round((1 << 20) / 10e3, 4)
    r4 = json.loads(row_json("torch-twoshot", "f32", 4096, 4, False, 3.0, issue_us=1.25))
    assert r4["busbw_gbps"] == round(4096 / 3e3 * 1.5, 4) and r4["issue_us"] == 1.25 and r4["graph"] is False
    assert json.loads(row_json("torch-nccl", "f32", 8, 2, False, 5.0))["issue_us"] is None
    assert " " not in line and line.startswith('{"op":"all_reduce","impl":"torch-oneshot","backend":"torch"')
    assert median_batch([(5.0, 1), (1.0, 2), (3.0, 3), (4.0, 4), (2.0, 5)]) == (3.0, 3)
    assert iters_for(8, None) == 1000 and iters_for(256 << 20, None) == 10 and iters_for(1 << 20, None) == 256
    assert iters_for(8, 7) == 7
    text = table([r, r4, json.loads(row_json("torch-nccl", "bf16", 1 << 20, 2, True, 20.0))], 2)
    assert "## all_reduce bf16 graph" in text and "torch-nccl" in text and "1M" in text, text
    print(f"{NAME}: self-test passed ({len(sizes)} sizes, pattern exact for 2..16 ranks in bf16 and f32)")


# ---- on the GPU box, under torchrun -----------------------------------------

def run(args):
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}
    int_view = {"f32": torch.int32, "bf16": torch.int16}

    class World:
        """The world group: NCCL for the host's barriers and gathers,
        SymmMem on its CUDA backend."""

        def __init__(self):
            local_rank = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local_rank)
            self.device = torch.device("cuda", local_rank)
            dist.init_process_group("nccl", device_id=self.device)
            self.rank, self.n = dist.get_rank(), dist.get_world_size()
            if self.n < 2:
                sys.exit(f"{NAME}: PyTorch's symmetric memory refuses a group of one rank: run 2 or more")
            set_backend = getattr(symm_mem, "set_backend", None)
            if set_backend is not None:
                # Before the first symmetric allocation. Some builds register
                # the CUDA allocator as the default without offering it by
                # name ("does not find allocation backend CUDA"): then the
                # default is the one wanted.
                try:
                    set_backend("CUDA")
                except RuntimeError as e:
                    get_backend = getattr(symm_mem, "get_backend", None)
                    now = get_backend(self.device) if get_backend is not None else "unknown"
                    if self.rank == 0:
                        print(f"{NAME}: set_backend('CUDA'): {e}; SymmMem's backend stays {now!r}", file=sys.stderr)
            self.name = dist.group.WORLD.group_name
            # Needed by older torch, deprecated by newer (hence the filter).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
                if enable is not None:
                    enable(self.name)
            self.keep = []
            self.fence = None
            self.fence_name = "none"
            word = self.symmetric(1, dtype=torch.int32)
            try:
                handle = symm_mem.rendezvous(word, group=self.name)
                handle.barrier(channel=0)
                torch.cuda.synchronize()
                self.fence = lambda: handle.barrier(channel=0)
                self.fence_name = "symm_mem barrier"
            except (RuntimeError, AttributeError, NotImplementedError, TypeError) as e:
                if self.rank == 0:
                    note(f"no barrier on the stream (SymmMem's barrier: {type(e).__name__}: {e}); "
                         f"batches start after the host barrier alone")

        def symmetric(self, *size, dtype):
            """A symmetric tensor, rendezvoused, kept to the end (freeing
            symmetric memory is collective)."""
            t = symm_mem.empty(*size, dtype=dtype, device=self.device)
            symm_mem.rendezvous(t, group=self.name)
            self.keep.append(t)
            return t

        def gather(self, obj):
            out = [None] * self.n
            dist.all_gather_object(out, obj)
            return out

        def line_up(self):
            """Every rank's stream empty, every rank here, then a barrier on
            the stream: what follows starts together on every GPU."""
            torch.cuda.synchronize()
            dist.barrier()
            if self.fence is not None:
                self.fence()

    def op_of(name):
        """``torch.ops.symm_mem.<name>``, or None where this torch lacks it."""
        try:
            return getattr(torch.ops.symm_mem, name)
        except (AttributeError, RuntimeError):
            return None

    class Case:
        """One implementation at one dtype and size: its buffers, the
        expected sum, and how to run, poison and check it."""

        def __init__(self, w, impl, dtype, nbytes, symm, plain, out):
            self.w, self.impl, self.dtype, self.nbytes = w, impl, dtype, nbytes
            numel = nbytes // ELEMENT_BYTES[dtype]
            m = pattern_range(dtype, w.n)
            idx = torch.arange(numel, dtype=torch.int64, device=w.device)
            r = pattern_r(idx, seed_of(dtype, nbytes), m)
            self.src = input_value(w.rank, w.n, r).to(torch_dtype[dtype])
            self.want = sum_value(w.n, r).to(torch_dtype[dtype])
            del idx, r
            self.in_place = impl != "torch-oneshot"
            # one_shot_all_reduce without _out: its output is a new tensor each call.
            self.functional = False
            if impl == "torch-nccl":
                self.buf = plain[:numel]
            else:
                self.buf = symm[:numel]
            self.out = self.buf if self.in_place else out[:numel]
            self.result = self.out
            g = w.name
            if impl == "torch-oneshot":
                one_out, one = op_of("one_shot_all_reduce_out"), op_of("one_shot_all_reduce")
                if one_out is not None:
                    self.call = lambda: one_out(self.buf, "sum", g, self.out)
                else:
                    # The functional form: a new output each call (not poisoned).
                    self.functional = True

                    def call():
                        self.result = one(self.buf, "sum", g)
                    self.call = call
            elif impl == "torch-twoshot":
                two = op_of("two_shot_all_reduce_")
                self.call = lambda: two(self.buf, "sum", g)
            else:
                self.call = lambda: dist.all_reduce(self.buf)

        def label(self, graph):
            return f"all_reduce {self.impl} {self.dtype} {self.nbytes} B ({'graph' if graph else 'eager'})"

        def prepare(self):
            """Input refilled, output poisoned (all-ones bytes: NaN), every
            rank's done before any reads a peer's."""
            self.buf.copy_(self.src)
            if not self.in_place:
                self.out.view(int_view[self.dtype]).fill_(-1)
            if not self.functional:
                self.result = self.out
            self.w.line_up()

        def compare(self):
            """None when the output is the exact sum, else its first difference."""
            torch.cuda.synchronize()
            got = self.result
            if got.shape != self.want.shape:
                return f"{got.numel()} elements where {self.want.numel()} were expected"
            wrong = got != self.want
            if not bool(wrong.any()):
                return None
            count = int(wrong.sum())
            i = int(wrong.nonzero()[0, 0])
            return (f"element {i} is {got[i].item()}, expected {self.want[i].item()} "
                    f"({count} of {self.want.numel()} wrong)")

    class Bench:
        def __init__(self, w, args):
            self.w, self.args = w, args
            self.rows = []
            self.wrong = 0
            self.partial = None
            if w.rank == 0 and args.json:
                os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
                self.partial = open(args.json + ".partial", "w")

        def settle(self, c, graph, found):
            """Whether every rank's verdict was right. ``found``: None (right),
            ("wrong", what) or ("error", what). A wrong value is reported by
            each rank at once and counted; an error is noted once."""
            if found is not None and found[0] == "wrong":
                note(f"WRONG RESULT: {c.label(graph)} on rank {self.w.rank}: {found[1]}")
                self.wrong += 1
            verdicts = self.w.gather(found)
            failed = [r for r, v in enumerate(verdicts) if v is not None]
            errors = [(r, v[1]) for r, v in enumerate(verdicts) if v is not None and v[0] == "error"]
            if errors and self.w.rank == errors[0][0]:
                note(f"{c.label(graph)} skipped (failed on ranks {failed}): {errors[0][1]}")
            return not failed

        def attempt(self, f):
            """f's verdict, an exception turned into an error verdict."""
            try:
                what = f()
            except Exception as e:  # noqa: BLE001 (any failure skips the row)
                return ("error", f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
            return None if what is None else ("wrong", what)

        def check_once(self, c):
            def f():
                c.prepare()
                c.call()
                return c.compare()
            return self.attempt(f)

        def time_eager(self, c):
            iters = iters_for(c.nbytes, self.args.iters)
            for _ in range(self.args.warmup):
                c.call()
            batches = []
            for _ in range(BATCHES):
                self.w.line_up()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                t0 = time.perf_counter()
                for _ in range(iters):
                    c.call()
                issue = (time.perf_counter() - t0) * 1e6 / iters
                end.record()
                end.synchronize()
                batches.append((start.elapsed_time(end) * 1e3 / iters, issue))
            return median_batch(batches)

        def eager(self, c):
            if not self.settle(c, False, self.check_once(c)):
                return None
            timed = {}

            def f():
                timed["t"] = self.time_eager(c)
                # Out of place: the output as the timed calls left it; in
                # place: refilled and one call.
                if c.in_place:
                    c.prepare()
                    c.call()
                return c.compare()
            if not self.settle(c, False, self.attempt(f)):
                return None
            t, issue = timed["t"]
            return row_json(c.impl, c.dtype, c.nbytes, self.w.n, False, t, issue, torch.__version__)

        def capture(self, c, count):
            g = torch.cuda.CUDAGraph()
            try:
                ctx = torch.cuda.graph(g, capture_error_mode="thread_local")
            except TypeError:  # older torch: no capture_error_mode
                ctx = torch.cuda.graph(g)
            with ctx:
                for _ in range(count):
                    c.call()
            return g

        def graphed(self, c):
            graphs = {}

            def captured():
                c.prepare()
                graphs["timed"] = self.capture(c, PER_GRAPH)
                # In place, 100 calls multiply the sum by n^99: the check
                # replays a graph of one call on the same buffers.
                graphs["check"] = self.capture(c, 1) if c.in_place else graphs["timed"]
                return None

            # Every rank has its graphs before any replays one.
            if not self.settle(c, True, self.attempt(captured)):
                return None

            def replay_check():
                c.prepare()
                graphs["check"].replay()
                return c.compare()
            if not self.settle(c, True, self.attempt(replay_check)):
                return None
            timed = {}

            def f():
                g = graphs["timed"]
                for _ in range(GRAPH_UNTIMED):
                    g.replay()
                reps = []
                for _ in range(BATCHES):
                    self.w.line_up()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    g.replay()
                    end.record()
                    end.synchronize()
                    reps.append(start.elapsed_time(end) * 1e3 / PER_GRAPH)
                timed["t"] = statistics.median(reps)
                return replay_check()
            ok = self.settle(c, True, self.attempt(f))
            del graphs
            if not ok:
                return None
            return row_json(c.impl, c.dtype, c.nbytes, self.w.n, True, timed["t"], None, torch.__version__)

        def keep(self, line):
            self.rows.append(json.loads(line))
            if self.partial is not None:
                self.partial.write(line + "\n")
                self.partial.flush()

        def all(self):
            w, args = self.w, self.args
            sizes = sweep(args.min_bytes, args.max_bytes)
            missing = {
                "torch-oneshot": op_of("one_shot_all_reduce_out") is None and op_of("one_shot_all_reduce") is None,
                "torch-twoshot": op_of("two_shot_all_reduce_") is None,
                "torch-nccl": False,
            }
            impls = []
            for impl in args.impl:
                if missing[impl]:
                    if w.rank == 0:
                        what = "one_shot_all_reduce(_out)" if impl == "torch-oneshot" else "two_shot_all_reduce_"
                        note(f"torch {torch.__version__} has no torch.ops.symm_mem.{what}: no {impl} rows")
                else:
                    impls.append(impl)
            if w.rank == 0 and "torch-oneshot" in impls and op_of("one_shot_all_reduce_out") is None:
                note("no one_shot_all_reduce_out: torch-oneshot rows call one_shot_all_reduce (an output "
                     "allocated each call, not poisoned before the checks)")
            for dtype in args.dtype:
                try:
                    pattern_range(dtype, w.n)
                except ValueError as e:
                    if w.rank == 0:
                        note(f"{dtype}: {e}: no {dtype} rows")
                    continue
                elem = ELEMENT_BYTES[dtype]
                numel = args.max_bytes // elem
                symm = w.symmetric(numel, dtype=torch_dtype[dtype]) if any(i != "torch-nccl" for i in impls) else None
                plain = torch.empty(numel, dtype=torch_dtype[dtype], device=w.device) if "torch-nccl" in impls else None
                out = torch.empty(numel, dtype=torch_dtype[dtype], device=w.device) if "torch-oneshot" in impls else None
                # NCCL last: a failure of its captures leaves the rows above intact.
                for impl in sorted(impls, key=lambda i: i == "torch-nccl"):
                    for nbytes in sizes:
                        if nbytes % elem:
                            continue
                        c = Case(w, impl, dtype, nbytes, symm, plain, out)
                        line = self.eager(c)
                        if line is not None:
                            self.keep(line)
                        if args.graph and nbytes <= args.graph_max_bytes:
                            line = self.graphed(c)
                            if line is not None:
                                self.keep(line)
                        del c
                del plain, out
            return self.rows

    w = World()
    if w.rank == 0:
        try:
            backend = symm_mem.get_backend(w.device)
        except (AttributeError, RuntimeError) as e:
            backend = f"CUDA, the default (get_backend: {type(e).__name__})"
        note(f"torch {torch.__version__}, {w.n} ranks, SymmMem backend {backend}, stream barrier: {w.fence_name}")
    bench = Bench(w, args)
    rows = bench.all()
    if w.rank == 0:
        print(table(rows, w.n), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
            bench.partial.close()
            os.remove(args.json + ".partial")
    wrong = sum(w.gather(bench.wrong))
    dist.barrier()
    dist.destroy_process_group()
    if wrong:
        if bench.wrong:
            note(f"{bench.wrong} wrong result(s) on rank {w.rank} (see above)")
        return 1
    if not rows and w.rank == 0:
        note("no rows")
        return 1
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--self-test", action="store_true", help="test the pure-Python parts (no torch, no GPU)")
    p.add_argument("--json", metavar="PATH", help="rank 0 writes one JSON row a line here")
    p.add_argument("--min-bytes", type=parse_bytes, default=8, help="smallest buffer, a multiple of 4 (default 8)")
    p.add_argument("--max-bytes", type=parse_bytes, default=256 << 20, help="largest buffer (default 256M)")
    p.add_argument("--graph-max-bytes", type=parse_bytes, default=1 << 20,
                   help="largest buffer timed as graph replays (default 1M)")
    p.add_argument("--no-graph", dest="graph", action="store_false", help="eager rows only")
    p.add_argument("--dtype", default="f32,bf16", help="comma-separated: f32, bf16 (default f32,bf16)")
    p.add_argument("--impl", default=",".join(IMPLS), help=f"comma-separated: {', '.join(IMPLS)} (default all)")
    p.add_argument("--iters", type=int, help="calls per timed batch (default: enough to move 256 MiB, 10..=1000)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls before each size (default 5)")
    args = p.parse_args()
    if args.self_test:
        self_test()
        return 0
    args.dtype = list(dict.fromkeys(d.strip() for d in args.dtype.split(",") if d.strip()))
    args.impl = list(dict.fromkeys(i.strip() for i in args.impl.split(",") if i.strip()))
    if bad := [d for d in args.dtype if d not in EXACT]:
        p.error(f"--dtype {','.join(bad)}: SymmMem's all-reduce takes f32 and bf16")
    if bad := [i for i in args.impl if i not in IMPLS]:
        p.error(f"--impl {','.join(bad)}: one of {', '.join(IMPLS)}")
    if args.min_bytes % 4 or args.min_bytes > args.max_bytes:
        p.error(f"--min-bytes ({args.min_bytes}) must be a multiple of 4 and at most --max-bytes ({args.max_bytes})")
    if args.iters is not None and args.iters < 1:
        p.error("--iters must be at least 1")
    if "LOCAL_RANK" not in os.environ:
        p.error("run under torchrun (torchrun --nproc-per-node N ci/torch_symm_bench.py ...)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
