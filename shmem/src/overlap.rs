//! Compute–communication overlap for tensor-parallel layers:
//! [`Team::all_gather_matmul`] and [`Team::matmul_reduce_scatter`].
//!
//! Both split the communication into chunks so that chunk i moves while
//! the GEMM of chunk i − 1 runs (cuBLAS, on the caller's stream). The
//! chunks move on a side stream, either by copy engines (peer
//! `cuMemcpyAsync` through NVLink: no SMs taken from the GEMM) or by a
//! small SM kernel; [`OverlapComm::Sequential`] runs the unfused sequence
//! instead (the collective, then one GEMM; or one GEMM, then the
//! collective), the baseline the others are measured against.
//!
//! ```text
//! all_gather_matmul, 2 PEs, PE 0:   stream    [barrier][GEMM own rows     ][GEMM peer chunk 0][… 1][… 2][… 3][barrier]
//!                                   side                 [copy chunk 0][… 1][… 2][… 3]
//! matmul_reduce_scatter, PE 0:      stream    [barrier][GEMM c0][GEMM c1][GEMM c2][GEMM c3][GEMM own block][barrier][sum]
//!                                   side                        [put c0 ][put c1 ][put c2 ][put c3 ]
//! ```
//!
//! Matrices are row-major. Results equal the unfused sequence's up to the
//! GEMM's own rounding: cuBLAS may sum a row block in another order than
//! the whole matrix (f32 accumulation either way), so 16-bit outputs can
//! differ in the last bit; the tests allow 2⁻⁷ relative for bf16 and 2⁻¹⁰
//! for f16 against an f64 reference.
//!
//! On the host backend the same calls run the collective and a plain
//! (rayon-parallel, f32-accumulating) matmul: the reference.

use crate::buffer::{Region, SymSlice};
use crate::context::Stream;
use crate::control::DESC_WORDS;
use crate::dtype::{DType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::heap::overlap;
use crate::team::{Desc, OpKind, Team};

/// Blocks of the SM copy kernel beside a GEMM: few, so that the GEMM keeps
/// most of the 132 SMs.
const SM_COPY_BLOCKS: usize = 16;
const WAIT: cudarc::driver::sys::CUevent_wait_flags = cudarc::driver::sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;

/// How the communication of an overlapped matmul runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OverlapComm {
    /// No overlap: the collective and one GEMM, one after the other.
    Sequential,
    /// Chunks moved by a small SM kernel on a side stream, beside the GEMMs.
    Sm,
    /// Chunks moved by copy engines on a side stream: no SMs taken from
    /// the GEMMs. Needs every peer over NVLink (otherwise: sequential).
    #[default]
    CopyEngine,
}

/// How an overlapped matmul is cut and moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overlap {
    pub comm: OverlapComm,
    /// Chunks each PE's block is moved in (at least 1; more than its rows
    /// counts as its rows). Need not divide the rows.
    pub chunks: usize,
}

impl Default for Overlap {
    fn default() -> Overlap {
        Overlap { comm: OverlapComm::CopyEngine, chunks: 4 }
    }
}

impl Overlap {
    /// `comm` with the default chunking.
    pub fn new(comm: OverlapComm) -> Overlap {
        Overlap { comm, ..Overlap::default() }
    }
}

/// Elements of the workspace [`Team::matmul_reduce_scatter`] needs for an
/// `m × n` product: a receive and a send slot per PE, each `m / n_pes × n`.
pub const fn reduce_scatter_workspace_len(m: usize, n: usize) -> usize {
    2 * m * n
}

/// Row `r0..r1` of chunk `j` of `c` over `rows` rows (the first `rows % c`
/// chunks one row longer).
fn chunk(rows: usize, c: usize, j: usize) -> (usize, usize) {
    let (q, r) = (rows / c, rows % c);
    let start = j * q + j.min(r);
    (start, start + q + usize::from(j < r))
}

fn supported<T: Element>(op: &'static str) -> Result<()> {
    match T::DTYPE {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        other => Err(Error::UnsupportedOp { op, dtype: other.name() }),
    }
}

/// The checked shapes of a call.
struct Shapes {
    m: usize,
    n: usize,
    k: usize,
}

