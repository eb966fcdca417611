//! Symmetric buffers: the same allocation on every PE.

use crate::context::{Context, Inner, Stream};
use crate::dtype::Element;
use crate::error::{Error, Result};
pub(crate) use crate::heap::Region;
use crate::team::{Desc, OpKind};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

/// `len` elements of `T` at the same place in every PE's symmetric heap.
///
/// Made by [`Context::alloc`] (collective); freed when dropped, which is
/// collective too: every PE drops its buffers in the same order.
///
/// A symmetric buffer is shared memory: other PEs read and write this PE's
/// copy, so methods take `&self` and the program orders conflicting
/// accesses with barriers, signals or quiet, as with NVSHMEM.
///
/// ```compile_fail
/// # fn f(ctx: &shmem::Context) -> shmem::Result<()> {
/// let s = ctx.stream();
/// let x = ctx.alloc::<f32>(16)?;
/// drop(x);
/// x.copy_to_host(&s)?; // a freed buffer cannot be named
/// # Ok(()) }
/// ```
pub struct SymmetricBuffer<T: Element> {
    pub(crate) ctx: Arc<Inner>,
    /// Byte offset in every PE's heap.
    pub(crate) offset: usize,
    pub(crate) len: usize,
    /// Allocation number, the same on every PE.
    pub(crate) serial: u64,
    _t: PhantomData<T>,
}

impl<T: Element> fmt::Debug for SymmetricBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SymmetricBuffer")
            .field("dtype", &T::DTYPE)
            .field("len", &self.len)
            .field("offset", &self.offset)
            .finish()
    }
}

/// A range of a [`SymmetricBuffer`]; its bounds are checked when it is used.
#[derive(Clone, Copy)]
pub struct SymSlice<'a, T: Element> {
    pub(crate) buf: &'a SymmetricBuffer<T>,
    pub(crate) start: usize,
    pub(crate) end: usize,
}

impl<'a, T: Element> From<&'a SymmetricBuffer<T>> for SymSlice<'a, T> {
    fn from(buf: &'a SymmetricBuffer<T>) -> Self {
        SymSlice { buf, start: 0, end: buf.len }
    }
}

impl<'a, T: Element> SymSlice<'a, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.end.saturating_sub(self.start)
    }

    /// Whether the slice has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// This PE's device address of the slice's first element, for the
    /// user's own kernels (gpu backend; `None` on the host backend).
    pub fn device_ptr(&self) -> Result<Option<u64>> {
        let r = self.region(&self.buf.ctx)?;
        Ok(self.buf.ctx.backend.device_addr(r.offset))
    }

    /// Checks the slice against `ctx` and returns where it lies.
    pub(crate) fn region(&self, ctx: &Inner) -> Result<Region> {
        self.buf.check(ctx)?;
        if self.start > self.end || self.end > self.buf.len {
            return Err(Error::OutOfBounds { start: self.start, end: self.end, len: self.buf.len });
        }
        Ok(Region { offset: self.buf.offset + self.start * size_of::<T>(), len: self.end - self.start })
    }

    /// Copies `data` into this PE's copy of the slice.
    pub fn copy_from_host(&self, data: &[T], stream: &Stream) -> Result<()> {
        let r = self.region(&self.buf.ctx)?;
        if data.len() != r.len {
            return Err(Error::LengthMismatch(format!(
                "copy_from_host: {} host elements into a slice of {}",
                data.len(),
                r.len
            )));
        }
        let ctx = &self.buf.ctx;
        ctx.backend.write_local(ctx.me, r.offset, data, stream.cuda_stream())
    }

    /// Copies this PE's copy of the slice into `out`.
    ///
    /// On the GPU backend it waits for the stream first, and, once it has
    /// copied, fails with a failure the device found in an earlier call
    /// that no call reported yet (see [`crate::Team`]).
    pub fn copy_to_host_into(&self, out: &mut [T], stream: &Stream) -> Result<()> {
        let r = self.read_into(out, stream);
        self.buf.ctx.report(r)
    }

    /// This PE's copy of the slice, as a new vector (reporting as
    /// [`SymSlice::copy_to_host_into`] does).
    pub fn copy_to_host(&self, stream: &Stream) -> Result<Vec<T>> {
        let r = self.read(stream);
        self.buf.ctx.report(r)
    }

    /// [`SymSlice::copy_to_host_into`] without reporting an earlier
    /// failure: for the steps of a call, which reports once it is issued.
    pub(crate) fn read_into(&self, out: &mut [T], stream: &Stream) -> Result<()> {
        let r = self.region(&self.buf.ctx)?;
        if out.len() != r.len {
            return Err(Error::LengthMismatch(format!(
                "copy_to_host: a slice of {} elements into {} host elements",
                r.len,
                out.len()
            )));
        }
        let ctx = &self.buf.ctx;
        ctx.backend.read_local(ctx.me, r.offset, out, stream.cuda_stream())
    }

    /// [`SymSlice::copy_to_host`] without reporting (see [`SymSlice::read_into`]).
    pub(crate) fn read(&self, stream: &Stream) -> Result<Vec<T>> {
        let n = self.region(&self.buf.ctx)?.len;
        let mut v = crate::dtype::zeroed_vec::<T>(n);
        self.read_into(&mut v, stream)?;
        Ok(v)
    }
}

