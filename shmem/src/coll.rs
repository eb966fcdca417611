//! Collectives over a team: the public calls, their checks and agreement
//! ([`Team::begin`]), and the hand-over to the backend ([`Team::run`]):
//! the host's collectives (`host/coll.rs`) or, on the GPU, shmem's kernels
//! and NVSHMEM's collectives.

use crate::algo;
use crate::buffer::SymSlice;
use crate::context::{Context, Stream};
use crate::desc::Collective;
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::gpu::coll::GpuTeam;
use crate::heap::{overlap, Region};
use crate::team::{Desc, OpKind, Team};

/// What a collective needs checked before the agreement.
struct Call<'a, 'b, T: Element> {
    kind: OpKind,
    dst: SymSlice<'a, T>,
    src: SymSlice<'b, T>,
    op: Option<ReduceOp>,
    root: usize,
}

use crate::desc::DeviceAgreement;

impl Team {
    /// Checks the call locally and returns (dst, src) with how the team
    /// agrees on it: on the host, by exchanging descriptors with the team
    /// before this returns (`None`); in graph capture, not at all (`None`);
    /// on the device, by the call's kernel ([`DeviceAgreement`], see
    /// `Team::agrees_on_device`), where a PE whose own arguments failed
    /// launches the agreement alone before it returns its error. `shape`
    /// checks the regions and says whether this PE's side is its own block
    /// of the other buffer (in-place all-gather and reduce-scatter), which
    /// differs by PE and is so left out of the comparison.
    fn begin<T: Element>(
        &self,
        call: Call<'_, '_, T>,
        stream: &Stream,
        shape: impl Fn(Region, Region) -> Result<bool>,
    ) -> Result<(Region, Region, Option<DeviceAgreement>)> {
        self.check()?;
        let local = (|| {
            let d = call.dst.region(&self.ctx)?;
            let s = call.src.region(&self.ctx)?;
            if let Some(op) = call.op {
                if !op.supports(T::DTYPE) {
                    return Err(Error::UnsupportedOp { op: op.name(), dtype: T::DTYPE.name() });
                }
            }
            if call.root >= self.n_pes() {
                return Err(Error::PeOutOfRange { pe: call.root, n_pes: self.n_pes() });
            }
            let own_block = shape(s, d).map_err(|e| match e {
                Error::LengthMismatch(m) => Error::LengthMismatch(format!("{}: {m}", call.kind.name())),
                Error::Invalid(m) => Error::Invalid(format!("{}: {m}", call.kind.name())),
                e => e,
            })?;
            Ok((d, s, own_block))
        })();
        let mut desc = Desc::new(call.kind);
        desc.dtype = Some(T::DTYPE);
        desc.op = call.op;
        if let Ok((d, s, own_block)) = &local {
            desc.args = [s.offset as u64, s.len as u64, d.offset as u64, d.len as u64, call.root as u64];
            if *own_block {
                let per_pe = if call.kind == OpKind::ReduceScatter { 2 } else { 0 };
                desc.args[per_pe] = u64::MAX;
            }
        }
        let capturing = self.capturing(stream);
        if capturing {
            // A graph replays without the host: arguments are checked here
            // only, and the device path must take the call (see gpu_collective).
            let (d, s, _) = local?;
            return Ok((d, s, None));
        }
        if self.agrees_on_device(capturing) {
            let (epoch, row) = self.device_row(&desc, local.as_ref().err());
            return match local {
                Ok((d, s, _)) => Ok((d, s, Some((epoch, row)))),
                Err(e) => {
                    // The peers' kernels wait for this PE's row. Should the
                    // launch fail, the context is lost anyway (the next
                    // synchronisation says so): the caller's error first.
                    let _ = self.agree_alone((epoch, row), stream);
                    Err(e)
                }
            };
        }
        let rows = self.exchange(&desc, local.as_ref().err())?;
        let (d, s, _) = local?;
        self.agree(&rows)?;
        Ok((d, s, None))
    }

    /// Launches the agreement on the device alone (`shmem_agree`), for a
    /// call this PE does not make: its row carries its error.
    pub(crate) fn agree_alone(&self, agreement: DeviceAgreement, stream: &Stream) -> Result<()> {
        let agree = |t: &GpuTeam<'_>| t.agree_alone(agreement, stream.cuda_stream());
        self.on_gpu(agree).expect("the device agrees on the GPU backend")
    }

