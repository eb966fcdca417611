//! Launchers of the local kernels of the overlapped matmuls
//! (`coll/overlap.cu`): a copy by SMs and the sum of slots.

use super::abi::{MAX_BLOCKS, THREADS};
use super::kernel_id::{KernelId, Plain};
use super::kernels::Kernels;
use super::module::Grid;
use super::CUstream;
use crate::dtype::DType;
use crate::error::Result;
use std::ffi::c_void;

impl Kernels {
    /// `bytes` from device address `src` to `dst` (either may be a peer's
    /// NVLink mapping) by an SM kernel of `blocks` blocks.
    ///
    /// # Safety
    /// Both ranges are valid for the copy and apart.
    pub(crate) unsafe fn copy_sm(&self, dst: u64, src: u64, bytes: usize, blocks: usize, s: CUstream) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let (mut d, mut f, mut b) = (dst, src, bytes as u64);
        let mut params: [*mut c_void; 3] = [(&raw mut d).cast(), (&raw mut f).cast(), (&raw mut b).cast()];
        // SAFETY: (u64, u64, u64) as the kernel declares; the caller's contract.
        unsafe { self.module.launch(KernelId::Plain(Plain::CopySm), Grid::of(blocks.max(1)), 0, s, &mut params) }
    }

    /// `out[i] = Σ_j slots[j·stride + i]` over `n` slots, in slot order,
    /// for `count` elements of `dtype` (f32, f16, bf16) at device addresses.
    ///
    /// # Safety
    /// `out` holds `count` elements, `slots` `n` slots of `stride` (≥ count).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn sum_slots(
        &self,
        dtype: DType,
        out: u64,
        slots: u64,
        count: usize,
        stride: usize,
        n: usize,
        s: CUstream,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let (mut o, mut sl, mut c, mut st, mut nn) = (out, slots, count as u64, stride as u64, n as i32);
        let mut params: [*mut c_void; 5] = [
            (&raw mut o).cast(),
            (&raw mut sl).cast(),
            (&raw mut c).cast(),
            (&raw mut st).cast(),
            (&raw mut nn).cast(),
        ];
        let blocks = count.div_ceil(THREADS as usize).clamp(1, 4 * MAX_BLOCKS);
        // SAFETY: (u64, u64, u64, u64, int) as the kernel declares; the caller's contract.
        unsafe { self.module.launch(KernelId::SumSlots(dtype), Grid::of(blocks), 0, s, &mut params) }
    }
}
