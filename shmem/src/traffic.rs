//! The counts behind [`crate::net`]: this PE's traffic with other nodes'
//! PEs, added where the data moves (the public layer, the host backend,
//! and the gpu backend's device counters read back as [`NetTraffic`]).

use crate::control::Control;
use std::sync::atomic::{AtomicU64, Ordering};

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

    /// One transfer of `bytes` with world PE `peer` in direction `dir`,
    /// counted if `peer` is on another node than this PE (`ctl`'s).
    pub(crate) fn count(&self, ctl: &Control, peer: usize, bytes: usize, dir: NetDir) {
        if bytes > 0 && ctl.other_node(peer) {
            self.add(bytes, dir);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