    /// The error of this call's agreement, which its kernel found failed
    /// (after a synchronisation): the first failure since the last look,
    /// which is this one unless an earlier went unreported.
    pub(crate) fn failed_agreement(&self) -> Error {
        self.ctx.take_agreement_error().unwrap_or_else(|| {
            Error::CollectiveMismatch(format!(
                "a collective on the team of PEs {:?} failed its agreement",
                self.state.members
            ))
        })
    }

    /// Whether this team's collectives take the node-aware forms now, where
    /// a byte crosses between nodes once ([`crate::AcrossNodes`]): where
    /// the settings and the team's shape say so; on the gpu backend also
    /// where shmem's own kernels run the collectives, the node's PEs reach
    /// each other over NVLink and two blocks of a kernel are resident at
    /// once.
    pub fn node_aware(&self) -> bool {
        match self.on_gpu(|t| t.rails().is_some()) {
            Some(gpu) => gpu,
            None => {
                let cfg = *self.ctx.collectives.lock().unwrap_or_else(|e| e.into_inner());
                algo::node_aware(self.state.shape, cfg.across_nodes, cfg.force_rma)
            }
        }
    }

    /// Whether `stream` is being captured into a CUDA graph (GPU backend).
    fn capturing(&self, stream: &Stream) -> bool {
        self.ctx.backend.capturing(stream.cuda_stream())
    }

    /// Copies `root`'s `src` into every PE's `dst`.
    ///
    /// # Collective
    pub fn broadcast<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        root: usize,
        _stream: &Stream,
    ) -> Result<()> {
        let call = Call { kind: OpKind::Broadcast, dst: dst.into(), src: src.into(), op: None, root };
        let (d, s, agreement) = self.begin(call, _stream, |s, d| {
            if s.len != d.len {
                return Err(Error::LengthMismatch(format!("src has {} elements, dst {}", s.len, d.len)));
            }
            Ok(false)
        })?;
        let c = Collective { kind: OpKind::Broadcast, dst: d, src: s, op: None, root, agreement };
        self.run::<T>(c, _stream)
    }

    /// Gathers every PE's `src` into `dst` (`n_pes × src.len()`
    /// elements, PE order). `src` may be this PE's own block of `dst`.
    ///
    /// # Collective
    pub fn all_gather<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        _stream: &Stream,
    ) -> Result<()> {
        let n = self.n_pes();
        let me = self.my_pe();
        let call = Call { kind: OpKind::AllGather, dst: dst.into(), src: src.into(), op: None, root: 0 };
        let elem = size_of::<T>();
        let mine = |d: Region, s: Region| Region { offset: d.offset + me * s.len * elem, len: s.len };
        let (d, s, agreement) = self.begin(call, _stream, |s, d| {
            if d.len != s.len * n {
                return Err(Error::LengthMismatch(format!("dst has {} elements, expected {n} × {}", d.len, s.len)));
            }
            if overlap(d, s, elem) && s != mine(d, s) {
                return Err(Error::Invalid("src overlaps dst but is not this PE's block of it".into()));
            }
            Ok(s == mine(d, s) && n > 1)
        })?;
        let c = Collective { kind: OpKind::AllGather, dst: d, src: s, op: None, root: 0, agreement };
        self.run::<T>(c, _stream)
    }

    /// Reduces every PE's `src` element-wise into every PE's `dst`.
    /// `dst` and `src` may be the same slice (in place).
    ///
    /// # Collective
    pub fn all_reduce<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        op: ReduceOp,
        _stream: &Stream,
    ) -> Result<()> {
        let call = Call { kind: OpKind::AllReduce, dst: dst.into(), src: src.into(), op: Some(op), root: 0 };
        let elem = size_of::<T>();
        let (d, s, agreement) = self.begin(call, _stream, |s, d| {
            if s.len != d.len {
                return Err(Error::LengthMismatch(format!("src has {} elements, dst {}", s.len, d.len)));
            }
            if overlap(d, s, elem) && d != s {
                return Err(Error::Invalid("src and dst overlap without being the same slice".into()));
            }
            Ok(false)
        })?;
        let c = Collective { kind: OpKind::AllReduce, dst: d, src: s, op: Some(op), root: 0, agreement };
        self.run::<T>(c, _stream)
    }

    /// Reduces every PE's `src` (`n_pes × dst.len()` elements) and leaves
    /// block `i` of the result in PE `i`'s `dst`.
    ///
    /// # Collective
    pub fn reduce_scatter<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        op: ReduceOp,
        _stream: &Stream,
    ) -> Result<()> {
        let n = self.n_pes();
        let me = self.my_pe();
        let elem = size_of::<T>();
        let call = Call { kind: OpKind::ReduceScatter, dst: dst.into(), src: src.into(), op: Some(op), root: 0 };
        let (d, s, agreement) = self.begin(call, _stream, |s, d| {
            if s.len != d.len * n {
                return Err(Error::LengthMismatch(format!("src has {} elements, expected {n} × {}", s.len, d.len)));
            }
            let mine = Region { offset: s.offset + me * d.len * elem, len: d.len };
            if overlap(d, s, elem) && d != mine {
                return Err(Error::Invalid("dst overlaps src but is not this PE's block of it".into()));
            }
            Ok(d == mine && n > 1)
        })?;
        let c = Collective { kind: OpKind::ReduceScatter, dst: d, src: s, op: Some(op), root: 0, agreement };
        self.run::<T>(c, _stream)
    }

    /// Sends block `j` of this PE's `src` to PE `j`, which stores it as
    /// block `i` (this PE's index) of its `dst`. Both hold `n_pes` equal
    /// blocks; `dst` may be `src` (in place).
    ///
    /// # Collective
    pub fn all_to_all<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        _stream: &Stream,
    ) -> Result<()> {
        let n = self.n_pes();
        let elem = size_of::<T>();
        let call = Call { kind: OpKind::AllToAll, dst: dst.into(), src: src.into(), op: None, root: 0 };
        let (d, s, agreement) = self.begin(call, _stream, |s, d| {
            if s.len != d.len || s.len % n != 0 {
                return Err(Error::LengthMismatch(format!(
                    "src ({}) and dst ({}) must have the same length, a multiple of {n}",
                    s.len, d.len
                )));
            }
            if overlap(d, s, elem) && d != s {
                return Err(Error::Invalid("src and dst overlap without being the same slice".into()));
            }
            Ok(false)
        })?;
        let c = Collective { kind: OpKind::AllToAll, dst: d, src: s, op: None, root: 0, agreement };
        self.run::<T>(c, _stream)
    }

    /// Runs a call that `begin` checked and agreed on (or left to the
    /// device to agree on) on this team's backend.
    fn run<T: Element>(&self, c: Collective, stream: &Stream) -> Result<()> {
        let Some(t) = self.host() else {
            let on = stream.cuda_stream();
            let r = self.on_gpu(|t| t.collective::<T>(c, on));
            return self.ctx.report(r.expect("the gpu backend, where not the host's"));
        };
        let (d, s, op) = (c.dst, c.src, c.op.unwrap_or(ReduceOp::Sum));
        match c.kind {
            OpKind::Broadcast => t.broadcast::<T>(d, s, c.root),
            OpKind::AllGather => t.all_gather::<T>(d, s),
            OpKind::AllReduce => t.all_reduce::<T>(d, s, op),
            OpKind::ReduceScatter => t.reduce_scatter::<T>(d, s, op),
            OpKind::AllToAll => t.all_to_all::<T>(d, s),
            other => unreachable!("{} is not a data collective", other.name()),
        }
    }
}