impl Team {
    /// Gathers every PE's `a_shard` (`m × k`) into `a_out` (`n_pes·m × k`,
    /// PE order) and multiplies it by this PE's `b` (`k × n`) into `out`
    /// (`n_pes·m × n`): `out = all_gather(a_shard) · b`, with the gather's
    /// chunks moving while the GEMM of the rows already here runs.
    ///
    /// `a_shard` may be this PE's own block of `a_out` (in place); `b` and
    /// `out` are this PE's alone (their shapes may differ by PE). f32, f16
    /// and bf16, accumulated in f32.
    ///
    /// # Collective
    #[allow(clippy::too_many_arguments)]
    pub fn all_gather_matmul<'a, 'b, 'c, 'd, T: Element>(
        &self,
        a_out: impl Into<SymSlice<'a, T>>,
        out: impl Into<SymSlice<'b, T>>,
        a_shard: impl Into<SymSlice<'c, T>>,
        b: impl Into<SymSlice<'d, T>>,
        k: usize,
        how: Overlap,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "all_gather_matmul";
        let (a_out, out, a_shard, b) = (a_out.into(), out.into(), a_shard.into(), b.into());
        let np = self.n_pes();
        let me = self.my_pe();
        let elem = size_of::<T>();
        self.check()?;
        let local = (|| {
            supported::<T>(OP)?;
            let (ro, rc, ra, rb) =
                (a_out.region(&self.ctx)?, out.region(&self.ctx)?, a_shard.region(&self.ctx)?, b.region(&self.ctx)?);
            let (m, n) = operand_rows(OP, "a_shard", ra, rb, k, how)?;
            if ro.len != np * m * k || rc.len != np * m * n {
                return Err(Error::LengthMismatch(format!(
                    "{OP}: a_out has {} elements and out {}; {np} PEs × a {m} × {k} shard times b {k} × {n} need \
                     {} and {}",
                    ro.len,
                    rc.len,
                    np * m * k,
                    np * m * n
                )));
            }
            let own_block = ra == Region { offset: ro.offset + me * m * k * elem, len: m * k };
            let clash = overlap(rc, ro, elem)
                || overlap(rc, ra, elem)
                || overlap(rc, rb, elem)
                || overlap(ro, rb, elem)
                || (overlap(ro, ra, elem) && !own_block);
            if clash {
                return Err(Error::Invalid(format!(
                    "{OP}: out, a_out and b must not overlap each other or a_shard (a_shard may be this PE's block \
                     of a_out)"
                )));
            }
            Ok((ro, rc, ra, rb, Shapes { m, n, k }, own_block))
        })();
        let mut desc = Desc::new(OpKind::AllGatherMatmul);
        desc.dtype = Some(T::DTYPE);
        if let Ok((ro, _, ra, _, _, own_block)) = &local {
            desc.args = [
                if *own_block { u64::MAX } else { ra.offset as u64 },
                ra.len as u64,
                ro.offset as u64,
                ro.len as u64,
                k as u64,
            ];
        }
        let rows = self.exchange_call(OP, &desc, local.as_ref().err(), stream)?;
        let (ro, rc, ra, rb, s, own_block) = local?;
        self.agree(&rows)?;
        if !self.fused(how) {
            self.all_gather(a_out, a_shard, stream)?;
            let me = self.ctx.me;
            let on = stream.cuda_stream();
            return self.ctx.backend.gemm::<T>(
                me,
                (ro.offset, rb.offset, rc.offset),
                (np * s.m, s.k, s.n),
                &self.ctx.pool,
                on,
            );
        }
        // The sequential forms report through their collective.
        self.ctx.report(self.gpu_all_gather_matmul::<T>(ro, rc, ra, rb, s, own_block, how, stream))
    }

