//! Where the kernels' state lies in the symmetric allocation, after the
//! heap (every PE alike): a synchronisation slot per team slot, the world
//! team's low-latency packets and push staging, this PE's RMA staging, its
//! MoE all-to-all-v table and its counters of traffic with other nodes;
//! where the world spans nodes, last, the rail pipes of the node-aware
//! collectives (so that one node's offsets do not move).

use super::abi::{
    A2AV_COUNTER_BYTES, A2AV_PACKET_WORDS, AGREE_DATA_BYTES, AGREE_WORDS, EPOCH_COUNTERS, MAX_BLOCKS,
    NET_COUNTER_WORDS, PACKET_BYTES, PUSH_MAX_BYTES, PUSH_MAX_TEAM, RAIL_CHANNELS, RAIL_CHUNK, RAIL_DEPTH, RMA_BLOCKS,
    RMA_CHUNK, SIGNAL_ARRAYS, STATE_ALIGN,
};
use crate::algo::low_latency_buffer_bytes;

/// Team slots with synchronisation state (as many as the host's team slots).
pub(super) const TEAM_SLOTS: usize = 64;

/// 64-bit words of each PE's MoE all-to-all-v table: the verdict and
/// active blocks, every PE's splits (and offsets), the plan kernel's work
/// arrays, and the send plan (4 words per chunk).
pub(super) const A2AV_TABLE_WORDS: usize = 1 << 17;

/// The kernels' state of a world of `n` PEs on `nodes` nodes after a heap
/// of `base` bytes.
#[derive(Clone, Copy)]
pub(crate) struct Layout {
    base: usize,
    n: usize,
    nodes: usize,
}

impl Layout {
    pub(crate) fn new(heap_size: usize, n: usize, nodes: usize) -> Layout {
        Layout { base: heap_size, n, nodes: nodes.max(1) }
    }

    /// A team's synchronisation slot: the signal arrays and epoch
    /// counters, then the one-kernel MoE all-to-all-v's counters and its
    /// two buffers of splits packets (`A2avPackets` in `moe/a2av.cuh`), then the
    /// agreement's state (`TeamSync::agree_base` in `abi.cuh`).
    pub(super) fn slot_bytes(&self) -> usize {
        ((SIGNAL_ARRAYS * MAX_BLOCKS * self.n + EPOCH_COUNTERS) * 8).next_multiple_of(STATE_ALIGN)
            + A2AV_COUNTER_BYTES
            + 2 * A2AV_PACKET_WORDS * PACKET_BYTES
            + self.agree_bytes()
    }

    /// The agreement's state of a slot: for each of two epoch parities, a
    /// packet a word of every sender's row and of the data it may carry
    /// (NVLink), and every sender's row (RMA), then a signal word a sender.
    fn agree_bytes(&self) -> usize {
        let packets = AGREE_WORDS + AGREE_DATA_BYTES / 8;
        (self.n * (2 * (packets * PACKET_BYTES + AGREE_WORDS * 8) + 8)).next_multiple_of(STATE_ALIGN)
    }

    /// Heap offset of team slot `slot`'s synchronisation state.
    pub(super) fn slot(&self, slot: usize) -> usize {
        self.base + slot * self.slot_bytes()
    }

    /// The world team's low-latency buffers: one a sender for each of two
    /// epoch parities.
    pub(super) fn ll(&self) -> usize {
        self.slot(TEAM_SLOTS)
    }

    /// The push all-reduce's flags and staging (`Push` in `prims/push.cuh`),
    /// for worlds of up to `PUSH_MAX_TEAM` PEs.
    fn push(&self) -> usize {
        self.ll() + 2 * self.n * low_latency_buffer_bytes(self.n)
    }

    fn push_bytes(&self) -> usize {
        if self.n > PUSH_MAX_TEAM {
            return 0;
        }
        (self.n * MAX_BLOCKS * 8).next_multiple_of(STATE_ALIGN) + 2 * self.n * PUSH_MAX_BYTES
    }

