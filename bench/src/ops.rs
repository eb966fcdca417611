//! What the bench measures: the operations (`--op`) and the
//! implementations (`--impl`), their names, groups and settings, and which
//! implementation has a row for which operation.

use crate::overlap;
use clap::ValueEnum;
use shmem::Collectives;

/// The broadcast's root.
pub(super) const ROOT: usize = 0;

/// The operations, in the order they run and are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub(super) enum Op {
    Barrier,
    Put,
    Get,
    #[value(name = "all_reduce", alias = "all-reduce")]
    AllReduce,
    #[value(name = "all_gather", alias = "all-gather")]
    AllGather,
    #[value(name = "reduce_scatter", alias = "reduce-scatter")]
    ReduceScatter,
    Broadcast,
    #[value(name = "all_to_all", alias = "all-to-all")]
    AllToAll,
    /// The MoE dispatch: all_to_all_v_2d
    Dispatch,
    /// The MoE combine: all_to_all_v_2d_offset, the dispatch's reverse
    Combine,
    /// The MoE ops' 1D all_to_all_v
    #[value(name = "all_to_all_v", alias = "all-to-all-v")]
    AllToAllV,
    /// The MoE layer's deduplicated dispatch: MoeAllToAll::dispatch_on_device
    #[value(name = "layer_dispatch", alias = "layer-dispatch")]
    LayerDispatch,
    /// The MoE layer's reducing combine: MoeAllToAll::combine_on_device
    #[value(name = "layer_combine", alias = "layer-combine")]
    LayerCombine,
    /// all_gather_matmul: the all-gather of a, overlapped with the GEMM
    #[value(name = "ag_matmul", alias = "ag-matmul")]
    AgMatmul,
    /// matmul_reduce_scatter: the GEMM, overlapped with the reduce-scatter
    #[value(name = "matmul_rs", alias = "matmul-rs")]
    MatmulRs,
    /// Every operation but the MoE ops and the overlapped matmuls
    All,
    /// The MoE ops: dispatch, combine, all_to_all_v
    Moe,
    /// The MoE layer (MoeAllToAll): layer_dispatch, layer_combine
    #[value(name = "moe_layer", alias = "moe-layer")]
    MoeLayer,
    /// The overlapped matmuls: ag_matmul, matmul_rs
    Overlap,
}

/// The collectives, which NCCL and NVSHMEM also run.
pub(super) const COLLECTIVES: [Op; 5] = [Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::Broadcast, Op::AllToAll];
/// The MoE ops (`--op moe`), which NCCL also runs.
pub(super) const MOE: [Op; 3] = [Op::Dispatch, Op::Combine, Op::AllToAllV];
/// The MoE layer's ops (`--op moe_layer`): shmem's rows only; their 2D
/// and NCCL counterparts are [`Op::Dispatch`] and [`Op::Combine`].
pub(super) const LAYER: [Op; 2] = [Op::LayerDispatch, Op::LayerCombine];

