//! `MoeAllToAll::arrivals`, the receive-side hook: after every dispatch
//! form (host path, device path, FP8) each (local expert, source PE)
//! pair's flag holds that dispatch's epoch — pairs that received no row
//! too — the epoch grows by one per dispatch and a refused dispatch leaves
//! both; on the GPU a kernel on a second stream, launched before the
//! dispatch, waits on each pair's flag and copies the pair's rows as they
//! land, and its copy equals the view exactly, eagerly and in replays of
//! a CUDA graph of both (the waiter counting its epochs on the device).

use super::{random_weight, routable, routing, Spread};
use crate::util::{needs_gpu, poison, Env, TestResult};
use crate::TestFn;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use shmem::{bf16, Fp8DeviceTokens, Fp8Out, Fp8Tokens, Layout, MoeAllToAll, MoeConfig, MoeKernels};

pub const TESTS: &[(&str, TestFn)] = &[
    ("moe::arrivals::marked_after_dispatch", marked_after_dispatch),
    ("moe::arrivals::waiter_kernel_gpu_only", waiter_kernel),
    ("moe::arrivals::waiter_in_graph_gpu_only", waiter_in_graph),
    // The layer's exchange form where its decode form would run.
    ("moe::lines::arrivals::marked_after_dispatch", |e| super::with_form(e, MoeKernels::Lines, marked_after_dispatch)),
    ("moe::lines::arrivals::waiter_kernel_gpu_only", |e| super::with_form(e, MoeKernels::Lines, waiter_kernel)),
];

/// Every pair's flag is `epoch`, and so is the epoch word; `layout` (the
/// dispatch's) says which pairs had rows, so both kinds are seen.
fn check_marked<T: shmem::Element>(
    env: &Env,
    moe: &MoeAllToAll<T>,
    layout: Option<&Layout>,
    epoch: u64,
    what: &str,
) -> TestResult {
    let (n, s) = (env.n(), &env.s);
    let a = moe.arrivals();
    assert_eq!(a.last_epoch(s)?, epoch, "{what}: the epoch word");
    let flags = a.flags.copy_to_host(s)?;
    assert_eq!(flags.len(), moe.config().experts_per_pe * n, "{what}: flags");
    for e in 0..moe.config().experts_per_pe {
        for src in 0..n {
            let rows = layout.map(|l| l.source_rows(e, src).len());
            assert_eq!(flags[e * n + src], epoch, "{what}: expert {e} source {src} ({rows:?} rows)");
            assert_eq!(a.flag(e, src, s)?, epoch, "{what}: Arrivals::flag({e}, {src})");
        }
    }
    Ok(())
}

