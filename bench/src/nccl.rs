//! NCCL's rows: a communicator over the world through cudarc's bindings,
//! the collectives on plain device buffers, and the grouped sends and
//! receives of all_to_all and the MoE ops.

use crate::args::Dtype;
use crate::bench::Bench;
use crate::data::{seed, Pattern, Shape, Value};
use crate::harness::Case;
use crate::ops::{Imp, Op, ROOT};
use crate::report::{note, Row};
use crate::Res;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t};
use shmem::{bf16, f16};
use std::sync::Arc;

impl Bench<'_> {
    /// NCCL's rows of `ops`, on plain device buffers of the same sizes.
    pub(super) fn nccl(&self, ops: &[Op]) -> Res<Vec<Row>> {
        let Some(nccl) = Nccl::new(self)? else { return Ok(Vec::new()) };
        let mut rows = Vec::new();
        let (moe_ops, ops): (Vec<Op>, Vec<Op>) = ops.iter().partition(|op| op.is_moe());
        for op in ops {
            for dtype in self.dtypes(op) {
                rows.extend(match dtype {
                    Dtype::F32 => self.nccl_collective::<f32>(&nccl, op)?,
                    Dtype::F16 => self.nccl_collective::<f16>(&nccl, op)?,
                    Dtype::Bf16 => self.nccl_collective::<bf16>(&nccl, op)?,
                });
            }
        }
        if !moe_ops.is_empty() {
            rows.extend(self.moe_nccl(&nccl, &moe_ops)?);
        }
        Ok(rows)
    }

    fn nccl_collective<T: Value>(&self, nccl: &Nccl, op: Op) -> Res<Vec<Row>> {
        let (me, n) = (self.ctx.my_pe(), self.ctx.n_pes());
        let mut rows = Vec::new();
        let elem = size_of::<T>();
        let Some(max) = self.largest(op, elem) else { return Ok(rows) };
        let src = DeviceBuf::new(&nccl.stream, max.src * elem)?;
        let dst = DeviceBuf::new(&nccl.stream, max.dst * elem)?;
        for &b in &self.sizes {
            let Some(shape) = Shape::of(op, b, elem, n) else { continue };
            if !self.runs(Imp::Nccl, op, shape.bytes) {
                continue;
            }
            let pattern = Pattern::new::<T>(n, seed(op, T::NAME, shape.bytes))?;
            src.write(&pattern.input::<T>(me, shape.src))?;
            let want = pattern.expected::<T>(op, shape, me);
            let case = Case {
                op,
                imp: Imp::Nccl,
                dtype: Some(T::NAME),
                bytes: shape.bytes,
                run: &|| nccl.enqueue(op, T::NCCL, elem, &dst, &src, shape),
                poison: &|| dst.poison(shape.dst * elem),
                read: &|| dst.read::<T>(shape.dst),
                want: &want,
                moe: None,
                splits: None,
                matmul: None,
                layer: None,
            };
            self.measure(&case, &mut rows)?;
        }
        Ok(rows)
    }
}

/// Plain device memory, for NCCL's rows.
pub(super) struct DeviceBuf {
    mem: CudaSlice<u8>,
    stream: Arc<CudaStream>,
}

impl DeviceBuf {
    pub(super) fn new(stream: &Arc<CudaStream>, bytes: usize) -> Res<DeviceBuf> {
        Ok(DeviceBuf { mem: stream.alloc_zeros::<u8>(bytes.max(1))?, stream: stream.clone() })
    }

    fn fits(&self, bytes: usize) -> Res {
        match bytes <= self.mem.len() {
            true => Ok(()),
            false => Err(format!("{bytes} bytes do not fit in a buffer of {}", self.mem.len()).into()),
        }
    }

    fn addr(&self) -> u64 {
        // Event tracking is off (see `Nccl::new`): the guard records nothing.
        self.mem.device_ptr(&self.stream).0
    }

