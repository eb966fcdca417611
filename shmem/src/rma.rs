//! One-sided communication: put, get, signals and atomics on a peer's copy.
//!
//! On the host backend every operation completes before it returns (the
//! `_nbi` forms too); `quiet` and `fence` are then memory fences. The
//! programs written against them are the programs that run on the GPU
//! backend, where `_nbi` operations complete at `quiet`.

use crate::buffer::{SymSlice, SymmetricBuffer};
use crate::context::{Context, Stream};
use crate::dtype::{AtomicElement, AtomicOp, Element};
use crate::error::{Error, Result};
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

/// Copies `bytes` bytes; large copies are split over the rayon pool.
///
/// # Safety
/// `src` and `dst` are valid for `bytes` bytes; if they overlap, the copy is
/// done as one `memmove`.
unsafe fn copy_bytes(pool: &rayon::ThreadPool, dst: *mut u8, src: *const u8, bytes: usize) {
    const CHUNK: usize = 1 << 20;
    let overlap =
        (dst as usize) < (src as usize + bytes) && (src as usize) < (dst as usize + bytes);
    if bytes < 4 * CHUNK || overlap || pool.current_num_threads() == 1 {
        // SAFETY: the caller's contract; `copy` tolerates overlap.
        unsafe { std::ptr::copy(src, dst, bytes) };
        return;
    }
    let (d, s) = (dst as usize, src as usize);
    pool.install(|| {
        (0..bytes.div_ceil(CHUNK)).into_par_iter().for_each(|i| {
            let off = i * CHUNK;
            let n = CHUNK.min(bytes - off);
            // SAFETY: disjoint chunks of non-overlapping ranges valid for `bytes`.
            unsafe {
                std::ptr::copy_nonoverlapping((s + off) as *const u8, (d + off) as *mut u8, n)
            };
        })
    });
}

impl Context {
    fn check_pe(&self, pe: usize) -> Result<()> {
        if pe >= self.inner.n {
            return Err(Error::PeOutOfRange {
                pe,
                n_pes: self.inner.n,
            });
        }
        Ok(())
    }

