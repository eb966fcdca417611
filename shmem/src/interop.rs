//! cudarc interop: a symmetric buffer seen as cudarc device memory, for
//! users' own kernels and cudarc's copies.
//!
//! The view exists only on the GPU backend: cudarc's `DeviceSlice` must name
//! a CUDA stream, which the host backend does not have.

use crate::buffer::SymmetricBuffer;
use crate::dtype::Element;
use crate::error::{Error, Result};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, LaunchArgs, PushKernelArg, SyncOnDrop};
use std::sync::Arc;

/// This PE's copy of a [`SymmetricBuffer`] as cudarc device memory: a
/// `DevicePtr`/`DevicePtrMut` and a kernel argument (the device pointer).
///
/// Ordering: the view's stream is the context's own; operations on other
/// streams are ordered by the program (stream waits or synchronize), as
/// for any memory NVSHMEM peers may write.
pub struct CudaView<'a, T: Element> {
    buf: &'a SymmetricBuffer<T>,
    addr: u64,
    stream: &'a Arc<CudaStream>,
}

impl<T: Element> SymmetricBuffer<T> {
    /// This PE's copy as cudarc device memory (GPU backend only).
    pub fn cuda_view(&self) -> Result<CudaView<'_, T>> {
        self.check(&self.ctx)?;
        let g = self
            .ctx
            .backend
            .gpu()
            .ok_or_else(|| Error::BackendUnavailable("a CUDA view needs the gpu backend".into()))?;
        Ok(CudaView { buf: self, addr: g.addr(self.offset), stream: g.own_stream() })
    }
}

impl<T: Element> DeviceSlice<T> for CudaView<'_, T> {
    fn len(&self) -> usize {
        self.buf.len()
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl<T: Element> DevicePtr<T> for CudaView<'_, T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (cudarc::driver::sys::CUdeviceptr, SyncOnDrop<'a>) {
        // Nothing to wait for: symmetric memory carries no cudarc events.
        (self.addr, SyncOnDrop::Sync(None))
    }
}

impl<T: Element> DevicePtrMut<T> for CudaView<'_, T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (cudarc::driver::sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.addr, SyncOnDrop::Sync(None))
    }
}

// SAFETY: pushes a pointer to the view's device address, which lives as long
// as the view borrowed for the launch ('b: 'a).
unsafe impl<'a, 'b: 'a, 'c: 'b, T: Element> PushKernelArg<&'b CudaView<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, view: &'b CudaView<'c, T>) -> &mut Self {
        self.arg(&view.addr)
    }
}
