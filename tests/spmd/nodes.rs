//! Traffic with other nodes' PEs ([`shmem::Context::net_traffic`]): on
//! the host backend every flat collective ([`AcrossNodes::Flat`]) moves
//! exactly what [`shmem::net::host_flat_traffic`] says, RMA calls count what they move
//! to other nodes on either backend, and on one node nothing counts.
//! Run across nodes with `SHMEM_TEST_NODES=2`.

use crate::util::{needs_gpu, Env, NotApplicable, TestElem, TestResult};
use crate::TestFn;
use shmem::net::{host_flat_traffic, Collective, NodeShape};
use shmem::{bf16, AcrossNodes, Collectives, NetTraffic, ReduceOp, SignalOp};

pub const TESTS: &[(&str, TestFn)] = &[
    ("nodes::host_collectives_count_their_formula", host_collectives_count_their_formula),
    ("nodes::rma_counts_other_nodes_only", rma_counts_other_nodes_only),
    ("nodes::gpu_kernels_count_other_nodes_only", gpu_kernels_count_other_nodes_only),
];

/// The world's nodes: the same number of PEs on each, in PE order (as
/// `shmemrun --nodes` places them); otherwise the tests do not apply.
fn shape(env: &Env) -> Result<NodeShape, Box<dyn std::error::Error>> {
    let (n, per_node) = (env.n(), env.ctx.local_size());
    let first = env.ctx.node().world_pe(0)?;
    if n % per_node != 0 || first != env.me() / per_node * per_node {
        return Err(NotApplicable("needs the same number of PEs on every node, in PE order".into()).into());
    }
    Ok(NodeShape { nodes: n / per_node, per_node })
}

/// This PE's traffic with other nodes during `op`.
fn measure(env: &Env, op: impl FnOnce() -> shmem::Result<()>) -> shmem::Result<NetTraffic> {
    let before = env.ctx.net_traffic(&env.s)?;
    op()?;
    Ok(env.ctx.net_traffic(&env.s)?.since(&before))
}

fn host_collectives_count_their_formula(env: &Env) -> TestResult {
    if env.s.cuda_stream().is_some() {
        return Err(NotApplicable("the host backend's formula; the kernels' algorithms vary by size".into()).into());
    }
    let shape = shape(env)?;
    // The formula is the flat forms'.
    let before = env.ctx.collectives();
    env.ctx.set_collectives(Collectives { across_nodes: AcrossNodes::Flat, ..before });
    // Small, odd, and past the one-shot all-reduce's limit (two-shot,
    // uneven blocks) for every element size here.
    let result = (|| {
        for count in [1, 5, 4099, 150_001] {
            collectives_count::<f32>(env, shape, count)?;
            collectives_count::<bf16>(env, shape, count)?;
            collectives_count::<u64>(env, shape, count)?;
        }
        Ok(())
    })();
    env.ctx.set_collectives(before);
    result
}

