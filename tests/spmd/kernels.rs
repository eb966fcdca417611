//! What the GPU kernels add to the collectives' tests: the settings each
//! test of `coll` runs under, and CUDA-graph capture replayed with new
//! inputs. The host backend ignores the settings but the route across
//! nodes ([`Variant::about_nodes`]), and cannot capture.

use crate::coll::{input, reduce, Coll, Report};
use crate::util::{self, mix, needs_gpu, payload, poison, Env, TestElem, TestResult};
use shmem::{
    bf16, AcrossNodes, AllGatherAlgo, AllReduceAlgo, CollImpl, Collectives, Context, ReduceOp, ReduceOrder, Stream,
    SymmetricBuffer, Tuning,
};

/// One setting of [`Collectives`], applied on top of what the run started
/// with (so a run under `SHMEM_FORCE_RMA=1` takes every variant through RMA).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Default,
    ForceRma,
    OneShot,
    TwoShot,
    /// Two-shot by stores alone at 2 PEs over NVLink out of place (else the two-shot).
    TwoShotStores,
    LowLatency,
    LowLatency128,
    Push,
    Sm,
    CopyEngine,
    /// NVSHMEM's own collectives, the baseline.
    Nvshmem,
    /// The kernels retuned ([`TUNED`]): other grids, and the low-latency
    /// kernels past their default limit.
    Tuned,
    /// The low-latency kernels in 128-byte lines at every size they take
    /// ([`Tuning::low_latency_lines_min_bytes`] 0).
    Lines,
    /// Every broadcast pulled by its members over NVLink
    /// ([`Tuning::broadcast_pull_min_bytes`] 0).
    Pull,
    /// Every broadcast of three or more PEs over NVLink relayed by its
    /// members ([`Tuning::broadcast_relay_min_bytes`] 0).
    Relay,
    /// The flat forms across nodes ([`AcrossNodes::Flat`]).
    Flat,
    /// The node-aware forms wherever they apply, one PE a node included
    /// ([`AcrossNodes::NodeAware`]); reductions in PE order.
    NodeAware,
    /// As [`Variant::NodeAware`], reductions grouped by node
    /// ([`ReduceOrder::NodeGrouped`]).
    NodeGrouped,
}

/// [`Variant::Tuned`]'s knobs: the medium sizes' cases past 128 KiB a peer
/// (f16's and bf16's 128 KiB + 10 bytes, f32's 256 KiB + 20, the 8-byte
/// types' 192 KiB + 24 and 512 KiB + 40) take the push kernels on 128
/// blocks, in every element type (the default takes them only at 4 or more
/// PEs, and not for these sizes of 2-byte types); the rest the low-latency
/// kernels on 64 blocks of 192 threads (by default 512) at every size (the
/// default grid changes at 32 KiB) and in 8-byte packets (by default in
/// lines from 256 KiB); a team of one never copies by a copy
/// engine (by default it does in graphs, and from 2 or 8 MiB outside); a
/// broadcast is never pulled (nor by default) nor relayed (by default it
/// is past 1 MiB at three or more PEs); the MoE ops take
/// the one kernel, not the line kernel, for every input but an empty one
/// (by default the line kernel wherever it fits), and the layer's decode
/// form its counted stores (by default lines for small rows).
pub const TUNED: Tuning = Tuning {
    low_latency_max_bytes: Some(128 << 10),
    low_latency_blocks: Some(64),
    low_latency_threads: Some(192),
    low_latency_lines_min_bytes: Some(usize::MAX),
    push_blocks: Some(128),
    moe_block_bytes: Some(256),
    moe_lines_max_bytes: Some(0),
    moe_layer_lines_max_bytes: Some(0),
    solo_copy_engine_min_bytes: Some(usize::MAX),
    broadcast_pull_min_bytes: Some(usize::MAX),
    broadcast_relay_min_bytes: Some(usize::MAX),
};