    /// Multiplies this PE's `a` (`m × k`) by its `b` (`k × n`) and
    /// reduce-scatters the sum over the PEs: `out` (`m / n_pes × n`) gets
    /// block `my_pe` of `Σ_pe a_pe · b_pe`, summed in PE order (f32). Each
    /// peer's block is computed first, in chunks, and sent while the next
    /// chunk's GEMM runs; this PE's own block last.
    ///
    /// `workspace` holds at least [`reduce_scatter_workspace_len`]`(m, n)`
    /// elements (the same on every PE); `m` must be a multiple of `n_pes`.
    /// f32, f16 and bf16.
    ///
    /// # Collective
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_reduce_scatter<'a, 'b, 'c, 'd, T: Element>(
        &self,
        out: impl Into<SymSlice<'a, T>>,
        a: impl Into<SymSlice<'b, T>>,
        b: impl Into<SymSlice<'c, T>>,
        workspace: impl Into<SymSlice<'d, T>>,
        k: usize,
        how: Overlap,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "matmul_reduce_scatter";
        let (out, a, b, ws) = (out.into(), a.into(), b.into(), workspace.into());
        let np = self.n_pes();
        let elem = size_of::<T>();
        self.check()?;
        let local = (|| {
            supported::<T>(OP)?;
            let (rc, ra, rb, rw) =
                (out.region(&self.ctx)?, a.region(&self.ctx)?, b.region(&self.ctx)?, ws.region(&self.ctx)?);
            let (m, n) = operand_rows(OP, "a", ra, rb, k, how)?;
            if m % np != 0 {
                return Err(Error::LengthMismatch(format!("{OP}: a's {m} rows do not split evenly over {np} PEs")));
            }
            if rc.len != m / np * n {
                return Err(Error::LengthMismatch(format!(
                    "{OP}: out has {} elements; block {} × {n} of an {m} × {n} product over {np} PEs needs {}",
                    rc.len,
                    m / np,
                    m / np * n
                )));
            }
            let need = reduce_scatter_workspace_len(m, n);
            if rw.len < need {
                return Err(Error::LengthMismatch(format!(
                    "{OP}: workspace has {} elements, an {m} × {n} product needs {need}",
                    rw.len
                )));
            }
            let rw = Region { offset: rw.offset, len: need };
            let all = [rc, ra, rb, rw];
            if (0..4).any(|i| (i + 1..4).any(|j| (i, j) != (1, 2) && overlap(all[i], all[j], elem))) {
                return Err(Error::Invalid(format!("{OP}: out, a and b must not overlap workspace or each other")));
            }
            Ok((rc, ra, rb, rw, Shapes { m, n, k }))
        })();
        let mut desc = Desc::new(OpKind::MatmulReduceScatter);
        desc.dtype = Some(T::DTYPE);
        if let Ok((_, _, _, rw, s)) = &local {
            desc.args = [rw.offset as u64, rw.len as u64, s.m as u64, s.n as u64, 0];
        }
        let rows = self.exchange_call(OP, &desc, local.as_ref().err(), stream)?;
        let (rc, ra, rb, rw, s) = local?;
        self.agree(&rows)?;
        let partials = SymSlice { buf: ws.buf, start: ws.start, end: ws.start + s.m * s.n };
        if !self.fused(how) {
            let me = self.ctx.me;
            let on = stream.cuda_stream();
            self.ctx.backend.gemm::<T>(me, (ra.offset, rb.offset, rw.offset), (s.m, s.k, s.n), &self.ctx.pool, on)?;
            return self.reduce_scatter(out, partials, ReduceOp::Sum, stream);
        }
        self.ctx.report(self.gpu_matmul_reduce_scatter::<T>(rc, ra, rb, rw, s, how, stream))
    }

    /// The descriptor exchange of an overlapped matmul: every PE's rows,
    /// to check (after this PE's own error) with [`Team::agree`].
    fn exchange_call(
        &self,
        op: &str,
        desc: &Desc,
        err: Option<&Error>,
        stream: &Stream,
    ) -> Result<Vec<[u64; DESC_WORDS]>> {
        if self.ctx.backend.capturing(stream.cuda_stream()) {
            return Err(Error::Invalid(format!("{op} cannot be captured in a CUDA graph")));
        }
        self.exchange(desc, err)
    }

    /// Whether the call takes a fused form: the gpu backend, asked for one,
    /// a team of two or more, every member over NVLink (RMA not forced);
    /// else the collective and one GEMM in sequence.
    fn fused(&self, how: Overlap) -> bool {
        how.comm != OverlapComm::Sequential && self.n_pes() > 1 && self.on_gpu(|t| t.nvlink()).unwrap_or(false)
    }

