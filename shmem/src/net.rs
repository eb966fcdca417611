//! Network traffic: the bytes each PE moves to and from PEs of other
//! nodes, counted where the data moves, and what the host backend's
//! collectives are expected to move (the spec the counts are tested
//! against).
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

use crate::algo;
use crate::context::{Context, Stream};
use crate::error::Result;
use std::sync::atomic::{AtomicU64, Ordering};

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
        let Some(g) = &self.inner.gpu else { return Ok(host) };
        stream.synchronize()?;
        Ok(g.device_net()?.plus(&host))
    }
}

/// Cumulative counts of one PE's traffic with PEs of other nodes, from
/// [`crate::Context::net_traffic`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetTraffic {
    /// Payload bytes this PE put to other nodes' PEs.
    pub bytes_put: u64,
    /// Payload bytes this PE read from other nodes' PEs.
    pub bytes_got: u64,
    /// Puts that carried them (a block-wide put of a kernel is one).
    pub puts: u64,
    /// Gets that carried them.
    pub gets: u64,
    /// Signals this PE sent to other nodes' PEs.
    pub signals: u64,
}

impl NetTraffic {
    /// Payload bytes in either direction.
    pub fn bytes(&self) -> u64 {
        self.bytes_put + self.bytes_got
    }

    /// The traffic since `earlier`, a reading of the same PE's counters.
    pub fn since(&self, earlier: &NetTraffic) -> NetTraffic {
        NetTraffic {
            bytes_put: self.bytes_put.wrapping_sub(earlier.bytes_put),
            bytes_got: self.bytes_got.wrapping_sub(earlier.bytes_got),
            puts: self.puts.wrapping_sub(earlier.puts),
            gets: self.gets.wrapping_sub(earlier.gets),
            signals: self.signals.wrapping_sub(earlier.signals),
        }
    }

    /// Both counts added (the device's and the host's, on the GPU backend).
    pub(crate) fn plus(&self, o: &NetTraffic) -> NetTraffic {
        NetTraffic {
            bytes_put: self.bytes_put.wrapping_add(o.bytes_put),
            bytes_got: self.bytes_got.wrapping_add(o.bytes_got),
            puts: self.puts.wrapping_add(o.puts),
            gets: self.gets.wrapping_add(o.gets),
            signals: self.signals.wrapping_add(o.signals),
        }
    }

    /// From the device's `NetCounters` words (`abi.cuh`, in its order).
    pub(crate) fn from_words(w: [u64; 5]) -> NetTraffic {
        NetTraffic { bytes_put: w[0], bytes_got: w[1], puts: w[2], gets: w[3], signals: w[4] }
    }
}

/// Which way a counted transfer went, seen from this PE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NetDir {
    /// This PE wrote to the peer.
    Put,
    /// This PE read from the peer.
    Got,
}

/// The host's counters of one PE (see the module docs).
#[derive(Default)]
pub(crate) struct NetCounters {
    bytes_put: AtomicU64,
    bytes_got: AtomicU64,
    puts: AtomicU64,
    gets: AtomicU64,
    signals: AtomicU64,
}

impl NetCounters {
    /// One transfer of `bytes` (relaxed: the counts are read after the
    /// operations that made them returned, and order nothing).
    pub(crate) fn add(&self, bytes: usize, dir: NetDir) {
        let (b, c) = match dir {
            NetDir::Put => (&self.bytes_put, &self.puts),
            NetDir::Got => (&self.bytes_got, &self.gets),
        };
        b.fetch_add(bytes as u64, Ordering::Relaxed);
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_signal(&self) {
        self.signals.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn load(&self) -> NetTraffic {
        NetTraffic {
            bytes_put: self.bytes_put.load(Ordering::Relaxed),
            bytes_got: self.bytes_got.load(Ordering::Relaxed),
            puts: self.puts.load(Ordering::Relaxed),
            gets: self.gets.load(Ordering::Relaxed),
            signals: self.signals.load(Ordering::Relaxed),
        }
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

/// A team collective, as [`host_flat_traffic`] takes it.
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

    #[test]
    fn since_takes_the_difference_across_wrapping() {
        let a = NetTraffic { bytes_put: u64::MAX, bytes_got: 5, puts: 1, gets: 2, signals: 3 };
        let b = NetTraffic { bytes_put: 9, bytes_got: 7, puts: 2, gets: 2, signals: 4 };
        let d = b.since(&a);
        assert_eq!(d, NetTraffic { bytes_put: 10, bytes_got: 2, puts: 1, gets: 0, signals: 1 });
        assert_eq!(a.plus(&d), b);
        assert_eq!(d.bytes(), 12);
    }

    #[test]
    fn counters_add_by_direction() {
        let c = NetCounters::default();
        c.add(100, NetDir::Put);
        c.add(30, NetDir::Got);
        c.add(5, NetDir::Got);
        c.add_signal();
        let want = NetTraffic { bytes_put: 100, bytes_got: 35, puts: 1, gets: 2, signals: 1 };
        assert_eq!(c.load(), want);
        assert_eq!(NetTraffic::from_words([100, 35, 1, 2, 1]), want);
    }
}