impl<T: Element> SymmetricBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A range of the buffer (checked when used).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> SymSlice<'_, T> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len,
        };
        SymSlice { buf: self, start, end }
    }

    pub(crate) fn check(&self, ctx: &Inner) -> Result<()> {
        if self.ctx.id != ctx.id {
            return Err(Error::Foreign("symmetric buffer"));
        }
        ctx.check_live("symmetric buffer")
    }

    /// Copies `data` (exactly `len()` elements) into this PE's copy.
    pub fn copy_from_host(&self, data: &[T], stream: &Stream) -> Result<()> {
        SymSlice::from(self).copy_from_host(data, stream)
    }

    /// This PE's copy, as a new vector.
    pub fn copy_to_host(&self, stream: &Stream) -> Result<Vec<T>> {
        SymSlice::from(self).copy_to_host(stream)
    }

    /// Fills this PE's copy with `value`.
    pub fn fill(&self, value: T, stream: &Stream) -> Result<()> {
        self.copy_from_host(&vec![value; self.len], stream)
    }

    /// This PE's copy: a host pointer on the host backend, a device pointer
    /// on the GPU backend.
    pub fn local_ptr(&self) -> *mut T {
        self.ctx.backend.local_ptr(self.ctx.me, self.offset).cast()
    }

    /// `pe`'s copy, when this PE can load and store it directly (always on
    /// the host backend; over NVLink on the GPU backend).
    pub fn peer_ptr(&self, pe: usize) -> Option<*mut T> {
        if pe >= self.ctx.n {
            return None;
        }
        self.ctx.backend.peer_ptr(pe, self.offset).map(<*mut u8>::cast)
    }
}

impl<T: Element> Drop for SymmetricBuffer<T> {
    fn drop(&mut self) {
        // Freeing is local bookkeeping: every PE frees the same buffers
        // before its next allocation, so the allocators stay equal; the live
        // sets are compared at that allocation. Memory is reused only by an
        // allocation, which waits for every PE, so no peer still uses it.
        let mut heap = self.ctx.heap.lock().unwrap_or_else(|e| e.into_inner());
        heap.free(self.offset, self.serial);
    }
}

impl Context {
    /// Allocates `len` elements of `T` on every PE; contents unspecified.
    ///
    /// # Collective
    /// Every PE calls it with the same `len` and `T`, with the same buffers
    /// alive (allocated and not yet dropped); otherwise every PE gets
    /// [`Error::CollectiveMismatch`] and nothing is allocated.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<SymmetricBuffer<T>> {
        let world = self.world();
        world.check()?;
        let bytes = len.checked_mul(size_of::<T>());
        let mut heap = self.inner.heap.lock().unwrap_or_else(|e| e.into_inner());
        let mut d = Desc::new(OpKind::Alloc);
        d.dtype = Some(T::DTYPE);
        d.args = [bytes.map_or(u64::MAX, |b| b as u64), heap.allocs, heap.live_count, heap.live_hash, len as u64];
        let too_big = bytes.is_none().then(|| Error::HeapExhausted {
            requested: usize::MAX,
            largest_free: 0,
            heap_size: self.inner.heap_size,
        });
        let rows = world.exchange(&d, too_big.as_ref())?;
        if let Some(e) = too_big {
            return Err(e);
        }
        world.agree(&rows)?;
        // Every PE's allocator is in the same state: the same offset, or the
        // same exhaustion, everywhere.
        let serial = heap.allocs;
        let offset = heap.alloc(bytes.unwrap_or(usize::MAX))?;
        drop(heap);
        Ok(SymmetricBuffer { ctx: self.inner.clone(), offset, len, serial, _t: PhantomData })
    }

    /// Allocates `len` zeroed elements of `T` on every PE.
    ///
    /// # Collective
    /// As [`Context::alloc`]; returns after every PE has zeroed its copy.
    pub fn alloc_zeroed<T: Element>(&self, len: usize) -> Result<SymmetricBuffer<T>> {
        let buf = self.alloc::<T>(len)?;
        let inner = &self.inner;
        inner.backend.zero_local(inner.me, buf.offset, len * size_of::<T>(), None)?;
        // No peer may write into the buffer before this PE has zeroed it.
        self.world().raw_barrier()?;
        Ok(buf)
    }
}