    #[allow(clippy::too_many_arguments)]
    fn gpu_all_gather_matmul<T: Element>(
        &self,
        ro: Region,
        rc: Region,
        ra: Region,
        rb: Region,
        s: Shapes,
        own_block: bool,
        how: Overlap,
        stream: &Stream,
    ) -> Result<()> {
        let g = self.ctx.backend.gpu().expect("gpu backend");
        let k = g.kernels.as_ref().ok_or_else(crate::gpu::kernels::not_built)?;
        let (np, rank, elem) = (self.n_pes(), self.my_pe(), size_of::<T>());
        let members = &self.state.members;
        let t = k.team(self.state.slot, members, false)?;
        let st = g.stream(stream.cuda_stream());
        let mut guard = g.blas()?;
        let blas = guard.as_mut().expect("made by blas()");
        let (row_bytes, shard_bytes) = (s.k * elem, s.m * s.k * elem);
        let c = how.chunks.min(s.m).max(1);
        let steps = (np - 1) * c;
        let comm = blas.comm.clone();
        let events: Vec<_> = blas.events(g, steps + 1)?.iter().map(|e| e.cu_event()).collect();
        let (cu, ccu) = (st.cu_stream(), comm.cu_stream());
        // Every PE's shard is ready and its a_out free.
        k.barrier(t, cu)?;
        if !own_block {
            // SAFETY: checked regions of this PE's heap, apart.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    g.addr(ro.offset + rank * shard_bytes),
                    g.addr(ra.offset),
                    shard_bytes,
                    cu,
                )?
            };
        }
        // SAFETY: events of this context; the side stream waits for the barrier.
        unsafe {
            cudarc::driver::result::event::record(events[steps], cu)?;
            cudarc::driver::result::stream::wait_event(ccu, events[steps], WAIT)?;
        }
        for step in 1..np {
            let p = (rank + step) % np;
            let from = g.peer_base[members[p]].expect("nvlink checked")
                + if own_block { ro.offset + p * shard_bytes } else { ra.offset } as u64;
            let to = g.addr(ro.offset + p * shard_bytes);
            for j in 0..c {
                let (r0, r1) = chunk(s.m, c, j);
                let (off, bytes) = ((r0 * row_bytes) as u64, (r1 - r0) * row_bytes);
                // SAFETY: rows of member p's shard (its a_shard, or its
                // block of a_out, at the same offset everywhere) into the
                // same rows of this PE's a_out; the barrier made them ready.
                unsafe {
                    match how.comm {
                        OverlapComm::Sm => k.copy_sm(to + off, from + off, bytes, SM_COPY_BLOCKS, ccu)?,
                        _ => cudarc::driver::result::memcpy_dtod_async(to + off, from + off, bytes, ccu)?,
                    }
                    cudarc::driver::result::event::record(events[(step - 1) * c + j], ccu)?;
                }
            }
        }
        let gemm = |r0: usize, r1: usize| {
            // SAFETY: rows r0..r1 of a_out and out, all of b: checked regions.
            unsafe {
                blas.gemm(
                    T::DTYPE,
                    g.addr(ro.offset + r0 * row_bytes),
                    g.addr(rb.offset),
                    g.addr(rc.offset + r0 * s.n * elem),
                    r1 - r0,
                    s.k,
                    s.n,
                    st,
                )
            }
        };
        gemm(rank * s.m, (rank + 1) * s.m)?;
        for step in 1..np {
            let p = (rank + step) % np;
            for j in 0..c {
                let (r0, r1) = chunk(s.m, c, j);
                // SAFETY: an event recorded above on the side stream.
                unsafe { cudarc::driver::result::stream::wait_event(cu, events[(step - 1) * c + j], WAIT)? };
                gemm(p * s.m + r0, p * s.m + r1)?;
            }
        }
        // Peers are done reading this PE's shard once all have passed.
        k.barrier(t, cu)
    }

    #[allow(clippy::too_many_arguments)]
    fn gpu_matmul_reduce_scatter<T: Element>(
        &self,
        rc: Region,
        ra: Region,
        rb: Region,
        rw: Region,
        s: Shapes,
        how: Overlap,
        stream: &Stream,
    ) -> Result<()> {
        let g = self.ctx.backend.gpu().expect("gpu backend");
        let k = g.kernels.as_ref().ok_or_else(crate::gpu::kernels::not_built)?;
        let (np, rank, elem) = (self.n_pes(), self.my_pe(), size_of::<T>());
        let members = &self.state.members;
        let t = k.team(self.state.slot, members, false)?;
        let st = g.stream(stream.cuda_stream());
        let mut guard = g.blas()?;
        let blas = guard.as_mut().expect("made by blas()");
        let m_out = s.m / np;
        let slot_bytes = m_out * s.n * elem;
        let recv = |j: usize| rw.offset + j * slot_bytes;
        let send = |j: usize| rw.offset + (np + j) * slot_bytes;
        let c = how.chunks.min(m_out).max(1);
        let steps = (np - 1) * c;
        let comm = blas.comm.clone();
        let events: Vec<_> = blas.events(g, steps + 1)?.iter().map(|e| e.cu_event()).collect();
        let (cu, ccu) = (st.cu_stream(), comm.cu_stream());
        let gemm = |rows: (usize, usize), to: usize| {
            // SAFETY: rows of a, all of b, into a checked workspace slot.
            unsafe {
                blas.gemm(
                    T::DTYPE,
                    g.addr(ra.offset + rows.0 * s.k * elem),
                    g.addr(rb.offset),
                    g.addr(to),
                    rows.1 - rows.0,
                    s.k,
                    s.n,
                    st,
                )
            }
        };
        // Every PE's receive slots are free (its last sum is done).
        k.barrier(t, cu)?;
        for step in 1..np {
            let p = (rank + step) % np;
            let peer = g.peer_base[members[p]].expect("nvlink checked");
            for j in 0..c {
                let (r0, r1) = chunk(m_out, c, j);
                let off = r0 * s.n * elem;
                gemm((p * m_out + r0, p * m_out + r1), send(p) + off)?;
                let ev = events[(step - 1) * c + j];
                let (to, from, bytes) =
                    (peer + (recv(rank) + off) as u64, g.addr(send(p) + off), (r1 - r0) * s.n * elem);
                // SAFETY: the chunk just computed into this PE's send slot
                // p, into receive slot `rank` of member p (the same offsets
                // everywhere), once the GEMM is done (the event).
                unsafe {
                    cudarc::driver::result::event::record(ev, cu)?;
                    cudarc::driver::result::stream::wait_event(ccu, ev, WAIT)?;
                    match how.comm {
                        OverlapComm::Sm => k.copy_sm(to, from, bytes, SM_COPY_BLOCKS, ccu)?,
                        _ => cudarc::driver::result::memcpy_dtod_async(to, from, bytes, ccu)?,
                    }
                }
            }
        }
        gemm((rank * m_out, (rank + 1) * m_out), recv(rank))?;
        // SAFETY: events of this context: the stream waits for every send.
        unsafe {
            cudarc::driver::result::event::record(events[steps], ccu)?;
            cudarc::driver::result::stream::wait_event(cu, events[steps], WAIT)?;
        }
        // Every peer's sends into this PE are done once all have passed.
        k.barrier(t, cu)?;
        // SAFETY: the np receive slots into out, checked regions.
        unsafe { k.sum_slots(T::DTYPE, g.addr(rc.offset), g.addr(recv(0)), m_out * s.n, m_out * s.n, np, cu) }
    }
}

