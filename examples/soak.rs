//! A soak test: many collectives back to back, then many MoE dispatches,
//! every checked result exact, and this process's host and device memory
//! the same at the end as after the warm-up. What it catches: state that
//! wears out with reuse (epochs, signal pads, staging, graph replays) and
//! anything that leaks per call.
//!
//! ```text
//! shmemrun -n 2 target/release/examples/soak [--collectives N] [--replays M] [--json FILE]
//! ```
//!
//! 1. Warm-up: every collective below at every size, [`WARMUP_ROUNDS`]
//!    times each, all checked, as many again checked as in step 2, and
//!    [`WARMUP_REPLAYS`] dispatches. Then the baseline: this PE's resident
//!    set (`/proc/self/statm`) and, on the gpu backend, the device memory
//!    in use (`cuMemGetInfo`: total − free).
//! 2. `N` collectives (100000 by default), cycling through barrier,
//!    all_reduce (f32 sum, bf16 sum), all_gather, reduce_scatter (f32 sum),
//!    broadcast (the root goes round) and all_to_all, over [`SIZES`]
//!    elements per PE (per block), back to back. Every [`CHECK_EVERY`]th
//!    and the last get fresh inputs and a poisoned output and are checked
//!    element by element; 97 is prime to the 7 operations and 6 sizes, so
//!    the checks go round every (operation, size) pair.
//! 3. `M` dispatches (`all_to_all_v_2d`, 10000 by default), each with new
//!    random splits and rows written into the same buffers, its output and
//!    out_splits_offsets checked against what the host computes: on the
//!    gpu backend one CUDA graph, captured once and replayed; on the host
//!    backend eager calls.
//! 4. Memory again: the device's must not differ at all, the resident set
//!    may grow by at most [`RSS_SLACK_KIB`].
//!
//! Values that are moved are `pe << 56 | iteration << 32 | index` (u64),
//! so a wrong one says where it came from; reductions sum small integers
//! drawn from the same triple, exact in f32 and bf16.
//!
//! Each PE prints one summary line. With `--json FILE`, PE 0 writes one
//! JSON object: `pes`, `backend`, `collectives`, `replays`, `seconds`
//! (phases 2 and 3; also `collective_seconds`, `replay_seconds`), per PE
//! `rss_kib_before`/`rss_kib_after` and `device_used_bytes_before`/`_after`
//! (null on the host backend), `rss_slack_kib`, and `ok`. Exits non-zero on
//! a wrong value or on growth (the PE concerned names it).