impl Op {
    pub(super) fn name(self) -> &'static str {
        match self {
            Op::Barrier => "barrier",
            Op::Put => "put",
            Op::Get => "get",
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
            Op::AllToAll => "all_to_all",
            Op::Dispatch => "dispatch",
            Op::Combine => "combine",
            Op::AllToAllV => "all_to_all_v",
            Op::LayerDispatch => "layer_dispatch",
            Op::LayerCombine => "layer_combine",
            Op::AgMatmul => "ag_matmul",
            Op::MatmulRs => "matmul_rs",
            Op::All => "all",
            Op::Moe => "moe",
            Op::MoeLayer => "moe_layer",
            Op::Overlap => "overlap",
        }
    }

    fn is_collective(self) -> bool {
        COLLECTIVES.contains(&self)
    }

    pub(super) fn is_moe(self) -> bool {
        MOE.contains(&self)
    }

    pub(super) fn is_layer(self) -> bool {
        LAYER.contains(&self)
    }

    /// The 2D op a layer op is compared with (itself for the others): the
    /// same token exchange, rows per (token, expert) rather than per
    /// (token, PE).
    pub(super) fn counterpart(self) -> Op {
        match self {
            Op::LayerDispatch => Op::Dispatch,
            Op::LayerCombine => Op::Combine,
            op => op,
        }
    }

    pub(super) fn is_overlap(self) -> bool {
        overlap::OPS.contains(&self)
    }

    /// Whether `--op` (`ops`) selects this operation, by name or group.
    pub(super) fn selected_by(self, ops: &[Op]) -> bool {
        let group = match self {
            _ if self.is_moe() => Op::Moe,
            _ if self.is_layer() => Op::MoeLayer,
            _ if self.is_overlap() => Op::Overlap,
            _ => Op::All,
        };
        ops.contains(&self) || ops.contains(&group)
    }

    /// nccl-tests' bus bandwidth over algorithm bandwidth, over `n` PEs.
    pub(super) fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::AllGather
            | Op::ReduceScatter
            | Op::AllToAll
            | Op::Dispatch
            | Op::Combine
            | Op::AllToAllV
            | Op::LayerDispatch
            | Op::LayerCombine => (n - 1.0) / n,
            _ => 1.0,
        }
    }
}

/// Who runs an operation; the order of the table's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub(super) enum Imp {
    /// shmem with the default collective settings
    Shmem,
    /// all_reduce: the one-shot algorithm
    ShmemOneshot,
    /// all_reduce: the two-shot algorithm
    ShmemTwoshot,
    /// all_reduce: the two-shot algorithm by stores alone (2 PEs over NVLink, out of place)
    ShmemTwoshotStores,
    /// all_reduce: the low-latency algorithm (up to its limit, 1 MiB at 2 PEs)
    ShmemLl,
    /// all_reduce: the low-latency algorithm in 128-byte lines (up to 1 MiB, up to 8 PEs)
    ShmemLl128,
    /// all_reduce: the push algorithm (up to 1 MiB, up to 8 PEs)
    ShmemPush,
    /// all_gather: moved by the copy engines
    ShmemCe,
    /// the MoE ops: a plan kernel, then a data kernel (MoeKernels::PlanThenMove)
    #[value(name = "shmem-2k", alias = "shmem_2k")]
    Shmem2k,
    /// the MoE ops: one kernel moving the rows in 128-byte lines where they
    /// fit the low-latency buffer (MoeKernels::Lines)
    ShmemLines,
    /// shmem's kernels reaching every peer through NVSHMEM's RMA
    ShmemRma,
    /// NVSHMEM's own collectives
    Nvshmem,
    /// NCCL's (all_to_all and the MoE ops: grouped sends and receives)
    Nccl,
    /// put and get's reference: a peer copy (GPU) or a memcpy (host)
    Memcpy,
    /// ag_matmul, matmul_rs: the collective, then one GEMM
    Sequential,
    /// ag_matmul, matmul_rs: chunks moved by an SM kernel beside the GEMMs
    #[value(name = "overlap_sm", alias = "overlap-sm")]
    OverlapSm,
    /// ag_matmul, matmul_rs: chunks moved by copy engines beside the GEMMs
    #[value(name = "overlap_ce", alias = "overlap-ce")]
    OverlapCe,
    /// ag_matmul, matmul_rs: their GEMM alone, on a team of one PE
    #[value(name = "gemm_only", alias = "gemm-only")]
    GemmOnly,
}

/// The implementations a `shmem*` row is compared with (its `vs` columns).
pub(super) const REFERENCES: [Imp; 3] = [Imp::Nccl, Imp::Nvshmem, Imp::Memcpy];