/// Every collective with `count` elements (see `host_flat_traffic`) of
/// random values: the results are checked, and this PE's traffic must be
/// the formula's (nothing on one node).
fn collectives_count<T: TestElem + PartialOrd>(env: &Env, shape: NodeShape, count: usize) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let world = env.ctx.world();
    let seed = env.fresh_seed();
    let value = |pe: usize, i: usize| {
        T::random(crate::util::mix(seed ^ crate::util::mix((pe as u64) << 40 ^ i as u64)), ReduceOp::Max)
    };
    let inputs = |pe: usize, len: usize| (0..len).map(|i| value(pe, i)).collect::<Vec<T>>();
    let max_of = |i: usize| (1..n).map(|pe| value(pe, i)).fold(value(0, i), |m, v| if v > m { v } else { m });
    let src = env.ctx.alloc::<T>(n * count)?;
    let dst = env.ctx.alloc::<T>(n * count)?;
    let poison = vec![crate::util::poison::<T>(); n * count];
    let elem = size_of::<T>();
    let root = n - 1;
    for op in Collective::all(root) {
        src.copy_from_host(&inputs(me, n * count), s)?;
        dst.copy_from_host(&poison, s)?;
        world.barrier(s)?;
        let (got, want): (NetTraffic, Vec<T>) = match op {
            Collective::Broadcast { root } => {
                let t = measure(env, || world.broadcast(dst.slice(..count), src.slice(..count), root, s))?;
                (t, inputs(root, count))
            }
            Collective::AllGather => {
                let t = measure(env, || world.all_gather(&dst, src.slice(..count), s))?;
                (t, (0..n).flat_map(|pe| inputs(pe, count)).collect())
            }
            Collective::AllReduce => {
                let t = measure(env, || world.all_reduce(dst.slice(..count), src.slice(..count), ReduceOp::Max, s))?;
                (t, (0..count).map(max_of).collect())
            }
            Collective::ReduceScatter => {
                let t = measure(env, || world.reduce_scatter(dst.slice(..count), &src, ReduceOp::Max, s))?;
                (t, (me * count..(me + 1) * count).map(max_of).collect())
            }
            Collective::AllToAll => {
                let t = measure(env, || world.all_to_all(&dst, &src, s))?;
                let want = (0..n).flat_map(|pe| inputs(pe, n * count)[me * count..(me + 1) * count].to_vec()).collect();
                (t, want)
            }
        };
        let what = format!("{} of {count} {:?} on {shape:?}, PE {me}", op.name(), T::DTYPE);
        crate::util::assert_bits_eq(&dst.slice(..want.len()).copy_to_host(s)?, &want, &what);
        let formula_count = match op {
            Collective::ReduceScatter | Collective::AllToAll => n * count,
            _ => count,
        };
        assert_eq!(got, host_flat_traffic(op, shape, me, formula_count, elem), "{what}: traffic");
        if shape.nodes == 1 {
            assert_eq!(got, NetTraffic::default(), "{what}: one node");
        }
    }
    // In place: the same traffic.
    src.slice(..count).copy_from_host(&inputs(me, count), s)?;
    world.barrier(s)?;
    let got = measure(env, || world.all_reduce(src.slice(..count), src.slice(..count), ReduceOp::Max, s))?;
    let want: Vec<T> = (0..count).map(max_of).collect();
    crate::util::assert_bits_eq(&src.slice(..count).copy_to_host(s)?, &want, "in-place all_reduce");
    assert_eq!(got, host_flat_traffic(Collective::AllReduce, shape, me, count, elem), "in-place all_reduce: traffic");
    world.barrier(s)?;
    Ok(())
}