use clap::Parser;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use shmem::{bf16, BackendKind, Context, Element, ReduceOp, Stream, SymSlice, SymmetricBuffer};
use std::fmt::Debug;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Soak: collectives and MoE dispatches, checked, and memory compared.
#[derive(Parser, Debug)]
#[command(name = "soak")]
struct Args {
    /// Collectives after the warm-up.
    #[arg(long, default_value_t = 100_000)]
    collectives: u64,
    /// MoE dispatches (graph replays on the gpu backend) after the warm-up.
    #[arg(long, default_value_t = 10_000)]
    replays: u64,
    /// PE 0 writes the summary here, as one JSON object.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// Elements per PE (per block for the blocked collectives): odd sizes for
/// the kernels' tails, up to 256 KiB of f32 and 512 KiB of u64.
const SIZES: [usize; 6] = [1, 7, 33, 1000, 4099, 65_541];
const MAX_LEN: usize = 65_541;
/// Checked warm-up calls of each (operation, size) pair (300 of each
/// operation), and as many again checked as the soak checks.
const WARMUP_ROUNDS: u64 = 50;
const CHECK_EVERY: u64 = 97;
const WARMUP_REPLAYS: u64 = 200;
/// Resident-set growth tolerated. A leak is not the only way RSS grows:
/// glibc's malloc keeps freed memory in its arenas and hands it out again
/// rather than returning it, and where the vectors of the checks land
/// shifts, so an arena can settle a few pages higher than after the
/// warm-up. 8 MiB is far above that and far below what a leak of a few
/// bytes per call comes to over the default 100000 collectives.
const RSS_SLACK_KIB: u64 = 8 << 10;

// The dispatch: each PE's input of IN_ROWS rows, EXPERTS_PER_PE experts
// per PE, each expert's block padded to ALIGN rows.
const IN_ROWS: usize = 48;
const ROW_LEN: usize = 16;
const EXPERTS_PER_PE: usize = 3;
const ALIGN: usize = 8;
/// What out_splits_offsets is poisoned with.
const POISON_SO: i64 = -7;

#[derive(Clone, Copy, Debug)]
enum Op {
    Barrier,
    AllReduceF32,
    AllReduceBf16,
    AllGather,
    ReduceScatter,
    Broadcast,
    AllToAll,
}

const OPS: [Op; 7] =
    [Op::Barrier, Op::AllReduceF32, Op::AllReduceBf16, Op::AllGather, Op::ReduceScatter, Op::Broadcast, Op::AllToAll];

/// Iteration `it`'s operation and size: the operations in turn, the size
/// moving on after each full turn.
fn plan(it: u64) -> (Op, usize) {
    (OPS[(it % OPS.len() as u64) as usize], SIZES[(it / OPS.len() as u64 % SIZES.len() as u64) as usize])
}

/// SplitMix64's finaliser (the project has no random-number crate).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A value that names its sender, its index there and the iteration
/// (modulo 2^24).
fn value(pe: usize, index: usize, it: u64) -> u64 {
    (pe as u64) << 56 | (it & 0xff_ffff) << 32 | (index as u64 & 0xffff_ffff)
}

/// A reduction input: an integer in −a..=a drawn from (PE, index,
/// iteration), a = min(8, 256 / n), so that every partial sum of the `n`
/// PEs' values is an integer of magnitude at most 256: exact in bf16 (8
/// significant bits) and f32, in any order. A sum cannot name its sources,
/// but a missing, doubled or stale input changes most elements.
fn small(pe: usize, index: usize, it: u64, n: usize) -> f32 {
    let a = (256 / n as u64).clamp(1, 8);
    (mix(value(pe, index, it)) % (2 * a + 1)) as f32 - a as f32
}

/// Element types the checks compare: a poison no result equals, and a way
/// to show a value in a failure message.
trait Checked: Element + PartialEq + Debug {
    fn poison() -> Self;
    fn show(self) -> String {
        format!("{self:?}")
    }
}

impl Checked for u64 {
    fn poison() -> Self {
        0x5a5a_5a5a_5a5a_5a5a
    }
    fn show(self) -> String {
        format!("{self:#x} (PE {}, iteration {}, index {})", self >> 56, self >> 32 & 0xff_ffff, self & 0xffff_ffff)
    }
}

impl Checked for i64 {
    fn poison() -> Self {
        POISON_SO
    }
}

impl Checked for f32 {
    fn poison() -> Self {
        f32::NAN
    }
}

impl Checked for bf16 {
    fn poison() -> Self {
        bf16::NAN
    }
}

/// Writes `f(i)` into element `i` of this PE's `dst`.
fn write<T: Checked>(dst: SymSlice<'_, T>, f: impl Fn(usize) -> T, s: &Stream) -> shmem::Result<()> {
    dst.copy_from_host(&(0..dst.len()).map(f).collect::<Vec<_>>(), s)
}

fn poison<T: Checked>(dst: SymSlice<'_, T>, s: &Stream) -> shmem::Result<()> {
    write(dst, |_| T::poison(), s)
}

/// Compares `got` with `want(i)`, naming the first wrong element and how
/// many are wrong.
fn compare<T: Checked>(what: &dyn Fn() -> String, got: &[T], want: impl Fn(usize) -> T) -> Res {
    let mut bad = (0..got.len()).filter(|&i| got[i] != want(i));
    let Some(i) = bad.next() else { return Ok(()) };
    let count = 1 + bad.count();
    let (g, w) = (got[i].show(), want(i).show());
    Err(format!("{}: {count} of {} elements wrong; element {i} is {g}, expected {w}", what(), got.len()).into())
}

/// This PE's copy of `dst`, compared with `want`.
fn verify<T: Checked>(what: &dyn Fn() -> String, dst: SymSlice<'_, T>, want: impl Fn(usize) -> T, s: &Stream) -> Res {
    compare(what, &dst.copy_to_host(s)?, want)
}

/// The collectives' buffers, sliced to each call's size.
struct Collectives {
    /// One slot per PE, written by every PE before a checked barrier.
    flags: SymmetricBuffer<u64>,
    f32_src: SymmetricBuffer<f32>,
    f32_dst: SymmetricBuffer<f32>,
    bf16_src: SymmetricBuffer<bf16>,
    bf16_dst: SymmetricBuffer<bf16>,
    u64_src: SymmetricBuffer<u64>,
    u64_dst: SymmetricBuffer<u64>,
}

impl Collectives {
    fn new(ctx: &Context) -> shmem::Result<Collectives> {
        let n = ctx.n_pes();
        Ok(Collectives {
            flags: ctx.alloc_zeroed(n)?,
            f32_src: ctx.alloc_zeroed(MAX_LEN * n)?,
            f32_dst: ctx.alloc_zeroed(MAX_LEN)?,
            bf16_src: ctx.alloc_zeroed(MAX_LEN)?,
            bf16_dst: ctx.alloc_zeroed(MAX_LEN)?,
            u64_src: ctx.alloc_zeroed(MAX_LEN * n)?,
            u64_dst: ctx.alloc_zeroed(MAX_LEN * n)?,
        })
    }

