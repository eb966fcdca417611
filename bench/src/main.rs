//! shmem-bench: time per message size of every collective (and of the
//! barrier, put and get), next to the same operation through NCCL and
//! through NVSHMEM's own collectives in the same run; time per token
//! count of the MoE all-to-all-v ops, next to NCCL; and the overlapped
//! matmuls, sequential against overlapped.
//!
//! Built on its own: `cargo build --release -p shmem-bench` (add
//! `--features mpi` to run it under `mpirun`), as
//! `target/release/shmem-bench`. Run alone it starts itself as `--pes` PEs
//! (2 by default); under `shmemrun`/`mpirun` it runs on the world it is
//! given. PE 0 prints one table per operation, element type and timing
//! mode, and with `--json PATH` writes one JSON object per row (`op`,
//! `impl`, `backend`, `dtype`, `bytes`, `pes`, `graph`, `time_us`,
//! `algbw_gbps`, `busbw_gbps`, `vs_nccl`, `vs_nvshmem`, `vs_memcpy`, for
//! the MoE ops `tokens`, `hidden`, `experts_per_pe`, `topk`,
//! `major_align`, and for the overlapped matmuls `m`, `n`, `k`, `chunks`,
//! `tflops`, `vs_sequential`); rows go to `PATH.partial` as they are
//! measured, so a crash keeps what was done.
//!
//! ```text
//! shmem-bench [--backend host|gpu|auto] [--pes N] [--op all|barrier,put,get,all_reduce,all_gather,
//!             reduce_scatter,broadcast,all_to_all|moe|dispatch,combine,all_to_all_v|
//!             overlap|ag_matmul,matmul_rs]
//!             [--dtype f32,f16,bf16] [--impl shmem,nccl,...]
//!             [--min-bytes 8] [--max-bytes 64M] [--iters N] [--warmup 5]
//!             [--graph [--graph-max-bytes 64M]] [--json PATH]
//!             [--tokens 128,4096] [--hidden 7168] [--experts-per-pe 8] [--topk 1] [--major-align 1]
//!             [--m 8192] [--n 8192] [--k 8192] [--chunks 4]
//! ```
//!
//! `--op all` is every operation but the MoE ones, which `--op moe`
//! selects, and the overlapped matmuls, which `--op overlap` selects (at
//! their default size they need about 640 MiB of heap and, on the host
//! backend, minutes of CPU); `--op all,moe,overlap`: everything. Names and
//! groups mix freely.
//!
//! **Sizes and bandwidths** follow nccl-tests. `bytes` is per PE: the
//! buffer of all_reduce, broadcast and all_to_all, the whole output of
//! all_gather, the whole input of reduce_scatter (counts round down to a
//! multiple of the PE count where the buffer is split in blocks). algbw is
//! bytes over time; busbw is algbw times 2(n-1)/n for all_reduce, (n-1)/n
//! for all_gather, reduce_scatter and all_to_all, and 1 for broadcast (root
//! 0), put and get. `--dtype` applies to all_reduce and reduce_scatter
//! (sums, f32 by default), to the MoE ops (bf16 by default) and to the
//! overlapped matmuls (f16 by default); the other data-moving collectives
//! move f32, put and get u32.
//!
//! **MoE ops** ([`shmem::moe`], PyTorch's `all_to_all_vdev*`): `dispatch`
//! is `all_to_all_v_2d`, `combine` is `all_to_all_v_2d_offset` sending the
//! dispatch's output back (its input splits and offsets are the
//! dispatch's out_splits_offsets), `all_to_all_v` the 1D op with each
//! peer's rows of the dispatch. One row per `--tokens` count: each PE
//! sends `tokens × topk` rows of `--hidden` elements, each token to
//! `--topk` distinct experts of the `n × --experts-per-pe`, drawn
//! uniformly from a fixed seed (every PE knows every PE's routes; see
//! `moe.rs`); the dispatch pads each expert's block to
//! `--major-align` rows. `bytes` is what a PE sends: `tokens × topk ×
//! hidden × element` (in the combine each PE sends back what it received:
//! that on average); algbw is bytes over time, busbw algbw × (n-1)/n.
//! Their `nccl` rows are one group of ncclSend/ncclRecv with the same rows
//! per peer, packed by peer (what `torch.distributed.all_to_all_single`
//! with splits does; the combine's permutation back to expert order is not
//! timed); they have no `nvshmem` row.
//!
//! **Overlapped matmuls** ([`shmem::overlap`]): `ag_matmul` is
//! [`Context::all_gather_matmul`] (each PE's shard of `--m / n` rows of
//! `--k`, gathered into `m × k` and multiplied by its own `k × --n`),
//! `matmul_rs` [`Context::matmul_reduce_scatter`] (each PE's `m × k` times
//! its `k × n`, reduce-scattered into `m / n × n` per PE). Rows, by
//! `impl`: `sequential` (the collective, then one GEMM), `overlap_sm` and
//! `overlap_ce` (chunks moved by an SM kernel or by copy engines beside
//! the GEMMs; one row per `--chunks` count), `gemm_only` (the op's `m × k`
//! by `k × n` GEMM alone: all_gather_matmul on a team of this PE only, in
//! place, so nothing moves but the call's fixed costs stay; the floor an
//! overlap can reach). `bytes` is
//! one PE's block: its shard (ag_matmul; 64 MiB at the defaults over 2
//! PEs in f16) or its block of the output (matmul_rs); `tflops` is `2 m n
//! k` over the time; `vs_sequential` is sequential's time over this row's.
//! Their checks and timing inputs are in `overlap.rs`. On the
//! host backend the three run the same code (the collective, then a host
//! matmul). No graph rows: the calls cannot be captured.
//!
//! **Implementations** (`impl`): on the GPU backend `shmem` is the default
//! [`shmem::Collectives`]; `shmem-oneshot`, `shmem-twoshot`, `shmem-ll`,
//! `shmem-push` force an all-reduce algorithm, `shmem-ce` the copy-engine all-gather,
//! `shmem-rma` NVSHMEM's RMA inside the kernels; `nvshmem` is NVSHMEM's own
//! collective and `nccl` NCCL's (cudarc's bindings to the box's libnccl, on
//! plain device buffers; all_to_all as grouped sends and receives), both
//! with the same dtype and sizes (the MoE ops: `shmem` and `nccl` only).
//! `memcpy` is the reference of put and get: a copy-engine copy to or
//! from the peer's memory (GPU) or a memcpy (host). The host backend
//! ignores the collective settings, so it has only `shmem` (and `memcpy`)
//! rows. `vs X` is X's time over ours, for the `shmem*` rows: above 1,
//! shmem is faster.
//!
//! **Timing** (PE 0's clock): eager, on the GPU backend, CUDA events around
//! 5 batches of `--iters` back-to-back operations, each batch started by a
//! barrier, after `--warmup` untimed ones: the median batch's mean; on the
//! host backend the median of single timed operations, each after a
//! barrier (barriers themselves back to back). `--graph` (GPU) captures 100
//! operations in a CUDA graph and times replays with events, each after a
//! barrier (after 3 untimed): the median of 5, per operation, for sizes up
//! to `--graph-max-bytes`; every implementation but `nvshmem`, whose
//! collectives are called from the host (the MoE ops are captured too).
//!
//! **Checks**: before timing, each row's output is poisoned (all-ones
//! bytes: NaN, `u32::MAX`), the operation runs once, and every element is
//! compared with the exact expected value; after timing it is compared
//! again. Inputs are small integers, exact in the dtype, that name the
//! sending PE (`pe + 1 + n·r` with `r` pseudo-random per index and size;
//! the MoE ops' index is row × hidden + column of the sender's input, and
//! `r` takes as many values as stay exact, since nothing is summed). The
//! MoE ops' data rows are compared (padding rows, never written, are not),
//! and so is their out_splits_offsets (poisoned to -1), with the values
//! the host computes from the known splits.
//! A wrong result is reported with the op, impl, size and PE, its row is
//! left out, and the run exits non-zero. An implementation that fails (an
//! unsupported size, a capture it cannot be part of) is noted on stderr and
//! its row left out; every PE agrees on each row before going on.
//!
//! **Heap**: unless `SHMEM_HEAP_SIZE` is set, 4 × `--max-bytes` (source,
//! destination and the collectives' scratch) where `--op all` ops run, or
//! what the MoE ops or the overlapped matmuls take where that is more
//! (each group runs after the others have freed theirs), + 64 MiB. The MoE ops take, at the largest token
//! count and in the widest dtype, `2 × tokens × topk` rows (the dispatch's
//! input, the combine's output) and the dispatch's output: the most rows
//! any PE receives, with padding, which the host computes from the routes
//! before `init` over the launcher's world size (`SHMEM_WORLD_SIZE`,
//! `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`; else `--pes`). Defaults over 8 PEs,
//! bf16: about 3 × 56 MiB. The overlapped matmuls take, per PE, in the
//! widest dtype: ag_matmul `m k + m n + (m / n_pes) k + k n` elements
//! (a_out, out, shard, b: 448 MiB at the defaults in f16 over 2 PEs),
//! matmul_rs `m k + k n + (m / n_pes) n + 2 m n` (a, b, out, workspace:
//! 576 MiB). Rows that do not fit are noted (with what they need) and
//! left out.

