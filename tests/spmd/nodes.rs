//! Traffic with other nodes' PEs ([`shmem::Context::net_traffic`]): on
//! the host backend every flat collective ([`AcrossNodes::Flat`]) moves
//! exactly what [`shmem::net::host_flat_traffic`] says, and every
//! node-aware one exactly what [`shmem::net::host_node_traffic`] says,
//! within the bounds `docs/clusters.md` states; RMA calls count what they
//! move to other nodes on either backend, and on one node nothing counts.
//! Run across nodes with `SHMEM_TEST_NODES=2` (or 3, 4, …).

use crate::coll::{reduce, reduce_grouped};
use crate::util::{assert_bits_eq, needs_gpu, payload, poison, Env, NotApplicable, TestElem, TestResult};
use crate::TestFn;
use shmem::net::{host_flat_traffic, host_node_traffic, Collective, NodeShape};
use shmem::{bf16, AcrossNodes, Collectives, DType, NetTraffic, ReduceOp, ReduceOrder, SignalOp, SymmetricBuffer};

pub const TESTS: &[(&str, TestFn)] = &[
    ("nodes::host_collectives_count_their_formula", host_collectives_count_their_formula),
    ("nodes::node_aware_collectives_count_their_formula", |e| {
        node_aware_collectives_count_their_formula(e, ReduceOrder::PeOrder)
    }),
    ("nodes::node_grouped_collectives_count_their_formula", |e| {
        node_aware_collectives_count_their_formula(e, ReduceOrder::NodeGrouped)
    }),
    ("nodes::rma_counts_other_nodes_only", rma_counts_other_nodes_only),
    ("nodes::gpu_kernels_count_other_nodes_only", gpu_kernels_count_other_nodes_only),
    ("nodes::node_aware_all_to_all_eager_and_replayed", node_aware_all_to_all),
    ("nodes::gpu_node_grouped_reductions_count_their_formula", gpu_node_grouped_reductions),
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
    with_settings(env, AcrossNodes::Flat, ReduceOrder::PeOrder, || {
        assert!(!env.ctx.world().node_aware(), "the flat forms asked for");
        each_count(env, shape, ReduceOrder::PeOrder)
    })
}

/// The node-aware forms across nodes, reductions in `order`: as `Auto`
/// chooses them (flat with one PE a node), and where that is flat also as
/// [`AcrossNodes::NodeAware`] forces them. Each call's traffic must be
/// [`host_node_traffic`]'s, within the bounds [`assert_within_bounds`]
/// checks; results are checked bit for bit, sums against the fold in
/// `order`.
fn node_aware_collectives_count_their_formula(env: &Env, order: ReduceOrder) -> TestResult {
    if env.s.cuda_stream().is_some() {
        return Err(NotApplicable(
            "the host backend's node-aware forms (the kernels' counts vary by size and path; \
             node_aware_all_to_all_eager_and_replayed checks the gpu backend's all-to-all)"
                .into(),
        )
        .into());
    }
    let shape = shape(env)?;
    if shape.nodes < 2 {
        return Err(NotApplicable("needs two nodes or more (SHMEM_TEST_NODES)".into()).into());
    }
    let mut asks = vec![AcrossNodes::Auto];
    if shape.per_node < 2 {
        asks.push(AcrossNodes::NodeAware);
    }
    for across in asks {
        with_settings(env, across, order, || {
            // Node-aware where the settings and the world's shape say so:
            // a test that ran flat here would check the wrong formula.
            let wanted = across == AcrossNodes::NodeAware || shape.per_node >= 2;
            assert_eq!(env.ctx.world().node_aware(), wanted, "{across:?} on {shape:?}");
            each_count(env, shape, order)
        })?;
    }
    Ok(())
}

/// Runs `body` under `across` and `order`, then restores the settings.
fn with_settings(env: &Env, across: AcrossNodes, order: ReduceOrder, body: impl FnOnce() -> TestResult) -> TestResult {
    let before = env.ctx.collectives();
    env.ctx.set_collectives(Collectives { across_nodes: across, reduce_order: order, ..before });
    let result = body();
    env.ctx.set_collectives(before);
    result
}