/// The world team's collectives.
impl Context {
    /// Blocks until every PE has arrived (NVSHMEM's `barrier_all`).
    ///
    /// # Collective
    pub fn barrier_all(&self, stream: &Stream) -> Result<()> {
        self.world().barrier(stream)
    }

    /// [`Team::broadcast`] over the world.
    ///
    /// # Collective
    pub fn broadcast<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.world().broadcast(dst, src, root, stream)
    }

    /// [`Team::all_gather`] over the world.
    ///
    /// # Collective
    pub fn all_gather<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        stream: &Stream,
    ) -> Result<()> {
        self.world().all_gather(dst, src, stream)
    }

    /// [`Team::all_reduce`] over the world.
    ///
    /// # Collective
    pub fn all_reduce<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.world().all_reduce(dst, src, op, stream)
    }

    /// [`Team::reduce_scatter`] over the world.
    ///
    /// # Collective
    pub fn reduce_scatter<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.world().reduce_scatter(dst, src, op, stream)
    }

    /// [`Team::all_to_all`] over the world.
    ///
    /// # Collective
    pub fn all_to_all<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        stream: &Stream,
    ) -> Result<()> {
        self.world().all_to_all(dst, src, stream)
    }

    /// A team of world PEs `start, start + stride, …` (`size` of them);
    /// `None` on PEs outside it.
    ///
    /// # Collective
    pub fn team_split_strided(&self, start: usize, stride: usize, size: usize) -> Result<Option<Team>> {
        self.world().split_strided(start, stride, size)
    }
}
