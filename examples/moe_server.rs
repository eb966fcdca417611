//! An MoE layer's token exchange in a serving loop: every decode step
//! routes a new batch (a new token count, new top-k experts and weights),
//! dispatches the tokens to their experts' PEs, runs the experts, and
//! combines their outputs — on the gpu backend as one CUDA graph, captured
//! once and replayed every step, the inputs written into the same device
//! buffers before each replay.
//!
//! Expert `g` (global) multiplies its rows by `g + 1`, so a token sent to
//! the wrong expert shows: each step every PE checks that token `t` came
//! back as `Σ_j w[t, j] · (g[t, j] + 1) · x[t]`, exactly (small integers,
//! weights that are powers of two, the sums in the order of the slots).
//!
//! `shmemrun -n 2 target/release/examples/moe_server [steps]` (1000 by
//! default on the gpu backend, 50 on the host backend, where the experts run
//! on the host and nothing is captured).

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use shmem::{BackendKind, Context, MoeAllToAll, MoeConfig, Stream, SymmetricBuffer};
use std::process::ExitCode;

const HIDDEN: usize = 256;
const MAX_TOKENS: usize = 64;
const EXPERTS_PER_PE: usize = 4;
const TOP_K: usize = 2;

const EXPERTS: &str = r#"
// Expert e of this PE scales its rows (where the dispatch put them, from
// its out_splits_offsets `so`) by its global number + 1.
extern "C" __global__ void experts(float *rows, const long long *so, int n_pes, int ne, long long hidden,
                                   int my_pe) {
    int e = blockIdx.y, m = n_pes * ne;
    long long start = so[m + e * n_pes], count = 0;
    for (int s = 0; s < n_pes; s++) count += so[e * n_pes + s];
    float scale = (float)(my_pe * ne + e + 1);
    for (long long r = blockIdx.x; r < count; r += gridDim.x)
        for (long long h = threadIdx.x; h < hidden; h += blockDim.x) rows[(start + r) * hidden + h] *= scale;
}
"#;

/// A step's batch on one PE.
struct Batch {
    tokens: Vec<f32>,
    ids: Vec<i64>,
    weights: Vec<f32>,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// PE `me`'s batch at `step`: 1..=MAX_TOKENS tokens, top-k distinct experts each.
fn batch(step: u64, me: usize, experts: usize) -> Batch {
    let r = |i: u64| mix(step << 32 ^ (me as u64) << 24 ^ i);
    let n = 1 + (r(0) % MAX_TOKENS as u64) as usize;
    let tokens = (0..n * HIDDEN).map(|i| (r(1 + i as u64) % 17) as f32 - 8.0).collect();
    let mut ids = Vec::with_capacity(n * TOP_K);
    for t in 0..n {
        let first = r(1 << 20 | t as u64) as usize % experts;
        ids.extend((0..TOP_K).map(|j| ((first + j * 3) % experts) as i64));
    }
    let weights = (0..n * TOP_K).map(|i| [0.5f32, 0.25, 1.0, 2.0][(r(1 << 21 | i as u64) % 4) as usize]).collect();
    Batch { tokens, ids, weights }
}

/// What token `t` must come back as.
fn expected(b: &Batch, t: usize, h: usize) -> f32 {
    (0..TOP_K).fold(0.0f32, |acc, j| {
        let s = t * TOP_K + j;
        acc + b.weights[s] * (b.tokens[t * HIDDEN + h] * (b.ids[s] + 1) as f32)
    })
}

/// The device buffers a step reads and writes.
struct Buffers {
    tokens: SymmetricBuffer<f32>,
    ids: SymmetricBuffer<i64>,
    weights: SymmetricBuffer<f32>,
    count: SymmetricBuffer<i64>,
    out: SymmetricBuffer<f32>,
}

impl Buffers {
    fn new(ctx: &Context) -> shmem::Result<Buffers> {
        Ok(Buffers {
            tokens: ctx.alloc(MAX_TOKENS * HIDDEN)?,
            ids: ctx.alloc(MAX_TOKENS * TOP_K)?,
            weights: ctx.alloc(MAX_TOKENS * TOP_K)?,
            count: ctx.alloc(1)?,
            out: ctx.alloc(MAX_TOKENS * HIDDEN)?,
        })
    }

    fn write(&self, b: &Batch, s: &Stream) -> shmem::Result<()> {
        self.tokens.slice(..b.tokens.len()).copy_from_host(&b.tokens, s)?;
        self.ids.slice(..b.ids.len()).copy_from_host(&b.ids, s)?;
        self.weights.slice(..b.weights.len()).copy_from_host(&b.weights, s)?;
        self.count.copy_from_host(&[(b.ids.len() / TOP_K) as i64], s)?;
        self.out.fill(f32::NAN, s)
    }