impl Variant {
    pub const ALL: [Variant; 18] = [
        Variant::Default,
        Variant::ForceRma,
        Variant::OneShot,
        Variant::TwoShot,
        Variant::TwoShotStores,
        Variant::LowLatency,
        Variant::LowLatency128,
        Variant::Push,
        Variant::Sm,
        Variant::CopyEngine,
        Variant::Nvshmem,
        Variant::Tuned,
        Variant::Lines,
        Variant::Pull,
        Variant::Relay,
        Variant::Flat,
        Variant::NodeAware,
        Variant::NodeGrouped,
    ];

    /// The collectives the variant is tested on over the world: those it
    /// chooses a form of, and every one for the settings of every
    /// collective (the path, the implementation, the tuning, the route).
    pub fn world_colls(self) -> &'static [Coll] {
        match self {
            Variant::Default
            | Variant::ForceRma
            | Variant::Nvshmem
            | Variant::Tuned
            | Variant::Lines
            | Variant::Flat
            | Variant::NodeAware => &Coll::ALL,
            Variant::OneShot
            | Variant::TwoShot
            | Variant::TwoShotStores
            | Variant::LowLatency
            | Variant::LowLatency128
            | Variant::Push => &[Coll::AllReduce],
            Variant::Sm | Variant::CopyEngine => &[Coll::AllGather],
            Variant::Pull | Variant::Relay => &[Coll::Broadcast],
            Variant::NodeGrouped => &[Coll::AllReduce, Coll::ReduceScatter],
        }
    }

    /// Whether the variant is tested on split teams too: where its forms
    /// serve teams other than the world (not the world's protocols' own
    /// settings: pushes, tuning, lines, pulls, the flat route).
    pub fn on_teams(self) -> bool {
        !matches!(
            self,
            Variant::Push | Variant::Tuned | Variant::Lines | Variant::Pull | Variant::Flat | Variant::NodeGrouped
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Variant::Default => "default",
            Variant::ForceRma => "force_rma",
            Variant::OneShot => "one_shot",
            Variant::TwoShot => "two_shot",
            Variant::TwoShotStores => "two_shot_stores",
            Variant::LowLatency => "low_latency",
            Variant::LowLatency128 => "low_latency_128",
            Variant::Push => "push",
            Variant::Sm => "sm",
            Variant::CopyEngine => "copy_engine",
            Variant::Nvshmem => "nvshmem",
            Variant::Tuned => "tuned",
            Variant::Lines => "lines",
            Variant::Pull => "pull",
            Variant::Relay => "relay",
            Variant::Flat => "flat",
            Variant::NodeAware => "node_aware",
            Variant::NodeGrouped => "node_grouped",
        }
    }

    pub fn settings(self, base: Collectives) -> Collectives {
        match self {
            Variant::Default => base,
            Variant::ForceRma => Collectives { force_rma: true, ..base },
            Variant::OneShot => Collectives { all_reduce: AllReduceAlgo::OneShot, ..base },
            Variant::TwoShot => Collectives { all_reduce: AllReduceAlgo::TwoShot, ..base },
            Variant::TwoShotStores => Collectives { all_reduce: AllReduceAlgo::TwoShotStores, ..base },
            Variant::LowLatency => Collectives { all_reduce: AllReduceAlgo::LowLatency, ..base },
            Variant::LowLatency128 => Collectives { all_reduce: AllReduceAlgo::LowLatency128, ..base },
            Variant::Push => Collectives { all_reduce: AllReduceAlgo::Push, ..base },
            Variant::Sm => Collectives { all_gather: AllGatherAlgo::Sm, ..base },
            Variant::CopyEngine => Collectives { all_gather: AllGatherAlgo::CopyEngine, ..base },
            Variant::Nvshmem => Collectives { implementation: CollImpl::Nvshmem, ..base },
            Variant::Tuned => Collectives { tuning: TUNED, ..base },
            Variant::Lines => {
                Collectives { tuning: Tuning { low_latency_lines_min_bytes: Some(0), ..base.tuning }, ..base }
            }
            Variant::Pull => {
                Collectives { tuning: Tuning { broadcast_pull_min_bytes: Some(0), ..base.tuning }, ..base }
            }
            Variant::Relay => {
                Collectives { tuning: Tuning { broadcast_relay_min_bytes: Some(0), ..base.tuning }, ..base }
            }
            Variant::Flat => Collectives { across_nodes: AcrossNodes::Flat, ..base },
            Variant::NodeAware => Collectives { across_nodes: AcrossNodes::NodeAware, ..base },
            Variant::NodeGrouped => {
                Collectives { across_nodes: AcrossNodes::NodeAware, reduce_order: ReduceOrder::NodeGrouped, ..base }
            }
        }
    }

    /// Whether the variant is about `coll`: its split-team tests and its
    /// 256 MiB cases run only then.
    pub fn covers(self, coll: Coll) -> bool {
        match self {
            Variant::Default | Variant::ForceRma | Variant::Nvshmem | Variant::Flat | Variant::NodeAware => true,
            Variant::NodeGrouped => matches!(coll, Coll::AllReduce | Coll::ReduceScatter),
            Variant::OneShot
            | Variant::TwoShot
            | Variant::TwoShotStores
            | Variant::LowLatency
            | Variant::LowLatency128
            | Variant::Push => coll == Coll::AllReduce,
            Variant::Sm | Variant::CopyEngine => coll == Coll::AllGather,
            Variant::Pull | Variant::Relay => coll == Coll::Broadcast,
            // Its kernels run up to 1 MiB a peer: the small and medium sizes.
            Variant::Tuned | Variant::Lines => false,
        }
    }

    /// Whether the in-place and misaligned forms run: the NVSHMEM baseline
    /// is checked out of place only.
    pub fn in_place(self) -> bool {
        self != Variant::Nvshmem
    }

    /// The form of the GPU's kernels the variant names, which the host
    /// backend does not have: its collectives take one form whatever these
    /// settings say, so a run there would repeat the default and pass
    /// without running the form the test names. `None` for the settings
    /// the host follows too (the default, forced RMA, the route across
    /// nodes).
    pub fn gpu_form(self) -> Option<&'static str> {
        let form = match self {
            Variant::Default | Variant::ForceRma | Variant::Flat | Variant::NodeAware | Variant::NodeGrouped => {
                return None
            }
            Variant::OneShot => "the one-shot all-reduce kernel",
            Variant::TwoShot => "the two-shot all-reduce kernel",
            Variant::TwoShotStores => "the two-shot all-reduce by stores",
            Variant::LowLatency => "the low-latency all-reduce kernel",
            Variant::LowLatency128 => "the low-latency all-reduce in 128-byte lines",
            Variant::Push => "the push all-reduce kernel",
            Variant::Sm => "the all-gather kernel on SMs",
            Variant::CopyEngine => "the all-gather by copy engines",
            Variant::Nvshmem => "NVSHMEM's collectives",
            Variant::Tuned => "the kernels' tuned grids and limits",
            Variant::Lines => "the low-latency kernels in lines",
            Variant::Pull => "the broadcast pulled over NVLink",
            Variant::Relay => "the relayed broadcast",
        };
        Some(form)
    }

    /// [`Variant::gpu_form`]'s verdict for this run ([`util::gpu_form`]).
    pub fn on_this_backend(self, env: &Env) -> TestResult {
        Ok(self.gpu_form().map_or(Ok(()), |form| util::gpu_form(env, form))?)
    }

    /// Whether the variant chooses the route across nodes, which the host
    /// backend follows.
    pub fn about_nodes(self) -> bool {
        matches!(self, Variant::Flat | Variant::NodeAware | Variant::NodeGrouped)
    }
}