    /// Iteration `it`; when `check`, with fresh inputs, a poisoned output,
    /// and the result compared.
    fn step(&self, ctx: &Context, s: &Stream, it: u64, check: bool) -> Res {
        let (me, n) = (ctx.my_pe(), ctx.n_pes());
        let (op, len) = plan(it);
        let what = || format!("PE {me}: {op:?} of {len} element(s) per PE, iteration {it}");
        let x = |pe: usize, i: usize| small(pe, i, it, n);
        match op {
            Op::Barrier => {
                // Every PE's put must be visible once the barrier is done.
                // The next checked barrier's puts cannot overtake this
                // read: they come after collectives that need this PE.
                if check {
                    for pe in 0..n {
                        ctx.p(&self.flags, me, value(me, pe, it), pe, s)?;
                    }
                }
                ctx.barrier_all(s)?;
                if check {
                    verify(&what, self.flags.slice(..), |j| value(j, me, it), s)?;
                }
            }
            Op::AllReduceF32 => {
                let (src, dst) = (self.f32_src.slice(..len), self.f32_dst.slice(..len));
                if check {
                    write(src, |i| x(me, i), s)?;
                    poison(dst, s)?;
                }
                ctx.all_reduce(dst, src, ReduceOp::Sum, s)?;
                if check {
                    verify(&what, dst, |i| (0..n).map(|pe| x(pe, i)).sum(), s)?;
                }
            }
            Op::AllReduceBf16 => {
                let (src, dst) = (self.bf16_src.slice(..len), self.bf16_dst.slice(..len));
                if check {
                    write(src, |i| bf16::from_f32(x(me, i)), s)?;
                    poison(dst, s)?;
                }
                ctx.all_reduce(dst, src, ReduceOp::Sum, s)?;
                if check {
                    verify(&what, dst, |i| bf16::from_f32((0..n).map(|pe| x(pe, i)).sum()), s)?;
                }
            }
            Op::AllGather => {
                let (src, dst) = (self.u64_src.slice(..len), self.u64_dst.slice(..len * n));
                if check {
                    write(src, |i| value(me, i, it), s)?;
                    poison(dst, s)?;
                }
                ctx.all_gather(dst, src, s)?;
                if check {
                    verify(&what, dst, |i| value(i / len, i % len, it), s)?;
                }
            }
            Op::ReduceScatter => {
                let (src, dst) = (self.f32_src.slice(..len * n), self.f32_dst.slice(..len));
                if check {
                    write(src, |i| x(me, i), s)?;
                    poison(dst, s)?;
                }
                ctx.reduce_scatter(dst, src, ReduceOp::Sum, s)?;
                if check {
                    verify(&what, dst, |i| (0..n).map(|pe| x(pe, me * len + i)).sum(), s)?;
                }
            }
            Op::Broadcast => {
                // The next root after each turn of every (operation, size)
                // pair, so that every size has every root.
                let root = (it / (OPS.len() * SIZES.len()) as u64 % n as u64) as usize;
                let (src, dst) = (self.u64_src.slice(..len), self.u64_dst.slice(..len));
                if check {
                    write(src, |i| value(me, i, it), s)?;
                    poison(dst, s)?;
                }
                ctx.broadcast(dst, src, root, s)?;
                if check {
                    let what = || format!("{} from root {root}", what());
                    verify(&what, dst, |i| value(root, i, it), s)?;
                }
            }
            Op::AllToAll => {
                let (src, dst) = (self.u64_src.slice(..len * n), self.u64_dst.slice(..len * n));
                if check {
                    write(src, |i| value(me, i, it), s)?;
                    poison(dst, s)?;
                }
                ctx.all_to_all(dst, src, s)?;
                if check {
                    verify(&what, dst, |i| value(i / len, me * len + i % len, it), s)?;
                }
            }
        }
        Ok(())
    }
}

/// One 2D MoE dispatch's buffers (the graph's, on the gpu backend).
struct Dispatch {
    input: SymmetricBuffer<u64>,
    in_splits: SymmetricBuffer<i64>,
    output: SymmetricBuffer<u64>,
    out_splits_offsets: SymmetricBuffer<i64>,
}

/// PE `pe`'s splits at `replay` (`m` entries), drawn in turn as: spread at
/// random over up to all rows, everything to one entry, up to
/// `IN_ROWS / m` rows each, nothing at all, and every row spread at random.
fn splits(replay: u64, pe: usize, m: usize) -> Vec<i64> {
    let r = |k: usize| mix(mix(replay ^ 0x50a4) ^ (pe as u64) << 40 ^ k as u64) as usize;
    let mut s = vec![0i64; m];
    match replay % 5 {
        0 => (0..r(0) % (IN_ROWS + 1)).for_each(|row| s[r(1 + row) % m] += 1),
        1 => s[r(0) % m] = IN_ROWS as i64,
        2 => s.iter_mut().enumerate().for_each(|(k, x)| *x = (r(k) % (IN_ROWS / m + 1)) as i64),
        3 => {}
        _ => (0..IN_ROWS).for_each(|row| s[r(1 + row) % m] += 1),
    }
    s
}

impl Dispatch {
    /// Rows of the output: the most any PE can receive, with padding.
    fn out_rows(n: usize) -> usize {
        n * IN_ROWS + EXPERTS_PER_PE * ALIGN
    }