    /// This PE's result, checked against the batch.
    fn check(&self, b: &Batch, step: u64, me: usize, s: &Stream) -> Result<(), Box<dyn std::error::Error>> {
        let got = self.out.copy_to_host(s)?;
        let n = b.ids.len() / TOP_K;
        for t in 0..n {
            for h in 0..HIDDEN {
                let (g, w) = (got[t * HIDDEN + h], expected(b, t, h));
                if g.to_bits() != w.to_bits() {
                    return Err(format!("step {step}, PE {me}: token {t} element {h} is {g}, expected {w}").into());
                }
            }
        }
        if got[n * HIDDEN..].iter().any(|x| !x.is_nan()) {
            return Err(format!("step {step}, PE {me}: rows past the {n} tokens were written").into());
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moe_server: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = shmem::init()?;
    let (me, n, s) = (ctx.my_pe(), ctx.n_pes(), ctx.stream());
    let gpu = ctx.backend() == BackendKind::Gpu;
    let steps: u64 = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None if gpu => 1000,
        None => 50,
    };
    let config = MoeConfig::new(HIDDEN, MAX_TOKENS, EXPERTS_PER_PE, TOP_K).major_align(8);
    let moe = MoeAllToAll::<f32>::new(&ctx, config)?;
    let bufs = Buffers::new(&ctx)?;
    let experts = n * EXPERTS_PER_PE;
    if gpu {
        let cuda = ctx.cuda_context().expect("gpu backend");
        let stream = s.cuda_stream().expect("gpu backend").clone();
        let module = cuda.load_module(cudarc::nvrtc::compile_ptx(EXPERTS)?)?;
        let scale = module.load_function("experts")?;
        ctx.barrier_all(&s)?;
        // One step, captured: dispatch, experts, combine.
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let captured = (|| -> Result<(), Box<dyn std::error::Error>> {
            let view = moe.dispatch_on_device(&bufs.tokens, &bufs.ids, &bufs.weights, &bufs.count, &s)?;
            let rows = view.device_ptr()?.ok_or("gpu backend")?;
            let so = moe.device_layout().device_ptr()?.ok_or("gpu backend")?;
            let cfg =
                LaunchConfig { grid_dim: (32, EXPERTS_PER_PE as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let (np, ne, hidden, pe) = (n as i32, EXPERTS_PER_PE as i32, HIDDEN as i64, me as i32);
            // SAFETY: `rows` is this PE's receive buffer (the layout's rows lie
            // in it), `so` its 2 × n × ne out_splits_offsets; the arguments
            // match the kernel's parameters.
            unsafe {
                stream.launch_builder(&scale).arg(&rows).arg(&so).arg(&np).arg(&ne).arg(&hidden).arg(&pe).launch(cfg)?
            };
            moe.combine_on_device(view, &bufs.out, &s)?;
            Ok(())
        })();
        let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
        captured?;
        let graph = graph.ok_or("the capture gave no graph")?;
        for step in 0..steps {
            let b = batch(step, me, experts);
            bufs.write(&b, &s)?;
            graph.launch()?;
            bufs.check(&b, step, me, &s)?;
        }
        ctx.check_device()?;
    } else {
        for step in 0..steps {
            let b = batch(step, me, experts);
            bufs.write(&b, &s)?;
            let view = moe.dispatch_on_device(&bufs.tokens, &bufs.ids, &bufs.weights, &bufs.count, &s)?;
            // The experts, on the host.
            let so = moe.device_layout().copy_to_host(&s)?;
            let mut rows = view.copy_to_host(&s)?;
            let m = n * EXPERTS_PER_PE;
            for e in 0..EXPERTS_PER_PE {
                let start = so[m + e * n] as usize;
                let count: i64 = so[e * n..(e + 1) * n].iter().sum();
                let scale = (me * EXPERTS_PER_PE + e + 1) as f32;
                rows[start * HIDDEN..(start + count as usize) * HIDDEN].iter_mut().for_each(|x| *x *= scale);
            }
            view.copy_from_host(&rows, &s)?;
            moe.combine_on_device(view, &bufs.out, &s)?;
            bufs.check(&b, step, me, &s)?;
        }
    }
    ctx.barrier_all(&s)?;
    if me == 0 {
        let how = if gpu { "one CUDA graph replayed per step" } else { "eager, host backend" };
        println!("moe_server: {steps} decode steps on {n} PEs ({how}), every token's combined output exact");
    }
    ctx.finalize()?;
    Ok(())
}