/// A variant's settings until dropped, then the ones before. Every PE
/// applies the same at the same point, between collectives.
pub struct Settings<'a> {
    ctx: &'a Context,
    before: Collectives,
}

impl<'a> Settings<'a> {
    pub fn apply(ctx: &'a Context, v: Variant) -> Settings<'a> {
        let before = ctx.collectives();
        ctx.set_collectives(v.settings(before));
        Settings { ctx, before }
    }
}

impl Drop for Settings<'_> {
    fn drop(&mut self) {
        self.ctx.set_collectives(self.before);
    }
}

/// GPU only: all-reduces (bf16 and f32 sums), an all-gather (f32),
/// reduce-scatters (f32 and bf16 sums) and a broadcast (f32, from the last
/// PE) captured once into a CUDA graph,
/// under each algorithm setting, then replayed 1000 times with new random
/// inputs written from the host between replays; every result exact, the
/// sums bit for bit the sums in PE order, as eager calls give them.
pub fn graph_replay(env: &Env) -> TestResult {
    let stream = needs_gpu(env)?;
    let mut rep = Report::new(env);
    for v in [
        Variant::Default,
        Variant::LowLatency,
        Variant::LowLatency128,
        Variant::Push,
        Variant::OneShot,
        Variant::TwoShot,
        Variant::TwoShotStores,
        Variant::Sm,
        Variant::CopyEngine,
        Variant::Tuned,
        Variant::Lines,
        Variant::Pull,
        Variant::Relay,
    ] {
        let _settings = Settings::apply(&env.ctx, v);
        replay(env, stream, v, &mut rep)?;
    }
    rep.finish()
}

