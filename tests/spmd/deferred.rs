//! Failures found on the device after the call that made them returned.
//!
//! On the gpu backend an eager collective agrees on the device, and the MoE
//! exchanges check their splits and routing there: a call whose PEs'
//! calls differ (in length, reduction or root), a bad 2D split, a bad
//! routing of `MoeAllToAll::dispatch_on_device` return `Ok`, and their
//! kernels write nothing. The first call that can see the failure reports
//! it, on every PE, once: a `copy_to_host` (which waits for the stream),
//! another collective (which reads the host-mapped record the kernels
//! write), or `finalize` (the scenario below). The host backend checks
//! before it writes, so there the call itself fails; the same tests check
//! that. Either way: exactly one report, the message the host's check
//! gives, the destination unwritten, and the context usable afterwards.

use crate::util::{assert_bits_eq, needs_gpu, needs_pes, poison, Env, TestResult};
use crate::TestFn;
use shmem::{BackendKind, Error, MoeAllToAll, MoeConfig, ReduceOp, RoutingFault, SymmetricBuffer};

pub const TESTS: &[(&str, TestFn)] = &[
    ("deferred::length_then_copy", |e| deferred(e, Kind::Length, Next::Copy)),
    ("deferred::length_then_collective", |e| deferred(e, Kind::Length, Next::Collective)),
    ("deferred::op_then_copy", |e| deferred(e, Kind::Op, Next::Copy)),
    ("deferred::op_then_collective", |e| deferred(e, Kind::Op, Next::Collective)),
    ("deferred::root_then_copy", |e| deferred(e, Kind::Root, Next::Copy)),
    ("deferred::root_then_collective", |e| deferred(e, Kind::Root, Next::Collective)),
    ("deferred::split_2d_then_copy", |e| deferred(e, Kind::Split2d, Next::Copy)),
    ("deferred::split_2d_then_collective", |e| deferred(e, Kind::Split2d, Next::Collective)),
    ("deferred::routing_then_copy", |e| deferred(e, Kind::Routing, Next::Copy)),
    ("deferred::routing_then_collective", |e| deferred(e, Kind::Routing, Next::Collective)),
    ("deferred::reported_once_without_a_wait", reported_once_without_a_wait),
    ("deferred::at_finalize", at_finalize),
    ("deferred::graph_replay_gpu_only", graph_replay),
];

/// The kinds of failure a kernel finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The last PE's all-reduce is 4000 elements, the others' 4096.
    Length,
    /// PE 0 reduces by max, the others by min.
    Op,
    /// PE 0 broadcasts from PE 0, the others from the last PE.
    Root,
    /// The last PE's `all_to_all_v_2d` has a negative split.
    Split2d,
    /// The last PE routes a token to an expert out of range.
    Routing,
}

/// What comes after the failed call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// `copy_to_host` of the failed call's destination.
    Copy,
    /// An all-reduce on other buffers, once the failed call's kernel has
    /// run (waited for through CUDA itself, which shmem does not see).
    Collective,
}

/// The elements of the collectives' buffers.
const LEN: usize = 4096;
/// Poison of the MoE out splits/offsets.
const POISON_SO: i64 = -7;

/// One failing call and what to check of it.
struct Failing<'a> {
    env: &'a Env,
    kind: Kind,
    /// The collectives' source and destination.
    src: SymmetricBuffer<f32>,
    dst: SymmetricBuffer<f32>,
    /// The 2D exchange's buffers: input, output, splits, out splits/offsets.
    a2a: Option<TwoD>,
    /// The layer's buffers, and its view and layout before the failed call.
    layer: Option<Layer>,
}

/// The 2D exchange's input, output, splits and out splits/offsets.
type TwoD = (SymmetricBuffer<f32>, SymmetricBuffer<f32>, SymmetricBuffer<i64>, SymmetricBuffer<i64>);

struct Layer {
    moe: MoeAllToAll<f32>,
    tokens: SymmetricBuffer<f32>,
    ids: SymmetricBuffer<i64>,
    weights: SymmetricBuffer<f32>,
    count: SymmetricBuffer<i64>,
    view: Vec<f32>,
    layout: Vec<i64>,
}

