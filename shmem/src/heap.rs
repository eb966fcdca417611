//! The symmetric heap's allocator.
//!
//! Every PE runs the same deterministic allocator over its own heap; since
//! allocation and free are collective and ordered, the PEs' allocators stay
//! in the same state and every buffer lies at the same offset on every PE.
//! The allocation count and the set of live buffers are compared across
//! PEs at each allocation, so a PE that allocated or freed differently is
//! caught there rather than corrupting the heap.

pub(crate) mod asan;

use crate::error::{Error, Result};
use crate::heap::asan::HeapMarks;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Alignment of every allocation: enough for 16-byte vector accesses and
/// for the GPU's 256-byte transaction granularity.
pub(crate) const ALIGN: usize = 256;

/// A well-mixed image of a serial number (SplitMix64's finaliser).
fn serial_hash(serial: u64) -> u64 {
    let mut z = serial.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A checked slice: where it lies in every PE's heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    /// Byte offset in the heap.
    pub(crate) offset: usize,
    /// Elements.
    pub(crate) len: usize,
}

/// Whether two non-empty regions of `elem`-byte elements share a byte.
pub(crate) fn overlap(a: Region, b: Region, elem: usize) -> bool {
    a.offset < b.offset + b.len * elem && b.offset < a.offset + a.len * elem && a.len > 0 && b.len > 0
}

/// Heap space a collective uses internally, given back on drop.
///
/// Every member of the collective's team takes and gives it back at the
/// same point of the same collective, so their allocators place it alike
/// without an exchange; it is not counted as an allocation, so the PEs
/// outside the team, which take none, stay in agreement with them.
pub(crate) struct Scratch<'a> {
    heap: &'a Mutex<Allocator>,
    pub(crate) offset: usize,
}

impl<'a> Scratch<'a> {
    /// Takes `bytes` of scratch from `heap`.
    pub(crate) fn take(heap: &'a Mutex<Allocator>, bytes: usize) -> Result<Scratch<'a>> {
        let offset = heap.lock().unwrap_or_else(|e| e.into_inner()).take_scratch(bytes)?;
        Ok(Scratch { heap, offset })
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        self.heap.lock().unwrap_or_else(|e| e.into_inner()).give_back_scratch(self.offset);
    }
}

pub(crate) struct Allocator {
    size: usize,
    /// Free blocks: offset → length, coalesced.
    free: BTreeMap<usize, usize>,
    /// Live blocks: offset → length.
    live: BTreeMap<usize, usize>,
    /// Allocations so far (the next buffer's serial number).
    pub(crate) allocs: u64,
    /// Live buffers, and an order-free hash of their serial numbers: two
    /// PEs with the same live set agree however they ordered their frees
    /// (frees between two allocations cannot reuse memory, so their order
    /// does not matter).
    pub(crate) live_count: u64,
    pub(crate) live_hash: u64,
    /// ASan builds on the host backend: what is allocated, told to ASan.
    marks: Option<HeapMarks>,
}

impl Allocator {
    pub(crate) fn new(size: usize) -> Allocator {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        Allocator { size, free, live: BTreeMap::new(), allocs: 0, live_count: 0, live_hash: 0, marks: None }
    }

    /// Tells `marks` of every allocation and free (ASan builds).
    pub(crate) fn with_marks(mut self, marks: Option<HeapMarks>) -> Allocator {
        self.marks = marks;
        self
    }

    /// First-fit allocation of `bytes` (at least one aligned unit, so every
    /// buffer has its own address), counted: it gets serial number
    /// `allocs` and joins the live set. Returns the offset.
    pub(crate) fn alloc(&mut self, bytes: usize) -> Result<usize> {
        let offset = self.carve(bytes)?;
        self.live_count += 1;
        self.live_hash ^= serial_hash(self.allocs);
        self.allocs += 1;
        Ok(offset)
    }

    /// A collective's temporary block, as [`Allocator::alloc`] places it but
    /// not counted: the members of a team take it and give it back within
    /// one collective, and the PEs outside the team take none, so counting
    /// it would set their allocation counts apart (every later allocation
    /// would then fail its agreement check).
    pub(crate) fn take_scratch(&mut self, bytes: usize) -> Result<usize> {
        self.carve(bytes)
    }

    /// Returns a block of [`Allocator::take_scratch`].
    pub(crate) fn give_back_scratch(&mut self, offset: usize) {
        self.release(offset);
    }

    /// Returns the block at `offset` (allocated with serial `serial`).
    pub(crate) fn free(&mut self, offset: usize, serial: u64) {
        if self.release(offset) {
            self.live_count -= 1;
            self.live_hash ^= serial_hash(serial);
        }
    }

