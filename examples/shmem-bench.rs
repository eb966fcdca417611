//! shmem-bench: put bandwidth, barrier latency and all-reduce time per
//! message size, next to a plain `memcpy` of the same size.
//!
//! Run alone it starts itself as `--pes` PEs (2 by default); under
//! `shmemrun`/`mpirun` it runs on the world it is given. PE 0 prints a
//! table and, with `--json PATH`, writes one JSON object per row.
//!
//! Every time is the median over `--iters` timed iterations after
//! `--warmup` untimed ones, taken on PE 0 with `std::time::Instant`. Each
//! result is checked once per size, outside the timed region.

use clap::{Parser, ValueEnum};
use shmem::launch::Launch;
use shmem::{BackendKind, Config, Context, ReduceOp, Stream};
use std::fmt::Write as _;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

#[derive(Parser, Debug)]
#[command(about = "Measure shmem put, barrier and all-reduce against memcpy")]
struct Args {
    /// Backend to measure
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// Operation to measure
    #[arg(long, value_enum, default_value_t = Op::All)]
    op: Op,
    /// Smallest message: bytes, a multiple of 4 (K, M, G suffixes allowed)
    #[arg(long, default_value = "8", value_parser = parse_bytes)]
    min_bytes: usize,
    /// Largest message; sizes double from --min-bytes up to it
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    max_bytes: usize,
    /// Timed iterations per size [default: enough to move 256 MiB, within 10..=1000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    iters: Option<u64>,
    /// Untimed iterations before timing each size
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Also write the rows here, one JSON object per line
    #[arg(long)]
    json: Option<PathBuf>,
    /// PEs to start when run on its own
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pes: u64,
    /// GPU backend: also time all-reduces captured in a CUDA graph and replayed
    #[arg(long)]
    graph: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    Host,
    Gpu,
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Op {
    Put,
    Barrier,
    #[value(name = "all_reduce")]
    AllReduce,
    All,
}

fn parse_bytes(s: &str) -> Result<usize, String> {
    match shmem::config::parse_size(s) {
        Some(n) if n > 0 => Ok(n),
        _ => Err(format!("{s:?} is not a positive size such as 8, 64K or 256M")),
    }
}

/// One line of the table and of the JSON output.
struct Row {
    /// Timed as CUDA-graph replays.
    graph: bool,
    op: &'static str,
    imp: &'static str,
    /// `None` for the barrier, which moves no data.
    dtype: Option<&'static str>,
    bytes: usize,
    time_us: f64,
    /// Bus bandwidth over algorithm bandwidth: 2(n-1)/n for all-reduce.
    bus_factor: f64,
    /// The memcpy time for the same bytes, for the ratio.
    memcpy_us: Option<f64>,
}

impl Row {
    /// An f32-sum all-reduce row over `n` PEs.
    fn all_reduce(imp: &'static str, graph: bool, bytes: usize, time_us: f64, n: usize, memcpy_us: Option<f64>) -> Row {
        let bus_factor = 2.0 * (n - 1) as f64 / n as f64;
        Row { graph, op: "all_reduce", imp, dtype: Some("f32"), bytes, time_us, bus_factor, memcpy_us }
    }

    fn algbw_gbps(&self) -> Option<f64> {
        self.dtype.map(|_| self.bytes as f64 / (self.time_us * 1e3))
    }
    fn busbw_gbps(&self) -> Option<f64> {
        self.algbw_gbps().map(|a| a * self.bus_factor)
    }
    /// How many times faster than memcpy (below 1: slower).
    fn vs_memcpy(&self) -> Option<f64> {
        self.memcpy_us.map(|m| m / self.time_us)
    }
}

/// A JSON number, or null where there is none (or it is not finite).
fn num(x: Option<f64>) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.4}"),
        _ => "null".into(),
    }
}

fn cell(x: Option<f64>, width: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:>width$.2}"),
        _ => format!("{:>width$}", "-"),
    }
}