    pub(super) fn write<T: Value>(&self, data: &[T]) -> Res {
        self.fits(size_of_val(data))?;
        // SAFETY: the copy fits (checked above) and is complete before `data` can go.
        unsafe { cudarc::driver::result::memcpy_htod_async(self.addr(), data, self.stream.cu_stream())? };
        Ok(self.stream.synchronize()?)
    }

    pub(super) fn read<T: Value>(&self, len: usize) -> Res<Vec<T>> {
        self.fits(len * size_of::<T>())?;
        let mut out = vec![T::POISON; len];
        // SAFETY: the copy fits (checked above) and is complete before `out` is used.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut out, self.addr(), self.stream.cu_stream())? };
        self.stream.synchronize()?;
        Ok(out)
    }

    pub(super) fn poison(&self, bytes: usize) -> Res {
        self.fits(bytes)?;
        // SAFETY: within the allocation (checked above), ordered on its stream.
        unsafe { cudarc::driver::result::memset_d8_async(self.addr(), 0xFF, bytes, self.stream.cu_stream())? };
        Ok(())
    }
}

/// An NCCL communicator over the world on the bench's stream: cudarc's
/// bindings to the box's libnccl, through its `result` layer, whose
/// run-time dtype takes bf16 without cudarc's `f16` feature.
pub(super) struct Nccl {
    comm: ncclComm_t,
    pub(super) stream: Arc<CudaStream>,
    n: usize,
}

impl Nccl {
    /// Every PE joins; `None` where the box has no libnccl.
    ///
    /// # Collective
    fn new(b: &Bench<'_>) -> Res<Option<Nccl>> {
        use cudarc::nccl::{result, sys};
        let (me, n) = (b.ctx.my_pe(), b.ctx.n_pes());
        // SAFETY: only tries to open the library.
        if !unsafe { sys::is_culib_present() } {
            if me == 0 {
                note("no libnccl found: NCCL rows skipped");
            }
            return Ok(None);
        }
        // NCCL's unique id travels through a symmetric buffer.
        let id_buf = b.ctx.alloc_zeroed::<u64>(16)?;
        if me == 0 {
            let id = result::get_uniqueid().map_err(|e| format!("ncclGetUniqueId: {:?}", e.0))?;
            let words: Vec<u64> =
                id.internal.chunks(8).map(|c| u64::from_le_bytes(std::array::from_fn(|i| c[i] as u8))).collect();
            id_buf.copy_from_host(&words, &b.s)?;
        }
        b.ctx.barrier_all(&b.s)?;
        let mut words = [0u64; 16];
        for (i, w) in words.iter_mut().enumerate() {
            *w = b.ctx.g(&id_buf, i, 0, &b.s)?;
        }
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        for (i, c) in id.internal.iter_mut().enumerate() {
            *c = (words[i / 8] >> (8 * (i % 8))) as u8 as std::ffi::c_char;
        }
        let stream = b.cuda()?.clone();
        // SAFETY: the NCCL buffers are used on this one stream only, so
        // they need no cudarc events (events of other streams would also
        // break graph capture). shmem's own rows are all done.
        unsafe { b.ctx.cuda_context().ok_or("gpu backend")?.disable_event_tracking() };
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: every PE passes the same id and world size and its own rank.
        unsafe { result::comm_init_rank(comm.as_mut_ptr(), n as i32, id, me as i32) }
            .map_err(|e| format!("ncclCommInitRank: {:?}", e.0))?;
        // SAFETY: written by the successful call above. Never destroyed: the
        // bench exits right after, and a communicator left in an error
        // state can crash on destroy.
        let comm = unsafe { comm.assume_init() };
        Ok(Some(Nccl { comm, stream, n }))
    }

