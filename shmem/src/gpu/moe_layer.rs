//! Launchers of the MoE layer's own kernels (`moe/layer.cu`): local, on
//! the world's view, each in the phase its [`MoeLayer`] names.

use super::abi::{
    MoeLayer, TeamSync, DECODE_MAX_EXPERTS, DECODE_MAX_PAIRS, DECODE_MAX_TOKENS, DECODE_MAX_TOP_K, FP8_QUANTIZE,
    LAYER_CHUNK_BYTES, LAYER_QUANT_CHUNK, LAYER_SHARED_SLOTS, MAX_BLOCKS, RANK_CHUNK, RANK_KEYS, RANK_TOP_K,
};
use super::kernel_id::{KernelId, Plain};
use super::kernels::Kernels;
use super::module::Grid;
use super::CUstream;
use crate::dtype::DType;
use crate::error::Result;

/// Most blocks of the combine: a block a row, or a piece of one.
const MAX_ROW_BLOCKS: usize = 1024;

/// The gather's blocks: where its units fill more than a block an SM,
/// half the kernels' width and up to twice as many blocks (on an SM, two
/// blocks' units in flight where the kernel's registers fit one block of
/// 512 threads; a piece of [`LAYER_CHUNK_BYTES`] is still one 16-byte
/// vector load a thread), at most [`MAX_GATHER_BLOCKS`]; else the whole
/// width, a unit's work over as many threads as can take it.
const NARROW_GATHER_THREADS: u32 = 256;
const MAX_GATHER_BLOCKS: usize = 2048;

/// The blocks of a row kernel over `rows` rows of `bytes` each, a block a
/// piece of `chunk` bytes (as the kernels split them), at most `most`.
fn row_blocks(rows: usize, bytes: i64, chunk: usize, most: usize) -> usize {
    let pieces = usize::try_from(bytes).unwrap_or(0).div_ceil(chunk).max(1);
    rows.saturating_mul(pieces).clamp(1, most)
}

/// The units of the source's gather of `max_tokens` tokens of `top_k`
/// slots: a token each, or beyond [`LAYER_SHARED_SLOTS`] a slot.
pub(crate) fn source_units(max_tokens: usize, top_k: usize) -> usize {
    max_tokens.saturating_mul(if top_k > LAYER_SHARED_SLOTS { top_k } else { 1 })
}

/// The grid of the flat form's route over many blocks (`shmem_moe_rank`
/// and `shmem_moe_stamp`) for `m`'s phase on `n` PEs: a block a chunk of
/// [`RANK_CHUNK`] tokens (phase 0) or of one source's staged rows (phase
/// 1); `None` where that route does not serve (the node-aware form's
/// stages, a top-k or experts a PE beyond its masks), which takes the
/// one-block route.
fn rank_blocks(m: &MoeLayer, n: i32) -> Option<usize> {
    let flat = m.forward_in == 0 && m.view_n == 0 && m.origin == 0;
    let fits = m.top_k as usize <= RANK_TOP_K && m.ne as usize <= RANK_KEYS;
    let chunks = usize::try_from(m.max_tokens).ok()?.div_ceil(RANK_CHUNK);
    (flat && fits).then_some(if m.phase == 0 { chunks } else { chunks * n as usize })
}

/// `u32`s of scratch the flat form's route over many blocks takes for
/// `max_tokens` tokens a PE and `experts_per_pe` on `n` PEs: its five
/// u64 words, then per (chunk, key) a total and a first row, for the
/// receiver's `n × chunks` chunks of `experts_per_pe` keys (the larger
/// side: the source's are `chunks` of `n`).
pub(crate) fn rank_scratch_len(max_tokens: usize, experts_per_pe: usize, n: usize) -> usize {
    10 + 2 * max_tokens.div_ceil(RANK_CHUNK) * n * experts_per_pe
}

/// The decode form's dispatch runs on half the blocks the GPUs hold at
/// once, at least [`DECODE_MIN_BLOCKS`] and at most [`DECODE_MAX_BLOCKS`].
const DECODE_MIN_BLOCKS: usize = 32;
const DECODE_MAX_BLOCKS: usize = 64;

/// From this many tokens a PE (`MoeConfig::max_tokens`) the decode form's
/// combine runs on every block the GPUs hold at once, where no GPU is
/// shared: its time is the partials' stores over NVLink, which more SMs
/// keep more of in flight (at 4 PEs, 128 tokens: 0.87× the time on half
/// of them). Below, the count of more blocks done costs more than it
/// saves (1 token: 1.03×).
const DECODE_WIDE_COMBINE_TOKENS: usize = 32;