    fn new(ctx: &Context) -> shmem::Result<Dispatch> {
        let (n, m) = (ctx.n_pes(), ctx.n_pes() * EXPERTS_PER_PE);
        Ok(Dispatch {
            input: ctx.alloc_zeroed(IN_ROWS * ROW_LEN)?,
            in_splits: ctx.alloc_zeroed(m)?,
            output: ctx.alloc_zeroed(Dispatch::out_rows(n) * ROW_LEN)?,
            out_splits_offsets: ctx.alloc_zeroed(2 * m)?,
        })
    }

    fn call(&self, ctx: &Context, s: &Stream) -> shmem::Result<()> {
        let (input, output, so) = (&self.input, &self.output, &self.out_splits_offsets);
        ctx.all_to_all_v_2d(input, output, &self.in_splits, so, ROW_LEN, ALIGN, s)
    }

    /// Replay `replay`'s inputs and splits, and poisoned outputs.
    fn prepare(&self, ctx: &Context, s: &Stream, replay: u64) -> shmem::Result<()> {
        let me = ctx.my_pe();
        write(self.input.slice(..), |i| value(me, i, replay), s)?;
        self.in_splits.copy_from_host(&splits(replay, me, ctx.n_pes() * EXPERTS_PER_PE), s)?;
        poison(self.output.slice(..), s)?;
        poison(self.out_splits_offsets.slice(..), s)
    }

    /// The output and out_splits_offsets against the dispatch rule: for
    /// each local expert, every source's chunk in PE order, the block
    /// padded to `max(round_up(rows, ALIGN), ALIGN)` rows, which keep
    /// their poison.
    fn check(&self, ctx: &Context, s: &Stream, replay: u64) -> Res {
        let (me, n) = (ctx.my_pe(), ctx.n_pes());
        let m = n * EXPERTS_PER_PE;
        let all: Vec<Vec<i64>> = (0..n).map(|pe| splits(replay, pe, m)).collect();
        let mut want = vec![u64::poison(); Dispatch::out_rows(n) * ROW_LEN];
        let (mut out_splits, mut out_offsets) = (Vec::with_capacity(m), Vec::with_capacity(m));
        let mut at = 0;
        for e in 0..EXPERTS_PER_PE {
            let block = at;
            for (src, sp) in all.iter().enumerate() {
                let entry = me * EXPERTS_PER_PE + e;
                let (from, rows) = (sp[..entry].iter().sum::<i64>() as usize, sp[entry] as usize);
                for k in 0..rows * ROW_LEN {
                    want[at * ROW_LEN + k] = value(src, from * ROW_LEN + k, replay);
                }
                out_splits.push(rows as i64);
                out_offsets.push(at as i64);
                at += rows;
            }
            at = block + (at - block).div_ceil(ALIGN).max(1) * ALIGN;
        }
        let what = || format!("PE {me}: dispatch {replay}: output");
        verify(&what, self.output.slice(..), |i| want[i], s)?;
        let what = || format!("PE {me}: dispatch {replay}: out_splits_offsets");
        let so = [out_splits, out_offsets].concat();
        verify(&what, self.out_splits_offsets.slice(..), |i| so[i], s)
    }
}

/// How the dispatches run: a replayed graph (gpu) or eager calls (host).
enum Runner {
    Graph(CudaGraph),
    Eager,
}

impl Runner {
    /// Captures one dispatch on the gpu backend.
    fn new(ctx: &Context, s: &Stream, d: &Dispatch) -> Res<Runner> {
        let Some(stream) = s.cuda_stream() else { return Ok(Runner::Eager) };
        ctx.barrier_all(s)?;
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let captured = d.call(ctx, s);
        let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
        captured?;
        Ok(Runner::Graph(graph.ok_or("the capture gave no graph")?))
    }