fn main() {
    let args = Args::parse();
    if args.min_bytes > args.max_bytes || args.min_bytes % 4 != 0 {
        // Sizes double from the minimum, so all are whole u32 and f32 counts.
        eprintln!(
            "shmem-bench: --min-bytes ({}) must be a multiple of 4 and at most --max-bytes ({})",
            args.min_bytes, args.max_bytes
        );
        std::process::exit(2);
    }
    if !shmem::bootstrap::started_by_launcher() {
        std::process::exit(relaunch(args.pes as usize));
    }
    if let Err(e) = run(&args) {
        eprintln!("shmem-bench failed: {e}");
        std::process::exit(1);
    }
}

/// Runs this program again, with the same arguments, as `pes` PEs.
fn relaunch(pes: usize) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("shmem-bench: cannot find my own executable: {e}");
            return 1;
        }
    };
    // Untagged: only PE 0 prints, and the table should stay copy-pastable.
    let launch = Launch::new(pes, exe).args(std::env::args_os().skip(1)).tag_output(false).kill_on_failure(true);
    match launch.run() {
        Ok(outcome) => outcome.exit_code(),
        Err(e) => {
            eprintln!("shmem-bench: launching {pes} PEs failed: {e}");
            1
        }
    }
}

struct Bench<'a> {
    ctx: &'a Context,
    s: Stream,
    args: &'a Args,
    sizes: Vec<usize>,
}

