//! Network traffic: the bytes each PE moves to and from PEs of other
//! nodes, counted where the data moves, and what the host backend's
//! collectives are expected to move, flat ([`host_flat_traffic`]) and
//! node-aware ([`host_node_traffic`]): the spec the counts are tested
//! against.
//!
//! **What counts.** Payload bytes between this PE and a PE of another
//! node. A put is counted at the PE that sends, a get at the PE that
//! reads (the PE read from runs nothing). Signals are counted by number,
//! not as bytes: an 8-byte signal beside an 8-byte payload would otherwise
//! double it. Atomics are not counted. Transfers between PEs of one node
//! count nothing, also where they take the RMA path
//! ([`crate::Context::set_force_rma`]).
//!
//! **Where.** On the GPU backend, shmem's kernels count their RMA calls
//! to other nodes' PEs on the device (one atomic per block-wide call; the
//! NVLink path counts nothing), and the host counts the RMA calls it
//! issues on a stream (at the call: a call captured into a CUDA graph is
//! counted once, at capture, however often the graph replays, while the
//! kernels' counts add up with every replay). NVSHMEM's own collectives
//! ([`crate::CollImpl::Nvshmem`]) are not counted. On the host backend
//! every copy between PEs of different (emulated) nodes counts.
//!
//! The counters only grow: read them before and after the operations of
//! interest and take the difference ([`NetTraffic::since`]).

use crate::algo::{self, ReduceOrder};
use crate::context::{Context, Stream};
use crate::dtype::DType;
use crate::error::Result;
pub use crate::traffic::NetTraffic;

impl Context {
    /// This PE's traffic with other nodes' PEs since the context started:
    /// cumulative counts, never reset (see [`crate::net`]). On the GPU
    /// backend it first waits for `stream`, so that the kernels issued on
    /// it are counted (kernels still running on other streams may be
    /// counted in part); a CUDA graph's kernels count at every replay.
    ///
    /// All zero in a job of one node.
    pub fn net_traffic(&self, stream: &Stream) -> Result<NetTraffic> {
        self.inner.check_live("context")?;
        let host = self.inner.net.load();
        let Some(g) = self.inner.backend.gpu() else { return Ok(host) };
        stream.synchronize()?;
        Ok(g.device_net()?.plus(&host))
    }
}

/// A team of `nodes × per_node` members in node-contiguous order: member
/// `r` is on node `r / per_node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeShape {
    /// Nodes the team spans.
    pub nodes: usize,
    /// Members on each node.
    pub per_node: usize,
}

impl NodeShape {
    /// Members of the team.
    pub fn n(&self) -> usize {
        self.nodes * self.per_node
    }

    /// Whether members `a` and `b` are on different nodes.
    pub fn apart(&self, a: usize, b: usize) -> bool {
        a / self.per_node != b / self.per_node
    }
}

/// A team collective, as [`host_flat_traffic`] and [`host_node_traffic`]
/// take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    /// [`crate::Team::broadcast`] from member `root`.
    Broadcast { root: usize },
    /// [`crate::Team::all_gather`].
    AllGather,
    /// [`crate::Team::all_reduce`].
    AllReduce,
    /// [`crate::Team::reduce_scatter`].
    ReduceScatter,
    /// [`crate::Team::all_to_all`].
    AllToAll,
}

impl Collective {
    /// The collectives, with a broadcast from `root`.
    pub fn all(root: usize) -> [Collective; 5] {
        use Collective::*;
        [Broadcast { root }, AllGather, AllReduce, ReduceScatter, AllToAll]
    }

    /// The name of the `Team` method.
    pub fn name(&self) -> &'static str {
        match self {
            Collective::Broadcast { .. } => "broadcast",
            Collective::AllGather => "all_gather",
            Collective::AllReduce => "all_reduce",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllToAll => "all_to_all",
        }
    }
}

