#!/usr/bin/env python3
"""PyTorch's MoE dispatch, ``torch.ops.symm_mem.all_to_all_vdev_2d`` on the
NVSHMEM backend of SymmMem: the reference shmem's ``all_to_all_v_2d`` is
checked and timed against.

    torchrun --nproc-per-node 2 ci/torch_a2av_2d.py --out DIR [--bench JSONL]

For every case of ``case_list()`` each rank draws its ``in_splits`` and an
input whose elements name (rank, row, column), runs torch's op once, checks
the result against ``dispatch_layout`` (this file's reading of the op's
semantics) and writes raw little-endian files into DIR:

    case<K>.rank<R>.in_splits.i64           n_pes * ne int64
    case<K>.rank<R>.input.bin               input_rows x row_len elements
    case<K>.rank<R>.out.bin                 torch's whole output buffer, output_rows x row_len
                                            (rows it does not write keep the poison, all-ones bytes)
    case<K>.rank<R>.out_splits_offsets.i64  2 x n_pes * ne int64: splits, then offsets
    cases.json                              (rank 0) every case and how its files are laid out

``shmemrun -n 2 moe_torch_check DIR`` (examples/moe_torch_check.rs) runs
shmem's op on the same files and compares.

With ``--bench JSONL`` rank 0 also writes one JSON line per measurement of
the dispatch (bf16, 8 experts per PE, 4096 and 128 tokens of 7168 per rank):
torch's op, NCCL's ``all_to_all_single`` moving the same rows with the
splits known on the host (``nccl``), and the same with the splits exchanged
on the device and read back first (``nccl+splits``, what an MoE layer whose
routing lives on the GPU pays). Every implementation's output is checked
before and after timing.

Torch's op is not safe to call again before every rank has finished the
previous call: its splits exchange writes the source offsets into each peer's
``out_splits_offsets``, which the peer's data kernel reads and, at its end,
overwrites with the output offsets. A rank that starts the next call early
gets its offsets overwritten, reads output offsets as source offsets, and
the op reads out of bounds ("an illegal memory access", in whichever case
the ranks drift apart). So every call here is fenced:
the cases by a host barrier after the output is poisoned, the timing by a
barrier on the stream after each call (``torch`` rows: the op and that
barrier; ``torch_barrier`` rows: the barrier alone, to subtract).

Exits non-zero when torch's output differs from the reference or a check
fails.
"""

import os

# NVLink multicast stays off on these machines (see shared/GPU.md): forced,
# whatever the environment says, before torch, NCCL or NVSHMEM read it.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
# Every case keeps its buffers (freeing symmetric memory is collective; this
# way no rank frees while another still reads): about 0.4 GiB with --bench.
os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", "2G")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._symmetric_memory as symm_mem  # noqa: E402

FORMAT_VERSION = 1
# Raw element bits per dtype: the files hold bits, the checks compare bits.
BITS = {"bf16": np.dtype("<u2"), "f32": np.dtype("<u4")}
ENCODING = (
    "bf16: bits = (rank & 1) << 15 | (1 + row % 254) << 7 | col % 128 (normal numbers); "
    "f32: value = rank * 2^19 + row * 2^6 + col % 64 (exact integers)"
)
# Rows beyond the data in every input (never sent) and output buffer.
INPUT_SLACK = 3
OUTPUT_SLACK = 5
ROUTINGS = ("random", "zeros", "one_expert", "skewed")
# Rows each rank routes, about, per row length.
TOKENS = {7168: 96, 129: 400}


def case_list():
    """Every (dtype, row length, routing) once; experts per PE and
    major_align cycle with coprime periods, so each of their 12 pairs comes
    up; then two cases where nothing moves."""
    cases = []
    for dtype in ("bf16", "f32"):
        for row_len in (7168, 129):
            for routing in ROUTINGS:
                i = len(cases)
                cases.append(
                    {
                        "dtype": dtype,
                        "row_len": row_len,
                        "experts_per_pe": (1, 4, 8)[i % 3],
                        "major_align": (1, 8, 16, 128)[i % 4],
                        "routing": routing,
                        "seed": 1000 + i,
                    }
                )
    cases.append({"dtype": "bf16", "row_len": 7168, "experts_per_pe": 8, "major_align": 16,
                  "routing": "empty", "seed": 2000})
    cases.append({"dtype": "f32", "row_len": 129, "experts_per_pe": 4, "major_align": 1,
                  "routing": "empty", "seed": 2001})
    return cases