    fn element_ptr<T: Element>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        pe: usize,
    ) -> Result<*mut T> {
        self.check_pe(pe)?;
        buf.check(&self.inner)?;
        if index >= buf.len {
            return Err(Error::IndexOutOfBounds {
                index,
                len: buf.len,
            });
        }
        Ok(self
            .inner
            .host
            .heap_ptr(pe, buf.offset + index * size_of::<T>())
            .cast())
    }

    /// Copies this PE's `src` into `pe`'s copy of `dst`; returns when done.
    pub fn put<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        pe: usize,
        _stream: &Stream,
    ) -> Result<()> {
        self.transfer(dst.into(), src.into(), pe, true)
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
        _stream: &Stream,
    ) -> Result<()> {
        self.transfer(dst.into(), src.into(), pe, false)
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
    ) -> Result<()> {
        self.check_pe(pe)?;
        let d = dst.region(&self.inner)?;
        let s = src.region(&self.inner)?;
        if d.len != s.len {
            return Err(Error::LengthMismatch(format!(
                "{}: source has {} elements, destination {}",
                if put { "put" } else { "get" },
                s.len,
                d.len
            )));
        }
        let host = &self.inner.host;
        let (dst_pe, src_pe) = if put {
            (pe, self.inner.me)
        } else {
            (self.inner.me, pe)
        };
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

    /// Writes one element into `pe`'s copy of `dst` (NVSHMEM's `p`).
    pub fn p<T: Element>(
        &self,
        dst: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        _stream: &Stream,
    ) -> Result<()> {
        let p = self.element_ptr(dst, index, pe)?;
        // SAFETY: an aligned element inside `pe`'s heap (checked); volatile
        // because other processes read it.
        unsafe { p.write_volatile(value) };
        Ok(())
    }

    /// Reads one element of `pe`'s copy of `src` (NVSHMEM's `g`).
    pub fn g<T: Element>(
        &self,
        src: &SymmetricBuffer<T>,
        index: usize,
        pe: usize,
        _stream: &Stream,
    ) -> Result<T> {
        let p = self.element_ptr(src, index, pe)?;
        // SAFETY: as in `p`.
        Ok(unsafe { p.read_volatile() })
    }

    /// Completes every outstanding operation of this PE.
    pub fn quiet(&self, _stream: &Stream) -> Result<()> {
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// Orders this PE's operations to each peer: those before the fence are
    /// delivered before those after it.
    pub fn fence(&self, _stream: &Stream) -> Result<()> {
        fence(Ordering::SeqCst);
        Ok(())
    }

    fn signal_cell<'s>(
        &self,
        signal: &'s SymmetricBuffer<u64>,
        index: usize,
        pe: usize,
    ) -> Result<&'s AtomicU64> {
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
        let cell = self.signal_cell(signal, sig_index, pe)?;
        self.put(dst, src, pe, stream)?;
        // SeqCst (a release at least): the data written above happens-before
        // any acquire load that sees the new signal value.
        match op {
            SignalOp::Set => cell.store(value, Ordering::SeqCst),
            SignalOp::Add => {
                cell.fetch_add(value, Ordering::SeqCst);
            }
        }
        Ok(())
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
        _stream: &Stream,
    ) -> Result<()> {
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
    pub fn signal_fetch(
        &self,
        signal: &SymmetricBuffer<u64>,
        index: usize,
        _stream: &Stream,
    ) -> Result<u64> {
        let me = self.inner.me;
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
        _stream: &Stream,
    ) -> Result<u64> {
        let me = self.inner.me;
        let cell = self.signal_cell(signal, index, me)?;
        let mut seen = 0;
        self.inner.host.wait_for_anyone(
            || {
                // Acquire: pairs with the release of the signalling put.
                seen = cell.load(Ordering::Acquire);
                cmp.holds(seen, value)
            },
            &|| format!("waiting for signal[{index}] {cmp:?} {value}"),
        )?;
        Ok(seen)
    }

    fn atomic<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        pe: usize,
        op: AtomicOp<T>,
    ) -> Result<T> {
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
        _s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, AtomicOp::Fetch)
    }

    /// Writes `pe`'s `buf[index]` atomically.
    pub fn atomic_set<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        _s: &Stream,
    ) -> Result<()> {
        self.atomic(buf, index, pe, AtomicOp::Set(value)).map(drop)
    }

    /// Swaps in `value`; returns the old value.
    pub fn atomic_swap<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        _s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, AtomicOp::Swap(value))
    }

    /// Writes `new` if the element equals `current`; returns the old value.
    pub fn atomic_compare_swap<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        current: T,
        new: T,
        pe: usize,
        _s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, AtomicOp::CompareSwap { current, new })
    }

    /// Adds `value` (wrapping); returns the old value.
    pub fn atomic_fetch_add<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        _s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, AtomicOp::FetchAdd(value))
    }

    /// Adds `value` (wrapping).
    pub fn atomic_add<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        _s: &Stream,
    ) -> Result<()> {
        self.atomic(buf, index, pe, AtomicOp::FetchAdd(value))
            .map(drop)
    }

    /// Bitwise and; returns the old value.
    pub fn atomic_fetch_and<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        _s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, AtomicOp::FetchAnd(value))
    }

    /// Bitwise or; returns the old value.
    pub fn atomic_fetch_or<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        _s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, AtomicOp::FetchOr(value))
    }

    /// Bitwise xor; returns the old value.
    pub fn atomic_fetch_xor<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        value: T,
        pe: usize,
        _s: &Stream,
    ) -> Result<T> {
        self.atomic(buf, index, pe, AtomicOp::FetchXor(value))
    }
}