    fn replay(&self, ctx: &Context, s: &Stream, d: &Dispatch, replay: u64) -> Res {
        d.prepare(ctx, s, replay)?;
        match self {
            Runner::Graph(g) => g.launch()?,
            Runner::Eager => d.call(ctx, s)?,
        }
        d.check(ctx, s, replay)
    }
}

/// This PE's memory: resident set, and device memory in use (gpu).
#[derive(Clone, Copy, Debug)]
struct Memory {
    rss_kib: u64,
    device_used: Option<u64>,
}

impl Memory {
    fn now(ctx: &Context) -> Res<Memory> {
        let statm = std::fs::read_to_string("/proc/self/statm")?;
        let pages: u64 = statm.split_whitespace().nth(1).ok_or("/proc/self/statm: no resident field")?.parse()?;
        // SAFETY: sysconf reads a constant of the system; no memory is involved.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let rss_kib = pages * page.max(1) as u64 / 1024;
        let device_used = match ctx.cuda_context() {
            Some(cuda) => {
                cuda.bind_to_thread()?;
                let (free, total) = cudarc::driver::result::mem_get_info()?;
                Some((total - free) as u64)
            }
            None => None,
        };
        Ok(Memory { rss_kib, device_used })
    }

    /// What grew past what is allowed since `before`.
    fn growth(&self, before: &Memory) -> Vec<String> {
        let mut out = Vec::new();
        if self.rss_kib > before.rss_kib + RSS_SLACK_KIB {
            out.push(format!(
                "host RSS grew by {} KiB ({} → {} KiB; {RSS_SLACK_KIB} KiB allowed)",
                self.rss_kib - before.rss_kib,
                before.rss_kib,
                self.rss_kib
            ));
        }
        if let (Some(b), Some(a)) = (before.device_used, self.device_used) {
            if a != b {
                out.push(format!("device memory in use changed by {:+} bytes ({b} → {a})", a as i64 - b as i64));
            }
        }
        out
    }
}

/// `x` as a JSON string.
fn json_string(x: &dyn std::fmt::Display) -> String {
    let mut out = String::from("\"");
    for c in x.to_string().chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out + "\""
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What a soak measured on this PE.
struct Measured {
    before: Memory,
    after: Memory,
    coll_secs: f64,
    replay_secs: f64,
}

/// Warm-up, baseline, the collectives and the dispatches, memory again.
fn soak(ctx: &Context, s: &Stream, args: &Args) -> Res<Measured> {
    // Everything is allocated, and the graph captured, before the
    // baseline: nothing that follows should need new memory.
    let colls = Collectives::new(ctx)?;
    let dispatch = Dispatch::new(ctx)?;
    let runner = Runner::new(ctx, s, &dispatch)?;
    // The first half checks every call; the second runs as the soak does,
    // 97 calls queued between checks, so that whatever the driver sizes by
    // the depth of a stream's queue has its size before the baseline.
    let half = WARMUP_ROUNDS * (OPS.len() * SIZES.len()) as u64;
    for it in 0..2 * half {
        colls.step(ctx, s, it, it < half || it % CHECK_EVERY == 0)?;
    }
    for replay in 0..WARMUP_REPLAYS {
        runner.replay(ctx, s, &dispatch, replay)?;
    }
    ctx.barrier_all(s)?;
    s.synchronize()?;
    let before = Memory::now(ctx)?;

    let start = Instant::now();
    for k in 0..args.collectives {
        let check = k % CHECK_EVERY == 0 || k + 1 == args.collectives;
        colls.step(ctx, s, 2 * half + k, check)?;
    }
    s.synchronize()?;
    let coll_secs = start.elapsed().as_secs_f64();
    let start = Instant::now();
    for k in 0..args.replays {
        runner.replay(ctx, s, &dispatch, WARMUP_REPLAYS + k)?;
    }
    ctx.barrier_all(s)?;
    s.synchronize()?;
    ctx.check_device()?;
    let replay_secs = start.elapsed().as_secs_f64();
    Ok(Measured { before, after: Memory::now(ctx)?, coll_secs, replay_secs })
}

/// Whether this PE's memory held; errors for wrong results.
fn run(args: &Args) -> Res<bool> {
    let ctx = shmem::init()?;
    let (me, n, s) = (ctx.my_pe(), ctx.n_pes(), ctx.stream());
    let backend = if ctx.backend() == BackendKind::Gpu { "gpu" } else { "host" };
    let json = args.json.as_ref().filter(|_| me == 0);
    let m = soak(&ctx, &s, args).inspect_err(|e| {
        if let Some(path) = json {
            let text = format!("{{\"pes\":{n},\"backend\":\"{backend}\",\"ok\":false,\"error\":{}}}\n", json_string(e));
            let _ = std::fs::write(path, text);
        }
    })?;
    let growth = m.after.growth(&m.before);
    for g in &growth {
        eprintln!("soak: PE {me}: {g}");
    }
    let ok = growth.is_empty();
    let per = |secs: f64, count: u64| if count == 0 { 0.0 } else { secs * 1e6 / count as f64 };
    let device = match (m.before.device_used, m.after.device_used) {
        (Some(b), Some(a)) => format!(", device memory in use {b} → {a} bytes"),
        _ => String::new(),
    };
    println!(
        "soak: PE {me} of {n} ({backend}): {} collectives in {:.2} s ({:.1} µs each), {} dispatches in \
         {:.2} s ({:.1} µs each), RSS {} → {} KiB{device}: {}",
        args.collectives,
        m.coll_secs,
        per(m.coll_secs, args.collectives),
        args.replays,
        m.replay_secs,
        per(m.replay_secs, args.replays),
        m.before.rss_kib,
        m.after.rss_kib,
        if ok { "ok" } else { "FAILED" }
    );

    // Every PE's numbers to PE 0, for the JSON (this buffer is allocated
    // after both measurements).
    let mine = [
        m.before.rss_kib,
        m.after.rss_kib,
        m.before.device_used.unwrap_or(u64::MAX),
        m.after.device_used.unwrap_or(u64::MAX),
        ok as u64,
    ];
    let (one, all) = (ctx.alloc::<u64>(mine.len())?, ctx.alloc::<u64>(mine.len() * n)?);
    one.copy_from_host(&mine, &s)?;
    ctx.all_gather(&all, &one, &s)?;
    let all = all.copy_to_host(&s)?;
    if let Some(path) = json {
        let column = |k: usize| -> String {
            let v: Vec<String> = (0..n).map(|pe| all[pe * mine.len() + k].to_string()).collect();
            format!("[{}]", v.join(","))
        };
        let device = |k: usize| if backend == "gpu" { column(k) } else { "null".into() };
        let all_ok = (0..n).all(|pe| all[pe * mine.len() + 4] == 1);
        let text = format!(
            "{{\"pes\":{n},\"backend\":\"{backend}\",\"collectives\":{},\"replays\":{},\"seconds\":{:.3},\
             \"collective_seconds\":{:.3},\"replay_seconds\":{:.3},\"rss_kib_before\":{},\"rss_kib_after\":{},\
             \"rss_slack_kib\":{RSS_SLACK_KIB},\"device_used_bytes_before\":{},\"device_used_bytes_after\":{},\
             \"ok\":{all_ok}}}\n",
            args.collectives,
            args.replays,
            m.coll_secs + m.replay_secs,
            m.coll_secs,
            m.replay_secs,
            column(0),
            column(1),
            device(2),
            device(3),
        );
        std::fs::write(path, text)?;
    }
    // A barrier: no PE exits (which stops the others under shmemrun)
    // before PE 0 has written the JSON.
    ctx.finalize()?;
    Ok(ok)
}