    /// Enqueues one `op` of `shape` (elements of `dtype`, `elem` bytes each).
    fn enqueue(
        &self,
        op: Op,
        dtype: ncclDataType_t,
        elem: usize,
        dst: &DeviceBuf,
        src: &DeviceBuf,
        shape: Shape,
    ) -> Res {
        use cudarc::nccl::result::{self as nccl, NcclStatus};
        use cudarc::nccl::sys::{cudaStream_t, ncclRedOp_t::ncclSum};
        use std::ffi::c_void;
        if op == Op::AllToAll {
            // Block p of the source to PE p, block p of the destination from PE p.
            let c = shape.dst / self.n;
            let blocks: Vec<(usize, usize)> = (0..self.n).map(|p| (p * c, c)).collect();
            return self.send_recv(op, dtype, elem, dst, src, &blocks, &blocks);
        }
        src.fits(shape.src * elem)?;
        dst.fits(shape.dst * elem)?;
        let (s, d) = (src.addr(), dst.addr());
        let (comm, cu) = (self.comm, self.stream.cu_stream() as cudaStream_t);
        // SAFETY: both buffers hold the counts passed (checked above), live
        // until the stream is done with them (the case outlives its runs),
        // and every PE enqueues the same operations in the same order.
        let status = unsafe {
            match op {
                Op::AllReduce => {
                    nccl::all_reduce(s as *const c_void, d as *mut c_void, shape.dst, dtype, ncclSum, comm, cu)
                }
                Op::AllGather => nccl::all_gather(s as *const c_void, d as *mut c_void, shape.src, dtype, comm, cu),
                Op::ReduceScatter => {
                    nccl::reduce_scatter(s as *const c_void, d as *mut c_void, shape.dst, dtype, ncclSum, comm, cu)
                }
                Op::Broadcast => {
                    nccl::broadcast(s as *const c_void, d as *mut c_void, shape.dst, dtype, ROOT as i32, comm, cu)
                }
                _ => Ok(NcclStatus::Success),
            }
        };
        status.map(drop).map_err(|e| format!("NCCL {}: {:?}", op.name(), e.0).into())
    }

    /// One fused group of sends and receives, as `op` (all_to_all and,
    /// with splits, PyTorch's `all_to_all_single`): `send[p]` and `recv[p]`
    /// are (first element, elements) of `src` to PE `p` and of `dst` from
    /// PE `p`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_recv(
        &self,
        op: Op,
        dtype: ncclDataType_t,
        elem: usize,
        dst: &DeviceBuf,
        src: &DeviceBuf,
        send: &[(usize, usize)],
        recv: &[(usize, usize)],
    ) -> Res {
        use cudarc::nccl::result as nccl;
        use cudarc::nccl::sys::cudaStream_t;
        use std::ffi::c_void;
        if send.len() != self.n || recv.len() != self.n {
            return Err(format!(
                "NCCL {}: {} sends and {} receives over {} PEs",
                op.name(),
                send.len(),
                recv.len(),
                self.n
            )
            .into());
        }
        src.fits(send.iter().map(|&(at, len)| (at + len) * elem).max().unwrap_or(0))?;
        dst.fits(recv.iter().map(|&(at, len)| (at + len) * elem).max().unwrap_or(0))?;
        let (s, d) = (src.addr(), dst.addr());
        let (comm, cu) = (self.comm, self.stream.cu_stream() as cudaStream_t);
        // SAFETY: both buffers hold every range passed (checked above), live
        // until the stream is done with them (the case outlives its runs),
        // and every PE enqueues the same operations in the same order, with
        // each send's count equal to its peer's receive.
        let status = unsafe {
            let mut sent = nccl::group_start();
            for (p, (&(from, sends), &(to, recvs))) in send.iter().zip(recv).enumerate() {
                let (from, to) = ((from * elem) as u64, (to * elem) as u64);
                sent = sent
                    .and_then(|_| nccl::send((s + from) as *const c_void, sends, dtype, p as i32, comm, cu))
                    .and_then(|_| nccl::recv((d + to) as *mut c_void, recvs, dtype, p as i32, comm, cu));
            }
            // Ended whatever happened, so later calls are not grouped.
            let ended = nccl::group_end();
            sent.and(ended)
        };
        status.map(drop).map_err(|e| format!("NCCL {}: {:?}", op.name(), e.0).into())
    }
}