/// Small, odd (shares of whole 16-byte vectors round, some rails get
/// none), and past the flat all-reduce's one-shot limit (two-shot, uneven
/// blocks) for every element size here; bf16 sums go in f32.
fn each_count(env: &Env, shape: NodeShape, order: ReduceOrder) -> TestResult {
    for count in [1, 5, 4099, 150_001] {
        collectives_count::<f32>(env, shape, order, count)?;
        collectives_count::<bf16>(env, shape, order, count)?;
        collectives_count::<u64>(env, shape, order, count)?;
    }
    Ok(())
}

/// Every collective (broadcasts from the first and the last PE) with
/// `count` elements (see `host_flat_traffic`) of random values: the
/// results are checked bit for bit, and this PE's traffic must be the
/// formula of the form the world takes now (nothing on one node); the
/// node-aware forms' must also keep within their bounds.
fn collectives_count<T: TestElem>(env: &Env, shape: NodeShape, order: ReduceOrder, count: usize) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let world = env.ctx.world();
    let node_aware = world.node_aware();
    let seed = env.fresh_seed();
    let value = |pe: usize, i: usize| {
        T::random(crate::util::mix(seed ^ crate::util::mix((pe as u64) << 40 ^ i as u64)), ReduceOp::Sum)
    };
    let inputs = |pe: usize, len: usize| (0..len).map(|i| value(pe, i)).collect::<Vec<T>>();
    // The flat forms and PeOrder sum in PE order; NodeGrouped node by node.
    let sum_of = |i: usize| {
        let xs: Vec<T> = (0..n).map(|pe| value(pe, i)).collect();
        match (node_aware, order) {
            (true, ReduceOrder::NodeGrouped) => reduce_grouped(ReduceOp::Sum, &xs, shape.per_node),
            _ => reduce(ReduceOp::Sum, xs.into_iter()),
        }
    };
    let traffic = |op: Collective, formula_count: usize| match node_aware {
        true => host_node_traffic(op, shape, me, formula_count, T::DTYPE, order),
        false => host_flat_traffic(op, shape, me, formula_count, size_of::<T>()),
    };
    let src = env.ctx.alloc::<T>(n * count)?;
    let dst = env.ctx.alloc::<T>(n * count)?;
    let poison = vec![crate::util::poison::<T>(); n * count];
    for op in Collective::all(n - 1).into_iter().chain([Collective::Broadcast { root: 0 }]) {
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
                let t = measure(env, || world.all_reduce(dst.slice(..count), src.slice(..count), ReduceOp::Sum, s))?;
                (t, (0..count).map(sum_of).collect())
            }
            Collective::ReduceScatter => {
                let t = measure(env, || world.reduce_scatter(dst.slice(..count), &src, ReduceOp::Sum, s))?;
                (t, (me * count..(me + 1) * count).map(sum_of).collect())
            }
            Collective::AllToAll => {
                let t = measure(env, || world.all_to_all(&dst, &src, s))?;
                let want = (0..n).flat_map(|pe| inputs(pe, n * count)[me * count..(me + 1) * count].to_vec()).collect();
                (t, want)
            }
        };
        let what = format!(
            "{} of {count} {:?} on {shape:?}, {order:?}, node-aware {node_aware}, PE {me}",
            op.name(),
            T::DTYPE
        );
        crate::util::assert_bits_eq(&dst.slice(..want.len()).copy_to_host(s)?, &want, &what);
        let formula_count = match op {
            Collective::ReduceScatter | Collective::AllToAll => n * count,
            _ => count,
        };
        assert_eq!(got, traffic(op, formula_count), "{what}: traffic");
        if shape.nodes == 1 {
            assert_eq!(got, NetTraffic::default(), "{what}: one node");
        }
        if node_aware {
            assert_within_bounds(op, shape, formula_count, T::DTYPE, order, got, &what);
        }
    }
    // In place: the same traffic.
    src.copy_from_host(&inputs(me, n * count), s)?;
    world.barrier(s)?;
    let got = measure(env, || world.all_reduce(src.slice(..count), src.slice(..count), ReduceOp::Sum, s))?;
    let want: Vec<T> = (0..count).map(sum_of).collect();
    crate::util::assert_bits_eq(&src.slice(..count).copy_to_host(s)?, &want, "in-place all_reduce");
    assert_eq!(got, traffic(Collective::AllReduce, count), "in-place all_reduce: traffic");
    src.copy_from_host(&inputs(me, n * count), s)?;
    world.barrier(s)?;
    let mine = src.slice(me * count..(me + 1) * count);
    let got = measure(env, || world.reduce_scatter(mine, &src, ReduceOp::Sum, s))?;
    let want: Vec<T> = (me * count..(me + 1) * count).map(sum_of).collect();
    crate::util::assert_bits_eq(&mine.copy_to_host(s)?, &want, "in-place reduce_scatter");
    assert_eq!(got, traffic(Collective::ReduceScatter, n * count), "in-place reduce_scatter: traffic");
    world.barrier(s)?;
    Ok(())
}