fn marked_after_dispatch(env: &Env) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    for (c, spread) in [
        (MoeConfig::new(8, 6, 2, 2).major_align(4), Spread::Random),
        (MoeConfig::new(5, 5, 3, 2), Spread::OnePe),
        (MoeConfig::new(4, 3, 2, 1), Spread::Nothing),
        // Rows of two 8 KiB pieces: a pair is marked once its rows' every piece is placed.
        (MoeConfig::new(2100, 4, 2, 2), Spread::Random),
    ] {
        if !routable(&c, n, spread) {
            continue;
        }
        let moe = MoeAllToAll::<f32>::new(&env.ctx, c)?;
        assert_eq!(moe.arrivals().last_epoch(s)?, 0, "{c:?}: a new exchange's epoch");
        let (tokens, ids, weights, count) = device_inputs::<f32>(env, &c)?;
        let mut epoch = 0;
        let mut empty_pairs = 0;
        for round in 0..2 {
            let what = format!("{c:?} {spread:?} round {round} on PE {me}");
            let r = routing::<f32>(env.fresh_seed(), me, n, &c, spread, &random_weight);
            let (_, layout) = moe.dispatch(&r.tokens, &r.ids, &r.weights, s)?;
            epoch += 1;
            check_marked(env, &moe, Some(&layout), epoch, &format!("{what}: dispatch"))?;
            empty_pairs += layout.splits().iter().filter(|&&x| x == 0).count();
            write_inputs(env, &r.tokens, &r.ids, &r.weights, c.top_k, (&tokens, &ids, &weights, &count))?;
            moe.dispatch_on_device(&tokens, &ids, &weights, &count, s)?;
            epoch += 1;
            check_marked(env, &moe, None, epoch, &format!("{what}: dispatch_on_device"))?;
            // A refused dispatch (an expert out of range on every PE with
            // tokens; the others fail as a collective mismatch) marks
            // nothing.
            let mut bad = r.ids.clone();
            if let Some(id) = bad.first_mut() {
                *id = (n * c.experts_per_pe) as i64;
            }
            let any_tokens = env.agree(u32::from(!r.ids.is_empty()))?.contains(&1);
            let refused = moe.dispatch(&r.tokens, &bad, &r.weights, s);
            assert_eq!(refused.is_err(), any_tokens, "{what}: a dispatch with an expert out of range on a PE");
            if !any_tokens {
                // Nothing to refuse: an empty dispatch, marked as any other.
                epoch += 1;
            }
            check_marked(env, &moe, None, epoch, &format!("{what}: after a refused dispatch"))?;
        }
        // These routings leave some pairs empty (no tokens anywhere; every
        // token to one PE's experts, so the others get none): their flags
        // were checked above.
        let seen_empty: u32 = env.agree(empty_pairs as u32)?.iter().sum();
        if spread == Spread::Nothing || (spread == Spread::OnePe && n > 1) {
            assert!(seen_empty > 0, "{c:?} {spread:?}: no PE saw an empty (expert, source) pair");
        }
        env.ctx.check_device()?;
    }
    // The FP8 forms mark the same flags.
    let c = MoeConfig::new(200, 4, 2, 2.min(2 * n)).fp8();
    let moe = MoeAllToAll::<bf16>::new(&env.ctx, c)?;
    let (tokens, ids, weights, count) = device_inputs::<bf16>(env, &c)?;
    let r = routing::<bf16>(env.fresh_seed(), me, n, &c, Spread::Random, &random_weight);
    let (_, layout) = moe.dispatch_fp8(Fp8Tokens::Bf16(&r.tokens), &r.ids, &r.weights, Fp8Out::E4m3, s)?;
    check_marked(env, &moe, Some(&layout), 1, &format!("dispatch_fp8 on PE {me}"))?;
    write_inputs(env, &r.tokens, &r.ids, &r.weights, c.top_k, (&tokens, &ids, &weights, &count))?;
    moe.dispatch_fp8_on_device(Fp8DeviceTokens::Bf16((&tokens).into()), &ids, &weights, &count, Fp8Out::Bf16, s)?;
    check_marked(env, &moe, None, 2, &format!("dispatch_fp8_on_device on PE {me}"))?;
    env.ctx.check_device()?;
    Ok(())
}

type Inputs<T> =
    (shmem::SymmetricBuffer<T>, shmem::SymmetricBuffer<i64>, shmem::SymmetricBuffer<f32>, shmem::SymmetricBuffer<i64>);

/// The device path's input buffers for `c`.
fn device_inputs<T: shmem::Element>(env: &Env, c: &MoeConfig) -> shmem::Result<Inputs<T>> {
    let ctx = &env.ctx;
    Ok((
        ctx.alloc(c.max_tokens * c.hidden)?,
        ctx.alloc(c.max_tokens * c.top_k)?,
        ctx.alloc(c.max_tokens * c.top_k)?,
        ctx.alloc(1)?,
    ))
}