    /// This PE's RMA staging: [`RMA_CHUNK`] bytes per block and peer.
    pub(super) fn temp(&self) -> usize {
        self.push() + self.push_bytes()
    }

    /// This PE's MoE all-to-all-v table (`A2avTable` in `moe/a2av.cuh`).
    pub(super) fn a2av(&self) -> usize {
        self.temp() + RMA_BLOCKS * self.n * RMA_CHUNK
    }

    /// This PE's counters of traffic with other nodes' PEs (`NetCounters`
    /// in `abi.cuh`), after everything a job of one node has besides.
    pub(crate) fn net(&self) -> usize {
        self.a2av() + A2AV_TABLE_WORDS * 8
    }

    /// The rail pipes' state (`Rail` in `prims/rail.cuh`), where the world
    /// spans nodes, after everything else: for each of [`RAIL_CHANNELS`]
    /// channels and each node, [`RAIL_DEPTH`] step words, a credit, a sent
    /// and a taken count (rounded up to [`STATE_ALIGN`]); then the inboxes
    /// and the outboxes, [`RAIL_DEPTH`] chunks of [`RAIL_CHUNK`] bytes for
    /// each channel and each other node.
    pub(crate) fn rail(&self) -> Option<usize> {
        (self.nodes >= 2).then(|| self.net() + (NET_COUNTER_WORDS * 8).next_multiple_of(STATE_ALIGN))
    }

    fn rail_bytes(&self) -> usize {
        if self.nodes < 2 {
            return 0;
        }
        let words = (RAIL_CHANNELS * self.nodes * (RAIL_DEPTH + 3) * 8).next_multiple_of(STATE_ALIGN);
        words + 2 * RAIL_CHANNELS * (self.nodes - 1) * RAIL_DEPTH * RAIL_CHUNK
    }

    /// Bytes of all the kernels' state.
    pub(crate) fn bytes(&self) -> usize {
        self.net() + (NET_COUNTER_WORDS * 8).next_multiple_of(STATE_ALIGN) + self.rail_bytes() - self.base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets of a world of 2 PEs after a 1 MiB heap, as the kernels
    /// compute them.
    #[test]
    fn state_of_a_pair() {
        let l = Layout::new(1 << 20, 2, 1);
        // 3 × 128 × 2 + 256 words, rounded to 256 bytes, + 256 + 2 × 1024 × 16,
        // + 2 × (2 × ((8 + 32) × 16 + 8 × 8) + 8) rounded to 256 (the
        // agreement: its rows' packets and 256 bytes of data's, its rows).
        assert_eq!(l.slot_bytes(), 8192 + 256 + 32768 + 3072);
        assert_eq!(l.slot(0), 1 << 20);
        assert_eq!(l.ll(), (1 << 20) + 64 * 44288);
        assert_eq!(l.push(), l.ll() + 2 * 2 * ((2 << 20) + (64 << 10)));
        assert_eq!(l.temp(), l.push() + 2048 + 2 * 2 * (1 << 20));
        assert_eq!(l.a2av(), l.temp() + 32 * 2 * 8192);
        assert_eq!(l.a2av(), 17_057_792 + 64 * 3072);
        assert_eq!(l.net(), l.a2av() + A2AV_TABLE_WORDS * 8);
        assert_eq!(l.bytes(), l.net() + 256 - (1 << 20));
        assert_eq!(l.rail(), None);
    }

    /// Across nodes the rail pipes come last: nothing else moves.
    #[test]
    fn rail_pipes_after_everything_else() {
        let one = Layout::new(1 << 20, 4, 1);
        let two = Layout::new(1 << 20, 4, 2);
        assert_eq!((one.ll(), one.temp(), one.a2av(), one.net()), (two.ll(), two.temp(), two.a2av(), two.net()));
        let rail = two.rail().expect("two nodes");
        assert_eq!(rail, one.bytes() + (1 << 20));
        // 16 channels × 2 nodes × 7 words = 1792 bytes, then 2 × 16 × 4
        // chunks of 64 KiB: 8 MiB.
        assert_eq!(two.bytes(), one.bytes() + 1792 + (8 << 20));
    }
}