/// The bounds on the bytes one PE sends to other nodes in a node-aware
/// collective (`docs/clusters.md`), for a payload of `S` bytes on `N`
/// nodes of `L` PEs: `S` is the vector of an all-reduce or broadcast, the
/// output of an all-gather, the input of a reduce-scatter or all-to-all;
/// `f` is the size of the accumulator over the element's (2 for bf16).
///
/// - all-reduce: `2·S/L`; in PeOrder with 2-byte floats on 4 nodes or
///   more, `3·S/L` (`(1+f)·S/L`): nodes `0..N−2` send their running sums
///   in f32 and then forward the result along the ring. NodeGrouped also
///   keeps within the tree's `2 (N−1)/N·S/L`.
/// - all-gather: `(N−1)/N·S/L`.
/// - reduce-scatter: `(N−1)/N·S/L` in NodeGrouped; `f·S/L` in PeOrder,
///   which cannot meet the tighter bound and keep the PE-order sum: node
///   `a`'s values must join each block's sum at position `a`, so every
///   block leaves every node but the last, as a running sum (`f·B`).
/// - broadcast: `(N−1)·S/L` on up to three nodes (the root's node sends
///   each share to every other node), `S/L` on more (a ring).
/// - all-to-all: `(N−1)/N·S`, as flat, but in `N−1` transfers.
///
/// Shares of a vector are whole 16-byte vectors, so where the split
/// rounds a share may exceed its exact part by less than one vector: one
/// vector (in the type it travels in) of slack per share sent. The blocks
/// of the others split exactly: no slack.
fn assert_within_bounds(
    op: Collective,
    shape: NodeShape,
    count: usize,
    dtype: DType,
    order: ReduceOrder,
    got: NetTraffic,
    what: &str,
) {
    let (nodes, l, n) = (shape.nodes as u128, shape.per_node as u128, shape.n() as u128);
    let f = (dtype.acc_size() / dtype.size()) as u128;
    let elem = dtype.size() as u128;
    let s = count as u128 * elem * if op == Collective::AllGather { n } else { 1 };
    const V: u128 = 16;
    // Whether `bytes` in `puts` transfers keep within the bound.
    let within = |bytes: u64, puts: u64| {
        let (b, puts) = (bytes as u128, puts as u128);
        match (op, order) {
            (Collective::AllReduce, ReduceOrder::PeOrder) => {
                // Each share sent (a running sum in f·elem bytes, or a result) is < S/L + 16.
                let shares = if f == 2 && nodes >= 4 { 3 } else { 2 };
                b * l <= shares * (s + V * l)
            }
            // Each of the pieces (a share split over the nodes) is < S/(N·L) + 16,
            // and a PE sends at most 2 (N−1) of them.
            (Collective::AllReduce, ReduceOrder::NodeGrouped) => {
                b * l <= 2 * s + V * puts * l && b * nodes * l <= 2 * (nodes - 1) * s + V * puts * nodes * l
            }
            (Collective::AllGather, _) | (Collective::ReduceScatter, ReduceOrder::NodeGrouped) => {
                b * nodes * l <= (nodes - 1) * s
            }
            (Collective::ReduceScatter, ReduceOrder::PeOrder) => b * l <= f * s,
            (Collective::Broadcast { .. }, _) => {
                let shares = if nodes <= 3 { nodes - 1 } else { 1 };
                b * l <= shares * (s + V * l)
            }
            (Collective::AllToAll, _) => b * nodes <= (nodes - 1) * s && puts < nodes,
        }
    };
    assert!(within(got.bytes(), got.puts + got.gets), "{what}: {got:?} over the bound");
    // The bound has teeth: with two PEs a node or more the flat all-gather
    // and reduce-scatter, which send each block to every PE of the other
    // nodes, break `(N−1)/N·S/L`.
    let tree_bound =
        matches!((op, order), (Collective::AllGather, _) | (Collective::ReduceScatter, ReduceOrder::NodeGrouped));
    if tree_bound && shape.per_node >= 2 && count > 0 {
        let flat = host_flat_traffic(op, shape, 0, count, dtype.size());
        assert!(!within(flat.bytes(), flat.gets), "{what}: the flat form's {flat:?} is within the bound");
    }
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

/// The node-aware all-to-all on the world across nodes
/// ([`AcrossNodes::NodeAware`], so one PE a node takes it too): on the gpu
/// backend its kernel (`shmem_alltoall_nodes`), on the host backend the
/// host form. Every element size (1, 2, 4 and 8 bytes), blocks from one
/// element (a row shorter than a 16-byte vector) up, out of place and in
/// place (through a copy on the gpu backend), every result exact; on the
/// gpu backend also blocks of 4 MiB (rows of many pipe chunks a channel)
/// and the calls replayed from a CUDA graph with fresh inputs. The bytes
/// each PE puts to other nodes are [`host_node_traffic`]'s, `(N−1)/N` of
/// the source: exactly on the host backend and in graph replays; an eager
/// call on the gpu backend also puts its agreement's rows (`core/agree.cuh`),
/// the same bytes at every size. Nothing is read from other nodes.
fn node_aware_all_to_all(env: &Env) -> TestResult {
    let shape = shape(env)?;
    if shape.nodes < 2 {
        return Err(NotApplicable("needs two nodes or more (SHMEM_TEST_NODES)".into()).into());
    }
    let gpu = env.s.cuda_stream();
    with_settings(env, AcrossNodes::NodeAware, ReduceOrder::PeOrder, || {
        if !env.ctx.world().node_aware() {
            return Err(NotApplicable(
                "the world does not take the node-aware forms here (forced RMA, a node's PEs without NVLink \
                 addresses, or shmem's kernels not running the collectives)"
                    .into(),
            )
            .into());
        }
        // The host backend puts no agreement rows.
        let mut agreement = if gpu.is_some() { None } else { Some(0) };
        for count in [1, 5, 4099, 65_541] {
            a2a_eager::<u8>(env, shape, count, &mut agreement)?;
            a2a_eager::<bf16>(env, shape, count, &mut agreement)?;
            a2a_eager::<f32>(env, shape, count, &mut agreement)?;
            a2a_eager::<u64>(env, shape, count, &mut agreement)?;
        }
        match gpu {
            Some(stream) => {
                a2a_eager::<f32>(env, shape, (1 << 20) + 3, &mut agreement)?;
                a2a_replay(env, stream, shape)
            }
            None => {
                if env.me() == 0 {
                    eprintln!("nodes::node_aware_all_to_all_eager_and_replayed: graph replays skipped: they need the gpu backend");
                }
                Ok(())
            }
        }
    })
}

/// Checks an eager call's bytes put: the formula's, plus the agreement's
/// rows, which must be the same in every call (`agreement`: the first
/// call's, or none on the host backend); nothing read.
fn eager_bytes(got: NetTraffic, want: NetTraffic, agreement: &mut Option<u64>, what: &str) {
    assert_eq!(got.bytes_got, 0, "{what}: bytes read from other nodes ({got:?})");
    assert!(got.bytes_put >= want.bytes_put, "{what}: {got:?} puts less than {want:?}");
    let rows = got.bytes_put - want.bytes_put;
    assert_eq!(*agreement.get_or_insert(rows), rows, "{what}: {got:?} against {want:?}");
}

/// One all-to-all of `count` elements a block, out of place then in
/// place, eager.
fn a2a_eager<T: TestElem>(env: &Env, shape: NodeShape, count: usize, agreement: &mut Option<u64>) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let world = env.ctx.world();
    let seed = env.fresh_seed();
    let src = env.ctx.alloc::<T>(n * count)?;
    let dst = env.ctx.alloc::<T>(n * count)?;
    let mine: Vec<T> = (0..n * count).map(|i| payload(seed, me, i)).collect();
    // Block p of the output is block `me` of PE p's input.
    let want: Vec<T> = (0..n * count).map(|i| payload(seed, i / count, me * count + i % count)).collect();
    let formula = host_node_traffic(Collective::AllToAll, shape, me, n * count, T::DTYPE, ReduceOrder::PeOrder);
    let what = format!("all_to_all of {count} {:?} a block on {shape:?}, PE {me}", T::DTYPE);
    src.copy_from_host(&mine, s)?;
    dst.fill(poison(), s)?;
    world.barrier(s)?;
    let got = measure(env, || world.all_to_all(&dst, &src, s))?;
    assert_bits_eq(&dst.copy_to_host(s)?, &want, &what);
    assert_bits_eq(&src.copy_to_host(s)?, &mine, &format!("{what}: source afterwards"));
    eager_bytes(got, formula, agreement, &what);
    world.barrier(s)?;
    let got = measure(env, || world.all_to_all(&src, &src, s))?;
    let what = format!("{what}, in place");
    assert_bits_eq(&src.copy_to_host(s)?, &want, &what);
    eager_bytes(got, formula, agreement, &what);
    world.barrier(s)?;
    Ok(())
}