/// Whether a layer of `max_tokens` tokens a PE, `top_k` and
/// `experts_per_pe` on `n` PEs fits the decode form's kernels
/// (`moe/decode.cu`): their limits, the team's experts (PEs × experts a PE)
/// among them. The team's links and the GPUs' blocks are the caller's to
/// check ([`Kernels::decode_blocks`]).
pub(crate) fn decode_fits(max_tokens: usize, top_k: usize, experts_per_pe: usize, n: usize) -> bool {
    max_tokens <= DECODE_MAX_TOKENS
        && top_k <= DECODE_MAX_TOP_K
        && experts_per_pe <= DECODE_MAX_EXPERTS
        && n.saturating_mul(experts_per_pe) <= DECODE_MAX_PAIRS
}

/// Whether the decode form's combine of `max_tokens` tokens a PE, rows of
/// `row_bytes`, may send its partials in lines on a world of `n` PEs
/// (`MoeLayer::lines`, `decode_combine_lines` in moe/decode.cu): a head
/// line and a member's partials for one source (at most `max_tokens`
/// rows, each from a fresh line) within one sender's low-latency buffer.
pub(crate) fn combine_lines_fit(n: usize, max_tokens: usize, row_bytes: usize) -> bool {
    let room = crate::algo::low_latency_buffer_bytes(n) / super::abi::LINE_BYTES;
    let lines = max_tokens.saturating_mul(row_bytes.div_ceil(super::abi::LINE_DATA_BYTES_WIDE));
    lines.saturating_add(1) <= room
}

/// Whether the decode form's dispatch of `max_tokens` tokens a PE, rows
/// of `row_bytes` in the native format, `experts_per_pe` experts a PE, may
/// send its rows in lines on a world of `n` PEs (`decode_dispatch_lines`
/// in moe/decode.cu): the head (`1 + experts_per_pe` words) and this PE's
/// rows for one member (at most `max_tokens` records, each a metadata
/// line and the row's lines) within one sender's low-latency buffer.
pub(crate) fn dispatch_lines_fit(n: usize, max_tokens: usize, row_bytes: usize, experts_per_pe: usize) -> bool {
    let room = crate::algo::low_latency_buffer_bytes(n) / super::abi::LINE_BYTES;
    let head = (8 * (1 + experts_per_pe)).div_ceil(super::abi::LINE_DATA_BYTES_WIDE);
    let record = 1 + row_bytes.div_ceil(super::abi::LINE_DATA_BYTES_WIDE);
    max_tokens.saturating_mul(record).saturating_add(head) <= room
}

/// The blocks a kernel whose blocks wait on one another may take where
/// `resident` are resident at once (a block an SM) and kernels waiting on
/// the MoE layer's arrivals must find room beside it: half, up to
/// [`DECODE_MAX_BLOCKS`].
fn beside_waiters(resident: usize) -> usize {
    (resident / 2).min(DECODE_MAX_BLOCKS)
}

/// The grid of the decode form's phase `phase` for `max_tokens` tokens a
/// PE, where `resident` blocks are resident at once on every PE's GPU and
/// `shared_gpu` says whether some GPU holds two PEs: the dispatch's
/// [`beside_waiters`] (`None` below [`DECODE_MIN_BLOCKS`]); the combine's
/// the same, or from [`DECODE_WIDE_COMBINE_TOKENS`] every resident block
/// where no GPU is shared (nothing waits on the combine as the experts
/// wait on the dispatch's arrivals, and two PEs of a GPU would not both
/// fit). The same on every PE, as each member counts the blocks of each
/// operation; every block resident at once, as each waits for every
/// member's blocks.
fn decode_grid(resident: usize, shared_gpu: bool, phase: i32, max_tokens: i64) -> Option<usize> {
    let dispatch = beside_waiters(resident);
    if dispatch < DECODE_MIN_BLOCKS {
        return None;
    }
    let wide = phase == 1 && !shared_gpu && max_tokens >= DECODE_WIDE_COMBINE_TOKENS as i64;
    Some(if wide { resident.max(dispatch) } else { dispatch })
}

impl Kernels {
    /// The decode form's dispatch grid ([`decode_grid`] of phase 0), on
    /// the blocks every PE's GPU holds at once (agreed at start-up);
    /// `None` where the GPUs hold too few.
    pub(crate) fn decode_blocks(&self) -> Option<usize> {
        decode_grid(self.resident_blocks, self.shared_gpu, 0, 0)
    }

