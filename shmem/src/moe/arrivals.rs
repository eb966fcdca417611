//! [`MoeAllToAll`]'s arrival flags: the receive-side hook that lets an
//! expert kernel start on one source's rows as they land, before the whole
//! dispatch is done.
//!
//! Each PE holds one `u64` flag per (local expert, source PE), entry
//! `expert × n_pes + source`, and an epoch word. Every dispatch that
//! succeeds advances the epoch by one (the first marks 1, the next 2, …,
//! on the device for the device path, so that replays of a CUDA graph
//! advance it too) and stores that epoch in the flag of a pair once the
//! pair's rows are all in the expert's block — with release semantics,
//! after the rows are written, so that a kernel that sees the flag with
//! an acquire load sees the rows. A pair that receives no row is marked
//! too (at the start of the placement), so a waiter never waits for rows
//! that will not come. Flags only grow: nothing is reset between
//! dispatches. A dispatch that fails marks nothing and leaves the epoch.
//!
//! On the device: `shmem::MoeArrivals` and `shmem::moe_wait_arrival` of
//! [`DEVICE_HEADER`](crate::DEVICE_HEADER), with
//! [`Arrivals::device_arg`] as the kernel argument.

use super::layer::MoeAllToAll;
use crate::buffer::SymSlice;
use crate::context::Stream;
use crate::dtype::Element;
use crate::error::Result;
use std::sync::atomic::{AtomicU64, Ordering};

/// `u64`s of an exchange's arrival words on `n` PEs with `ne` experts
/// each: the flags, the epoch word, then the device path's placement
/// counters (`ne × n` u32, in as many u64 words for simplicity).
pub(super) fn arrival_words(ne: usize, n: usize) -> usize {
    2 * ne * n + 1
}

/// This PE's arrival flags and epoch word ([`MoeAllToAll::arrivals`]).
#[derive(Clone, Copy)]
pub struct Arrivals<'a> {
    /// `experts_per_pe × n_pes` flags: entry `expert × n_pes + source`
    /// holds the epoch of the last dispatch whose rows from PE `source`
    /// for local expert `expert` are all placed (0 before any).
    pub flags: SymSlice<'a, u64>,
    /// One word: the epoch of the last dispatch (0 before any); the next
    /// dispatch marks this + 1.
    pub epoch: SymSlice<'a, u64>,
    n_pes: usize,
    experts_per_pe: usize,
}

impl std::fmt::Debug for Arrivals<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arrivals").field("n_pes", &self.n_pes).field("experts_per_pe", &self.experts_per_pe).finish()
    }
}

impl Arrivals<'_> {
    /// The epoch of the last dispatch, read once the stream's work is
    /// done: the next dispatch marks this + 1. Read it before issuing a
    /// dispatch and a kernel that waits on its flags (eagerly, or once
    /// before replaying a graph of one dispatch: replay `r` marks the
    /// value read + 1 + `r`).
    pub fn last_epoch(&self, stream: &Stream) -> Result<u64> {
        Ok(self.epoch.copy_to_host(stream)?[0])
    }

    /// The flag of (local expert `expert`, source PE `source`), read once
    /// the stream's work is done.
    pub fn flag(&self, expert: usize, source: usize, stream: &Stream) -> Result<u64> {
        let i = expert * self.n_pes + source;
        Ok(self.flags.buf.slice(self.flags.start + i..self.flags.start + i + 1).copy_to_host(stream)?[0])
    }

    /// The kernel argument: `shmem::MoeArrivals` of
    /// [`DEVICE_HEADER`](crate::DEVICE_HEADER), passed by value. On the
    /// host backend its addresses are this process's mapping of the heap.
    pub fn device_arg(&self) -> Result<DeviceMoeArrivals<'_>> {
        let addr = |s: &SymSlice<'_, u64>| -> Result<u64> {
            Ok(match s.device_ptr()? {
                Some(p) => p,
                None => s.buf.local_ptr().wrapping_add(s.start) as u64,
            })
        };
        Ok(DeviceMoeArrivals {
            flags: addr(&self.flags)?,
            epoch: addr(&self.epoch)?,
            n_pes: self.n_pes as i32,
            experts_per_pe: self.experts_per_pe as i32,
            _arrivals: std::marker::PhantomData,
        })
    }
}