/// A sum captured in the graph: an all-reduce of `len` elements, or a
/// reduce-scatter of `len` a PE; its inputs drawn from the replay's seed
/// and `salt`.
struct Sum<T: TestElem> {
    scatter: bool,
    len: usize,
    salt: u64,
    src: SymmetricBuffer<T>,
    dst: SymmetricBuffer<T>,
}

impl<T: TestElem> Sum<T> {
    fn new(ctx: &Context, scatter: bool, len: usize, salt: u64) -> shmem::Result<Sum<T>> {
        let src = ctx.alloc::<T>(if scatter { len * ctx.n_pes() } else { len })?;
        Ok(Sum { scatter, len, salt, src, dst: ctx.alloc::<T>(len)? })
    }

    fn name(&self) -> String {
        format!("{} {} sum", if self.scatter { "reduce_scatter" } else { "all_reduce" }, T::DTYPE)
    }

    fn call(&self, ctx: &Context, s: &Stream) -> shmem::Result<()> {
        if self.scatter {
            ctx.reduce_scatter(&self.dst, &self.src, ReduceOp::Sum, s)
        } else {
            ctx.all_reduce(&self.dst, &self.src, ReduceOp::Sum, s)
        }
    }

    fn input(&self, seed: u64, pe: usize, i: usize) -> T {
        input::<T>(seed ^ self.salt, pe, i, Some(ReduceOp::Sum))
    }

    /// This PE's fresh input; the output poisoned.
    fn write(&self, env: &Env, seed: u64) -> TestResult {
        let me = env.me();
        let src: Vec<T> = (0..self.src.len()).map(|i| self.input(seed, me, i)).collect();
        self.src.copy_from_host(&src, &env.s)?;
        self.dst.fill(poison(), &env.s)?;
        Ok(())
    }

    /// The output against the sum in PE order, bit for bit.
    fn check(&self, env: &Env, rep: &mut Report, label: &str, seed: u64) -> TestResult {
        let at = if self.scatter { env.me() * self.len } else { 0 };
        let want: Vec<T> = (at..at + self.len)
            .map(|i| reduce(ReduceOp::Sum, (0..env.n()).map(|pe| self.input(seed, pe, i))))
            .collect();
        rep.check(label, seed, &self.name(), &self.dst.copy_to_host(&env.s)?, &want);
        Ok(())
    }
}