/// The traffic with other nodes that member `r` of a team of `shape` has
/// in one call of `op` on the host backend, whose collectives are flat:
/// every PE reads what it needs from each peer (all gets, no puts).
///
/// `count` is the call's `src.len()` in elements of `elem` bytes: the
/// vector of a broadcast or all-reduce, one PE's block of an all-gather,
/// the whole input (`n_pes` blocks) of a reduce-scatter or all-to-all.
/// Transfers of no bytes are not counted.
pub fn host_flat_traffic(op: Collective, shape: NodeShape, r: usize, count: usize, elem: usize) -> NetTraffic {
    let n = shape.n();
    let remote: Vec<usize> = (0..n).filter(|&p| shape.apart(p, r)).collect();
    // Each remote peer read once, `bytes(p)` from peer p.
    let reads = |bytes: &dyn Fn(usize) -> usize| {
        remote.iter().map(|&p| bytes(p) * elem).filter(|&b| b > 0).fold(NetTraffic::default(), |t, b| NetTraffic {
            bytes_got: t.bytes_got + b as u64,
            gets: t.gets + 1,
            ..t
        })
    };
    match op {
        Collective::Broadcast { root } => reads(&|p| if p == root { count } else { 0 }),
        Collective::AllGather => reads(&|_| count),
        Collective::ReduceScatter => reads(&|_| count / n),
        Collective::AllToAll => reads(&|_| count / n),
        Collective::AllReduce if algo::host_all_reduce_one_shot(count * elem, count, n) => reads(&|_| count),
        Collective::AllReduce => {
            // Two-shot: this PE's block of every peer's source, then every
            // peer's reduced block of its destination.
            let block = |i: usize| (i + 1) * count / n - i * count / n;
            reads(&|_| block(r)).plus(&reads(&block))
        }
    }
}