/// The 2D exchange's shape: rows of 4 elements, 2 experts a PE, 8 input
/// rows, blocks aligned to 8 rows.
const ROW: usize = 4;
const NE: usize = 2;
const IN_ROWS: usize = 8;
const ALIGN: usize = 8;

fn filled<T: crate::util::TestElem>(env: &Env, data: &[T]) -> shmem::Result<SymmetricBuffer<T>> {
    let b = env.ctx.alloc::<T>(data.len())?;
    b.copy_from_host(data, &env.s)?;
    Ok(b)
}

impl<'a> Failing<'a> {
    fn new(env: &'a Env, kind: Kind) -> shmem::Result<Failing<'a>> {
        let (n, me) = (env.n(), env.me());
        let src = filled(env, &(0..LEN).map(|i| (me * LEN + i) as f32).collect::<Vec<_>>())?;
        let dst = filled(env, &vec![poison::<f32>(); LEN])?;
        let a2a = match kind {
            Kind::Split2d => {
                // A row to each of the first (PE, expert) pairs, as many
                // as the input holds; the last PE's last split negative.
                let mut splits: Vec<i64> = (0..n * NE).map(|i| i64::from(i < IN_ROWS / 2)).collect();
                if me == n - 1 {
                    splits[n * NE - 1] = -3;
                }
                let out_rows = NE * ALIGN * n.div_ceil(ALIGN) + NE * ALIGN;
                Some((
                    filled(env, &[1.0f32; IN_ROWS * ROW])?,
                    filled(env, &vec![poison::<f32>(); out_rows * ROW])?,
                    filled(env, &splits)?,
                    filled(env, &vec![POISON_SO; 2 * n * NE])?,
                ))
            }
            _ => None,
        };
        let layer = match kind {
            Kind::Routing => Some(Layer::new(env)?),
            _ => None,
        };
        Ok(Failing { env, kind, src, dst, a2a, layer })
    }

    /// The call whose failure a kernel finds.
    fn call(&self) -> shmem::Result<()> {
        let (env, s) = (self.env, &self.env.s);
        let (n, me) = (env.n(), env.me());
        match self.kind {
            Kind::Length => {
                let len = if me == n - 1 { 4000 } else { LEN };
                env.ctx.all_reduce(self.dst.slice(..len), self.src.slice(..len), ReduceOp::Sum, s)
            }
            Kind::Op => {
                let op = if me == 0 { ReduceOp::Max } else { ReduceOp::Min };
                env.ctx.all_reduce(&self.dst, &self.src, op, s)
            }
            Kind::Root => env.ctx.broadcast(&self.dst, &self.src, if me == 0 { 0 } else { n - 1 }, s),
            Kind::Split2d => {
                let (input, output, splits, so) = self.a2a.as_ref().expect("the 2D exchange's buffers");
                env.ctx.all_to_all_v_2d(input, output, splits, so, ROW, ALIGN, s)
            }
            Kind::Routing => {
                let l = self.layer.as_ref().expect("the layer");
                l.moe.dispatch_on_device(&l.tokens, &l.ids, &l.weights, &l.count, s).map(drop)
            }
        }
    }

    /// Whether `e` is this kind's error, as the host's check words it.
    fn check(&self, e: &Error) {
        let (n, me) = (self.env.n(), self.env.me());
        let m = e.to_string();
        match self.kind {
            Kind::Length => {
                assert!(matches!(e, Error::CollectiveMismatch(_)), "{m}");
                assert!(m.contains("all_reduce") && m.contains("src 4096 elements"), "{m}");
                assert!(m.contains("src 4000 elements"), "{m}");
            }
            Kind::Op => {
                assert!(matches!(e, Error::CollectiveMismatch(_)), "{m}");
                assert!(m.contains("max") && m.contains("min"), "{m}");
            }
            Kind::Root => {
                assert!(matches!(e, Error::CollectiveMismatch(_)), "{m}");
                assert!(
                    m.contains("broadcast") && m.contains("root 0") && m.contains(&format!("root {}", n - 1)),
                    "{m}"
                );
            }
            Kind::Split2d => {
                assert!(matches!(e, Error::Invalid(_)), "{m}");
                assert!(m.contains(&format!("PE {}'s split", n - 1)) && m.contains("negative"), "{m}");
            }
            Kind::Routing => {
                let fault = RoutingFault::ExpertOutOfRange;
                let bad = n - 1;
                match e {
                    Error::BadRouting { fault: f, .. } if me == bad => assert_eq!(*f, fault, "{m}"),
                    _ => {
                        // In the node-aware form on the gpu backend, off the
                        // bad PE's rail: the failed split of the forwarder
                        // of this node that took its rail's failure.
                        let per = self.env.ctx.node().n_pes();
                        let forwarder = format!("PE {}'s split 0 is negative", me / per * per + bad % per);
                        let node_aware = self.layer.as_ref().is_some_and(|l| l.moe.node_aware());
                        let named = m.contains(&format!("PE {bad} ")) && m.contains(fault.describe());
                        assert!(named || (node_aware && me % per != bad % per && m.contains(&forwarder)), "{m}");
                    }
                }
            }
        }
    }

    /// The failed call wrote nothing: its destination as it was.
    fn nothing_written(&self) -> TestResult {
        let s = &self.env.s;
        assert_bits_eq(&self.dst.copy_to_host(s)?, &vec![poison::<f32>(); LEN], "the collective's destination");
        if let Some((_, output, _, so)) = &self.a2a {
            assert_bits_eq(&output.copy_to_host(s)?, &vec![poison::<f32>(); output.len()], "the 2D output");
            assert_eq!(so.copy_to_host(s)?, vec![POISON_SO; so.len()], "the 2D out splits/offsets");
        }
        if let Some(l) = &self.layer {
            assert_eq!(l.moe.device_layout().copy_to_host(s)?, l.layout, "the layout");
            assert_bits_eq(&l.moe.device_view().copy_to_host(s)?, &l.view, "the view");
        }
        Ok(())
    }

    /// The destination the failure is read through by [`Next::Copy`].
    fn read_destination(&self) -> shmem::Result<()> {
        let s = &self.env.s;
        match (&self.a2a, &self.layer) {
            (Some((_, output, _, _)), _) => output.copy_to_host(s).map(drop),
            (_, Some(l)) => l.moe.device_layout().copy_to_host(s).map(drop),
            _ => self.dst.copy_to_host(s).map(drop),
        }
    }
}

impl Layer {
    /// A layer of 3 tokens a PE, two experts each; the last PE's first
    /// token goes to an expert past the last. Its view and layout are those
    /// of a good dispatch before.
    fn new(env: &Env) -> shmem::Result<Layer> {
        let (n, me, s) = (env.n(), env.me(), &env.s);
        let c = MoeConfig::new(4, 3, 2, 2);
        let moe = MoeAllToAll::<f32>::new(&env.ctx, c)?;
        let tokens = filled(env, &(0..12).map(|i| (me * 100 + i) as f32).collect::<Vec<_>>())?;
        let good = vec![0i64, 1, 1, 0, (2 * n - 1) as i64, 0];
        let ids = filled(env, &good)?;
        let weights = filled(env, &[0.5f32; 6])?;
        let count = filled(env, &[3i64])?;
        moe.dispatch_on_device(&tokens, &ids, &weights, &count, s)?;
        let mut l = Layer { moe, tokens, ids, weights, count, view: Vec::new(), layout: Vec::new() };
        l.view = l.moe.device_view().copy_to_host(s)?;
        l.layout = l.moe.device_layout().copy_to_host(s)?;
        if me == n - 1 {
            l.ids.copy_from_host(&[0, 1, 1, (2 * n) as i64, 0, 1], s)?;
        }
        Ok(l)
    }
}

/// Waits for the stream through CUDA itself, which shmem does not see:
/// the failed call's kernel has run, and nothing has reported it.
fn raw_wait(env: &Env) -> TestResult {
    if let Some(cs) = env.s.cuda_stream() {
        cs.synchronize()?;
    }
    Ok(())
}

/// An all-reduce of 256 words on fresh buffers whose sums encode every
/// PE; returns its result buffer and the sums it must hold.
fn good_all_reduce(env: &Env) -> shmem::Result<(shmem::Result<()>, SymmetricBuffer<u64>, Vec<u64>)> {
    let n = env.n() as u64;
    let mine: Vec<u64> = (0..256u64).map(|i| ((env.me() as u64 + 1) << 20) | i).collect();
    let x = filled(env, &mine)?;
    let r = env.ctx.all_reduce(&x, &x, ReduceOp::Sum, &env.s);
    let want = (0..256u64).map(|i| ((n * (n + 1) / 2) << 20) | (n * i)).collect();
    Ok((r, x, want))
}

fn applies(env: &Env, kind: Kind) -> TestResult {
    if matches!(kind, Kind::Length | Kind::Op | Kind::Root) {
        // The PEs' calls differ: it takes two.
        needs_pes(env, 2)?;
    }
    Ok(())
}

fn deferred(env: &Env, kind: Kind, next: Next) -> TestResult {
    applies(env, kind)?;
    let f = Failing::new(env, kind)?;
    let host = env.ctx.backend() == BackendKind::Host;
    let at_call = f.call().err();
    if host {
        assert!(at_call.is_some(), "{kind:?}: the host backend checks before it writes: the call itself fails");
    }
    raw_wait(env)?;
    let (later, collective) = match next {
        Next::Copy => (f.read_destination().err(), None),
        Next::Collective => {
            let (r, x, want) = good_all_reduce(env)?;
            (r.err(), Some((x, want)))
        }
    };
    // On the gpu backend the call may report its own failure where its
    // kernel ran before it returned; else the next call must.
    match (&at_call, &later) {
        (Some(e), None) | (None, Some(e)) => f.check(e),
        (Some(a), Some(b)) => panic!("{kind:?}: reported twice: by the call ({a}) and after it ({b})"),
        (None, None) => panic!("{kind:?} then {next:?}: the failure was never reported"),
    }
    if let Some((x, want)) = collective {
        // The collective that reported the failure ran all the same.
        assert_eq!(x.copy_to_host(&env.s)?, want, "{kind:?}: the collective that reported the failure");
    }
    f.nothing_written()?;
    env.ctx.check_device()?;
    // The context is usable: a good collective, nothing left to report.
    let (r, x, want) = good_all_reduce(env)?;
    r?;
    assert_eq!(x.copy_to_host(&env.s)?, want, "{kind:?}: an all-reduce after the failure");
    if kind == Kind::Routing {
        let l = f.layer.as_ref().expect("the layer");
        l.ids.copy_from_host(&[0, 1, 1, 0, (2 * env.n() - 1) as i64, 0], &env.s)?;
        l.moe.dispatch_on_device(&l.tokens, &l.ids, &l.weights, &l.count, &env.s)?;
        let view = l.moe.device_view().copy_to_host(&env.s)?;
        assert_bits_eq(&view, &l.view, "the view of a good dispatch after the failure");
    }
    Ok(())
}

/// With no wait in between: a failed all-reduce, then a good all-reduce,
/// then a `copy_to_host` of the good one. Exactly one of the three reports
/// the failure (which one depends on when the kernel ran), and the good
/// one's sums are right.
fn reported_once_without_a_wait(env: &Env) -> TestResult {
    needs_pes(env, 2)?;
    for round in 0..8 {
        let f = Failing::new(env, Kind::Length)?;
        let first = f.call().err();
        let (second, x, want) = good_all_reduce(env)?;
        let third = x.copy_to_host(&env.s);
        let reports: Vec<String> = [first.as_ref(), second.as_ref().err(), third.as_ref().err()]
            .into_iter()
            .flatten()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(reports.len(), 1, "round {round}: reports {reports:?}");
        assert!(reports[0].contains("src 4000 elements"), "round {round}: {}", reports[0]);
        let sums = match third {
            Ok(v) => v,
            Err(_) => x.copy_to_host(&env.s)?,
        };
        assert_eq!(sums, want, "round {round}: the good all-reduce");
        f.nothing_written()?;
        env.ctx.check_device()?;
    }
    Ok(())
}

/// GPU only: a 2D dispatch captured in a CUDA graph and replayed, with a
/// negative split on the last PE at the second replay: that replay writes
/// nothing, and the `copy_to_host` after it reports the failure on every
/// PE, once (a replay reports through the record eager calls use); the
/// third replay, with good splits again, is exact.
fn graph_replay(env: &Env) -> TestResult {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let stream = needs_gpu(env)?;
    let (n, me, s, ctx) = (env.n(), env.me(), &env.s, &env.ctx);
    let m = n * NE;
    let good: Vec<i64> = (0..m).map(|i| i64::from(i < IN_ROWS)).collect();
    let mut bad = good.clone();
    bad[0] = -2;
    let input = filled(env, &(0..IN_ROWS * ROW).map(|i| (me * 1000 + i) as f32).collect::<Vec<_>>())?;
    let splits = filled(env, &good)?;
    let out_rows = NE * ALIGN * n.div_ceil(ALIGN) + NE * ALIGN;
    let output = filled(env, &vec![poison::<f32>(); out_rows * ROW])?;
    let so = filled(env, &vec![POISON_SO; 2 * m])?;
    ctx.barrier_all(s)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = ctx.all_to_all_v_2d(&input, &output, &splits, &so, ROW, ALIGN, s);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
    captured?;
    let graph = graph.ok_or("capture gave no graph")?;
    let replay = |mine: &[i64]| -> TestResult {
        splits.copy_from_host(mine, s)?;
        output.fill(poison(), s)?;
        so.fill(POISON_SO, s)?;
        Ok(graph.launch()?)
    };
    replay(&good)?;
    let (rows, so_good) = (output.copy_to_host(s)?, so.copy_to_host(s)?);
    assert_ne!(so_good, vec![POISON_SO; 2 * m], "the first replay's out splits/offsets");
    replay(if me == n - 1 { &bad } else { &good })?;
    let e = match output.copy_to_host(s) {
        Err(e) => e,
        Ok(_) => panic!("a replay with a negative split was not reported"),
    };
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    assert!(e.to_string().contains(&format!("PE {}'s split 0 is negative (-2)", n - 1)), "{e}");
    assert_bits_eq(&output.copy_to_host(s)?, &vec![poison::<f32>(); out_rows * ROW], "the bad replay's output");
    assert_eq!(so.copy_to_host(s)?, vec![POISON_SO; 2 * m], "the bad replay's out splits/offsets");
    replay(&good)?;
    assert_bits_eq(&output.copy_to_host(s)?, &rows, "a good replay after the bad one");
    assert_eq!(so.copy_to_host(s)?, so_good, "a good replay's out splits/offsets");
    ctx.check_device()?;
    Ok(())
}

/// A failed call that nothing reports before `finalize`: `finalize` does,
/// on every PE (a job of its own, see `scenarios.rs`).
fn at_finalize(env: &Env) -> TestResult {
    crate::scenarios::unreported_at_finalize(env)
}

/// The scenario's PE: the last PE's all-reduce is shorter, then
/// `finalize`. On the host backend the call fails and `finalize`
/// succeeds; on the gpu backend the call returns (its kernel skips it)
/// and `finalize` fails with the mismatch, unless the call itself saw its
/// kernel's verdict. Exactly one report either way.
pub fn unreported_at_finalize_pe(rank: usize) -> Result<(), String> {
    let ctx = shmem::init().map_err(|e| e.to_string())?;
    let n = ctx.n_pes();
    let s = ctx.stream();
    let a = ctx.alloc::<f32>(LEN).map_err(|e| e.to_string())?;
    let len = if rank == n - 1 { 4000 } else { LEN };
    let call = ctx.all_reduce(a.slice(..len), a.slice(..len), ReduceOp::Sum, &s).err();
    let host = ctx.backend() == BackendKind::Host;
    let end = ctx.finalize().err();
    let e = match (call, end) {
        (Some(e), None) => e,
        (None, Some(e)) if !host => e,
        (None, Some(e)) => return Err(format!("the host backend's call succeeded, finalize failed: {e}")),
        (Some(a), Some(b)) => return Err(format!("reported twice: {a}, then by finalize: {b}")),
        (None, None) => return Err("the failure was never reported".into()),
    };
    match e {
        Error::CollectiveMismatch(m) if m.contains("src 4000 elements") => {
            eprintln!("PE {rank} saw: {m}");
            Ok(())
        }
        e => Err(format!("wrong error: {e}")),
    }
}