    /// First fit of `bytes` rounded up to whole units; the block joins `live`.
    fn carve(&mut self, bytes: usize) -> Result<usize> {
        let need = bytes.max(1).checked_next_multiple_of(ALIGN).unwrap_or(usize::MAX);
        let found = self.free.iter().find(|(_, &len)| len >= need).map(|(&o, &l)| (o, l));
        let Some((offset, len)) = found else {
            return Err(Error::HeapExhausted {
                requested: bytes,
                largest_free: self.free.values().copied().max().unwrap_or(0),
                heap_size: self.size,
            });
        };
        self.free.remove(&offset);
        if len > need {
            self.free.insert(offset + need, len - need);
        }
        self.live.insert(offset, need);
        if let Some(marks) = &self.marks {
            // The padding up to `need` stays poisoned.
            marks.allocated(offset, bytes);
        }
        Ok(offset)
    }

    /// The live block at `offset` back to the free blocks, coalesced;
    /// whether there was one.
    fn release(&mut self, offset: usize) -> bool {
        let Some(mut len) = self.live.remove(&offset) else {
            debug_assert!(false, "free of an unknown offset {offset}");
            return false;
        };
        if let Some(marks) = &self.marks {
            marks.freed(offset, len);
        }
        let mut start = offset;
        if let Some((&prev, &plen)) = self.free.range(..offset).next_back() {
            if prev + plen == offset {
                self.free.remove(&prev);
                start = prev;
                len += plen;
            }
        }
        let next = start + len;
        if let Some(nlen) = self.free.remove(&next) {
            len += nlen;
        }
        self.free.insert(start, len);
        true
    }

    /// Bytes in use.
    pub(crate) fn used(&self) -> usize {
        self.live.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_reuses_and_coalesces() {
        let mut a = Allocator::new(4 * ALIGN);
        let x = a.alloc(1).unwrap();
        let y = a.alloc(ALIGN + 1).unwrap();
        let z = a.alloc(ALIGN).unwrap();
        assert_eq!((x, y, z), (0, ALIGN, 3 * ALIGN));
        assert!(matches!(a.alloc(1), Err(Error::HeapExhausted { .. })));
        a.free(y, 1);
        a.free(x, 0);
        // x and y coalesced into one block of three units.
        assert_eq!(a.alloc(3 * ALIGN).unwrap(), 0);
        a.free(0, 3);
        a.free(z, 2);
        assert_eq!(a.free.len(), 1);
        assert_eq!(a.used(), 0);
        assert_eq!(a.alloc(4 * ALIGN).unwrap(), 0);
    }

    #[test]
    fn live_set_hash_ignores_free_order_but_not_content() {
        let mut a = Allocator::new(8 * ALIGN);
        let mut b = Allocator::new(8 * ALIGN);
        let (a0, a1, a2) = (a.alloc(8).unwrap(), a.alloc(8).unwrap(), a.alloc(8).unwrap());
        let (b0, b1, _b2) = (b.alloc(8).unwrap(), b.alloc(8).unwrap(), b.alloc(8).unwrap());
        a.free(a0, 0);
        a.free(a1, 1);
        b.free(b1, 1);
        b.free(b0, 0);
        assert_eq!((a.live_count, a.live_hash), (b.live_count, b.live_hash));
        assert_eq!(a.alloc(16).unwrap(), b.alloc(16).unwrap());
        a.free(a2, 2);
        assert_ne!((a.live_count, a.live_hash), (b.live_count, b.live_hash));
    }

    /// A team's scratch (taken by its members only) leaves the counts alone
    /// and the heap as it found it: a PE that took one and a PE that did
    /// not agree on the next allocation, and place it alike.
    #[test]
    fn scratch_is_not_counted() {
        let mut member = Allocator::new(8 * ALIGN);
        let mut outsider = Allocator::new(8 * ALIGN);
        let (m0, o0) = (member.alloc(8).unwrap(), outsider.alloc(8).unwrap());
        let sc = member.take_scratch(3 * ALIGN).unwrap();
        assert_eq!(sc, ALIGN);
        assert_eq!(member.used(), 4 * ALIGN);
        member.give_back_scratch(sc);
        assert_eq!(member.used(), outsider.used());
        assert_eq!(
            (member.allocs, member.live_count, member.live_hash),
            (outsider.allocs, outsider.live_count, outsider.live_hash)
        );
        assert_eq!(member.alloc(7 * ALIGN).unwrap(), outsider.alloc(7 * ALIGN).unwrap());
        member.free(m0, 0);
        outsider.free(o0, 0);
        assert_eq!(member.free, outsider.free);
    }
}