/// The traffic with other nodes that member `r` of a team of `shape` has
/// in one call of `op` on the host backend's node-aware forms
/// ([`crate::AcrossNodes`], `host/nodes.rs`), reductions in `order`: every
/// byte that crosses between nodes is pushed by its holder to the PE of
/// its rail on the other node (all puts, no gets). With `B` the bytes of
/// one member's block, `share` the bytes of this PE's rail share of a
/// vector (whole 16-byte vectors, as the forms split it), `f` the size of
/// `dtype`'s accumulator over its own, `N` nodes and node `a`:
///
/// | op | puts of this PE |
/// |---|---|
/// | all-gather | `N−1` × `B` |
/// | all-to-all | `N−1` × `L·B` (a node's blocks in one transfer) |
/// | broadcast | the share spread from the root's node (see below) |
/// | all-reduce, PeOrder | `f·share` to node `a+1` (`a < N−1`), then the share spread from node `N−1` |
/// | all-reduce, NodeGrouped | part `b` of the share (split again over the nodes) to node `b`, for `b ≠ a`; then `N−1` × part `a` |
/// | reduce-scatter, PeOrder | `f·N·B` to node `a+1` (`a < N−1`); `N−1` × `B` on node `N−1` |
/// | reduce-scatter, NodeGrouped | `N−1` × `B` |
///
/// A share spreads along its rail directly from its node to the `N−1`
/// others on up to three nodes, else along the ring from its node, each
/// node but the one before it forwarding once.
///
/// `count` is the call's `src.len()`, as for [`host_flat_traffic`].
/// Transfers of no bytes are not counted, and on one node nothing crosses.
pub fn host_node_traffic(
    op: Collective,
    shape: NodeShape,
    r: usize,
    count: usize,
    dtype: DType,
    order: ReduceOrder,
) -> NetTraffic {
    let (nodes, per_node) = (shape.nodes, shape.per_node);
    if nodes < 2 {
        return NetTraffic::default();
    }
    let (elem, acc) = (dtype.size(), dtype.acc_size());
    let (node, rail, last) = (r / per_node, r % per_node, nodes - 1);
    // Elements of this PE's rail share of the vector, and of each member's block.
    let share = algo::rail_share(count, elem, rail, per_node).len();
    let block = count / shape.n();
    // The puts with which this PE spreads its share from node `from`.
    let spread = |from: usize| match (nodes <= 3, node == from) {
        (true, true) => last,
        (true, false) => 0,
        // The ring `from, from+1, …`: every node but the one before `from` sends.
        (false, _) => usize::from(node != (from + last) % nodes),
    };
    // (bytes, how many puts of them)
    let puts: Vec<(usize, usize)> = match (op, order) {
        (Collective::Broadcast { root }, _) => vec![(share * elem, spread(root / per_node))],
        (Collective::AllGather, _) => vec![(count * elem, last)],
        (Collective::AllToAll, _) => vec![(per_node * block * elem, last)],
        (Collective::AllReduce, ReduceOrder::PeOrder) => {
            vec![(share * acc, usize::from(node < last)), (share * elem, spread(last))]
        }
        (Collective::AllReduce, ReduceOrder::NodeGrouped) => {
            let part = |b: usize| algo::rail_share(share, elem, b, nodes).len() * elem;
            (0..nodes).filter(|&b| b != node).map(|b| (part(b), 1)).chain([(part(node), last)]).collect()
        }
        (Collective::ReduceScatter, ReduceOrder::PeOrder) if node < last => vec![(nodes * block * acc, 1)],
        (Collective::ReduceScatter, _) => vec![(block * elem, last)],
    };
    puts.into_iter().filter(|&(bytes, _)| bytes > 0).fold(NetTraffic::default(), |t, (bytes, times)| NetTraffic {
        bytes_put: t.bytes_put + (bytes * times) as u64,
        puts: t.puts + times as u64,
        ..t
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_BY_TWO: NodeShape = NodeShape { nodes: 2, per_node: 2 };

    #[test]
    fn one_node_moves_nothing() {
        let one = NodeShape { nodes: 1, per_node: 4 };
        for op in Collective::all(3) {
            for count in [0, 1, 4, 1000, 1 << 20] {
                for r in 0..4 {
                    assert_eq!(host_flat_traffic(op, one, r, count, 4), NetTraffic::default(), "{op:?} {count}");
                }
            }
        }
    }

    #[test]
    fn one_shot_all_reduce_reads_the_vector_from_each_remote_peer() {
        // 2 × 3: three peers on the other node, 100 f32 from each.
        let shape = NodeShape { nodes: 2, per_node: 3 };
        let t = host_flat_traffic(Collective::AllReduce, shape, 4, 100, 4);
        assert_eq!(t, NetTraffic { bytes_got: 1200, gets: 3, ..Default::default() });
    }

    #[test]
    fn two_shot_all_reduce_reads_a_block_and_then_the_blocks() {
        // 2^20 f32 on 2 × 2 is past the one-shot limit: blocks of 2^18.
        let count = 1 << 20;
        assert!(!algo::host_all_reduce_one_shot(count * 4, count, 4));
        let t = host_flat_traffic(Collective::AllReduce, TWO_BY_TWO, 0, count, 4);
        // Block 0 of members 2 and 3, then their blocks 2 and 3.
        assert_eq!(t, NetTraffic { bytes_got: 4 * (1 << 20), gets: 4, ..Default::default() });
        // Uneven blocks: a count just past the limit, not a multiple of 4.
        let count = (algo::ONE_SHOT_MAX_BYTES / 2) + 2;
        let b = |i: usize| ((i + 1) * count / 4 - i * count / 4) as u64;
        let t = host_flat_traffic(Collective::AllReduce, TWO_BY_TWO, 1, count, 2);
        assert_eq!(t.bytes_got, 2 * (2 * b(1) + b(2) + b(3)));
    }

    #[test]
    fn movement_reads_each_remote_block_once() {
        let shape = NodeShape { nodes: 3, per_node: 2 };
        // All-gather: a block of 10 from each of 4 remote peers.
        let ag = host_flat_traffic(Collective::AllGather, shape, 5, 10, 8);
        assert_eq!((ag.bytes_got, ag.gets), (4 * 80, 4));
        // Reduce-scatter and all-to-all of 60 elements: a block of 10 each.
        for op in [Collective::ReduceScatter, Collective::AllToAll] {
            let t = host_flat_traffic(op, shape, 0, 60, 8);
            assert_eq!((t.bytes_got, t.gets, t.bytes_put), (4 * 80, 4, 0), "{op:?}");
        }
    }

    #[test]
    fn broadcast_reads_only_a_remote_root() {
        let root = 1;
        let on_roots_node = host_flat_traffic(Collective::Broadcast { root }, TWO_BY_TWO, 0, 7, 4);
        assert_eq!(on_roots_node, NetTraffic::default());
        let root_itself = host_flat_traffic(Collective::Broadcast { root }, TWO_BY_TWO, root, 7, 4);
        assert_eq!(root_itself, NetTraffic::default());
        let away = host_flat_traffic(Collective::Broadcast { root }, TWO_BY_TWO, 3, 7, 4);
        assert_eq!(away, NetTraffic { bytes_got: 28, gets: 1, ..Default::default() });
    }

    fn puts(bytes: u64, puts: u64) -> NetTraffic {
        NetTraffic { bytes_put: bytes, puts, ..Default::default() }
    }

    /// Every member's traffic in `op`, node-aware.
    fn node_traffic(
        op: Collective,
        shape: NodeShape,
        count: usize,
        dtype: DType,
        order: ReduceOrder,
    ) -> Vec<NetTraffic> {
        (0..shape.n()).map(|r| host_node_traffic(op, shape, r, count, dtype, order)).collect()
    }

    #[test]
    fn node_aware_forms_move_nothing_on_one_node() {
        let one = NodeShape { nodes: 1, per_node: 4 };
        for order in [ReduceOrder::PeOrder, ReduceOrder::NodeGrouped] {
            for op in Collective::all(2) {
                for t in node_traffic(op, one, 4096, DType::BF16, order) {
                    assert_eq!(t, NetTraffic::default(), "{op:?} {order:?}");
                }
            }
        }
    }

    #[test]
    fn pe_order_all_reduce_chains_in_the_accumulator_then_spreads() {
        // 4099 f32 on 2 × 2: rail shares of 2048 and 2051 elements.
        let t = node_traffic(Collective::AllReduce, TWO_BY_TWO, 4099, DType::F32, ReduceOrder::PeOrder);
        assert_eq!(t, [puts(8192, 1), puts(8204, 1), puts(8192, 1), puts(8204, 1)]);
        // bf16: node 0's running sums go in f32, node 1's results in bf16.
        let t = node_traffic(Collective::AllReduce, TWO_BY_TWO, 4099, DType::BF16, ReduceOrder::PeOrder);
        assert_eq!(t, [puts(8192, 1), puts(8204, 1), puts(4096, 1), puts(4102, 1)]);
        // 3 × 2: node 2 sends its results to both other nodes directly.
        let shape = NodeShape { nodes: 3, per_node: 2 };
        let t = node_traffic(Collective::AllReduce, shape, 4096, DType::BF16, ReduceOrder::PeOrder);
        assert_eq!(t[0], puts(8192, 1));
        assert_eq!(t[2], puts(8192, 1));
        assert_eq!(t[4], puts(2 * 4096, 2));
        // 4 × 2: along the ring 3 → 0 → 1 → 2; nodes 0 and 1 chain and forward.
        let shape = NodeShape { nodes: 4, per_node: 2 };
        let t = node_traffic(Collective::AllReduce, shape, 4096, DType::BF16, ReduceOrder::PeOrder);
        let share = 2048 * 2;
        assert_eq!(
            [t[0], t[2], t[4], t[6]],
            [puts(3 * share, 2), puts(3 * share, 2), puts(2 * share, 1), puts(share, 1)]
        );
    }

    #[test]
    fn node_grouped_all_reduce_splits_each_share_over_the_nodes() {
        // 4096 f32 on 2 × 2: shares of 2048, halves of 1024 (4096 bytes).
        let t = node_traffic(Collective::AllReduce, TWO_BY_TWO, 4096, DType::F32, ReduceOrder::NodeGrouped);
        assert_eq!(t, [puts(8192, 2); 4]);
        // 3 × 2, 100 f32 (25 vectors): shares of 12 and 13 vectors; rail 1's
        // 13 in parts of 4, 4 and 5 vectors. Node 2's PE of rail 1 sends
        // parts 0 and 1, then its part 2 to both other nodes.
        let shape = NodeShape { nodes: 3, per_node: 2 };
        let t = host_node_traffic(Collective::AllReduce, shape, 5, 100, DType::F32, ReduceOrder::NodeGrouped);
        assert_eq!(t, puts(16 * (4 + 4 + 2 * 5), 4));
        // One element: only the last rail and the last node's part hold it.
        let t = node_traffic(Collective::AllReduce, shape, 1, DType::F32, ReduceOrder::NodeGrouped);
        assert_eq!(t, [puts(0, 0), puts(4, 1), puts(0, 0), puts(4, 1), puts(0, 0), puts(8, 2)]);
    }

    #[test]
    fn reduce_scatter_chains_a_rail_s_blocks_or_sends_node_partials() {
        // 2 × 3, blocks of 100 bf16 (600 in all).
        let shape = NodeShape { nodes: 2, per_node: 3 };
        let chain = node_traffic(Collective::ReduceScatter, shape, 600, DType::BF16, ReduceOrder::PeOrder);
        // Node 0: both nodes' blocks of its rail, in f32; node 1: node 0's block, rounded.
        assert_eq!(chain, [[puts(800, 1); 3], [puts(200, 1); 3]].concat());
        let grouped = node_traffic(Collective::ReduceScatter, shape, 600, DType::BF16, ReduceOrder::NodeGrouped);
        assert_eq!(grouped, [puts(200, 1); 6]);
        // 4 × 2, u64: the chain's last node sends three blocks.
        let shape = NodeShape { nodes: 4, per_node: 2 };
        let chain = node_traffic(Collective::ReduceScatter, shape, 80, DType::U64, ReduceOrder::PeOrder);
        assert_eq!(chain[0], puts(4 * 10 * 8, 1));
        assert_eq!(chain[7], puts(3 * 10 * 8, 3));
    }

    #[test]
    fn movement_crosses_each_rail_once() {
        let shape = NodeShape { nodes: 3, per_node: 2 };
        for order in [ReduceOrder::PeOrder, ReduceOrder::NodeGrouped] {
            // All-gather: a block of 10 u64 to each of 2 other nodes.
            let ag = node_traffic(Collective::AllGather, shape, 10, DType::U64, order);
            assert_eq!(ag, [puts(2 * 80, 2); 6]);
            // All-to-all of 60 u64: a node's 2 blocks of 10 in one put.
            let a2a = node_traffic(Collective::AllToAll, shape, 60, DType::U64, order);
            assert_eq!(a2a, [puts(2 * 160, 2); 6]);
        }
        // Broadcast from member 3 (node 1) of 64 f32 on 3 × 2: node 1's PEs
        // send their shares of 32 to both other nodes.
        let t = node_traffic(Collective::Broadcast { root: 3 }, shape, 64, DType::F32, ReduceOrder::PeOrder);
        assert_eq!(t, [puts(0, 0), puts(0, 0), puts(256, 2), puts(256, 2), puts(0, 0), puts(0, 0)]);
        // On 4 × 2 from node 1 along the ring 1 → 2 → 3 → 0: node 0 sends nothing.
        let shape = NodeShape { nodes: 4, per_node: 2 };
        let t = node_traffic(Collective::Broadcast { root: 2 }, shape, 64, DType::F32, ReduceOrder::PeOrder);
        assert_eq!(t, [&[puts(0, 0); 2][..], &[puts(128, 1); 6]].concat());
    }

    /// Summed over the team, each form sends every byte to each other node
    /// once (the reductions: once on the way in, once on the way back).
    #[test]
    fn node_aware_team_totals_cross_each_byte_once_per_node() {
        for (nodes, per_node) in [(2, 1), (2, 2), (2, 3), (3, 2), (4, 1), (4, 2), (5, 3), (8, 4)] {
            let shape = NodeShape { nodes, per_node };
            let n = shape.n();
            for dtype in [DType::F32, DType::BF16, DType::U64] {
                let (elem, f) = (dtype.size() as u64, (dtype.acc_size() / dtype.size()) as u64);
                for count in [0, 1, 7, 100, 4099, 150_001] {
                    let total = |op, count, order| {
                        node_traffic(op, shape, count, dtype, order).iter().map(|t| t.bytes()).sum::<u64>()
                    };
                    let what = format!("{nodes} × {per_node}, {count} {dtype}");
                    let (s, cross) = (count as u64 * elem, nodes as u64 - 1);
                    for root in [0, n - 1] {
                        let broadcast = total(Collective::Broadcast { root }, count, ReduceOrder::PeOrder);
                        assert_eq!(broadcast, cross * s, "broadcast from {root}, {what}");
                    }
                    assert_eq!(
                        total(Collective::AllGather, count, ReduceOrder::PeOrder),
                        n as u64 * cross * s,
                        "{what}"
                    );
                    assert_eq!(
                        total(Collective::AllReduce, count, ReduceOrder::PeOrder),
                        cross * s * (f + 1),
                        "{what}"
                    );
                    assert_eq!(total(Collective::AllReduce, count, ReduceOrder::NodeGrouped), 2 * cross * s, "{what}");
                    // The all-to-all and reduce-scatter of n blocks of `count`.
                    let (blocks, block) = (n * count, s * per_node as u64);
                    let a2a = total(Collective::AllToAll, blocks, ReduceOrder::PeOrder);
                    assert_eq!(a2a, n as u64 * cross * block, "{what}");
                    let grouped = total(Collective::ReduceScatter, blocks, ReduceOrder::NodeGrouped);
                    assert_eq!(grouped, n as u64 * cross * s, "{what}");
                    // The chain: each node but the last sends its rail's N
                    // running blocks in the accumulator; the last, N−1 blocks.
                    let chain = total(Collective::ReduceScatter, blocks, ReduceOrder::PeOrder);
                    assert_eq!(chain, per_node as u64 * cross * s * (f * nodes as u64 + 1), "{what}");
                }
            }
        }
    }

    #[test]
    fn since_takes_the_difference_across_wrapping() {
        let a = NetTraffic { bytes_put: u64::MAX, bytes_got: 5, puts: 1, gets: 2, signals: 3 };
        let b = NetTraffic { bytes_put: 9, bytes_got: 7, puts: 2, gets: 2, signals: 4 };
        let d = b.since(&a);
        assert_eq!(d, NetTraffic { bytes_put: 10, bytes_got: 2, puts: 1, gets: 0, signals: 1 });
        assert_eq!(a.plus(&d), b);
        assert_eq!(d.bytes(), 12);
    }
}