/// One all-to-all captured in a graph: its buffers and element count a
/// block.
struct Captured<T: TestElem> {
    count: usize,
    salt: u64,
    src: SymmetricBuffer<T>,
    dst: SymmetricBuffer<T>,
}

impl<T: TestElem> Captured<T> {
    fn new(env: &Env, count: usize, salt: u64) -> shmem::Result<Captured<T>> {
        let n = env.n();
        Ok(Captured { count, salt, src: env.ctx.alloc(n * count)?, dst: env.ctx.alloc(n * count)? })
    }

    fn call(&self, env: &Env) -> shmem::Result<()> {
        env.ctx.world().all_to_all(&self.dst, &self.src, &env.s)
    }

    /// Fresh input from `seed`; the output poisoned.
    fn write(&self, env: &Env, seed: u64) -> TestResult {
        let (me, n) = (env.me(), env.n());
        let mine: Vec<T> = (0..n * self.count).map(|i| payload(seed ^ self.salt, me, i)).collect();
        self.src.copy_from_host(&mine, &env.s)?;
        self.dst.fill(poison(), &env.s)?;
        Ok(())
    }

    fn check(&self, env: &Env, seed: u64, what: &str) -> TestResult {
        let (me, n, c) = (env.me(), env.n(), self.count);
        let want: Vec<T> = (0..n * c).map(|i| payload(seed ^ self.salt, i / c, me * c + i % c)).collect();
        assert_bits_eq(&self.dst.copy_to_host(&env.s)?, &want, &format!("{what}: {:?} × {c} a block", T::DTYPE));
        Ok(())
    }