use clap::{Parser, ValueEnum};
use cudarc::driver::{CudaGraph, CudaSlice, CudaStream, DevicePtr};
use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t};
use shmem::launch::Launch;
use shmem::{bf16, f16, BackendKind, Collectives, Config, Context, ReduceOp, Stream, SymSlice, SymmetricBuffer};
use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::hint::black_box;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

mod moe;
use moe::MoeShape;
mod overlap;
use overlap::MatmulShape;

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Operations per CUDA graph in `--graph` mode.
const PER_GRAPH: usize = 100;
/// The broadcast's root.
const ROOT: usize = 0;
const HEAP_ENV: &str = "SHMEM_HEAP_SIZE";

#[derive(Parser, Debug)]
#[command(about = "Time shmem's collectives, barrier, put and get against NCCL, NVSHMEM and memcpy")]
struct Args {
    /// Backend to measure
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// Operations to measure (comma-separated)
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    op: Vec<Op>,
    /// Element types of all_reduce and reduce_scatter [default: f32], of
    /// the MoE ops [default: bf16] and of the overlapped matmuls [default:
    /// f16] (comma-separated)
    #[arg(long, value_enum, value_delimiter = ',')]
    dtype: Vec<Dtype>,
    /// Implementations to measure (comma-separated) [default: all]
    #[arg(long = "impl", value_enum, value_delimiter = ',')]
    imp: Vec<Imp>,
    /// Smallest message: bytes, a multiple of 4 (K, M, G suffixes allowed)
    #[arg(long, default_value = "8", value_parser = parse_bytes)]
    min_bytes: usize,
    /// Largest message; sizes double from --min-bytes up to it
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    max_bytes: usize,
    /// Timed iterations per size [default: enough to move 256 MiB, within 10..=1000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    iters: Option<u64>,
    /// Untimed iterations before timing each size
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Also write the rows here, one JSON object per line
    #[arg(long)]
    json: Option<PathBuf>,
    /// PEs to start when run on its own
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pes: u64,
    /// GPU backend: also time replays of CUDA graphs of 100 operations
    #[arg(long)]
    graph: bool,
    /// Largest message timed in graph mode
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    graph_max_bytes: usize,
    /// MoE ops: tokens per PE, one row per count (comma-separated)
    #[arg(long, value_delimiter = ',', default_value = "128,4096", value_parser = clap::value_parser!(u64).range(1..))]
    tokens: Vec<u64>,
    /// MoE ops: elements per token row
    #[arg(long, default_value_t = 7168, value_parser = clap::value_parser!(u64).range(1..))]
    hidden: u64,
    /// MoE ops: experts on each PE
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    experts_per_pe: u64,
    /// MoE ops: distinct experts each token goes to
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    topk: u64,
    /// MoE dispatch: each expert's block of rows starts at a multiple of this
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    major_align: u64,
    /// MoE ops: data blocks that copy each PE's own rows while the others
    /// push (`Collectives::moe_local_blocks`; 0: each block does both)
    /// [default: the kernel's choice]
    #[arg(long)]
    moe_local_blocks: Option<u32>,
    /// GPU kernels' tuning (`shmem::Tuning`), for every shmem row: the
    /// low-latency kernels' largest message a peer [default: 1M over the
    /// PEs' peers, at least 128K; at most 1M up to 8 PEs]
    #[arg(long, value_parser = parse_bytes)]
    ll_max_bytes: Option<usize>,
    /// GPU kernels' tuning: the smallest message a peer that the
    /// low-latency kernels move in 128-byte lines (after LL128; 0: every
    /// message) [default: 256K]
    #[arg(long, value_parser = parse_bytes_or_zero)]
    ll_lines_min_bytes: Option<usize>,
    /// GPU kernels' tuning: blocks of the low-latency kernels [default: 16
    /// below 32K a peer, 128 from there]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=128))]
    ll_blocks: Option<u32>,
    /// GPU kernels' tuning: threads a block of the low-latency kernels, in
    /// whole warps, at most 512 for packets and 640 for lines [default:
    /// 512 for packets; for lines, the warps for one pass, 256 to 640]
    #[arg(long, value_parser = clap::value_parser!(u32).range(32..=640))]
    ll_threads: Option<u32>,
    /// GPU kernels' tuning: blocks of the push kernels [default: 64]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=128))]
    push_blocks: Option<u32>,
    /// GPU kernels' tuning: MoE bytes of the busiest PE's rows per working
    /// data block (the line kernel: of the input per block) [default: 32K;
    /// the line kernel: 7168]
    #[arg(long, value_parser = parse_bytes)]
    moe_block_bytes: Option<usize>,
    /// GPU kernels' tuning: the largest MoE input (bytes of a PE's input
    /// rows) that the default form moves in 128-byte lines where they fit
    /// [default: every input]
    #[arg(long, value_parser = parse_bytes)]
    moe_lines_max_bytes: Option<usize>,
    /// GPU kernels' tuning: at 1 PE, the smallest collective (bytes of its
    /// destination) copied by a copy engine rather than by a kernel (0:
    /// every one) [default: every one in a graph; else 2M for all_reduce
    /// and reduce_scatter, 8M for the others]
    #[arg(long, value_parser = parse_bytes_or_zero)]
    solo_ce_min_bytes: Option<usize>,
    /// GPU kernels' tuning: the smallest broadcast (bytes) that the
    /// members pull from the root over NVLink rather than the root pushing
    /// it [default: none]
    #[arg(long, value_parser = parse_bytes_or_zero)]
    pull_bcast_min_bytes: Option<usize>,
    /// ag_matmul, matmul_rs: rows of a (ag_matmul: once gathered, each PE's
    /// shard is m / PEs rows; matmul_rs: each PE's out is m / PEs rows)
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    m: u64,
    /// ag_matmul, matmul_rs: columns of b and of out
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    n: u64,
    /// ag_matmul, matmul_rs: columns of a, rows of b
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    k: u64,
    /// ag_matmul, matmul_rs: chunks each PE's block moves in; one row of
    /// each overlapped implementation per count (comma-separated)
    #[arg(long, value_delimiter = ',', default_value = "4", value_parser = clap::value_parser!(u64).range(1..))]
    chunks: Vec<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    Host,
    Gpu,
    Auto,
}