    /// The decode form's kernel for `dtype` (its combine's; the dispatch
    /// moves bytes), phase 0 the dispatch and 1 the combine, on
    /// [`decode_grid`] blocks; in lines (either phase) on at most
    /// [`MAX_BLOCKS`], the low-latency epoch counters a block each.
    pub(crate) fn moe_decode(&self, dtype: DType, t: TeamSync, m: MoeLayer, s: CUstream) -> Result<()> {
        let blocks = decode_grid(self.resident_blocks, self.shared_gpu, m.phase, m.max_tokens).ok_or_else(|| {
            crate::error::Error::Invalid("MoeAllToAll: the decode form needs more resident blocks".into())
        })?;
        let blocks = if m.lines != 0 { blocks.min(MAX_BLOCKS) } else { blocks };
        let m = MoeLayer { error: self.a2av_error.device, ..m };
        // SAFETY: (TeamSync, MoeLayer) as the kernels declare; regions
        // checked by the layer, which allocated the decode form's words
        // and views; counts and ids checked on the device.
        unsafe { self.launch_with(KernelId::MoeDecode(dtype), blocks, 0, t, m, s) }
    }

    /// The route (the flat form's over many blocks where
    /// [`rank_blocks`] serves: in one launch where its grid fits beside
    /// the kernels that wait on the arrivals ([`beside_waiters`]), as the
    /// decode form's dispatch does; else the one-block kernel), then the
    /// gather
    /// (a block per piece of one of `rows` units: the source's
    /// [`source_units`], the forwarder's slots or the staged rows).
    pub(crate) fn moe_route(&self, t: TeamSync, m: MoeLayer, rows: usize, s: CUstream) -> Result<()> {
        // SAFETY: (TeamSync, MoeLayer) as the kernels declare; regions
        // checked by the layer (its scratch sized by `rank_scratch_len` and
        // zeroed at allocation); counts and ids checked on the device.
        unsafe {
            match rank_blocks(&m, t.n) {
                Some(blocks) if blocks <= beside_waiters(self.resident_blocks) => {
                    self.launch_with(KernelId::Plain(Plain::MoeRankStamp), blocks, 0, t, m, s)?;
                }
                Some(blocks) => {
                    self.launch_with(KernelId::Plain(Plain::MoeRank), blocks, 0, t, m, s)?;
                    self.launch_with(KernelId::Plain(Plain::MoeStamp), blocks, 0, t, m, s)?;
                }
                None => self.launch_with(KernelId::Plain(Plain::MoeRoute), 1, 0, t, m, s)?,
            }
        }
        // The source's gather quantizing to FP8 takes smaller pieces.
        let quantizing = m.phase == 0 && m.fp8 == FP8_QUANTIZE && m.forward_in == 0;
        let chunk = if quantizing { LAYER_QUANT_CHUNK } else { LAYER_CHUNK_BYTES };
        let blocks = row_blocks(rows, m.data_bytes, chunk, MAX_GATHER_BLOCKS);
        let threads = if blocks > self.resident_blocks { NARROW_GATHER_THREADS } else { super::abi::THREADS };
        let grid = Grid { blocks, threads };
        // SAFETY: as above.
        unsafe { self.launch_in(KernelId::Plain(Plain::MoeGather), grid, 0, t, m, s) }
    }

    /// The node-aware form's agreement over the world (`shmem_moe_agree`,
    /// one block): `t` is the world's view agreeing on the call, and the
    /// verdict goes to `m.state`'s second word, which the call's
    /// exchanges read ([`super::abi::A2av::skip_if`]).
    pub(crate) fn moe_agree(&self, t: TeamSync, m: MoeLayer, s: CUstream) -> Result<()> {
        // SAFETY: (TeamSync, MoeLayer) as the kernel declares; it writes
        // the agreement's state and record, and `m.state`'s second word
        // (the layer's buffer of two i64s).
        unsafe { self.launch_with(KernelId::Plain(Plain::MoeAgree), 1, 0, t, m, s) }
    }

    /// The combine kernel (f32, f64, f16, bf16): a block per piece of a
    /// staged row or token, `rows` at most.
    pub(crate) fn moe_combine(&self, dtype: DType, t: TeamSync, m: MoeLayer, rows: usize, s: CUstream) -> Result<()> {
        let blocks = row_blocks(rows, m.hidden * dtype.size() as i64, LAYER_CHUNK_BYTES, MAX_ROW_BLOCKS);
        // SAFETY: (TeamSync, MoeLayer) as the kernels declare; regions checked by the layer.
        unsafe { self.launch_with(KernelId::MoeCombine(dtype), blocks, 0, t, m, s) }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        beside_waiters, combine_lines_fit, decode_fits, decode_grid, dispatch_lines_fit, rank_blocks, rank_scratch_len,
        MoeLayer,
    };