    fn formula(&self, env: &Env, shape: NodeShape) -> NetTraffic {
        let total = env.n() * self.count;
        host_node_traffic(Collective::AllToAll, shape, env.me(), total, T::DTYPE, ReduceOrder::PeOrder)
    }
}

/// All-to-alls of every element size captured once into a CUDA graph,
/// then replayed with fresh inputs (`SHMEM_TEST_REPLAYS`, by default 100):
/// every result exact, and each replay's bytes put exactly the formula's
/// (a replay agrees nowhere).
fn a2a_replay(env: &Env, stream: &std::sync::Arc<cudarc::driver::CudaStream>, shape: NodeShape) -> TestResult {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (me, s, ctx) = (env.me(), &env.s, &env.ctx);
    let bytes = Captured::<u8>::new(env, 4099, 1)?;
    let halves = Captured::<bf16>::new(env, 33, 2)?;
    let floats = Captured::<f32>::new(env, 65_541, 3)?;
    let words = Captured::<u64>::new(env, 7, 4)?;
    ctx.barrier_all(s)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured =
        bytes.call(env).and_then(|()| halves.call(env)).and_then(|()| floats.call(env)).and_then(|()| words.call(env));
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
    captured?;
    let graph = graph.ok_or("capture gave no graph")?;
    let f =
        [bytes.formula(env, shape), halves.formula(env, shape), floats.formula(env, shape), words.formula(env, shape)];
    let want = NetTraffic { bytes_put: f.iter().map(|t| t.bytes_put).sum(), ..NetTraffic::default() };
    let replays: usize = match std::env::var("SHMEM_TEST_REPLAYS") {
        Ok(v) => v.parse().map_err(|_| format!("SHMEM_TEST_REPLAYS={v:?}: not a count"))?,
        Err(_) => 100,
    };
    for replay in 0..replays {
        let seed = env.fresh_seed();
        bytes.write(env, seed)?;
        halves.write(env, seed)?;
        floats.write(env, seed)?;
        words.write(env, seed)?;
        // Every PE's inputs are written before any replay reads them.
        ctx.barrier_all(s)?;
        let before = ctx.net_traffic(s)?;
        graph.launch()?;
        let got = ctx.net_traffic(s)?.since(&before);
        let what = format!("graph of all_to_alls on {shape:?}, replay {replay}, PE {me}");
        bytes.check(env, seed, &what)?;
        halves.check(env, seed, &what)?;
        floats.check(env, seed, &what)?;
        words.check(env, seed, &what)?;
        assert_eq!((got.bytes_put, got.bytes_got), (want.bytes_put, 0), "{what}: traffic {got:?}");
        // No PE writes the next replay's inputs while a peer still reads.
        ctx.barrier_all(s)?;
    }
    drop(graph);
    ctx.barrier_all(s)?;
    Ok(())
}