/// The operations, in the order they run and are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Op {
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
    /// The overlapped matmuls: ag_matmul, matmul_rs
    Overlap,
}

/// The collectives, which NCCL and NVSHMEM also run.
const COLLECTIVES: [Op; 5] = [Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::Broadcast, Op::AllToAll];
/// The MoE ops (`--op moe`), which NCCL also runs.
const MOE: [Op; 3] = [Op::Dispatch, Op::Combine, Op::AllToAllV];

impl Op {
    fn name(self) -> &'static str {
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
            Op::AgMatmul => "ag_matmul",
            Op::MatmulRs => "matmul_rs",
            Op::All => "all",
            Op::Moe => "moe",
            Op::Overlap => "overlap",
        }
    }

    fn is_collective(self) -> bool {
        COLLECTIVES.contains(&self)
    }

    fn is_moe(self) -> bool {
        MOE.contains(&self)
    }

    fn is_overlap(self) -> bool {
        overlap::OPS.contains(&self)
    }

    /// Whether `--op` (`ops`) selects this operation, by name or group.
    fn selected_by(self, ops: &[Op]) -> bool {
        let group = match self {
            _ if self.is_moe() => Op::Moe,
            _ if self.is_overlap() => Op::Overlap,
            _ => Op::All,
        };
        ops.contains(&self) || ops.contains(&group)
    }

    /// nccl-tests' bus bandwidth over algorithm bandwidth, over `n` PEs.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::AllGather | Op::ReduceScatter | Op::AllToAll | Op::Dispatch | Op::Combine | Op::AllToAllV => {
                (n - 1.0) / n
            }
            _ => 1.0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Dtype {
    F32,
    F16,
    Bf16,
}

/// Who runs an operation; the order of the table's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Imp {
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
const REFERENCES: [Imp; 3] = [Imp::Nccl, Imp::Nvshmem, Imp::Memcpy];

impl Imp {
    fn name(self) -> &'static str {
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

    fn is_shmem(self) -> bool {
        self.name().starts_with("shmem")
    }

    /// The collective settings of the rows shmem runs; `None` for NCCL and memcpy.
    fn settings(self, tuning: shmem::Tuning) -> Option<Collectives> {
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
    fn runs(self, op: Op, bytes: usize, gpu: bool, ll_max_bytes: usize, ll_room: usize) -> bool {
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
            Imp::Shmem2k | Imp::ShmemLines => op.is_moe(),
            Imp::ShmemRma => op.is_collective() || op.is_moe(),
            Imp::Nvshmem => op.is_collective(),
            Imp::Nccl => op.is_collective() || op.is_moe(),
        }
    }
}

impl Args {
    /// The kernels' tuning that the flags ask for.
    fn tuning(&self) -> shmem::Tuning {
        shmem::Tuning {
            low_latency_max_bytes: self.ll_max_bytes,
            low_latency_blocks: self.ll_blocks,
            low_latency_threads: self.ll_threads,
            low_latency_lines_min_bytes: self.ll_lines_min_bytes,
            push_blocks: self.push_blocks,
            moe_block_bytes: self.moe_block_bytes,
            moe_lines_max_bytes: self.moe_lines_max_bytes,
            solo_copy_engine_min_bytes: self.solo_ce_min_bytes,
            broadcast_pull_min_bytes: self.pull_bcast_min_bytes,
        }
    }
}

fn parse_bytes(s: &str) -> Result<usize, String> {
    match shmem::config::parse_size(s) {
        Some(n) if n > 0 => Ok(n),
        _ => Err(format!("{s:?} is not a positive size such as 8, 64K or 256M")),
    }
}

/// As [`parse_bytes`], 0 allowed (a threshold that every message passes).
fn parse_bytes_or_zero(s: &str) -> Result<usize, String> {
    shmem::config::parse_size(s).ok_or_else(|| format!("{s:?} is not a size such as 0, 8, 64K or 256M"))
}

/// The symmetric heap the bench needs over `n` PEs, and some slack: for
/// the `--op all` group, source, destination and the collectives' scratch,
/// each up to the largest message; for the MoE ops, see
/// [`moe::heap_bytes`]; for the overlapped matmuls, [`overlap::heap_bytes`]
/// (rows made one group after the other, so the largest of the three).
fn heap_bytes(args: &Args, n: usize) -> usize {
    let all = match COLLECTIVES.iter().chain(&[Op::Barrier, Op::Put, Op::Get]).any(|op| op.selected_by(&args.op)) {
        true => args.max_bytes.saturating_mul(4),
        false => 0,
    };
    let moe = match MOE.iter().any(|op| op.selected_by(&args.op)) {
        true => moe::heap_bytes(args, n),
        false => 0,
    };
    all.max(moe).max(overlap::heap_bytes(args, n)).saturating_add(64 << 20)
}

