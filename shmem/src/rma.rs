//! One-sided communication: put, get, signals and atomics on a peer's copy.
//!
//! On the host backend every operation completes before it returns (the
//! `_nbi` forms too); `quiet` and `fence` are then memory fences. The
//! programs written against them are the programs that run on the GPU
//! backend, where `_nbi` operations complete at `quiet`.

use crate::buffer::{Region, SymSlice, SymmetricBuffer};
use crate::context::{Context, Stream};
use crate::desc::{Signal, Transfer};
use crate::dtype::{AtomicElement, AtomicOp, Element};
use crate::error::{Error, Result};
use crate::traffic::NetDir;

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
        let t = Transfer { put, dst: d.offset, src: s.offset, bytes: d.len * size_of::<T>(), pe };
        self.inner.report(self.inner.backend.transfer(self.inner.me, t, &self.inner.pool, stream.cuda_stream()))
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
        self.inner.report(self.inner.backend.store(pe, off, value, stream.cuda_stream()))
    }

    /// Reads one element of `pe`'s copy of `src` (NVSHMEM's `g`).
    pub fn g<T: Element>(&self, src: &SymmetricBuffer<T>, index: usize, pe: usize, stream: &Stream) -> Result<T> {
        let off = self.element_offset(src, index, pe)?;
        self.inner.net_count(pe, size_of::<T>(), NetDir::Got);
        self.inner.report(self.inner.backend.load(pe, off, stream.cuda_stream()))
    }

    /// Completes every outstanding operation of this PE.
    pub fn quiet(&self, stream: &Stream) -> Result<()> {
        self.inner.report(self.inner.backend.quiet(stream.cuda_stream()))
    }

    /// Orders this PE's operations to each peer: those before the fence are
    /// delivered before those after it.
    pub fn fence(&self, stream: &Stream) -> Result<()> {
        // Quiet is a fence and more.
        self.inner.report(self.inner.backend.quiet(stream.cuda_stream()))
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
        let t = Transfer { put: true, dst: d.offset, src: s.offset, bytes: d.len * size_of::<T>(), pe };
        self.inner.net_count(pe, t.bytes, NetDir::Put);
        self.inner.net_signal(pe);
        let sig = Signal { offset: sig, value, add: op == SignalOp::Add, pe };
        self.inner.report(self.inner.backend.put_signal(self.inner.me, t, sig, &self.inner.pool, stream.cuda_stream()))
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
        let sig = Signal { offset: sig, value, add: op == SignalOp::Add, pe };
        self.inner.report(self.inner.backend.signal(sig, stream.cuda_stream()))
    }

    /// This PE's `signal[index]`.
    pub fn signal_fetch(&self, signal: &SymmetricBuffer<u64>, index: usize, stream: &Stream) -> Result<u64> {
        let me = self.inner.me;
        let off = self.element_offset(signal, index, me)?;
        self.inner.report(self.inner.backend.signal_fetch(me, off, stream.cuda_stream()))
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
        let off = self.element_offset(signal, index, me)?;
        let holds = |seen| cmp.holds(seen, value);
        self.inner.report(self.inner.backend.signal_wait(&self.inner.ctl, me, off, holds, &what, stream.cuda_stream()))
    }

    fn atomic<T: AtomicElement>(
        &self,
        buf: &SymmetricBuffer<T>,
        index: usize,
        pe: usize,
        stream: &Stream,
        op: AtomicOp<T>,
    ) -> Result<T> {
        let off = self.element_offset(buf, index, pe)?;
        self.inner.report(self.inner.backend.atomic(pe, off, op, stream.cuda_stream()))
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