fn replay(env: &Env, stream: &std::sync::Arc<cudarc::driver::CudaStream>, v: Variant, rep: &mut Report) -> TestResult {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    const AR_LEN: usize = 4099; // odd: the kernels' vector loops and their tails
    const AG_LEN: usize = 4099;
    const RS_LEN: usize = 1031;
    const BC_LEN: usize = 8195;
    let (me, n, s, ctx) = (env.me(), env.n(), &env.s, &env.ctx);
    let ar_bf16 = Sum::<bf16>::new(ctx, false, AR_LEN, 0)?;
    let ar_f32 = Sum::<f32>::new(ctx, false, AR_LEN, 3)?;
    let rs_f32 = Sum::<f32>::new(ctx, true, RS_LEN, 1)?;
    let rs_bf16 = Sum::<bf16>::new(ctx, true, RS_LEN, 4)?;
    let ag_src = ctx.alloc::<f32>(AG_LEN)?;
    let ag_dst = ctx.alloc::<f32>(AG_LEN * n)?;
    let bc_src = ctx.alloc::<f32>(BC_LEN)?;
    let bc_dst = ctx.alloc::<f32>(BC_LEN)?;
    let bc_root = n - 1;
    ctx.barrier_all(s)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = ar_bf16
        .call(ctx, s)
        .and_then(|()| ar_f32.call(ctx, s))
        .and_then(|()| ctx.all_gather(&ag_dst, &ag_src, s))
        .and_then(|()| rs_f32.call(ctx, s))
        .and_then(|()| rs_bf16.call(ctx, s))
        .and_then(|()| ctx.broadcast(&bc_dst, &bc_src, bc_root, s));
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
    if let (Err(e @ shmem::Error::Invalid(m)), true) = (&captured, ctx.force_rma()) {
        if m.contains("captured") {
            // The documented refusal of the forced-RMA path.
            if me == 0 {
                eprintln!("coll::graph_replay_gpu_only: {} with forced RMA: not capturable: {e}", v.name());
            }
            return Ok(());
        }
    }
    captured?;
    let graph = graph.ok_or("capture gave no graph")?;
    let rma = if ctx.force_rma() { " (RMA forced)" } else { "" };
    let name = format!("graph of all_reduces, an all_gather, reduce_scatters, a broadcast, settings {}{rma}", v.name());
    // SHMEM_TEST_REPLAYS: fewer for the sanitizers' runs (each replay is
    // checked on the host, which under a sanitizer is what takes the time).
    let replays: usize = match std::env::var("SHMEM_TEST_REPLAYS") {
        Ok(v) => v.parse().map_err(|_| format!("SHMEM_TEST_REPLAYS={v:?}: not a count"))?,
        Err(_) => 1000,
    };
    for replay in 0..replays {
        let label = format!("{name}, replay {replay}");
        let seed = rep.seed(&label);
        let ag_in = |pe: usize, i: usize| payload::<f32>(seed ^ 2, pe, i);
        ar_bf16.write(env, seed)?;
        ar_f32.write(env, seed)?;
        rs_f32.write(env, seed)?;
        rs_bf16.write(env, seed)?;
        ag_src.copy_from_host(&(0..AG_LEN).map(|i| ag_in(me, i)).collect::<Vec<_>>(), s)?;
        ag_dst.fill(poison(), s)?;
        let bc_in = |i: usize| payload::<f32>(seed ^ 5, bc_root, i);
        bc_src.copy_from_host(&(0..BC_LEN).map(bc_in).collect::<Vec<_>>(), s)?;
        bc_dst.fill(poison(), s)?;
        graph.launch()?;
        ar_bf16.check(env, rep, &label, seed)?;
        ar_f32.check(env, rep, &label, seed)?;
        rs_f32.check(env, rep, &label, seed)?;
        rs_bf16.check(env, rep, &label, seed)?;
        let want: Vec<f32> = (0..AG_LEN * n).map(|i| ag_in(i / AG_LEN, i % AG_LEN)).collect();
        rep.check(&label, seed, "all_gather f32", &ag_dst.copy_to_host(s)?, &want);
        let want: Vec<f32> = (0..BC_LEN).map(bc_in).collect();
        rep.check(&label, seed, "broadcast f32", &bc_dst.copy_to_host(s)?, &want);
    }
    drop(graph);
    ctx.barrier_all(s)?;
    Ok(())
}