/// The world's size before `init`, for the heap: from the launcher's
/// environment (shmemrun, mpirun), else `--pes`.
fn world_size_hint(args: &Args) -> usize {
    [shmem::bootstrap::env::WORLD_SIZE, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(args.pes as usize)
}

/// The element types of the rows: inputs are small integers, exact in each.
trait Value: shmem::Element {
    const NAME: &'static str;
    /// Every integer up to this is exact.
    const EXACT: usize;
    /// A value no input or sum takes; the all-ones bytes of the GPU's poison.
    const POISON: Self;
    const NCCL: ncclDataType_t;
    /// `x`, which is at most [`Value::EXACT`].
    fn of(x: usize) -> Self;
}

impl Value for f32 {
    const NAME: &'static str = "f32";
    const EXACT: usize = 1 << 24;
    const POISON: f32 = f32::NAN;
    const NCCL: ncclDataType_t = ncclDataType_t::ncclFloat32;
    fn of(x: usize) -> f32 {
        x as f32
    }
}

impl Value for f16 {
    const NAME: &'static str = "f16";
    const EXACT: usize = 1 << 11;
    const POISON: f16 = f16::NAN;
    const NCCL: ncclDataType_t = ncclDataType_t::ncclFloat16;
    fn of(x: usize) -> f16 {
        f16::from_f32(x as f32)
    }
}

impl Value for bf16 {
    const NAME: &'static str = "bf16";
    const EXACT: usize = 1 << 8;
    const POISON: bf16 = bf16::NAN;
    const NCCL: ncclDataType_t = ncclDataType_t::ncclBfloat16;
    fn of(x: usize) -> bf16 {
        bf16::from_f32(x as f32)
    }
}

impl Value for i64 {
    const NAME: &'static str = "i64";
    const EXACT: usize = i64::MAX as usize;
    const POISON: i64 = -1;
    const NCCL: ncclDataType_t = ncclDataType_t::ncclInt64;
    fn of(x: usize) -> i64 {
        x as i64
    }
}

impl Value for u32 {
    const NAME: &'static str = "u32";
    const EXACT: usize = u32::MAX as usize - 1;
    const POISON: u32 = u32::MAX;
    const NCCL: ncclDataType_t = ncclDataType_t::ncclUint32;
    fn of(x: usize) -> u32 {
        x as u32
    }
}

/// Element counts of one collective at one nominal size.
#[derive(Clone, Copy, Debug)]
struct Shape {
    src: usize,
    dst: usize,
    /// The row's `bytes`: the larger side (see the module's doc).
    bytes: usize,
}

impl Shape {
    /// `op` over `n` PEs at `bytes` of `elem`-byte elements; `None` where
    /// that is not one element per block. Counts split in blocks round down
    /// to a multiple of `n`, as in nccl-tests.
    fn of(op: Op, bytes: usize, elem: usize, n: usize) -> Option<Shape> {
        let count = bytes / elem;
        let (src, dst) = match op {
            Op::AllReduce | Op::Broadcast | Op::Put | Op::Get => (count, count),
            Op::AllToAll => (count / n * n, count / n * n),
            Op::AllGather => (count / n, count / n * n),
            Op::ReduceScatter => (count / n * n, count / n),
            _ => return None,
        };
        (src > 0 && dst > 0).then_some(Shape { src, dst, bytes: src.max(dst) * elem })
    }
}

/// SplitMix64's finaliser: reproducible pseudo-random numbers, no crate.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Inputs that name their sender: element `i` of PE `p`'s source is
/// `p + 1 + n·r(i)`, with `r(i)` pseudo-random in `0..m` (fresh for each
/// seed) and `m` small enough that a sum over the `n` PEs stays exact in
/// the element type.
#[derive(Clone, Copy)]
struct Pattern {
    n: usize,
    m: u64,
    seed: u64,
}

impl Pattern {
    fn new<T: Value>(n: usize, seed: u64) -> Res<Pattern> {
        let first = n * (n + 1) / 2; // the sum of p + 1
        if first > T::EXACT {
            return Err(format!("sums over {n} PEs are not exact in {}: use f32", T::NAME).into());
        }
        let m = ((T::EXACT - first) / (n * n) + 1).min(1 << 16);
        Ok(Pattern { n, m: m as u64, seed: mix(seed) })
    }

    fn r(&self, i: usize) -> usize {
        (mix(self.seed ^ i as u64) % self.m) as usize
    }

    /// Element `i` of PE `pe`'s source.
    fn value<T: Value>(&self, pe: usize, i: usize) -> T {
        T::of(pe + 1 + self.n * self.r(i))
    }

    /// Element `i` of the sum of every PE's source.
    fn sum<T: Value>(&self, i: usize) -> T {
        T::of(self.n * (self.n + 1) / 2 + self.n * self.n * self.r(i))
    }

    fn input<T: Value>(&self, pe: usize, len: usize) -> Vec<T> {
        (0..len).map(|i| self.value(pe, i)).collect()
    }

    /// What PE `me` must hold in its destination after `op`.
    fn expected<T: Value>(&self, op: Op, shape: Shape, me: usize) -> Vec<T> {
        let n = self.n;
        match op {
            Op::AllReduce => (0..shape.dst).map(|i| self.sum(i)).collect(),
            Op::ReduceScatter => (0..shape.dst).map(|i| self.sum(me * shape.dst + i)).collect(),
            Op::Broadcast => self.input(ROOT, shape.dst),
            // Block p is PE p's source.
            Op::AllGather => (0..n).flat_map(|p| (0..shape.src).map(move |i| self.value(p, i))).collect(),
            // Block p is block `me` of PE p's source.
            Op::AllToAll => {
                let c = shape.dst / n;
                (0..n).flat_map(|p| (0..c).map(move |i| self.value(p, me * c + i))).collect()
            }
            _ => Vec::new(),
        }
    }
}

/// A seed for one operation at one size, the same on every PE.
fn seed(op: Op, dtype: &str, bytes: usize) -> u64 {
    let tag = dtype.bytes().fold(op as u64, |h, b| mix(h ^ u64::from(b)));
    mix(tag ^ bytes as u64)
}

/// The first difference between `got` and `want`, said in words.
fn difference<T: Value>(got: &[T], want: &[T]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} elements where {} were expected", got.len(), want.len()));
    }
    let i = got.iter().zip(want).position(|(g, w)| g != w)?;
    let wrong = got.iter().zip(want).filter(|(g, w)| g != w).count();
    Some(format!("element {i} is {:?}, expected {:?} ({wrong} of {} wrong)", got[i], want[i], want.len()))
}

/// One line of the table and of the JSON output.
#[derive(Clone, Debug)]
struct Row {
    op: Op,
    imp: Imp,
    /// `None` for the barrier, which moves no data.
    dtype: Option<&'static str>,
    bytes: usize,
    /// Timed as CUDA-graph replays.
    graph: bool,
    time_us: f64,
    /// The MoE ops' parameters (`None` for the others).
    moe: Option<MoeShape>,
    /// The overlapped matmuls' parameters (`None` for the others).
    matmul: Option<MatmulShape>,
}

impl Row {
    /// Bytes over time; none for the overlapped matmuls, which are timed
    /// in operations (`tflops`).
    fn algbw_gbps(&self) -> Option<f64> {
        self.dtype.filter(|_| self.matmul.is_none()).map(|_| self.bytes as f64 / (self.time_us * 1e3))
    }

    fn busbw_gbps(&self, n: usize) -> Option<f64> {
        self.algbw_gbps().map(|a| a * self.op.bus_factor(n))
    }

    /// The same operation, element type, size and timing mode.
    fn same_case(&self, other: &Row) -> bool {
        (self.op, self.dtype, self.bytes, self.graph, self.moe, self.matmul)
            == (other.op, other.dtype, other.bytes, other.graph, other.moe, other.matmul)
    }

    /// `reference`'s time over ours, for shmem's rows.
    fn vs(&self, rows: &[Row], reference: Imp) -> Option<f64> {
        if !self.imp.is_shmem() {
            return None;
        }
        let r = rows.iter().find(|r| r.imp == reference && r.same_case(self))?;
        Some(r.time_us / self.time_us)
    }

    /// One JSON object; the ratios need every row (`None`: left out).
    fn json(&self, n: usize, backend: &str, rows: Option<&[Row]>) -> String {
        let dtype = self.dtype.map_or("null".into(), |d| format!("\"{d}\""));
        let mut s = format!(
            "{{\"op\":\"{}\",\"impl\":\"{}\",\"backend\":\"{backend}\",\"dtype\":{dtype},\"bytes\":{},\"pes\":{n},\
             \"graph\":{},\"time_us\":{},\"algbw_gbps\":{},\"busbw_gbps\":{}",
            self.op.name(),
            self.imp.name(),
            self.bytes,
            self.graph,
            num(Some(self.time_us)),
            num(self.algbw_gbps()),
            num(self.busbw_gbps(n)),
        );
        if let Some(m) = self.moe {
            let _ = write!(
                s,
                ",\"tokens\":{},\"hidden\":{},\"experts_per_pe\":{},\"topk\":{},\"major_align\":{}",
                m.tokens, m.hidden, m.experts_per_pe, m.topk, m.major_align
            );
        }
        if let Some(m) = self.matmul {
            let chunks = m.chunks.map_or("null".into(), |c| c.to_string());
            let tflops = num(Some(m.flops() / (self.time_us * 1e6)));
            let _ = write!(s, ",\"m\":{},\"n\":{},\"k\":{},\"chunks\":{chunks},\"tflops\":{tflops}", m.m, m.n, m.k);
        }
        if let Some(rows) = rows {
            for reference in REFERENCES {
                let _ = write!(s, ",\"vs_{}\":{}", reference.name(), num(self.vs(rows, reference)));
            }
            if self.matmul.is_some() {
                let _ = write!(s, ",\"vs_sequential\":{}", num(overlap::vs_sequential(self, rows)));
            }
        }
        s.push('}');
        s
    }
}

