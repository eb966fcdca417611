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
//! With `--fp8` the tokens are bf16 and the dispatch sends them as FP8
//! (`MoeConfig::fp8`: e4m3 codes and one f32 scale per 128 elements on
//! the wire); the experts scale the dequantized bf16 view, rounding each
//! product to bf16, and the combine sums in bf16 as `MoeAllToAll` defines
//! it. The check is still exact: the host applies the same quantization
//! (`shmem::quant`, bit for bit the kernels'), the same roundings and the
//! same order of the sums.
//!
//! `shmemrun -n 2 target/release/examples/moe_server [steps] [--fp8]` (1000
//! steps by default on the gpu backend, 50 on the host backend, where the
//! experts run on the host and nothing is captured).

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use shmem::quant::{dequantize_vec, quantize_vec};
use shmem::{
    bf16, BackendKind, CombineElement, Context, Element, Fp8DeviceTokens, Fp8Out, MoeAllToAll, MoeConfig, Stream,
    SymSlice, SymmetricBuffer,
};
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

// The same on bf16 rows (as raw bits): the product in f32, rounded to
// the nearest bf16, ties to even (the values are finite).
extern "C" __global__ void experts_bf16(unsigned short *rows, const long long *so, int n_pes, int ne,
                                        long long hidden, int my_pe) {
    int e = blockIdx.y, m = n_pes * ne;
    long long start = so[m + e * n_pes], count = 0;
    for (int s = 0; s < n_pes; s++) count += so[e * n_pes + s];
    float scale = (float)(my_pe * ne + e + 1);
    for (long long r = blockIdx.x; r < count; r += gridDim.x)
        for (long long h = threadIdx.x; h < hidden; h += blockDim.x) {
            unsigned short *x = &rows[(start + r) * hidden + h];
            unsigned int y = __float_as_uint(__fmul_rn(__uint_as_float((unsigned int)*x << 16), scale));
            *x = (unsigned short)((y + 0x7fffu + ((y >> 16) & 1u)) >> 16);
        }
}
"#;

/// The two ways tokens travel: f32 as they are, bf16 as FP8.
trait Token: Element + CombineElement {
    /// The experts' kernel in `EXPERTS`.
    const KERNEL: &'static str;
    const NAN: Self;
    fn of(x: f32) -> Self;
    fn bits(self) -> u32;
    /// What expert `g` makes of `x`: `x × (g + 1)`, rounded to `Self`.
    fn expert(x: Self, g: usize) -> Self;
    /// The exchange's configuration.
    fn config() -> MoeConfig;
    /// The step's dispatch on the device: the view the experts work on.
    fn dispatch<'a>(moe: &'a MoeAllToAll<Self>, b: &Buffers<Self>, s: &Stream) -> shmem::Result<SymSlice<'a, Self>>;
    /// What token `t` of `b` must come back as, on `n` PEs.
    fn expected(b: &Batch, t: usize, n: usize) -> Vec<Self>;
}

impl Token for f32 {
    const KERNEL: &'static str = "experts";
    const NAN: f32 = f32::NAN;
    fn of(x: f32) -> f32 {
        x
    }
    fn bits(self) -> u32 {
        self.to_bits()
    }
    fn expert(x: f32, g: usize) -> f32 {
        x * (g + 1) as f32
    }
    fn config() -> MoeConfig {
        MoeConfig::new(HIDDEN, MAX_TOKENS, EXPERTS_PER_PE, TOP_K).major_align(8)
    }
    fn dispatch<'a>(moe: &'a MoeAllToAll<f32>, b: &Buffers<f32>, s: &Stream) -> shmem::Result<SymSlice<'a, f32>> {
        moe.dispatch_on_device(&b.tokens, &b.ids, &b.weights, &b.count, s)
    }
    /// `Σ_j w[t, j] · (g[t, j] + 1) · x[t]`: exact in f32 (small
    /// integers, weights that are powers of two), whatever the order.
    fn expected(b: &Batch, t: usize, _: usize) -> Vec<f32> {
        (0..HIDDEN)
            .map(|h| {
                (0..TOP_K).fold(0.0f32, |acc, j| {
                    let s = t * TOP_K + j;
                    acc + b.weights[s] * (b.tokens[t * HIDDEN + h] * (b.ids[s] + 1) as f32)
                })
            })
            .collect()
    }
}

