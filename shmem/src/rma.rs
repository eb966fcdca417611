//! One-sided communication: put, get, signals and atomics on a peer's copy.
//!
//! On the host backend every operation completes before it returns (the
//! `_nbi` forms too); `quiet` and `fence` are then memory fences. The
//! programs written against them are the programs that run on the GPU
//! backend, where `_nbi` operations complete at `quiet`.

use crate::buffer::{Region, SymSlice, SymmetricBuffer};
use crate::context::{Context, Stream};
use crate::dtype::{AtomicElement, AtomicOp, Element};
use crate::error::{Error, Result};
use crate::net::NetDir;
use rayon::prelude::*;
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// How a signal is updated by [`Context::put_signal`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalOp {
    /// `signal = value`
    Set,
    /// `signal += value`
    Add,
}

/// Comparisons of [`Context::signal_wait_until`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

impl Cmp {
    /// Whether `value cmp target` holds.
    pub fn holds(self, value: u64, target: u64) -> bool {
        match self {
            Cmp::Eq => value == target,
            Cmp::Ne => value != target,
            Cmp::Gt => value > target,
            Cmp::Ge => value >= target,
            Cmp::Lt => value < target,
            Cmp::Le => value <= target,
        }
    }
}

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
unsafe fn copy_bytes(pool: &rayon::ThreadPool, dst: *mut u8, src: *const u8, bytes: usize) {
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

impl Context {
    fn check_pe(&self, pe: usize) -> Result<()> {
        if pe >= self.inner.n {
            return Err(Error::PeOutOfRange { pe, n_pes: self.inner.n });
        }
        Ok(())
    }

    /// The checked heap offset of `buf[index]` (on any PE).
    fn element_offset<T: Element>(&self, buf: &SymmetricBuffer<T>, index: usize, pe: usize) -> Result<usize> {
        self.check_pe(pe)?;
        buf.check(&self.inner)?;
        if index >= buf.len {
            return Err(Error::IndexOutOfBounds { index, len: buf.len });
        }
        Ok(buf.offset + index * size_of::<T>())
    }

    /// Host backend: the address of `pe`'s `buf[index]`.
    fn element_ptr<T: Element>(&self, buf: &SymmetricBuffer<T>, index: usize, pe: usize) -> Result<*mut T> {
        let off = self.element_offset(buf, index, pe)?;
        Ok(self.inner.host_heap().heap_ptr(pe, off).cast())
    }

    /// Copies this PE's `src` into `pe`'s copy of `dst`; returns when done.
    pub fn put<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        pe: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.transfer(dst.into(), src.into(), pe, true, stream)
    }

    /// Starts a put; it is complete at the next [`Context::quiet`].
    pub fn put_nbi<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        pe: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.put(dst, src, pe, stream)
    }

    /// Copies `pe`'s copy of `src` into this PE's `dst`; returns when done.
    pub fn get<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        pe: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.transfer(dst.into(), src.into(), pe, false, stream)
    }

    /// Starts a get; it is complete at the next [`Context::quiet`].
    pub fn get_nbi<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        pe: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.get(dst, src, pe, stream)
    }

    fn transfer<T: Element>(
        &self,
        dst: SymSlice<'_, T>,
        src: SymSlice<'_, T>,
        pe: usize,
        put: bool,
        stream: &Stream,
    ) -> Result<()> {
        let (d, s) = self.transfer_regions(&dst, &src, pe, if put { "put" } else { "get" })?;
        self.inner.net_count(pe, d.len * size_of::<T>(), if put { NetDir::Put } else { NetDir::Got });
        if let Some(g) = &self.inner.gpu {
            let bytes = d.len * size_of::<T>();
            return self.inner.report(g.transfer(put, g.addr(d.offset), g.addr(s.offset), bytes, pe, g.stream(stream)));
        }
        let host = self.inner.host_heap();
        let (dst_pe, src_pe) = if put { (pe, self.inner.me) } else { (self.inner.me, pe) };
        // SAFETY: both regions were checked to lie inside their heaps; the
        // program orders this access against others to the same memory.
        unsafe {
            copy_bytes(
                &self.inner.pool,
                host.heap_ptr(dst_pe, d.offset),
                host.heap_ptr(src_pe, s.offset),
                d.len * size_of::<T>(),
            )
        };
        Ok(())
    }

    /// Checks a transfer with `pe` and returns (dst, src).
    fn transfer_regions<T: Element>(
        &self,
        dst: &SymSlice<'_, T>,
        src: &SymSlice<'_, T>,
        pe: usize,
        what: &str,
    ) -> Result<(Region, Region)> {
        self.check_pe(pe)?;
        let d = dst.region(&self.inner)?;
        let s = src.region(&self.inner)?;
        if d.len != s.len {
            return Err(Error::LengthMismatch(format!("{what}: source has {} elements, destination {}", s.len, d.len)));
        }
        Ok((d, s))
    }

    /// Writes one element into `pe`'s copy of `dst` (NVSHMEM's `p`).
    pub fn p<T: Element>(
        &self,
        dst: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        stream: &Stream,
    ) -> Result<()> {
        let off = self.element_offset(dst, index, pe)?;
        self.inner.net_count(pe, size_of::<T>(), NetDir::Put);
        if let Some(g) = &self.inner.gpu {
            // SAFETY: a checked element of the symmetric heap.
            let r =
                unsafe { crate::gpu::dispatch::p(g.nv, g.addr(off), value, pe as i32, g.stream(stream).cu_stream()) };
            return self.inner.report(r);
        }
        let p = self.element_ptr(dst, index, pe)?;
        // SAFETY: an aligned element inside `pe`'s heap (checked); volatile
        // because other processes read it.
        unsafe { p.write_volatile(value) };
        Ok(())
    }

    /// Reads one element of `pe`'s copy of `src` (NVSHMEM's `g`).
    pub fn g<T: Element>(&self, src: &SymmetricBuffer<T>, index: usize, pe: usize, stream: &Stream) -> Result<T> {
        let off = self.element_offset(src, index, pe)?;
        self.inner.net_count(pe, size_of::<T>(), NetDir::Got);
        if let Some(g) = &self.inner.gpu {
            let st = g.stream(stream);
            // SAFETY: a checked element of the symmetric heap.
            let v = unsafe { crate::gpu::dispatch::g(g.nv, g.addr(off), pe as i32, st.cu_stream())? };
            st.synchronize()?;
            return self.inner.report(Ok(v));
        }
        let p = self.element_ptr(src, index, pe)?;
        // SAFETY: as in `p`.
        Ok(unsafe { p.read_volatile() })
    }

    /// Completes every outstanding operation of this PE.
    pub fn quiet(&self, stream: &Stream) -> Result<()> {
        if let Some(g) = &self.inner.gpu {
            return self.inner.report(g.quiet(g.stream(stream)));
        }
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// Orders this PE's operations to each peer: those before the fence are
    /// delivered before those after it.
    pub fn fence(&self, stream: &Stream) -> Result<()> {
        if let Some(g) = &self.inner.gpu {
            // Quiet is a fence and more: NVSHMEM has no fence on a stream.
            return self.inner.report(g.quiet(g.stream(stream)));
        }
        fence(Ordering::SeqCst);
        Ok(())
    }

    fn signal_cell<'s>(&self, signal: &'s SymmetricBuffer<u64>, index: usize, pe: usize) -> Result<&'s AtomicU64> {
        let p = self.element_ptr(signal, index, pe)?;
        // SAFETY: an aligned u64 inside a mapping that lives as long as the
        // buffer (it holds the context); AtomicU64 has u64's layout.
        Ok(unsafe { &*p.cast::<AtomicU64>() })
    }

    /// Puts `src` into `pe`'s `dst`, then updates `pe`'s `signal[sig_index]`;
    /// a peer that sees the signal sees the data.
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        signal: &SymmetricBuffer<u64>,
        sig_index: usize,
        value: u64,
        op: SignalOp,
        pe: usize,
        stream: &Stream,
    ) -> Result<()> {
        let sig = self.element_offset(signal, sig_index, pe)?;
        let (dst, src) = (dst.into(), src.into());
        let (d, s) = self.transfer_regions(&dst, &src, pe, "put_signal")?;
        if let Some(g) = &self.inner.gpu {
            let (bytes, add) = (d.len * size_of::<T>(), op == SignalOp::Add);
            self.inner.net_count(pe, bytes, NetDir::Put);
            self.inner.net_signal(pe);
            let st = g.stream(stream);
            let r = g.put_signal(g.addr(d.offset), g.addr(s.offset), bytes, g.addr(sig), value, add, pe, st);
            return self.inner.report(r);
        }
        self.put(dst, src, pe, stream)?;
        // The signal's SeqCst store or add (a release at least) makes the data
        // written above visible to any acquire load that sees the new value.
        self.signal_op(signal, sig_index, value, op, pe, stream)
    }

    /// Starts a [`Context::put_signal`]; complete at the next quiet.
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal_nbi<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        signal: &SymmetricBuffer<u64>,
        sig_index: usize,
        value: u64,
        op: SignalOp,
        pe: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.put_signal(dst, src, signal, sig_index, value, op, pe, stream)
    }

    /// Updates `pe`'s `signal[sig_index]` with no data.
    pub fn signal_op(
        &self,
        signal: &SymmetricBuffer<u64>,
        sig_index: usize,
        value: u64,
        op: SignalOp,
        pe: usize,
        stream: &Stream,
    ) -> Result<()> {
        let sig = self.element_offset(signal, sig_index, pe)?;
        self.inner.net_signal(pe);
        if let Some(g) = &self.inner.gpu {
            return self.inner.report(g.signal_op(g.addr(sig), value, op == SignalOp::Add, pe, g.stream(stream)));
        }
        let cell = self.signal_cell(signal, sig_index, pe)?;
        match op {
            SignalOp::Set => cell.store(value, Ordering::SeqCst),
            SignalOp::Add => {
                cell.fetch_add(value, Ordering::SeqCst);
            }
        }
        Ok(())
    }

    /// This PE's `signal[index]`.
    pub fn signal_fetch(&self, signal: &SymmetricBuffer<u64>, index: usize, stream: &Stream) -> Result<u64> {
        let me = self.inner.me;
        if let Some(g) = &self.inner.gpu {
            let off = self.element_offset(signal, index, me)?;
            let mut v = [0u64];
            g.dtoh(&mut v, g.addr(off), g.stream(stream))?;
            return self.inner.report(Ok(v[0]));
        }
        // Acquire: data put before the signal is visible after this load.
        Ok(self.signal_cell(signal, index, me)?.load(Ordering::Acquire))
    }

    /// Waits until this PE's `signal[index] cmp value` holds; returns the
    /// signal's value then. Fails if a peer dies, or every peer leaves,
    /// while waiting.
    pub fn signal_wait_until(
        &self,
        signal: &SymmetricBuffer<u64>,
        index: usize,
        cmp: Cmp,
        value: u64,
        stream: &Stream,
    ) -> Result<u64> {
        let me = self.inner.me;
        let what = || format!("waiting for signal[{index}] {cmp:?} {value}");
        if let Some(g) = &self.inner.gpu {
            // Polled from the host, so that a dead peer ends the wait.
            let off = self.element_offset(signal, index, me)?;
            let st = g.stream(stream);
            st.synchronize()?;
            let (mut seen, mut failed) = (0, None);
            let poll = || {
                let mut v = [0u64];
                match g.dtoh(&mut v, g.addr(off), st) {
                    Ok(()) => {
                        seen = v[0];
                        cmp.holds(seen, value)
                    }
                    Err(e) => {
                        failed = Some(e);
                        true
                    }
                }
            };
            self.inner.ctl.wait_for_anyone(poll, &what)?;
            return self.inner.report(failed.map_or(Ok(seen), Err));
        }
        let cell = self.signal_cell(signal, index, me)?;
        let mut seen = 0;
        self.inner.ctl.wait_for_anyone(
            || {
                // Acquire: pairs with the release of the signalling put.
                seen = cell.load(Ordering::Acquire);
                cmp.holds(seen, value)
            },
            &what,
        )?;
        Ok(seen)
    }

    fn atomic<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        pe: usize,
        stream: &Stream,
        op: AtomicOp<T>,
    ) -> Result<T> {
        if let Some(g) = &self.inner.gpu {
            let off = self.element_offset(buf, index, pe)?;
            // NVSHMEM's host atomics are blocking calls: order them after
            // the work already on the stream.
            g.stream(stream).synchronize()?;
            return self.inner.report(g.atomic(off, op, pe, g.stream(stream)));
        }
        let p = self.element_ptr(buf, index, pe)?;
        // SAFETY: an aligned element inside the mapping, which outlives the
        // borrow of `buf`; `T::Atomic` has T's layout.
        let a = unsafe { &*p.cast::<T::Atomic>() };
        Ok(T::atomic_op(a, op))
    }

    /// Reads `pe`'s `buf[index]` atomically.
    pub fn atomic_fetch<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        pe: usize,
        s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, s, AtomicOp::Fetch)
    }

    /// Writes `pe`'s `buf[index]` atomically.
    pub fn atomic_set<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        s: &Stream,
    ) -> Result<()> {
        self.atomic(buf, index, pe, s, AtomicOp::Set(value)).map(drop)
    }

    /// Swaps in `value`; returns the old value.
    pub fn atomic_swap<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, s, AtomicOp::Swap(value))
    }

    /// Writes `new` if the element equals `current`; returns the old value.
    pub fn atomic_compare_swap<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        current: T,
        new: T,
        pe: usize,
        s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, s, AtomicOp::CompareSwap { current, new })
    }

    /// Adds `value` (wrapping); returns the old value.
    pub fn atomic_fetch_add<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, s, AtomicOp::FetchAdd(value))
    }

    /// Adds `value` (wrapping).
    pub fn atomic_add<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        s: &Stream,
    ) -> Result<()> {
        self.atomic(buf, index, pe, s, AtomicOp::FetchAdd(value)).map(drop)
    }

    /// Bitwise and; returns the old value.
    pub fn atomic_fetch_and<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, s, AtomicOp::FetchAnd(value))
    }

    /// Bitwise or; returns the old value.
    pub fn atomic_fetch_or<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, s, AtomicOp::FetchOr(value))
    }

    /// Bitwise xor; returns the old value.
    pub fn atomic_fetch_xor<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, s, AtomicOp::FetchXor(value))
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