/// One line on stderr in one write, so that the PEs' lines do not mix.
fn note(msg: impl std::fmt::Display) {
    let _ = std::io::stderr().write_all(format!("shmem-bench: {msg}\n").as_bytes());
}

/// A JSON number, or null where there is none (or it is not finite).
fn num(x: Option<f64>) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.4}"),
        _ => "null".into(),
    }
}

fn cell(x: Option<f64>, width: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:>width$.2}"),
        _ => format!("{:>width$}", "-"),
    }
}

/// 64K, 1M, 3G; plain bytes where that is not exact.
fn human(bytes: usize) -> String {
    for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

fn main() {
    let args = Args::parse();
    if args.min_bytes > args.max_bytes || args.min_bytes % 4 != 0 {
        // Sizes double from the minimum, so all are whole u32 and f32 counts.
        eprintln!(
            "shmem-bench: --min-bytes ({}) must be a multiple of 4 and at most --max-bytes ({})",
            args.min_bytes, args.max_bytes
        );
        std::process::exit(2);
    }
    if !shmem::bootstrap::started_by_launcher() {
        std::process::exit(relaunch(&args));
    }
    if let Err(e) = run(&args) {
        note(format_args!("failed: {e}"));
        std::process::exit(1);
    }
}

/// Runs this program again, with the same arguments, as `--pes` PEs.
fn relaunch(args: &Args) -> i32 {
    let pes = args.pes as usize;
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("shmem-bench: cannot find my own executable: {e}");
            return 1;
        }
    };
    // Untagged: only PE 0 prints, and the table should stay copy-pastable.
    let mut launch = Launch::new(pes, exe).args(std::env::args_os().skip(1)).tag_output(false).kill_on_failure(true);
    if std::env::var_os(HEAP_ENV).is_none() {
        launch = launch.env(HEAP_ENV, heap_bytes(args, pes).to_string());
    }
    match launch.run() {
        Ok(outcome) => outcome.exit_code(),
        Err(e) => {
            eprintln!("shmem-bench: launching {pes} PEs failed: {e}");
            1
        }
    }
}

/// One implementation of one operation at one size, ready to run.
struct Case<'a, T> {
    op: Op,
    imp: Imp,
    dtype: Option<&'static str>,
    bytes: usize,
    /// Enqueues one operation on the bench's stream.
    run: &'a dyn Fn() -> Res,
    /// Overwrites the output with [`Value::POISON`].
    poison: &'a dyn Fn() -> Res,
    /// This PE's output, once the stream is done.
    read: Reader<'a, T>,
    want: &'a [T],
    /// The MoE ops' parameters (`None` for the others).
    moe: Option<MoeShape>,
    /// A second output checked as the first: the MoE ops' out_splits_offsets.
    splits: Option<(Reader<'a, i64>, &'a [i64])>,
    /// The overlapped matmuls' parameters (`None` for the others).
    matmul: Option<MatmulShape>,
}

/// Reads an output of a [`Case`] into host memory.
type Reader<'a, T> = &'a dyn Fn() -> Res<Vec<T>>;

impl<T> Case<'_, T> {
    fn label(&self, graph: bool) -> String {
        let mode = if graph { "graph" } else { "eager" };
        let tokens = self.moe.map_or(String::new(), |m| format!(" ({} tokens)", m.tokens));
        let matmul = self.matmul.map_or(String::new(), |m| format!(" ({m})"));
        let (op, imp, dtype) = (self.op.name(), self.imp.name(), self.dtype.unwrap_or("-"));
        format!("{op} {imp} {dtype} {} B{tokens}{matmul} ({mode})", self.bytes)
    }

    fn row(&self, graph: bool, time_us: f64) -> Row {
        let (op, imp, dtype, bytes, moe, matmul) = (self.op, self.imp, self.dtype, self.bytes, self.moe, self.matmul);
        Row { op, imp, dtype, bytes, graph, time_us, moe, matmul }
    }
}

impl<T: Value> Case<'_, T> {
    /// Reads this PE's output: its first difference from what was
    /// expected, in words (`None`: right).
    fn compare(&self) -> Res<Option<String>> {
        if let Some(what) = difference(&(self.read)()?, self.want) {
            return Ok(Some(match self.moe {
                Some(m) => format!("data rows of {} elements, padding left out: {what}", m.hidden),
                None => what,
            }));
        }
        let Some((read, want)) = self.splits else { return Ok(None) };
        Ok(difference(&read()?, want).map(|what| format!("out_splits_offsets: {what}")))
    }
}

struct Bench<'a> {
    ctx: &'a Context,
    s: Stream,
    args: &'a Args,
    sizes: Vec<usize>,
    /// One word per PE, for [`Bench::agree`].
    verdicts: SymmetricBuffer<u32>,
    /// Wrong results seen on this PE.
    wrong: Cell<usize>,
    /// PE 0 with `--json`: rows as they are measured, without ratios.
    partial: RefCell<Option<std::fs::File>>,
    backend: String,
}

