//! shmem's rows of put and get, and their reference: a peer copy (GPU)
//! or a memcpy (host).

use crate::bench::Bench;
use crate::data::{seed, Pattern};
use crate::harness::Case;
use crate::ops::{Imp, Op};
use crate::report::{note, Row};
use crate::Res;
use shmem::SymmetricBuffer;
use std::hint::black_box;

impl Bench<'_> {
    /// PE 0 puts `bytes / 4` u32 into PE 1's buffer, and gets as many from
    /// it (PE 0 alone in a world of one), with the memcpy reference rows.
    pub(super) fn put_get(&self) -> Res<Vec<Row>> {
        let (me, n) = (self.ctx.my_pe(), self.ctx.n_pes());
        let peer = 1 % n;
        let max = *self.sizes.last().expect("sizes") / 4;
        let src = self.ctx.alloc::<u32>(max)?;
        let dst = self.ctx.alloc::<u32>(max)?;
        // The host memcpy's buffers, made on first use. Non-zero contents:
        // a zeroed vector may read from the kernel's shared zero page.
        let mut host = None::<(Vec<u8>, Vec<u8>)>;
        let mut rows = Vec::new();
        for &b in &self.sizes {
            let len = b / 4;
            for op in [Op::Put, Op::Get].into_iter().filter(|&op| self.selected(op)) {
                let pattern = Pattern::new::<u32>(n, seed(op, "u32", b))?;
                src.slice(..len).copy_from_host(&pattern.input(me, len), &self.s)?;
                // PE `checker` holds the result: PE 0's data at the peer, or
                // the peer's data at PE 0.
                let (checker, want) = match op {
                    Op::Put => (peer, pattern.input::<u32>(0, len)),
                    _ => (0, pattern.input::<u32>(peer, len)),
                };
                let transfer = || match op {
                    Op::Put => Ok(self.ctx.put(dst.slice(..len), src.slice(..len), peer, &self.s)?),
                    _ => Ok(self.ctx.get(dst.slice(..len), src.slice(..len), peer, &self.s)?),
                };
                let case = Case {
                    op,
                    imp: Imp::Shmem,
                    dtype: Some("u32"),
                    bytes: b,
                    run: &transfer,
                    poison: &|| self.poison(&dst, len),
                    read: &|| Ok(dst.slice(..len).copy_to_host(&self.s)?),
                    want: &want,
                    moe: None,
                    splits: None,
                    matmul: None,
                    layer: None,
                };
                // PE 0 transfers, timed or not (untimed: counting its bytes
                // to and from other nodes); the barrier makes the transfer
                // complete and visible at the checker.
                let net = std::cell::Cell::new(0);
                let check = |time: bool| -> Res<(bool, Option<f64>)> {
                    let done = match (me, time) {
                        (0, true) => self.time(b, || Ok(()), || (case.run)()).map(Some),
                        (0, false) => (|| {
                            let before = self.ctx.net_traffic(&self.s)?;
                            (case.run)()?;
                            net.set(self.ctx.net_traffic(&self.s)?.since(&before).bytes());
                            Ok(None)
                        })(),
                        _ => Ok(None),
                    };
                    self.ctx.barrier_all(&self.s)?;
                    let (t, got) = match done {
                        Ok(t) if me == checker => (t, case.compare()),
                        Ok(t) => (t, Ok(None)),
                        Err(e) => (None, Err(e)),
                    };
                    Ok((self.settle(&case, false, got)?, t))
                };
                if self.runs(Imp::Shmem, op, b) {
                    (case.poison)()?;
                    self.ctx.barrier_all(&self.s)?;
                    if check(false)?.0 {
                        let net_pes = Some(self.gather_net(net.get())?);
                        if let (true, Some(t)) = check(true)? {
                            self.keep(&mut rows, Row { net_pes, ..case.row(false, t) })?;
                        }
                    }
                }
                if self.runs(Imp::Memcpy, op, b) {
                    let t = if me == 0 { self.memcpy(op, &src, &dst, b, &mut host) } else { Ok(0.0) };
                    self.ctx.barrier_all(&self.s)?;
                    match t {
                        Ok(t) if me == 0 => {
                            self.keep(&mut rows, Row { imp: Imp::Memcpy, ..case.row(false, t) })?;
                        }
                        Ok(_) => {}
                        Err(e) => note(format_args!("{} memcpy {b} B skipped: {e}", op.name())),
                    }
                }
            }
        }
        Ok(rows)
    }

    /// The reference of a put or get of `b` bytes: on the GPU backend a
    /// copy-engine copy to (put) or from (get) the peer's memory through
    /// its NVLink address, the peer-copy ceiling; on the host backend a
    /// memcpy between two vectors of this process. PE 0 alone.
    fn memcpy(
        &self,
        op: Op,
        src: &SymmetricBuffer<u32>,
        dst: &SymmetricBuffer<u32>,
        b: usize,
        host: &mut Option<(Vec<u8>, Vec<u8>)>,
    ) -> Res<f64> {
        let peer = 1 % self.ctx.n_pes();
        if let Some(stream) = self.s.cuda_stream() {
            let unreachable = || "the peer is not reachable over NVLink";
            let (to, from) = match op {
                Op::Put => (dst.peer_ptr(peer).ok_or_else(unreachable)? as u64, src.local_ptr() as u64),
                _ => (dst.local_ptr() as u64, src.peer_ptr(peer).ok_or_else(unreachable)? as u64),
            };
            let copy = || {
                // SAFETY: both are the first `b` bytes of live symmetric
                // buffers of at least that size.
                unsafe { cudarc::driver::result::memcpy_dtod_async(to, from, b, stream.cu_stream())? };
                Ok(())
            };
            return self.time(b, || Ok(()), copy);
        }
        let max = *self.sizes.last().expect("sizes");
        let (from, to) = host.get_or_insert_with(|| ((0..max).map(|i| i as u8 | 1).collect(), vec![0u8; max]));
        // copy_from_slice is copy_nonoverlapping, i.e. memcpy; black_box
        // keeps the compiler from dropping copies nobody reads.
        self.time(
            b,
            || Ok(()),
            || {
                black_box(&mut to[..b]).copy_from_slice(&from[..b]);
                Ok(())
            },
        )
    }
}
