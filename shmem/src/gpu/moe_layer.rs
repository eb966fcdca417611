//! Launchers of the MoE layer's own kernels (`moe_layer.cu`): local, on
//! the world's view.

use super::abi::{MoeCombine, MoeRoute, TeamSync};
use super::kernel_id::KernelId;
use super::kernels::Kernels;
use super::CUstream;
use crate::dtype::DType;
use crate::error::Result;

/// Most blocks of the gather and the combine: a block a slot (a token).
const MAX_ROW_BLOCKS: usize = 1024;

impl Kernels {
    /// The route kernel (one block), then the gather (a block per slot, up
    /// to [`MAX_ROW_BLOCKS`]).
    pub(crate) fn moe_route(&self, t: TeamSync, r: MoeRoute, s: CUstream) -> Result<()> {
        let slots = (r.max_tokens as usize).saturating_mul(r.top_k as usize);
        // SAFETY: (TeamSync, MoeRoute) as the kernels declare; regions
        // checked by the layer; counts and ids checked on the device.
        unsafe { self.launch_with(KernelId::MoeRoute, 1, 0, t, r, s) }?;
        // SAFETY: as above.
        unsafe { self.launch_with(KernelId::MoeGather, slots.clamp(1, MAX_ROW_BLOCKS), 0, t, r, s) }
    }

    /// The weighted sum of each token's returned rows (f32, f64, f16, bf16).
    pub(crate) fn moe_combine(&self, dtype: DType, t: TeamSync, c: MoeCombine, s: CUstream) -> Result<()> {
        let blocks = (c.max_tokens as usize).clamp(1, MAX_ROW_BLOCKS);
        // SAFETY: (TeamSync, MoeCombine) as the kernels declare; regions checked by the layer.
        unsafe { self.launch_with(KernelId::MoeCombine(dtype), blocks, 0, t, c, s) }
    }
}