/// The `shmem::MoeArrivals` struct of [`DEVICE_HEADER`](crate::DEVICE_HEADER),
/// field for field: a kernel argument, made by [`Arrivals::device_arg`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DeviceMoeArrivals<'a> {
    flags: u64,
    epoch: u64,
    n_pes: i32,
    experts_per_pe: i32,
    _arrivals: std::marker::PhantomData<&'a ()>,
}

const _: () = assert!(size_of::<DeviceMoeArrivals<'static>>() == 24);
const _: () = assert!(std::mem::offset_of!(DeviceMoeArrivals<'static>, flags) == 0);
const _: () = assert!(std::mem::offset_of!(DeviceMoeArrivals<'static>, epoch) == 8);
const _: () = assert!(std::mem::offset_of!(DeviceMoeArrivals<'static>, n_pes) == 16);
const _: () = assert!(std::mem::offset_of!(DeviceMoeArrivals<'static>, experts_per_pe) == 20);

// SAFETY: `#[repr(C)]` plain data laid out as the header's struct (two
// 8-byte addresses, two `int`s, no padding); the marker is zero-sized.
unsafe impl cudarc::driver::DeviceRepr for DeviceMoeArrivals<'_> {}

impl<T: Element> MoeAllToAll<T> {
    /// The arrival flags of this PE's expert blocks and the epoch word
    /// (see [`Arrivals`]): a kernel on another stream can wait on a
    /// (local expert, source PE) pair's flag and start on those rows while
    /// the dispatch still places the others.
    ///
    /// On the device path ([`MoeAllToAll::dispatch_on_device`] and its
    /// FP8 form) the placement kernel stores each flag with release
    /// semantics after the pair's rows; [`MoeAllToAll::dispatch`] and
    /// [`MoeAllToAll::dispatch_fp8`] mark every pair once the call has
    /// placed every row (on the GPU backend by a copy ordered on the
    /// stream after the rows' copies: wait on those with the stream, not
    /// from a concurrent kernel).
    pub fn arrivals(&self) -> Arrivals<'_> {
        let pairs = self.config.experts_per_pe * self.team.n_pes();
        Arrivals {
            flags: self.arrivals.slice(0..pairs),
            epoch: self.arrivals.slice(pairs..pairs + 1),
            n_pes: self.team.n_pes(),
            experts_per_pe: self.config.experts_per_pe,
        }
    }

    /// The host path's marks, once every row of a dispatch is placed: the
    /// epoch advanced, every pair's flag set to it (those with no rows
    /// too).
    pub(super) fn mark_arrivals(&self, stream: &Stream) -> Result<()> {
        let a = self.arrivals();
        let epoch = a.last_epoch(stream)? + 1;
        let pairs = a.flags.len();
        if self.team.ctx.backend.gpu().is_some() {
            a.flags.copy_from_host(&vec![epoch; pairs], stream)?;
            return a.epoch.copy_from_host(&[epoch], stream);
        }
        let base = self.arrivals.local_ptr();
        for i in 0..=pairs {
            // SAFETY: word `i ≤ pairs` of this PE's copy of the arrival
            // words (`2 × pairs + 1` of them, 8-byte aligned as every heap
            // allocation); other threads touch them only through atomics.
            // Release: the rows, copied into the heap before this call,
            // are visible to whoever acquires the flag.
            let word = unsafe { AtomicU64::from_ptr(base.add(i)) };
            word.store(epoch, Ordering::Release);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_agrees_with_the_rust_side() {
        let h = crate::DEVICE_HEADER;
        assert!(h.contains("const uint64_t *flags;"), "MoeArrivals::flags");
        assert!(h.contains("const uint64_t *epoch;"), "MoeArrivals::epoch");
        assert!(h.contains("static_assert(sizeof(MoeArrivals) == 24"), "MoeArrivals: size");
        assert_eq!(size_of::<DeviceMoeArrivals>(), 24);
    }
}