impl Bench<'_> {
    fn iters(&self, bytes: usize) -> usize {
        match self.args.iters {
            Some(n) => n as usize,
            None => ((256usize << 20) / bytes.max(1)).clamp(10, 1000),
        }
    }

    /// Median in µs of `iters` runs of `op`, each after an untimed `setup`.
    ///
    /// On the GPU backend the operations are asynchronous: they are timed
    /// with CUDA events around a batch of `iters` back-to-back operations,
    /// five batches, and the median batch's mean is returned.
    fn time(&self, bytes: usize, mut setup: impl FnMut() -> Res, mut op: impl FnMut() -> Res) -> Res<f64> {
        for _ in 0..self.args.warmup {
            setup()?;
            op()?;
        }
        if let Some(stream) = self.s.cuda_stream() {
            let iters = self.iters(bytes);
            let mut batches = Vec::new();
            for _ in 0..5 {
                stream.synchronize()?;
                let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
                let start = stream.record_event(timing)?;
                for _ in 0..iters {
                    op()?;
                }
                let end = stream.record_event(timing)?;
                end.synchronize()?;
                batches.push(start.elapsed_ms(&end)? as f64 * 1e3 / iters as f64);
            }
            batches.sort_by(f64::total_cmp);
            return Ok(batches[2]);
        }
        let mut t = Vec::with_capacity(self.iters(bytes));
        for _ in 0..self.iters(bytes) {
            setup()?;
            let start = Instant::now();
            op()?;
            self.s.synchronize()?;
            t.push(start.elapsed().as_secs_f64() * 1e6);
        }
        t.sort_by(f64::total_cmp);
        Ok(t[t.len() / 2])
    }

    /// The baseline: on the host backend memcpy between two vectors of this
    /// process; on the GPU backend a copy-engine copy into the peer's memory
    /// through its NVLink address (the peer-copy ceiling). PE 0 alone.
    fn memcpy(&self) -> Res<Vec<f64>> {
        let mut times = Vec::new();
        if self.ctx.backend() == BackendKind::Gpu {
            let max = *self.sizes.last().unwrap();
            let src = self.ctx.alloc_zeroed::<u32>(max / 4)?;
            let dst = self.ctx.alloc_zeroed::<u32>(max / 4)?;
            let peer = 1 % self.ctx.n_pes();
            if self.ctx.my_pe() == 0 {
                let to = dst.peer_ptr(peer).ok_or("the peer is not reachable over NVLink")? as u64;
                let from = src.local_ptr() as u64;
                let stream = self.s.cuda_stream().expect("gpu backend").clone();
                for &b in &self.sizes {
                    let copy = || {
                        // SAFETY: both are `b` bytes of live symmetric buffers.
                        unsafe { cudarc::driver::result::memcpy_dtod_async(to, from, b, stream.cu_stream())? };
                        Ok(())
                    };
                    times.push(self.time(b, || Ok(()), copy)?);
                }
            }
            self.ctx.barrier_all(&self.s)?;
            return Ok(times);
        }
        if self.ctx.my_pe() == 0 {
            let max = *self.sizes.last().unwrap();
            // Non-zero contents: a zeroed vector may read from the kernel's
            // shared zero page, which would flatter the baseline.
            let src: Vec<u8> = (0..max).map(|i| i as u8 | 1).collect();
            let mut dst = vec![0u8; max];
            for &b in &self.sizes {
                // copy_from_slice is copy_nonoverlapping, i.e. memcpy; black_box
                // keeps the compiler from dropping copies nobody reads.
                let copy = || {
                    black_box(&mut dst[..b]).copy_from_slice(&src[..b]);
                    Ok(())
                };
                times.push(self.time(b, || Ok(()), copy)?);
            }
        }
        self.ctx.barrier_all(&self.s)?;
        Ok(times)
    }

    /// PE 0 puts `bytes / 4` u32 to PE 1 (to itself in a world of one);
    /// PE 1 checks the data. (shmem has no byte element type.)
    fn put(&self, memcpy_us: &[f64]) -> Res<Vec<Row>> {
        let (me, n) = (self.ctx.my_pe(), self.ctx.n_pes());
        let peer = 1 % n;
        let max = *self.sizes.last().unwrap() / 4;
        let src = self.ctx.alloc::<u32>(max)?;
        let dst = self.ctx.alloc::<u32>(max)?;
        let mut rows = Vec::new();
        for (k, &b) in self.sizes.iter().enumerate() {
            let len = b / 4;
            // Different for every element and size, so a short, misplaced
            // or stale put shows.
            let pattern: Vec<u32> = (0..len as u32).map(|i| i ^ (len as u32).rotate_right(8)).collect();
            if me == 0 {
                src.slice(..len).copy_from_host(&pattern, &self.s)?;
                let put = || Ok(self.ctx.put(dst.slice(..len), src.slice(..len), peer, &self.s)?);
                rows.push(Row {
                    graph: false,
                    op: "put",
                    imp: "shmem",
                    dtype: Some("u32"),
                    bytes: b,
                    time_us: self.time(b, || Ok(()), put)?,
                    bus_factor: 1.0,
                    memcpy_us: memcpy_us.get(k).copied(),
                });
                // Get the same bytes back from the peer's source copy.
                let get = || Ok(self.ctx.get(src.slice(..len), src.slice(..len), peer, &self.s)?);
                rows.push(Row {
                    graph: false,
                    op: "get",
                    imp: "shmem",
                    dtype: Some("u32"),
                    bytes: b,
                    time_us: self.time(b, || Ok(()), get)?,
                    bus_factor: 1.0,
                    memcpy_us: memcpy_us.get(k).copied(),
                });
            }
            self.ctx.barrier_all(&self.s)?; // the puts are complete and visible
            if me == peer && dst.slice(..len).copy_to_host(&self.s)? != pattern {
                return Err(format!("put of {len} u32: PE {peer} received wrong data").into());
            }
            self.ctx.barrier_all(&self.s)?; // checked before the next size overwrites it
        }
        Ok(rows)
    }

    /// Back-to-back barriers on every PE: each one lasts until the last PE arrives.
    fn barrier(&self) -> Res<Row> {
        let time_us = self.time(0, || Ok(()), || Ok(self.ctx.barrier_all(&self.s)?))?;
        Ok(Row {
            graph: false,
            op: "barrier",
            imp: "shmem",
            dtype: None,
            bytes: 0,
            time_us,
            bus_factor: 0.0,
            memcpy_us: None,
        })
    }

    /// f32 sum of `bytes / 4` elements into a separate output, so the
    /// inputs stay the same and every iteration computes the same result.
    fn all_reduce(&self, memcpy_us: &[f64]) -> Res<Vec<Row>> {
        let mut rows = self.all_reduce_with("shmem", memcpy_us)?;
        if self.args.graph && self.ctx.backend() == BackendKind::Gpu {
            rows.extend(self.all_reduce_graph(memcpy_us)?);
        }
        if self.ctx.backend() == BackendKind::Gpu {
            // NVSHMEM's own collective, which force_rma selects, in the
            // same run for the ratio. Every PE sets it at the same point.
            self.ctx
                .set_collectives(shmem::Collectives { implementation: shmem::CollImpl::Nvshmem, ..Default::default() });
            rows.extend(self.all_reduce_with("nvshmem", memcpy_us)?);
            self.ctx.set_collectives(Default::default());
            // NCCL last: a failure there leaves the rows above intact.
            match self.nccl_all_reduce(memcpy_us) {
                Ok(nccl) => rows.extend(nccl),
                Err(e) => eprintln!("shmem-bench: NCCL rows skipped on PE {}: {e}", self.ctx.my_pe()),
            }
        }
        Ok(rows)
    }

    /// NCCL's all-reduce (cudarc's bindings to the box's libnccl) on plain
    /// device buffers of the same sizes, eager and (with --graph, up to
    /// 1 MiB) graph-replayed: the reference of the same run.
    fn nccl_all_reduce(&self, memcpy_us: &[f64]) -> Res<Vec<Row>> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        use cudarc::nccl::{Comm, Id, ReduceOp as NcclOp};
        // SAFETY: only tries to open the library.
        let present = unsafe { cudarc::nccl::sys::is_culib_present() };
        let (me, n) = (self.ctx.my_pe(), self.ctx.n_pes());
        if !present {
            if me == 0 {
                eprintln!("shmem-bench: no libnccl found: NCCL rows skipped");
            }
            return Ok(Vec::new());
        }
        // NCCL's unique id travels through a symmetric buffer.
        let id_buf = self.ctx.alloc_zeroed::<u64>(16)?;
        if me == 0 {
            let id = Id::new().map_err(|e| format!("ncclGetUniqueId: {e:?}"))?;
            let words: Vec<u64> =
                id.internal().chunks(8).map(|c| u64::from_le_bytes(std::array::from_fn(|i| c[i] as u8))).collect();
            id_buf.copy_from_host(&words, &self.s)?;
        }
        self.ctx.barrier_all(&self.s)?;
        let mut words = [0u64; 16];
        for (i, w) in words.iter_mut().enumerate() {
            *w = self.ctx.g(&id_buf, i, 0, &self.s)?;
        }
        let mut internal = [0 as std::ffi::c_char; 128];
        for (i, c) in internal.iter_mut().enumerate() {
            *c = (words[i / 8] >> (8 * (i % 8))) as u8 as std::ffi::c_char;
        }
        let stream = self.s.cuda_stream().expect("gpu backend").clone();
        // SAFETY: the NCCL buffers below are used on this one stream only, so
        // they need no cudarc events (events of other streams would also
        // break graph capture).
        unsafe { self.ctx.cuda_context().expect("gpu backend").disable_event_tracking() };
        let comm = Comm::from_rank(stream.clone(), me, n, Id::uninit(internal))
            .map_err(|e| format!("ncclCommInitRank: {e:?}"))?;
        // Not destroyed at the end: the benchmark exits right after, and a
        // communicator left in an error state can crash on destroy.
        let comm = std::mem::ManuallyDrop::new(comm);
        let max = *self.sizes.last().unwrap() / 4;
        let send = stream.clone_htod(&vec![(me + 1) as f32; max])?;
        let mut recv = stream.alloc_zeros::<f32>(max)?;
        let want = (n * (n + 1) / 2) as f32;
        let mut rows = Vec::new();
        for (k, &b) in self.sizes.iter().enumerate() {
            let len = b / 4;
            let src = send.slice(..len);
            let time_us = self.time(
                b,
                || Ok(()),
                || {
                    let mut dst = recv.slice_mut(..len);
                    comm.all_reduce(&src, &mut dst, &NcclOp::Sum).map_err(|e| format!("ncclAllReduce: {e:?}"))?;
                    Ok(())
                },
            )?;
            let got = stream.clone_dtoh(&recv.slice(..len))?;
            if got.iter().any(|&x| x != want) {
                return Err(format!("NCCL all_reduce of {len} f32 gave a wrong sum").into());
            }
            let row = |graph, time_us| Row::all_reduce("nccl", graph, b, time_us, n, memcpy_us.get(k).copied());
            rows.push(row(false, time_us));
            if self.args.graph && b <= 1 << 20 {
                const PER_GRAPH: usize = 100;
                let mut graphed = || -> Res<f64> {
                    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
                    let mut captured = Ok(());
                    for _ in 0..PER_GRAPH {
                        let mut dst = recv.slice_mut(..len);
                        captured = captured.and(comm.all_reduce(&src, &mut dst, &NcclOp::Sum).map(drop));
                    }
                    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
                    captured.map_err(|e| format!("capturing ncclAllReduce: {e:?}"))?;
                    time_graph(&stream, &graph.ok_or("the capture gave no graph")?, PER_GRAPH)
                };
                match graphed() {
                    Ok(t) => rows.push(row(true, t)),
                    Err(e) => eprintln!("shmem-bench: NCCL graph rows skipped: {e}"),
                }
            }
        }
        stream.synchronize()?;
        Ok(rows)
    }

    /// All-reduces captured once in a CUDA graph (100 per graph) and
    /// replayed: the device kernel's time without the host's. Sizes up to
    /// the one-shot kernel's 1 MiB (the others cannot be captured yet).
    fn all_reduce_graph(&self, memcpy_us: &[f64]) -> Res<Vec<Row>> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        const PER_GRAPH: usize = 100;
        let (me, n) = (self.ctx.my_pe(), self.ctx.n_pes());
        let stream = self.s.cuda_stream().expect("gpu backend").clone();
        let max = (*self.sizes.last().unwrap()).min(1 << 20) / 4;
        let src = self.ctx.alloc::<f32>(max)?;
        let dst = self.ctx.alloc::<f32>(max)?;
        src.fill((me + 1) as f32, &self.s)?;
        let want = (n * (n + 1) / 2) as f32;
        let mut rows = Vec::new();
        for (k, &b) in self.sizes.iter().enumerate().filter(|(_, &b)| b <= 1 << 20) {
            let len = b / 4;
            dst.fill(-1.0, &self.s)?;
            self.ctx.barrier_all(&self.s)?;
            stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
            let mut captured = Ok(());
            for _ in 0..PER_GRAPH {
                captured =
                    captured.and(self.ctx.all_reduce(dst.slice(..len), src.slice(..len), ReduceOp::Sum, &self.s));
            }
            let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
            captured?;
            let time_us = time_graph(&stream, &graph.ok_or("the capture gave no graph")?, PER_GRAPH)?;
            if dst.slice(..len).copy_to_host(&self.s)?.iter().any(|&x| x != want) {
                return Err(format!("graph all_reduce of {len} f32: PE {me} got a wrong sum").into());
            }
            rows.push(Row::all_reduce("shmem", true, b, time_us, n, memcpy_us.get(k).copied()));
        }
        Ok(rows)
    }

    fn all_reduce_with(&self, imp: &'static str, memcpy_us: &[f64]) -> Res<Vec<Row>> {
        let (me, n) = (self.ctx.my_pe(), self.ctx.n_pes());
        let max = *self.sizes.last().unwrap() / 4;
        let src = self.ctx.alloc::<f32>(max)?;
        let dst = self.ctx.alloc::<f32>(max)?;
        src.fill((me + 1) as f32, &self.s)?;
        let want = (n * (n + 1) / 2) as f32; // exact: a small integer
        let mut rows = Vec::new();
        for (k, &b) in self.sizes.iter().enumerate() {
            let len = b / 4;
            dst.fill(-1.0, &self.s)?;
            // The barrier before each iteration starts every PE together.
            let time_us = self.time(
                b,
                || Ok(self.ctx.barrier_all(&self.s)?),
                || Ok(self.ctx.all_reduce(dst.slice(..len), src.slice(..len), ReduceOp::Sum, &self.s)?),
            )?;
            if dst.slice(..len).copy_to_host(&self.s)?.iter().any(|&x| x != want) {
                return Err(format!("all_reduce ({imp}) of {len} f32: PE {me} got a wrong sum").into());
            }
            rows.push(Row::all_reduce(imp, false, b, time_us, n, memcpy_us.get(k).copied()));
        }
        Ok(rows)
    }
}