/// Writes a routing into the device path's inputs.
fn write_inputs<T: shmem::Element>(
    env: &Env,
    tokens: &[T],
    ids: &[i64],
    weights: &[f32],
    top_k: usize,
    to: (
        &shmem::SymmetricBuffer<T>,
        &shmem::SymmetricBuffer<i64>,
        &shmem::SymmetricBuffer<f32>,
        &shmem::SymmetricBuffer<i64>,
    ),
) -> shmem::Result<()> {
    let s = &env.s;
    to.0.slice(..tokens.len()).copy_from_host(tokens, s)?;
    to.1.slice(..ids.len()).copy_from_host(ids, s)?;
    to.2.slice(..weights.len()).copy_from_host(weights, s)?;
    to.3.copy_from_host(&[(ids.len() / top_k) as i64], s)
}

const WAITER: &str = r#"
#include "shmem_device.cuh"

// Block (e, s) waits until source s's rows for local expert e of the
// dispatch of epoch `*epoch` are placed, then copies them (rows of
// `row_bytes`, where the view's splits and offsets `so` say; read after
// the wait, as the dispatch writes them) from the view into `out`, and
// notes the flag it saw.
extern "C" __global__ void take_rows(shmem::MoeArrivals a, const unsigned long long *epoch, const long long *so,
                                     const unsigned char *view, unsigned char *out,
                                     unsigned long long row_bytes, unsigned long long *seen) {
    const int e = blockIdx.x, s = blockIdx.y, n = a.n_pes, m = a.experts_per_pe * n;
    shmem::block_moe_wait_arrival(a, e, s, *epoch);
    const long long rows = so[e * n + s], at = so[m + e * n + s];
    shmem::block_copy(out + at * row_bytes, view + at * row_bytes, rows * row_bytes);
    if (threadIdx.x == 0) seen[e * n + s] = shmem::ld_acquire_u64(a.flags + e * n + s);
}

// The next step's epoch: a graph's waiter counts its steps on the device.
extern "C" __global__ void advance(unsigned long long *epoch) { *epoch += 1; }
"#;

/// The waiter's kernels and the stream it runs on.
struct Waiter {
    take: cudarc::driver::CudaFunction,
    advance: cudarc::driver::CudaFunction,
    side: std::sync::Arc<cudarc::driver::CudaStream>,
    /// The epoch it waits for, on the device; its copy of the view's
    /// rows, and the flag each block saw.
    epoch: shmem::SymmetricBuffer<u64>,
    out: shmem::SymmetricBuffer<u8>,
    seen: shmem::SymmetricBuffer<u64>,
}

impl Waiter {
    /// The waiter's buffers for exchanges of `c`, its stream a new one.
    fn new(
        env: &Env,
        cuda: &std::sync::Arc<cudarc::driver::CudaContext>,
        module: &std::sync::Arc<cudarc::driver::CudaModule>,
        c: &MoeConfig,
    ) -> Result<Waiter, Box<dyn std::error::Error>> {
        let n = env.n();
        Ok(Waiter {
            take: module.load_function("take_rows")?,
            advance: module.load_function("advance")?,
            side: cuda.new_stream()?,
            epoch: env.ctx.alloc(1)?,
            // The most view rows (every staged token in up to top_k blocks,
            // each block's padding), of f32 (the FP8 codes take fewer bytes).
            out: env.ctx.alloc(
                (c.max_tokens * n * c.top_k.min(c.experts_per_pe) + c.experts_per_pe * c.major_align) * c.hidden * 4,
            )?,
            seen: env.ctx.alloc(c.experts_per_pe * n)?,
        })
    }

    /// Poisons the copy and the flags seen, and sets the epoch to wait for.
    fn reset(&self, env: &Env, epoch: u64) -> TestResult {
        let s = &env.s;
        self.out.fill(0xa5, s)?;
        self.seen.fill(0, s)?;
        self.epoch.copy_from_host(&[epoch], s)?;
        Ok(env.s.synchronize()?)
    }