impl Imp {
    pub(super) fn name(self) -> &'static str {
        match self {
            Imp::Shmem => "shmem",
            Imp::ShmemOneshot => "shmem-oneshot",
            Imp::ShmemTwoshot => "shmem-twoshot",
            Imp::ShmemTwoshotStores => "shmem-twoshot-stores",
            Imp::ShmemLl => "shmem-ll",
            Imp::ShmemLl128 => "shmem-ll128",
            Imp::ShmemPush => "shmem-push",
            Imp::ShmemCe => "shmem-ce",
            Imp::Shmem2k => "shmem-2k",
            Imp::ShmemLines => "shmem-lines",
            Imp::ShmemRma => "shmem-rma",
            Imp::Nvshmem => "nvshmem",
            Imp::Nccl => "nccl",
            Imp::Memcpy => "memcpy",
            Imp::Sequential => "sequential",
            Imp::OverlapSm => "overlap_sm",
            Imp::OverlapCe => "overlap_ce",
            Imp::GemmOnly => "gemm_only",
        }
    }

    pub(super) fn is_shmem(self) -> bool {
        self.name().starts_with("shmem")
    }

    /// The collective settings of the rows shmem runs; `None` for NCCL and memcpy.
    pub(super) fn settings(self, tuning: shmem::Tuning) -> Option<Collectives> {
        use shmem::{AllGatherAlgo, AllReduceAlgo, CollImpl, MoeKernels};
        let default = Collectives { tuning, ..Collectives::default() };
        Some(match self {
            Imp::Shmem => default,
            Imp::ShmemOneshot => Collectives { all_reduce: AllReduceAlgo::OneShot, ..default },
            Imp::ShmemTwoshot => Collectives { all_reduce: AllReduceAlgo::TwoShot, ..default },
            Imp::ShmemTwoshotStores => Collectives { all_reduce: AllReduceAlgo::TwoShotStores, ..default },
            Imp::ShmemLl => Collectives { all_reduce: AllReduceAlgo::LowLatency, ..default },
            Imp::ShmemLl128 => Collectives { all_reduce: AllReduceAlgo::LowLatency128, ..default },
            Imp::ShmemPush => Collectives { all_reduce: AllReduceAlgo::Push, ..default },
            Imp::ShmemCe => Collectives { all_gather: AllGatherAlgo::CopyEngine, ..default },
            Imp::Shmem2k => Collectives { moe: MoeKernels::PlanThenMove, ..default },
            Imp::ShmemLines => Collectives { moe: MoeKernels::Lines, ..default },
            Imp::ShmemRma => Collectives { force_rma: true, ..default },
            Imp::Nvshmem => Collectives { implementation: CollImpl::Nvshmem, ..default },
            Imp::Nccl | Imp::Memcpy => return None,
            Imp::Sequential | Imp::OverlapSm | Imp::OverlapCe | Imp::GemmOnly => return None,
        })
    }

    /// Whether this has a row for `op` of `bytes` on the GPU backend
    /// (`gpu`) or the host backend, which ignores the collective settings
    /// (but runs every implementation of the overlapped matmuls: the same
    /// code, a check of the bench itself).
    pub(super) fn runs(self, op: Op, bytes: usize, gpu: bool, ll_max_bytes: usize, ll_room: usize) -> bool {
        match self {
            Imp::Shmem => !op.is_overlap(),
            Imp::Memcpy => matches!(op, Op::Put | Op::Get),
            Imp::Sequential | Imp::OverlapSm | Imp::OverlapCe | Imp::GemmOnly => op.is_overlap(),
            _ if !gpu => false,
            Imp::ShmemOneshot | Imp::ShmemTwoshot | Imp::ShmemTwoshotStores => op == Op::AllReduce,
            Imp::ShmemLl => op == Op::AllReduce && bytes <= ll_max_bytes,
            Imp::ShmemLl128 => op == Op::AllReduce && bytes <= ll_room,
            Imp::ShmemPush => op == Op::AllReduce && bytes <= shmem::algo::PUSH_MAX_BYTES,
            Imp::ShmemCe => op == Op::AllGather,
            Imp::Shmem2k => op.is_moe(),
            // The layer's exchange form beside its decode form.
            Imp::ShmemLines => op.is_moe() || op.is_layer(),
            Imp::ShmemRma => op.is_collective() || op.is_moe(),
            Imp::Nvshmem => op.is_collective(),
            Imp::Nccl => op.is_collective() || op.is_moe(),
        }
    }
}