    /// The decode form's grids on 132 SMs: the dispatch on half of them
    /// (at most 64); the combine on every one from 32 tokens a PE, unless
    /// a GPU holds two PEs; none where the GPUs hold too few blocks. The
    /// route in one launch takes the dispatch's room.
    #[test]
    fn decode_grids_leave_room_for_the_waiters() {
        assert_eq!(decode_grid(132, false, 0, 256), Some(64));
        assert_eq!(decode_grid(132, false, 1, 256), Some(132));
        assert_eq!(decode_grid(132, false, 1, 32), Some(132));
        assert_eq!(decode_grid(132, false, 1, 31), Some(64));
        assert_eq!(decode_grid(132, true, 1, 256), Some(64));
        assert_eq!(decode_grid(116, true, 0, 256), Some(58));
        assert_eq!(decode_grid(63, false, 1, 256), None);
        assert_eq!(beside_waiters(132), 64);
        assert_eq!(beside_waiters(100), 50);
    }

    /// 7168 bf16 (128 lines of 112 bytes a row): a head line and 131
    /// tokens' partials fit a sender's 16896 lines in worlds of up to 8
    /// PEs, 132 do not; larger worlds have 2560 lines a sender.
    #[test]
    fn combine_lines_fit_one_senders_buffer() {
        let row = 7168 * 2;
        assert!(combine_lines_fit(4, 1, row));
        assert!(combine_lines_fit(8, 131, row));
        assert!(!combine_lines_fit(8, 132, row));
        assert!(combine_lines_fit(9, 19, row));
        assert!(!combine_lines_fit(9, 20, row));
        assert!(combine_lines_fit(2, 256, 7168));
    }

    /// 7168 bf16: records of 129 lines; 130 tokens and a head of one line
    /// (13 words) or of three (32 experts a PE) fit 16896 lines, 131 do
    /// not.
    #[test]
    fn dispatch_lines_fit_one_senders_buffer() {
        let row = 7168 * 2;
        assert!(dispatch_lines_fit(8, 130, row, 12));
        assert!(dispatch_lines_fit(8, 130, row, 32));
        assert!(!dispatch_lines_fit(8, 131, row, 8));
        assert!(dispatch_lines_fit(4, 1, row, 8));
    }

    /// The decode form takes the route's rank tables' limit (PEs × experts
    /// a PE) and the per-PE limits, and nothing on PEs × tokens.
    #[test]
    fn decode_fits_the_kernels_tables() {
        assert!(decode_fits(256, 8, 32, 16));
        assert!(!decode_fits(256, 8, 32, 17));
        assert!(decode_fits(256, 8, 8, 64));
        assert!(!decode_fits(257, 8, 8, 4));
        assert!(!decode_fits(256, 9, 8, 4));
        assert!(!decode_fits(256, 8, 33, 4));
    }

    /// The route over many blocks serves the flat form within its masks,
    /// a block a chunk of 512 tokens (phase 0) or of one source's staged
    /// rows (phase 1), and its scratch holds both sides' tables.
    #[test]
    fn rank_blocks_serve_the_flat_form_within_the_masks() {
        let m = MoeLayer { max_tokens: 1100, top_k: 8, ne: 64, ..MoeLayer::default() };
        assert_eq!(rank_blocks(&m, 4), Some(3));
        assert_eq!(rank_blocks(&MoeLayer { phase: 1, ..m }, 4), Some(12));
        assert_eq!(rank_blocks(&MoeLayer { max_tokens: 512, ..m }, 4), Some(1));
        assert_eq!(rank_blocks(&MoeLayer { top_k: 9, ..m }, 4), None);
        assert_eq!(rank_blocks(&MoeLayer { ne: 65, ..m }, 4), None);
        assert_eq!(rank_blocks(&MoeLayer { origin: 1, ..m }, 4), None);
        assert_eq!(rank_blocks(&MoeLayer { forward_in: 64, ..m }, 4), None);
        assert_eq!(rank_blocks(&MoeLayer { view_n: 8, phase: 1, ..m }, 4), None);
        // Five u64 words, then a total and a first row per (chunk, key):
        // the receiver's 4 × 3 chunks of 64 experts, more than the source's
        // 3 chunks of 4 destinations.
        assert_eq!(rank_scratch_len(1100, 64, 4), 10 + 2 * 12 * 64);
    }
}