    /// Launches one block per (local expert, source) on `on`, waiting for
    /// the epoch in `self.epoch`, copying rows of `row_bytes` from `view`.
    fn launch(
        &self,
        env: &Env,
        on: &cudarc::driver::CudaStream,
        a: &shmem::Arrivals,
        (so, view): (u64, u64),
        row_bytes: usize,
    ) -> TestResult {
        let arg = a.device_arg()?;
        let ptr = |b: shmem::SymSlice<'_, u64>| -> shmem::Result<u64> { Ok(b.device_ptr()?.expect("gpu")) };
        let (epoch, seen, out) =
            (ptr(self.epoch.slice(..))?, ptr(self.seen.slice(..))?, self.out.slice(..).device_ptr()?.expect("gpu"));
        let (rb, ne, n) = (row_bytes as u64, self.seen.len() / env.n(), env.n());
        let cfg = LaunchConfig { grid_dim: (ne as u32, n as u32, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match the kernel's parameters: the
        // arrivals of a live exchange, one u64 epoch, the view's splits and
        // offsets (2 × ne × n i64), its view and `out` (as many bytes),
        // `seen` (ne × n u64); the streams are synchronized before any of
        // them is read, written or dropped.
        unsafe {
            on.launch_builder(&self.take)
                .arg(&arg)
                .arg(&epoch)
                .arg(&so)
                .arg(&view)
                .arg(&out)
                .arg(&rb)
                .arg(&seen)
                .launch(cfg)?
        };
        Ok(())
    }

    /// Advances the epoch in `self.epoch` by one, on `on`.
    fn advance(&self, on: &cudarc::driver::CudaStream) -> TestResult {
        let epoch = self.epoch.slice(..).device_ptr()?.expect("gpu");
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: one u64 of a live buffer, as the kernel takes.
        unsafe { on.launch_builder(&self.advance).arg(&epoch).launch(cfg)? };
        Ok(())
    }

    /// After the dispatch and the waiter: the copy against the device
    /// view, the view against the host path's (`want`), block by block,
    /// and the flags the blocks saw.
    fn check(
        &self,
        env: &Env,
        (view, want): (&[u8], &[u8]),
        layout: &Layout,
        row_bytes: usize,
        epoch: u64,
        what: &str,
    ) -> TestResult {
        let got = self.out.copy_to_host(&env.s)?;
        for (i, (&rows, &at)) in layout.splits().iter().zip(layout.offsets()).enumerate() {
            let (a, b) = (at as usize * row_bytes, (at + rows) as usize * row_bytes);
            assert_eq!(
                view[a..b],
                want[a..b],
                "{what}: pair {i} ({rows} rows): the device view against the host path's"
            );
            assert_eq!(got[a..b], view[a..b], "{what}: pair {i} ({rows} rows): the waiter's copy against the view");
        }
        let seen = self.seen.copy_to_host(&env.s)?;
        assert!(seen.iter().all(|&f| f == epoch), "{what}: the flags the waiter saw, {seen:?}, are not all {epoch}");
        Ok(())
    }
}

/// On a second stream, before each dispatch: one block per (local
/// expert, source) waits for the pair's flag and copies its rows; the
/// copy must equal the view (poisoned before, fresh tokens each round),
/// and the view the host path's. Native f32 rows and FP8 codes.
fn waiter_kernel(env: &Env) -> TestResult {
    needs_gpu(env)?;
    let n = env.n();
    let cuda = env.ctx.cuda_context().expect("gpu backend");
    let module = cuda.load_module(shmem::compile_with_device_header(cuda, WAITER)?)?;
    let waiter = |c: &MoeConfig| Waiter::new(env, cuda, &module, c);
    for (c, spread) in [
        (MoeConfig::new(64, 16, 2, 2).major_align(8), Spread::Random),
        (MoeConfig::new(33, 9, 3, 3), Spread::OnePe),
        (MoeConfig::new(100, 5, 4, 1), Spread::Random),
        (MoeConfig::new(2100, 6, 2, 2), Spread::Random),
    ] {
        if routable(&c, n, spread) {
            waiter_native(env, &waiter(&c)?, c, spread)?;
        }
    }
    let c = MoeConfig::new(256, 12, 2, 2.min(2 * n)).fp8();
    waiter_fp8(env, &waiter(&c)?, c)?;
    env.ctx.check_device()?;
    Ok(())
}

fn waiter_native(env: &Env, w: &Waiter, c: MoeConfig, spread: Spread) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    let moe = MoeAllToAll::<f32>::new(&env.ctx, c)?;
    let (tokens, ids, weights, count) = device_inputs::<f32>(env, &c)?;
    // A dispatch of nothing, for the whole receive buffer.
    count.copy_from_host(&[0], s)?;
    let view = moe.dispatch_on_device(&tokens, &ids, &weights, &count, s)?;
    let (a, row_bytes) = (moe.arrivals(), c.hidden * 4);
    for round in 0..3 {
        let what = format!("{c:?} {spread:?} round {round} on PE {me}");
        let r = routing::<f32>(env.fresh_seed(), me, n, &c, spread, &random_weight);
        write_inputs(env, &r.tokens, &r.ids, &r.weights, c.top_k, (&tokens, &ids, &weights, &count))?;
        view.copy_from_host(&vec![poison(); view.len()], s)?;
        let epoch = a.last_epoch(s)? + 1;
        // Every PE's waiter is up before any PE dispatches.
        let (so, v) = (moe.device_layout().device_ptr()?.expect("gpu"), view.device_ptr()?.expect("gpu"));
        w.reset(env, epoch)?;
        w.launch(env, &w.side, &a, (so, v), row_bytes)?;
        env.ctx.barrier_all(s)?;
        moe.dispatch_on_device(&tokens, &ids, &weights, &count, s)?;
        let got = bytes_of(&view.copy_to_host(s)?);
        w.side.synchronize()?;
        let (want, layout) = moe.dispatch(&r.tokens, &r.ids, &r.weights, s)?;
        let want = bytes_of(&want.copy_to_host(s)?);
        w.check(env, (&got, &want), &layout, row_bytes, epoch, &what)?;
    }
    Ok(())
}

fn waiter_fp8(env: &Env, w: &Waiter, c: MoeConfig) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    let moe = MoeAllToAll::<bf16>::new(&env.ctx, c)?;
    let (tokens, ids, weights, count) = device_inputs::<bf16>(env, &c)?;
    let codes = moe.fp8_received().expect("an FP8 exchange").rows;
    let a = moe.arrivals();
    let bits = |v: shmem::SymSlice<'_, shmem::fp8_e4m3>| -> shmem::Result<Vec<u8>> {
        Ok(v.copy_to_host(s)?.iter().map(|q| q.to_bits()).collect())
    };
    for round in 0..3 {
        let what = format!("{c:?} round {round} on PE {me}");
        let r = routing::<bf16>(env.fresh_seed(), me, n, &c, Spread::Random, &random_weight);
        write_inputs(env, &r.tokens, &r.ids, &r.weights, c.top_k, (&tokens, &ids, &weights, &count))?;
        codes.copy_from_host(&vec![shmem::fp8_e4m3::from_bits(0x7f); codes.len()], s)?;
        let epoch = a.last_epoch(s)? + 1;
        let (so, v) = (moe.device_layout().device_ptr()?.expect("gpu"), codes.device_ptr()?.expect("gpu"));
        w.reset(env, epoch)?;
        w.launch(env, &w.side, &a, (so, v), c.hidden)?;
        env.ctx.barrier_all(s)?;
        let from = Fp8DeviceTokens::Bf16((&tokens).into());
        moe.dispatch_fp8_on_device(from, &ids, &weights, &count, Fp8Out::E4m3, s)?;
        let got = bits(codes)?;
        w.side.synchronize()?;
        let (want, layout) = moe.dispatch_fp8(Fp8Tokens::Bf16(&r.tokens), &r.ids, &r.weights, Fp8Out::E4m3, s)?;
        w.check(env, (&got, &bits(want.rows)?), &layout, c.hidden, epoch, &what)?;
    }
    Ok(())
}