impl Bench<'_> {
    fn gpu(&self) -> bool {
        self.ctx.backend() == BackendKind::Gpu
    }

    fn cuda(&self) -> Res<&Arc<CudaStream>> {
        Ok(self.s.cuda_stream().ok_or("this needs the gpu backend")?)
    }

    fn selected(&self, op: Op) -> bool {
        op.selected_by(&self.args.op)
    }

    /// Whether `imp` has a row for `op` at `bytes` in this run.
    fn runs(&self, imp: Imp, op: Op, bytes: usize) -> bool {
        let n = self.ctx.n_pes();
        let ll_max_bytes = shmem::algo::low_latency_max_bytes(n, &self.args.tuning());
        let ll_room = shmem::algo::low_latency_room_bytes(n);
        (self.args.imp.is_empty() || self.args.imp.contains(&imp))
            && imp.runs(op, bytes, self.gpu(), ll_max_bytes, ll_room)
    }

    fn graphs(&self, bytes: usize) -> bool {
        self.args.graph && self.gpu() && bytes <= self.args.graph_max_bytes
    }

    fn iters(&self, bytes: usize) -> usize {
        match self.args.iters {
            Some(n) => n as usize,
            None => ((256usize << 20) / bytes.max(1)).clamp(10, 1000),
        }
    }

    /// The element types of `op`'s rows.
    fn dtypes(&self, op: Op) -> Vec<Dtype> {
        let default = match op {
            Op::AllReduce | Op::ReduceScatter => Dtype::F32,
            _ if op.is_moe() => Dtype::Bf16,
            _ if op.is_overlap() => Dtype::F16,
            _ => return vec![Dtype::F32],
        };
        if self.args.dtype.is_empty() {
            return vec![default];
        }
        let mut d: Vec<Dtype> = Vec::new();
        for &t in &self.args.dtype {
            if !d.contains(&t) {
                d.push(t);
            }
        }
        d
    }

    /// Every row of this run, in order; PE 0's are the ones printed.
    fn all(&self) -> Res<Vec<Row>> {
        let mut rows = Vec::new();
        let moe_ops: Vec<Op> = MOE.into_iter().filter(|&op| self.selected(op)).collect();
        if !moe_ops.is_empty() {
            moe::check(self.args, self.ctx.n_pes())?;
        }
        if self.selected(Op::Put) || self.selected(Op::Get) {
            rows.extend(self.put_get()?);
        }
        if self.selected(Op::Barrier) {
            rows.extend(self.barrier()?);
        }
        for op in COLLECTIVES.into_iter().filter(|&op| self.selected(op)) {
            for dtype in self.dtypes(op) {
                rows.extend(match dtype {
                    Dtype::F32 => self.collective::<f32>(op)?,
                    Dtype::F16 => self.collective::<f16>(op)?,
                    Dtype::Bf16 => self.collective::<bf16>(op)?,
                });
            }
        }
        if !moe_ops.is_empty() {
            rows.extend(self.moe(&moe_ops)?);
        }
        let overlap_ops: Vec<Op> = overlap::OPS.into_iter().filter(|&op| self.selected(op)).collect();
        if !overlap_ops.is_empty() {
            rows.extend(self.overlap(&overlap_ops)?);
        }
        let nccl_ops: Vec<Op> = COLLECTIVES
            .into_iter()
            .filter(|&op| self.selected(op) && self.sizes.iter().any(|&b| self.runs(Imp::Nccl, op, b)))
            .chain(moe_ops.into_iter().filter(|&op| self.runs(Imp::Nccl, op, 0)))
            .collect();
        if !nccl_ops.is_empty() {
            // Last: a failure there leaves the rows above intact.
            match self.nccl(&nccl_ops) {
                Ok(nccl) => rows.extend(nccl),
                Err(e) => note(format_args!("NCCL rows skipped on PE {}: {e}", self.ctx.my_pe())),
            }
        }
        Ok(rows)
    }

    /// Records a row measured on this PE (PE 0's go to `--json`'s partial file).
    fn keep(&self, rows: &mut Vec<Row>, row: Row) -> Res {
        if let Some(f) = self.partial.borrow_mut().as_mut() {
            writeln!(f, "{}", row.json(self.ctx.n_pes(), &self.backend, None))?;
        }
        rows.push(row);
        Ok(())
    }

    /// The PEs whose verdict was "not ok". Each PE writes its verdict into
    /// its own word; after a barrier every PE reads them all.
    fn agree(&self, ok: bool) -> Res<Vec<usize>> {
        let me = self.ctx.my_pe();
        self.verdicts.slice(me..me + 1).copy_from_host(&[u32::from(ok)], &self.s)?;
        self.ctx.barrier_all(&self.s)?;
        let mut failed = Vec::new();
        for pe in 0..self.ctx.n_pes() {
            if self.ctx.g(&self.verdicts, pe, pe, &self.s)? != 1 {
                failed.push(pe);
            }
        }
        self.ctx.barrier_all(&self.s)?; // all read before the next verdict
        Ok(failed)
    }

    /// Whether every PE found its output right (`found`: the first
    /// difference from [`Case::compare`]; `None` also where there is
    /// nothing to check on this PE). A wrong value is reported at once, by each PE, and
    /// counted; an error is noted once, by the first PE that failed.
    fn settle<T: Value>(&self, c: &Case<'_, T>, graph: bool, found: Res<Option<String>>) -> Res<bool> {
        let me = self.ctx.my_pe();
        let why = match found {
            Ok(None) => None,
            Ok(Some(what)) => {
                note(format_args!("WRONG RESULT: {} on PE {me}: {what}", c.label(graph)));
                self.wrong.set(self.wrong.get() + 1);
                Some(None)
            }
            Err(e) => Some(Some(e)),
        };
        let failed = self.agree(why.is_none())?;
        if let (Some(Some(e)), Some(&first)) = (why, failed.first()) {
            if first == me {
                note(format_args!("{} skipped (failed on PEs {failed:?}): {e}", c.label(graph)));
            }
        }
        Ok(failed.is_empty())
    }

    /// Median µs of `op` (see the module's doc), each batch (GPU) or
    /// operation (host) after an untimed `setup`.
    fn time(&self, bytes: usize, mut setup: impl FnMut() -> Res, mut op: impl FnMut() -> Res) -> Res<f64> {
        for _ in 0..self.args.warmup {
            setup()?;
            op()?;
        }
        let iters = self.iters(bytes);
        if let Some(stream) = self.s.cuda_stream() {
            let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            let mut batches = Vec::new();
            for _ in 0..5 {
                stream.synchronize()?;
                setup()?;
                let start = stream.record_event(timing)?;
                for _ in 0..iters {
                    op()?;
                }
                let end = stream.record_event(timing)?;
                end.synchronize()?;
                batches.push(start.elapsed_ms(&end)? as f64 * 1e3 / iters as f64);
            }
            batches.sort_by(f64::total_cmp);
            return Ok(batches[2]);
        }
        let mut t = Vec::with_capacity(iters);
        for _ in 0..iters {
            setup()?;
            let start = Instant::now();
            op()?;
            self.s.synchronize()?;
            t.push(start.elapsed().as_secs_f64() * 1e6);
        }
        t.sort_by(f64::total_cmp);
        Ok(t[t.len() / 2])
    }

    /// Runs `c` once on a poisoned output and compares it; whether every
    /// PE found its output right.
    fn check_once<T: Value>(&self, c: &Case<'_, T>) -> Res<bool> {
        let found = (|| {
            (c.poison)()?;
            self.ctx.barrier_all(&self.s)?;
            (c.run)()?;
            c.compare()
        })();
        self.settle(c, false, found)
    }

    /// Checks `c` once, times it, checks it again; its row if every PE
    /// agreed both times.
    fn eager<T: Value>(&self, c: &Case<'_, T>) -> Res<Option<Row>> {
        let barrier = || Ok(self.ctx.barrier_all(&self.s)?);
        if !self.check_once(c)? {
            return Ok(None);
        }
        // Back-to-back barriers need no barrier before them.
        let setup = || if c.op == Op::Barrier { Ok(()) } else { barrier() };
        let timed = self.time(c.bytes, setup, c.run);
        let after = timed.as_ref().map_err(|e| e.to_string().into()).and_then(|_| c.compare());
        let ok = self.settle(c, false, after)?;
        Ok(timed.ok().filter(|_| ok).map(|t| c.row(false, t)))
    }

    /// Captures [`PER_GRAPH`] runs of `c` in a CUDA graph, checks one
    /// replay, times replays, checks again; its row if every PE agreed at
    /// each step.
    fn graphed<T: Value>(&self, c: &Case<'_, T>) -> Res<Option<Row>> {
        let stream = self.cuda()?;
        let captured = (|| {
            (c.poison)()?;
            self.ctx.barrier_all(&self.s)?;
            stream.synchronize()?;
            capture(stream, c.run)
        })();
        let (graph, failed) = match captured {
            Ok(g) => (Some(g), None),
            Err(e) => (None, Some(e)),
        };
        // Every PE must have its graph before any replays one.
        if !self.settle(c, true, failed.map_or(Ok(None), Err))? {
            return Ok(None);
        }
        let graph = graph.ok_or("no graph")?;
        let first = graph.launch().map_err(Into::into).and_then(|()| c.compare());
        if !self.settle(c, true, first)? {
            return Ok(None);
        }
        let timed = self.time_graph(stream, &graph);
        let after = timed.as_ref().map_err(|e| e.to_string().into()).and_then(|_| c.compare());
        let ok = self.settle(c, true, after)?;
        Ok(timed.ok().filter(|_| ok).map(|t| c.row(true, t)))
    }

    /// µs per operation of a graph of [`PER_GRAPH`]: 3 untimed replays,
    /// then 5 timed with CUDA events, each after a barrier; the median.
    fn time_graph(&self, stream: &CudaStream, graph: &CudaGraph) -> Res<f64> {
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        for _ in 0..3 {
            graph.launch()?;
        }
        let mut reps = Vec::new();
        for _ in 0..5 {
            stream.synchronize()?;
            self.ctx.barrier_all(&self.s)?;
            let start = stream.record_event(timing)?;
            graph.launch()?;
            let end = stream.record_event(timing)?;
            end.synchronize()?;
            reps.push(start.elapsed_ms(&end)? as f64 * 1e3 / PER_GRAPH as f64);
        }
        reps.sort_by(f64::total_cmp);
        Ok(reps[2])
    }

    /// Eager and (with `--graph`) graph rows of `c`. NVSHMEM's collectives
    /// are called from the host, so they have no graph rows.
    fn measure<T: Value>(&self, c: &Case<'_, T>, rows: &mut Vec<Row>) -> Res {
        if let Some(row) = self.eager(c)? {
            self.keep(rows, row)?;
        }
        if self.graphs(c.bytes) && c.imp != Imp::Nvshmem {
            if let Some(row) = self.graphed(c)? {
                self.keep(rows, row)?;
            }
        }
        Ok(())
    }

    /// Overwrites the first `len` elements of this PE's `buf` with poison.
    fn poison<T: Value>(&self, buf: &SymmetricBuffer<T>, len: usize) -> Res {
        if len > buf.len() {
            return Err(format!("poisoning {len} elements of a buffer of {}", buf.len()).into());
        }
        match self.s.cuda_stream() {
            Some(stream) => {
                // SAFETY: the first `len` elements (checked above) of this
                // PE's copy of a live buffer, ordered on the stream after
                // the operations that used it.
                let set = unsafe {
                    cudarc::driver::result::memset_d8_async(
                        buf.local_ptr() as u64,
                        0xFF,
                        len * size_of::<T>(),
                        stream.cu_stream(),
                    )
                };
                Ok(set?)
            }
            None => Ok(buf.slice(..len).copy_from_host(&vec![T::POISON; len], &self.s)?),
        }
    }

    /// One shmem collective on the bench's stream.
    fn enqueue<T: Value>(&self, op: Op, dst: SymSlice<'_, T>, src: SymSlice<'_, T>) -> Res {
        let s = &self.s;
        match op {
            Op::AllReduce => self.ctx.all_reduce(dst, src, ReduceOp::Sum, s)?,
            Op::AllGather => self.ctx.all_gather(dst, src, s)?,
            Op::ReduceScatter => self.ctx.reduce_scatter(dst, src, ReduceOp::Sum, s)?,
            Op::Broadcast => self.ctx.broadcast(dst, src, ROOT, s)?,
            Op::AllToAll => self.ctx.all_to_all(dst, src, s)?,
            _ => return Err(format!("{} is not a collective", op.name()).into()),
        }
        Ok(())
    }

    /// The largest source and destination counts of `op` in this run.
    fn largest(&self, op: Op, elem: usize) -> Option<Shape> {
        self.sizes.iter().rev().find_map(|&b| Shape::of(op, b, elem, self.ctx.n_pes()))
    }

    /// `op`'s rows for shmem's implementations, out of place.
    fn collective<T: Value>(&self, op: Op) -> Res<Vec<Row>> {
        let (me, n) = (self.ctx.my_pe(), self.ctx.n_pes());
        let mut rows = Vec::new();
        let Some(max) = self.largest(op, size_of::<T>()) else { return Ok(rows) };
        let src = self.ctx.alloc::<T>(max.src)?;
        let dst = self.ctx.alloc::<T>(max.dst)?;
        for &b in &self.sizes {
            let Some(shape) = Shape::of(op, b, size_of::<T>(), n) else { continue };
            let imps: Vec<Imp> = <Imp as ValueEnum>::value_variants()
                .iter()
                .copied()
                .filter(|&imp| imp.settings(self.args.tuning()).is_some() && self.runs(imp, op, shape.bytes))
                .collect();
            if imps.is_empty() {
                continue;
            }
            let pattern = Pattern::new::<T>(n, seed(op, T::NAME, shape.bytes))?;
            src.slice(..shape.src).copy_from_host(&pattern.input(me, shape.src), &self.s)?;
            let want = pattern.expected::<T>(op, shape, me);
            let run = || self.enqueue(op, dst.slice(..shape.dst), src.slice(..shape.src));
            let poison = || self.poison(&dst, shape.dst);
            let read = || Ok(dst.slice(..shape.dst).copy_to_host(&self.s)?);
            for imp in imps {
                // Every PE, between collectives (after the last agreement).
                self.ctx.set_collectives(imp.settings(self.args.tuning()).expect("filtered"));
                let case = Case {
                    op,
                    imp,
                    dtype: Some(T::NAME),
                    bytes: shape.bytes,
                    run: &run,
                    poison: &poison,
                    read: &read,
                    want: &want,
                    moe: None,
                    splits: None,
                    matmul: None,
                };
                let measured = self.measure(&case, &mut rows);
                self.ctx.set_collectives(Collectives::default());
                measured?;
            }
        }
        Ok(rows)
    }

    /// Back-to-back barriers on every PE: each lasts until the last PE arrives.
    fn barrier(&self) -> Res<Vec<Row>> {
        let mut rows = Vec::new();
        if !self.runs(Imp::Shmem, Op::Barrier, 0) {
            return Ok(rows);
        }
        let case = Case::<f32> {
            op: Op::Barrier,
            imp: Imp::Shmem,
            dtype: None,
            bytes: 0,
            run: &|| Ok(self.ctx.barrier_all(&self.s)?),
            poison: &|| Ok(()),
            read: &|| Ok(Vec::new()),
            want: &[],
            moe: None,
            splits: None,
            matmul: None,
        };
        self.measure(&case, &mut rows)?;
        Ok(rows)
    }

    /// PE 0 puts `bytes / 4` u32 into PE 1's buffer, and gets as many from
    /// it (PE 0 alone in a world of one), with the memcpy reference rows.
    fn put_get(&self) -> Res<Vec<Row>> {
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
                };
                // PE 0 transfers, timed or not; the barrier makes the
                // transfer complete and visible at the checker.
                let check = |time: bool| -> Res<(bool, Option<f64>)> {
                    let done = match (me, time) {
                        (0, true) => self.time(b, || Ok(()), || (case.run)()).map(Some),
                        (0, false) => (case.run)().map(|()| None),
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
                        if let (true, Some(t)) = check(true)? {
                            self.keep(&mut rows, case.row(false, t))?;
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

    /// NCCL's rows of `ops`, on plain device buffers of the same sizes.
    fn nccl(&self, ops: &[Op]) -> Res<Vec<Row>> {
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
            };
            self.measure(&case, &mut rows)?;
        }
        Ok(rows)
    }
}

