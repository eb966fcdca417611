//! The host backend's one-sided operations: copies between the mapped
//! heaps, loads and stores of single elements, and atomics on them. Every
//! operation completes before it returns.

use super::HostHeap;
use crate::dtype::{AtomicElement, AtomicOp, Element};
use rayon::prelude::*;
use std::sync::atomic::AtomicU64;

/// A pointer that may cross into the rayon pool's threads, keeping its
/// provenance (an address as an integer would not).
#[derive(Clone, Copy)]
struct PoolPtr(*mut u8);

// SAFETY: a plain address; the users say why their accesses through it
// from several threads are sound (disjoint ranges).
unsafe impl Send for PoolPtr {}
// SAFETY: as above.
unsafe impl Sync for PoolPtr {}

impl PoolPtr {
    /// The pointer (a method, so that closures capture the whole `PoolPtr`).
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// Copies `bytes` bytes; large copies are split over the rayon pool.
///
/// # Safety
/// `src` and `dst` are valid for `bytes` bytes; if they overlap, the copy is
/// done as one `memmove`.
pub(crate) unsafe fn copy_bytes(pool: &rayon::ThreadPool, dst: *mut u8, src: *const u8, bytes: usize) {
    const CHUNK: usize = 1 << 20;
    let overlap = (dst as usize) < (src as usize + bytes) && (src as usize) < (dst as usize + bytes);
    if bytes < 4 * CHUNK || overlap || pool.current_num_threads() == 1 {
        // SAFETY: the caller's contract; `copy` tolerates overlap.
        unsafe { std::ptr::copy(src, dst, bytes) };
        return;
    }
    let (d, s) = (PoolPtr(dst), PoolPtr(src.cast_mut()));
    pool.install(|| {
        (0..bytes.div_ceil(CHUNK)).into_par_iter().for_each(|i| {
            let off = i * CHUNK;
            let n = CHUNK.min(bytes - off);
            // SAFETY: disjoint chunks of non-overlapping ranges valid for `bytes`.
            unsafe { std::ptr::copy_nonoverlapping(s.get().add(off), d.get().add(off), n) };
        })
    });
}

/// The operations take heap offsets that the public layer checked: a
/// region inside the heap, an element aligned for its type (allocations
/// are 256-aligned, elements lie at multiples of their size). The program
/// orders them against other accesses to the same memory.
impl HostHeap {
    /// Copies `bytes` from `src_pe`'s heap at `src` to `dst_pe`'s at `dst`.
    pub(crate) fn copy(
        &self,
        pool: &rayon::ThreadPool,
        (dst_pe, dst): (usize, usize),
        (src_pe, src): (usize, usize),
        bytes: usize,
    ) {
        // SAFETY: both regions lie inside their heaps (checked by the caller).
        unsafe { copy_bytes(pool, self.heap_ptr(dst_pe, dst), self.heap_ptr(src_pe, src), bytes) };
    }

    /// Writes `data` into `pe`'s heap at `offset`.
    pub(crate) fn write<T: Element>(&self, pe: usize, offset: usize, data: &[T]) {
        // SAFETY: `data.len()` aligned elements inside the heap (checked by
        // the caller); the mapping cannot overlap a Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.heap_ptr(pe, offset).cast::<T>(), data.len()) };
    }

    /// Reads `out.len()` elements of `pe`'s heap at `offset`.
    pub(crate) fn read<T: Element>(&self, pe: usize, offset: usize, out: &mut [T]) {
        // SAFETY: as in `write`, reading instead of writing.
        unsafe { std::ptr::copy_nonoverlapping(self.heap_ptr(pe, offset).cast::<T>(), out.as_mut_ptr(), out.len()) };
    }

    /// Zeroes `bytes` of `pe`'s heap at `offset`.
    pub(crate) fn zero(&self, pe: usize, offset: usize, bytes: usize) {
        // SAFETY: a region inside the heap (checked by the caller); all-zero
        // bytes are a valid value of every Element type.
        unsafe { std::ptr::write_bytes(self.heap_ptr(pe, offset), 0, bytes) };
    }

    /// Stores one element into `pe`'s heap at `offset`.
    pub(crate) fn store<T: Element>(&self, pe: usize, offset: usize, value: T) {
        // SAFETY: an aligned element inside the heap (checked by the
        // caller); volatile because other processes read it.
        unsafe { self.heap_ptr(pe, offset).cast::<T>().write_volatile(value) };
    }

    /// Loads one element of `pe`'s heap at `offset`.
    pub(crate) fn load<T: Element>(&self, pe: usize, offset: usize) -> T {
        // SAFETY: as in `store`.
        unsafe { self.heap_ptr(pe, offset).cast::<T>().read_volatile() }
    }

    /// The signal word of `pe`'s heap at `offset`.
    pub(crate) fn signal(&self, pe: usize, offset: usize) -> &AtomicU64 {
        // SAFETY: an aligned u64 inside the mapping, which lives as long as
        // `self`; AtomicU64 has u64's layout.
        unsafe { &*self.heap_ptr(pe, offset).cast::<AtomicU64>() }
    }

    /// Performs `op` on `pe`'s element at `offset`; returns the old value.
    pub(crate) fn atomic<T: AtomicElement>(&self, pe: usize, offset: usize, op: AtomicOp<T>) -> T {
        // SAFETY: an aligned element inside the mapping, which lives as long
        // as `self`; `T::Atomic` has T's layout.
        let a = unsafe { &*self.heap_ptr(pe, offset).cast::<T::Atomic>() };
        T::atomic_op(a, op)
    }
}
#[cfg(test)]
mod tests {
    use super::copy_bytes;

    #[test]
    // rayon's crossbeam-epoch breaks Miri's default Stacked Borrows rules
    // (crossbeam-rs/crossbeam#996); ci/sanitize-host.sh runs this test
    // under Tree Borrows.
    #[cfg_attr(miri, ignore = "Miri: rayon's pool needs -Zmiri-tree-borrows")]
    fn copies_in_parallel_chunks_and_overlapping_in_one_move() {
        const CHUNK: usize = 1 << 20;
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        // Above the parallel threshold, and not a whole number of chunks.
        let len = 4 * CHUNK + 3;
        let mut src = vec![0xa5u8; len];
        let marks = [0, CHUNK - 1, CHUNK, 3 * CHUNK + 1, len - 1];
        for (i, &at) in marks.iter().enumerate() {
            src[at] = i as u8;
        }
        let mut dst = vec![0u8; len];
        // SAFETY: two distinct vectors of `len` bytes.
        unsafe { copy_bytes(&pool, dst.as_mut_ptr(), src.as_ptr(), len) };
        assert!(dst == src);
        // Overlapping ranges of one vector: a single memmove.
        let mut v: Vec<u8> = (0..64).collect();
        let p = v.as_mut_ptr();
        // SAFETY: bytes 0..32 and 8..40 of a 64-byte vector.
        unsafe { copy_bytes(&pool, p.add(8), p, 32) };
        assert_eq!(&v[..8], &(0..8).collect::<Vec<u8>>()[..]);
        assert_eq!(&v[8..40], &(0..32).collect::<Vec<u8>>()[..]);
        assert_eq!(&v[40..], &(40..64).collect::<Vec<u8>>()[..]);
    }
}