/// A step as one CUDA graph, replayed with fresh tokens: the waiter on a
/// stream forked inside the capture, waiting for the epoch in a device
/// word that it advances itself after each step, beside the dispatch on
/// the main stream. Each replay's copy equals the view, and every flag the
/// waiter saw holds that replay's epoch; nothing is reset between them.
fn waiter_in_graph(env: &Env) -> TestResult {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let stream = needs_gpu(env)?.clone();
    let (n, me, s) = (env.n(), env.me(), &env.s);
    let cuda = env.ctx.cuda_context().expect("gpu backend");
    let module = cuda.load_module(shmem::compile_with_device_header(cuda, WAITER)?)?;
    let c = MoeConfig::new(48, 10, 2, 2.min(2 * n)).major_align(4);
    let w = Waiter::new(env, cuda, &module, &c)?;
    let moe = MoeAllToAll::<f32>::new(&env.ctx, c)?;
    // The host path's reference, on an exchange of its own (whose
    // dispatches do not advance this one's epoch).
    let reference = MoeAllToAll::<f32>::new(&env.ctx, c)?;
    let (tokens, ids, weights, count) = device_inputs::<f32>(env, &c)?;
    // A dispatch of nothing, for the whole receive buffer.
    count.copy_from_host(&[0], s)?;
    let view = moe.dispatch_on_device(&tokens, &ids, &weights, &count, s)?;
    let a = moe.arrivals();
    let (so, v) = (moe.device_layout().device_ptr()?.expect("gpu"), view.device_ptr()?.expect("gpu"));
    let row_bytes = c.hidden * 4;
    env.ctx.barrier_all(s)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = (|| -> TestResult {
        let side = stream.fork()?;
        w.launch(env, &side, &a, (so, v), row_bytes)?;
        w.advance(&side)?;
        moe.dispatch_on_device(&tokens, &ids, &weights, &count, s)?;
        stream.join(&side)?;
        Ok(())
    })();
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
    captured?;
    let graph = graph.ok_or("the capture gave no graph")?;
    let base = a.last_epoch(s)?;
    w.reset(env, base + 1)?;
    for replay in 0..5u64 {
        let what = format!("{c:?} replay {replay} on PE {me}");
        let r = routing::<f32>(env.fresh_seed(), me, n, &c, Spread::Random, &random_weight);
        write_inputs(env, &r.tokens, &r.ids, &r.weights, c.top_k, (&tokens, &ids, &weights, &count))?;
        view.copy_from_host(&vec![poison(); view.len()], s)?;
        w.out.fill(0xa5, s)?;
        w.seen.fill(0, s)?;
        env.ctx.barrier_all(s)?;
        graph.launch()?;
        stream.synchronize()?;
        let epoch = base + 1 + replay;
        assert_eq!(a.last_epoch(s)?, epoch, "{what}: the exchange's epoch");
        assert_eq!(w.epoch.copy_to_host(s)?, [epoch + 1], "{what}: the waiter's next epoch");
        let got = bytes_of(&view.copy_to_host(s)?);
        let (want, layout) = reference.dispatch(&r.tokens, &r.ids, &r.weights, s)?;
        let want = bytes_of(&want.copy_to_host(s)?);
        w.check(env, (&got, &want), &layout, row_bytes, epoch, &what)?;
    }
    env.ctx.check_device()?;
    Ok(())
}

fn bytes_of<T: Copy>(xs: &[T]) -> Vec<u8> {
    // SAFETY: plain element types without padding; u8 needs no alignment.
    unsafe { std::slice::from_raw_parts(xs.as_ptr().cast::<u8>(), std::mem::size_of_val(xs)) }.to_vec()
}