/// The line protocol against stale packets: in each round, L2 is first
/// flushed (an all-gather of 64 MiB), then two all-to-alls go in 8-byte
/// packets, of a random length up to half of the lines' (u64), then two in
/// lines (512 KiB + 40 bytes a peer, or the low-latency limit where that
/// is less); fresh payloads each, every result exact. Each line operation
/// so lands on buffers whose last writer (two epochs before, the same
/// parity) sent packets that end inside one of its lines, the rest of that
/// line cold: the case where a line with one flag could be taken on its
/// flag while its first 64 bytes were still the packets'.
/// `SHMEM_TEST_ROUNDS` sets the rounds (by default 250 on the GPU, 3 on
/// the host, which ignores the settings, does not flush and checks the
/// all-to-all alone).
pub fn lines_after_packets(env: &Env) -> TestResult {
    let (me, n, s, ctx) = (env.me(), env.n(), &env.s, &env.ctx);
    let gpu = env.s.cuda_stream().is_some();
    let rounds: usize = match std::env::var("SHMEM_TEST_ROUNDS") {
        Ok(v) => v.parse().map_err(|_| format!("SHMEM_TEST_ROUNDS={v:?}: not a count"))?,
        Err(_) if gpu => 250,
        Err(_) => 3,
    };
    let limit = shmem::algo::low_latency_max_bytes(n, &Tuning::default());
    let len = ((1usize << 16) + 5).min(limit / 8);
    let srcs = (0..4).map(|_| ctx.alloc::<u64>(len * n)).collect::<shmem::Result<Vec<_>>>()?;
    let dsts = (0..4).map(|_| ctx.alloc::<u64>(len * n)).collect::<shmem::Result<Vec<_>>>()?;
    // 64 MiB of all-gather output at every PE: more than H100's and H200's
    // 50 MiB of L2.
    let flush_len = if gpu { (64 << 20) / 4 / n } else { 0 };
    let flush_src = ctx.alloc::<f32>(flush_len.max(1))?;
    let flush_dst = ctx.alloc::<f32>(flush_len.max(1) * n)?;
    // Every call below sets its own settings; the run's come back at the end.
    let _restore = Settings::apply(ctx, Variant::Default);
    let before = ctx.collectives();
    let packets =
        Collectives { tuning: Tuning { low_latency_lines_min_bytes: Some(usize::MAX), ..before.tuning }, ..before };
    let lines = Variant::Lines.settings(before);
    let mut rep = Report::new(env);
    for round in 0..rounds {
        let seed = rep.seed(&format!("lines after packets, round {round}"));
        // The packets' lengths: a sixteenth to a half of the lines'.
        let short = |k: u64| len / 16 + (mix(seed ^ k) % (len as u64 * 7 / 16)) as usize;
        let lens = [short(0), short(1), len, len];
        let label = format!(
            "all_to_all u64 × {} and {} a peer in packets, then × {len} in lines twice, round {round}",
            lens[0], lens[1]
        );
        for (k, (src, dst)) in srcs.iter().zip(&dsts).enumerate() {
            let l = lens[k];
            src.slice(..l * n)
                .copy_from_host(&(0..l * n).map(|i| payload::<u64>(seed ^ k as u64, me, i)).collect::<Vec<_>>(), s)?;
            dst.fill(poison(), s)?;
        }
        if gpu {
            ctx.set_collectives(before);
            ctx.all_gather(&flush_dst, &flush_src, s)?;
        }
        for (k, (src, dst)) in srcs.iter().zip(&dsts).enumerate() {
            let l = lens[k];
            ctx.set_collectives(if k < 2 { packets } else { lines });
            ctx.all_to_all(dst.slice(..l * n), src.slice(..l * n), s)?;
        }
        for (k, dst) in dsts.iter().enumerate() {
            let l = lens[k];
            // Block p of the output is block `me` of PE p's input.
            let want: Vec<u64> = (0..l * n).map(|i| payload(seed ^ k as u64, i / l, me * l + i % l)).collect();
            let what = if k < 2 { "in packets" } else { "in lines" };
            rep.check(&label, seed, what, &dst.slice(..l * n).copy_to_host(s)?, &want);
        }
    }
    ctx.barrier_all(s)?;
    rep.finish()
}