impl Token for bf16 {
    const KERNEL: &'static str = "experts_bf16";
    const NAN: bf16 = bf16::NAN;
    fn of(x: f32) -> bf16 {
        bf16::from_f32(x)
    }
    fn bits(self) -> u32 {
        u32::from(self.to_bits())
    }
    fn expert(x: bf16, g: usize) -> bf16 {
        bf16::from_f32(x.to_f32() * (g + 1) as f32)
    }
    fn config() -> MoeConfig {
        f32::config().fp8()
    }
    fn dispatch<'a>(moe: &'a MoeAllToAll<bf16>, b: &Buffers<bf16>, s: &Stream) -> shmem::Result<SymSlice<'a, bf16>> {
        let tokens = Fp8DeviceTokens::Bf16((&b.tokens).into());
        let view = moe.dispatch_fp8_on_device(tokens, &b.ids, &b.weights, &b.count, Fp8Out::Bf16, s)?;
        Ok(view.bf16.expect("asked for the bf16 view"))
    }
    /// The token as the dispatch delivers it (quantized, dequantized),
    /// each expert's output rounded to bf16; on each PE holding some of
    /// its experts their weighted sum in slot order in f32, rounded to
    /// bf16; those partials summed in PE order in f32, rounded.
    fn expected(b: &Batch, t: usize, n: usize) -> Vec<bf16> {
        let x: Vec<bf16> = b.tokens[t * HIDDEN..(t + 1) * HIDDEN].iter().map(|&v| bf16::from_f32(v)).collect();
        let (codes, scales) = quantize_vec(&x);
        let x: Vec<bf16> = dequantize_vec(&codes, &scales).expect("one token's codes and scales");
        let slots = &b.ids[t * TOP_K..(t + 1) * TOP_K];
        x.iter()
            .map(|&xh| {
                let mut acc = 0f32;
                for pe in 0..n {
                    let mine = (0..TOP_K).filter(|&j| slots[j] as usize / EXPERTS_PER_PE == pe);
                    let mut partial = 0f32;
                    let mut any = false;
                    for j in mine {
                        let y = bf16::expert(xh, slots[j] as usize);
                        partial += b.weights[t * TOP_K + j] * y.to_f32();
                        any = true;
                    }
                    if any {
                        acc += bf16::from_f32(partial).to_f32();
                    }
                }
                bf16::from_f32(acc)
            })
            .collect()
    }
}

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

/// The device buffers a step reads and writes.
struct Buffers<T: Token> {
    tokens: SymmetricBuffer<T>,
    ids: SymmetricBuffer<i64>,
    weights: SymmetricBuffer<f32>,
    count: SymmetricBuffer<i64>,
    out: SymmetricBuffer<T>,
}

impl<T: Token> Buffers<T> {
    fn new(ctx: &Context) -> shmem::Result<Buffers<T>> {
        Ok(Buffers {
            tokens: ctx.alloc(MAX_TOKENS * HIDDEN)?,
            ids: ctx.alloc(MAX_TOKENS * TOP_K)?,
            weights: ctx.alloc(MAX_TOKENS * TOP_K)?,
            count: ctx.alloc(1)?,
            out: ctx.alloc(MAX_TOKENS * HIDDEN)?,
        })
    }

    fn write(&self, b: &Batch, s: &Stream) -> shmem::Result<()> {
        let tokens: Vec<T> = b.tokens.iter().map(|&x| T::of(x)).collect();
        self.tokens.slice(..tokens.len()).copy_from_host(&tokens, s)?;
        self.ids.slice(..b.ids.len()).copy_from_host(&b.ids, s)?;
        self.weights.slice(..b.weights.len()).copy_from_host(&b.weights, s)?;
        self.count.copy_from_host(&[(b.ids.len() / TOP_K) as i64], s)?;
        self.out.fill(T::NAN, s)
    }