/// Every PE puts, gets, signals and puts with a signal to every peer:
/// what went to other nodes' PEs counts, at the PE that called.
fn rma_counts_other_nodes_only(env: &Env) -> TestResult {
    let (me, n, s, ctx) = (env.me(), env.n(), &env.s, &env.ctx);
    let shape = shape(env)?;
    const W: usize = 16;
    let encode = |pe: usize, i: usize| (pe * 1000 + i) as u32;
    let buf = ctx.alloc::<u32>(n * W)?;
    let mine = ctx.alloc::<u32>(W)?;
    let sig = ctx.alloc::<u64>(n)?;
    buf.copy_from_host(&(0..n * W).map(|i| encode(me, i)).collect::<Vec<_>>(), s)?;
    mine.copy_from_host(&(0..W).map(|i| encode(me, 500 + i)).collect::<Vec<_>>(), s)?;
    sig.copy_from_host(&vec![0; n], s)?;
    ctx.barrier_all(s)?;
    let peers: Vec<usize> = (0..n).filter(|&pe| pe != me).collect();
    let mut fetched = Vec::new();
    let got = measure(env, || {
        for &pe in &peers {
            // Block `me` of each peer's `buf` is this PE's to write; block
            // `pe` of its own is written by nobody.
            let at = me * W;
            ctx.put(buf.slice(at..at + 7), mine.slice(..7), pe, s)?;
            ctx.p(&buf, at + 7, encode(me, 900 + pe), pe, s)?;
            ctx.put_signal(buf.slice(at + 8..at + 11), mine.slice(8..11), &sig, me, 1, SignalOp::Add, pe, s)?;
            ctx.signal_op(&sig, me, 1, SignalOp::Add, pe, s)?;
            ctx.get(mine.slice(12..15), buf.slice(pe * W..pe * W + 3), pe, s)?;
            fetched.push((mine.slice(12..15).copy_to_host(s)?, ctx.g(&buf, pe * W + 3, pe, s)?));
        }
        ctx.quiet(s)
    })?;
    ctx.barrier_all(s)?;
    for (k, &pe) in peers.iter().enumerate() {
        let want: Vec<u32> = (0..3).map(|i| encode(pe, pe * W + i)).collect();
        assert_eq!(fetched[k], (want, encode(pe, pe * W + 3)), "get and g from PE {pe}");
    }
    let held = buf.copy_to_host(s)?;
    let signals = sig.copy_to_host(s)?;
    for &pe in &peers {
        let block = &held[pe * W..(pe + 1) * W];
        let want: Vec<u32> = (0..W)
            .map(|i| match i {
                0..7 | 8..11 => encode(pe, 500 + i),
                7 => encode(pe, 900 + me),
                _ => encode(me, pe * W + i),
            })
            .collect();
        assert_eq!(block, &want[..], "block written by PE {pe}");
        assert_eq!(signals[pe], 2, "signals from PE {pe}");
    }
    let remote = peers.iter().filter(|&&pe| shape.apart(pe, me)).count() as u64;
    let want = NetTraffic {
        bytes_put: remote * (7 + 1 + 3) * 4,
        bytes_got: remote * (3 + 1) * 4,
        puts: remote * 3,
        gets: remote * 2,
        signals: remote * 2,
    };
    assert_eq!(got, want, "PE {me} on {shape:?}");
    Ok(())
}

/// The kernels count their RMA to other nodes' PEs: something across
/// nodes, nothing on one node, even where RMA is forced there.
fn gpu_kernels_count_other_nodes_only(env: &Env) -> TestResult {
    needs_gpu(env)?;
    let (me, n, s, ctx) = (env.me(), env.n(), &env.s, &env.ctx);
    let shape = shape(env)?;
    let world = ctx.world();
    let len = 4096;
    let src = ctx.alloc::<f32>(len)?;
    let dst = ctx.alloc::<f32>(n * len)?;
    src.copy_from_host(&vec![me as f32; len], s)?;
    let force = ctx.force_rma();
    for forced in [false, true] {
        ctx.set_force_rma(forced);
        let reduce = measure(env, || world.all_reduce(dst.slice(..len), &src, ReduceOp::Sum, s))?;
        let sum = (n * (n - 1) / 2) as f32;
        assert!(dst.slice(..len).copy_to_host(s)?.iter().all(|&v| v == sum), "all_reduce, forced RMA {forced}");
        let gather = measure(env, || world.all_gather(&dst, &src, s))?;
        let got = dst.copy_to_host(s)?;
        assert!(got.iter().enumerate().all(|(i, &v)| v == (i / len) as f32), "all_gather, forced RMA {forced}");
        for (t, what) in [(reduce, "all_reduce"), (gather, "all_gather")] {
            if shape.nodes == 1 {
                assert_eq!(t, NetTraffic::default(), "{what} on one node, forced RMA {forced}");
            } else {
                assert!(t.bytes() > 0 && t.puts + t.gets > 0, "{what} across nodes, forced RMA {forced}: {t:?}");
            }
        }
        ctx.barrier_all(s)?;
    }
    ctx.set_force_rma(force);
    Ok(())
}