/// The gpu backend's node-grouped all-reduce and reduce-scatter
/// (`shmem_allreduce_grouped`, `shmem_reducescatter_grouped`) on the world
/// across nodes: sums of f32, bf16 and u64, eager and replayed from a CUDA
/// graph, results bit for bit the node-grouped fold, and the bytes each PE
/// puts to other nodes [`host_node_traffic`]'s (`2 (N−1)/N·S/L` and
/// `(N−1)/N·S/L`): exactly in replays, plus the agreement's rows in eager
/// calls. The host backend's forms are checked by
/// `node_grouped_collectives_count_their_formula`.
fn gpu_node_grouped_reductions(env: &Env) -> TestResult {
    let stream = needs_gpu(env)?;
    let shape = shape(env)?;
    if shape.nodes < 2 {
        return Err(NotApplicable("needs two nodes or more (SHMEM_TEST_NODES)".into()).into());
    }
    with_settings(env, AcrossNodes::NodeAware, ReduceOrder::NodeGrouped, || {
        if !env.ctx.world().node_aware() {
            return Err(NotApplicable("the world does not take the node-aware kernels here".into()).into());
        }
        let mut agreement = None;
        for count in [1, 5, 4099, 150_001] {
            grouped_sums::<f32>(env, stream, shape, count, &mut agreement)?;
            grouped_sums::<bf16>(env, stream, shape, count, &mut agreement)?;
            grouped_sums::<u64>(env, stream, shape, count, &mut agreement)?;
        }
        Ok(())
    })
}