/// µs per operation of a graph of `per_graph` operations: uploaded, warmed
/// up, then 5 replays timed with CUDA events; the median.
fn time_graph(stream: &cudarc::driver::CudaStream, graph: &cudarc::driver::CudaGraph, per_graph: usize) -> Res<f64> {
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    graph.upload()?;
    for _ in 0..3 {
        graph.launch()?;
    }
    let mut reps = Vec::new();
    for _ in 0..5 {
        stream.synchronize()?;
        let start = stream.record_event(timing)?;
        graph.launch()?;
        let end = stream.record_event(timing)?;
        end.synchronize()?;
        reps.push(start.elapsed_ms(&end)? as f64 * 1e3 / per_graph as f64);
    }
    reps.sort_by(f64::total_cmp);
    Ok(reps[2])
}

fn run(args: &Args) -> Res {
    let backend = match args.backend {
        Backend::Host => BackendKind::Host,
        Backend::Gpu => BackendKind::Gpu,
        Backend::Auto => BackendKind::Auto,
    };
    // Room for the two largest buffers, plus alignment slack.
    let ctx = Config::new().backend(backend).heap_size(2 * args.max_bytes + (1 << 20)).init()?;
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let sizes: Vec<usize> = std::iter::successors(Some(args.min_bytes), |&b| b.checked_mul(2))
        .take_while(|&b| b <= args.max_bytes)
        .collect();
    let bench = Bench { ctx: &ctx, s: ctx.stream(), args, sizes };
    let sized = matches!(args.op, Op::Put | Op::AllReduce | Op::All);

    let memcpy_us = if sized { bench.memcpy()? } else { Vec::new() };
    let mut rows: Vec<Row> = bench
        .sizes
        .iter()
        .zip(&memcpy_us)
        .map(|(&bytes, &time_us)| Row {
            graph: false,
            op: "memcpy",
            imp: "memcpy",
            dtype: Some("u8"),
            bytes,
            time_us,
            bus_factor: 1.0,
            memcpy_us: Some(time_us),
        })
        .collect();
    if matches!(args.op, Op::Put | Op::All) {
        rows.extend(bench.put(&memcpy_us)?);
    }
    if matches!(args.op, Op::Barrier | Op::All) {
        rows.push(bench.barrier()?);
    }
    if matches!(args.op, Op::AllReduce | Op::All) {
        rows.extend(bench.all_reduce(&memcpy_us)?);
    }
    let backend = format!("{:?}", ctx.backend()).to_lowercase();

    if me == 0 {
        print_table(&rows, n, &backend, args);
        if let Some(path) = &args.json {
            let mut out = String::new();
            for r in &rows {
                let dtype = r.dtype.map_or("null".into(), |d| format!("\"{d}\""));
                writeln!(
                    out,
                    "{{\"op\":\"{}\",\"impl\":\"{}\",\"backend\":\"{backend}\",\"dtype\":{dtype},\"bytes\":{},\"pes\":{n},\
                     \"graph\":{},\"time_us\":{},\"algbw_gbps\":{},\"busbw_gbps\":{},\"vs_memcpy\":{}}}",
                    r.op,
                    r.imp,
                    r.bytes,
                    r.graph,
                    num(Some(r.time_us)),
                    num(r.algbw_gbps()),
                    num(r.busbw_gbps()),
                    num(r.vs_memcpy()),
                )?;
            }
            std::fs::write(path, out).map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
    }
    // After the results are out: a fault in teardown cannot lose them.
    ctx.finalize()?;
    Ok(())
}

fn print_table(rows: &[Row], n: usize, backend: &str, args: &Args) {
    let iters = args.iters.map_or("auto (10..=1000)".into(), |i| i.to_string());
    println!("# shmem-bench: {n} PEs, {backend} backend; median of {iters} iterations after {} warm-up", args.warmup);
    println!("# put: PE 0 -> PE {}; all_reduce: f32 sum; vs_memcpy: memcpy time / time", 1 % n);
    println!(
        "{:<11}{:<14}{:>11}{:>12}{:>12}{:>12}{:>11}",
        "op", "impl", "bytes", "time_us", "algbw_GBps", "busbw_GBps", "vs_memcpy"
    );
    for r in rows {
        println!(
            "{:<11}{:<14}{:>11}{:>12.2}{}{}{}",
            r.op,
            if r.graph { format!("{}+graph", r.imp) } else { r.imp.to_owned() },
            r.bytes,
            r.time_us,
            cell(r.algbw_gbps(), 12),
            cell(r.busbw_gbps(), 12),
            cell(r.vs_memcpy(), 11)
        );
    }
}