    /// This PE's result, checked against the batch, bit for bit.
    fn check(&self, b: &Batch, step: u64, me: usize, n: usize, s: &Stream) -> Result<(), Box<dyn std::error::Error>> {
        let got = self.out.copy_to_host(s)?;
        let tokens = b.ids.len() / TOP_K;
        for t in 0..tokens {
            let want = T::expected(b, t, n);
            for (h, (&g, &w)) in got[t * HIDDEN..(t + 1) * HIDDEN].iter().zip(&want).enumerate() {
                if g.bits() != w.bits() {
                    return Err(format!("step {step}, PE {me}: token {t} element {h} is {g:?}, expected {w:?}").into());
                }
            }
        }
        if got[tokens * HIDDEN..].iter().any(|x| x.bits() != T::NAN.bits()) {
            return Err(format!("step {step}, PE {me}: rows past the {tokens} tokens were written").into());
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
    let mut steps = None;
    let mut fp8 = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--fp8" => fp8 = true,
            a => {
                steps = Some(
                    a.parse::<u64>()
                        .map_err(|e| format!("{a:?}: not a step count ({e}); usage: moe_server [steps] [--fp8]"))?,
                )
            }
        }
    }
    let ctx = shmem::init()?;
    let steps = steps.unwrap_or(if ctx.backend() == BackendKind::Gpu { 1000 } else { 50 });
    if fp8 {
        serve::<bf16>(&ctx, steps, "bf16 tokens, FP8 dispatch")?;
    } else {
        serve::<f32>(&ctx, steps, "f32 tokens")?;
    }
    ctx.finalize()?;
    Ok(())
}

/// `steps` decode steps of tokens of type `T`, each checked.
fn serve<T: Token>(ctx: &Context, steps: u64, what: &str) -> Result<(), Box<dyn std::error::Error>> {
    let (me, n, s) = (ctx.my_pe(), ctx.n_pes(), ctx.stream());
    let gpu = ctx.backend() == BackendKind::Gpu;
    let moe = MoeAllToAll::<T>::new(ctx, T::config())?;
    let bufs = Buffers::<T>::new(ctx)?;
    let experts = n * EXPERTS_PER_PE;
    if gpu {
        let cuda = ctx.cuda_context().expect("gpu backend");
        let stream = s.cuda_stream().expect("gpu backend").clone();
        let module = cuda.load_module(cudarc::nvrtc::compile_ptx(EXPERTS)?)?;
        let scale = module.load_function(T::KERNEL)?;
        ctx.barrier_all(&s)?;
        // One step, captured: dispatch, experts, combine.
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let captured = (|| -> Result<(), Box<dyn std::error::Error>> {
            let view = T::dispatch(&moe, &bufs, &s)?;
            let rows = view.device_ptr()?.ok_or("gpu backend")?;
            let so = moe.device_layout().device_ptr()?.ok_or("gpu backend")?;
            let cfg =
                LaunchConfig { grid_dim: (32, EXPERTS_PER_PE as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let (np, ne, hidden, pe) = (n as i32, EXPERTS_PER_PE as i32, HIDDEN as i64, me as i32);
            // SAFETY: `rows` is this PE's receive buffer of T (the layout's
            // rows lie in it), `so` its 2 × n × ne out_splits_offsets; the
            // arguments match the kernel's parameters.
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
            bufs.check(&b, step, me, n, &s)?;
        }
        ctx.check_device()?;
    } else {
        for step in 0..steps {
            let b = batch(step, me, experts);
            bufs.write(&b, &s)?;
            let view = T::dispatch(&moe, &bufs, &s)?;
            // The experts, on the host.
            let so = moe.device_layout().copy_to_host(&s)?;
            let mut rows = view.copy_to_host(&s)?;
            let m = n * EXPERTS_PER_PE;
            for e in 0..EXPERTS_PER_PE {
                let start = so[m + e * n] as usize;
                let count: i64 = so[e * n..(e + 1) * n].iter().sum();
                let g = me * EXPERTS_PER_PE + e;
                rows[start * HIDDEN..(start + count as usize) * HIDDEN].iter_mut().for_each(|x| *x = T::expert(*x, g));
            }
            view.copy_from_host(&rows, &s)?;
            moe.combine_on_device(view, &bufs.out, &s)?;
            bufs.check(&b, step, me, n, &s)?;
        }
    }
    ctx.barrier_all(&s)?;
    if me == 0 {
        let how = if gpu { "one CUDA graph replayed per step" } else { "eager, host backend" };
        println!("moe_server: {steps} decode steps on {n} PEs ({what}; {how}), every token's combined output exact");
    }
    Ok(())
}