def draw_splits(routing, seed, rank, n, ne, tokens):
    """Rank ``rank``'s in_splits (rows per global expert, rank-major), the
    same on whichever rank draws them."""
    rng = np.random.default_rng([seed, rank])
    experts = n * ne
    mean = max(1, tokens // experts)
    if routing == "random":
        splits = rng.integers(0, 2 * mean + 1, size=experts)
    elif routing == "zeros":
        # A third of the chunks empty, one expert that gets nothing from
        # anyone and, with several experts per rank, a rank that sends
        # nothing to another.
        splits = rng.integers(1, 2 * mean + 1, size=experts)
        splits[rng.random(experts) < 0.3] = 0
        splits[seed % experts] = 0
        if ne > 1 and rank == n - 1:
            splits[:ne] = 0
    elif routing == "one_expert":
        splits = np.zeros(experts, dtype=np.int64)
        splits[seed % experts] = tokens
    elif routing in ("skewed", "zipf"):
        weights = 1.0 / np.arange(1, experts + 1) ** 1.2
        splits = rng.multinomial(tokens, weights / weights.sum())
    elif routing == "uniform":
        splits = np.bincount(rng.integers(0, experts, size=tokens), minlength=experts)
    elif routing == "empty":
        splits = np.zeros(experts, dtype=np.int64)
    else:
        raise ValueError(f"unknown routing {routing!r}")
    return splits.astype(np.int64)


def encode_rows(dtype, rank, rows, row_len):
    """The input of ``rank``: raw element bits, ``rows`` x ``row_len``, each
    element naming its rank, row and column (see ENCODING)."""
    r = np.arange(rows, dtype=np.uint32)[:, None]
    c = np.arange(row_len, dtype=np.uint32)[None, :]
    if dtype == "bf16":
        bits = ((rank & 1) << 15) | ((1 + r % 254) << 7) | (c % 128)
        return bits.astype(np.uint16)
    if rank >= 32 or rows > 1 << 13:
        raise ValueError("the f32 encoding holds ranks below 32 and rows below 8192")
    value = (rank << 19) + (r << 6) + c % 64
    return value.astype(np.float32).view(np.uint32)


def dispatch_layout(all_splits, ne, align, dst):
    """What ``dst`` receives from ``all_to_all_vdev_2d``: its
    out_splits_offsets (2 x n*ne, entry ``e * n + src``) and the chunks
    ``(src, first input row, first output row, rows)``, and the rows its
    output needs. Each local expert's block holds the chunks of every source
    in order and takes ``max(round_up(rows, align), align)`` rows."""
    n = len(all_splits)
    src_offsets = [np.concatenate(([0], np.cumsum(s)[:-1])) for s in all_splits]
    splits_offsets = np.zeros((2, n * ne), dtype=np.int64)
    chunks = []
    at = 0
    for e in range(ne):
        start = at
        for s in range(n):
            i = dst * ne + e
            rows = int(all_splits[s][i])
            splits_offsets[:, e * n + s] = (rows, at)
            chunks.append((s, int(src_offsets[s][i]), at, rows))
            at += rows
        at = start + max(-(-(at - start) // align) * align, align)
    return splits_offsets, chunks, at


def first_difference(got_so, got_out, want_so, chunks, inputs):
    """None when torch's result matches the layout, else what differs first."""
    if not np.array_equal(got_so, want_so):
        k = int(np.flatnonzero(got_so.reshape(-1) != want_so.reshape(-1))[0])
        return (f"out_splits_offsets[{k // want_so.shape[1]}][{k % want_so.shape[1]}] is "
                f"{got_so.reshape(-1)[k]}, expected {want_so.reshape(-1)[k]}")
    for src, frm, to, rows in chunks:
        want = inputs[src][frm:frm + rows]
        got = got_out[to:to + rows]
        if not np.array_equal(got, want):
            row, col = (int(x[0]) for x in np.nonzero(got != want))
            return (f"output row {to + row} column {col} is {got[row, col]:#x}, expected "
                    f"{want[row, col]:#x} (rank {src} input row {frm + row})")
    return None


def write_le(path, array):
    np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tofile(path)


def torch_dtype(dtype):
    return {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]


def to_device(bits, dtype, device):
    """Raw bits as a tensor of ``dtype`` (a view: the bits stay as they are)."""
    signed = bits.view(np.int16 if dtype == "bf16" else np.int32)
    return torch.from_numpy(signed).to(device).view(torch_dtype(dtype))


def to_bits(tensor, dtype):
    signed = tensor.view(torch.int16 if dtype == "bf16" else torch.int32).cpu().numpy()
    return signed.view(BITS[dtype])


def poison(tensor, dtype):
    """All-ones bytes: a NaN that no encoded input is."""
    tensor.view(torch.int16 if dtype == "bf16" else torch.int32).fill_(-1)


class Group:
    """The world group, with SymmMem on NVSHMEM."""

    def __init__(self):
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        self.device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=self.device)
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        available = getattr(symm_mem, "is_nvshmem_available", None)
        if available is not None and not available():
            sys.exit("torch_a2av_2d: torch finds no NVSHMEM (libnvshmem_host.so.3)")
        # Before the first symmetric allocation.
        symm_mem.set_backend("NVSHMEM")
        self.name = dist.group.WORLD.group_name
        # Needed by older torch, deprecated by newer (hence the filter).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
            if enable is not None:
                enable(self.name)
        self.keep = []
        self.fence = None

    def stream_barrier(self):
        """A barrier of every rank on the current stream, without the host:
        SymmMem's own (``barrier`` of a rendezvoused handle) where this
        torch's NVSHMEM backend has one, else NCCL's all-reduce of one
        element."""
        if self.fence is None:
            t = symm_mem.empty(1, dtype=torch.int32, device=self.device)
            handle = symm_mem.rendezvous(t, group=self.name)
            self.keep.append(t)
            try:
                handle.barrier(channel=0)
                torch.cuda.synchronize()
                self.fence = ("symm_mem", lambda: handle.barrier(channel=0))
            except (RuntimeError, AttributeError, NotImplementedError) as e:
                one = torch.zeros(1, device=self.device)
                self.fence = (f"nccl all_reduce (symm_mem barrier: {type(e).__name__})", lambda: dist.all_reduce(one))
            if self.rank == 0:
                print(f"torch_a2av_2d: stream barrier: {self.fence[0]}", flush=True)
        self.fence[1]()

    def symmetric(self, *size, dtype):
        """A symmetric tensor, rendezvoused, kept to the end (see the top)."""
        t = symm_mem.empty(*size, dtype=dtype, device=self.device)
        symm_mem.rendezvous(t, group=self.name)
        self.keep.append(t)
        return t

    def gather(self, obj):
        out = [None] * self.n
        dist.all_gather_object(out, obj)
        return out


class Plan:
    """One dispatch, without torch: every rank's splits, the buffer sizes
    (equal on every rank, as symmetric allocations must be), every rank's
    input and what each rank should receive."""

    def __init__(self, n, dtype, row_len, ne, align, all_splits):
        self.n, self.dtype, self.row_len, self.ne, self.align = n, dtype, row_len, ne, align
        self.all_splits = all_splits
        self.input_rows = max(int(s.sum()) for s in all_splits) + INPUT_SLACK
        self.layouts = [dispatch_layout(all_splits, ne, align, d) for d in range(n)]
        self.output_rows = max(rows for _, _, rows in self.layouts) + OUTPUT_SLACK
        self.inputs = [encode_rows(dtype, r, self.input_rows, row_len) for r in range(n)]

    @classmethod
    def of_case(cls, case, n):
        ne, row_len = case["experts_per_pe"], case["row_len"]
        all_splits = [draw_splits(case["routing"], case["seed"], r, n, ne, TOKENS[row_len]) for r in range(n)]
        return cls(n, case["dtype"], row_len, ne, case["major_align"], all_splits)

    def check(self, rank, so, out):
        want_so, chunks, _ = self.layouts[rank]
        return first_difference(so, out, want_so, chunks, self.inputs)

    def write(self, out_dir, k, rank, so, out):
        """The files of case ``k`` and ``rank``, ``out`` and ``so`` its result."""
        base = os.path.join(out_dir, f"case{k}.rank{rank}")
        write_le(base + ".in_splits.i64", self.all_splits[rank])
        write_le(base + ".input.bin", self.inputs[rank])
        write_le(base + ".out.bin", out)
        write_le(base + ".out_splits_offsets.i64", so)

    def describe(self, case, k, matches):
        return dict(case, case=k, n_pes=self.n, input_rows=self.input_rows, output_rows=self.output_rows,
                    torch_matches_reference=matches)


def write_cases_json(out_dir, n, torch_version, described):
    with open(os.path.join(out_dir, "cases.json"), "w") as f:
        json.dump({
            "format": FORMAT_VERSION,
            "n_pes": n,
            "torch": torch_version,
            "encoding": ENCODING,
            "poison": "all-ones bytes",
            "files": "case<K>.rank<R>.{in_splits.i64,input.bin,out.bin,out_splits_offsets.i64}, raw little-endian",
            "cases": described,
        }, f, indent=1)
        f.write("\n")


class Dispatch:
    """Torch's op on one set of symmetric buffers, for one Plan."""

    def __init__(self, g, plan):
        self.g, self.plan = g, plan
        tdtype = torch_dtype(plan.dtype)
        self.input = g.symmetric(plan.input_rows, plan.row_len, dtype=tdtype)
        self.input.copy_(to_device(plan.inputs[g.rank], plan.dtype, g.device))
        self.output = g.symmetric(plan.output_rows, plan.row_len, dtype=tdtype)
        self.in_splits = g.symmetric(g.n * plan.ne, dtype=torch.int64)
        self.in_splits.copy_(torch.from_numpy(plan.all_splits[g.rank]))
        self.out_splits_offsets = g.symmetric(2, g.n * plan.ne, dtype=torch.int64)
        torch.cuda.synchronize()
        # Every rank's buffers exist before any rank's op reaches into them.
        dist.barrier()

    def run(self):
        torch.ops.symm_mem.all_to_all_vdev_2d(
            self.input, self.output, self.in_splits, self.out_splits_offsets, self.g.name,
            major_align=self.plan.align,
        )

    def run_fenced(self):
        """The op, then a barrier on the stream: the next call starts after
        every rank's previous one has ended (see the top)."""
        self.run()
        self.g.stream_barrier()

    def result_of_run(self):
        """Runs the op on a poisoned output; its out_splits_offsets and output bits."""
        poison(self.output, self.plan.dtype)
        self.out_splits_offsets.fill_(-1)
        torch.cuda.synchronize()
        # No rank's op may write into this rank's buffers before they are
        # poisoned (the splits exchange would be overwritten by the -1s).
        dist.barrier()
        self.run()
        torch.cuda.synchronize()
        dist.barrier()
        return self.out_splits_offsets.cpu().numpy(), to_bits(self.output, self.plan.dtype)

    def check(self):
        """None when a run gives what the plan says, else what differs."""
        return self.plan.check(self.g.rank, *self.result_of_run())


def run_cases(g, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    failed = 0
    described = []
    for k, case in enumerate(case_list()):
        plan = Plan.of_case(case, g.n)
        so, out = Dispatch(g, plan).result_of_run()
        plan.write(out_dir, k, g.rank, so, out)
        verdicts = g.gather(plan.check(g.rank, so, out))
        bad = [f"rank {r}: {v}" for r, v in enumerate(verdicts) if v is not None]
        failed += bool(bad)
        described.append(plan.describe(case, k, not bad))
        if g.rank == 0:
            what = (f"{case['dtype']} row_len {plan.row_len}, experts per PE {plan.ne}, major_align {plan.align}, "
                    f"{case['routing']} (seed {case['seed']}), {plan.input_rows} input / {plan.output_rows} "
                    f"output rows")
            print(f"case {k}: {what}: " + ("torch matches the reference" if not bad
                                           else "MISMATCH " + "; ".join(bad)), flush=True)
    if g.rank == 0:
        write_cases_json(out_dir, g.n, torch.__version__, described)
        print(f"torch_a2av_2d: {len(described)} cases in {out_dir}, {failed} where torch differs from the "
              f"reference", flush=True)
    return failed == 0


def time_op(op, warmup, batches, iters):
    """Rank's medians over batches of ``iters`` back-to-back calls (CUDA
    events around each batch, started by a barrier), in microseconds."""
    for _ in range(warmup):
        op()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(batches):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            op()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / iters)
    return statistics.median(per_call)


class NcclDispatch:
    """The same rows through ``dist.all_to_all_single``, rank-major (no
    expert reordering), on plain device buffers."""

    def __init__(self, d):
        g, plan = d.g, d.plan
        self.g, self.plan = g, plan
        per_rank = [s.reshape(g.n, plan.ne).sum(axis=1) for s in plan.all_splits]
        self.send_rows = [int(x) for x in per_rank[g.rank]]
        self.recv_rows = [int(per_rank[s][g.rank]) for s in range(g.n)]
        self.send = d.input[:sum(self.send_rows)].clone()
        self.recv = torch.empty(sum(self.recv_rows), plan.row_len, dtype=d.input.dtype, device=g.device)
        self.splits = torch.from_numpy(plan.all_splits[g.rank]).to(g.device)
        self.recv_splits = torch.empty_like(self.splits)
        # Rank s's rows for this rank start after what s sends to lower ranks.
        self.chunks = []
        at = 0
        for s in range(g.n):
            self.chunks.append((s, int(per_rank[s][:g.rank].sum()), at, self.recv_rows[s]))
            at += self.recv_rows[s]

    def run(self):
        dist.all_to_all_single(self.recv, self.send, self.recv_rows, self.send_rows)

    def run_with_splits(self):
        """Splits exchanged on the device and read back, then the data."""
        n, ne = self.g.n, self.plan.ne
        dist.all_to_all_single(self.recv_splits, self.splits)
        sizes = torch.stack([self.splits.view(n, ne).sum(1), self.recv_splits.view(n, ne).sum(1)]).tolist()
        dist.all_to_all_single(self.recv, self.send, sizes[1], sizes[0])

    def check(self, op):
        """None when ``op`` gives the rows this rank should receive."""
        poison(self.recv, self.plan.dtype)
        op()
        torch.cuda.synchronize()
        got = to_bits(self.recv, self.plan.dtype)
        for src, frm, to, rows in self.chunks:
            if not np.array_equal(got[to:to + rows], self.plan.inputs[src][frm:frm + rows]):
                return f"the rows from rank {src} differ"
        return None


def run_bench(g, path, routings, warmup, batches, iters):
    hidden, ne, align, seed = 7168, 8, 1, 7
    if g.rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ok = True
    method = (f"eager; CUDA events around {batches} batches of {iters} back-to-back calls, each batch started "
              f"by a barrier, after {warmup} untimed calls; time_us: rank 0's median batch mean per call "
              f"(time_us_per_rank: each rank's); outputs checked before and after timing")
    lines = []
    for tokens in (4096, 128):
        for routing in routings:
            plan = Plan(g.n, "bf16", hidden, ne, align,
                        [draw_splits(routing, seed, r, g.n, ne, tokens) for r in range(g.n)])
            d = Dispatch(g, plan)
            nccl = NcclDispatch(d)
            impls = [("torch", d.run_fenced, d.check), ("torch_barrier", g.stream_barrier, lambda: None),
                     ("nccl", nccl.run, lambda: nccl.check(nccl.run)),
                     ("nccl+splits", nccl.run_with_splits, lambda: nccl.check(nccl.run_with_splits))]
            for name, op, check in impls:
                before = g.gather(check())
                times = g.gather(time_op(op, warmup, batches, iters))
                after = g.gather(check())
                bad = [f"rank {r % g.n} {'after' if r >= g.n else 'before'} timing: {v}"
                       for r, v in enumerate(before + after) if v is not None]
                ok &= not bad
                sent = int(plan.all_splits[0].sum())
                lines.append({
                    "op": "dispatch_2d", "impl": name, "tokens": tokens, "hidden": hidden, "dtype": "bf16",
                    "pes": g.n, "experts_per_pe": ne, "routing": routing, "major_align": align,
                    "rows_sent": sent, "bytes_sent": sent * hidden * 2,
                    "time_us": round(times[0], 2), "time_us_per_rank": [round(t, 2) for t in times],
                    "checked": not bad, "method": method, "torch": torch.__version__,
                    "fence": g.fence[0] if name.startswith("torch") else None,
                })
                if g.rank == 0:
                    print(f"bench {name:>11}: {tokens:>5} tokens x {hidden} bf16, {routing:>7}: {times[0]:9.1f} us"
                          + ("" if not bad else "  CHECK FAILED " + "; ".join(bad)), flush=True)
    if g.rank == 0:
        with open(path, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in lines)
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the per-case files and cases.json")
    p.add_argument("--bench", metavar="JSONL", help="also time the dispatch; rank 0 writes JSON lines here")
    p.add_argument("--bench-routing", default="uniform,zipf", help="comma-separated: uniform, zipf")
    p.add_argument("--bench-warmup", type=int, default=5)
    p.add_argument("--bench-batches", type=int, default=25)
    p.add_argument("--bench-iters", type=int, default=10, help="back-to-back calls per timed batch")
    args = p.parse_args()
    g = Group()
    ok = run_cases(g, args.out)
    if args.bench:
        ok &= run_bench(g, args.bench, args.bench_routing.split(","), args.bench_warmup,
                        args.bench_batches, args.bench_iters)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