/// Captures [`PER_GRAPH`] runs of `run` on `stream` into a graph.
fn capture(stream: &Arc<CudaStream>, run: &dyn Fn() -> Res) -> Res<CudaGraph> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let mut captured = Ok(());
    for _ in 0..PER_GRAPH {
        captured = captured.and_then(|()| run());
    }
    // Ended whatever happened, so the stream leaves capture mode.
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    captured?;
    let graph = graph?.ok_or("the capture gave no graph")?;
    graph.upload()?;
    Ok(graph)
}

/// Plain device memory, for NCCL's rows.
struct DeviceBuf {
    mem: CudaSlice<u8>,
    stream: Arc<CudaStream>,
}

impl DeviceBuf {
    fn new(stream: &Arc<CudaStream>, bytes: usize) -> Res<DeviceBuf> {
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

    fn write<T: Value>(&self, data: &[T]) -> Res {
        self.fits(size_of_val(data))?;
        // SAFETY: the copy fits (checked above) and is complete before `data` can go.
        unsafe { cudarc::driver::result::memcpy_htod_async(self.addr(), data, self.stream.cu_stream())? };
        Ok(self.stream.synchronize()?)
    }

    fn read<T: Value>(&self, len: usize) -> Res<Vec<T>> {
        self.fits(len * size_of::<T>())?;
        let mut out = vec![T::POISON; len];
        // SAFETY: the copy fits (checked above) and is complete before `out` is used.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut out, self.addr(), self.stream.cu_stream())? };
        self.stream.synchronize()?;
        Ok(out)
    }

    fn poison(&self, bytes: usize) -> Res {
        self.fits(bytes)?;
        // SAFETY: within the allocation (checked above), ordered on its stream.
        unsafe { cudarc::driver::result::memset_d8_async(self.addr(), 0xFF, bytes, self.stream.cu_stream())? };
        Ok(())
    }
}

/// An NCCL communicator over the world on the bench's stream: cudarc's
/// bindings to the box's libnccl, through its `result` layer, whose
/// run-time dtype takes bf16 without cudarc's `f16` feature.
struct Nccl {
    comm: ncclComm_t,
    stream: Arc<CudaStream>,
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
    fn send_recv(
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

fn run(args: &Args) -> Res {
    let backend = match args.backend {
        Backend::Host => BackendKind::Host,
        Backend::Gpu => BackendKind::Gpu,
        Backend::Auto => BackendKind::Auto,
    };
    let mut config = Config::new().backend(backend);
    if std::env::var_os(HEAP_ENV).is_none() {
        config = config.heap_size(heap_bytes(args, world_size_hint(args)));
    }
    let ctx = config.init()?;
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let backend = format!("{:?}", ctx.backend()).to_lowercase();
    let partial = args.json.as_ref().map(|p| {
        let mut s = p.as_os_str().to_owned();
        s.push(".partial");
        PathBuf::from(s)
    });
    let (rows, wrong) = {
        let bench = Bench {
            ctx: &ctx,
            s: ctx.stream(),
            args,
            sizes: std::iter::successors(Some(args.min_bytes), |&b| b.checked_mul(2))
                .take_while(|&b| b <= args.max_bytes)
                .collect(),
            verdicts: ctx.alloc_zeroed::<u32>(n)?,
            wrong: Cell::new(0),
            partial: RefCell::new(match (&partial, me) {
                (Some(p), 0) => Some(std::fs::File::create(p).map_err(|e| format!("creating {}: {e}", p.display()))?),
                _ => None,
            }),
            backend: backend.clone(),
        };
        if args.graph && !bench.gpu() && me == 0 {
            note("--graph needs the gpu backend: no graph rows");
        }
        (bench.all()?, bench.wrong.get())
    };

    if me == 0 {
        print_table(&rows, n, &backend, args);
        if let Some(path) = &args.json {
            let out: String = rows.iter().map(|r| r.json(n, &backend, Some(&rows)) + "\n").collect();
            std::fs::write(path, out).map_err(|e| format!("writing {}: {e}", path.display()))?;
            if let Some(p) = &partial {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    // After the results are out: a fault in teardown cannot lose them.
    ctx.finalize()?;
    if wrong > 0 {
        return Err(format!("{wrong} wrong result(s) on PE {me} (see above)").into());
    }
    Ok(())
}

/// One table per operation, element type and timing mode.
fn print_table(rows: &[Row], n: usize, backend: &str, args: &Args) {
    let iters = args.iters.map_or("auto (10..=1000)".into(), |i| i.to_string());
    println!("# shmem-bench: {n} PEs, {backend} backend; time: µs on PE 0, median");
    println!("# eager: {iters} iterations per batch after {} warm-up; graph: replays of {PER_GRAPH}", args.warmup);
    if args.tuning() != shmem::Tuning::default() {
        println!("# shmem rows tuned: {:?}", args.tuning());
    }
    println!("# bytes per PE: all_gather's output, reduce_scatter's input, else the buffer; busbw as nccl-tests");
    if rows.iter().any(|r| r.moe.is_some()) {
        println!("# MoE ops: bytes sent per PE (tokens × topk × hidden × element), busbw = algbw × (n-1)/n");
    }
    if rows.iter().any(|r| r.matmul.is_some()) {
        println!("# overlapped matmuls: bytes = one PE's block (ag_matmul: its shard; matmul_rs: its output)");
    }
    println!("# vs X: X's time / shmem's time (above 1: shmem is faster)");
    if rows.is_empty() {
        println!("# no rows: nothing selected runs on this backend");
    }
    let mut sections: Vec<(Op, Option<&str>, bool)> = Vec::new();
    for r in rows.iter().filter(|r| r.matmul.is_none()) {
        if !sections.contains(&(r.op, r.dtype, r.graph)) {
            sections.push((r.op, r.dtype, r.graph));
        }
    }
    sections.sort_by_key(|&(op, _, graph)| (op, graph));
    for (op, dtype, graph) in sections {
        let mut section: Vec<&Row> = rows.iter().filter(|r| (r.op, r.dtype, r.graph) == (op, dtype, graph)).collect();
        section.sort_by_key(|r| (r.bytes, r.imp));
        let refs: Vec<Imp> = REFERENCES.into_iter().filter(|&i| section.iter().any(|r| r.imp == i)).collect();
        let mode = if graph { "graph" } else { "eager" };
        let moe = section.first().and_then(|r| r.moe);
        let shape = moe.map_or(String::new(), |m| {
            let (h, e, k, a) = (m.hidden, m.experts_per_pe, m.topk, m.major_align);
            format!(" (hidden {h}, {e} experts per PE, top-{k}, major_align {a})")
        });
        println!("\n## {} {}{mode}{shape}", op.name(), dtype.map_or(String::new(), |d| format!("{d} ")));
        let tokens = |t: &dyn std::fmt::Display| moe.map_or(String::new(), |_| format!("{t:>8}"));
        let mut head = format!(
            "{:<15}{}{:>7}{:>12}{:>12}{:>12}",
            "impl",
            tokens(&"tokens"),
            "size",
            "time_us",
            "algbw_GBps",
            "busbw_GBps"
        );
        for i in &refs {
            let _ = write!(head, "{:>12}", format!("vs_{}", i.name()));
        }
        println!("{head}");
        for r in section {
            let mut line = format!(
                "{:<15}{}{:>7}{:>12.2}{}{}",
                r.imp.name(),
                tokens(&r.moe.map_or(0, |m| m.tokens)),
                human(r.bytes),
                r.time_us,
                cell(r.algbw_gbps(), 12),
                cell(r.busbw_gbps(n), 12)
            );
            for &i in &refs {
                line += &cell(r.vs(rows, i), 12);
            }
            println!("{line}");
        }
    }
    overlap::print_tables(rows, n);
}