/// An all-reduce of `count` elements and a reduce-scatter of `count` a
/// PE, eager, then captured and replayed three times.
fn grouped_sums<T: TestElem>(
    env: &Env,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    shape: NodeShape,
    count: usize,
    agreement: &mut Option<u64>,
) -> TestResult {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (me, n, s, ctx) = (env.me(), env.n(), &env.s, &env.ctx);
    let world = ctx.world();
    let seed = env.fresh_seed();
    let value = |pe: usize, i: usize| {
        T::random(crate::util::mix(seed ^ crate::util::mix((pe as u64) << 40 ^ i as u64)), ReduceOp::Sum)
    };
    let sum_of = |i: usize| {
        let xs: Vec<T> = (0..n).map(|pe| value(pe, i)).collect();
        reduce_grouped(ReduceOp::Sum, &xs, shape.per_node)
    };
    let src = ctx.alloc::<T>(n * count)?;
    let ar = ctx.alloc::<T>(count)?;
    let rs = ctx.alloc::<T>(count)?;
    src.copy_from_host(&(0..n * count).map(|i| value(me, i)).collect::<Vec<_>>(), s)?;
    let ar_want: Vec<T> = (0..count).map(sum_of).collect();
    let rs_want: Vec<T> = (me * count..(me + 1) * count).map(sum_of).collect();
    let grouped = ReduceOrder::NodeGrouped;
    let ar_formula = host_node_traffic(Collective::AllReduce, shape, me, count, T::DTYPE, grouped);
    let rs_formula = host_node_traffic(Collective::ReduceScatter, shape, me, n * count, T::DTYPE, grouped);
    let what = format!("node-grouped sums of {count} {:?} on {shape:?}, PE {me}", T::DTYPE);
    ar.fill(poison(), s)?;
    rs.fill(poison(), s)?;
    world.barrier(s)?;
    let got = measure(env, || world.all_reduce(&ar, src.slice(..count), ReduceOp::Sum, s))?;
    assert_bits_eq(&ar.copy_to_host(s)?, &ar_want, &format!("{what}: all_reduce"));
    eager_bytes(got, ar_formula, agreement, &format!("{what}: all_reduce"));
    let got = measure(env, || world.reduce_scatter(&rs, &src, ReduceOp::Sum, s))?;
    assert_bits_eq(&rs.copy_to_host(s)?, &rs_want, &format!("{what}: reduce_scatter"));
    eager_bytes(got, rs_formula, agreement, &format!("{what}: reduce_scatter"));
    world.barrier(s)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = world
        .all_reduce(&ar, src.slice(..count), ReduceOp::Sum, s)
        .and_then(|()| world.reduce_scatter(&rs, &src, ReduceOp::Sum, s));
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
    captured?;
    let graph = graph.ok_or("capture gave no graph")?;
    for replay in 0..3 {
        ar.fill(poison(), s)?;
        rs.fill(poison(), s)?;
        ctx.barrier_all(s)?;
        let before = ctx.net_traffic(s)?;
        graph.launch()?;
        let got = ctx.net_traffic(s)?.since(&before);
        let what = format!("{what}, replay {replay}");
        assert_bits_eq(&ar.copy_to_host(s)?, &ar_want, &format!("{what}: all_reduce"));
        assert_bits_eq(&rs.copy_to_host(s)?, &rs_want, &format!("{what}: reduce_scatter"));
        let want = ar_formula.bytes_put + rs_formula.bytes_put;
        assert_eq!((got.bytes_put, got.bytes_got), (want, 0), "{what}: traffic {got:?}");
        ctx.barrier_all(s)?;
    }
    drop(graph);
    ctx.barrier_all(s)?;
    Ok(())
}