/// The world team's overlapped matmuls.
impl crate::Context {
    /// [`Team::all_gather_matmul`] over the world.
    ///
    /// # Collective
    #[allow(clippy::too_many_arguments)]
    pub fn all_gather_matmul<'a, 'b, 'c, 'd, T: Element>(
        &self,
        a_out: impl Into<SymSlice<'a, T>>,
        out: impl Into<SymSlice<'b, T>>,
        a_shard: impl Into<SymSlice<'c, T>>,
        b: impl Into<SymSlice<'d, T>>,
        k: usize,
        how: Overlap,
        stream: &Stream,
    ) -> Result<()> {
        self.world().all_gather_matmul(a_out, out, a_shard, b, k, how, stream)
    }

    /// [`Team::matmul_reduce_scatter`] over the world.
    ///
    /// # Collective
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_reduce_scatter<'a, 'b, 'c, 'd, T: Element>(
        &self,
        out: impl Into<SymSlice<'a, T>>,
        a: impl Into<SymSlice<'b, T>>,
        b: impl Into<SymSlice<'c, T>>,
        workspace: impl Into<SymSlice<'d, T>>,
        k: usize,
        how: Overlap,
        stream: &Stream,
    ) -> Result<()> {
        self.world().matmul_reduce_scatter(out, a, b, workspace, k, how, stream)
    }
}

/// (rows of `a`, columns of `b`) of an `a · b` with inner dimension `k`,
/// after checking `how` and that both are whole rows of `k`.
fn operand_rows(op: &str, a_name: &str, a: Region, b: Region, k: usize, how: Overlap) -> Result<(usize, usize)> {
    if how.chunks == 0 {
        return Err(Error::Invalid(format!("{op}: chunks must be at least 1")));
    }
    if k == 0 || a.len % k != 0 || b.len % k != 0 {
        return Err(Error::LengthMismatch(format!(
            "{op}: {a_name} ({} elements) and b ({} elements) must both be whole rows of k = {k}",
            a.len, b.len
        )));
    }
    Ok((a.len / k, b.len / k))
}

#[cfg(test)]
mod tests {
    use super::chunk;

    #[test]
    fn chunks_cover_the_rows_in_order() {
        for rows in 0..40 {
            for c in 1..9 {
                let mut next = 0;
                for j in 0..c {
                    let (a, b) = chunk(rows, c, j);
                    assert_eq!(a, next, "rows {rows} chunks {c}");
                    assert!(b >= a && b - a <= rows.div_ceil(c));
                    next = b;
                }
                assert_eq!(next, rows);
            }
        }
    }
}
